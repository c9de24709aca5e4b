# The field's MXFP4 recipes ranked at a network design's warm starts (profile key `leaderboard`), and a user's
# recipe placed among them from the stored board: the registered studies leaderboard-units, leaderboard and
# leaderboard-place (mxfp4/studies/leaderboard.py); here the step times they read and the rules that store them.
#   snakemake --cores all store_leaderboard --config profile=networks warm_starts=stored      # the board itself
#   snakemake --cores all leaderboard_place --config profile=networks compare_recipe=R warm_starts=stored   # R on it
from mxfp4.studies.leaderboard import placed_bench, stored_board

LEADERBOARD = list(P.leaderboard)
NEW_RECIPE = config.get("compare_recipe")  # a recipe placed on the stored board (none: the board is made here)
PLACED = NEW_RECIPE if NEW_RECIPE and NEW_RECIPE not in LEADERBOARD else None


def bench_recipes():
    return ["bf16", "mxfp4", *([PLACED] if PLACED else LEADERBOARD)]


rule leaderboard_bench:
    """The step time of BF16, MXFP4 and every recipe on the board (or the placed recipe) in one run: the first
    model's first warm start, a few GRPO steps each (kernels/bench/bench_step.py)."""
    input:
        warm_start_paths(TINY_MODELS[0]) if TINY_MODELS else [],
    output:
        str(L.leaderboard_bench if not PLACED else placed_bench(L, PLACED)),
    log:
        str(L.log(f"leaderboard_bench{'_' + PLACED if PLACED else ''}")),
    params:
        recipes=" ".join(f"'{r}'" for r in bench_recipes()),
    threads: 1
    shell:
        "{PYTHON} kernels/bench/bench_step.py --profile {PROFILE} --model {TINY_MODELS[0]} --seed {SEEDS[0]} "
        "--steps 4 --recipes {params.recipes} --out {output} > {log} 2>&1"


rule store_leaderboard:
    """Store the board with the baselines: its per-unit files, energies, run times and step times under the
    profile, then LEADERBOARD.md at results/baselines/ and its figure under the profile's stored figures, made from
    the stored files."""
    input:
        units=[str(p) for m in TINY_MODELS for p in STUDIES["leaderboard-units"].outputs(L, m)],  # energies, run
        bench=str(L.leaderboard_bench),
        md=[str(p) for p in STUDIES["leaderboard"].outputs(L)],
    output:
        touch(str(L.root / "leaderboard_stored.flag")),
    run:
        store_with_baselines([*input.units, input.bench])
        store_board_page(LEADERBOARD)


rule store_placed:
    """Store the placed recipe on the stored board, once it placed (target leaderboard_place): its arm merged into
    the stored per-unit files in a full run's order, its energies and its step times (its own benchmark, beside BF16)
    stored, the page made again from the stored files. Then name it in the profile's leaderboard list:
        snakemake --cores all store_placed --config profile=networks compare_recipe=R warm_starts=stored"""
    input:
        md=[str(p) for p in STUDIES["leaderboard-place"].outputs(L, recipe=PLACED)] if PLACED else [],
        units=[str(L.mechanism_units(PLACED, m)) for m in TINY_MODELS] if PLACED else [],
        bench=rules.leaderboard_bench.output[0] if PLACED else [],
    output:
        touch(str(L.root / (f"placed_{PLACED}_stored.flag" if PLACED else "placed_stored.flag"))),
    run:
        from mxfp4.report.leaderboard import store_placed_units

        if not PLACED:
            raise ValueError("store_placed stores a placed recipe: --config compare_recipe=R (R not on the board)")
        for model, units in zip(TINY_MODELS, input.units):
            store_placed_units(L.stored(L.leaderboard_units(model)), [units], PLACED)
        store_with_baselines([*(str(Path(u).with_suffix(".energy.json")) for u in input.units), input.bench])
        store_board_page([*LEADERBOARD, PLACED])


def store_board_page(recipes):
    """LEADERBOARD.md at results/baselines/ and its figure under the profile's stored figures, ranking ``recipes``
    from the stored board's files alone (its per-unit files; its own run's step times first, then each placed
    recipe's, beside its own BF16), the stored real-model board's page appended where it is stored."""
    import json

    from mxfp4.config.recipes import refuse_redefined
    from mxfp4.report import leaderboard
    from mxfp4.report.network_claims import read_units

    refuse_redefined(["mxfp4", *recipes], "leaderboard")
    accuracy_from = STUDIES["leaderboard"].settings_of(P).accuracy_from
    *units, main = stored_board(L, P)
    benches = [main, *sorted(main.parent.glob("step_times_*.json"))]
    page = L.baselines.parent / "LEADERBOARD.md"
    leaderboard.run(read_units(units), PROFILE, page, recipes,
                    {str(b): json.loads(b.read_text()) for b in benches}, [L.sibling(p) for p in accuracy_from],
                    out_png=L.stored(L.figure(FIGURES["leaderboard"].stem)))
    real = L.sibling("real-small-board")
    stored_real = real.stored(real.real_leaderboard())
    if stored_real.is_file():  # the page holds both boards
        from mxfp4.report.real_board import attach

        attach(page, stored_real)


@on_start
def leaderboard_estimate():
    """The cost of placing a recipe, printed before its first job: the stored board's measured time per arm and
    network, times the arms the placed recipe's run measures (it, MXFP4, BF16 and the correction arms)."""
    if PLACED and "leaderboard_place" in requested_targets():
        import json

        for m in TINY_MODELS:
            stored = L.stored(L.leaderboard_units(m).with_suffix(".run.json"))
            if not stored.is_file():
                print(f"leaderboard: no stored board of {m} ({stored}); store one first (target store_leaderboard)")
                continue
            run = json.loads(stored.read_text())
            arms = 3 + len(P.pathways.corrections)
            minutes = run["seconds"] / run["arms"] * arms / 60
            print(f"leaderboard: {PLACED} on {m}: {arms} arms at {run['networks']} networks, about {minutes:.0f} min "
                  f"on one core (the stored board: {run['arms']} arms in {run['seconds'] / 60:.0f} min), then its "
                  "step beside bf16 and mxfp4 (a few GRPO steps each)")

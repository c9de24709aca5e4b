rule store_baselines:
    """Store this profile's aggregated cells, claims table, pathway matrix and figures as the baselines
    that `compare` measures new recipes against (results/baselines/ is committed; the figures there
    are the reference figures, while figures/ holds only what the current run drew)."""
    input:
        str(L.table("cells")),
        str(L.table("summary")),
        str(L.table("items")),
        str(L.claims),
        str(L.pathways()),
        str(L.pathways().with_suffix(".md")),
        str(L.regime.with_suffix(".md")),
        str(L.regime),
        FIGURE_FILES,
        # every unit's harm behind the claim-level tests, and those tests per network (recomputable from them)
        [str(L.pathway_units(m, c)) for m in MODELS for c in (P.pathways.checkpoints if P.pathways else [])],
        NETWORK_CLAIMS,
        models=[p for m in TINY_MODELS for p in warm_start_paths(m)],  # every warm start, whole
    output:
        # The stored files are sources of the DAG (committed), not outputs: a rule that reads them (compare)
        # must never regenerate them. This marker records when they were last stored.
        touch(str(L.root / "baselines_stored.flag")),
    run:
        from mxfp4.report.profile_report import run as write_report

        store_with_baselines(input, input.models)
        write_report(L, stored=True)  # the stored REPORT.md, linking the stored tables


def unstored_warm_starts(wc=None):
    """The warm starts a network design stores: those no stored profile holds already, whole or as the SFT its
    outlier channels are added to (a pilot's reused networks, a regime's shared SFTs)."""
    from mxfp4.rl.models import made_from

    out = []
    for m in TINY_MODELS:
        for k in range(P.warm_starts):
            relative = L.model(m, k).relative_to(L.root)
            stored = [folder / relative for folder in stored_profiles()]
            if not any(made_from(f, P.warm_start_setting(m, k)) or made_from(f, P.sft_setting(m, k)) for f in stored):
                out.append(model_path(m, k))
    return out


rule store_network_claims:
    """Store a network design (a profile of pathways and claims alone, no RL) with the baselines: every model's
    per-unit file, its pathway matrix, the claim tests with the network as the replicate (each primary row
    recomputable by `mxfp4 network-claims` from the stored units) and the warm starts no other profile stores."""
    input:
        [str(L.pathway_units(m, "warm")) for m in MODELS],
        str(L.pathways()),
        str(L.pathways().with_suffix(".md")),
        NETWORK_CLAIMS,
        models=unstored_warm_starts,
    output:
        touch(str(L.root / "network_claims_stored.flag")),
    run:
        store_with_baselines(input, input.models)


# A pilot (--config compare_pilot=true): the compare recipe on the first model and seed only, against the
# references on the same cell: minutes, and a per-problem answer; the full compare adds the other cells.
# More seeds (--config compare_seeds=N): the profile's seeds, then the next integers; the references of the
# seeds the stored baselines lack run here too (they extend the stored ones where those reproduce here).
PILOT = compare_pilot(config)
COMPARE_MODELS = MODELS[:1] if PILOT else MODELS


def compare_seeds(n):
    """The first n seeds: the profile's, then consecutive new ones after its largest."""
    if n is None:
        return SEEDS[:1] if PILOT else SEEDS
    if PILOT:
        raise ValueError("--config compare_pilot=true runs one seed; leave out compare_seeds, or the pilot")
    return (SEEDS + [max(SEEDS) + k for k in range(1, int(n) - len(SEEDS) + 1)])[: int(n)]


COMPARE_SEEDS = compare_seeds(config.get("compare_seeds"))


def compare_references():
    """The recipes the compare recipe is measured against on this machine: the reference recipe, the
    recipe it modifies (its base) and any named in config compare_references."""
    from mxfp4.config.recipes import recipe_base

    wanted = [REFERENCE_RECIPE, recipe_base(COMPARE_RECIPE), *config.get("compare_references", [])]
    return [r for r in dict.fromkeys(wanted) if r is not None and r != COMPARE_RECIPE]


def reproduction_cells():
    """The stored cells rerun here, one per compared model (every model's references are checked before they are
    trusted): its first seed's cell of the compare recipe's base where it has one (a quantized recipe: full-
    precision cells can reproduce where quantized ones do not), else of the reference recipe."""
    refs = compare_references()
    recipe = refs[1] if len(refs) > 1 else refs[0]
    return [(m, recipe, SEEDS[0]) for m in COMPARE_MODELS]


checkpoint baseline_reproduction:
    """Rerun stored cells here (reproduction_cells) and check them against the stored baselines bit
    for bit: compare uses the stored cells only if every one reproduces."""
    input:
        cells=[cell_path(*c) for c in reproduction_cells()],
        baselines=str(L.stored(L.table("cells"))),
    output:
        str(L.root / "compare" / "baseline_reproduction.json"),
    log:
        str(L.log("baseline_reproduction")),
    params:
        cells=" ".join(f"--cell '{m}/{r}/seed{s}'" for m, r, s in reproduction_cells()),
    shell:
        "{MXFP4} reproduction --profile {PROFILE} {params.cells} --baselines {input.baselines} "
        "--out {output} > {log} 2>&1"


EXTRA_SEEDS = [s for s in COMPARE_SEEDS if s not in SEEDS]  # compare seeds the stored baselines lack


def reference_runs(seeds):
    """(model, recipe, seed) of the reference recipes' cells on ``seeds`` of the compared models."""
    return [(m, r, s) for m in COMPARE_MODELS for r in compare_references() for s in seeds]


def reference_cells(wc):
    """This run's cells of the reference recipes: of every compare seed when the stored baselines do not
    reproduce here, else of the seeds they lack."""
    import json

    check = json.loads(open(checkpoints.baseline_reproduction.get().output[0]).read())
    return [cell_path(*c) for c in reference_runs(EXTRA_SEEDS if check["reproduces"] else COMPARE_SEEDS)]


def planned_compare_cells():
    """(model, recipe, seed) of every cell a compare runs that has not run yet, where the stored baselines
    reproduce here: the recipe's, the reproduction's and the extra seeds' references."""
    wanted = [(m, COMPARE_RECIPE, s) for m in COMPARE_MODELS for s in COMPARE_SEEDS]
    wanted += reproduction_cells() + reference_runs(EXTRA_SEEDS)
    return [c for c in dict.fromkeys(wanted) if not os.path.exists(cell_path(*c))]


def measured_step_ratios():
    """The compare recipe's step measured once beside its base's (``mxfp4 recipe-cost``: a few steps each on the
    stored warm start of the first model), its warnings printed; {} where it cannot be measured (said)."""
    import json
    import subprocess

    out = L.root / "compare" / f"cost_{COMPARE_RECIPE}.json"
    done = subprocess.run([PYTHON, "-m", "mxfp4", "recipe-cost", "--profile", PROFILE, "--recipe", COMPARE_RECIPE,
                           "--results", str(L.baselines.parent), "--out", str(out)],
                          capture_output=True, text=True)
    print((done.stdout + done.stderr).strip())
    if done.returncode != 0:
        print("compare: the recipe's step was not measured; the estimate assumes it costs what its base costs")
        return {}
    return {COMPARE_RECIPE: json.loads(out.read_text())["step_ratio"]}


def requested_targets():
    return workflow.dag_settings.targets if workflow.dag_settings else ()


@on_start
def compare_estimate():
    """The cost of a compare, printed before its first job: the stored cells' wall times, the new recipe's scaled
    by its step measured here against its base's."""
    if "compare" in requested_targets():
        from mxfp4.report.compare import cost_estimate
        from mxfp4.report.tables import read_table

        stored = L.stored(L.table("cells"))
        ratios = measured_step_ratios() if planned_compare_cells() else {}
        print(cost_estimate(read_table(stored, "cells") if stored.is_file() else [], planned_compare_cells(),
                            workflow.cores, ratios)
              + " (if the stored cells do not reproduce here, the references of every seed run as well)")


@on_start
def mechanism_estimate():
    """The cost of a mechanism run, printed before its first job: the stored leaderboard's measured seconds per arm
    and network, times the arms this run measures."""
    if "mechanism" not in requested_targets() or P.pathways is None:
        return
    import json

    from mxfp4.analysis.mechanism import mechanism_arms

    arms = 2 + len(mechanism_arms(P, [COMPARE_RECIPE]))
    for m in (job["model"] for job in STUDIES["mechanism"].jobs(P, config)):
        stored = L.stored(L.leaderboard_units(m).with_suffix(".run.json"))
        if not stored.is_file():
            print(f"mechanism: {COMPARE_RECIPE} on {m}: {arms} arms; no stored measure of this profile's arms "
                  f"({stored}) to estimate the time from")
            continue
        run = json.loads(stored.read_text())
        minutes = run["seconds"] / run["arms"] * arms / 60
        print(f"mechanism: {COMPARE_RECIPE} on {m}: {arms} arms at {run['networks']} networks, about {minutes:.0f} "
              f"min on one core (the stored board: {run['arms']} arms in {run['seconds'] / 60:.0f} min)")


# The mechanism first (the registered studies mechanism and mechanism-report, mxfp4/studies/mechanism.py), where the
# profile fixes the pathways' margins (pathways.claims) and has tiny warm starts:
#   snakemake --cores all mechanism --config compare_recipe=R warm_starts=stored
MECHANISM = ([str(STUDIES["mechanism-report"].output(L, recipe=COMPARE_RECIPE))] if P.pathways and P.pathways.claims
             and STUDIES["mechanism"].jobs(P, config) else [])


rule mechanism:
    input:
        MECHANISM,


def placed_against(wc):
    """A recipe placed on the stored leaderboard: its run's mxfp4 and bf16 arms checked against the board's before
    its own arm is measured (``mxfp4 mechanism --against``)."""
    stored = L.stored(L.leaderboard_units(wc.model))
    placing = (bool({"leaderboard_place", "real_leaderboard_place", "store_placed", "store_real_placed"}
                    & set(requested_targets()))
               and wc.recipe not in P.leaderboard)
    return f"--against {stored}" if placing and stored.is_file() else ""


STUDY_ARGS["mechanism"] = placed_against


rule compare:
    """Run the cells of `compare_recipe` and set them against references from this machine: the
    stored baselines if one of their cells reproduces here bit for bit, else this run's own cells of
    the reference recipes (same seeds). The report says which."""
    input:
        mechanism=MECHANISM,
        cells=[cell_path(m, COMPARE_RECIPE, s) for m in COMPARE_MODELS for s in COMPARE_SEEDS],
        baselines=str(L.stored(L.table("cells"))),
        reproduction=str(L.root / "compare" / "baseline_reproduction.json"),
        references=reference_cells,
    output:
        md=str(L.compare(COMPARE_RECIPE)),
        fig=multiext(str(L.figure(f"compare_{COMPARE_RECIPE}", "")), ".png", ".pdf"),
    log:
        str(L.log(f"compare_{COMPARE_RECIPE}")),
    params:
        adjust=config.get("compare_adjust", "holm"),
        figure=lambda wc, output: output.fig[0],
        mechanism=f"--mechanism {MECHANISM[0]}" if MECHANISM else "",
    shell:
        "{MXFP4} compare --profile {PROFILE} --recipe '{COMPARE_RECIPE}' --baselines {input.baselines} "
        "--reproduction {input.reproduction} {params.mechanism} --out {output.md} "
        "--figure {params.figure} --adjust {params.adjust} > {log} 2>&1"


rule profile_contrast:
    """This run beside another profile's run that differs from it in one setting (typically the profile it
    derives from with base:): operand statistics, the pathway matrix paired unit by unit at the warm
    start, the recovery rows. The other profile's files must exist (run its figures first):
        snakemake --cores all results/embedded-large-outliers/contrast/embedded-large.md \
            --config profile=embedded-large-outliers"""
    input:
        str(L.table("cells")),
        str(L.table("items")),
        str(L.pathways()),
        str(L.regime),
        [str(L.pathway_units(m, "warm")) for m in MODELS if P.pathways and "warm" in P.pathways.checkpoints],
        lambda wc: [str(L.sibling(wc.other).table(t)) for t in ("cells", "items")]
        + [str(L.sibling(wc.other).regime)],
    output:
        md=str(L.contrast("{other}")),
        csv=str(L.contrast("{other}").with_suffix(".csv")),
    log:
        str(L.log("contrast_{other}")),
    shell:
        "{MXFP4} profile-contrast {wildcards.other} {PROFILE} --out {output.md} > {log} 2>&1"


rule store_contrast:
    """Store a profile contrast with this profile's baselines (results/baselines/<profile>/contrast/)."""
    input:
        md=str(L.contrast("{other}")),
        csv=str(L.contrast("{other}").with_suffix(".csv")),
    output:
        touch(str(L.root / "contrast" / "{other}.stored.flag")),
    run:
        store_with_baselines(input)


rule store_compare:
    """Store a compare report and its figure with this profile's baselines (results/baselines/<profile>/compare/;
    the stored REPORT.md links it):
        snakemake --cores all store_compare --config profile=embedded-large compare_recipe=mxfp4+macro"""
    input:
        md=str(L.compare(COMPARE_RECIPE)),
        fig=multiext(str(L.figure(f"compare_{COMPARE_RECIPE}", "")), ".png", ".pdf"),
    output:
        touch(str(L.root / "compare" / f"{COMPARE_RECIPE}.stored.flag")),
    run:
        from mxfp4.report.profile_report import run as write_report

        store_with_baselines(input)
        write_report(L, stored=True)

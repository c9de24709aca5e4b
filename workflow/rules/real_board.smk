# The real-model board: every recipe on a named pretrained model before RL (profile real-small-board), its held-out
# problems the replicate; where W4A4 breaks it (the collapse map); a user's recipe placed on the stored board:
#   snakemake --cores 2 store_real_board --config profile=real-small-board     # the board itself, stored
#   snakemake --cores 2 real_board --config profile=real-small-board compare_recipe=R   # R on the stored board
NAMED_MODELS = [m for m in MODELS if m not in TINY_MODELS]  # pretrained models of the hub or a package
REAL_PLACED = NEW_RECIPE if NEW_RECIPE and NEW_RECIPE not in ("mxfp4", "mxfp4-w4a16", *LEADERBOARD) else None
BOARD_MODEL = NAMED_MODELS[0] if NAMED_MODELS else None


def board_folder(model, recipe=None):
    return str(L.real_board(model, recipe))


rule real_board_measures:
    """Every recipe's GSM8K accuracy before RL per held-out problem, error completions and training-pass time (plain
    MXFP4 and W4A16 beside the profile's leaderboard), or a placed recipe's beside bf16."""
    input:
        CPU_KERNEL,
    output:
        problems=board_folder("{model}") + "/items.csv",
        record=board_folder("{model}") + "/recipes.json",
    log:
        str(L.log("real_board_{model}")),
    params:
        recipes=lambda wc: " ".join(f"'{r}'" for r in (["mxfp4", "mxfp4-w4a16", *LEADERBOARD]
                                                         if not wc.model.endswith(f"_{REAL_PLACED}") else [REAL_PLACED])),
        model=lambda wc: wc.model.removesuffix(f"_{REAL_PLACED}") if REAL_PLACED else wc.model,
    threads: 1
    shell:
        "MXFP4_THREADS={threads} {MXFP4} real-board --profile {PROFILE} --model {params.model} "
        "--recipe {params.recipes} --out $(dirname {output.problems}) > {log} 2>&1"


def real_board_inputs():
    """The board's folder and pathway units: this run's, or the stored ones beside the placed recipe's folder."""
    if BOARD_MODEL is None:
        return {}
    here = {"problems": board_folder(BOARD_MODEL) + "/items.csv", "units": str(L.leaderboard_units(BOARD_MODEL))}
    if not REAL_PLACED:
        return here
    return {**{k: str(L.stored(Path(v))) for k, v in here.items()},
            "placed": board_folder(f"{BOARD_MODEL}_{REAL_PLACED}") + "/items.csv"}


rule real_board:
    """The real-model board ranked (or the placed recipe's rank on the stored board, after its bf16 reproduces)."""
    input:
        **real_board_inputs(),
    output:
        str(L.real_leaderboard(REAL_PLACED)),
    log:
        str(L.log(f"real_board{'_' + REAL_PLACED if REAL_PLACED else ''}")),
    params:
        placed=lambda wc, input: (f"--recipe '{REAL_PLACED}' --recipe-board $(dirname {input.placed})"
                                  if REAL_PLACED else ""),
    shell:
        "{MXFP4} leaderboard --profile {PROFILE} --real $(dirname {input.problems}) {input.units} {params.placed} "
        "--out {output} > {log} 2>&1"


rule store_real_board:
    """Store the real-model board with the baselines (its measures, lm-eval's samples stay behind) and the collapse
    map, then LEADERBOARD.md at results/baselines/ with the network board and this one."""
    input:
        problems=board_folder(BOARD_MODEL) + "/items.csv" if BOARD_MODEL else [],
        record=board_folder(BOARD_MODEL) + "/recipes.json" if BOARD_MODEL else [],
        units=str(L.leaderboard_units(BOARD_MODEL)) if BOARD_MODEL else [],
        energy=str(L.leaderboard_units(BOARD_MODEL).with_suffix(".energy.json")) if BOARD_MODEL else [],
        collapse=str(STUDIES["collapse-map"].output(L, BOARD_MODEL)) if BOARD_MODEL else [],
        md=str(L.real_leaderboard()),
    output:
        touch(str(L.root / "real_board_stored.flag")),
    run:
        from mxfp4.report.real_board import attach

        collapse_md = Path(input.collapse).with_suffix(".md")
        store_with_baselines([input.problems, input.record, input.units, input.energy, input.collapse, str(collapse_md),
                              input.md, str(Path(input.md).with_suffix(".json"))])
        attach(L.baselines.parent / "LEADERBOARD.md", L.stored(Path(input.md)))


rule store_real_placed:
    """Store the placed recipe on the stored real-model board, once it placed (rule real_board): its rows of every
    held-out problem and its record (its training pass over BF16's of its own run), its pathway units merged into the
    stored ones after its run's mxfp4 and bf16 arms reproduced them, the page made again from the stored files:
        snakemake --cores 2 store_real_placed --config profile=real-small-board compare_recipe=R"""
    input:
        md=str(L.real_leaderboard(REAL_PLACED)) if REAL_PLACED else [],
        placed=board_folder(f"{BOARD_MODEL}_{REAL_PLACED}") + "/items.csv" if REAL_PLACED else [],
        units=str(L.mechanism_units(REAL_PLACED, BOARD_MODEL)) if REAL_PLACED else [],
    output:
        touch(str(L.root / (f"real_placed_{REAL_PLACED}_stored.flag" if REAL_PLACED else "real_placed_stored.flag"))),
    run:
        from mxfp4.analysis.real_board import ITEM_FIELDS
        from mxfp4.io import write_csv_atomic, write_json_atomic
        from mxfp4.report import real_board
        from mxfp4.report.leaderboard import store_placed_units
        from mxfp4.report.network_claims import read_units

        if not REAL_PLACED:
            raise ValueError("store_real_placed stores a placed recipe: --config compare_recipe=R (R not on the board)")
        stored_dir = L.stored(Path(board_folder(BOARD_MODEL)))
        items, record = real_board.placed(real_board.read_board(stored_dir),
                                          real_board.read_board(Path(input.placed).parent), REAL_PLACED)
        write_csv_atomic(stored_dir / "items.csv", items, ITEM_FIELDS)
        write_json_atomic(stored_dir / "recipes.json", record)
        stored_units = L.stored(L.leaderboard_units(BOARD_MODEL))
        store_placed_units(stored_units, [input.units], REAL_PLACED)
        store_with_baselines([str(Path(input.units).with_suffix(".energy.json"))])
        page = L.stored(L.real_leaderboard())
        real_board.run(stored_dir, PROFILE, page, read_units([stored_units]))
        real_board.attach(L.baselines.parent / "LEADERBOARD.md", page)

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


rule collapse_map:
    """Where W4A4 breaks the named model before RL: one decoder layer at a time in BF16, each operand role alone."""
    input:
        CPU_KERNEL,
    output:
        str(L.collapse_map("{model}")),
    log:
        str(L.log("collapse_map_{model}")),
    threads: 1
    shell:
        "MXFP4_THREADS={threads} {MXFP4} collapse-map --profile {PROFILE} --model {wildcards.model} --out {output} "
        "> {log} 2>&1"


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
        collapse=str(L.collapse_map(BOARD_MODEL)) if BOARD_MODEL else [],
        md=str(L.real_leaderboard()),
    output:
        touch(str(L.root / "real_board_stored.flag")),
    run:
        from mxfp4.report.real_board import attach

        collapse_md = Path(input.collapse).with_suffix(".md")
        store_with_baselines([input.problems, input.record, input.units, input.energy, input.collapse, str(collapse_md),
                              input.md])
        attach(L.baselines.parent / "LEADERBOARD.md", L.stored(Path(input.md)))

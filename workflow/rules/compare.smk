BASELINE_FIGURES = ["decomposition_shares", "correction_effects", "training_curves", "gsm8k_accuracy",
                    "kernel_throughput", "pathway_matrix"]


rule store_baselines:
    """Store this profile's aggregated cells, claims table, pathway matrix and figures as the baselines
    that `compare` measures new recipes against (results/baselines/ is committed; the figures there
    are the reference figures, while figures/ holds only what the current run drew)."""
    input:
        f"{AGGREGATE}/cells.csv",
        f"{AGGREGATE}/summary.csv",
        f"{AGGREGATE}/items.csv",
        str(L.claims),
        str(L.pathways()),
        str(L.pathways().with_suffix(".md")),
        [f"{FIGURES}/{name}{ext}" for name in BASELINE_FIGURES for ext in (".png", ".pdf")],
    output:
        f"{BASELINES}/cells.csv",
        f"{BASELINES}/summary.csv",
        f"{BASELINES}/items.csv",
        f"{BASELINES}/claims.md",
        f"{BASELINES}/pathways.csv",
        f"{BASELINES}/pathways.md",
        [f"{BASELINES}/figures/{name}{ext}" for name in BASELINE_FIGURES for ext in (".png", ".pdf")],
    run:
        from mxfp4.io import copy_atomic

        for src, dst in zip(input, output):
            copy_atomic(src, dst)


rule compare:
    """Run the cells of `compare_recipe` and set them against the stored baselines of this profile."""
    input:
        cells=[cell_path(m, COMPARE_RECIPE, s) for m in MODELS for s in SEEDS],
        baselines=f"{BASELINES}/cells.csv",
    output:
        md=str(L.compare(COMPARE_RECIPE)),
        fig=multiext(f"{FIGURES}/compare_{COMPARE_RECIPE}", ".png", ".pdf"),
    log:
        f"{LOGS}/compare_{COMPARE_RECIPE}.log",
    shell:
        "{MXFP4} compare --profile {PROFILE} --recipe '{COMPARE_RECIPE}' --baselines {input.baselines} "
        "--out {output.md} --figure {FIGURES}/compare_{COMPARE_RECIPE} > {log} 2>&1"

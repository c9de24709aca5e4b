rule store_baselines:
    """Store this profile's aggregated cells as the baselines that `compare` measures new recipes against."""
    input:
        f"{RESULTS}/aggregate/cells.csv",
        f"{RESULTS}/aggregate/summary.csv",
    output:
        f"{BASELINES}/cells.csv",
        f"{BASELINES}/summary.csv",
    shell:
        "mkdir -p {BASELINES} && cp {input[0]} {output[0]}.tmp && mv {output[0]}.tmp {output[0]} && "
        "cp {input[1]} {output[1]}.tmp && mv {output[1]}.tmp {output[1]}"


rule compare:
    """Run the cells of `compare_recipe` and set them against the stored baselines of this profile."""
    input:
        cells=[cell_path(m, COMPARE_RECIPE, s) for m in MODELS for s in SEEDS],
        baselines=f"{BASELINES}/cells.csv",
    output:
        md=f"{RESULTS}/compare/{COMPARE_RECIPE}.md",
        fig=multiext(f"{FIGURES}/compare_{COMPARE_RECIPE}", ".png", ".pdf"),
    log:
        f"{RESULTS}/logs/compare_{COMPARE_RECIPE}.log",
    shell:
        "mxfp4 compare --profile {PROFILE} --recipe '{COMPARE_RECIPE}' --baselines {input.baselines} "
        "--out {output.md} --figure {FIGURES}/compare_{COMPARE_RECIPE} > {log} 2>&1"

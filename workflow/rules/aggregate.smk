rule aggregate:
    """Tidy CSVs: one row per cell, one per cell-step, one per cell and GSM8K problem (lm-eval's samples),
    and per (model, recipe) means with CIs over seeds."""
    input:
        ALL_CELLS,
    output:
        cells=f"{RESULTS}/aggregate/cells.csv",
        steps=f"{RESULTS}/aggregate/steps.csv",
        summary=f"{RESULTS}/aggregate/summary.csv",
        problems=f"{RESULTS}/aggregate/items.csv",
    log:
        f"{RESULTS}/logs/aggregate.log",
    shell:
        "{MXFP4} aggregate --profile {PROFILE} --out {RESULTS}/aggregate > {log} 2>&1"


rule corrections_table:
    """Each correction's effect on each component, on the standard distributions and the tiny models."""
    input:
        [f"{RESULTS}/models/{m}" for m in TINY_MODELS],
    output:
        md=f"{RESULTS}/corrections.md",
        json=f"{RESULTS}/corrections.json",
    log:
        f"{RESULTS}/logs/corrections_table.log",
    params:
        models=lambda wc, input: " ".join(f"--model {m}={p}" for m, p in zip(TINY_MODELS, input)),
    shell:
        "{MXFP4} corrections-table --out {output.md} --json {output.json} {params.models} > {log} 2>&1"


rule claims:
    """The paper's claims against what this profile measured, with seeds and intervals."""
    input:
        cells=f"{RESULTS}/aggregate/cells.csv",
        proofs=f"{RESULTS}/proofs/proofs.json",
        corrections=f"{RESULTS}/corrections.json",
        pathways=f"{RESULTS}/pathways/pathways.csv",
    output:
        f"{RESULTS}/claims.md",
    log:
        f"{RESULTS}/logs/claims.log",
    shell:
        "{MXFP4} claims --profile {PROFILE} --cells {input.cells} --proofs {input.proofs} "
        "--corrections {input.corrections} --pathways {input.pathways} --out {output} > {log} 2>&1"

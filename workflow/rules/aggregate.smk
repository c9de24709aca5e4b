rule aggregate:
    """Tidy CSVs: one row per cell, one per cell-step, one per cell and GSM8K problem (lm-eval's samples),
    and per (model, recipe) means with CIs over seeds."""
    input:
        ALL_CELLS,
    output:
        cells=report(f"{AGGREGATE}/cells.csv", caption="../report/cells.rst", category="Cells"),
        steps=f"{AGGREGATE}/steps.csv",
        summary=report(f"{AGGREGATE}/summary.csv", caption="../report/summary.rst", category="Cells"),
        problems=f"{AGGREGATE}/items.csv",
    log:
        f"{LOGS}/aggregate.log",
    shell:
        "{MXFP4} aggregate --profile {PROFILE} --out {AGGREGATE} > {log} 2>&1"


rule corrections_table:
    """Each correction's effect on each component, on the standard distributions and the tiny models."""
    input:
        [model_path(m) for m in TINY_MODELS],
    output:
        md=str(L.corrections.with_suffix(".md")),
        json=str(L.corrections),
    log:
        f"{LOGS}/corrections_table.log",
    params:
        models=lambda wc, input: " ".join(f"--model {m}={p}" for m, p in zip(TINY_MODELS, input)),
    shell:
        "{MXFP4} corrections-table --out {output.md} --json {output.json} {params.models} > {log} 2>&1"


rule claims:
    """The paper's claims against what this profile measured, with seeds and intervals."""
    input:
        cells=f"{AGGREGATE}/cells.csv",
        problems=f"{AGGREGATE}/items.csv",  # the precondition rows (read beside cells.csv)
        proofs=str(L.proofs),
        corrections=str(L.corrections),
        pathways=str(L.pathways()),
    output:
        report(str(L.claims), caption="../report/claims.rst", category="Claims"),
    log:
        f"{LOGS}/claims.log",
    shell:
        "{MXFP4} claims --profile {PROFILE} --cells {input.cells} --proofs {input.proofs} "
        "--corrections {input.corrections} --pathways {input.pathways} --out {output} > {log} 2>&1"


rule report_md:
    """The run's results in one page: held-out accuracy, the pathway matrix's headline, the claims."""
    input:
        summary=f"{AGGREGATE}/summary.csv",
        claims=str(L.claims),
        pathways=str(L.pathways()),
    output:
        str(L.report),
    log:
        f"{LOGS}/report.log",
    shell:
        "{MXFP4} report --profile {PROFILE} > {log} 2>&1"

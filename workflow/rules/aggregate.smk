rule aggregate:
    """Tidy CSVs: one row per cell, one per cell-step, one per cell and GSM8K problem (lm-eval's samples),
    and per (model, recipe) means with CIs over seeds."""
    input:
        ALL_CELLS,
    output:
        cells=report(str(L.table("cells")), caption="../report/cells.rst", category="Cells"),
        steps=str(L.table("steps")),
        summary=report(str(L.table("summary")), caption="../report/summary.rst", category="Cells"),
        problems=str(L.table("items")),
        arithmetic=[str(L.table("items_arithmetic"))] if P.data.arithmetic_held_out else [],
    log:
        str(L.log("aggregate")),
    shell:
        "{MXFP4} aggregate --profile {PROFILE} > {log} 2>&1"


rule corrections_table:
    """Each correction's effect on each component, on the standard distributions and the tiny models."""
    input:
        [model_path(m) for m in TINY_MODELS],
    output:
        md=str(L.corrections.with_suffix(".md")),
        json=str(L.corrections),
    log:
        str(L.log("corrections_table")),
    params:
        models=lambda wc, input: " ".join(f"--model {m}={p}" for m, p in zip(TINY_MODELS, input)),
    shell:
        "{MXFP4} corrections-table --out {output.md} --json {output.json} {params.models} > {log} 2>&1"


rule report_md:
    """The run's results in one page: held-out accuracy, the pathway matrix's headline, the claims."""
    input:
        summary=str(L.table("summary")),
        claims=str(L.claims),
        pathways=str(L.pathways()),
        network=NETWORK_CLAIMS,
    output:
        str(L.report),
    log:
        str(L.log("report")),
    shell:
        "{MXFP4} report --profile {PROFILE} > {log} 2>&1"

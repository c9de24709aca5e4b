rule pathways_model:
    """The pathway matrix of one model: each error component injected alone (or removed) on the
    warm-started policy and on every seed's bf16 policy after GRPO, paired on the same data; every
    seed draws its own batches and prompts."""
    input:
        model_input,
        # the policies after GRPO, when the profile measures that checkpoint
        bf16_policies=lambda wc: [cell_path(wc.model, REFERENCE_RECIPE, s) for s in SEEDS]
        if P.pathways and "grpo" in P.pathways.checkpoints else [],
    output:
        str(L.pathways("{model}")),
    log:
        f"{LOGS}/pathways_{{model}}.log",
    threads: 1
    # the longest jobs of the DAG: start them as soon as their inputs exist, so the cells fill the other core
    priority: 10
    shell:
        "MXFP4_THREADS={threads} {MXFP4} pathways --profile {PROFILE} --model {wildcards.model} --out {output} > {log} 2>&1"


rule pathways_table:
    """Every model's pathway rows in one tidy CSV, and the matrix as a markdown table."""
    input:
        [str(L.pathways(m)) for m in MODELS],
    output:
        csv=str(L.pathways()),
        md=report(str(L.pathways().with_suffix(".md")), caption="../report/pathways_table.rst", category="Pathway matrix"),
    run:
        from mxfp4.io import write_text_atomic
        from mxfp4.report.pathway_table import run as table

        parts = [open(p).read().splitlines() for p in input]
        write_text_atomic(output.csv, "\n".join(parts[0][:1] + [line for p in parts for line in p[1:]]) + "\n")
        table(output.csv, output.md)

def checkpoint_inputs(wc):
    """The warm start is measured as soon as it exists; the policies after GRPO need every measured seed's bf16
    cell."""
    return [cell_path(wc.model, REFERENCE_RECIPE, s) for s in P.pathway_seeds] if wc.checkpoint == "grpo" else []


rule pathways_checkpoint:
    """The pathway matrix of one model at one checkpoint: each error component injected alone (or
    removed), with its energy-matched controls, on the warm-started policy or on every seed's bf16 policy
    after GRPO; every seed draws its own batches and prompts, every arm of a seed the same."""
    input:
        model_input,
        checkpoint_inputs,
    output:
        rows=str(L.pathways("{model}", "{checkpoint}")),
        units=str(L.pathway_units("{model}", "{checkpoint}")),
    log:
        str(L.log("pathways_{model}_{checkpoint}")),
    wildcard_constraints:
        checkpoint="warm|grpo",
    threads: 1
    # the longest jobs of the DAG: start them as soon as their inputs exist, so the cells fill the other core
    priority: 10
    shell:
        "MXFP4_THREADS={threads} {MXFP4} pathways --profile {PROFILE} --model {wildcards.model} "
        "--checkpoint {wildcards.checkpoint} --out {output.rows} --units {output.units} > {log} 2>&1"


rule pathways_table:
    """Every model's and checkpoint's pathway rows in one tidy CSV, and the matrix as a markdown table."""
    input:
        [str(L.pathways(m, c)) for m in MODELS for c in (P.pathways.checkpoints if P.pathways else [])],
    output:
        csv=str(L.pathways()),
        md=report(str(L.pathways().with_suffix(".md")), caption="../report/pathways_table.rst", category="Pathway matrix"),
    run:
        from mxfp4.io import write_text_atomic
        from mxfp4.report.pathway_table import run as table

        parts = [open(p).read().splitlines() for p in input]
        write_text_atomic(output.csv, "\n".join(parts[0][:1] + [line for p in parts for line in p[1:]]) + "\n")
        table(output.csv, output.md)

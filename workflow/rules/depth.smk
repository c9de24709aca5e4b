rule depth_model:
    """One model's per-layer gradient measures at its warm start: each component, its control and full
    MXFP4 against the unquantized gradient of the same batches, per layer, at each site."""
    input:
        model_input,
    output:
        str(L.depth_units("{model}")),
    wildcard_constraints:
        model=r"[^/]+",  # a model's name, not the optimizers/ folder beside the unit files
    log:
        str(L.log("depth_{model}")),
    threads: 1
    shell:
        "MXFP4_THREADS={threads} {MXFP4} depth --profile {PROFILE} --model {wildcards.model} --out {output} > {log} 2>&1"


rule depth_optimizers_model:
    """One model's short runs from its warm start: per run of GRPO batches and optimizer (SGD, AdamW), the
    per-layer displacement with the scale component injected, its sign-flip control, against no injection."""
    input:
        model_input,
    output:
        str(L.depth_optimizer_units("{model}")),
    log:
        str(L.log("depth_optimizers_{model}")),
    threads: 1
    params:
        made_from=lambda wc: P.depth_optimizers.model_dump_json() if P.depth_optimizers else "",
    shell:
        "MXFP4_THREADS={threads} {MXFP4} depth-optimizers --profile {PROFILE} --model {wildcards.model} --out {output} "
        "> {log} 2>&1"


rule depth_optimizers:
    """Whether the gain reaches the weights: the slope of log(displacement norm ratio) per layer under SGD and
    AdamW, the test fixed in the profile (SGD's excess over the control below AdamW's), and its figure."""
    input:
        [str(L.depth_optimizer_units(m)) for m in TINY_MODELS],
    output:
        csv=str(L.depth_optimizers),
        md=report(str(L.depth_optimizers.with_suffix(".md")), caption="../report/depth_optimizers.rst",
                  category="Depth"),
        png=report(str(L.figure("depth_optimizers", ".png")), caption="../report/depth_optimizers.rst",
                   category="Depth"),
        pdf=str(L.figure("depth_optimizers", ".pdf")),
    run:
        from mxfp4.report.depth_optimizers import run as optimizer_table

        optimizer_table(input, output.csv, figure_stem=output.png.removesuffix(".png"))


rule depth:
    """The depth law: the slope of log(gradient norm ratio) per layer of every model, shallow to deep, and
    the figure of norm ratio and cosine against the layer's distance from the output; the same slope split
    into the gradient's shrink and its misalignment, with the shrinkage-bias test (depth_shrinkage.md); with
    the profile's depth_optimizers, the short SGD and AdamW runs' table too."""
    input:
        units=[str(L.depth_units(m)) for m in TINY_MODELS],
        optimizers=rules.depth_optimizers.output if P.depth_optimizers else [],
    output:
        csv=str(L.depth),
        md=report(str(L.depth.with_suffix(".md")), caption="../report/depth.rst", category="Depth"),
        png=report(str(L.figure("depth", ".png")), caption="../report/depth.rst", category="Depth"),
        pdf=str(L.figure("depth", ".pdf")),
        shrinkage=str(L.depth_shrinkage),
        shrinkage_md=report(str(L.depth_shrinkage.with_suffix(".md")), caption="../report/depth.rst",
                            category="Depth"),
    run:
        from mxfp4.report.depth_shrinkage import run as shrinkage_table
        from mxfp4.report.depth_table import run as depth_table

        depth_table(input.units, output.csv, figure_stem=output.png.removesuffix(".png"))
        shrinkage_table(input.units, output.shrinkage)


rule store_depth:
    """Store the depth study's tables and figures beside the baselines (results/baselines/<profile>/), and its
    per-batch unit files (units/: every slope and test recomputable from them)."""
    input:
        rules.depth.output,
        [str(L.depth_units(m)) for m in TINY_MODELS],
        rules.depth_optimizers.output if P.depth_optimizers else [],
    output:
        touch(str(L.root / "depth_stored.flag")),
    run:
        store_with_baselines(input)

rule depth_model:
    """One model's per-layer gradient measures at its warm start: each component, its control and full
    MXFP4 against the unquantized gradient of the same batches, per layer, at each site."""
    input:
        model_input,
    output:
        str(L.depth_units("{model}")),
    log:
        str(L.log("depth_{model}")),
    threads: 1
    shell:
        "MXFP4_THREADS={threads} {MXFP4} depth --profile {PROFILE} --model {wildcards.model} --out {output} > {log} 2>&1"


rule depth:
    """The depth law: the slope of log(gradient norm ratio) per layer of every model, shallow to deep, and
    the figure of norm ratio and cosine against the layer's distance from the output."""
    input:
        [str(L.depth_units(m)) for m in TINY_MODELS],
    output:
        csv=str(L.depth),
        md=report(str(L.depth.with_suffix(".md")), caption="../report/depth.rst", category="Depth"),
        png=report(str(L.figure("depth", ".png")), caption="../report/depth.rst", category="Depth"),
        pdf=str(L.figure("depth", ".pdf")),
    run:
        from mxfp4.report.depth_table import run as depth_table

        depth_table(input, output.csv, figure_stem=output.png.removesuffix(".png"))


rule store_depth:
    """Store the depth study's table and figure beside the baselines (results/baselines/<profile>/)."""
    input:
        rules.depth.output,
    output:
        touch(str(L.root / "depth_stored.flag")),
    run:
        from mxfp4.io import copy_atomic

        for src in input:
            copy_atomic(src, L.stored(src))

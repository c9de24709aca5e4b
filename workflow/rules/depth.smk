# The depth study's tables, tests and figures over every model; each model's measurements are the registered
# studies depth and depth-optimizers (mxfp4/studies/depth.py, rules study_depth and study_depth_optimizers).
rule depth_optimizers:
    """Whether the gain reaches the weights: the slope of log(displacement norm ratio) per layer under SGD and
    AdamW, and the test fixed in the profile (SGD's excess over the control below AdamW's); its figure is the
    registered figure depth-optimizers."""
    input:
        [str(STUDIES["depth-optimizers"].output(L, m)) for m in TINY_MODELS],
    output:
        csv=str(L.depth_optimizers),
        md=report(str(L.depth_optimizers.with_suffix(".md")), caption="../report/depth_optimizers.rst",
                  category="Depth"),
    run:
        from mxfp4.report.depth_optimizers import run as optimizer_table

        optimizer_table(input, output.csv)


rule depth_table:
    """The depth law: the slope of log(gradient norm ratio) per layer of every model, shallow to deep; the same
    slope split into the gradient's shrink and its misalignment, with the shrinkage-bias test
    (depth_shrinkage.md). Its figure is the registered figure depth."""
    input:
        units=[str(STUDIES["depth"].output(L, m)) for m in TINY_MODELS],
    output:
        csv=str(L.depth),
        md=report(str(L.depth.with_suffix(".md")), caption="../report/depth.rst", category="Depth"),
        shrinkage=str(L.depth_shrinkage),
        shrinkage_md=report(str(L.depth_shrinkage.with_suffix(".md")), caption="../report/depth.rst",
                            category="Depth"),
    run:
        from mxfp4.report.depth_shrinkage import run as shrinkage_table
        from mxfp4.report.depth_table import run as depth_table

        depth_table(input.units, output.csv)
        shrinkage_table(input.units, output.shrinkage)


def depth_outputs(wc=None):
    """The depth study's tables and its registered figures; with the profile's depth_optimizers, the short SGD and
    AdamW runs' table and figure too."""
    figures = study_figures("depth", without=[] if P.depth_optimizers else ["depth-optimizers"])
    return [*rules.depth_table.output, *(rules.depth_optimizers.output if P.depth_optimizers else []), *figures]


rule depth:
    """The depth study: its tables and figures (depth_table, depth_optimizers, the figures depth and
    depth-optimizers)."""
    input:
        depth_outputs,


rule store_depth:
    """Store the depth study's tables and figures beside the baselines (results/baselines/<profile>/), and its
    per-batch unit files (units/: every slope and test recomputable from them)."""
    input:
        depth_outputs,
        [str(STUDIES["depth"].output(L, m)) for m in TINY_MODELS],
    output:
        touch(str(L.root / "depth_stored.flag")),
    run:
        store_with_baselines(input)

rule weight_components:
    """The decomposition of every quantized weight tensor of the warm-started models, in both forms:
    shares, cross term, Shapley shares and the pairwise cosines of the components."""
    input:
        [model_path(m) for m in TINY_MODELS],
    output:
        csv=str(L.weight_components),
        md=report(str(L.weight_components.with_suffix(".md")), caption="../report/weight_components.rst",
                  category="Decomposition"),
    log:
        str(L.log("weight_components")),
    shell:
        "{MXFP4} weight-components --profile {PROFILE} --out {output.csv} > {log} 2>&1"


rule regime:
    """Regime statistics of every GEMM operand (weights, activations, gradients of one GRPO batch) per
    model and layer, beside the published figures for real LLMs (experiments/regime_literature.yaml)."""
    input:
        [model_path(m) for m in TINY_MODELS],
        [str(L.probe_batch(m, SEEDS[0])) for m in MODELS],
        "experiments/regime_literature.yaml",
        [str(L.sibling(p).stored(L.sibling(p).regime)) for p in P.regime_beside],
    output:
        csv=str(L.regime),
        md=report(str(L.regime.with_suffix(".md")), caption="../report/regime.rst", category="Regime"),
    log:
        str(L.log("regime")),
    shell:
        "{MXFP4} regime --profile {PROFILE} --out {output.csv} > {log} 2>&1"


# One rule a registered figure (mxfp4/report/figures.py): figure_<name> (- as _) draws figures/<profile>/<stem>.png
# and .pdf from its input file with `mxfp4 plot <name>`, its caption from workflow/report/; the figures target asks for
# those of no study, a study's target for its own.
for _fig in FIGURES.values():

    rule:
        name:
            f"figure_{_fig.name.replace('-', '_')}"
        input:
            main=str(_fig.source(L)),
            beside=[str(p) for p in _fig.beside(L)],
        output:
            png=report(str(L.figure(_fig.stem, ".png")), caption=f"../report/{_fig.caption_file()}",
                       category=_fig.category),
            pdf=str(L.figure(_fig.stem, ".pdf")),
        params:
            # the shell command is formatted when the job runs, after the loop has moved on: the figure's name
            # travels as a param, fixed when the rule is made
            figure=_fig.name,
            seeds=len(SEEDS),  # read by the captions
            models=", ".join(MODELS),
        log:
            str(L.log(f"figure_{_fig.name.replace('-', '_')}")),
        shell:
            "{MXFP4} plot {params.figure} {input.main} --out {output.png} > {log} 2>&1"


rule figures:
    """Every figure of the profile, and the claims table they support, all made by this run (the
    kernel checks and a short benchmark included; stored reference figures live beside the baselines
    in results/baselines/<profile>/figures/). The cells are named here too:
    Snakemake does not regenerate a deleted intermediate file whose consumers are up to date, so a
    deleted cell is rerun (alone, then the aggregates) only when a target asks for it directly."""
    input:
        ALL_CELLS,
        str(L.claims),
        FIGURE_FILES,
        str(L.weight_components.with_suffix(".md")),
        rules.kernel_checks.output,
        str(L.report),

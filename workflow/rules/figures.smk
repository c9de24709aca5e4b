rule figure_decomposition:
    input:
        str(L.proofs),
    output:
        png=report(str(L.figure("decomposition_shares", ".png")), caption="../report/decomposition_shares.rst", category="Decomposition"),
        pdf=str(L.figure("decomposition_shares", ".pdf")),
    log:
        str(L.log("figure_decomposition")),
    shell:
        "{MXFP4} plot decomposition {input} --out {output.png} > {log} 2>&1"


rule figure_corrections:
    input:
        str(L.corrections),
    output:
        png=report(str(L.figure("correction_effects", ".png")), caption="../report/correction_effects.rst", category="Corrections"),
        pdf=str(L.figure("correction_effects", ".pdf")),
    log:
        str(L.log("figure_corrections")),
    shell:
        "{MXFP4} plot corrections {input} --out {output.png} > {log} 2>&1"


rule figure_training:
    input:
        steps=str(L.table("steps")),
        cells=str(L.table("cells")),  # held-out accuracy before and after RL, read beside steps.csv
    output:
        png=report(str(L.figure("training_curves", ".png")), caption="../report/training_curves.rst", category="Cells"),
        pdf=str(L.figure("training_curves", ".pdf")),
    params:
        seeds=len(SEEDS),
        models=", ".join(MODELS),
    log:
        str(L.log("figure_training")),
    shell:
        "{MXFP4} plot training {input.steps} --out {output.png} > {log} 2>&1"


rule figure_accuracy:
    input:
        cells=str(L.table("cells")),
        summary=str(L.table("summary")),  # the RL gain per problem type, read beside cells.csv
    output:
        png=report(str(L.figure("gsm8k_accuracy", ".png")), caption="../report/gsm8k_accuracy.rst", category="Cells"),
        pdf=str(L.figure("gsm8k_accuracy", ".pdf")),
    params:
        seeds=len(SEEDS),
        models=", ".join(MODELS),
    log:
        str(L.log("figure_accuracy")),
    shell:
        "{MXFP4} plot accuracy {input.cells} --out {output.png} > {log} 2>&1"


rule figure_kernels:
    input:
        str(L.kernel_bench),
    output:
        png=report(str(L.figure("kernel_throughput", ".png")), caption="../report/kernel_throughput.rst", category="Kernels"),
        pdf=str(L.figure("kernel_throughput", ".pdf")),
    log:
        str(L.log("figure_kernels")),
    shell:
        "{MXFP4} plot kernels {input} --out {output.png} > {log} 2>&1"


rule figure_pathways:
    input:
        str(L.pathways()),
    output:
        png=report(str(L.figure("pathway_matrix", ".png")), caption="../report/pathway_matrix.rst", category="Pathway matrix"),
        pdf=str(L.figure("pathway_matrix", ".pdf")),
    log:
        str(L.log("figure_pathways")),
    shell:
        "{MXFP4} plot pathways {input} --out {output.png} > {log} 2>&1"


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
        [str(Layout("results", p).stored(Layout("results", p).regime)) for p in P.regime_beside],
    output:
        csv=str(L.regime),
        md=report(str(L.regime.with_suffix(".md")), caption="../report/regime.rst", category="Regime"),
    log:
        str(L.log("regime")),
    shell:
        "{MXFP4} regime --profile {PROFILE} --out {output.csv} > {log} 2>&1"


rule figure_regime:
    input:
        str(L.regime),
    output:
        png=report(str(L.figure("regime_statistics", ".png")), caption="../report/regime.rst", category="Regime"),
        pdf=str(L.figure("regime_statistics", ".pdf")),
    log:
        str(L.log("figure_regime")),
    shell:
        "{MXFP4} plot regime {input} --out {output.png} > {log} 2>&1"


rule figure_cosines:
    input:
        str(L.weight_components),
    output:
        png=report(str(L.figure("component_cosines", ".png")), caption="../report/component_cosines.rst", category="Decomposition"),
        pdf=str(L.figure("component_cosines", ".pdf")),
    log:
        str(L.log("figure_cosines")),
    shell:
        "{MXFP4} plot cosines {input} --out {output.png} > {log} 2>&1"


rule figure_attribution:
    input:
        str(L.pathways()),
    output:
        png=report(str(L.figure("pathway_attribution", ".png")), caption="../report/pathway_attribution.rst",
                   category="Pathway matrix"),
        pdf=str(L.figure("pathway_attribution", ".pdf")),
    log:
        str(L.log("figure_attribution")),
    shell:
        "{MXFP4} plot attribution {input} --out {output.png} > {log} 2>&1"


rule figures:
    """Every figure of the profile, and the claims table they support, all made by this run (the
    kernel checks and a short benchmark included; stored reference figures live beside the baselines
    in results/baselines/<profile>/figures/). The cells are named here too:
    Snakemake does not regenerate a deleted intermediate file whose consumers are up to date, so a
    deleted cell is rerun (alone, then the aggregates) only when a target asks for it directly."""
    input:
        ALL_CELLS,
        str(L.claims),
        rules.figure_decomposition.output,
        rules.figure_corrections.output,
        rules.figure_training.output,
        rules.figure_accuracy.output,
        rules.figure_kernels.output,
        rules.figure_pathways.output,
        rules.figure_attribution.output,
        rules.figure_cosines.output,
        rules.figure_regime.output,
        str(L.weight_components.with_suffix(".md")),
        rules.kernel_checks.output,
        str(L.report),

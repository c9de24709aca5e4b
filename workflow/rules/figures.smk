rule figure_decomposition:
    input:
        str(L.proofs),
    output:
        png=report(f"{FIGURES}/decomposition_shares.png", caption="../report/decomposition_shares.rst", category="Decomposition"),
        pdf=f"{FIGURES}/decomposition_shares.pdf",
    log:
        f"{LOGS}/figure_decomposition.log",
    shell:
        "{MXFP4} plot decomposition {input} --out {FIGURES}/decomposition_shares > {log} 2>&1"


rule figure_corrections:
    input:
        str(L.corrections),
    output:
        png=report(f"{FIGURES}/correction_effects.png", caption="../report/correction_effects.rst", category="Corrections"),
        pdf=f"{FIGURES}/correction_effects.pdf",
    log:
        f"{LOGS}/figure_corrections.log",
    shell:
        "{MXFP4} plot corrections {input} --out {FIGURES}/correction_effects > {log} 2>&1"


rule figure_training:
    input:
        steps=f"{AGGREGATE}/steps.csv",
        cells=f"{AGGREGATE}/cells.csv",  # held-out accuracy before and after RL, read beside steps.csv
    output:
        png=report(f"{FIGURES}/training_curves.png", caption="../report/training_curves.rst", category="Cells"),
        pdf=f"{FIGURES}/training_curves.pdf",
    params:
        seeds=len(SEEDS),
        models=", ".join(MODELS),
    log:
        f"{LOGS}/figure_training.log",
    shell:
        "{MXFP4} plot training {input.steps} --out {FIGURES}/training_curves > {log} 2>&1"


rule figure_accuracy:
    input:
        f"{AGGREGATE}/cells.csv",
    output:
        png=report(f"{FIGURES}/gsm8k_accuracy.png", caption="../report/gsm8k_accuracy.rst", category="Cells"),
        pdf=f"{FIGURES}/gsm8k_accuracy.pdf",
    params:
        seeds=len(SEEDS),
        models=", ".join(MODELS),
    log:
        f"{LOGS}/figure_accuracy.log",
    shell:
        "{MXFP4} plot accuracy {input} --out {FIGURES}/gsm8k_accuracy > {log} 2>&1"


rule figure_kernels:
    input:
        f"{KERNELS}/bench.json",
    output:
        png=report(f"{FIGURES}/kernel_throughput.png", caption="../report/kernel_throughput.rst", category="Kernels"),
        pdf=f"{FIGURES}/kernel_throughput.pdf",
    log:
        f"{LOGS}/figure_kernels.log",
    shell:
        "{MXFP4} plot kernels {input} --out {FIGURES}/kernel_throughput > {log} 2>&1"


rule figure_pathways:
    input:
        str(L.pathways()),
    output:
        png=report(f"{FIGURES}/pathway_matrix.png", caption="../report/pathway_matrix.rst", category="Pathway matrix"),
        pdf=f"{FIGURES}/pathway_matrix.pdf",
    log:
        f"{LOGS}/figure_pathways.log",
    shell:
        "{MXFP4} plot pathways {input} --out {FIGURES}/pathway_matrix > {log} 2>&1"


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
        f"{LOGS}/weight_components.log",
    shell:
        "{MXFP4} weight-components --profile {PROFILE} --out {output.csv} > {log} 2>&1"


rule regime:
    """Regime statistics of every GEMM operand (weights, activations, gradients of one GRPO batch) per
    model and layer, beside the published figures for real LLMs (experiments/regime_literature.yaml)."""
    input:
        [model_path(m) for m in TINY_MODELS],
        [str(L.probe_batch(m, SEEDS[0])) for m in MODELS],
        "experiments/regime_literature.yaml",
    output:
        csv=str(L.regime),
        md=report(str(L.regime.with_suffix(".md")), caption="../report/regime.rst", category="Regime"),
    log:
        f"{LOGS}/regime.log",
    shell:
        "{MXFP4} regime --profile {PROFILE} --out {output.csv} > {log} 2>&1"


rule figure_regime:
    input:
        str(L.regime),
    output:
        png=report(f"{FIGURES}/regime_statistics.png", caption="../report/regime.rst", category="Regime"),
        pdf=f"{FIGURES}/regime_statistics.pdf",
    log:
        f"{LOGS}/figure_regime.log",
    shell:
        "{MXFP4} plot regime {input} --out {FIGURES}/regime_statistics > {log} 2>&1"


rule figure_cosines:
    input:
        str(L.weight_components),
    output:
        png=report(f"{FIGURES}/component_cosines.png", caption="../report/component_cosines.rst", category="Decomposition"),
        pdf=f"{FIGURES}/component_cosines.pdf",
    log:
        f"{LOGS}/figure_cosines.log",
    shell:
        "{MXFP4} plot cosines {input} --out {FIGURES}/component_cosines > {log} 2>&1"


rule figure_attribution:
    input:
        str(L.pathways()),
    output:
        png=report(f"{FIGURES}/pathway_attribution.png", caption="../report/pathway_attribution.rst",
                   category="Pathway matrix"),
        pdf=f"{FIGURES}/pathway_attribution.pdf",
    log:
        f"{LOGS}/figure_attribution.log",
    shell:
        "{MXFP4} plot attribution {input} --out {FIGURES}/pathway_attribution > {log} 2>&1"


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

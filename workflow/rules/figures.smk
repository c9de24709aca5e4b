rule figure_decomposition:
    input:
        f"{RESULTS}/proofs/proofs.json",
    output:
        multiext(f"{FIGURES}/decomposition_shares", ".png", ".pdf"),
    log:
        f"{RESULTS}/logs/figure_decomposition.log",
    shell:
        "{MXFP4} plot decomposition {input} --out {FIGURES}/decomposition_shares > {log} 2>&1"


rule figure_corrections:
    input:
        f"{RESULTS}/corrections.json",
    output:
        multiext(f"{FIGURES}/correction_effects", ".png", ".pdf"),
    log:
        f"{RESULTS}/logs/figure_corrections.log",
    shell:
        "{MXFP4} plot corrections {input} --out {FIGURES}/correction_effects > {log} 2>&1"


rule figure_training:
    input:
        f"{RESULTS}/aggregate/steps.csv",
    output:
        multiext(f"{FIGURES}/training_curves", ".png", ".pdf"),
    log:
        f"{RESULTS}/logs/figure_training.log",
    shell:
        "{MXFP4} plot training {input} --out {FIGURES}/training_curves > {log} 2>&1"


rule figure_accuracy:
    input:
        f"{RESULTS}/aggregate/cells.csv",
    output:
        multiext(f"{FIGURES}/gsm8k_accuracy", ".png", ".pdf"),
    log:
        f"{RESULTS}/logs/figure_accuracy.log",
    shell:
        "{MXFP4} plot accuracy {input} --out {FIGURES}/gsm8k_accuracy > {log} 2>&1"


rule figure_kernels:
    input:
        f"{RESULTS}/kernels/bench.json",
    output:
        multiext(f"{FIGURES}/kernel_throughput", ".png", ".pdf"),
    log:
        f"{RESULTS}/logs/figure_kernels.log",
    shell:
        "{MXFP4} plot kernels {input} --out {FIGURES}/kernel_throughput > {log} 2>&1"


rule figure_pathways:
    input:
        f"{RESULTS}/pathways/pathways.csv",
    output:
        multiext(f"{FIGURES}/pathway_matrix", ".png", ".pdf"),
    log:
        f"{RESULTS}/logs/figure_pathways.log",
    shell:
        "{MXFP4} plot pathways {input} --out {FIGURES}/pathway_matrix > {log} 2>&1"


rule figures:
    """Every figure of the profile, and the claims table they support, all made by this run (the
    kernel checks and a short benchmark included; stored reference figures live beside the baselines
    in results/baselines/<profile>/figures/). The cells are named here too:
    Snakemake does not regenerate a deleted intermediate file whose consumers are up to date, so a
    deleted cell is rerun (alone, then the aggregates) only when a target asks for it directly."""
    input:
        ALL_CELLS,
        f"{RESULTS}/claims.md",
        rules.figure_decomposition.output,
        rules.figure_corrections.output,
        rules.figure_training.output,
        rules.figure_accuracy.output,
        rules.figure_kernels.output,
        rules.figure_pathways.output,
        rules.kernel_checks.output,

rule figure_decomposition:
    input:
        f"{RESULTS}/proofs/proofs.json",
    output:
        png=f"{FIGURES}/decomposition_shares.png",
        pdf=f"{FIGURES}/decomposition_shares.pdf",
    log:
        f"{RESULTS}/logs/figure_decomposition.log",
    shell:
        "mxfp4 plot decomposition --proofs {input} --out {FIGURES}/decomposition_shares > {log} 2>&1"


rule figures:
    input:
        rules.figure_decomposition.output,

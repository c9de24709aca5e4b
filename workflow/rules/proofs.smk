rule prove_decomposition:
    """Numerical check of the exact decomposition identity over the standard distributions and formats."""
    output:
        f"{RESULTS}/proofs/proofs.json",
    log:
        f"{RESULTS}/logs/proofs.log",
    threads: 1
    shell:
        "{MXFP4} prove --out {output} 2> {log}"

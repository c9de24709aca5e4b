rule prove_decomposition:
    """Numerical check of the exact decomposition identity over the standard distributions and formats."""
    output:
        str(L.proofs),
    log:
        str(L.log("proofs")),
    threads: 1
    shell:
        "{MXFP4} prove --out {output} 2> {log}"

rule gpu_smoke:
    """The GPU smoke report of a one-model, one-seed profile (gpu-smoke): every recipe's cell run, then
    step and generation time against BF16, peak memory, weight update, rollout backend. A cell that
    fails is reported as failed (run with --keep-going, as the local and SLURM profiles do)."""
    input:
        ALL_CELLS,
    output:
        str(GPU_SMOKE_DENSE),
    log:
        str(L.log("gpu_smoke")),
    shell:
        "{MXFP4} gpu-smoke-report --profile {PROFILE} --out {output} > {log} 2>&1"

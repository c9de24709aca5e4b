rule kernel_checks:
    """Every Triton kernel bit-exact against the reference (interpreter on CPU, the GPU when present)."""
    output:
        f"{RESULTS}/kernels/checks.json",
    log:
        f"{RESULTS}/logs/kernel_checks.log",
    threads: 1
    shell:
        "OMP_NUM_THREADS={threads} {PYTHON} kernels/check_kernels.py --out {output} > {log} 2>&1"


rule kernel_bench:
    """Throughput of each path against the copy bandwidth and torchao, same run."""
    output:
        f"{RESULTS}/kernels/bench.json",
    log:
        f"{RESULTS}/logs/kernel_bench.log",
    params:
        shapes=P.bench_shapes,
    threads: workflow.cores
    shell:
        "{PYTHON} kernels/bench_kernels.py --out {output} --runs 1 --reps 3 "
        "$( [ -n '{params.shapes}' ] && echo --shapes {params.shapes} ) > {log} 2>&1"

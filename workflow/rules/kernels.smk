rule kernel_checks:
    """Every Triton kernel bit-exact against the reference: on the GPU when present, every input dtype;
    under the interpreter on CPU the bfloat16 inputs the harness trains with (a third of the time; the
    test suite checks every dtype)."""
    output:
        f"{KERNELS}/checks.json",
    log:
        f"{LOGS}/kernel_checks.log",
    threads: 1
    shell:
        "OMP_NUM_THREADS={threads} {PYTHON} kernels/check_kernels.py --interpreter-dtype bfloat16 --out {output} > {log} 2>&1"


rule kernel_bench:
    """Throughput of each path against the copy bandwidth and torchao, same run."""
    output:
        f"{KERNELS}/bench.json",
    log:
        f"{LOGS}/kernel_bench.log",
    params:
        shapes=P.bench_shapes,
    threads: workflow.cores
    shell:
        "{PYTHON} kernels/bench/bench_kernels.py --out {output} --runs 1 --reps 3 "
        "$( [ -n '{params.shapes}' ] && echo --shapes {params.shapes} ) > {log} 2>&1"

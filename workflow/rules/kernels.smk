rule kernel_checks:
    """Every Triton kernel bit-exact against the reference: on the GPU when present, every input dtype;
    under the interpreter on CPU the bfloat16 inputs the harness trains with (a third of the time; the
    test suite checks every dtype)."""
    output:
        str(L.kernel_checks),
    log:
        str(L.log("kernel_checks")),
    threads: 1
    shell:
        "OMP_NUM_THREADS={threads} {PYTHON} kernels/check_kernels.py --interpreter-dtype bfloat16 --out {output} > {log} 2>&1"


rule kernel_bench:
    """Throughput of each path against the copy bandwidth and torchao, same run."""
    output:
        str(L.kernel_bench),
    log:
        str(L.log("kernel_bench")),
    params:
        shapes=P.bench_shapes,
    threads: workflow.cores
    shell:
        "{PYTHON} kernels/bench/bench_kernels.py --out {output} --runs 1 --reps 3 "
        "$( [ -n '{params.shapes}' ] && echo --shapes {params.shapes} ) > {log} 2>&1"

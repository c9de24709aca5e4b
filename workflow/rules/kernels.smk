rule cpu_kernel:
    """The fused C++ CPU quantizer built once (cached on disk for every later job), beside the warm starts' SFT;
    otherwise the first quantizing jobs meet the build together, one compiling while the others wait on its lock
    with their cores idle."""
    output:
        str(L.cpu_kernel),
    log:
        str(L.log("cpu_kernel")),
    threads: 1
    priority: 20
    shell:
        "{PYTHON} kernels/build_cpu_kernel.py --out {output} > {log} 2>&1"


rule kernel_checks:
    """Every Triton kernel bit-exact against the reference: on the GPU when present, every input dtype;
    under the interpreter on CPU the bfloat16 inputs the harness trains with (a third of the time; the
    test suite checks every dtype)."""
    input:
        CPU_KERNEL,
    output:
        str(L.kernel_checks),
    log:
        str(L.log("kernel_checks")),
    threads: 1
    shell:
        "OMP_NUM_THREADS={threads} {PYTHON} kernels/check_kernels.py --interpreter-dtype bfloat16 --out {output} > {log} 2>&1"


rule kernel_bench:
    """Throughput of each path against the copy bandwidth and torchao, same run."""
    input:
        CPU_KERNEL,
    output:
        str(L.kernel_bench),
    log:
        str(L.log("kernel_bench")),
    params:
        shapes=P.bench_shapes,
        compile_peer="" if P.bench_compile_peer else "--no-compile",
    threads: workflow.cores
    shell:
        "{PYTHON} kernels/bench/bench_kernels.py --out {output} --runs 1 --reps 3 {params.compile_peer} "
        "$( [ -n '{params.shapes}' ] && echo --shapes {params.shapes} ) > {log} 2>&1"

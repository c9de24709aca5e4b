#!/usr/bin/env bash
# The device calls that measure issue 13's targets, each inside the device tool's 10-minute limit
# (kernels/NOTES.md: what each one checks and what it predicts). Run from the repository root on the
# device machine; every step writes JSON into $OUT (the device tool's return folder):
#
#   bash kernels/gpu_session.sh checks    # bit-exact on the device: every kernel, dtype, rule, layout; the GEMMs
#   bash kernels/gpu_session.sh memory1   # memory-bound rows at 16384x8192 and 8192x4096, copy bandwidth beside
#   bash kernels/gpu_session.sh memory2   # 8192x11008, the Qwen3-30B-A3B expert stack, a decode shape
#   bash kernels/gpu_session.sh gemm      # W4A16 decode and prefill, tl.dot_scaled, dequantize + cuBLAS, cuBLAS BF16
#   bash kernels/gpu_session.sh stats-patch  # memory rows at 16384x8192 with kernels/patches/stats_fewer_instructions.patch
#                                            # applied (then reverted): keep it if its stats rows beat memory1's
#
# Two steps fit one call (checks + memory1, memory2 + gemm; stats-patch alone). torchao (the peer) travels as a wheel in
# .whl/ (excluded from git; carry it) and is installed without its dependencies.
set -euo pipefail
OUT=${OUT:-results/bench/gpu}
mkdir -p "$OUT"
if ls .whl/torchao-*.whl >/dev/null 2>&1; then
    pip install --no-deps --quiet .whl/torchao-*.whl
fi
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/device.csv"
for step in "$@"; do
    case "$step" in
        checks)  MXFP4_AUTOTUNE=0 timeout 280 python kernels/check_kernels.py --out "$OUT/checks.json" ;;
        memory1) TRITON_PRINT_AUTOTUNING=1 timeout 280 python kernels/bench_kernels.py --only memory \
                     --shapes 16384x8192,8192x4096 --out "$OUT/bench_memory1.json" ;;
        memory2) TRITON_PRINT_AUTOTUNING=1 timeout 280 python kernels/bench_kernels.py --only memory \
                     --shapes 8192x11008,128x768x2048,64x2048 --out "$OUT/bench_memory2.json" ;;
        gemm)    TRITON_PRINT_AUTOTUNING=1 timeout 280 python kernels/bench_kernels.py --only gemm --out "$OUT/bench_gemm.json" ;;
        stats-patch) patch -p1 --forward --quiet < kernels/patches/stats_fewer_instructions.patch
                 MXFP4_AUTOTUNE=0 timeout 120 python kernels/check_kernels.py --out "$OUT/checks_stats_patch.json" || true
                 TRITON_PRINT_AUTOTUNING=1 timeout 280 python kernels/bench_kernels.py --only memory \
                     --shapes 16384x8192 --out "$OUT/bench_memory_stats_patch.json" || true
                 patch -p1 -R --quiet < kernels/patches/stats_fewer_instructions.patch ;;
        *) echo "unknown step '$step': checks, memory1, memory2, gemm or stats-patch" >&2; exit 2 ;;
    esac || echo "step $step stopped with exit status $? (its JSON keeps what it measured)" >&2
done

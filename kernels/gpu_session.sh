#!/usr/bin/env bash
# The one entry point on a GPU machine (issue 26): run from the repository root with the .whl bundle
# carried (kernels/fetch_gpu_wheels.sh makes it). Every step writes JSON into $OUT as it goes (the
# device tool's return folder), so a step stopped at its time limit keeps what it measured:
#
#   bash kernels/gpu_session.sh stack          # versions, free disk, the GPU, imports of trl and lm-eval, unmet requirements
#   bash kernels/gpu_session.sh tests          # MXFP4_TEST_CUDA=1 pytest -m gpu: the compiled CUDA paths
#   bash kernels/gpu_session.sh smoke-dense1   # gpu-smoke-quick cells bf16, mxfp4, mxfp4+macro  -> gpu_smoke_dense.json
#   bash kernels/gpu_session.sh smoke-dense2   # gpu-smoke-quick cells mxfp4+fallback, mxfp4+aqn, mxfp4+all
#   bash kernels/gpu_session.sh smoke-moe      # Qwen3-30B-A3B expert layers: bf16 vs grouped MXFP4 vs per-expert -> gpu_smoke_moe.json
#   bash kernels/gpu_session.sh checks         # bit-exact on the device: every kernel, dtype, rule, layout; the GEMMs
#   bash kernels/gpu_session.sh memory1        # memory-bound rows at 16384x8192 and 8192x4096, copy bandwidth beside
#   bash kernels/gpu_session.sh memory2        # 8192x11008, the Qwen3-30B-A3B expert stack, a decode shape
#   bash kernels/gpu_session.sh gemm           # W4A16 decode and prefill, tl.dot_scaled, dequantize + cuBLAS, cuBLAS BF16
#   bash kernels/gpu_session.sh stats-patch    # memory rows with kernels/patches/stats_fewer_instructions.patch applied
#
# Planned calls (each within the device tool's 10 minutes): "stack tests smoke-moe", "smoke-dense1",
# "smoke-dense2", "checks memory1", "memory2 gemm". kernels/NOTES.md says what each kernel step predicts.
set -uo pipefail
OUT=${OUT:-results/gpu/session}
RESULTS=${RESULTS:-/tmp/mxfp4-results}
mkdir -p "$OUT" "$RESULTS"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then   # the packages the machine lacks (kernels/gpu_wheels.txt)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "installing the carried wheels failed" >&2; exit 3; }
    export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/device.csv" 2>/dev/null || true

smoke_dense() {   # the given recipes' gpu-smoke-quick cells, the report rewritten after each
    for recipe in "$@"; do
        timeout 290 python3 -m mxfp4 cell --profile gpu-smoke-quick --model qwen2.5-3b-random --recipe "$recipe" \
            --seed 0 --results "$RESULTS" > "$OUT/cell_$recipe.log" 2>&1 \
            || echo "cell $recipe stopped with exit status $?" >&2
        python3 -m mxfp4 gpu-smoke-report --profile gpu-smoke-quick --results "$RESULTS" \
            --out "$OUT/gpu_smoke_dense.json" >> "$OUT/gpu_smoke_report.log" 2>&1 || true
    done
}

for step in "$@"; do
    case "$step" in
        stack) python3 - > "$OUT/stack.json" <<'PY'
import importlib, json, shutil
out = {"disk_free_gib": shutil.disk_usage(".").free / 2**30, "tmp_free_gib": shutil.disk_usage("/tmp").free / 2**30}
for name in ("torch", "triton", "transformers", "accelerate", "trl", "lm_eval", "datasets", "pydantic", "torchao"):
    try:
        out[name] = getattr(importlib.import_module(name), "__version__", "imported")
    except Exception as err:  # a missing or broken package: say which and why
        out[name] = f"import failed: {type(err).__name__}: {err}"
import torch
out["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
print(json.dumps(out, indent=1))
PY
               cat "$OUT/stack.json"
               python3 kernels/gpu_bundle.py --installed --out "$OUT/stack_requirements.json" ;;
        tests) MXFP4_TEST_CUDA=1 timeout 400 python3 -m pytest -m gpu -q -p no:cacheprovider \
                   --junitxml="$OUT/tests_gpu.xml" tests > "$OUT/tests_gpu.log" 2>&1
               tail -3 "$OUT/tests_gpu.log" ;;
        smoke-dense1) smoke_dense bf16 mxfp4 mxfp4+macro ;;
        smoke-dense2) smoke_dense mxfp4+fallback mxfp4+aqn mxfp4+all ;;
        smoke-moe) timeout 280 python3 kernels/bench_moe.py --device cuda --compute bfloat16 --cases all --reps 3 \
                       --out "$OUT/gpu_smoke_moe.json" ;;
        checks)  MXFP4_AUTOTUNE=0 timeout 280 python3 kernels/check_kernels.py --out "$OUT/checks.json" ;;
        memory1) TRITON_PRINT_AUTOTUNING=1 timeout 280 python3 kernels/bench_kernels.py --only memory \
                     --shapes 16384x8192,8192x4096 --out "$OUT/bench_memory1.json" ;;
        memory2) TRITON_PRINT_AUTOTUNING=1 timeout 280 python3 kernels/bench_kernels.py --only memory \
                     --shapes 8192x11008,128x768x2048,64x2048 --out "$OUT/bench_memory2.json" ;;
        gemm)    TRITON_PRINT_AUTOTUNING=1 timeout 280 python3 kernels/bench_kernels.py --only gemm --out "$OUT/bench_gemm.json" ;;
        stats-patch) patch -p1 --forward --quiet < kernels/patches/stats_fewer_instructions.patch
                 MXFP4_AUTOTUNE=0 timeout 120 python3 kernels/check_kernels.py --out "$OUT/checks_stats_patch.json" || true
                 TRITON_PRINT_AUTOTUNING=1 timeout 280 python3 kernels/bench_kernels.py --only memory \
                     --shapes 16384x8192 --out "$OUT/bench_memory_stats_patch.json" || true
                 patch -p1 -R --quiet < kernels/patches/stats_fewer_instructions.patch ;;
        *) echo "unknown step '$step': stack, tests, smoke-dense1, smoke-dense2, smoke-moe, checks, memory1, memory2," \
                "gemm or stats-patch" >&2; exit 2 ;;
    esac || echo "step $step stopped with exit status $? (its JSON keeps what it measured)" >&2
done

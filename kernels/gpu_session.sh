#!/usr/bin/env bash
# The one entry point on a GPU machine (issue 26): run from the repository root with the .whl bundle
# carried (kernels/fetch_gpu_wheels.sh makes it). Every step writes JSON into $OUT as it goes (the
# device tool's return folder), so a step stopped at its time limit keeps what it measured:
#
#   bash kernels/gpu_session.sh stack          # versions, free disk, the GPU, imports of trl and lm-eval, unmet requirements
#   bash kernels/gpu_session.sh tests          # MXFP4_TEST_CUDA=1 pytest -m gpu: the compiled CUDA paths
#   bash kernels/gpu_session.sh smoke-dense1   # gpu-smoke-quick cells bf16, mxfp4, mxfp4+macro  -> gpu_smoke_dense.json
#   bash kernels/gpu_session.sh smoke-dense2   # gpu-smoke-quick cells bf16, mxfp4+fallback, mxfp4+aqn, mxfp4+all
#   bash kernels/gpu_session.sh smoke-moe      # Qwen3-30B-A3B expert layers: bf16 vs grouped MXFP4 vs per-expert -> gpu_smoke_moe.json
#   bash kernels/gpu_session.sh checks         # bit-exact on the device: every kernel, dtype, rule, layout; the GEMMs
#   bash kernels/gpu_session.sh memory1        # memory-bound rows at 16384x8192 and 8192x4096, copy bandwidth beside
#   bash kernels/gpu_session.sh memory2        # 8192x11008, the Qwen3-30B-A3B expert stack, a decode shape
#   bash kernels/gpu_session.sh gemm           # W4A16 decode and prefill, tl.dot_scaled, dequantize + cuBLAS, cuBLAS BF16
#   bash kernels/gpu_session.sh stats-patch    # memory rows with kernels/patches/stats_fewer_instructions.patch applied
#
# Each dense half runs its own bf16 cell: a call may land on a fresh machine, and times are compared only
# within one run (`mxfp4 gpu-smoke-report --results A --results B` joins the halves, each recipe against its
# own run's bf16, and the two bf16 cells against each other as an A/A check). The cells' results are
# written under $OUT/results so that they come back.
#
# A call's steps share one deadline, DEADLINE_S seconds after the script starts (default 540, inside the
# device tool's 600 s): each step's timeout is its own cap or the time left, whichever is less, and a step
# that would get under 30 s is skipped. So name the steps in order of priority; $OUT/steps.tsv records
# each step's wall time and exit status for planning the next call. Set DEADLINE_S lower when the session
# has less device time left than a full call.
#
# Planned calls for a 30-minute session, in this order (issue each as soon as the previous returns, within
# the tool's 30 s idle release, so that the warm machine keeps /tmp/site and the Triton cache):
#   1. stack smoke-moe smoke-dense1     2. smoke-dense2 tests     3. checks memory1 gemm memory2
# kernels/NOTES.md says what each kernel step predicts.
set -uo pipefail
OUT=${OUT:-results/gpu/session}
RESULTS=${RESULTS:-$OUT/results}
DEADLINE_S=${DEADLINE_S:-540}
mkdir -p "$OUT" "$RESULTS"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then   # the packages the machine lacks (kernels/gpu_wheels.txt)
    bundle=$(ls .whl | sha1sum)
    if [ "$(cat /tmp/site/.bundle 2>/dev/null)" != "$bundle" ]; then   # a warm machine keeps them
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl || { echo "installing the carried wheels failed" >&2; exit 3; }
        echo "$bundle" > /tmp/site/.bundle
    fi
    export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/device.csv" 2>/dev/null || true

left() { echo $(( DEADLINE_S - SECONDS )); }   # SECONDS: since the script started
cap() { local l; l=$(left); (( l > 1 )) || l=1; echo $(( $1 < l ? $1 : l )); }   # its own cap or the time left

smoke_dense() {   # the given recipes' gpu-smoke-quick cells, the report rewritten after each
    for recipe in "$@"; do
        if (( $(left) < 60 )); then echo "cell $recipe skipped: $(left) s left before the deadline" >&2; continue; fi
        log="$RESULTS/gpu-smoke-quick/logs/cell_qwen2.5-3b-random_${recipe}_seed0.log"   # Layout.cell_log
        mkdir -p "$(dirname "$log")"
        timeout "$(cap 290)" python3 -m mxfp4 cell --profile gpu-smoke-quick --model qwen2.5-3b-random \
            --recipe "$recipe" --seed 0 --results "$RESULTS" > "$log" 2>&1 \
            || echo "cell $recipe stopped with exit status $?" >&2
        python3 -m mxfp4 gpu-smoke-report --profile gpu-smoke-quick --results "$RESULTS" \
            --out "$OUT/gpu_smoke_dense.json" >> "$OUT/gpu_smoke_report.log" 2>&1 || true
    done
}

for step in "$@"; do
    if (( $(left) < 30 )); then
        echo "step $step skipped: $(left) s left before the deadline (DEADLINE_S=$DEADLINE_S)" >&2
        printf '%s\tskipped\t0\n' "$step" >> "$OUT/steps.tsv"; continue
    fi
    began=$SECONDS
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
               python3 kernels/gpu_bundle.py --installed --out "$OUT/stack_requirements.json" \
                   || echo "unmet requirements: $OUT/stack_requirements.json names them" >&2 ;;
        tests) MXFP4_TEST_CUDA=1 timeout "$(cap 400)" python3 -m pytest -m gpu -q -p no:cacheprovider \
                   --junitxml="$OUT/tests_gpu.xml" tests > "$OUT/tests_gpu.log" 2>&1
               tail -3 "$OUT/tests_gpu.log" ;;
        smoke-dense1) smoke_dense bf16 mxfp4 mxfp4+macro ;;
        smoke-dense2) smoke_dense bf16 mxfp4+fallback mxfp4+aqn mxfp4+all ;;
        smoke-moe) timeout "$(cap 150)" python3 kernels/bench_moe.py --device cuda --compute bfloat16 --cases all --reps 3 \
                       --out "$OUT/gpu_smoke_moe.json" ;;
        checks)  MXFP4_AUTOTUNE=0 timeout "$(cap 280)" python3 kernels/check_kernels.py --out "$OUT/checks.json" ;;
        memory1) TRITON_PRINT_AUTOTUNING=1 timeout "$(cap 280)" python3 kernels/bench_kernels.py --only memory \
                     --shapes 16384x8192,8192x4096 --out "$OUT/bench_memory1.json" ;;
        memory2) TRITON_PRINT_AUTOTUNING=1 timeout "$(cap 280)" python3 kernels/bench_kernels.py --only memory \
                     --shapes 8192x11008,128x768x2048,64x2048 --out "$OUT/bench_memory2.json" ;;
        gemm)    TRITON_PRINT_AUTOTUNING=1 timeout "$(cap 280)" python3 kernels/bench_kernels.py --only gemm --out "$OUT/bench_gemm.json" ;;
        stats-patch) patch -p1 --forward --quiet < kernels/patches/stats_fewer_instructions.patch
                 MXFP4_AUTOTUNE=0 timeout "$(cap 120)" python3 kernels/check_kernels.py --out "$OUT/checks_stats_patch.json" || true
                 TRITON_PRINT_AUTOTUNING=1 timeout "$(cap 280)" python3 kernels/bench_kernels.py --only memory \
                     --shapes 16384x8192 --out "$OUT/bench_memory_stats_patch.json" || true
                 patch -p1 -R --quiet < kernels/patches/stats_fewer_instructions.patch ;;
        *) echo "unknown step '$step': stack, tests, smoke-dense1, smoke-dense2, smoke-moe, checks, memory1, memory2," \
                "gemm or stats-patch" >&2; exit 2 ;;
    esac
    status=$?
    (( status == 0 )) || echo "step $step stopped with exit status $status (its JSON keeps what it measured)" >&2
    printf '%s\t%s\t%s\n' "$step" "$status" "$(( SECONDS - began ))" >> "$OUT/steps.tsv"
done

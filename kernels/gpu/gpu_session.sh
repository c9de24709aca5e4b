#!/usr/bin/env bash
# The one entry point on a GPU machine: run from the repository root with the .whl bundle
# carried (kernels/gpu/fetch_gpu_wheels.sh makes it). Every step writes JSON into $OUT as it goes (the
# device tool's return folder), so a step stopped at its time limit keeps what it measured:
#
#   bash kernels/gpu/gpu_session.sh stack          # versions, free disk, the GPU, imports of trl and lm-eval, unmet requirements
#   bash kernels/gpu/gpu_session.sh tests          # MXFP4_TEST_CUDA=1 pytest -m gpu: the compiled CUDA paths (first configs;
#                                              # the benchmark checks the tuned ones bit for bit before timing)
#   bash kernels/gpu/gpu_session.sh smoke-dense1   # gpu-smoke-quick cells bf16, mxfp4, mxfp4+macro  -> gpu_smoke_dense.json
#   bash kernels/gpu/gpu_session.sh smoke-dense2   # gpu-smoke-quick cells bf16, mxfp4+fallback, mxfp4+aqn, mxfp4+all
#   bash kernels/gpu/gpu_session.sh smoke:mxfp4+all,mxfp4+macro   # bf16, then the named cells (what a device still lacks)
#   bash kernels/gpu/gpu_session.sh smoke-moe      # Qwen3-30B-A3B expert layers: bf16 vs grouped MXFP4 vs per-expert -> gpu_smoke_moe.json
#   bash kernels/gpu/gpu_session.sh layer          # real-shape dense and MoE layers, every recipe: host vs device, launches,
#                                              # where the decode host time goes -> bench_layer.json
#   bash kernels/gpu/gpu_session.sh layer-unfused  # the correction recipes with their hooks composed in torch ops (the fused
#                                              # kernels off): before against after in one call -> bench_layer_unfused.json
#   bash kernels/gpu/gpu_session.sh layer-unshared # plain and combined recipes with each layer quantizing its own copy of a
#                                              # shared input (q/k/v, gate/up): before against after -> bench_layer_unshared.json
#   bash kernels/gpu/gpu_session.sh corrected      # the corrections' fused Triton kernel compiled, bit-exact on the device
#   bash kernels/gpu/gpu_session.sh checks         # bit-exact on the device: every kernel, dtype, rule, layout; the GEMMs
#   bash kernels/gpu/gpu_session.sh configs        # each config of every autotune space forced and checked (the tuner may pick any)
#   bash kernels/gpu/gpu_session.sh memory1        # memory-bound rows at 16384x8192 and 8192x4096, copy bandwidth beside
#   bash kernels/gpu/gpu_session.sh memory2        # 8192x11008, the Qwen3-30B-A3B expert stack, a decode shape
#   bash kernels/gpu/gpu_session.sh gemm           # W4A16 decode and prefill, tl.dot_scaled, dequantize + cuBLAS, cuBLAS BF16
#   bash kernels/gpu/gpu_session.sh stats-patch    # memory rows with kernels/gpu/patches/stats_fewer_instructions.patch applied
#
# What comes back from the device tool's $OUT is limited (8 files, 16 MiB each, two folders deep, names of
# letters, digits, '.', '_', '-': no '+', so no recipe-named files). So every step works in $WORK (a folder
# of this call) and, after each step, `publish` copies the headline files flat into $OUT (steps.tsv,
# stack.json, gpu_smoke_dense.json, gpu_smoke_moe.json, checks.json, bench_*.json, tests_gpu.log) and packs
# the rest (cell results and logs, lm-eval outputs, every log) into $OUT/session.tgz, leaving out weights.
#
# Each dense half runs its own bf16 cell: a call may land on a fresh machine, and times are compared only
# within one run (`mxfp4 gpu-smoke-report --results A --results B` joins the halves, each recipe against its
# own run's bf16, and the two bf16 cells against each other as an A/A check; unpack each call's
# session.tgz and pass its results/ folder).
#
# A call's steps share one deadline, DEADLINE_S seconds after the script starts (default 540, inside the
# device tool's 600 s): each step's timeout is its own cap or the time left, whichever is less, and a step
# that would get under 30 s is skipped. So name the steps in order of priority; $OUT/steps.tsv records
# each step's wall time and exit status for planning the next call. Set DEADLINE_S lower when the session
# has less device time left than a full call.
#
# Which calls to send, for the device time a session has: kernels/gpu/README.md ("On the device"), the
# one place the plan is kept, with what the stored calls fitted.
# Back here, `python kernels/gpu/collect_gpu_session.py CALL1 [CALL2 ...]` (the folders the calls brought back)
# merges what the calls measured into the GPU result files and prints every target.
# docs/kernels.md says what each kernel step predicts.
set -uo pipefail
STEPS="stack tests corrected smoke-dense1 smoke-dense2 smoke-moe layer layer-unfused layer-unshared checks configs memory1 memory2 gemm stats-patch"
SMOKE_RECIPES="bf16 mxfp4 mxfp4+macro mxfp4+fallback mxfp4+aqn mxfp4+all"   # the gpu-smoke-quick profile's
for step in "$@"; do   # every name checked before any device time is spent
    if [[ $step == smoke:* ]]; then
        IFS=, read -ra picked <<< "${step#smoke:}"
        (( ${#picked[@]} )) || { echo "step '$step' names no recipe; the recipes: $SMOKE_RECIPES" >&2; exit 2; }
        for recipe in "${picked[@]}"; do
            [ "$recipe" != bf16 ] || { echo "step '$step': bf16 runs first in every smoke step; name the others" >&2; exit 2; }
            [[ " $SMOKE_RECIPES " == *" $recipe "* ]] \
                || { echo "unknown recipe '$recipe' in step '$step'; the recipes: $SMOKE_RECIPES" >&2; exit 2; }
        done
        continue
    fi
    [[ " $STEPS " == *" $step "* ]] \
        || { echo "unknown step '$step'; the steps: $STEPS, smoke:<recipe>[,<recipe>...]" >&2; exit 2; }
done

OUT=${OUT:-results/gpu/session}
WORK=${WORK:-/tmp/gpu-session-$(date +%s)}   # this call's own: a warm machine keeps earlier calls' folders
RESULTS=$WORK/results
DEADLINE_S=${DEADLINE_S:-540}
SMOKE_PROFILE=${SMOKE_PROFILE:-gpu-smoke-quick}   # the dense cells' profile and model (one model, one seed)
SMOKE_MODEL=${SMOKE_MODEL:-qwen2.5-3b-random}
SMOKE_AUTOTUNE=${SMOKE_AUTOTUNE:-1}   # 0: the cells' kernels run each space's first config (no tuning compiles)
SMOKE_CELL_CAP_S=${SMOKE_CELL_CAP_S:-290}   # one cell's cap; mxfp4+all (about 310 s on an H100) needs more
for knob in DEADLINE_S SMOKE_CELL_CAP_S; do   # checked before any device time is spent
    [[ ${!knob} =~ ^[0-9]+$ ]] || { echo "$knob='${!knob}' is not a whole number of seconds" >&2; exit 2; }
done
mkdir -p "$OUT" "$WORK" "$RESULTS"
export PYTHONUNBUFFERED=1
# No network there: libraries that would ask the hub fail at once instead of waiting on a timeout
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
WHEELS=${WHEELS:-.whl}   # the packages the machine lacks (kernels/gpu/gpu_wheels.txt); none: the environment has them all
SITE=${SITE:-/tmp/site}  # where they go: outside the work tree, so a warm machine's next call finds them
if [ "$WHEELS" = none ]; then
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
elif ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    bundle=$(ls "$WHEELS" | sha1sum)
    if [ "$(cat "$SITE/.bundle" 2>/dev/null)" != "$bundle" ]; then   # a warm machine keeps them
        bash kernels/gpu/install_carried_wheels.sh "$WHEELS" "$SITE" \
            || { echo "installing the carried wheels failed" >&2; exit 3; }
        echo "$bundle" > "$SITE/.bundle"
    fi
    export PYTHONPATH=$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}
else   # without them every step would die at its first import: stop before spending device time
    echo "no wheels in '$WHEELS': run kernels/gpu/fetch_gpu_wheels.sh here and carry .whl" \
         "(WHEELS=none where the environment already has every package)" >&2
    exit 3
fi
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > "$WORK/device.csv" 2>/dev/null || true

HEADLINE="steps.tsv stack.json bench_layer.json bench_layer_unfused.json bench_layer_unshared.json gpu_smoke_dense.json tests_corrected.log
          gpu_smoke_moe.json checks.json bench_memory1.json bench_memory2.json bench_gemm.json tests_gpu.log"
publish() {   # after every step: the headline files flat into $OUT (at most 6 of them), the rest packed
    local n=0 f
    for f in $HEADLINE; do
        if [ -f "$WORK/$f" ] && (( n < 6 )); then cp "$WORK/$f" "$OUT/$f"; n=$((n + 1)); fi
    done
    local packed="$WORK.tgz"   # beside $WORK, not in $OUT: a kill mid-pack leaves no extra file there
    tar czf "$packed" -C "$WORK" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' \
        --exclude='*.lock' . 2>/dev/null
    if [ "$(stat -c %s "$packed")" -gt 15000000 ]; then   # over the 16 MiB a file: reports and logs only
        (cd "$WORK" && find . \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' -o -name '*.tsv' -o -name '*.xml' \
            -o -name '*.csv' -o -name '*.out' -o -name '*.err' \) -size -2M \
            -print0 | tar czf "$packed" --null -T -)
    fi
    cp "$packed" "$OUT/session.tgz.part" && mv "$OUT/session.tgz.part" "$OUT/session.tgz"
}

apply_patch() {   # apply_patch [-R] FILE: every hunk or none (git apply where git is, else patch(1) after a dry run)
    if command -v git > /dev/null; then git apply "$@"; return; fi
    local reverse=; [ "$1" = -R ] && { reverse=-R; shift; }
    patch -p1 --force --quiet --no-backup-if-mismatch --dry-run $reverse < "$1" > /dev/null \
        && patch -p1 --force --quiet --no-backup-if-mismatch $reverse < "$1"
}
left() { echo $(( DEADLINE_S - SECONDS )); }   # SECONDS: since the script started
# capped SECONDS CMD...: CMD under its own cap or the time left, whichever is less; killed 10 s after the
# TERM where it ignores it
capped() {
    local l; l=$(left); (( l > 1 )) || l=1
    local s=$(( $1 < l ? $1 : l )); shift
    timeout -k 10 "$s" "$@"
}

smoke_dense() {   # the given recipes' gpu-smoke-quick cells, the report rewritten after each
    for recipe in "$@"; do
        if (( $(left) < 60 )); then echo "cell $recipe skipped: $(left) s left before the deadline" >&2; continue; fi
        log="$RESULTS/$SMOKE_PROFILE/logs/cell_${SMOKE_MODEL}_${recipe}_seed0.log"   # Layout.cell_log
        mkdir -p "$(dirname "$log")"
        # autotuning kept on disk: a call's later cells read what its first mxfp4 cell tuned; each tuned key
        # printed into the cell's log (steps are timed net of tuning: mxfp4.report.gpu_smoke). Expandable
        # segments: the memory plan's peak leaves about 7 GiB of the H100's 78 for the allocator's fragments
        # (the log's peak_reserved_gib says what it held)
        MXFP4_AUTOTUNE=$SMOKE_AUTOTUNE TRITON_CACHE_AUTOTUNING=1 TRITON_PRINT_AUTOTUNING=1 \
        PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True} \
        capped "$SMOKE_CELL_CAP_S" python3 -m mxfp4 cell --profile "$SMOKE_PROFILE" --model "$SMOKE_MODEL" \
            --recipe "$recipe" --seed 0 --results "$RESULTS" > "$log" 2>&1 \
            || echo "cell $recipe stopped with exit status $?" >&2
        python3 -m mxfp4 gpu-smoke-report --profile "$SMOKE_PROFILE" --results "$RESULTS" \
            --out "$WORK/gpu_smoke_dense.json" >> "$WORK/gpu_smoke_report.log" 2>&1 || true
        publish   # after every cell, not only every step
    done
}

for step in "$@"; do
    if (( $(left) < 30 )); then
        echo "step $step skipped: $(left) s left before the deadline (DEADLINE_S=$DEADLINE_S)" >&2
        printf '%s\tskipped\t0\n' "$step" >> "$WORK/steps.tsv"; publish; continue
    fi
    began=$SECONDS
    case "$step" in
        stack) python3 - > "$WORK/stack.json" <<'PY'
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
               cat "$WORK/stack.json"
               python3 kernels/gpu/gpu_bundle.py --installed --out "$WORK/stack_requirements.json" \
                   || echo "unmet requirements: stack_requirements.json (in session.tgz) names them" >&2 ;;
        tests) workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")   # compiles in parallel where xdist is
               # -v: the log names each test as it ends, so a run cut at its cap says which never finished
               MXFP4_TEST_CUDA=1 MXFP4_AUTOTUNE=0 capped 400 python3 -m pytest -m gpu -v --durations=10 \
                   -p no:cacheprovider $workers --junitxml="$WORK/tests_gpu.xml" tests > "$WORK/tests_gpu.log" 2>&1
               rc=$?; tail -3 "$WORK/tests_gpu.log"; (exit $rc) ;;   # the step's status is pytest's, not tail's
        corrected) MXFP4_TEST_CUDA=1 MXFP4_AUTOTUNE=0 capped 200 python3 -m pytest -m gpu -v -p no:cacheprovider \
                       tests/corrections/test_triton_corrections.py > "$WORK/tests_corrected.log" 2>&1
               rc=$?; tail -3 "$WORK/tests_corrected.log"; (exit $rc) ;;
        smoke-dense1) smoke_dense bf16 mxfp4 mxfp4+macro ;;
        smoke-dense2) smoke_dense bf16 mxfp4+fallback mxfp4+aqn mxfp4+all ;;
        smoke:*) IFS=, read -ra picked <<< "${step#smoke:}"; smoke_dense bf16 "${picked[@]}" ;;
        smoke-moe) capped 150 python3 kernels/bench/bench_moe.py --device cuda --compute bfloat16 --cases all --reps 3 \
                       --out "$WORK/gpu_smoke_moe.json" ;;
        layer)   capped 200 python3 kernels/bench/bench_layer.py --device cuda --compute bfloat16 --reps 3 \
                     --host-profile 20 --out "$WORK/bench_layer.json" ;;
        layer-unfused) capped 150 python3 kernels/bench/bench_layer.py --device cuda --compute bfloat16 --reps 3 \
                     --recipes bf16 mxfp4+fallback mxfp4+macro mxfp4+all --fused-corrections off \
                     --out "$WORK/bench_layer_unfused.json" ;;
        layer-unshared) capped 150 python3 kernels/bench/bench_layer.py --device cuda --compute bfloat16 --reps 3 \
                     --recipes bf16 mxfp4 mxfp4+all --shared-inputs off --out "$WORK/bench_layer_unshared.json" ;;
        checks)  MXFP4_AUTOTUNE=0 capped 280 python3 kernels/check_kernels.py --out "$WORK/checks.json" ;;
        configs) capped 280 python3 kernels/check_kernels.py --every-config --out "$WORK/checks_configs.json" ;;
        memory1) TRITON_PRINT_AUTOTUNING=1 capped 280 python3 kernels/bench/bench_kernels.py --only memory \
                     --shapes 16384x8192,8192x4096 --out "$WORK/bench_memory1.json" ;;
        memory2) TRITON_PRINT_AUTOTUNING=1 capped 280 python3 kernels/bench/bench_kernels.py --only memory \
                     --shapes 8192x11008,128x768x2048,64x2048 --out "$WORK/bench_memory2.json" ;;
        gemm)    TRITON_PRINT_AUTOTUNING=1 capped 280 python3 kernels/bench/bench_kernels.py --only gemm --out "$WORK/bench_gemm.json" ;;
        stats-patch) if apply_patch kernels/gpu/patches/stats_fewer_instructions.patch; then
                 MXFP4_AUTOTUNE=0 capped 120 python3 kernels/check_kernels.py --out "$WORK/checks_stats_patch.json" || true
                 TRITON_PRINT_AUTOTUNING=1 capped 280 python3 kernels/bench/bench_kernels.py --only memory \
                     --shapes 16384x8192 --out "$WORK/bench_memory_stats_patch.json" || true
                 apply_patch -R kernels/gpu/patches/stats_fewer_instructions.patch
                 else echo "kernels/gpu/patches/stats_fewer_instructions.patch does not apply to this tree: nothing run" >&2; false; fi ;;
    esac > "$WORK/$step.out" 2> "$WORK/$step.err"   # progress bars, autotuning: whole in session.tgz, tails here
    status=$?
    tail -n 25 "$WORK/$step.out"
    tail -c 1500 "$WORK/$step.err" | tr '\r' '\n' | tail -n 6 >&2
    (( status == 0 )) || echo "step $step stopped with exit status $status (its JSON keeps what it measured)" >&2
    printf '%s\t%s\t%s\n' "$step" "$status" "$(( SECONDS - began ))" >> "$WORK/steps.tsv"
    publish
done

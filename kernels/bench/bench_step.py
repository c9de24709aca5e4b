"""Where a GRPO step's time goes, per recipe, side by side in one process: the cell's own trainer (TRL's
GRPOTrainer with the recipe's patched model, rollouts through the patched model) run for a few steps,
its step and rollout times from the step log, and a torch.profiler table of the timed steps grouped by
op; the MXFP4 step's ratio to the BF16 step of the same model and seed is the headline. Each quantizing
recipe runs once per ``--backends`` entry (the dispatch's choice, ``auto``, and e.g. the eager
``reference``: the same values, the time each path costs).

    python kernels/bench/bench_step.py --profile embedded --model tiny-dense --steps 12 \\
        --backends auto reference --out results/bench/step_profile_cpu.json

It needs the profile's warm start (``snakemake --cores all pretrain``); it writes nothing else.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time

from mxfp4.machine import describe, pin_cpu_numerics

pin_cpu_numerics()  # before torch loads, as in every cell

import torch  # noqa: E402
from accelerate import PartialState  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

import mxfp4  # noqa: E402
from mxfp4.config.profiles import load_profile  # noqa: E402
from mxfp4.config.recipes import Recipe  # noqa: E402
from mxfp4.config.run import Run, Start  # noqa: E402
from mxfp4.io import write_json_atomic  # noqa: E402
from mxfp4.layout import TRAIN_LOG  # noqa: E402
from mxfp4.numerics.dispatch import BACKENDS, use_backend, use_fused_corrections  # noqa: E402
from mxfp4.rl.cell import plan_cell, prepare  # noqa: E402
from mxfp4.rl.models import warm_start_folder  # noqa: E402
from mxfp4.rl.step_cost import short_run  # noqa: E402

TOP_OPS = 25  # ops kept per recipe in the profile table


class ProfilerSteps(TrainerCallback):
    """Advances the profiler's schedule at the end of every trainer step."""

    def __init__(self, prof):
        self.prof = prof

    def on_step_end(self, args, state, control, **kwargs):
        self.prof.step()


def run_recipe(start: Start, recipe: str, steps: int) -> dict:
    """``steps`` GRPO steps of one recipe's cell from ``start`` in a short run (``step_cost.short_run``: no probes,
    no checkpoints, no evaluation): step 1 is warm-up (first-call costs, compilation), steps 2 .. ``steps // 2 + 1``
    are timed with the profiler idle, the rest recorded by torch.profiler (whose overhead would inflate the
    timings)."""
    plan = plan_cell(start.run.cell(start.model, recipe, start.seed))
    cell = prepare(plan, PartialState(cpu=True))
    activities = [torch.profiler.ProfilerActivity.CPU]
    timed_steps = steps // 2
    schedule = torch.profiler.schedule(wait=timed_steps + 1, warmup=0, active=steps - timed_steps - 1, repeat=1)
    with torch.profiler.profile(activities=activities, schedule=schedule, record_shapes=False) as prof:
        cell.trainer.add_callback(ProfilerSteps(prof))
        t0 = time.perf_counter()
        cell.trainer.train()
        wall = time.perf_counter() - t0
    log = [json.loads(line) for line in (plan.out / TRAIN_LOG).read_text().splitlines()]
    timed = log[1:timed_steps + 1]
    table = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in table) or 1.0
    return {
        "steps": len(log), "timed_steps": len(timed), "profiled_steps": len(log) - len(timed) - 1, "wall_s": wall,
        "step_time_s": statistics.mean(r["step_time"] for r in timed),
        "rollout_time_s": statistics.mean(r["rollout_time"] for r in timed),
        "ops": [{"op": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                 "self_cpu_share": e.self_cpu_time_total / total} for e in table[:TOP_OPS]],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="embedded", help="a CPU profile whose warm start exists")
    p.add_argument("--model", default="tiny-dense", help="a tiny model line of the profile")
    p.add_argument("--recipes", nargs="+", default=["bf16", "mxfp4"], help="the first is the reference")
    p.add_argument("--backends", nargs="+", default=["auto"], choices=BACKENDS,
                   help="the quantization backends each quantizing recipe runs under (MXFP4_BACKEND's values)")
    p.add_argument("--fused-corrections", nargs="+", default=["on"], choices=["on", "off"],
                   help="each quantizing recipe with the corrections' fused kernels on and/or off "
                        "(dispatch.use_fused_corrections: the same values, the time each path costs)")
    p.add_argument("--seed", type=int, default=0, help="the cells' seed")
    p.add_argument("--steps", type=int, default=10,
                   help="GRPO steps per recipe: 1 warm-up, half timed, the rest profiled")
    p.add_argument("--threads", type=int, default=1,
                   help="torch's CPU threads (1: what each cell of the main job gets on 2 cores)")
    p.add_argument("--results", default="results", help="the results root holding the warm start")
    p.add_argument("--out", required=True, help="the JSON report")
    args = p.parse_args(argv)
    if args.steps < 4:
        raise SystemExit("bench_step: --steps must be at least 4 (warm-up, timed steps, profiled steps)")
    if args.threads < 1:
        raise SystemExit("bench_step: --threads must be at least 1")
    torch.set_num_threads(args.threads)
    profile = load_profile(args.profile)
    run = Run.of(profile, args.results)
    start = run.start(args.model, args.seed)
    warm_start_folder(start)  # checked before the JSON is begun
    command = ["python", "kernels/bench/bench_step.py", *(argv if argv is not None else sys.argv[1:])]
    out = {"command": " ".join(command),
           "method": "mean over the timed steps (2 .. steps // 2 + 1, profiler idle) of the step log's step_time "
                     "and rollout_time (the cell's own trainer, probes off); self CPU time per op over the steps "
                     "after them (torch.profiler, key_averages)",
           "machine": describe(), "platform": platform.platform(), "versions": {"torch": torch.__version__,
                                                                                 "mxfp4": mxfp4.__version__},
           "profile": profile.name, "model": args.model, "seed": args.seed, "recipes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = short_run(start, args.steps, tmp)
        for recipe in args.recipes:
            quantizes = Recipe.named(recipe).quantize
            for backend in args.backends if quantizes else ["auto"]:
                for fused in args.fused_corrections if quantizes else ["on"]:
                    name = recipe if backend == "auto" or not quantizes else f"{recipe} [{backend}]"
                    name += " [fused corrections off]" if fused == "off" else ""
                    print(f"{name}: {args.steps} steps", file=sys.stderr, flush=True)
                    with use_backend(backend), use_fused_corrections(fused == "on"):
                        out["recipes"][name] = run_recipe(scratch, recipe, args.steps)
                    out["recipes"][name].update(backend=backend, fused_corrections=fused)
                    write_json_atomic(args.out, out)
    ref = out["recipes"][args.recipes[0]]
    for name, rec in out["recipes"].items():
        rec["step_time_vs_reference"] = rec["step_time_s"] / ref["step_time_s"]
        rec["rollout_time_vs_reference"] = rec["rollout_time_s"] / ref["rollout_time_s"]
        print(f"{name}: step {rec['step_time_s']:.3f} s ({rec['step_time_vs_reference']:.2f}x), "
              f"rollout {rec['rollout_time_s']:.3f} s ({rec['rollout_time_vs_reference']:.2f}x)")
    write_json_atomic(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

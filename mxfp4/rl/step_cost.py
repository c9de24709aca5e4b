"""What a recipe costs before its cells run: its step measured once (a few GRPO steps of the cell's own trainer on
the stored warm start, beside its base recipe's in the same process), and the numerics hooks that force the
host's reference path, each with the measured cost of one quantization of a real operand.

A compare's estimate scales the stored cells' wall times by the measured ratio instead of assuming that a new
recipe costs what its base costs: a custom ``block_quantizer`` without a ``fake_quantize`` of its own quantizes
every block through the Python reference, and that is said before the first job.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time

import torch

from ..config.recipes import Recipe
from ..config.run import Run, Start
from ..corrections.base import Correction
from ..layout import REFERENCE_RECIPE, TRAIN_LOG
from ..numerics.quantizer import Quantizer
from .models import load, warm_start_folder


def reference_hooks(quantizer: Quantizer) -> list[str]:
    """The numerics hooks of ``quantizer``'s corrections that run on the host's reference path whatever the
    backend: a ``block_quantizer`` without a ``fake_quantize`` (each block through Python), a rotation (two
    float64 matrix products per operand). Empty for a recipe that runs at kernel speed."""
    out = []
    owner = quantizer._block_owner
    if owner is not None and type(owner).fake_quantize is Correction.fake_quantize:
        out.append(f"block_quantizer of correction {owner.name!r} (no fake_quantize: every block through the Python "
                   "reference)")
    for c in quantizer._rotating:
        out.append(f"rotation of correction {c.name!r} (float64 block rotations on the host)")
    return out


def real_operand(start: Start) -> tuple[str, torch.Tensor]:
    """The largest 2D weight of the stored warm start ``start``'s cells start from (a real operand of the cells'
    GEMMs): its name and values in float32."""
    net, _ = load(str(warm_start_folder(start)), dtype=torch.float32)
    name, w = max(((n, p) for n, p in net.named_parameters() if p.dim() == 2 and "embed" not in n),
                  key=lambda item: item[1].numel())
    return name, w.detach().clone()


def quantization_ms(quantizer: Quantizer, x: torch.Tensor, reps: int = 5) -> float:
    """Median wall milliseconds of one fake quantization of ``x`` along its last axis (after one warm-up call)."""
    quantizer(x, axis=-1)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        quantizer(x, axis=-1)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def short_run(start: Start, steps: int, folder) -> Start:
    """``start``'s run cut to ``steps`` GRPO steps without probes or checkpoints, under the scratch results root
    ``folder``, with the stored warm start that its seed's cells start from linked in: what a timed step runs on.

    Args:
        start: a tiny model of the run and the cells' seed (it picks the warm start).
        steps: GRPO steps per cell.
        folder: an empty scratch folder (the caller removes it).

    Returns:
        The same model and seed in the cut run.
    """
    profile = start.profile
    grpo = profile.grpo.model_copy(update={"max_steps": steps, "save_steps": None})
    short = Run.of(profile.model_copy(update={"grpo": grpo, "probe_every": 0}), folder)
    target = short.layout.model(start.model, start.warm_start)
    target.parent.mkdir(parents=True)
    target.symlink_to(warm_start_folder(start).resolve())
    return short.start(start.model, start.seed)


# What a measured step is, here and in the leaderboard's benchmark (kernels/bench/bench_step.py): a ratio of two
# such means taken in one process. A cell's own ``mean_step_time`` is another measure: every step of its run, the
# first included, beside whatever else the run schedules (docs/methods.md, "Step times").
STEP_METHOD = ("mean step_time of GRPO steps 2..{last} of the cell's own trainer (TRL's GRPOTrainer on the "
               "recipe's patched model) from the stored warm start, probes, checkpoints and evaluation off, the "
               "recipes one after another in one process")


def measured_steps(start: Start, recipes: list[str], steps: int = 3) -> dict:
    """Mean step time (seconds, steps 2..``steps``: the first is warm-up) of each recipe's cell run for ``steps``
    GRPO steps from the stored warm start (no probes, checkpoints or evaluation) in a scratch folder."""
    from accelerate import PartialState

    from .cell import plan_cell, prepare

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = short_run(start, steps, tmp)
        for recipe in recipes:
            plan = plan_cell(scratch.run.cell(scratch.model, recipe, scratch.seed))
            prepare(plan, PartialState(cpu=True)).trainer.train()
            log = [json.loads(line) for line in (plan.out / TRAIN_LOG).read_text().splitlines()]
            out[recipe] = statistics.mean(r["step_time"] for r in log[1:]) if len(log) > 1 else log[0]["step_time"]
    return out


def recipe_cost(start: Start, recipe: str, base: str, steps: int = 3) -> dict:
    """``recipe`` against ``base`` on the stored warm start of ``start`` (a tiny model of a run and the cells' seed):
    the hooks on the reference path, one quantization of a real operand under each (ms) and a measured step of each
    (s), with their ratios."""
    mine, theirs = Recipe.named(recipe), Recipe.named(base)
    out = {"recipe": recipe, "base": base, "model": start.model, "seed": start.seed, "steps": steps,
           "reference_hooks": reference_hooks(mine.quantizer()) if mine.quantize else []}
    if mine.quantize:
        name, w = real_operand(start)
        q_mine = quantization_ms(mine.quantizer(), w)
        q_base = quantization_ms(theirs.quantizer(), w) if theirs.quantize else None
        out.update(operand=name, operand_shape=list(w.shape), quantize_ms=q_mine, base_quantize_ms=q_base)
    step = measured_steps(start, list(dict.fromkeys([recipe, base, REFERENCE_RECIPE])), steps)
    out.update(step_s=step[recipe], base_step_s=step[base], step_ratio=step[recipe] / step[base],
               bf16_step_s=step[REFERENCE_RECIPE], bf16_step_ratio=step[recipe] / step[REFERENCE_RECIPE],
               method=STEP_METHOD.format(last=steps))
    return out


def cost_lines(cost: dict) -> list[str]:
    """What ``recipe_cost`` found, as the lines said before a compare's first job (a warning first, where hooks
    force the reference path)."""
    lines = []
    if cost["reference_hooks"]:
        q = f"{cost['quantize_ms']:.2f} ms"
        if cost.get("base_quantize_ms"):
            q += f" against {cost['base_quantize_ms']:.2f} ms under {cost['base']} " \
                 f"({cost['quantize_ms'] / cost['base_quantize_ms']:.1f}x)"
        lines.append(f"WARNING: recipe {cost['recipe']!r} runs on the host's reference path: "
                     f"{'; '.join(cost['reference_hooks'])}. One quantization of {cost['operand']} "
                     f"{'x'.join(map(str, cost['operand_shape']))} takes {q}. Give the correction a fake_quantize "
                     "through the dispatch (docs/corrections.md) to run at kernel speed.")
    lines.append(f"measured step of {cost['model']} (seed {cost['seed']}, mean of steps 2..{cost['steps']}, one "
                 f"process): {cost['recipe']} {cost['step_s']:.3f} s, {cost['base']} {cost['base_step_s']:.3f} s "
                 f"({cost['step_ratio']:.2f}x its base)"
                 + (f", bf16 {cost['bf16_step_s']:.3f} s ({cost['bf16_step_ratio']:.2f}x bf16)"
                    if "bf16_step_s" in cost and cost["base"] != REFERENCE_RECIPE else ""))
    return lines

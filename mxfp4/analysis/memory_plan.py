"""The memory plan of one GRPO training step per recipe at a real configuration, computed on CPU.

The method in full: docs/methods.md, ``mxfp4.analysis.memory_plan``."""

from __future__ import annotations

import fcntl
import json
import sys
import time
import warnings
from pathlib import Path

import torch

from ..config.profiles import Profile
from ..config.recipes import Recipe
from ..io import write_json_atomic
from ..machine import describe
from ..nn import bypassed, patch_model, weight_cache_pays
from ..numerics.hooks import lifecycle
from ..rl.models import real_config

GIB = 2**30
DEVICE_LIMIT_GIB = {"nvidia-h100-x1": 78.0, "nvidia-h200": 139.0}  # what the device tool lends (its README)
PROMPT_TOKENS = 96  # an embedded GSM8K-format prompt is 70-95 characters (one token each)


def step_plan(config_name: str, recipe_name: str, micro: int, seq: int, checkpointing: bool, layers: int | None = None):
    """(peak bytes by category per device of one training step of ``recipe_name`` (MemTracker's peak
    snapshot), whether the patched layers cache their quantized weights)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import AutoModelForCausalLM


    recipe = Recipe.named(recipe_name)
    with FakeTensorMode(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the weight cache keys on data_ptr, which fake tensors warn on
        config = real_config(config_name)
        if layers is not None:
            config.num_hidden_layers = layers
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        corrections = recipe.build_corrections()
        for c in corrections:
            lifecycle(c.bind, total_steps=3, seed=0)
        quantizer = recipe.quantizer(corrections) if recipe.quantize else None
        cached = weight_cache_pays(model, quantizer)  # the cell's rule (single-process cells)
        if quantizer is not None:
            patch_model(model, quantizer, cache_weights=cached)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-6)
        ids = torch.randint(0, config.vocab_size, (micro, seq))
        tracker = MemTracker()
        tracker.track_external(model, opt)
        advantages = torch.randn(micro, 1)

        def loss_of():
            tracker.reset_mod_stats()  # MemTracker follows one forward per module; the peak is kept across
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(input_ids=ids).logits
            logp = torch.log_softmax(logits.float(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
            return -(logp * advantages).mean()

        with tracker:
            loss_of().backward()  # a micro-batch: gradients accumulated
            opt.step()  # Adam's two moments exist from here on
            loss_of().backward()  # the next step's first micro-batch
            g_q = torch.autograd.grad(loss_of(), params, allow_unused=True)  # the probe, quantized
            with bypassed(model):
                g_r = torch.autograd.grad(loss_of(), params, allow_unused=True)  # its full-precision shadow
            del g_q, g_r
        peak = tracker.get_tracker_snapshot("peak")
    out = {}
    for device, by_kind in peak.items():
        out[str(device)] = {str(getattr(k, "value", k)): v for k, v in by_kind.items()}
    return out, cached


SETTINGS = ("profile", "model", "config", "layers", "micro_batch", "accumulation", "sequence_tokens",
            "gradient_checkpointing", "compute", "device")


def _store(out: Path, report: dict) -> dict:
    """Write ``report`` to ``out`` with the recipes another process stored there under the same settings
    kept (those of ``report`` win), under an exclusive lock; returns what was written."""
    with open(out.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stored = json.loads(out.read_text()) if out.exists() else {}
        kept = stored.get("recipes", {}) if all(stored.get(k) == report[k] for k in SETTINGS) else {}
        merged = {**report, "recipes": {**kept, **report["recipes"]}}
        write_json_atomic(out, merged)
    return merged


def write_plan(profile: Profile, out, model: str | None = None, recipes: list[str] | None = None,
               layers: int | None = None, device: str = "nvidia-h100-x1") -> dict:
    """The plan of every recipe (default: the profile's) for ``model`` (default: the profile's first with a
    real configuration), written to ``out`` after each recipe; returns the report."""
    if device not in DEVICE_LIMIT_GIB:
        raise ValueError(f"unknown device {device!r}; accepted: {', '.join(sorted(DEVICE_LIMIT_GIB))}")
    real = [n for n, s in profile.models.items() if s.config]
    name = model or (real[0] if real else None)
    if name not in real:
        raise ValueError(f"profile {profile.name!r}: {name!r} has no real configuration (config:); accepted: {real}")
    spec, grpo = profile.model(name), profile.grpo
    micro, accumulation = grpo.accumulation(spec.processes)
    seq = PROMPT_TOKENS + grpo.max_completion_length
    limit = DEVICE_LIMIT_GIB[device]
    report = {
        "method": "torch FakeTensorMode + MemTracker on CPU (no memory allocated): the real model, patched layers, "
                  "weight caches, AdamW; one micro-batch forward and backward, the optimizer step, a second "
                  "micro-batch's gradients, then the probe's quantized and full-precision gradient sets together "
                  "(conservative by one gradient set: the trainer probes after the optimizer has freed them)",
        "profile": profile.name, "model": name, "config": spec.config, "layers": layers or "all",
        "micro_batch": micro, "accumulation": accumulation, "sequence_tokens": seq,
        "gradient_checkpointing": grpo.gradient_checkpointing, "compute": spec.compute,
        "device": device, "limit_gib": limit, "machine": describe(), "recipes": {},
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = report
    for recipe in recipes or list(profile.recipes):
        t0 = time.time()
        by_device, cached = step_plan(spec.config, recipe, micro, seq, grpo.gradient_checkpointing, layers)
        kinds = next(iter(by_device.values()))
        total = kinds.get("Total", sum(v for k, v in kinds.items() if k != "Total"))
        report["recipes"][recipe] = {
            "peak_gib_by_category": {k: v / GIB for k, v in kinds.items()},
            "peak_gib": total / GIB,
            "fits": total / GIB < limit,
            "weight_cache": cached,
            "seconds": time.time() - t0,
        }
        written = _store(out, report)
        print(f"{recipe}: peak {total / GIB:.1f} GiB of {limit:g} ({time.time() - t0:.0f} s)", file=sys.stderr,
              flush=True)
    return written

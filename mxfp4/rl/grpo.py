"""The GRPO trainer of a cell: TRL's ``GRPOTrainer`` with the recipe's lifecycle hooks and the probes.

``MXGRPOTrainer`` adds, on top of TRL's trainer:

- every correction's ``rollout_context`` around rollout generation (AQN's noise);
- every ``probe_every`` steps, the gradient cosine and relative norm error against a full-precision
  shadow backward pass on the same batch (per layer and total), and the decomposition statistics of
  the weights, activations and gradients of the probed layers;
- the recipe's quantized weights pushed to vLLM when rollouts run there.

``StepLogger`` (a ``TrainerCallback``) writes one JSON line per step: TRL's logged metrics, the
probes' metrics, each correction's ``metrics()`` and the step time, and hands the step's metrics to
each correction's ``observe``.

Every touch of TRL's private API is in the block marked "TRL INTERNALS" below, and
``tests/test_grpo_internals.py`` exercises each of them against the TRL version pinned in
``constraints.txt``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import time
from pathlib import Path

import torch
from transformers import TrainerCallback
from trl import GRPOTrainer

from ..numerics.decompose import SUMMARY_KEYS, pool_stats
from .grad_accuracy import compare
from .vllm_weights import vllm_named_weights
from .patching import bypassed, gemm_weights, patch_state, patched_modules, quantized_weights, set_probe



class DecompositionProbe:
    """Collects the decomposition statistics of tensors that patched layers see, by kind.

    On GPU, for a quantizer without corrections, the fused stats kernel gives the energies and
    counts in the same pass as a fake-quantization (float32, device tensors, synced once in
    ``summary``; no Shapley shares); elsewhere the float64 decomposition with Shapley shares."""

    def __init__(self, quantizer, layers: set[str]):
        self.quantizer, self.layers = quantizer, layers
        self.stats: dict[str, list[dict]] = {}

    def __call__(self, layer: str, kind: str, tensor: torch.Tensor, axis: int, valid=None):
        if layer not in self.layers:
            return
        kind = kind.removesuffix("_t")
        fused = self.quantizer.fused_stats(tensor, axis) if valid is None else None
        if fused is not None:
            self.stats.setdefault(kind, []).append(fused)
        elif torch.isfinite(tensor).all():
            self.stats.setdefault(kind, []).append(self.quantizer.decompose(tensor.float(), axis, valid).stats)

    def summary(self) -> dict:
        out = {}
        for kind, items in self.stats.items():
            items = [{k: float(v) if isinstance(v, torch.Tensor) else v for k, v in s.items()} for s in items]  # one sync
            items = [s for s in items if all(math.isfinite(v) for v in s.values() if isinstance(v, float))]
            if not items:
                continue
            pooled = pool_stats(items)
            for k in SUMMARY_KEYS:
                if k in pooled:
                    out[f"decomp/{kind}/{k}"] = pooled[k]
        return out


def probe_layers(model) -> set[str]:
    """The first attention projection and the last MLP (experts for MoE) get decomposition probes."""
    names = [n for n, _, _ in patched_modules(model)]
    first = next((n for n in names if n.endswith("q_proj")), None)
    last_mlp = [n for n in names if n.endswith("down_proj") or n.endswith("experts")]
    return {n for n in (first, last_mlp[-1] if last_mlp else None) if n}


class MXGRPOTrainer(GRPOTrainer):
    """GRPOTrainer with the recipe's corrections' lifecycle hooks and the gradient/decomposition probes.

    Build it as TRL's trainer, then call ``setup_mx(corrections, probe_every)`` once. The quantizer
    is read from the patched model (``patch_state``).
    """

    def setup_mx(self, corrections, probe_every: int):
        state = patch_state(self.model)
        self.mx_corrections = list(corrections)
        self.mx_quantizer = state.quantizer if state is not None else None
        self.mx_probe_every = probe_every
        self.mx_probe_layers = probe_layers(self.model)
        self.mx_step_metrics: dict = {}
        if getattr(self, "use_vllm", False) and self.mx_quantizer is not None:
            self._push_quantized_weights_to_vllm()

    # ---------------------------------------------------------------- TRL INTERNALS (begin)
    # Three places use TRL's private API (pinned in constraints.txt; tests/test_grpo_internals.py):
    # 1. ``_generate_and_score_completions``: the one method that generates a step's rollouts; it is
    #    wrapped so the corrections' rollout contexts (AQN's noise) hold during generation only.
    # 2. ``_metrics`` and ``_entropy_window_stats``: TRL's per-step metric buffers; the probe's
    #    shadow pass calls ``compute_loss`` a second time, so they are saved and restored around it.
    # 3. ``vllm_generation.sync_weights``: TRL's weight push to vLLM, wrapped to ship the recipe's
    #    quantized weights (same names and shapes) instead of the master weights; and
    #    ``vllm_generation._iter_named_params``, the (name, tensor) stream it pushes, mapped to the
    #    checkpoint names vLLM's loaders take (fused MoE experts split per expert: vllm_weights.py).

    def _generate_and_score_completions(self, inputs):
        with contextlib.ExitStack() as stack:
            for c in self.mx_corrections:
                stack.enter_context(c.rollout_context(self.model, self.state.global_step))
            return super()._generate_and_score_completions(inputs)

    def _without_logging(self, fn):
        """Run ``fn()`` leaving TRL's logged metrics as they were."""
        logged = copy.deepcopy(self._metrics)
        window = copy.deepcopy(getattr(self, "_entropy_window_stats", None))
        try:
            return fn()
        finally:
            self._metrics, self._entropy_window_stats = logged, window

    def _push_quantized_weights_to_vllm(self):
        gen = self.vllm_generation
        stream = gen._iter_named_params
        gen._iter_named_params = lambda: vllm_named_weights(stream())
        sync = gen.sync_weights

        def sync_quantized():
            with quantized_weights(self.model):
                sync()

        gen.sync_weights = sync_quantized

    # ---------------------------------------------------------------- TRL INTERNALS (end)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        step = self.state.global_step
        probing = self.mx_quantizer is not None and self.mx_probe_every and step % self.mx_probe_every == 0
        if not probing:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        probe = DecompositionProbe(self.mx_quantizer, self.mx_probe_layers)
        for name, module, _ in patched_modules(model):
            if name in self.mx_probe_layers:
                probe(name, "weight", next(iter(gemm_weights(module).values())).detach(), -1)
        set_probe(model, probe)
        try:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
            g_q = torch.autograd.grad(loss, [p for _, p in params], retain_graph=True, allow_unused=True)
        finally:
            set_probe(model, None)

        def shadow():
            with bypassed(model):
                ref_loss = super(MXGRPOTrainer, self).compute_loss(model, inputs, return_outputs, num_items_in_batch)
                return torch.autograd.grad(ref_loss, [p for _, p in params], allow_unused=True)

        g_r = self._without_logging(shadow)
        quant = {n: g for (n, _), g in zip(params, g_q) if g is not None}
        ref = {n: g for (n, _), g in zip(params, g_r) if g is not None and n in quant}
        acc = compare(quant, ref)
        metrics = {"grad/cosine": acc["total"]["cosine"], "grad/rel_norm_error": acc["total"]["rel_norm_error"]}
        for layer, v in acc["per_layer"].items():
            metrics[f"grad/{layer}/cosine"] = v["cosine"]
            metrics[f"grad/{layer}/rel_norm_error"] = v["rel_norm_error"]
        metrics.update(probe.summary())
        self.mx_step_metrics.update(metrics)
        return loss


class StepLogger(TrainerCallback):
    """Writes one JSON line per step (TRL's logs, the probes' metrics, the corrections' metrics, step
    time) and passes the step's metrics to every correction's ``observe``."""

    def __init__(self, trainer: MXGRPOTrainer, path: Path, progress=None):
        self.trainer, self.path, self.progress = trainer, Path(path), progress
        self.t0 = None
        self.step_time = None

    def on_step_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self.step_time = time.perf_counter() - self.t0

    def on_log(self, args, state, control, logs=None, **kw):
        if logs is None or "train_runtime" in logs:
            return
        row = {"step": state.global_step, "step_time": self.step_time, **logs, **self.trainer.mx_step_metrics}
        for c in self.trainer.mx_corrections:
            row.update(c.metrics())
        self.trainer.mx_step_metrics = {}
        for c in self.trainer.mx_corrections:
            c.observe(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.progress is not None:
            self.progress(row)

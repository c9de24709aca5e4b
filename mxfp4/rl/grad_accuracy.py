"""Gradient accuracy: the gradients of one batch under a recipe against a full-precision shadow pass."""

from __future__ import annotations

import math
import re

import torch

from ..nn import bypassed

_LAYER = re.compile(r"layers\.(\d+)\.")


def layer_of(param_name: str) -> str:
    m = _LAYER.search(param_name)
    return f"layer{m.group(1)}" if m else param_name.rsplit(".", 1)[0]


def _grads(model, loss_fn) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss_fn(model).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def _sums(q: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """[<q, r>, |q|^2, |r|^2, |q - r|^2] of one tensor pair, in float64 on their device."""
    q, r = q.double(), r.double()
    return torch.stack([torch.dot(q.flatten(), r.flatten()), q.pow(2).sum(), r.pow(2).sum(), (q - r).pow(2).sum()])


def _score(s: torch.Tensor) -> dict:
    dot, qq, rr, dd = (float(v) for v in s)
    rn, qn = math.sqrt(rr), math.sqrt(qq)
    # undefined (None) for a zero reference gradient, e.g. a GRPO batch whose groups all tie
    cos = dot / (qn * rn) if rn > 0 and qn > 0 else None
    # the norm ratio |g_q| / |g|: a gain on the gradient (a product of per-layer gains through the
    # backward pass) shows in it and not in the cosine
    return {"cosine": cos, "rel_norm_error": math.sqrt(dd) / rn if rn > 0 else None,
            "norm_ratio": qn / rn if rn > 0 else None}


def compare(quantized: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict:
    """Cosine similarity, relative norm error ``|g_q - g| / |g|`` and norm ratio ``|g_q| / |g|``, per
    layer and in total (None where the reference gradient is zero). Float64 sums accumulated one
    parameter at a time: the memory beyond the gradients is that of the largest parameter, whatever the
    model's size."""
    per_group: dict[str, torch.Tensor] = {}
    for name in reference:
        s = _sums(quantized[name], reference[name])  # stays on the device: one transfer at the end
        group = layer_of(name)
        per_group[group] = per_group[group] + s if group in per_group else s
    groups = sorted(per_group)
    sums = torch.stack([per_group[g] for g in groups]).cpu()
    return {"total": _score(sums.sum(0)), "per_layer": {g: _score(s) for g, s in zip(groups, sums)}}


def gradient_accuracy(model, loss_fn) -> dict:
    """Backward ``loss_fn(model)`` as the model is patched and again in full precision (same batch,
    same weights); returns ``compare``'s dict. ``loss_fn`` must be deterministic (no dropout)."""
    quantized = _grads(model, loss_fn)
    with bypassed(model):
        reference = _grads(model, loss_fn)
    return compare(quantized, reference)

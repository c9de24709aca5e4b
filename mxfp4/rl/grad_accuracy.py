"""Gradient accuracy: the gradients of one batch under a recipe against a full-precision shadow pass."""

from __future__ import annotations

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


def compare(quantized: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict:
    """Cosine similarity and relative norm error ``|g_q - g| / |g|``, per layer and in total
    (None where the reference gradient is zero)."""
    groups: dict[str, list[str]] = {}
    for name in reference:
        groups.setdefault(layer_of(name), []).append(name)

    def score(names):
        q = torch.cat([quantized[n].double().flatten() for n in names])
        r = torch.cat([reference[n].double().flatten() for n in names])
        rn, qn = float(r.norm()), float(q.norm())
        # undefined (None) for a zero reference gradient, e.g. a GRPO batch whose groups all tie
        cos = float(torch.dot(q, r)) / (qn * rn) if rn > 0 and qn > 0 else None
        return {"cosine": cos, "rel_norm_error": float((q - r).norm()) / rn if rn > 0 else None}

    out = {"total": score(list(reference)), "per_layer": {g: score(ns) for g, ns in sorted(groups.items())}}
    return out


def gradient_accuracy(model, loss_fn) -> dict:
    """Backward ``loss_fn(model)`` as the model is patched and again in full precision (same batch,
    same weights); returns ``compare``'s dict. ``loss_fn`` must be deterministic (no dropout)."""
    quantized = _grads(model, loss_fn)
    with bypassed(model):
        reference = _grads(model, loss_fn)
    return compare(quantized, reference)

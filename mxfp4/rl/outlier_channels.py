"""The miniature's heavy-tail knob: outlier channels in the warm start, the function left exactly as it was.

The method in full: docs/methods.md, ``mxfp4.rl.outlier_channels``."""

from __future__ import annotations

import math

import torch

# norm -> the parameters that read its output, as named in transformers' Qwen2 / Qwen3-MoE decoder layers
READERS = {
    "input_layernorm": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "post_attention_layernorm": ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.gate.weight",
                                 "mlp.experts.gate_up_proj"),
}
NOT_READERS = ("self_attn.o_proj.weight", "mlp.down_proj.weight", "mlp.experts.down_proj")
KNOWN = {n for names in READERS.values() for n in names} | set(NOT_READERS)


def outlier_channel_indices(hidden: int, count: int, seed: int = 0) -> list[int]:
    """``count`` distinct hidden dimensions, drawn once from ``seed`` (the same in every layer)."""
    if not 0 <= count <= hidden:
        raise ValueError(f"outlier channels: count {count} is outside 0..{hidden} (the hidden size)")
    g = torch.Generator().manual_seed(seed)
    return sorted(torch.randperm(hidden, generator=g)[:count].tolist())


def add_outlier_channels(model, count: int, scale: float, seed: int = 0) -> list[int]:
    """Scale ``count`` channels of every decoder layer's norm gains up by ``scale`` and their readers'
    input columns down by it (in place); returns the channels. ``scale`` must be a power of two (the
    exactness of the transform rests on it); a layer with a parameter of the hidden width that is not
    a known reader or non-reader is refused (it could read the norm, and the function would change)."""
    if count == 0:
        return []
    if scale <= 0 or 2.0 ** round(math.log2(scale)) != scale:
        raise ValueError(f"outlier channels: scale {scale} is not a power of two (accepted: 2, 4, ..., 1024; "
                         "only then is the transform exact)")
    hidden = model.config.hidden_size
    channels = outlier_channel_indices(hidden, count, seed)
    idx = torch.tensor(channels)
    layers = [dict(layer.named_parameters()) for layer in model.model.layers]
    for i, params in enumerate(layers):  # every layer checked before any is changed
        unknown = [n for n, p in params.items()  # a matrix reading the hidden width (biases read nothing)
                   if p.dim() >= 2 and p.shape[-1] == hidden and n not in KNOWN]
        if unknown:
            raise ValueError(f"outlier channels: layer {i} has parameters {unknown} of the hidden width whose role "
                             "is unknown; accepted: Qwen2 dense and Qwen3-MoE decoder layers")
    with torch.no_grad():
        for params in layers:
            for norm, readers in READERS.items():
                params[f"{norm}.weight"][idx] *= scale
                for name in readers:
                    if name in params:
                        params[name][..., idx] /= scale
    return channels

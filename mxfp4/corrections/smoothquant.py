"""SmoothQuant's per-channel smoothing (Xiao et al., "SmoothQuant", arXiv 2211.10438), for MXFP4: each input
channel j of a forward GEMM X W^T is divided out of the activation and multiplied into the weight,

    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha),   X -> X / s,   W -> W * s   (W [N, K]: its column j),

which leaves the product unchanged and migrates an activation's outlier channels into the weight, whose blocks
along K then share a scale with less spread. Here s is rounded to the nearest power of two in log2 (so both
scalings are exact and the GEMM on the quantized operands is exactly Q(X/s) Q(W s)^T), and it is computed from the
current batch's activation maxima over every token (the paper calibrates them offline: per batch, no calibration
set is needed and the weight's cached quantization is keyed on s). A channel that is zero in either operand keeps
s = 1."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Correction
from .registry import register


@register("smoothquant")
@dataclass
class SmoothQuant(Correction):
    """Per-input-channel smoothing of each forward GEMM by a power of two (``gemm_transform``: a diagonal).

    Storage: s is K one-byte power-of-two exponents per GEMM, 8 / N bits per weight element (0.014 at N = 576),
    reported as 0; the work is two channel maxima per forward.

    Args:
        alpha: the migration strength, in [0, 1]: 0 leaves the activation as is (s from the weight alone), 1 moves
            its whole channel range into the weight. SmoothQuant's default is 0.5.
    """

    alpha: float = 0.5

    transforms_gemm = True

    def __post_init__(self):
        if not (isinstance(self.alpha, int | float) and 0.0 <= self.alpha <= 1.0):
            raise ValueError(f"smoothquant alpha {self.alpha!r}; accepted: a number in [0, 1]")

    def gemm_transform(self, activation: torch.Tensor, weight: torch.Tensor, operand) -> torch.Tensor:
        return smoothing_scale(activation, weight, self.alpha)


def smoothing_scale(activation: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """SmoothQuant's s [K] for ``activation`` [..., K] and ``weight`` [N, K], rounded to the nearest power of two in
    log2 (a tie to the larger power: ``torch.round`` would send it to the even exponent); 1 where either channel
    is all zero."""
    if not activation.numel():  # no token this call: nothing to smooth by
        return torch.ones(weight.shape[-1], device=weight.device)
    a = activation.reshape(-1, activation.shape[-1]).abs().amax(0).double()
    w = weight.abs().amax(0).double()
    live = (a > 0) & (w > 0) & torch.isfinite(a) & torch.isfinite(w)
    log2_s = alpha * torch.log2(torch.where(live, a, 1.0)) - (1 - alpha) * torch.log2(torch.where(live, w, 1.0))
    exponent = torch.floor(log2_s + 0.5).clamp(-100, 100)
    return torch.where(live, torch.exp2(exponent), 1.0).float()

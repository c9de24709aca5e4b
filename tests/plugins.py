"""Corrections written as a user would, against the documented API alone (docs/corrections.md), shared by the
tests that place them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mxfp4.corrections import Correction


@dataclass
class PowerOfTwoSmoothing(Correction):
    """The smoothing idea written against the documented API alone: s_j a power of two from both operands' channel
    maxima; it records the operands its value hook is told and how often each GEMM asked for a transform."""

    alpha: float = 0.5
    name = "test_smoothing"
    transforms_gemm = True
    takes_operand = True

    def __post_init__(self):
        self.asked, self.split_operands = 0, []

    def gemm_transform(self, activation, weight, operand):
        self.asked += 1
        a = activation.reshape(-1, activation.shape[-1]).abs().amax(0).clamp_min(1e-30)
        w = weight.abs().amax(0).clamp_min(1e-30)
        return torch.exp2(torch.floor(self.alpha * a.log2() - (1 - self.alpha) * w.log2() + 0.5))

    def split(self, x, axis, valid=None, operand=None):
        self.split_operands.append(None if operand is None else (operand.role, operand.gemm))
        return None

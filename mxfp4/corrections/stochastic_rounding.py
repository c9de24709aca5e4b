"""Stochastic rounding of chosen operands onto the FP4 grid: unbiased within the grid, so the
quantization error of a gradient averages out over steps instead of biasing the update (the field's
MXFP4/NVFP4 training recipes round gradients stochastically)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..numerics.quantizer import ROLES
from .base import Correction
from .hadamard import stable_seed
from .registry import register


@register("stochastic_rounding")
@dataclass
class StochasticRounding(Correction):
    """The elements of operands whose role is in ``roles`` (default: gradients, both backward GEMMs) are
    rounded stochastically under the format's block scales. Each call draws from its own generator,
    seeded from (the cell's seed, layer, role, GEMM, the call's count): the counts are run state, saved
    with a checkpoint, so a resumed cell draws what the uninterrupted one would. Without operand
    context every operand is rounded stochastically. Values beyond the grid's maximum saturate (the
    E8M0 floor scale leaves up to 8/6 of headroom above 6): that part of the error stays biased.

    Args:
        roles: the operand roles rounded stochastically (weight, activation, grad; default grad).
        seed: the streams' seed (``bind`` sets the cell's).
    """

    roles: list[str] = field(default_factory=lambda: ["grad"])
    seed: int = 0

    rounds_stochastically = True

    def __post_init__(self):
        bad = [r for r in self.roles if r not in ROLES]
        if bad or not self.roles:
            raise ValueError(
                f"stochastic_rounding roles {self.roles}; accepted: a non-empty list of {', '.join(ROLES)}")
        self.calls: dict[tuple, int] = {}

    def bind(self, total_steps: int, seed: int) -> None:
        self.seed = seed
        self.calls.clear()

    def rounding_generator(self, operand, device) -> torch.Generator | None:
        if operand is not None and operand.role not in self.roles:
            return None
        key = ("", "", "") if operand is None else (operand.layer, operand.role, operand.gemm)
        n = self.calls.get(key, 0)
        self.calls[key] = n + 1
        return torch.Generator(device=device).manual_seed(stable_seed(self.seed, *key, n))

    def state_dict(self) -> dict:
        return {"calls": [[*key, n] for key, n in sorted(self.calls.items())]}

    def load_state_dict(self, state: dict) -> None:
        self.calls = {tuple(entry[:3]): int(entry[3]) for entry in state.get("calls", [])}

    def metrics(self) -> dict:
        return {"stochastic_rounding/calls": sum(self.calls.values())}

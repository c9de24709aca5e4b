"""A diagnostic, not a correction of the field: the operands of the named roles pass unquantized, so that the other
roles are quantized alone (the collapse map's "weights alone", "activations alone", "gradients alone")."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..numerics.quantizer import ROLES
from .base import Correction
from .registry import register


@register("full_precision_roles")
@dataclass
class FullPrecisionRoles(Correction):
    """Every operand whose role (``Operand.role``: weight, activation, grad) is in ``roles`` keeps its values: its
    blocks go through an identity block quantizer (grid values the block itself, scale 1), the format's MXFP4 for
    every other operand. No storage is counted: it measures, it does not compress.

    Args:
        roles: the roles left unquantized (one or two of weight, activation, grad).
    """

    roles: list = field(default_factory=list)

    def __post_init__(self):
        bad = [r for r in self.roles if r not in ROLES]
        if bad or not self.roles or len(set(self.roles)) == len(ROLES):
            raise ValueError(f"full_precision_roles: roles {self.roles!r}; accepted: one or two of {', '.join(ROLES)}")

    def quantizes_blocks_of(self, operand) -> bool:
        return operand is not None and operand.role in self.roles

    def block_quantizer(self, fmt, rule):
        return lambda blocks: (blocks, torch.ones(blocks.shape[:-1], dtype=blocks.dtype, device=blocks.device))

"""2D block scaling of the weights (NVIDIA, "Pretraining LLMs with NVFP4", arXiv 2509.25149; TransformerEngine's
NVFP4 recipe scales each weight per 16 x 16 tile), on MXFP4's E8M0 scales: one scale per tile of ``rows`` rows by
one 32-block, so that a weight and its transpose quantize to the same values in the forward and the backward GEMMs
(the chain rule sees one weight, not two)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..numerics.quantizer import ROLES
from ..numerics.reference import quantize_blocks
from .base import Correction
from .registry import register


@register("two_d_scales")
@dataclass
class TwoDScales(Correction):
    """Each tile of ``rows`` consecutive rows of one 32-block column shares one scale: the format's scale rule
    applied to the tile's largest magnitude, every element rounded to the grid under it. Tiles are square at
    ``rows`` = 32, so a weight quantized along either axis gets the same tiles, scales and values. Operands of the
    roles in ``roles`` only (the weights); the others keep the format's 1 x 32 blocks. The scale byte is the
    format's, one per tile: 31 of every 32 bytes fewer (the extra bits are negative).

    Args:
        rows: rows per tile across the blocked axis (32: square tiles, the transpose's tiles too).
        roles: the operand roles tiled (weight, activation, grad).
    """

    rows: int = 32
    roles: list[str] = field(default_factory=lambda: ["weight"])

    def __post_init__(self):
        if self.rows < 1:
            raise ValueError(f"two_d_scales needs rows >= 1, got {self.rows}")
        bad = [r for r in self.roles if r not in ROLES]
        if bad or not self.roles:
            raise ValueError(f"two_d_scales roles {self.roles}; accepted: a non-empty list of {', '.join(ROLES)}")

    def rows_per_group(self) -> int:
        return self.rows

    def quantizes_blocks_of(self, operand) -> bool:
        return operand is None or operand.role in self.roles

    def block_quantizer(self, fmt, rule):
        if fmt.scale != "e8m0":
            raise ValueError(f"two_d_scales tiles E8M0 block scales; format {fmt.name!r} has {fmt.scale} scales "
                             "(accepted: mxfp4 and the other E8M0 formats)")

        def quantize(blocks: torch.Tensor):
            shape, bs = blocks.shape, blocks.shape[-1]
            r, nb = (shape[-3] if blocks.dim() >= 3 else 1), shape[-2]  # rows across the blocked axis; leading
            flat = blocks.reshape(-1, r, nb, bs)  # dims (a grouped experts' index) stay apart: [B, R, nb, bs]
            padded = torch.nn.functional.pad(flat, (0, 0, 0, 0, 0, -r % self.rows))  # zero rows: no larger max
            b, t = flat.shape[0], padded.shape[1] // self.rows
            tiles = padded.reshape(b, t, self.rows, nb, bs).permute(0, 1, 3, 2, 4).reshape(b, t, nb, self.rows * bs)
            grid, _, scale = quantize_blocks(tiles, fmt, rule)  # one tile a "block": its max sets its scale
            grid = grid.reshape(b, t, nb, self.rows, bs).permute(0, 1, 3, 2, 4).reshape(b, t * self.rows, nb, bs)
            scale = scale.unsqueeze(2).expand(b, t, self.rows, nb).reshape(b, t * self.rows, nb)
            return grid[:, :r].reshape(shape), scale[:, :r].reshape(shape[:-1])

        return quantize

    def cost(self) -> dict:
        return {"extra_bits_per_element": 8.0 / (32 * self.rows) - 8.0 / 32, "bf16_fraction": 0.0}

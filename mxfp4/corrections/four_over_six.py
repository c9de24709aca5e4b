"""Four Over Six (4/6) adaptive block scaling (Cook et al., arXiv 2512.02010; TransformerEngine's "4over6"), on the
E8M0 block scales of MXFP4: per block, the format's own scale or the one that maps the block's maximum to at most
4 on the E2M1 grid, whichever gives the smaller squared error (E2M1's step from 4 to 6 is where a block's
near-maximal values lose most)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..numerics.formats import E8M0_BIAS
from ..numerics.reference import quantize_blocks, round_to_grid
from .base import Correction
from .registry import register

FOUR = 4.0


def scale_to_four(amax: torch.Tensor) -> torch.Tensor:
    """The smallest power of two s with amax / s <= 4 (an E8M0 scale: exponents clamped to [-127, 127]), exactly:
    amax = m 2^e with m in [0.5, 1), so amax / 4 <= 2^(e - 2), with equality where m = 0.5."""
    mantissa, exponent = torch.frexp(amax)
    k = exponent - 2 - (mantissa == 0.5).to(exponent.dtype)
    k = k.clamp(-E8M0_BIAS, E8M0_BIAS)
    return torch.ldexp(torch.ones_like(amax), k)


@register("four_over_six")
@dataclass
class FourOverSix(Correction):
    """Each block quantized under two scales, its error energy summed in float64 element by element in the block's
    order (a cumulative sum: the same choice whatever the vectorisation): the format's own scale (the scale rule's:
    under ``floor`` the block's maximum lands in [4, 8)) and ``scale_to_four`` (the maximum at most 4); the smaller
    error wins, the format's own scale on a tie. MXFP4-style formats only (E8M0 scales); no extra bits: the
    choice is the scale byte itself."""

    def block_quantizer(self, fmt, rule):
        if fmt.scale != "e8m0":
            raise ValueError(f"four_over_six chooses between E8M0 block scales; format {fmt.name!r} has {fmt.scale} "
                             "scales (accepted: mxfp4 and the other E8M0 formats)")

        def quantize(blocks: torch.Tensor):
            grid_own, _, scale_own = quantize_blocks(blocks, fmt, rule)
            scale_four = scale_to_four(blocks.abs().amax(-1).float())
            grid_four = round_to_grid(blocks.float() / scale_four.unsqueeze(-1), fmt.element)
            x = blocks.double()
            own = (grid_own.double() * scale_own.double().unsqueeze(-1) - x).pow(2).cumsum(-1)[..., -1]
            four = (grid_four.double() * scale_four.double().unsqueeze(-1) - x).pow(2).cumsum(-1)[..., -1]
            pick = four < own  # a non-finite block (NaN scale, NaN error) keeps the format's own
            return (torch.where(pick.unsqueeze(-1), grid_four, grid_own),
                    torch.where(pick, scale_four, scale_own))

        return quantize

    def cost(self) -> dict:
        return {"extra_bits_per_element": 0.0, "bf16_fraction": 0.0}

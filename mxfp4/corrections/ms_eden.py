"""MS-EDEN (Quartet II, Panferov et al., arXiv 2601.22813; its reference quantizer's E8M0 variant): unbiased
gradients without stochastic rounding of the elements. Each block is rotated by a random-sign Hadamard matrix,
its elements rounded to nearest under the scale 2^floor(log2 amax) / 3, and the EDEN correction <x, x> / <x, Q(x)>
folded into the block's E8M0 scale by stochastic rounding of the scale: the randomness moves from 32 elements to one
scale, and the quantized block's projection on the block is unbiased."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..numerics.formats import round_to_grid
from .hadamard import RandomHadamard, stable_seed
from .registry import register

GLOBAL = 3.0  # the element grid's reach under the scale 2^floor(log2 amax): the block max lands in [3, 6)


def eden_scales(blocks: torch.Tensor, elem, uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(grid values, effective scales) of MS-EDEN for ``blocks`` [..., bs] (already rotated), in float64: y = 3 x /
    2^k with 2^k the largest power of two at most the block's max; q = y rounded to nearest on the grid; the block's
    scale 2^k c, c = sum(y^2) / sum(y q) (summed in the block's order; 1 for an all-zero block), rounded to a
    power of two stochastically (up with probability v / 2^floor(log2 v) - 1, drawn as ``uniform`` < it); the
    effective scale that power over 3."""
    x = blocks.double()
    amax = x.abs().amax(-1)
    _, ex = torch.frexp(amax)
    pow2 = torch.where(amax > 0, torch.ldexp(torch.ones_like(amax), ex - 1), torch.ones_like(amax))
    y = x * (GLOBAL / pow2).unsqueeze(-1)  # exact: x has 24 significant bits, 3 two more
    q = round_to_grid(y, elem)
    num, den = (y * y).cumsum(-1)[..., -1], (y * q).cumsum(-1)[..., -1]
    c = torch.where(den > 0, num / torch.where(den > 0, den, 1.0), 1.0)
    v = pow2 * c
    _, vex = torch.frexp(v)
    low = torch.ldexp(torch.ones_like(v), vex - 1)
    up = uniform < (v / low - 1.0)
    return q, torch.where(up, 2 * low, low) / GLOBAL


@register("ms_eden")
@dataclass
class MSEden(RandomHadamard):
    """MS-EDEN on the operands of the GEMMs in ``gemms`` (default both backward GEMMs: the gradients' path): each
    block rotated as ``hadamard`` rotates it (random signs from the cell's seed, the layer and the GEMM; both operands
    of a GEMM alike) and quantized by ``eden_scales``. Each call draws its scale roundings from its own stream,
    seeded from (the cell's seed, the call's count): the count is run state, saved with a checkpoint. MXFP4 only
    (E2M1 elements, E8M0 scales); the global factor 1/3 is one per tensor, applied after the GEMM; no extra bits.

    Args:
        gemms: the GEMMs whose operands are rotated and quantized so.
        seed: the streams' and signs' seed (``bind`` sets the cell's).
        signs: ``random`` (R = D H) or ``none`` (R = H).
    """

    gemms: list[str] = field(default_factory=lambda: ["input_grad", "weight_grad"])

    def __post_init__(self):
        super().__post_init__()
        self.calls = 0

    def bind(self, total_steps: int, seed: int) -> None:
        super().bind(total_steps, seed)
        self.calls = 0

    def quantizes_blocks_of(self, operand) -> bool:
        return operand is None or operand.gemm in self.gemms

    def block_quantizer(self, fmt, rule):
        if fmt.name != "mxfp4":
            raise ValueError(f"ms_eden rounds E8M0 scales of E2M1 blocks; format {fmt.name!r} (accepted: mxfp4)")

        def quantize(blocks: torch.Tensor):
            g = torch.Generator(device=blocks.device).manual_seed(stable_seed(self.seed, "ms_eden", self.calls))
            self.calls += 1
            uniform = torch.rand(blocks.shape[:-1], generator=g, dtype=torch.float64, device=blocks.device)
            return eden_scales(blocks, fmt.element, uniform)

        return quantize

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = int(state.get("calls", 0))

    def cost(self) -> dict:
        return {"extra_bits_per_element": 0.0, "bf16_fraction": 0.0}

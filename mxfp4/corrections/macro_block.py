"""Macro-block scaling: a BF16 scale per macro-block (a group of 32-blocks, or a 2D tile) on top of
the E8M0 block scales. Targets scale bias (gradient accuracy)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..numerics import dispatch, fused_cpu
from ..numerics.formats import get_format
from ..numerics.reference import from_blocks, quantize_blocks, to_blocks
from .base import Correction
from .registry import register


def _bf16_round_up(m: torch.Tensor) -> torch.Tensor:
    """The smallest bfloat16 value >= m (m > 0, finite)."""
    down = m.to(torch.bfloat16).float()
    inf = torch.full_like(down, float("inf"), dtype=torch.bfloat16)  # on m's device: no CPU operand
    up = torch.nextafter(down.to(torch.bfloat16), inf).float()
    return torch.where(down >= m, down, up)


@register("macro_block")
@dataclass
class MacroBlockScaling(Correction):
    """x ~ m . MX(x / m) with one BF16 scale m in [1, 2) per macro-block of ``blocks`` 32-blocks
    along the blocked axis and ``rows`` rows across it (rows > 1 gives 2D tiles).

    Candidates for m: 1 (plain MXFP4) and the mantissa that puts a block's max exactly on the top
    grid point (``amax_b / M`` divided by its power of two, rounded up to BF16 so nothing
    saturates): for the group's largest block (``candidates: max``, the default) or for every block
    of the group (``candidates: all``, up to 1 + blocks*rows quantizations: slower, a little more
    accurate). m is the candidate with the least error energy over the group, so the group never
    does worse than MXFP4, and the aligned block has no scale bias.

    Args:
        blocks: 32-blocks per macro-block along the blocked axis.
        rows: rows per macro-block across it (> 1: 2D tiles).
        candidates: ``max`` (the largest block's mantissa) or ``all`` (every block's).
    """

    # the paper's ties: the pathway it restores, its correction arm, the statistic it is built to lower
    pathway = "gradient"
    arm = "mxfp4+macro"
    lowers = ("energy_scale", "scale-bias energy")
    table_settings = ({"blocks": 4}, {"blocks": 1})  # its rows of the corrections table

    blocks: int = 4
    rows: int = 1
    candidates: str = "max"

    def __post_init__(self):
        if self.blocks < 1 or self.rows < 1:
            raise ValueError(f"macro_block needs blocks >= 1 and rows >= 1, got blocks={self.blocks}, rows={self.rows}")
        if self.candidates not in ("max", "all"):
            raise ValueError(f"macro_block candidates must be one of: max, all; got {self.candidates!r}")

    def _groups(self, blocks32: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """[G, rows*blocks, bs] view of the blocks, padded with zero blocks; and how to undo it."""
        bs = blocks32.shape[-1]
        flat = blocks32.reshape(-1, blocks32.shape[-2], bs)  # [R, nb, bs]
        r, nb = flat.shape[:2]
        pr, pb = -r % self.rows, -nb % self.blocks
        padded = torch.nn.functional.pad(flat, (0, 0, 0, pb, 0, pr))
        R, NB = padded.shape[:2]
        g = padded.reshape(R // self.rows, self.rows, NB // self.blocks, self.blocks, bs)
        g = g.permute(0, 2, 1, 3, 4).reshape(-1, self.rows * self.blocks, bs)
        return g, (blocks32.shape, r, nb, R, NB)

    def _ungroup(self, g: torch.Tensor, info) -> torch.Tensor:
        """Inverse of ``_groups`` for a [G, rows*blocks, *tail] tensor: [..., nb, *tail]."""
        shape, r, nb, R, NB = info
        tail = g.shape[2:]
        t = g.reshape(R // self.rows, NB // self.blocks, self.rows, self.blocks, *tail)
        t = t.transpose(1, 2).reshape(R, NB, *tail)
        return t[:r, :nb].reshape(*shape[:-1], *tail)

    def blocks_per_group(self) -> int:
        return self.blocks

    def rows_per_group(self) -> int:
        return self.rows

    def kernel_terms(self) -> dict | None:
        return {"macro_blocks": self.blocks} if self.rows == 1 and self.candidates == "max" else None

    def value_bits(self, fmt) -> int:
        """A grid value's significand times the BF16 mantissa m (the E8M0 scale is a power of two)."""
        return get_format(fmt).element.mbits + 1 + 8

    def block_quantizer(self, fmt, rule):
        fmt = get_format(fmt)
        elem = fmt.element

        def quantize(blocks32: torch.Tensor):
            g, info = self._groups(blocks32)  # [G, n, bs]
            candidates = self._candidates(g, elem)  # [1+n, G]
            # all candidates in one batched call: [C, G, n, bs]
            grid, _, scale = quantize_blocks(g.unsqueeze(0) / candidates[:, :, None, None], fmt, rule)
            eff = scale * candidates[:, :, None]  # [C, G, n]
            best, pick = self._best(grid * eff.unsqueeze(-1), g)
            return self._ungroup(grid[best, pick], info), self._ungroup(eff[best, pick], info)

        return quantize

    def _candidates(self, g: torch.Tensor, elem) -> torch.Tensor:
        """[1 + n, G] macro scales per group: 1 (plain MXFP4), then the BF16 mantissa that puts the
        group's largest block (``max``: n = 1) or each block (``all``) on the top grid point."""
        amax_b = g.abs().amax(-1)  # [G, n]
        if self.candidates == "max":
            amax_b = amax_b.amax(-1, keepdim=True)  # [G, 1]
        ratio = (amax_b / elem.max_value).clamp(min=torch.finfo(torch.float32).tiny)
        mant = torch.frexp(ratio).mantissa * 2  # ratio's significand in [1, 2), exactly (a normal float32)
        mant = _bf16_round_up(mant.clamp(1.0, 2.0))
        return torch.cat([torch.ones_like(mant[:, :1]), mant], dim=1).T

    @staticmethod
    def _best(values: torch.Tensor, g: torch.Tensor):
        """(index of the candidate with the least error energy per group, group index) for candidate
        values [C, G, n, bs] of groups g [G, n, bs]; the first minimum: plain MXFP4 wins ties. The energy is
        summed in float64 element by element in the group's order (a cumulative sum is sequential), a rule
        that does not depend on how a reduction is vectorised, so that the fused CPU kernel makes the same
        choice."""
        err = (values.double() - g.double().unsqueeze(0)).pow(2).flatten(2).cumsum(-1)[..., -1]  # [C, G]
        return err.argmin(0), torch.arange(g.shape[0], device=g.device)

    def fake_quantize(self, x: torch.Tensor, axis: int, fmt, rule) -> torch.Tensor | None:
        """m . MX(x / m) through the dispatch, the same values as ``block_quantizer`` bit for bit. On the
        fused CPU backend (one row per group, float32): one pass of the fused kernel, its output laid out as
        the block path's. On Triton: two fake-quantizations of the whole tensor (m = 1 and the group's
        mantissa) and a per-group choice (products of a grid value, a power of two and a BF16 mantissa are
        exact in float32). None elsewhere (``candidates: all``, the reference): use the block path."""
        if self.candidates != "max":
            return None
        fmt = get_format(fmt)
        ax = axis % x.dim()
        backend = dispatch.backend_for(x, fmt)
        if backend == "fused":
            if self.rows != 1 or x.dtype != torch.float32:
                return None
            strides = _block_path_strides(self.blocks, self.rows, tuple(x.shape), x.stride(), ax, fmt, rule)
            return fused_cpu.macro_block(x, fmt, ax, rule, self.blocks, strides)
        if backend != "triton":
            return None
        xf = x.float()
        g, info = self._groups(to_blocks(xf, ax, fmt.block_size))  # [G, n, bs]
        m = self._candidates(g, fmt.element)[1]  # [G]
        scaled = from_blocks(self._ungroup(g / m[:, None, None], info), x.shape, ax)
        plain = self._groups(to_blocks(dispatch.fake_quantize(xf, fmt, ax, rule), ax, fmt.block_size))[0]
        macro = self._groups(to_blocks(dispatch.fake_quantize(scaled, fmt, ax, rule), ax, fmt.block_size))[0]
        values = torch.stack([plain, macro * m[:, None, None]])  # [2, G, n, bs]
        best, pick = self._best(values, g)
        # contiguous blocks, as the block path's product is: the same layout
        return from_blocks(self._ungroup(values[best, pick], info).contiguous(), x.shape, ax).to(x.dtype)

    def cost(self) -> dict:
        return {"extra_bits_per_element": 16.0 / (32 * self.blocks * self.rows), "bf16_fraction": 0.0}


@functools.lru_cache(maxsize=1024)
def _block_path_strides(blocks: int, rows: int, shape: tuple, stride: tuple, axis: int, fmt, rule) -> tuple:
    """The strides of the block path's result for a float32 x of this shape and strides: its own operations
    run on a meta tensor (no data, the same stride rules), cached per case."""
    x = torch.empty_strided(shape, stride, dtype=torch.float32, device="meta")
    grid, scale = MacroBlockScaling(blocks, rows).block_quantizer(fmt, rule)(to_blocks(x, axis, fmt.block_size))
    return from_blocks(grid * scale.unsqueeze(-1), x.shape, axis).to(x.dtype).stride()

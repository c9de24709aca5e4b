"""Outlier fallback: outliers stay in BF16; the rest is quantized with the scale of what remains, so
entries of the deadzone come back. Targets deadzone truncation (rollout quality)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..numerics import dispatch, fused_cpu
from ..numerics.reference import from_blocks, to_blocks
from .base import Correction
from .registry import register


@register("outlier_fallback")
@dataclass
class OutlierFallback(Correction):
    """``mode: element`` keeps the ``k`` largest magnitudes of every 32-block in BF16 (cost k/32 of
    the elements plus a 5-bit index each); ``mode: block`` keeps whole blocks in BF16: the
    ``fraction`` of blocks with the largest crest factor (amax / rms).

    Args:
        mode: ``element`` (the largest elements of each block) or ``block`` (whole blocks).
        k: elements kept per 32-block in ``element`` mode (0..31).
        fraction: the share of blocks kept in ``block`` mode (0..1).
    """

    # the paper's ties: the pathway it restores, its correction arm, the statistic it is built to lower
    pathway = "rollout"
    arm = "mxfp4+fallback"
    lowers = ("deadzone_fraction", "deadzone fraction")
    table_settings = ({"mode": "element", "k": 1}, {"mode": "block", "fraction": 0.05})  # its corrections-table rows

    mode: str = "element"
    k: int = 1
    fraction: float = 0.05

    def __post_init__(self):
        if self.mode not in ("element", "block"):
            raise ValueError(f"outlier_fallback mode must be one of: element, block; got {self.mode!r}")
        if not 0 <= self.k < 32:
            raise ValueError(f"outlier_fallback k must be in 0..31, got {self.k}")
        if not 0 <= self.fraction <= 1:
            raise ValueError(f"outlier_fallback fraction must be in [0, 1], got {self.fraction}")
        self._kept = [0, 0]  # elements kept in BF16, elements seen (device tensors between syncs)

    def outlier_mask(self, x: torch.Tensor, axis: int) -> torch.Tensor:
        axis = axis % x.dim()
        blocks = to_blocks(x, axis, 32).abs()
        if self.mode == "element":
            mask = torch.zeros_like(blocks, dtype=torch.bool)
            if self.k:
                idx = blocks.argmax(-1, keepdim=True) if self.k == 1 else blocks.topk(self.k, dim=-1).indices
                mask.scatter_(-1, idx, True)
        else:
            rms = blocks.pow(2).mean(-1).sqrt().clamp(min=torch.finfo(torch.float32).tiny)
            crest = blocks.amax(-1) / rms
            n_keep = int(round(self.fraction * crest.numel()))
            keep = torch.zeros(crest.numel(), dtype=torch.bool, device=crest.device)
            if n_keep:
                keep[crest.flatten().topk(n_keep).indices] = True
            mask = keep.view(crest.shape).unsqueeze(-1).expand_as(blocks)
        return from_blocks(mask, x.shape, axis)

    def split(self, x, axis, valid=None):
        """(outlier mask, x with the outliers zeroed); counts what it keeps for ``cost()`` (only the
        ``valid`` elements when x holds padding). One element a block on the fused CPU backend: one pass
        of the fused kernel, the same values and layouts."""
        parts = self._fused_split(x, axis)
        if parts is None:
            mask = self.outlier_mask(x, axis)
            parts = mask, torch.where(mask, torch.zeros_like(x), x)
        mask = parts[0]
        counted = mask if valid is None else mask & valid
        self._kept[0] = self._kept[0] + counted.sum()  # stays on the device: no host sync per call
        self._kept[1] = self._kept[1] + (mask.numel() if valid is None else valid.expand_as(mask).sum())
        return parts

    def _fused_split(self, x: torch.Tensor, axis: int):
        """``split``'s (mask, rest) from the fused CPU kernel where it applies (element mode, k = 1, a float32
        or bfloat16 x on the fused backend, every element finite), laid out as the torch path lays them out;
        else None."""
        if (self.mode != "element" or self.k != 1 or x.dtype not in (torch.float32, torch.bfloat16)
                or dispatch.backend_for(x) != "fused"):
            return None
        axis = axis % x.dim()
        strides = _torch_path_strides(tuple(x.shape), x.stride(), x.dtype, axis)
        return fused_cpu.split_max(x, axis, 32, *strides)

    def kernel_terms(self) -> dict | None:
        return {"split": "block_max"} if self.mode == "element" and self.k == 1 else None

    def record_split(self, kept: int, seen: int) -> None:
        self._kept[0] = self._kept[0] + kept
        self._kept[1] = self._kept[1] + seen

    def state_dict(self) -> dict:
        return {"kept": [int(v) for v in self._kept]}

    def load_state_dict(self, state: dict) -> None:
        self._kept = [int(v) for v in state["kept"]]

    def cost(self) -> dict:
        self._kept = [int(v) for v in self._kept]  # one sync
        seen = self._kept[1]
        nominal = self.k / 32 if self.mode == "element" else self.fraction
        frac = self._kept[0] / seen if seen else nominal
        index_bits = 5 if self.mode == "element" else 0
        return {"extra_bits_per_element": frac * (16 + index_bits), "bf16_fraction": frac}


@functools.lru_cache(maxsize=1024)
def _torch_path_strides(shape: tuple, stride: tuple, dtype: torch.dtype, axis: int) -> tuple[tuple, tuple]:
    """The strides of the torch path's (mask, rest) in element mode with k = 1, for an x of this shape,
    strides and dtype: its own operations run on a meta tensor (no data, the same stride rules)."""
    x = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    mask = OutlierFallback(k=1).outlier_mask(x, axis)
    return mask.stride(), torch.where(mask, torch.zeros_like(x), x).stride()

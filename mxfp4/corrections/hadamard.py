"""Random-sign Hadamard rotation of each block before MXFP4 quantization ("Training LLMs with MXFP4",
Tseng et al. 2025; NVIDIA's NVFP4 recipe rotates the weight-gradient GEMM's operands the same way). A
rotation spreads a block's outlier over all its elements, so the block scale fits the rest better;
both operands of a GEMM share the rotation along its reduction axis, so the GEMM of the rotated
quantized operands equals the quantized GEMM of the originals: Q(A R) Q(B R)^T."""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field

import torch

from ..numerics.quantizer import GEMMS
from .base import Correction
from .registry import register


def stable_seed(*parts) -> int:
    """A 63-bit seed from ``parts`` that is the same in every process and Python run (``hash`` is not).

    Args:
        parts: anything with a stable ``repr`` (the cell's seed, a layer name, a GEMM, a count).
    """
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") >> 1


@functools.cache
def hadamard_matrix(n: int) -> torch.Tensor:
    """Sylvester's n x n Hadamard matrix over sqrt(n) (orthogonal), float64; n a power of two."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"a Hadamard rotation needs a power-of-two block size, got {n}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


@register("hadamard")
@dataclass
class RandomHadamard(Correction):
    """Each block b of the operands of the GEMMs in ``gemms`` is quantized as Q(b R) R^T, with R = D H:
    H the block's normalised Hadamard matrix, D diagonal random signs drawn from (the cell's seed, the
    layer, the GEMM), the same for both operands of a GEMM. Without operand context (a standalone
    tensor) every block is rotated, with the signs of (seed, "", "").

    Args:
        gemms: the GEMMs whose operands are rotated (default the weight gradient's).
        seed: the signs' seed (``bind`` sets the cell's).
        signs: ``random`` (R = D H) or ``none`` (R = H, the same for every layer and run: the deterministic
            Hadamard transform reported to cure the weight-gradient divergence, arXiv 2605.09825).
    """

    gemms: list[str] = field(default_factory=lambda: ["weight_grad"])
    seed: int = 0
    signs: str = "random"

    rotates = True

    def __post_init__(self):
        bad = [g for g in self.gemms if g not in GEMMS]
        if bad or not self.gemms:
            raise ValueError(f"hadamard gemms {self.gemms}; accepted: a non-empty list of {', '.join(GEMMS)}")
        if self.signs not in ("random", "none"):
            raise ValueError(f"hadamard signs {self.signs!r}; accepted: random (R = D H), none (R = H: deterministic)")
        self._matrices: dict = {}

    def bind(self, total_steps: int, seed: int) -> None:
        self.seed = seed
        self._matrices.clear()

    def rotation(self, operand, block_size: int, device) -> torch.Tensor | None:
        if operand is not None and operand.gemm not in self.gemms:
            return None
        key = ("", "") if operand is None else (operand.layer, operand.gemm)
        if self.signs == "none":
            key = ("", "")  # one matrix for every operand
        hit = self._matrices.get((key, block_size, str(device)))
        if hit is None:
            if self.signs == "none":
                hit = hadamard_matrix(block_size).to(device)
            else:
                g = torch.Generator().manual_seed(stable_seed(self.seed, *key))
                signs = torch.randint(0, 2, (block_size,), generator=g, dtype=torch.float64) * 2 - 1
                hit = (signs.unsqueeze(1) * hadamard_matrix(block_size)).to(device)
            self._matrices[(key, block_size, str(device))] = hit
        return hit

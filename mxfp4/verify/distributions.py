"""Named test distributions: the standard cases of the decomposition proofs and tables."""

from __future__ import annotations

import torch


def _gaussian(g, rows, cols):
    return torch.randn(rows, cols, generator=g)


def _laplace(g, rows, cols):
    u = torch.rand(rows, cols, generator=g, dtype=torch.float64).clamp(1e-12, 1 - 1e-12) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs())).float()


def _student_t3(g, rows, cols):
    z = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    chi2 = torch.randn(3, rows, cols, generator=g, dtype=torch.float64).pow(2).sum(0)
    return (z / torch.sqrt(chi2 / 3)).float()


def _llm_rows(g, rows, cols):
    """Activation-like rows: Gaussian, with a few channels ~50x larger in every row."""
    x = torch.randn(rows, cols, generator=g)
    channels = torch.randperm(cols, generator=g)[: max(1, cols // 256)]
    x[:, channels] *= 50.0
    return x


def _zero_blocks(g, rows, cols):
    """Gaussian with every other 32-block all zero."""
    x = torch.randn(rows, cols, generator=g)
    x.view(rows, -1, 32)[:, ::2] = 0.0
    return x


def _constant_blocks(g, rows, cols):
    """Each 32-block holds one repeated value (amax = every element)."""
    per_block = torch.randn(rows, cols // 32, 1, generator=g)
    return per_block.expand(rows, cols // 32, 32).reshape(rows, cols).contiguous()


def _e8m0_tiny(g, rows, cols):
    """Values near the bottom of the E8M0 range (float32 subnormals included): the scale clamps."""
    return torch.randn(rows, cols, generator=g) * 2.0**-130


def _e8m0_huge(g, rows, cols):
    """Values near the top of the float32 range."""
    return torch.randn(rows, cols, generator=g) * 2.0**124


def _exact_ties(g, rows, cols):
    """E2M1 ties (0.25, 0.75, 1.25, 2.5, 3.5, 5) times the block's power-of-two scale, amax 6*2^k."""
    ties = torch.tensor([0.25, 0.75, 1.25, 2.5, 3.5, 5.0])
    idx = torch.randint(0, len(ties), (rows, cols), generator=g)
    sign = torch.randint(0, 2, (rows, cols), generator=g) * 2 - 1
    k = torch.randint(-10, 10, (rows, cols // 32, 1), generator=g).float()
    x = (ties[idx] * sign).view(rows, -1, 32)
    x[..., 0] = 6.0
    return (x * torch.exp2(k)).reshape(rows, cols)


DISTRIBUTIONS = {
    "gaussian": _gaussian,
    "laplace": _laplace,
    "student_t3": _student_t3,
    "llm_rows": _llm_rows,
    "zero_blocks": _zero_blocks,
    "constant_blocks": _constant_blocks,
    "e8m0_tiny": _e8m0_tiny,
    "e8m0_huge": _e8m0_huge,
    "exact_ties": _exact_ties,
}


def sample(
    name: str, rows: int = 256, cols: int = 1024, seed: int = 0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """A [rows, cols] tensor of the named distribution, deterministic under ``seed``."""
    if name not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {name!r}; accepted: {', '.join(DISTRIBUTIONS)}")
    if cols % 32:
        raise ValueError(f"cols must be a multiple of 32 (whole blocks), got {cols}")
    g = torch.Generator().manual_seed(seed)
    return DISTRIBUTIONS[name](g, rows, cols).to(dtype)

"""Operands for the corrections' kernels: a spread of magnitudes and exponents, and equal magnitudes on demand."""

import torch


def correction_operand(g: torch.Generator, shape, log_scale: int, spread: int, ties: bool) -> torch.Tensor:
    """Gaussian values times a uniform to the power ``spread`` (heavier tails as it grows), each times 2**(log_scale
    + an exponent in [-8, 8)); with ``ties``, about half the elements set to the tensor's largest magnitude (then
    the first of equal magnitudes is a block's outlier)."""
    x = torch.randn(shape, generator=g) * torch.rand(shape, generator=g) ** spread
    x = x * 2.0 ** (log_scale + torch.randint(-8, 8, shape, generator=g).float())
    if ties:
        x = torch.where(torch.rand(shape, generator=g) < 0.5, x.abs().amax() * torch.sign(x), x)
    return x

"""A change of basis of one GEMM's operand pair that leaves the product unchanged: what a correction's
``gemm_transform`` hook returns, checked and applied here.

The forward GEMM of a linear layer is ``Y = X W^T`` with X [..., K] and W [N, K], contracted over K. A transform T
(an invertible [K, K] matrix, or a diagonal one given as its positive diagonal s [K]) gives the same product as
``(X T^-1) (W T^T)^T``; the quantizer quantizes the transformed operands and maps each result back to the original
basis, ``Q(X T^-1) T`` and ``Q(W T^T) T^-T``, so the GEMM, its backward and every caller see operands of the
original shapes whose product is ``Q(X T^-1) Q(W T^T)^T`` (exactly, for a diagonal of powers of two: every scaling
is exact in floating point).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .decompose import component_stats
from .hooks import HookError

CONDITION_LIMIT = 1e6  # a matrix transform's largest condition number: beyond it the inverse loses the product


@dataclass(frozen=True, eq=False)
class GemmTransform:
    """A checked transform of one GEMM's contracted axis (``checked_transform``). ``scale``: the diagonal s [K]
    (X / s and W * s), or ``matrix``: T [K, K] (X T^-1 and W T^T, its inverse computed once in float64).

    Args:
        scale: a positive finite vector of K entries, or None.
        matrix: an invertible finite [K, K] matrix, or None (exactly one of the two is given).
    """

    scale: torch.Tensor | None = None
    matrix: torch.Tensor | None = None

    def __post_init__(self):
        if (self.scale is None) == (self.matrix is None):
            raise ValueError("GemmTransform takes one of scale (a vector) or matrix, not "
                             + ("both" if self.scale is not None else "neither"))

    @property
    def inverse(self) -> torch.Tensor:
        inv = self.__dict__.get("_inverse")
        if inv is None:
            inv = torch.linalg.inv(self.matrix.to(torch.float64))
            object.__setattr__(self, "_inverse", inv)
        return inv

    def same_as(self, other: GemmTransform | None) -> bool:
        """Whether ``other`` is this transform value for value (what a cached weight is keyed on)."""
        if other is None:
            return False
        if other is self:
            return True
        mine, theirs = (self.scale, other.scale) if self.scale is not None else (self.matrix, other.matrix)
        return theirs is not None and mine.shape == theirs.shape and bool(torch.equal(mine, theirs))

    def into(self, t: torch.Tensor, role: str) -> torch.Tensor:
        """``t`` (an activation [..., K] or a weight [N, K]) in the transformed basis: X T^-1, or W T^T."""
        if self.scale is not None:
            s = self.scale.to(t.dtype)
            return t / s if role == "activation" else t * s
        m = self.inverse if role == "activation" else self.matrix.to(torch.float64).T
        return (t.to(torch.float64) @ m).to(t.dtype)

    def back(self, q: torch.Tensor, role: str) -> torch.Tensor:
        """A quantized operand of the transformed basis in the original one: Q(X T^-1) T, or Q(W T^T) T^-T."""
        if self.scale is not None:
            s = self.scale.to(q.dtype)
            return q * s if role == "activation" else q / s
        m = self.matrix.to(torch.float64) if role == "activation" else self.inverse.T
        return (q.to(torch.float64) @ m).to(q.dtype)


def decomposition_back(d, transform: GemmTransform, role: str):
    """A decomposition taken in the transformed basis (of X T^-1 or W T^T) mapped back to the operand's own basis:
    the input, the quantized values and each component through ``back`` (a linear map, so the identity still holds
    and each component's energy is the error the GEMM's operand really carries), the masks of the transformed
    elements kept, the statistics recomputed there. The Shapley values are left out: their game was played on the
    transformed elements' corner energies."""
    back = {f: transform.back(getattr(d, f), role) for f in ("x", "quantized", "e_scale", "e_dead", "e_grid")}
    out = dataclasses.replace(d, **back, stats={})
    out.stats = component_stats(out, None, n=d.stats["n"])
    out.stats.update({k: d.stats[k] for k in ("format", "scale_rule", "axis", "shape", "dtype", "form",
                                              "mean_abs_gain", "mean_abs_nominal_gain") if k in d.stats})
    out.stats["basis"] = "mapped back from the GEMM transform's"
    return out


def checked_transform(correction, out, k: int, device) -> GemmTransform | None:
    """``gemm_transform``'s return for a GEMM contracted over ``k``: None, a positive finite vector [k] (a diagonal
    scaling) or an invertible finite [k, k] matrix; anything else one ``HookError`` naming the correction."""
    if out is None:
        return None
    expected = f"None, a positive vector of shape ({k},) or an invertible [{k}, {k}] matrix"
    if not isinstance(out, torch.Tensor) or not out.is_floating_point() or out.shape not in ((k,), (k, k)):
        got = f"a {out.dtype} tensor of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else \
            type(out).__name__
        raise HookError.says(correction, "gemm_transform", f"returned {got}; expected {expected}")
    out = out.detach().to(device)
    if not bool(torch.isfinite(out).all()):
        raise HookError.says(correction, "gemm_transform", "returned non-finite values")
    if out.dim() == 1:
        if not bool((out > 0).all()):
            raise HookError.says(correction, "gemm_transform", f"returned a scale with {int((out <= 0).sum())} "
                                                               "entries <= 0; expected a positive vector")
        return GemmTransform(scale=out)
    cond = float(torch.linalg.cond(out.to(torch.float64)))  # a singular matrix would lose the product
    if not cond < CONDITION_LIMIT:
        raise HookError.says(correction, "gemm_transform", f"returned a matrix of condition number {cond:.3g} "
                                                           f"(limit {CONDITION_LIMIT:g}); expected an invertible one")
    return GemmTransform(matrix=out)

"""Component injection: one error component of MXFP4 alone, or MXFP4 without it, as a quantizer.

Because the split is exact as vectors (``MX(x) - x = e_scale + e_dead + e_grid``), each component
can be applied to a GEMM operand by itself (docs/design.md, "The pathway matrix"):

    inject c   x + e_c           sufficiency: what that component alone does
    remove c   MX(x) - e_c       necessity: MXFP4 with a perfect correction of c

``ComponentQuantizer`` is a ``Quantizer``: the model patcher runs it through the same patched GEMMs
as every recipe, so a recipe's ``gemms`` choose the site (``SITES``: the forward GEMM, the two
backward GEMMs, or both). The components are computed in float32 (float64 for a float64 operand),
then cast to the operand's dtype; so ``inject scale + inject dead + inject grid - 2x = MX(x)`` holds
to float32 round-off.

``form`` picks the decomposition (``canonical`` or ``gain``, docs/decomposition.md); the identity
holds in both. The pathway matrix's rows (``ROWS``) name the arms: ``none`` (no quantization), ``+c`` (inject c),
``all`` (MXFP4), ``-c`` (remove c).
"""

from __future__ import annotations

import torch

from .decompose import COMPONENTS, check_form, error_components
from .quantizer import Quantizer

SITES = {
    "forward": {"forward": True, "input_grad": False, "weight_grad": False},
    "backward": {"forward": False, "input_grad": True, "weight_grad": True},
    "both": {"forward": True, "input_grad": True, "weight_grad": True},
}
ROWS = ("none", "+scale", "+dead", "+grid", "all", "-scale", "-dead", "-grid")


def row_spec(row: str) -> dict:
    """The quantizer arguments of a pathway row: {} for ``all``, {"inject": c} for ``+c``,
    {"remove": c} for ``-c``; None for ``none`` (no quantization)."""
    if row not in ROWS:
        raise ValueError(f"unknown pathway row {row!r}; accepted: {', '.join(ROWS)}")
    if row == "none":
        return None
    if row == "all":
        return {}
    return {"inject" if row[0] == "+" else "remove": row[1:]}


def _check_component(kind: str, c: str | None) -> str | None:
    if c is not None and c not in COMPONENTS:
        raise ValueError(f"{kind} must be one of {', '.join(COMPONENTS)}, got {c!r}")
    return c


class ComponentQuantizer(Quantizer):
    """``q(x, axis)`` = x + e_c (``inject=c``) or MX(x) - e_c (``remove=c``), blocks along ``axis``.

    Takes the arguments of ``Quantizer`` (format, scale rule, gemms, modules) but no corrections:
    the components are those of the format's own quantizer.
    """

    def __init__(self, fmt="mxfp4", scale_rule=None, corrections=(), *, inject=None, remove=None, form="canonical",
                 **kw):
        if (inject is None) == (remove is None):
            raise ValueError(
                f"ComponentQuantizer takes exactly one of inject= or remove= (got inject={inject!r}, remove={remove!r})"
            )
        if list(corrections):
            raise ValueError("component injection applies to the format's own quantizer: corrections are not accepted")
        if kw.get("activations") is False:
            raise ValueError(
                "component injection needs activations: true (it acts on every operand of the chosen GEMMs)"
            )
        super().__init__(fmt, scale_rule, (), **kw)
        self.inject = _check_component("inject", inject)
        self.remove = _check_component("remove", remove)
        self.form = check_form(form)

    @property
    def plain(self) -> bool:
        return False

    @property
    def exact_in_bf16(self) -> bool:
        """x + e_c is not a grid value in general: GEMMs on it run in float32."""
        return False

    @property
    def row(self) -> str:
        return f"+{self.inject}" if self.inject else f"-{self.remove}"

    def __repr__(self) -> str:
        return super().__repr__().replace("Quantizer(", f"ComponentQuantizer({self.row}, {self.form}, ", 1)

    def __call__(self, x: torch.Tensor, axis: int, valid: torch.Tensor | None = None) -> torch.Tensor:
        x = self.widened(x)  # a 16-bit x: float32 out (x + e_c is no 16-bit number in general)
        dtype = torch.float32 if x.dtype != torch.float64 else torch.float64
        parts = error_components(x, self.fmt, axis, self.scale_rule, dtype=dtype, form=self.form)
        if self.inject:
            out = x.to(dtype) + parts[self.inject]
        else:
            out = parts["quantized"] - parts[self.remove]
        return out.to(x.dtype)

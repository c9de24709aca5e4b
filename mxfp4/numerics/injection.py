"""Component injection: one error component of MXFP4 alone, or MXFP4 without it, as a quantizer.

Because the split is exact as vectors (``MX(x) - x = e_scale + e_dead + e_grid``), each component
can be applied to a GEMM operand by itself: ``inject c`` gives ``x + e_c``, ``remove c`` gives
``MX(x) - e_c``; energy-matched controls replace ``e_c`` by noise of the same energy per block.

The method in full: docs/methods.md, ``mxfp4.numerics.injection``."""

from __future__ import annotations

import torch

from .decompose import COMPONENTS, check_form
from .dispatch import error_components
from .quantizer import Quantizer
from .reference import from_blocks, to_blocks

SITES = {
    "forward": {"forward": True, "input_grad": False, "weight_grad": False},
    "backward": {"forward": False, "input_grad": True, "weight_grad": True},
    "both": {"forward": True, "input_grad": True, "weight_grad": True},
}
ROWS = ("none", "+scale", "+dead", "+grid", "all", "-scale", "-dead", "-grid")
CONTROLS = ("gaussian", "permuted", "signflip")
CONTROL_ROWS = tuple(f"{sign}{c}~{k}" for sign in "+-" for c in COMPONENTS for k in CONTROLS)


def row_spec(row: str) -> dict:
    """The quantizer arguments of a pathway row: {} for ``all``, {"inject": c} for ``+c``,
    {"remove": c} for ``-c``, plus {"control": k} for ``±c~k``; None for ``none`` (no quantization)."""
    if row not in ROWS and row not in CONTROL_ROWS:
        raise ValueError(f"unknown pathway row {row!r}; accepted: {', '.join(ROWS + CONTROL_ROWS)}")
    if row == "none":
        return None
    if row == "all":
        return {}
    component, _, control = row[1:].partition("~")
    return {"inject" if row[0] == "+" else "remove": component, **({"control": control} if control else {})}


def matched_control(e: torch.Tensor, axis: int, block_size: int, kind: str, seed: int = 0) -> torch.Tensor:
    """Noise with the energy of ``e`` in every block (blocks of ``block_size`` along ``axis``) and no
    structure: ``gaussian`` draws N(0, 1) over the block's elements and rescales it to the block's
    ``||e||``; ``permuted`` shuffles e's values within the block (the same multiset); ``signflip``
    multiplies each element by an independent random sign (each element keeps its magnitude, so the
    control puts its energy where the component does, on the block maximum or on the small elements,
    and only the alignment with x is lost: the fair control where one value dominates a block). The RNG
    is seeded from ``seed``, the shape and the content of e, so a tensor gets the same control every time."""
    if kind not in CONTROLS:
        raise ValueError(f"control {kind!r}; accepted: {', '.join(CONTROLS)}")
    blocks = to_blocks(e, axis, block_size, dtype=None)
    valid = to_blocks(torch.ones_like(e, dtype=torch.bool), axis, block_size, dtype=None)
    key = hash((seed, tuple(e.shape), axis, float(e.double().abs().sum()), float(e.double().pow(2).sum())))
    g = torch.Generator().manual_seed(key & 0x7FFF_FFFF_FFFF_FFFF)
    if kind == "gaussian":
        z = torch.randn(blocks.shape, generator=g, dtype=torch.float64) * valid
        target = blocks.double().pow(2).sum(-1, keepdim=True).sqrt()
        norm = z.pow(2).sum(-1, keepdim=True).sqrt()
        out = torch.where(norm > 0, z * target / norm.clamp(min=torch.finfo(torch.float64).tiny), 0.0).to(e.dtype)
    elif kind == "permuted":
        keys = torch.rand(blocks.shape, generator=g).masked_fill(~valid, 2.0)  # padding sorts last: stays padding
        out = blocks.gather(-1, keys.argsort(-1))
    else:  # signflip: a sign is exact, so magnitudes and block energies are kept exactly
        signs = torch.randint(0, 2, blocks.shape, generator=g, dtype=torch.int8) * 2 - 1
        out = blocks * signs.to(blocks.dtype)
    return from_blocks(out, e.shape, axis)


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
                 control=None, **kw):
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
        if control is not None and control not in CONTROLS:
            raise ValueError(f"control {control!r}; accepted: {', '.join(CONTROLS)} (or none)")
        self.control = control

    @property
    def plain(self) -> bool:
        return False

    @property
    def exact_in_bf16(self) -> bool:
        """x + e_c is not a grid value in general: GEMMs on it run in float32."""
        return False

    @property
    def exact_in_tf32(self) -> bool:
        return False

    @property
    def row(self) -> str:
        row = f"+{self.inject}" if self.inject else f"-{self.remove}"
        return f"{row}~{self.control}" if self.control else row

    def __repr__(self) -> str:
        return super().__repr__().replace("Quantizer(", f"ComponentQuantizer({self.row}, {self.form}, ", 1)

    def __call__(self, x: torch.Tensor, axis: int, valid: torch.Tensor | None = None, operand=None) -> torch.Tensor:
        x = self.widened(x)  # a 16-bit x: float32 out (x + e_c is no 16-bit number in general)
        dtype = torch.float32 if x.dtype != torch.float64 else torch.float64
        parts = error_components(x, self.fmt, axis, self.scale_rule, dtype=dtype, form=self.form)
        c = self.inject or self.remove
        e = parts[c]
        if self.control:
            e = matched_control(e, axis, self.fmt.block_size, self.control)
        if self.inject:
            out = x.to(dtype) + e
        else:  # MXFP4 without c (or, with a control, with c's structure replaced by its matched noise)
            out = parts["quantized"] - parts[c] + (e if self.control else 0)
        return out.to(x.dtype)

"""The one dispatch every caller goes through: it picks the implementation, callers never do.

- CUDA tensors in MXFP4: the Triton kernels.
- CPU tensors in an E8M0-scaled format (MXFP4, MXFP6, MXFP8): the fused C++ kernel (``fused_cpu``: the
  reference's values and layout in one pass), or the reference where it cannot be built.
- ``MXFP4_BACKEND`` (or ``use_backend``) may ask for ``reference`` (pure PyTorch), ``fused`` or
  ``triton`` (on CPU under ``TRITON_INTERPRET=1``, set before the first import of the kernels): the
  same values on every one.
- Other formats (NVFP4) use the reference.

The method in full: docs/methods.md, ``mxfp4.numerics.dispatch``."""

from __future__ import annotations

import contextlib
import math
import os
import sys

import torch

from . import fused_cpu, reference
from .formats import BlockFormat, get_format

BACKENDS = ("auto", "reference", "fused", "triton")
_override: list[str] = []


@contextlib.contextmanager
def use_backend(name: str):
    """Force a backend inside a ``with`` block (tests, benchmarks).

    Args:
        name: one of ``BACKENDS`` (``auto``, ``reference``, ``fused``, ``triton``).
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; accepted: {', '.join(BACKENDS)}")
    _override.append(name)
    try:
        yield
    finally:
        _override.pop()


_fused_corrections: list[bool] = []


@contextlib.contextmanager
def use_fused_corrections(enabled: bool):
    """Switch the fused kernels of the corrections (one pass for outlier fallback and macro-block scaling,
    stochastic rounding with the reference's draws) on or off inside a ``with`` block: off, the quantizer
    composes the corrections' hooks around the plain kernel (the same values; benchmarks measure both)."""
    _fused_corrections.append(bool(enabled))
    try:
        yield
    finally:
        _fused_corrections.pop()


def fused_corrections_enabled() -> bool:
    return _fused_corrections[-1] if _fused_corrections else True


def requested_backend() -> str:
    name = _override[-1] if _override else os.environ.get("MXFP4_BACKEND", "auto")
    if name not in BACKENDS:
        raise ValueError(f"MXFP4_BACKEND={name!r} is not a backend; accepted: {', '.join(BACKENDS)}")
    return name


def backend_for(x: torch.Tensor, fmt: str | BlockFormat = "mxfp4") -> str:
    """The backend that handles ``x`` in ``fmt``: 'reference', 'fused' or 'triton'."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"expected a torch.Tensor, got {type(x).__name__} (wrap it: torch.tensor(...))")
    wanted = requested_backend()
    fmt = get_format(fmt)
    is_mxfp4 = fmt.name == "mxfp4"
    if wanted in ("auto", "fused") and fused_cpu.applies(x, fmt) and fused_cpu.available():
        return "fused"
    if wanted in ("auto", "fused"):
        return "triton" if (wanted == "auto" and x.is_cuda and is_mxfp4) else "reference"
    if wanted == "triton":
        if not is_mxfp4:
            return "reference"
        if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                "the Triton backend on CPU tensors runs under the interpreter: set TRITON_INTERPRET=1 "
                "before importing mxfp4's kernels, or use MXFP4_BACKEND=reference"
            )
    return wanted


def prepare(fmt: str | BlockFormat = "mxfp4") -> str:
    """Build what the CPU backend of ``fmt`` needs now (the fused kernel's one-off build, about 30 s on a
    new machine), so that the first quantization does not pay it; returns that backend."""
    return backend_for(torch.zeros(1), fmt)


def error_components(x: torch.Tensor, fmt: str | BlockFormat = "mxfp4", axis: int = -1, scale_rule: str | None = None,
                     *, dtype: torch.dtype = torch.float64, form: str = "canonical") -> dict[str, torch.Tensor]:
    """``decompose.error_components`` (what component injection applies) on the backend picked here: the
    fused CPU kernel for a float32 x computed in float32, the same values and layouts; else the torch path."""
    from .decompose import error_components as torch_path
    from .decompose import fused_error_components

    if dtype == torch.float32 and x.dtype == torch.float32 and x.numel() and backend_for(x, fmt) == "fused":
        parts = fused_error_components(x, fmt, axis, scale_rule, form=form)
        if parts is not None:
            return parts
    return torch_path(x, fmt, axis, scale_rule, dtype=dtype, form=form)


def fast_path(x: torch.Tensor, fmt: str | BlockFormat = "mxfp4") -> bool:
    """Whether ``x`` in ``fmt`` goes to the Triton kernels (the fused paths below apply only then)."""
    return backend_for(x, fmt) == "triton"


def _kernels():
    from . import triton_kernels

    return triton_kernels


def autotune_spent() -> tuple[float, int]:
    """(seconds, keys) the Triton kernels' autotuning has taken in this process (``triton_kernels.autotune_spent``);
    (0.0, 0) while they are not loaded (importing them here would fix the interpreter choice too early)."""
    loaded = sys.modules.get(f"{__package__}.triton_kernels")
    return loaded.autotune_spent() if loaded is not None else (0.0, 0)


def quantize(x, fmt="mxfp4", axis=-1, scale_rule=None) -> reference.QuantizedTensor:
    """Quantize ``x`` into packed element codes and per-block scales (the Triton kernels on CUDA, the
    reference elsewhere; the same bytes either way).

    Args:
        x: the tensor (float32, bfloat16 or float16; any number of dimensions, any device).
        fmt: the block format, a name of ``FORMATS`` (``mxfp4``, ``nvfp4``, ...) or a ``BlockFormat``.
        axis: the axis the blocks run along (a GEMM's reduction axis); its length need not be a multiple
            of the block size (the last block is padded with zeros).
        scale_rule: the E8M0 scale rule, ``floor`` (OCP, the default), ``ceil``, ``even`` or ``rceil``.

    Returns:
        A ``QuantizedTensor``: codes packed two per byte along the blocked axis (first element in the low
        nibble), the scales as raw E8M0 bytes, and what ``dequantize`` needs to restore the shape.
    """
    if backend_for(x, fmt) == "triton":
        return _kernels().quantize(x, axis, scale_rule)
    return reference.quantize(x, fmt, axis, scale_rule)


def dequantize(qt: reference.QuantizedTensor, dtype=None) -> torch.Tensor:
    """The values of a ``QuantizedTensor`` in its original shape and layout.

    Args:
        qt: what ``quantize`` returned.
        dtype: the output dtype (default: the dtype ``x`` had).
    """
    if not isinstance(qt, reference.QuantizedTensor):
        raise ValueError(f"dequantize takes a QuantizedTensor (from mxfp4.quantize), got {type(qt).__name__}")
    if backend_for(qt.codes, qt.fmt) == "triton":
        return _kernels().dequantize(qt, dtype)
    return reference.dequantize(qt, dtype)


class _StraightThrough(torch.autograd.Function):
    """The straight-through estimator: the forward's values are ``quantize(x)`` exactly, the gradient
    passes to x unchanged (d fake_quantize(x) / dx := 1)."""

    @staticmethod
    def forward(ctx, x, quantize):
        return quantize(x.detach())

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def fake_quantize(x, fmt="mxfp4", axis=-1, scale_rule=None) -> torch.Tensor:
    """x quantized and dequantized, in x's dtype: ``dequantize(quantize(x))`` without the packed copy. On a
    tensor that requires grad (with grad mode on) the gradient flows straight through (the
    straight-through estimator); the values are the same.

    Args: as ``quantize``'s (x, fmt, axis, scale_rule).
    """
    if isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled():
        return _StraightThrough.apply(x, lambda t: fake_quantize(t, fmt, axis, scale_rule))
    backend = backend_for(x, fmt)
    if backend == "triton":
        return _kernels().fake_quantize(x, axis, scale_rule)
    if backend == "fused":
        return fused_cpu.fake_quantize(x, *reference.check_input(x, fmt, axis, scale_rule))
    return reference.fake_quantize(x, fmt, axis, scale_rule)


def fake_quantize_corrected(x: torch.Tensor, fmt, axis: int, scale_rule, split: bool, blocks: int,
                            strides: tuple) -> torch.Tensor | None:
    """Outlier fallback (``split``: each block's largest magnitude kept in bfloat16) and/or macro-block scaling
    over ``blocks`` blocks in one pass of the backend's fused kernel (``fused_cpu.corrected`` for a float32 x
    on the fused backend, ``triton_kernels.corrected`` on Triton), the torch composition's values laid out
    with ``strides``; None where no fused kernel applies or an element is not finite."""
    backend = backend_for(x, fmt)
    if backend == "fused" and x.dtype == torch.float32:
        return fused_cpu.corrected(x, get_format(fmt), axis, scale_rule, split, blocks, strides)
    if backend == "triton":
        return _kernels().corrected(x, axis, scale_rule, split, blocks, strides)
    return None


def plain_output_strides(x: torch.Tensor, axis: int, fmt, scale_rule, backend: str) -> tuple:
    """The strides of ``fake_quantize``'s result on ``backend`` for an x of these shape and strides (a meta
    tensor will do)."""
    if backend == "triton":
        return _kernels().output_strides(x, axis)
    return fused_cpu.output_strides(x, axis, get_format(fmt), scale_rule)


def fake_quantize_stochastic(x: torch.Tensor, fmt, axis: int, scale_rule, generator: torch.Generator) -> torch.Tensor:
    """``reference.fake_quantize_stochastic`` (elements rounded stochastically under the block scales, the draws
    from ``generator``): the fused CPU kernel for a float32 x (the gradients the recipes round) on the fused
    backend with a CPU generator, the same values, layout and draws; the reference elsewhere. Along another axis
    or in another layout, the kernel runs on x with the axis moved last and made contiguous: the reference draws
    in that order (its blocks'), and lays its result out as the kernel's moved back."""
    if (fused_corrections_enabled() and x.dtype == torch.float32 and x.numel()
            and isinstance(generator, torch.Generator) and generator.device.type == "cpu"
            and backend_for(x, fmt) == "fused"):
        fmt_, ax, rule = reference.check_input(x, fmt, axis, scale_rule)
        out = fused_cpu.stochastic(x.movedim(ax, -1).contiguous(), fmt_, x.dim() - 1, rule, generator)
        if out is not None:
            return out.movedim(-1, ax)
    return reference.fake_quantize_stochastic(x, fmt, axis, scale_rule, generator)


def fake_quantize_with_stats(x, fmt="mxfp4", axis=-1, scale_rule=None) -> tuple[torch.Tensor, dict]:
    """Fake-quantize and return the decomposition energies and counts of the same tensor, as Python
    numbers (the Triton path's float32 energies: relative 1e-5 of the float64 reference; for device
    tensors without a sync use ``Quantizer.fused_stats``).

    Args:
        x: the tensor.
        fmt: the block format's name or a ``BlockFormat``.
        axis: the axis the blocks run along.
        scale_rule: the E8M0 scale rule; None: the format's default.
    """
    if backend_for(x, fmt) == "triton":
        out, on_device = _kernels().fake_quantize_with_stats(x, axis, scale_rule)  # device tensors: synced here
        stats = {k: float(v) if isinstance(v, torch.Tensor) else v for k, v in on_device.items()}
        stats["deadzone_count"], stats["saturation_count"] = (
            int(stats["deadzone_count"]),
            int(stats["saturation_count"]),
        )
        if not all(math.isfinite(v) for k, v in stats.items() if k.startswith("energy")):
            raise ValueError("fake_quantize_with_stats needs finite input; found NaN or infinite elements")
        return out, stats
    from .decompose import decompose

    d = decompose(x, fmt, axis, scale_rule)
    keys = (
        "energy_scale",
        "energy_dead",
        "energy_grid",
        "energy_total",
        "cross_term",
        "deadzone_fraction",
        "saturation_fraction",
        "n",
    )
    stats = {k: d.stats[k] for k in keys}
    stats["deadzone_count"] = int(d.dead.sum())
    stats["saturation_count"] = int(d.saturated.sum())
    return d.quantized.to(x.dtype), stats


def fake_quantize_both(x: torch.Tensor, fmt="mxfp4", scale_rule=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x fake-quantized along its rows, along its columns) of a 2D tensor: one read of x by the fused
    kernel on the fast path, two fake-quantizations elsewhere (the same values, bit for bit)."""
    if x.dim() != 2:
        raise ValueError(f"fake_quantize_both takes a 2D tensor, got shape {tuple(x.shape)}")
    if fast_path(x, fmt):
        return _kernels().fake_quantize_both(x, scale_rule)
    return fake_quantize(x, fmt, -1, scale_rule), fake_quantize(x, fmt, 0, scale_rule)


def fused_stats(x: torch.Tensor, fmt="mxfp4", axis=-1, scale_rule=None) -> dict | None:
    """The decomposition energies and counts of ``x`` as 0-dim device tensors (float32 arithmetic, no
    host sync) from the fused kernel on the fast path; None elsewhere (use ``decompose``)."""
    if not fast_path(x, fmt):
        return None
    return _kernels().fake_quantize_with_stats(x, axis, scale_rule)[1]


def pack_weight(w: torch.Tensor, scale_rule=None):
    """``w`` [N, K] quantized along K and packed for ``w4a16_matmul`` (fast path only)."""
    if not fast_path(w, "mxfp4"):
        raise ValueError(
            "pack_weight runs the W4A16 kernels, which need a CUDA tensor (or MXFP4_BACKEND=triton "
            "with TRITON_INTERPRET=1); check dispatch.fast_path(w) first"
        )
    from . import triton_gemm

    return triton_gemm.pack_weight(_kernels().quantize(w, -1, scale_rule))


def w4a16_matmul(x: torch.Tensor, packed) -> torch.Tensor:
    """``x @ dequantize(packed)^T`` by the W4A16 kernel (a weight from ``pack_weight``)."""
    from . import triton_gemm

    return triton_gemm.w4a16_matmul(x, packed)

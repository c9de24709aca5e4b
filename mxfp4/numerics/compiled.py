"""The CPU fast path: the reference's fake-quantization compiled by ``torch.compile`` (inductor's C++),
equal to the reference bit for bit (the tests compare them over every format, scale rule, dtype, the
adversarial inputs and every finite bfloat16 value) and in layout, but where the reference's own
reshape into blocks is a view (one block along a non-last axis: its output comes back contiguous).

Each (format, scale rule) has a compiled function of its own, fed contiguous 2D tensors blocked along
their last axis with dynamic shapes, so a process compiles a handful of graphs whatever its row counts;
the first call of each pays the compilation (inductor caches it on disk for later processes). Where
compilation fails (no C++ compiler), the reference runs instead, the same values, with one warning."""

from __future__ import annotations

import functools
import types
import warnings

import torch

from . import reference
from .formats import BlockFormat

_failed: list[BaseException] = []  # the first compilation failure of this process, if any


def _fake_quantize_rows(x2: torch.Tensor, fmt: BlockFormat, rule: str) -> torch.Tensor:
    """The reference's fake-quantized blocks [rows, n_blocks, block_size] of a 2D tensor along its last
    axis, in float32 (the padding cropped outside, so the result's layout is the reference's)."""
    tensor_scale = reference.nvfp4_tensor_scale(x2, fmt) if fmt.tensor_scale else None
    q, _, scale = reference.quantize_blocks(reference.to_blocks(x2, 1, fmt.block_size), fmt, rule, tensor_scale)
    return q * scale.unsqueeze(-1)


@functools.cache
def _compiled(fmt_name: str, rule: str):
    """The compiled function of one (format, rule), with a code object of its own: dynamo counts its
    recompilations per code object, so the variants of one never crowd out another's."""
    code = _fake_quantize_rows.__code__.replace(co_name=f"fake_quantize_rows_{fmt_name}_{rule}")
    fn = types.FunctionType(code, _fake_quantize_rows.__globals__, code.co_name)
    return torch.compile(fn, dynamic=True)


def fake_quantize(x: torch.Tensor, fmt: BlockFormat, axis: int, rule: str) -> torch.Tensor:
    """``reference.fake_quantize(x, fmt, axis, rule)`` for checked arguments (``reference.check_input``:
    the format, the axis in range and non-negative, the rule resolved), through the compiled function."""
    x = x.detach()
    last = axis == x.dim() - 1
    moved = x if last else x.movedim(axis, -1)
    x2 = moved.reshape(-1, moved.shape[-1]).contiguous()
    out = None
    if not _failed:
        try:
            out = _compiled(fmt.name, rule)(x2, fmt, rule)
        except Exception as err:  # noqa: BLE001  (a machine that cannot compile: the reference, same values)
            _failed.append(err)
            warnings.warn(f"torch.compile of the fake-quantization failed ({type(err).__name__}: {err}); the "
                          "reference runs instead, with the same values, slower", RuntimeWarning, stacklevel=2)
    if out is None:
        out = _fake_quantize_rows(x2, fmt, rule)
    out = reference.from_blocks(out, x2.shape, 1).reshape(moved.shape)
    return (out if last else out.movedim(-1, axis)).to(x.dtype)

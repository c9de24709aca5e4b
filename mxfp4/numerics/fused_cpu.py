"""The CPU fast path: fake-quantization to an E8M0-scaled block format (MXFP4, MXFP6, MXFP8) in one fused
C++ pass (``fused_cpu.cpp``), equal to the reference bit for bit and in layout.

- Values: the kernel performs the reference's float32 operations element for element (the tests
  compare them over every E8M0 format, scale rule and dtype, the adversarial inputs and every finite
  bfloat16 value).
- Layout: the output has the strides the reference's own result would have, so a later GEMM reads the
  operand exactly as it reads the reference's: for a contiguous x blocked in two or more blocks without
  a rounding to a narrower dtype after padding, the reference's buffer (the blocked axis last, padded)
  moved back (``moved_back_strides``, checked against the reference over random shapes by the tests);
  otherwise found by running the reference on a meta tensor of x's shape and strides (cached).
- Blocks along a non-last axis (the weight-gradient GEMM's operands) are read in place, without the
  transposed copy.

The same extension computes the error components of component injection (``components``: the canonical
form in one pass, the gain form in two around its per-block sums, which the caller takes with torch).

The extension is built by ``torch.utils.cpp_extension`` (a C++ compiler and ninja) on its first use on a
machine, about 50 s on 2 cores, and cached on disk for every later process, under a name of its own per
source file and flags (two checkouts on one machine do not rebuild over each other's build). Where the
build fails, the reference runs instead, with the same values, and one warning says why."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import platform
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch

from ..machine import cpu_flags
from . import reference
from .formats import SCALE_RULES_E8M0, BlockFormat

SOURCE = Path(__file__).with_suffix(".cpp")
MAX_BLOCK = 64  # kMaxBlock in the source
_failed: list[BaseException] = []  # the first build failure of this process, if any


def _flags() -> list[str]:
    """-O3 with no FMA contraction, OpenMP (ATen's parallel_for is inline: without it the kernel runs on
    one thread whatever torch's thread count); AVX2 where the CPU has it (the results do not depend on
    it: every operation is an exact IEEE one)."""
    flags = ["-O3", "-ffp-contract=off", "-fopenmp"]
    if platform.machine().lower() in ("x86_64", "amd64") and "avx2" in cpu_flags():
        flags += ["-mavx2", "-mf16c"]
    return flags


def _find_ninja() -> None:
    """Put the ninja that pip installed (the ``ninja`` package, a dependency) on PATH when none is there:
    ``cpp_extension`` runs ``ninja`` by name, and a venv's own bin folder is on PATH only when activated."""
    if shutil.which("ninja") is None:
        import ninja

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


@functools.cache
def _extension():
    from torch.utils import cpp_extension

    _find_ninja()
    flags = _flags()
    # the build folder is named after the extension: one per source path and flags, so that two checkouts
    # (or two flag sets) each keep their build instead of recompiling whenever the other one loads
    key = hashlib.sha256(repr((str(SOURCE.resolve()), flags, sys.version_info[:2])).encode()).hexdigest()[:10]
    name = f"mxfp4_fused_cpu_{key}"
    build = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()) / name
    build.mkdir(parents=True, exist_ok=True)
    with build_lock(build):
        # a plain shared library whose ops register themselves (no Python module: see the source's includes)
        cpp_extension.load(name=name, sources=[str(SOURCE)], extra_cflags=flags, extra_ldflags=["-fopenmp"],
                           is_python_module=False, verbose=False, build_directory=str(build))
    return torch.ops.mxfp4_fused_cpu


BUILD_WAIT = 900  # seconds to wait for another live process's build of the same kernel before giving up


@contextlib.contextmanager
def build_lock(build: Path, wait: float = BUILD_WAIT):
    """Hold the build folder's own lock while torch builds or loads the kernel. It is an flock, which the kernel
    drops when its holder dies, so a killed build never blocks the next one; holding it, a ``lock`` file of torch's
    in the folder can only be a killed build's (torch's own lock names no process and is waited on forever), and is
    removed with one line saying so. Another live build is waited for up to ``wait`` seconds, then an error."""
    import fcntl

    with open(build / "mxfp4_build.lock", "w") as held:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another process has been building the fused CPU kernel for {wait:.0f} s "
                                       f"(it holds {build / 'mxfp4_build.lock'})") from None
                time.sleep(0.2)
        stale = build / "lock"
        if stale.exists():
            stale.unlink()
            print(f"mxfp4: removed the lock a killed build of the fused CPU kernel left ({stale})", file=sys.stderr)
        yield


def available() -> bool:
    """Whether the fused kernel is built (building it now if needed); False, with one warning per
    process, where it cannot be (no C++ compiler, no ninja)."""
    if _failed:
        return False
    try:
        _extension()
        return True
    except Exception as err:  # noqa: BLE001  (a machine that cannot build: the reference, same values)
        _failed.append(err)
        warnings.warn(f"building the fused CPU quantizer failed ({type(err).__name__}: {err}); the reference runs "
                      "instead, with the same values, slower", RuntimeWarning, stacklevel=2)
        return False


def applies(x: torch.Tensor, fmt: BlockFormat) -> bool:
    """Whether the fused kernel handles ``x`` in ``fmt``: a plain CPU tensor with data (a tensor subclass,
    such as a fake tensor under tracing or the memory audit's, goes through the reference's torch ops,
    which it intercepts), E8M0 block scales (not NVFP4)."""
    return (type(x) in (torch.Tensor, torch.nn.Parameter) and x.device.type == "cpu" and not x.is_meta
            and fmt.scale == "e8m0" and fmt.block_size <= MAX_BLOCK)


@functools.lru_cache(maxsize=4096)
def reference_strides(shape: tuple, stride: tuple, dtype: torch.dtype, axis: int, fmt: BlockFormat,
                      rule: str) -> tuple:
    """The strides of ``reference.fake_quantize``'s result for an input of this shape, strides and dtype:
    the reference's own operations run on a meta tensor (no data, the same stride rules)."""
    x = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    q, _, scale = reference.quantize_blocks(reference.to_blocks(x, axis, fmt.block_size), fmt, rule, None)
    return reference.from_blocks(q * scale.unsqueeze(-1), x.shape, axis).to(dtype).stride()


def contiguous_strides(shape) -> tuple:
    """The strides of a contiguous tensor of ``shape``."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def moved_back_strides(shape: tuple, axis: int, block_size: int) -> tuple:
    """The strides of the reference's float32 result for a contiguous x with blocks along ``axis``: a
    contiguous buffer with ``axis`` last and padded to whole blocks, that axis moved back in place."""
    padded = -(-shape[axis] // block_size) * block_size
    buffer = contiguous_strides([n for i, n in enumerate(shape) if i != axis] + [padded])
    return (*buffer[:axis], buffer[-1], *buffer[axis:-1])


def output_strides(x: torch.Tensor, axis: int, fmt: BlockFormat, rule: str) -> tuple:
    """The strides of ``reference.fake_quantize(x, fmt, axis, rule)``: ``moved_back_strides`` where that
    rule is known to hold (a contiguous x, two or more blocks along the axis, float32 or no padding),
    else ``reference_strides``."""
    shape = tuple(x.shape)
    k = shape[axis]
    if k > fmt.block_size and (x.dtype == torch.float32 or k % fmt.block_size == 0) and (
            x.stride() == contiguous_strides(shape)):
        return moved_back_strides(shape, axis, fmt.block_size)
    return reference_strides(shape, x.stride(), x.dtype, axis, fmt, rule)


def _as_3d(t: torch.Tensor, dims: tuple[int, int, int]) -> torch.Tensor | None:
    """``t`` viewed as [outer, blocked axis, inner] without a copy, or None where its strides forbid it."""
    try:
        return t.view(dims)
    except RuntimeError:
        return None


def _views_3d(x: torch.Tensor, axis: int, outputs: list[torch.Tensor], kernel, *args) -> bool:
    """``kernel(x3, *outputs3, *args)`` on [outer, blocked axis, inner] views of x and of each output (a
    contiguous stand-in, copied back, where an output's strides forbid the view); False where the kernel
    returned False (a non-finite element), True otherwise."""
    dims = (math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:]))
    x3 = _as_3d(x, dims)
    if x3 is None:
        x3 = x.contiguous().view(dims)
    views = [_as_3d(o, dims) for o in outputs]
    targets = [v if v is not None else torch.empty(dims, dtype=o.dtype) for v, o in zip(views, outputs)]
    if kernel(x3, *targets, *args) is False:
        return False
    for v, o, t in zip(views, outputs, targets):
        if v is None:
            o.copy_(t.view(x.shape))
    return True


def fake_quantize(x: torch.Tensor, fmt: BlockFormat, axis: int, rule: str) -> torch.Tensor:
    """``reference.fake_quantize(x, fmt, axis, rule)`` for checked arguments (``reference.check_input``:
    the axis in range and non-negative, the rule resolved) and a format ``applies`` to."""
    x = x.detach()
    out = torch.empty_strided(x.shape, output_strides(x, axis, fmt, rule), dtype=x.dtype)
    _views_3d(x, axis, [out], _extension().fake_quantize_into, fmt.block_size, *_element_args(fmt, rule))
    return out


@functools.lru_cache(maxsize=64)
def _element_args(fmt: BlockFormat, rule: str) -> tuple:
    """The kernels' element-format arguments: emin, emax, mantissa bits, max value and the rule's index."""
    elem = fmt.element
    return elem.emin, elem.emax, elem.mbits, elem.max_value, SCALE_RULES_E8M0.index(rule)


def macro_block(x: torch.Tensor, fmt: BlockFormat, axis: int, rule: str, blocks: int, strides: tuple
                ) -> torch.Tensor | None:
    """Macro-block scaling of a float32 x (``corrections.macro_block``, one row per group, the largest block's
    candidate) in one pass, its values those of the reference block path bit for bit; the output has
    ``strides``. None where x holds a NaN or an infinity (the reference then runs)."""
    x = x.detach()
    out = torch.empty_strided(x.shape, strides, dtype=x.dtype)
    ok = _views_3d(x, axis, [out], _extension().macro_block_into, fmt.block_size, blocks, *_element_args(fmt, rule))
    return out if ok else None


def macro_beats_plain(x: torch.Tensor, plain: torch.Tensor, macro: torch.Tensor) -> bool:
    """The kernels' choice for one group (contiguous float32 vectors): whether ``macro``'s error energy against
    ``x``, summed in float64 element by element in order, is below ``plain``'s (``corrections.macro_block``'s rule).
    The kernels sum in vector lanes and fall back to the sequential sums only near a tie."""
    return bool(_extension().macro_beats_plain(x, plain, macro))


LANE_SPAN = 256  # kMaxLaneSpan in the source: the most elements of one group on the corrected kernel


def corrected(x: torch.Tensor, fmt: BlockFormat, axis: int, rule: str, split: bool, blocks: int, strides: tuple
              ) -> torch.Tensor | None:
    """Outlier fallback (``split``: each block's largest magnitude kept, rounded to bfloat16) and/or macro-block
    scaling (``blocks`` > 0 blocks a group, one row, the largest block's candidate) of a float32 x in one pass:
    the values of the quantizer's torch composition of the two (split, quantize the rest, put the kept
    elements back) bit for bit, laid out with ``strides``. None where x holds a NaN or an infinity."""
    x = x.detach()
    out = torch.empty_strided(x.shape, strides, dtype=torch.float32)
    ok = _views_3d(x, axis, [out], _extension().corrected_into, fmt.block_size, split, blocks,
                   *_element_args(fmt, rule))
    return out if ok else None


def stochastic(x: torch.Tensor, fmt: BlockFormat, axis: int, rule: str, generator: torch.Generator
               ) -> torch.Tensor | None:
    """``reference.fake_quantize_stochastic`` of a contiguous float32 x blocked along its last axis, for checked
    arguments, in one pass: the uniform draws taken from ``generator`` exactly as the reference takes them (one
    per element of its zero-padded blocks, in their order), the rounding fused, the result laid out as the
    reference's (its padded buffer, cropped). None, with the generator's state restored, where x holds a NaN or
    an infinity (the reference then runs and draws the same values)."""
    x = x.detach()
    k = x.shape[axis]
    nb = -(-k // fmt.block_size)
    state = generator.get_state()
    u = torch.rand((*x.shape[:axis], *x.shape[axis + 1:], nb, fmt.block_size), generator=generator,
                   dtype=torch.float32)
    out = torch.empty_strided(x.shape, moved_back_strides(tuple(x.shape), axis, fmt.block_size), dtype=torch.float32)
    if _views_3d(x, axis, [out], lambda x3, o3: _extension().stochastic_into(
            x3, u, o3, fmt.block_size, *_element_args(fmt, rule))):
        return out
    generator.set_state(state)
    return None


def split_max(x: torch.Tensor, axis: int, block_size: int, mask_strides: tuple, rest_strides: tuple
              ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(mask of each block's largest magnitude, the first of equal ones as torch's argmax picks it; x with it
    zeroed) for a float32 or bfloat16 x, blocks of ``block_size`` along ``axis``, in one pass
    (``corrections.outlier_fallback``, one element a block), laid out with the strides given. None where x
    holds a NaN or an infinity (the reference then runs)."""
    x = x.detach()
    mask = torch.empty_strided(x.shape, mask_strides, dtype=torch.bool)
    rest = torch.empty_strided(x.shape, rest_strides, dtype=x.dtype)
    return (mask, rest) if _views_3d(x, axis, [mask, rest], _extension().split_max_into, block_size) else None


def laid_out(t: torch.Tensor, strides: tuple) -> torch.Tensor:
    """``t``'s values in a tensor with ``strides`` (``t`` itself where it has them already)."""
    if t.stride() == tuple(strides):
        return t
    return torch.empty_strided(t.shape, strides, dtype=t.dtype).copy_(t)


def components(blocks: torch.Tensor, fmt: BlockFormat, rule: str, form: str, sums) -> dict | None:
    """The error components of float32 blocks [N, block size] (contiguous) in ``form``
    (``decompose._block_components``' names: ``quantized``, ``e_scale``, ``e_dead``, ``e_grid``), each
    contiguous [N, block size]; None where a block holds a non-finite element. The gain form's per-block
    sums are ``sums([kept_sq, cross])`` (the caller sums as the reference does)."""
    ext, args = _extension(), _element_args(fmt, rule)
    q, e_scale, e_dead, e_grid = (torch.empty_like(blocks) for _ in range(4))
    if form == "canonical":
        if not ext.canonical_components_into(blocks, q, e_scale, e_dead, e_grid, *args):
            return None
    else:
        kept_sq, cross = torch.empty_like(blocks), torch.empty_like(blocks)
        if not ext.gain_products_into(blocks, q, kept_sq, cross, *args):
            return None
        norm, dot = (s.reshape(-1).contiguous() for s in sums([kept_sq, cross]))
        ext.gain_components_into(blocks, q, norm, dot, e_scale, e_dead, e_grid)
    return {"quantized": q, "e_scale": e_scale, "e_dead": e_dead, "e_grid": e_grid}

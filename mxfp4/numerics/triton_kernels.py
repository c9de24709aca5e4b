"""Triton kernels for MXFP4 (E2M1 elements, E8M0 scales, blocks of 32): bit-exact with the reference.

- ``quantize``: float32/bfloat16/float16 to packed E2M1 codes + E8M0 scale bytes, blocks along any
  axis (the kernel reads the axis with its stride: the last axis for forward operands, the first
  for the transposed operands of the backward GEMMs), output in the reference's layout.
- ``dequantize``: the inverse, to any float dtype.
- ``fake_quantize``: both in one pass; optionally also the decomposition statistics (sums of
  squares of e_scale, e_dead, e_grid and of the total error, deadzone and saturation counts) in
  the same pass over memory. The deadzone test and the ideal-scale grid are done with exact
  float64 comparisons, so the counts equal the reference's exactly.
- ``mx_matmul``: C = A @ B^T on MXFP4 operands through ``tl.dot_scaled`` (B MXFP4; A MXFP4 or bf16).

Everything runs on CUDA, and on CPU under ``TRITON_INTERPRET=1`` (how CI checks bit-exactness).
The arithmetic restates the reference exactly: shared exponents from the float32 bits of the block
max, element rounding by comparison with the grid's midpoints (ties to the even code), powers of
two built from bits (2**-127 as a float32 subnormal).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .formats import FORMATS
from .reference import QuantizedTensor

MXFP4 = FORMATS["mxfp4"]
RULE_IDS = {"floor": 0, "ceil": 1, "even": 2, "rceil": 3}
N_STATS = 8  # scale, dead, grid, total energies; dead count, saturated count, (2 spare)


@triton.jit
def _pow2(e):
    """2**e as float32 for integer e in [-127, 127]."""
    bits = tl.where(e == -127, 0x00400000, (e + 127) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _to_float32(x, IS_BF16: tl.constexpr):
    """Widen to float32; bfloat16 arrives as int16 bits and is widened by a shift (exact for
    subnormals too, where the interpreter's own bfloat16 conversion is not)."""
    if IS_BF16:
        return (x.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)


@triton.jit
def _from_float32(v, out_ptr, IS_BF16: tl.constexpr):
    """Narrow to the output type; for bfloat16 (int16 bits) round to nearest even by hand."""
    if IS_BF16:
        bits = v.to(tl.int32, bitcast=True)
        rounded = bits + 0x7FFF + ((bits >> 16) & 1)
        rounded = tl.where(v != v, bits, rounded)
        return (rounded >> 16).to(tl.int16)
    return v.to(out_ptr.dtype.element_ty)


@triton.jit
def _shared_exponent(amax, RULE: tl.constexpr):
    """Unbiased E8M0 exponent of each block (E2M1: emax = 2, one mantissa bit)."""
    bits = amax.to(tl.int32, bitcast=True)
    if RULE == 0:  # floor
        e = ((bits >> 23) & 0xFF) - 129
    elif RULE == 1:  # ceil
        e = ((bits >> 23) & 0xFF) - 129 + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    elif RULE == 2:  # even: round amax half-up to one mantissa bit first
        e = (((bits + (1 << 21)) >> 23) & 0xFF) - 129
    else:  # rceil: ceil(log2(fp32(amax / 6)))
        rb = tl.math.div_rn(amax, tl.full(amax.shape, 6.0, tl.float32)).to(tl.int32, bitcast=True)
        ex = (rb >> 23) & 0xFF
        normal = ex - 127 + ((rb & 0x7FFFFF) != 0).to(tl.int32)
        e = tl.where(ex == 0, tl.where(rb > 0x00400000, -126, -127), normal)
    e = tl.where(amax > 0, e, -127)
    return tl.minimum(tl.maximum(e, -127), 127)


@triton.jit
def _e2m1_index(y):
    """Grid index 0..7 of |y| on {0, .5, 1, 1.5, 2, 3, 4, 6}: nearest, ties to the even index."""
    return (
        (y > 0.25).to(tl.int32)
        + (y >= 0.75).to(tl.int32)
        + (y > 1.25).to(tl.int32)
        + (y >= 1.75).to(tl.int32)
        + (y > 2.5).to(tl.int32)
        + (y >= 3.5).to(tl.int32)
        + (y > 5.0).to(tl.int32)
    )


@triton.jit
def _e2m1_value(idx):
    return tl.where(idx <= 4, 0.5 * idx.to(tl.float32), tl.where(idx == 7, 6.0, (idx - 2).to(tl.float32)))


@triton.jit
def _ideal_index(ax, amax):
    """Grid index of |x| / s* with s* = amax / 6, by exact float64 comparisons 6|x| vs m * amax;
    0 in an all-zero block (where s* = 0)."""
    a6 = ax.to(tl.float64) * 6.0
    m = amax.to(tl.float64)
    idx = (
        (a6 > 0.25 * m).to(tl.int32)
        + (a6 >= 0.75 * m).to(tl.int32)
        + (a6 > 1.25 * m).to(tl.int32)
        + (a6 >= 1.75 * m).to(tl.int32)
        + (a6 > 2.5 * m).to(tl.int32)
        + (a6 >= 3.5 * m).to(tl.int32)
        + (a6 > 5.0 * m).to(tl.int32)
    )
    return tl.where(m > 0, idx, 0)


@triton.jit
def _mx_quant_kernel(
    x_ptr,
    codes_ptr,
    scales_ptr,
    out_ptr,
    stats_ptr,
    R,
    K,
    n_blocks,
    stride_xr,
    stride_xk,
    stride_or,
    stride_ok,
    RULE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    WRITE_CODES: tl.constexpr,
    WRITE_FAKE: tl.constexpr,
    WITH_STATS: tl.constexpr,
    IN_BF16: tl.constexpr,
    OUT_BF16: tl.constexpr,
):
    NB: tl.constexpr = BLOCK_K // 32
    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    valid = (rows[:, None] < R) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None] * stride_xr + cols[None, :] * stride_xk, mask=valid, other=0)
    xb = tl.reshape(_to_float32(x, IN_BF16), (BLOCK_R, NB, 32))
    ax = tl.abs(xb)
    finite = ax < float("inf")  # False for NaN and infinities
    bad = tl.max((~finite).to(tl.int32), axis=2) > 0
    amax = tl.where(bad, 0.0, tl.max(tl.where(finite, ax, 0.0), axis=2))
    e = _shared_exponent(amax, RULE)
    scale = _pow2(e)[:, :, None]
    y = ax * _pow2(-e)[:, :, None]
    idx = tl.where(bad[:, :, None], 0, _e2m1_index(y))
    sign = (xb.to(tl.int32, bitcast=True) >> 31) & 1

    if WRITE_CODES:
        codes = tl.where(bad[:, :, None], 0, idx | (sign << 3))
        pairs = tl.reshape(codes, (BLOCK_R, BLOCK_K // 2, 2))
        lo, hi = tl.split(pairs)
        packed = (lo | (hi << 4)).to(tl.uint8)
        half = pid_k * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
        row_bytes = n_blocks * 16
        tl.store(
            codes_ptr + rows[:, None] * row_bytes + half[None, :],
            packed,
            mask=(rows[:, None] < R) & (half[None, :] < row_bytes),
        )
        blk = pid_k * NB + tl.arange(0, NB)
        scale_bytes = tl.where(bad, 255, e + 127).to(tl.uint8)
        tl.store(
            scales_ptr + rows[:, None] * n_blocks + blk[None, :],
            scale_bytes,
            mask=(rows[:, None] < R) & (blk[None, :] < n_blocks),
        )

    if WRITE_FAKE:
        q = _e2m1_value(idx)
        signed = (q.to(tl.int32, bitcast=True) | (sign << 31)).to(tl.float32, bitcast=True)
        fake = tl.where(bad[:, :, None], float("nan"), signed * scale)
        out = _from_float32(tl.reshape(fake, (BLOCK_R, BLOCK_K)), out_ptr, OUT_BF16)
        tl.store(out_ptr + rows[:, None] * stride_or + cols[None, :] * stride_ok, out, mask=valid)

        if WITH_STATS:
            vb = tl.reshape(valid, (BLOCK_R, NB, 32))
            istar = _ideal_index(ax, amax[:, :, None])
            dead = vb & (istar == 0)
            xd = xb.to(tl.float64)
            amax64 = amax.to(tl.float64)[:, :, None]
            x_grid = _e2m1_value(istar).to(tl.float64) * amax64 / 6.0
            x_grid = tl.where(xd < 0, -x_grid, x_grid)
            fake64 = tl.where(vb, fake.to(tl.float64), 0.0)
            e_dead = tl.where(dead, -xd, 0.0)
            e_grid = tl.where(vb & (istar != 0), x_grid - xd, 0.0)
            e_scale = tl.where(vb, fake64 - x_grid, 0.0)
            e_total = fake64 - xd
            base = stats_ptr + (pid_r * tl.num_programs(1) + pid_k) * 8
            tl.store(base + 0, tl.sum(tl.sum(tl.sum(e_scale * e_scale, axis=2), axis=1), axis=0))
            tl.store(base + 1, tl.sum(tl.sum(tl.sum(e_dead * e_dead, axis=2), axis=1), axis=0))
            tl.store(base + 2, tl.sum(tl.sum(tl.sum(e_grid * e_grid, axis=2), axis=1), axis=0))
            tl.store(base + 3, tl.sum(tl.sum(tl.sum(e_total * e_total, axis=2), axis=1), axis=0))
            tl.store(base + 4, tl.sum(tl.sum(tl.sum(dead.to(tl.float64), axis=2), axis=1), axis=0))
            sat = vb & (y > 6.0)
            tl.store(base + 5, tl.sum(tl.sum(tl.sum(sat.to(tl.float64), axis=2), axis=1), axis=0))


@triton.jit
def _mx_dequant_kernel(
    codes_ptr,
    scales_ptr,
    out_ptr,
    R,
    K,
    n_blocks,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    OUT_BF16: tl.constexpr,
):
    NB: tl.constexpr = BLOCK_K // 32
    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    half = pid_k * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    row_bytes = n_blocks * 16
    packed = tl.load(
        codes_ptr + rows[:, None] * row_bytes + half[None, :],
        mask=(rows[:, None] < R) & (half[None, :] < row_bytes),
        other=0,
    ).to(tl.int32)
    codes = tl.reshape(tl.join(packed & 0xF, packed >> 4), (BLOCK_R, NB, 32))
    blk = pid_k * NB + tl.arange(0, NB)
    sbytes = tl.load(
        scales_ptr + rows[:, None] * n_blocks + blk[None, :],
        mask=(rows[:, None] < R) & (blk[None, :] < n_blocks),
        other=127,
    ).to(tl.int32)
    scale = _pow2(tl.minimum(sbytes, 254) - 127)
    scale = tl.where(sbytes == 255, float("nan"), scale)[:, :, None]
    q = _e2m1_value(codes & 7)
    signed = (q.to(tl.int32, bitcast=True) | ((codes >> 3) << 31)).to(tl.float32, bitcast=True)
    out = _from_float32(tl.reshape(signed * scale, (BLOCK_R, BLOCK_K)), out_ptr, OUT_BF16)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(out_ptr + rows[:, None] * K + cols[None, :], out, mask=(rows[:, None] < R) & (cols[None, :] < K))


@triton.jit
def _mx_matmul_kernel(
    a_ptr,
    a_scale_ptr,
    b_ptr,
    b_scale_ptr,
    c_ptr,
    M,
    N,
    K_pad,
    stride_am,
    stride_cm,
    A_FORMAT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """C[M, N] = A[M, K] @ B[N, K]^T; B packed E2M1 [N, K/2] + scales [N, K/32]; A likewise or bf16."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    n_blocks = K_pad // 32
    for k0 in range(0, K_pad, BLOCK_K):
        kh = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        ks = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        b = tl.load(
            b_ptr + offs_n[None, :] * (K_pad // 2) + kh[:, None],
            mask=(offs_n[None, :] < N) & (kh[:, None] < K_pad // 2),
            other=0,
        )
        b_scale = tl.load(
            b_scale_ptr + offs_n[:, None] * n_blocks + ks[None, :],
            mask=(offs_n[:, None] < N) & (ks[None, :] < n_blocks),
            other=127,
        )
        if A_FORMAT == "e2m1":
            a = tl.load(
                a_ptr + offs_m[:, None] * stride_am + kh[None, :],
                mask=(offs_m[:, None] < M) & (kh[None, :] < K_pad // 2),
                other=0,
            )
            a_scale = tl.load(
                a_scale_ptr + offs_m[:, None] * n_blocks + ks[None, :],
                mask=(offs_m[:, None] < M) & (ks[None, :] < n_blocks),
                other=127,
            )
            acc = tl.dot_scaled(a, a_scale, "e2m1", b, b_scale, "e2m1", acc)
        else:
            kf = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(
                a_ptr + offs_m[:, None] * stride_am + kf[None, :],
                mask=(offs_m[:, None] < M) & (kf[None, :] < K_pad),
                other=0.0,
            )
            acc = tl.dot_scaled(a, None, "bf16", b, b_scale, "e2m1", acc)
    tl.store(
        c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :],
        acc,
        mask=(offs_m[:, None] < M) & (offs_n[None, :] < N),
    )


def _bits_if_bf16(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def _rows_view(x: torch.Tensor, axis: int) -> torch.Tensor:
    """A 2D [R, K] view (or copy) of ``x`` with the blocked axis as K, strides kept where possible."""
    moved = x.movedim(axis, -1)
    k = moved.shape[-1]
    try:
        return moved.view(-1, k)
    except RuntimeError:
        return moved.reshape(-1, k)


def _tiles(r: int, k: int) -> tuple[int, int]:
    """Tile sizes: large tiles (few programs) under the interpreter, moderate ones on the GPU."""
    if triton_interpreting():
        return min(64, triton.next_power_of_2(max(r, 1))), min(512, max(32, triton.next_power_of_2(k)))
    return 16, 256


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _launch_quant(x, axis, rule, write_codes, write_fake, with_stats, out_dtype=None):
    from .reference import check_input

    fmt, axis, rule = check_input(x, MXFP4, axis, rule)
    v = _rows_view(x, axis)
    r, k = v.shape
    n_blocks = -(-k // 32)
    block_r, block_k = _tiles(r, k)
    grid = (triton.cdiv(r, block_r), triton.cdiv(k, block_k))
    dev = x.device
    codes = torch.empty((r, n_blocks * 16), dtype=torch.uint8, device=dev) if write_codes else None
    scales = torch.empty((r, n_blocks), dtype=torch.uint8, device=dev) if write_codes else None
    out = torch.empty((r, k), dtype=out_dtype or x.dtype, device=dev) if write_fake else None
    stats = torch.zeros((grid[0] * grid[1], N_STATS), dtype=torch.float64, device=dev) if with_stats else None
    dummy = torch.empty(1, dtype=torch.uint8, device=dev)
    _mx_quant_kernel[grid](
        _bits_if_bf16(v),
        codes if codes is not None else dummy,
        scales if scales is not None else dummy,
        _bits_if_bf16(out) if out is not None else dummy,
        stats if stats is not None else dummy,
        r,
        k,
        n_blocks,
        v.stride(0),
        v.stride(1),
        k,
        1,
        RULE=RULE_IDS[rule],
        BLOCK_R=block_r,
        BLOCK_K=block_k,
        WRITE_CODES=write_codes,
        WRITE_FAKE=write_fake,
        WITH_STATS=with_stats,
        IN_BF16=v.dtype == torch.bfloat16,
        OUT_BF16=out is not None and out.dtype == torch.bfloat16,
    )
    return fmt, axis, rule, codes, scales, out, stats


def quantize(x: torch.Tensor, axis: int = -1, scale_rule: str | None = None) -> QuantizedTensor:
    fmt, axis, rule, codes, scales, _, _ = _launch_quant(x, axis, scale_rule, True, False, False)
    lead = x.movedim(axis, -1).shape[:-1]
    return QuantizedTensor(
        codes.reshape(*lead, -1), scales.reshape(*lead, -1), None, fmt, rule, x.shape, axis, x.dtype
    )


def _restore(out2d: torch.Tensor, shape: torch.Size, axis: int) -> torch.Tensor:
    moved_shape = list(shape)
    moved_shape.append(moved_shape.pop(axis))
    return out2d.reshape(moved_shape).movedim(-1, axis)


def fake_quantize(x: torch.Tensor, axis: int = -1, scale_rule: str | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    _, axis, _, _, _, out, _ = _launch_quant(x, axis, scale_rule, False, True, False, dtype)
    return _restore(out, x.shape, axis)


def fake_quantize_with_stats(x: torch.Tensor, axis: int = -1, scale_rule: str | None = None):
    """(fake-quantized x, stats dict) in one pass: energies of the three components and the total,
    deadzone and saturation counts and fractions."""
    _, axis, _, _, _, out, stats = _launch_quant(x, axis, scale_rule, False, True, True)
    sums = stats.sum(0).tolist()
    n = x.numel()
    energy = dict(zip(("energy_scale", "energy_dead", "energy_grid", "energy_total"), sums[:4]))
    return _restore(out, x.shape, axis), {
        **energy,
        "cross_term": energy["energy_total"] - energy["energy_scale"] - energy["energy_dead"] - energy["energy_grid"],
        "deadzone_count": int(sums[4]),
        "saturation_count": int(sums[5]),
        "deadzone_fraction": sums[4] / n,
        "saturation_fraction": sums[5] / n,
        "n": n,
    }


def dequantize(qt: QuantizedTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    if qt.fmt.name != "mxfp4":
        raise ValueError(f"the Triton dequantize kernel takes mxfp4 only, got {qt.fmt.name!r}")
    k = qt.shape[qt.axis]
    codes = qt.codes.reshape(-1, qt.codes.shape[-1]).contiguous()
    scales = qt.scales.reshape(-1, qt.scales.shape[-1]).contiguous()
    r, n_blocks = scales.shape
    out = torch.empty((r, k), dtype=dtype or qt.dtype, device=codes.device)
    block_r, block_k = _tiles(r, k)
    grid = (triton.cdiv(r, block_r), triton.cdiv(k, block_k))
    _mx_dequant_kernel[grid](
        codes, scales, _bits_if_bf16(out), r, k, n_blocks,
        BLOCK_R=block_r, BLOCK_K=block_k, OUT_BF16=out.dtype == torch.bfloat16,
    )
    return _restore(out, qt.shape, qt.axis)


def mx_matmul(a: QuantizedTensor | torch.Tensor, b: QuantizedTensor) -> torch.Tensor:
    """float32 C = A @ B^T with B an MXFP4 [N, K] (blocks along K) and A an MXFP4 [M, K] or a bf16 [M, K]."""
    if b.fmt.name != "mxfp4" or len(b.shape) != 2 or b.axis != 1:
        raise ValueError("mx_matmul needs b quantized as mxfp4 with shape [N, K] and blocks along K (axis 1)")
    n, k = b.shape
    k_pad = b.n_blocks * 32
    if isinstance(a, QuantizedTensor):
        if a.fmt.name != "mxfp4" or len(a.shape) != 2 or a.axis != 1 or a.shape[1] != k:
            raise ValueError(f"mx_matmul needs a quantized as mxfp4 [M, {k}] with blocks along K, got {tuple(a.shape)}")
        a_data, a_scales, a_format, stride_am = a.codes, a.scales, "e2m1", a.codes.stride(0)
        m = a.shape[0]
    else:
        if a.dim() != 2 or a.shape[1] != k:
            raise ValueError(f"mx_matmul needs a of shape [M, {k}], got {tuple(a.shape)}")
        a_data = torch.nn.functional.pad(a.to(torch.bfloat16), (0, k_pad - k)).contiguous()
        a_scales, a_format, stride_am, m = a_data, "bf16", a_data.stride(0), a.shape[0]
    c = torch.empty((m, n), dtype=torch.float32, device=b.codes.device)
    if triton_interpreting():
        bm, bn = max(16, min(64, triton.next_power_of_2(m))), max(16, min(64, triton.next_power_of_2(n)))
        bk = 128 if k_pad % 128 == 0 else 64 if k_pad % 64 == 0 else 32
    else:
        bm, bn, bk = 128, 128, 128
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    _mx_matmul_kernel[grid](
        a_data, a_scales, b.codes, b.scales, c, m, n, k_pad, stride_am, c.stride(0),
        A_FORMAT=a_format, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
    )
    return c

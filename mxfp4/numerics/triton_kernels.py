"""Triton kernels for MXFP4 (E2M1 elements, E8M0 scales, blocks of 32): bit-exact with the reference.

Quantize, dequantize, fake-quantize (one axis or both from one read) and fake-quantize with the
decomposition statistics, tiled by where the blocked axis lies in memory (row mode or column mode),
never through a transposed copy; autotuned on CUDA, large fixed tiles under the interpreter.

The method in full: docs/methods.md, ``mxfp4.numerics.triton_kernels``."""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass

import numpy
import torch
import triton
import triton.language as tl
from packaging.version import Version

from .formats import FORMATS
from .reference import QuantizedTensor, check_input

MXFP4 = FORMATS["mxfp4"]
RULE_IDS = {"floor": 0, "ceil": 1, "even": 2, "rceil": 3}
N_STATS = 8  # energies of e_scale, e_dead, e_grid, total; deadzone count, saturated count; 2 spare
STAT_NAMES = ("energy_scale", "energy_dead", "energy_grid", "energy_total", "deadzone_count", "saturation_count")


@triton.jit
def _pow2(e):
    """2**e as float32 for integer e in [-127, 127]."""
    bits = tl.where(e == -127, 0x00400000, (e + 127) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _widen(x, IS_BF16: tl.constexpr):
    """int32 bits of x as float32; bfloat16 arrives as int16 bits and widens by a shift (exact for
    subnormals too, where the interpreter's own bfloat16 conversion is not)."""
    if IS_BF16:
        return x.to(tl.int32) << 16
    return x.to(tl.float32).to(tl.int32, bitcast=True)


@triton.jit
def _narrow(bits, out_ptr, OUT_BF16: tl.constexpr):
    """float32 bits of values exact in the output type (MXFP4 values, infinities, NaN) to it: bfloat16
    by truncation, which equals round-to-nearest-even on such values."""
    if OUT_BF16:
        return (bits >> 16).to(tl.int16)
    return bits.to(tl.float32, bitcast=True).to(out_ptr.dtype.element_ty)


@triton.jit
def bf16_bits_rne(x):
    """int16 bits of float32 x rounded to bfloat16, nearest with ties to even, by integer arithmetic,
    for values that are not exact in bfloat16 (``_narrow`` is for those that are): the device's
    conversion rounds so, the interpreter's truncates, so CI checks this one. NaN stays NaN (the
    device's 0x7FFFFFFF would carry into the sign bit)."""
    bits = x.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return tl.where(x != x, 0x7FC0, rounded).to(tl.int16)


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
def _block_exponent(amax_bits, RULE: tl.constexpr):
    """(shared exponent, non-finite flag) of blocks from the max of their elements' |x| float32 bits:
    integer order is float order on non-negative floats, and infinities and NaN sort above every
    finite value, so one integer max finds both the block max and a non-finite element."""
    bad = amax_bits >= 0x7F800000
    amax = tl.where(bad, 0, amax_bits).to(tl.float32, bitcast=True)
    return _shared_exponent(amax, RULE), bad, amax


@triton.jit
def _grid_round(y):
    """(index 0..7, value) of finite y >= 0 rounded to the E2M1 grid {0, .5, 1, 1.5, 2, 3, 4, 6},
    nearest with ties to the even index, saturating at 6. One float add of a power of two whose ulp
    is the grid's spacing at y (0.5 below 2, 1 in [2, 4), 2 from 4) rounds y to nearest-even on
    that spacing; every midpoint of the grid is a tie there whose even neighbour is the even index.
    With FP fusion the compiler folds the scaling y = |x| * 2**-e into this add (one FFMA): that
    product is exact (or below the grid's first midpoint when it underflows), so both forms round alike."""
    ey = tl.maximum(y.to(tl.int32, bitcast=True) >> 23, 127)
    magic = (ey + 22) << 23
    r = y + magic.to(tl.float32, bitcast=True)
    idx = tl.minimum(r.to(tl.int32, bitcast=True) - magic + 2 * (ey - 127), 7)
    value = tl.minimum(r - magic.to(tl.float32, bitcast=True), 6.0)
    return idx, value


@triton.jit
def _code(w, idx, bad):
    """4-bit E2M1 codes from the float32 bits ``w`` (sign) and grid indices; 0 in non-finite blocks."""
    return tl.where(bad, 0, idx | ((w >> 28) & 8))


@triton.jit
def _fake_bits(w, value, scale, bad):
    """float32 bits of sign(x) * value * scale; NaN in non-finite blocks."""
    mag = (value * scale).to(tl.int32, bitcast=True)
    return tl.where(bad, 0x7FC00000, mag | (w & -2147483648))


@triton.jit
def _pow4_f64(e):
    """4**e = 2**(2e) as float64 for integer e in [-127, 127] (a normal float64)."""
    return ((2 * e.to(tl.int64) + 1023) << 52).to(tl.float64, bitcast=True)


@triton.jit
def _ideal_value(y, amax_s, EXACT_F64: tl.constexpr):
    """Grid value of |x| / s* (s* = amax / 6) in the block's scaled domain (y = |x| / 2**e, amax_s =
    amax / 2**e: exact scalings), nearest with ties to the even index as the reference rounds; 0
    where amax = 0.

    bfloat16 and float16 inputs: z = 6y / amax_s is either a grid midpoint exactly or at least 2**-13
    (relative) away from every midpoint (6y has at most 13 significant bits, a midpoint times amax_s
    at most 14), so z computed to within 2**-21 and snapped to 17 significant bits lands on the
    midpoint exactly in a tie and on z's own side of it otherwise: ``_grid_round`` of the snapped
    value is exact. float32 inputs (24-bit y): 6y against each midpoint times amax_s in float64."""
    if EXACT_F64:
        a6 = y.to(tl.float64) * 6.0
        m = amax_s.to(tl.float64)
        v = tl.where(a6 > 0.25 * m, 0.5, 0.0)
        v = tl.where(a6 >= 0.75 * m, 1.0, v)
        v = tl.where(a6 > 1.25 * m, 1.5, v)
        v = tl.where(a6 >= 1.75 * m, 2.0, v)
        v = tl.where(a6 > 2.5 * m, 3.0, v)
        v = tl.where(a6 >= 3.5 * m, 4.0, v)
        v = tl.where(a6 > 5.0 * m, 6.0, v)
    else:
        z = y * tl.where(amax_s > 0, 6.0 / amax_s, 0.0)
        snapped = ((z.to(tl.int32, bitcast=True) + 0x20) & -64).to(tl.float32, bitcast=True)
        _, v = _grid_round(snapped)
    return tl.where(amax_s > 0, v, 0.0)


@triton.jit
def _stat_terms(y, value, amax_s, valid, EXACT_F64: tl.constexpr):
    """Squared errors in the scaled domain (e_scale, e_dead, e_grid, total), float32, and the dead
    and saturated indicators, elementwise. Signs cancel in the squares: with q the rounded magnitude
    and g the ideal one, e_scale = q - g, e_total = q - y, and g - y is e_grid where the ideal
    rounding is nonzero and e_dead (= -y) where it is zero. Padding has y = 0: no error."""
    g = _ideal_value(y, amax_s, EXACT_F64) * (amax_s / 6.0)
    dead = g == 0.0
    d_scale = value - g
    d_total = value - y
    d_ideal = g - y
    sq_ideal = d_ideal * d_ideal
    return (d_scale * d_scale, tl.where(dead, sq_ideal, 0.0), tl.where(dead, 0.0, sq_ideal), d_total * d_total,
            dead & valid, y > 6.0)


@triton.jit
def _store_stats(base, p_scale, p_dead, p_grid, p_total, w, n_dead, n_sat):
    """One program's statistics, 8 float64 at ``base``: the energies from float32 partial sums
    within blocks (``p_*``), scaled back by their block's ``w`` = 4**e in float64 and summed; the
    counts summed as integers."""
    tl.store(base + 0, tl.sum(p_scale.to(tl.float64) * w))
    tl.store(base + 1, tl.sum(p_dead.to(tl.float64) * w))
    tl.store(base + 2, tl.sum(p_grid.to(tl.float64) * w))
    tl.store(base + 3, tl.sum(p_total.to(tl.float64) * w))
    tl.store(base + 4, tl.sum(n_dead.to(tl.int32)).to(tl.float64))
    tl.store(base + 5, tl.sum(n_sat.to(tl.int32)).to(tl.float64))


@triton.jit
def _quant_rows_kernel(
    x_ptr, codes_ptr, scales_ptr, out_ptr, stats_ptr,
    R, K, n_blocks, stride_xr, stride_or, R_BUCKET,
    RULE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    WRITE_CODES: tl.constexpr, WRITE_FAKE: tl.constexpr, WITH_STATS: tl.constexpr,
    IN_BF16: tl.constexpr, IN_FP32: tl.constexpr, OUT_BF16: tl.constexpr,
):
    """Blocks along the contiguous axis K of an [R, K] view (row stride ``stride_xr``)."""
    NB: tl.constexpr = BLOCK_K // 32
    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    valid = (rows[:, None] < R) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xr + cols[None, :], mask=valid, other=0)
    w = tl.reshape(_widen(x, IN_BF16), (BLOCK_R, NB, 32))
    absbits = w & 0x7FFFFFFF
    e, bad, amax = _block_exponent(tl.max(absbits, axis=2), RULE)
    y = absbits.to(tl.float32, bitcast=True) * _pow2(-e)[:, :, None]
    idx, value = _grid_round(y)

    if WRITE_CODES:
        lo, hi = tl.split(tl.reshape(_code(w, idx, bad[:, :, None]), (BLOCK_R, BLOCK_K // 2, 2)))
        half = pid_k * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
        row_bytes = n_blocks * 16
        tl.store(
            codes_ptr + rows[:, None].to(tl.int64) * row_bytes + half[None, :],
            (lo | (hi << 4)).to(tl.uint8),
            mask=(rows[:, None] < R) & (half[None, :] < row_bytes),
        )
        blk = pid_k * NB + tl.arange(0, NB)
        tl.store(
            scales_ptr + rows[:, None].to(tl.int64) * n_blocks + blk[None, :],
            tl.where(bad, 255, e + 127).to(tl.uint8),
            mask=(rows[:, None] < R) & (blk[None, :] < n_blocks),
        )
    if WRITE_FAKE:
        fake = _fake_bits(w, value, _pow2(e)[:, :, None], bad[:, :, None])
        out = _narrow(tl.reshape(fake, (BLOCK_R, BLOCK_K)), out_ptr, OUT_BF16)
        tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_or + cols[None, :], out, mask=valid)
    if WITH_STATS:
        amax_s = (amax * _pow2(-e))[:, :, None]
        vb = tl.reshape(valid, (BLOCK_R, NB, 32))
        t0, t1, t2, t3, dead, sat = _stat_terms(y, value, amax_s, vb, IN_FP32)
        # float32 partial sums over runs of 8 (a thread's 16-byte load of bfloat16), float64 beyond
        _store_stats(
            stats_ptr + (pid_r * tl.num_programs(1) + pid_k) * 8,
            tl.sum(tl.reshape(t0, (BLOCK_R, NB, 4, 8)), axis=3),
            tl.sum(tl.reshape(t1, (BLOCK_R, NB, 4, 8)), axis=3),
            tl.sum(tl.reshape(t2, (BLOCK_R, NB, 4, 8)), axis=3),
            tl.sum(tl.reshape(t3, (BLOCK_R, NB, 4, 8)), axis=3),
            _pow4_f64(e)[:, :, None],
            dead,
            sat,
        )


@triton.jit
def _quant_cols_kernel(
    x_ptr,
    codes_ptr,
    scales_ptr,
    out_ptr,
    stats_ptr,
    R,
    C,
    n_blocks,
    stride_xb,
    stride_xr,
    stride_ob,
    stride_or,
    R_BUCKET,
    RULE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    WRITE_CODES: tl.constexpr,
    WRITE_FAKE: tl.constexpr,
    WITH_STATS: tl.constexpr,
    IN_BF16: tl.constexpr,
    IN_FP32: tl.constexpr,
    OUT_BF16: tl.constexpr,
):
    """Blocks of 32 along R of a [B, R, C] tensor with C contiguous; tiles in the tensor's layout.
    Even and odd rows are loaded apart: the two nibbles of one code byte."""
    NB: tl.constexpr = BLOCK_R // 32
    HALF: tl.constexpr = BLOCK_R // 2
    pid_c = tl.program_id(0)
    pid_r = tl.program_id(1)
    pid_b = tl.program_id(2)
    pair = pid_r * HALF + tl.arange(0, HALF)  # index of the row pair (= the code byte along R)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    rows_e = 2 * pair
    rows_o = rows_e + 1
    c_ok = cols[None, :] < C
    ok_e = (rows_e[:, None] < R) & c_ok
    ok_o = (rows_o[:, None] < R) & c_ok
    base = x_ptr + pid_b.to(tl.int64) * stride_xb
    xe = tl.load(base + rows_e[:, None].to(tl.int64) * stride_xr + cols[None, :], mask=ok_e, other=0)
    xo = tl.load(base + rows_o[:, None].to(tl.int64) * stride_xr + cols[None, :], mask=ok_o, other=0)
    we = tl.reshape(_widen(xe, IN_BF16), (NB, 16, BLOCK_C))
    wo = tl.reshape(_widen(xo, IN_BF16), (NB, 16, BLOCK_C))
    ae = we & 0x7FFFFFFF
    ao = wo & 0x7FFFFFFF
    e, bad, amax = _block_exponent(tl.maximum(tl.max(ae, axis=1), tl.max(ao, axis=1)), RULE)  # [NB, BLOCK_C]
    inv = _pow2(-e)[:, None, :]
    bad3 = bad[:, None, :]
    y_e = ae.to(tl.float32, bitcast=True) * inv
    y_o = ao.to(tl.float32, bitcast=True) * inv
    idx_e, value_e = _grid_round(y_e)
    idx_o, value_o = _grid_round(y_o)

    if WRITE_CODES:
        packed = _code(we, idx_e, bad3) | (_code(wo, idx_o, bad3) << 4)
        packed = tl.trans(tl.reshape(packed, (HALF, BLOCK_C))).to(tl.uint8)  # [C, pairs]
        row_bytes = n_blocks * 16
        lead = pid_b.to(tl.int64) * C + cols  # row of the code matrix [B * C, row_bytes]
        tl.store(
            codes_ptr + lead[:, None] * row_bytes + pair[None, :],
            packed,
            mask=(cols[:, None] < C) & (pair[None, :] < row_bytes),
        )
        blk = pid_r * NB + tl.arange(0, NB)
        tl.store(
            scales_ptr + lead[:, None] * n_blocks + blk[None, :],
            tl.trans(tl.where(bad, 255, e + 127).to(tl.uint8)),
            mask=(cols[:, None] < C) & (blk[None, :] < n_blocks),
        )
    if WRITE_FAKE:
        scale = _pow2(e)[:, None, :]
        out_e = _narrow(tl.reshape(_fake_bits(we, value_e, scale, bad3), (HALF, BLOCK_C)), out_ptr, OUT_BF16)
        out_o = _narrow(tl.reshape(_fake_bits(wo, value_o, scale, bad3), (HALF, BLOCK_C)), out_ptr, OUT_BF16)
        obase = out_ptr + pid_b.to(tl.int64) * stride_ob
        tl.store(obase + rows_e[:, None].to(tl.int64) * stride_or + cols[None, :], out_e, mask=ok_e)
        tl.store(obase + rows_o[:, None].to(tl.int64) * stride_or + cols[None, :], out_o, mask=ok_o)
    if WITH_STATS:
        amax_s = (amax * _pow2(-e))[:, None, :]
        a0, a1, a2, a3, dead_e, sat_e = _stat_terms(y_e, value_e, amax_s, tl.reshape(ok_e, (NB, 16, BLOCK_C)), IN_FP32)
        b0, b1, b2, b3, dead_o, sat_o = _stat_terms(y_o, value_o, amax_s, tl.reshape(ok_o, (NB, 16, BLOCK_C)), IN_FP32)
        pid = (pid_b * tl.num_programs(1) + pid_r) * tl.num_programs(0) + pid_c
        _store_stats(
            stats_ptr + pid * 8,
            tl.sum(a0 + b0, axis=1),
            tl.sum(a1 + b1, axis=1),
            tl.sum(a2 + b2, axis=1),
            tl.sum(a3 + b3, axis=1),
            _pow4_f64(e),
            dead_e.to(tl.int32) + dead_o.to(tl.int32),
            sat_e.to(tl.int32) + sat_o.to(tl.int32),
        )


@triton.jit
def _fake_both_kernel(
    x_ptr,
    out_rows_ptr,
    out_cols_ptr,
    R,
    C,
    stride_xr,
    R_BUCKET,
    RULE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    IN_BF16: tl.constexpr,
    OUT_BF16: tl.constexpr,
):
    """One read of an [R, C] tile; fake-quantized with blocks along C (``out_rows``) and along R
    (``out_cols``), both in the input's layout."""
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    valid = (rows[:, None] < R) & (cols[None, :] < C)
    offs = rows[:, None].to(tl.int64) * stride_xr + cols[None, :]
    w = _widen(tl.load(x_ptr + offs, mask=valid, other=0), IN_BF16)
    absbits = w & 0x7FFFFFFF
    # blocks along C
    wr = tl.reshape(w, (BLOCK_R, BLOCK_C // 32, 32))
    ar = tl.reshape(absbits, (BLOCK_R, BLOCK_C // 32, 32))
    e, bad, _ = _block_exponent(tl.max(ar, axis=2), RULE)
    _, value = _grid_round(ar.to(tl.float32, bitcast=True) * _pow2(-e)[:, :, None])
    fake = tl.reshape(_fake_bits(wr, value, _pow2(e)[:, :, None], bad[:, :, None]), (BLOCK_R, BLOCK_C))
    tl.store(out_rows_ptr + offs, _narrow(fake, out_rows_ptr, OUT_BF16), mask=valid)
    # blocks along R
    wc = tl.reshape(w, (BLOCK_R // 32, 32, BLOCK_C))
    ac = tl.reshape(absbits, (BLOCK_R // 32, 32, BLOCK_C))
    e, bad, _ = _block_exponent(tl.max(ac, axis=1), RULE)
    _, value = _grid_round(ac.to(tl.float32, bitcast=True) * _pow2(-e)[:, None, :])
    fake = tl.reshape(_fake_bits(wc, value, _pow2(e)[:, None, :], bad[:, None, :]), (BLOCK_R, BLOCK_C))
    tl.store(out_cols_ptr + offs, _narrow(fake, out_cols_ptr, OUT_BF16), mask=valid)


@triton.jit
def _decode_bits(codes, sbytes):
    """float32 bits of E2M1 codes (int32, one each) times E8M0 scales from their bytes (255: NaN).
    Codes 2..7 are the normal floats with exponent (code >> 1) - 1 and mantissa bit code & 1, whose
    float32 bits are (code << 22) + bits(0.5); codes 1 and 0 are 0.5 and 0."""
    mag = codes & 7
    q = tl.where(mag >= 2, (mag << 22) + 0x3F000000, mag * 0x3F000000).to(tl.float32, bitcast=True)
    scale = tl.where(sbytes == 255, float("nan"), _pow2(tl.minimum(sbytes, 254) - 127))
    return (q * scale).to(tl.int32, bitcast=True) | ((codes & 8) << 28)


@triton.jit
def decode_e2m1(codes, sbytes):
    """float32 values of E2M1 codes (int32, one each) times E8M0 scales from their bytes."""
    return _decode_bits(codes, sbytes).to(tl.float32, bitcast=True)


@triton.jit
def _dequant_rows_kernel(
    codes_ptr,
    scales_ptr,
    out_ptr,
    R,
    K,
    n_blocks,
    R_BUCKET,
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
        codes_ptr + rows[:, None].to(tl.int64) * row_bytes + half[None, :],
        mask=(rows[:, None] < R) & (half[None, :] < row_bytes),
        other=0,
    ).to(tl.int32)
    codes = tl.reshape(tl.join(packed & 0xF, packed >> 4), (BLOCK_R, NB, 32))
    blk = pid_k * NB + tl.arange(0, NB)
    sbytes = tl.load(
        scales_ptr + rows[:, None].to(tl.int64) * n_blocks + blk[None, :],
        mask=(rows[:, None] < R) & (blk[None, :] < n_blocks),
        other=127,
    ).to(tl.int32)
    values = _decode_bits(codes, sbytes[:, :, None])
    out = _narrow(tl.reshape(values, (BLOCK_R, BLOCK_K)), out_ptr, OUT_BF16)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(
        out_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], out, mask=(rows[:, None] < R) & (cols[None, :] < K)
    )


@triton.jit
def _dequant_cols_kernel(
    codes_ptr,
    scales_ptr,
    out_ptr,
    R,
    C,
    n_blocks,
    R_BUCKET,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    OUT_BF16: tl.constexpr,
):
    """Codes [B * C, n_blocks * 16] (blocked axis last) -> values [B, R, C] in the original layout."""
    NB: tl.constexpr = BLOCK_R // 32
    HALF: tl.constexpr = BLOCK_R // 2
    pid_c = tl.program_id(0)
    pid_r = tl.program_id(1)
    pid_b = tl.program_id(2)
    pair = pid_r * HALF + tl.arange(0, HALF)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    row_bytes = n_blocks * 16
    lead = pid_b.to(tl.int64) * C + cols
    packed = tl.load(
        codes_ptr + lead[:, None] * row_bytes + pair[None, :],
        mask=(cols[:, None] < C) & (pair[None, :] < row_bytes),
        other=0,
    ).to(tl.int32)
    packed = tl.trans(packed)  # [pairs, C]
    blk = pid_r * NB + tl.arange(0, NB)
    sbytes = tl.trans(
        tl.load(
            scales_ptr + lead[:, None] * n_blocks + blk[None, :],
            mask=(cols[:, None] < C) & (blk[None, :] < n_blocks),
            other=127,
        ).to(tl.int32)
    )[:, None, :]  # [NB, 1, C]
    even = _decode_bits(tl.reshape(packed & 0xF, (NB, 16, BLOCK_C)), sbytes)
    odd = _decode_bits(tl.reshape(packed >> 4, (NB, 16, BLOCK_C)), sbytes)
    rows_e = 2 * pair
    rows_o = rows_e + 1
    obase = out_ptr + pid_b.to(tl.int64) * R * C
    tl.store(
        obase + rows_e[:, None].to(tl.int64) * C + cols[None, :],
        _narrow(tl.reshape(even, (HALF, BLOCK_C)), out_ptr, OUT_BF16),
        mask=(rows_e[:, None] < R) & (cols[None, :] < C),
    )
    tl.store(
        obase + rows_o[:, None].to(tl.int64) * C + cols[None, :],
        _narrow(tl.reshape(odd, (HALF, BLOCK_C)), out_ptr, OUT_BF16),
        mask=(rows_o[:, None] < R) & (cols[None, :] < C),
    )


# ---------------------------------------------------------------------------- the corrections, fused
# Outlier fallback (each 32-block's largest magnitude kept in bfloat16) and macro-block scaling (one BF16 scale
# per group of 32-blocks, the group's largest block's candidate against plain MXFP4) in one kernel: the values
# and layout of the quantizer's torch composition of the two, as fused_cpu.corrected computes them on CPU.
# The choice between a group's two candidates compares error energies summed in float64 element by element in
# the group's order (MacroBlockScaling._best), so the kernel sums them in a loop over the group's columns, each
# thread one row's sequential sum; every other step is elementwise or a maximum, which no order changes. A
# squared error is exact in float64 (at most 26 significant bits a difference): a fused multiply-add sums as a
# multiply and an add do. A group with a non-finite element raises a flag the host reads: the torch path runs.

MAX_GROUP_BLOCKS = 8  # blocks of one macro-block group on this kernel (a power of two: a tile's extent)


@triton.jit
def _macro_candidate(gmax):
    """The BF16 value >= the significand of max(gmax / 6, 2**-126): ``macro_block``'s candidate scale."""
    ratio = tl.math.div_rn(gmax, tl.full(gmax.shape, 6.0, tl.float32))
    ratio = tl.maximum(ratio, 1.1754943508222875e-38)
    mant = ((ratio.to(tl.int32, bitcast=True) & 0x007FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)
    b = bf16_bits_rne(mant).to(tl.int32)  # in [0x3F80, 0x4000]: positive as int16
    down = (b << 16).to(tl.float32, bitcast=True)
    up = ((b + 1) << 16).to(tl.float32, bitcast=True)
    return tl.where(down >= mant, down, up)


@triton.jit
def _fallback_rows_kernel(
    x_ptr, out_ptr, flag_ptr, R, K, stride_xr, stride_or, R_BUCKET,
    RULE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, IN_BF16: tl.constexpr, OUT_BF16: tl.constexpr,
):
    """Outlier fallback along the contiguous axis K of an [R, K] view, a tile of ``BLOCK_R`` rows and ``BLOCK_K``
    columns a program: each block's first largest magnitude kept (rounded to bfloat16), the rest quantized."""
    NB: tl.constexpr = BLOCK_K // 32
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    valid = (rows[:, None] < R) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xr + cols[None, :], mask=valid, other=0)
    w = tl.reshape(_widen(x, IN_BF16), (BLOCK_R, NB, 32))  # float32 bits
    absbits = w & 0x7FFFFFFF
    bmax = tl.max(absbits, axis=2)
    tl.atomic_max(flag_ptr, tl.max(tl.max((bmax >= 0x7F800000).to(tl.int32), axis=1), axis=0))
    lane = tl.arange(0, 32)[None, None, :]
    is_top = lane == tl.min(tl.where(absbits == bmax[:, :, None], lane, 32), axis=2)[:, :, None]
    rest = tl.where(is_top, 0, absbits)
    e, _, _ = _block_exponent(tl.max(rest, axis=2), RULE)
    _, value = _grid_round(rest.to(tl.float32, bitcast=True) * _pow2(-e)[:, :, None])
    out = (value * _pow2(e)[:, :, None]).to(tl.int32, bitcast=True) | (w & -2147483648)
    out = tl.where(is_top, bf16_bits_rne(w.to(tl.float32, bitcast=True)).to(tl.int32) << 16, out)
    out = tl.reshape(out, (BLOCK_R, BLOCK_K))
    tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_or + cols[None, :],
             (out >> 16).to(tl.int16) if OUT_BF16 else out.to(tl.float32, bitcast=True), mask=valid)


@triton.jit
def _pick(tile, idx, b):
    """Column ``b`` of a [rows, NB] tile: a masked sum (one term, the rest zeros: exact)."""
    return tl.sum(tl.where(idx == b, tile, tl.zeros_like(tile)), axis=1)


@triton.jit
def _macro_groups_kernel(
    x_ptr, out_ptr, flag_ptr, R, K, stride_xr, stride_or, R_BUCKET,
    RULE: tl.constexpr, SPLIT: tl.constexpr, NB: tl.constexpr, BLOCK_R: tl.constexpr,
):
    """Macro-block scaling (after the split where ``SPLIT``) of a float32 [R, K] view, groups of NB 32-blocks along
    the contiguous axis K: one group column a program, ``BLOCK_R`` rows, a row a thread. The group is visited a
    [BLOCK_R, 32] block at a time, four times: the tops and the rest's maxima, the macro-scaled maxima, the two
    float64 error energies column by column in the group's order (each thread one row's sequential sums), the
    stores. Only a group's per-block exponents stay between the visits."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    x_row = x_ptr + rows.to(tl.int64) * stride_xr
    base = tl.program_id(1) * (NB * 32)
    lane = tl.arange(0, 32)[None, :]
    blk = tl.arange(0, NB)[None, :]
    tops = tl.zeros([BLOCK_R, NB], dtype=tl.int32)
    rest_max = tl.zeros([BLOCK_R, NB], dtype=tl.int32)
    bad = tl.zeros([BLOCK_R], dtype=tl.int32)
    for b in range(NB):  # the tops (the first of equal magnitudes) and the rest's maxima
        cols = base + b * 32 + lane
        a = tl.load(x_row[:, None] + cols, mask=rmask[:, None] & (cols < K), other=0.0).to(tl.int32, bitcast=True)
        a = a & 0x7FFFFFFF
        bmax = tl.max(a, axis=1)
        bad = tl.maximum(bad, (bmax >= 0x7F800000).to(tl.int32))
        if SPLIT:
            top = tl.min(tl.where(a == bmax[:, None], lane, 32), axis=1)
            tops = tl.where(blk == b, top[:, None], tops)
            a = tl.where(lane == top[:, None], 0, a)
        rest_max = tl.where(blk == b, tl.max(a, axis=1)[:, None], rest_max)
    tl.atomic_max(flag_ptr, tl.max(bad, axis=0))
    e_p, _, _ = _block_exponent(rest_max, RULE)
    m = _macro_candidate(tl.max(rest_max, axis=1).to(tl.float32, bitcast=True))
    y_max = tl.zeros([BLOCK_R, NB], dtype=tl.int32)
    for b in range(NB):  # the maxima of x / m
        cols = base + b * 32 + lane
        a = tl.load(x_row[:, None] + cols, mask=rmask[:, None] & (cols < K), other=0.0).to(tl.int32, bitcast=True)
        a = a & 0x7FFFFFFF
        if SPLIT:
            a = tl.where(lane == _pick(tops, blk, b)[:, None], 0, a)
        y = tl.math.div_rn(a.to(tl.float32, bitcast=True), tl.broadcast_to(m[:, None], (BLOCK_R, 32)))
        y_max = tl.where(blk == b, tl.max(y.to(tl.int32, bitcast=True), axis=1)[:, None], y_max)
    e_m, _, _ = _block_exponent(y_max, RULE)
    eff = _pow2(e_m) * m[:, None]  # [BLOCK_R, NB]: the block's scale times the group's
    acc_p = tl.zeros([BLOCK_R], dtype=tl.float64)
    acc_m = tl.zeros([BLOCK_R], dtype=tl.float64)
    for b in range(NB):  # the energies, column by column (signs cancel in the squares: magnitudes)
        up_b, down_b = _pow2(_pick(e_p, blk, b)), _pow2(-_pick(e_p, blk, b))
        down_m, eff_b = _pow2(-_pick(e_m, blk, b)), _pick(eff, blk, b)
        if SPLIT:
            top_b = _pick(tops, blk, b)
        for j in range(32):
            col = rows * 0 + (base + b * 32 + j)  # a vector: the interpreter masks with vectors
            aj = tl.load(x_row + col, mask=rmask & (col < K), other=0.0).to(tl.int32, bitcast=True) & 0x7FFFFFFF
            if SPLIT:
                aj = tl.where(top_b == j, 0, aj)
            af = aj.to(tl.float32, bitcast=True)
            a64 = af.to(tl.float64)
            dp = (_grid_round(af * down_b)[1] * up_b).to(tl.float64) - a64
            dm = (_grid_round(tl.math.div_rn(af, m) * down_m)[1] * eff_b).to(tl.float64) - a64
            acc_p += dp * dp
            acc_m += dm * dm
    use = (acc_m < acc_p)[:, None]  # plain wins ties
    o_row = out_ptr + rows.to(tl.int64) * stride_or
    for b in range(NB):  # the values: the group's pick, the tops in bfloat16
        cols = base + b * 32 + lane
        valid = rmask[:, None] & (cols < K)
        w = tl.load(x_row[:, None] + cols, mask=valid, other=0.0).to(tl.int32, bitcast=True)
        a = w & 0x7FFFFFFF
        if SPLIT:
            is_top = lane == _pick(tops, blk, b)[:, None]
            a = tl.where(is_top, 0, a)
        af = a.to(tl.float32, bitcast=True)
        ep_b = _pick(e_p, blk, b)[:, None]
        plain = _grid_round(af * _pow2(-ep_b))[1] * _pow2(ep_b)
        macro = _grid_round(tl.math.div_rn(af, tl.broadcast_to(m[:, None], (BLOCK_R, 32)))
                            * _pow2(-_pick(e_m, blk, b))[:, None])[1] * _pick(eff, blk, b)[:, None]
        out = tl.where(use, macro, plain).to(tl.int32, bitcast=True) | (w & -2147483648)
        if SPLIT:
            out = tl.where(is_top, bf16_bits_rne(w.to(tl.float32, bitcast=True)).to(tl.int32) << 16, out)
        tl.store(o_row[:, None] + cols, out.to(tl.float32, bitcast=True), mask=valid)


# ---------------------------------------------------------------------------- launch (host side)


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def autotuning() -> bool:
    """On CUDA the tiles are autotuned unless ``MXFP4_AUTOTUNE=0`` (then each space's first config:
    kernel checks and CI-like runs that compile many variants once each)."""
    return os.environ.get("MXFP4_AUTOTUNE", "1") != "0"


def _major_minor(version: str) -> tuple[int, ...]:
    """(major, minor) of a release, pre-releases and local tags included: 2.4.0rc1 and 2.11.0+cu130 are 2.4, 2.11."""
    return Version(version).release[:2]


def known_interpreter_fault(error: str, triton_version: str, numpy_version: str) -> str | None:
    """What went wrong, and the remedy, when a kernel launch under Triton's interpreter failed with
    ``error`` (its text and its cause's) for a fault of older interpreters; None for any other error. Both were seen
    with the GPU machines' triton 3.6.0 on CPU; compiled CUDA kernels have neither.

    - Before triton 3.7 the interpreter passes a scalar argument as a one-element array and takes its
      ``__index__`` as ``int(array)``, which numpy 2.4 made a TypeError (triton-lang/triton#9171, fixed
      by #9172): kernels whose loop bound is a runtime argument (the W4A16 and MXFP4 GEMMs) stop there.
    - Before triton 3.8 the interpreter has no ``tl.dot_scaled`` (``mx_matmul``): it fails on the
      format string, or with a constexpr format on the missing ``create_dot_scaled``."""
    where = "For CPU runs (TRITON_INTERPRET=1) install"
    int_of_array_fails = _major_minor(triton_version) < (3, 7) and _major_minor(numpy_version) >= (2, 4)
    if "0-dimensional arrays" in error and int_of_array_fails:
        return (
            f"Triton's interpreter in triton {triton_version} cannot run this kernel with numpy {numpy_version}: it "
            "converts scalar kernel arguments with int() on a one-element array, which numpy 2.4 made a TypeError "
            f"(triton-lang/triton#9171, fixed in triton 3.7). {where} triton>=3.8 (or numpy<2.4 for the kernels "
            "without tl.dot_scaled); compiled CUDA kernels are not affected"
        )
    no_dot_scaled = "create_dot_scaled" in error or "'str' object has no attribute 'value'" in error
    if no_dot_scaled and _major_minor(triton_version) < (3, 8):
        return (
            f"Triton's interpreter in triton {triton_version} has no tl.dot_scaled (added in triton 3.8), which this "
            f"kernel (mx_matmul) uses. {where} triton>=3.8; compiled CUDA kernels are not affected"
        )
    return None


_AUTOTUNED = [0.0, 0]  # host seconds of the launches that tuned a new key, and how many keys, in this process


def autotune_spent() -> tuple[float, int]:
    """(seconds, keys) that autotuning has taken in this process so far: the host time of every launch that
    tuned a key its autotuner had not seen (compiling and benchmarking the space's configs, or reading them
    from Triton's disk cache under TRITON_CACHE_AUTOTUNING=1), and how many. Such a launch synchronizes, so
    its time also holds the wait for GPU work queued before it (at most the pass in flight). Subtract
    differences of it from a step's time to get the step's own (``mxfp4.rl.grpo.StepLogger``)."""
    return _AUTOTUNED[0], _AUTOTUNED[1]


@dataclass
class Forced:
    """A config forced on an autotune space, and how many launches have run it."""

    config: triton.Config
    launches: int = 0


_FORCED: dict[int, Forced] = {}  # id(autotuner) -> the config its launches run


@contextlib.contextmanager
def forced_config(tuned, config: triton.Config):
    """Within the block, every launch of the autotune space ``tuned`` runs ``config`` (its tiles; on CUDA
    also its warps and stages) instead of the autotuner's choice, the space's first config or the
    interpreter's tiles; yields the ``Forced`` record that counts those launches. How
    ``kernel_checks.check_every_config`` checks each config the autotuner may pick, bit for bit."""
    if config not in tuned.configs:
        raise ValueError(f"{config} is not a config of this autotune space (its configs: {tuned.configs})")
    forced = _FORCED[id(tuned)] = Forced(config)
    try:
        yield forced
    finally:
        del _FORCED[id(tuned)]


def launch_tuned(kernel, tuned, grid_of, interp_meta: dict, args: tuple, **constexprs):
    """Launch ``tuned`` (an autotuner over ``kernel``) on CUDA, its first config when autotuning is
    off, or ``kernel`` with ``interp_meta`` under the interpreter; a config forced on the space
    (``forced_config``) in every mode."""
    forced = _FORCED.get(id(tuned))
    if forced:
        forced.launches += 1
    if triton_interpreting():
        meta = forced.config.kwargs if forced else interp_meta
        try:
            kernel[grid_of(meta)](*args, **meta, **constexprs)
        except Exception as err:  # a known fault of older interpreters: cause and remedy named
            text = " ".join(str(e) for e in (err, err.__cause__) if e is not None)
            known = known_interpreter_fault(text, triton.__version__, numpy.__version__)
            if known:
                raise RuntimeError(known) from err
            raise
    elif autotuning() and not forced:
        keys, t0 = len(tuned.cache), time.perf_counter()
        tuned[grid_of](*args, **constexprs)
        if len(tuned.cache) > keys:  # this launch tuned a new key: timed apart from the work it launched
            _AUTOTUNED[0] += time.perf_counter() - t0
            _AUTOTUNED[1] += 1
    else:
        cfg = forced.config if forced else tuned.configs[0]
        kernel[grid_of(cfg.kwargs)](
            *args, **cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **constexprs
        )


def _configs(tiles, names):
    return [triton.Config(dict(zip(names, t[:2])), num_warps=t[2]) for t in tiles]


# Autotune spaces (tile extents, warps), first config = the pinned default; kernels/bench/inspect_sass.py reports
# each config compiled for sm_90a (column mode: 32-row tiles keep a block in one thread, so the block max
# needs no shuffles), the autotuner measures them on CUDA.
ROW_TILES = [
    (16, 512, 4),
    (8, 512, 4),
    (16, 256, 4),
    (32, 256, 4),
    (32, 256, 8),
    (16, 1024, 8),
    (32, 512, 8),
    (64, 256, 8),
]
COL_TILES = [
    (32, 256, 4),
    (32, 128, 2),
    (32, 64, 2),
    (32, 128, 4),
    (32, 256, 8),
    (64, 128, 8),
    (64, 64, 4),
    (128, 64, 8),
]
BOTH_TILES = [(32, 128, 4), (32, 64, 2), (32, 256, 4), (32, 256, 8), (64, 64, 4)]
_VARIANT = ["RULE", "WRITE_CODES", "WRITE_FAKE", "WITH_STATS", "IN_BF16", "IN_FP32", "OUT_BF16"]

# The stats partials are one row per program, in a buffer sized for the config with the most programs:
# zeroed after the autotuner's benchmark runs (reset_to_zero), or a call that tunes sums their rows too.
_quant_rows_tuned = triton.autotune(
    _configs(ROW_TILES, ("BLOCK_R", "BLOCK_K")), key=["K", "R_BUCKET", *_VARIANT], reset_to_zero=["stats_ptr"]
)(_quant_rows_kernel)
_quant_cols_tuned = triton.autotune(
    _configs(COL_TILES, ("BLOCK_R", "BLOCK_C")), key=["C", "R_BUCKET", *_VARIANT], reset_to_zero=["stats_ptr"]
)(_quant_cols_kernel)
_fake_both_tuned = triton.autotune(
    _configs(BOTH_TILES, ("BLOCK_R", "BLOCK_C")), key=["C", "R_BUCKET", "RULE", "IN_BF16", "OUT_BF16"]
)(_fake_both_kernel)
_dequant_rows_tuned = triton.autotune(_configs(ROW_TILES, ("BLOCK_R", "BLOCK_K")), key=["K", "R_BUCKET", "OUT_BF16"])(
    _dequant_rows_kernel
)
_dequant_cols_tuned = triton.autotune(_configs(COL_TILES, ("BLOCK_R", "BLOCK_C")), key=["C", "R_BUCKET", "OUT_BF16"])(
    _dequant_cols_kernel
)


def _bucket(n: int) -> int:
    """Autotune key for an extent that varies from call to call (tokens): its power-of-two ceiling.
    Column mode buckets B * R (the tokens of an axis-0 operand), so training does not retune per step."""
    return min(triton.next_power_of_2(max(n, 1)), 1 << 16)


def _bits_if_bf16(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def _rows_tiling(r: int, k: int):
    """(grid, interpreter tiles) of row mode over an [r, k] view."""

    def grid(m):
        return (triton.cdiv(r, m["BLOCK_R"]), triton.cdiv(k, m["BLOCK_K"]))

    return grid, {
        "BLOCK_R": min(64, triton.next_power_of_2(r)),
        "BLOCK_K": min(512, max(32, triton.next_power_of_2(k))),
    }


def _cols_tiling(b: int, r: int, c: int, min_c: int = 16):
    """(grid, interpreter tiles) of column mode over a [b, r, c] view (blocks along r)."""

    def grid(m):
        return (triton.cdiv(c, m["BLOCK_C"]), triton.cdiv(r, m["BLOCK_R"]), b)

    return grid, {
        "BLOCK_R": min(64, max(32, triton.next_power_of_2(r))),
        "BLOCK_C": min(256, max(min_c, triton.next_power_of_2(c))),
    }


def _stats_buffer(grid, interp: dict, tuned, dev) -> torch.Tensor:
    """Zeroed per-program partials, sized for the most programs that the interpreter's tiles or any
    config of the space launch."""
    n_programs = max(math.prod(grid(m)) for m in (interp, *(cfg.kwargs for cfg in tuned.configs)))
    return torch.zeros((n_programs, N_STATS), dtype=torch.float64, device=dev)


class _Geometry:
    """Where the blocked axis of ``x`` lies in memory. A 2D tensor stored transposed is read through
    its transpose (no copy); otherwise a non-contiguous tensor is made contiguous once.

    - rows mode: ``src`` viewed [R, K] with K the blocked, contiguous axis;
    - cols mode: ``src`` viewed [B, R, C] with R the blocked axis and C contiguous.
    """

    def __init__(self, x: torch.Tensor, axis: int):
        self.shape, self.axis = x.shape, axis
        self.flip = x.dim() == 2 and not x.is_contiguous() and x.t().is_contiguous()
        src, ax = (x.t(), 1 - axis) if self.flip else (x, axis)
        if ax == src.dim() - 1 and src.stride(-1) == 1 and src.dim() == 2:
            self.src = src
        else:
            self.src = src.contiguous()
        shape = self.src.shape
        self.b, self.r, self.c = math.prod(shape[:ax]), shape[ax], math.prod(shape[ax + 1 :])
        self.rows_mode = self.c == 1
        if self.rows_mode:  # blocked axis contiguous: rows are everything before it
            self.view = self.src if self.src.dim() == 2 and ax == 1 else self.src.reshape(-1, shape[ax])
        else:
            self.view = self.src.view(self.b, self.r, self.c)
        self.lead = x.movedim(axis, -1).shape[:-1]
        self.n_blocks = -(-shape[ax] // 32)

    def restore(self, out: torch.Tensor) -> torch.Tensor:
        """An output written in ``src``'s layout, back to ``x``'s shape (a transposed view if flipped)."""
        out = out.reshape(self.src.shape)
        return out.t() if self.flip else out


def _quant(x, axis, rule, write_codes, write_fake, with_stats, out_dtype=None):
    fmt, axis, rule = check_input(x, MXFP4, axis, rule)
    g = _Geometry(x, axis)
    dev = x.device
    rows = g.b * g.c if not g.rows_mode else g.view.shape[0]
    codes = torch.empty((rows, g.n_blocks * 16), dtype=torch.uint8, device=dev) if write_codes else None
    scales = torch.empty((rows, g.n_blocks), dtype=torch.uint8, device=dev) if write_codes else None
    out = torch.empty(g.view.shape, dtype=out_dtype or x.dtype, device=dev) if write_fake else None
    dummy = torch.empty(1, dtype=torch.uint8, device=dev)
    flags = dict(
        RULE=RULE_IDS[rule],
        WRITE_CODES=write_codes,
        WRITE_FAKE=write_fake,
        WITH_STATS=with_stats,
        IN_BF16=x.dtype == torch.bfloat16,
        IN_FP32=x.dtype == torch.float32,
        OUT_BF16=out is not None and out.dtype == torch.bfloat16,
    )
    v = _bits_if_bf16(g.view)
    if g.rows_mode:
        r, k = v.shape
        kernel, tuned, (grid, interp) = _quant_rows_kernel, _quant_rows_tuned, _rows_tiling(r, k)
        sizes = (r, k, g.n_blocks, v.stride(0), k, _bucket(r))
    else:
        b, r, c = g.b, g.r, g.c
        kernel, tuned, (grid, interp) = _quant_cols_kernel, _quant_cols_tuned, _cols_tiling(b, r, c)
        sizes = (r, c, g.n_blocks, r * c, c, r * c, c, _bucket(b * r))
    stats = _stats_buffer(grid, interp, tuned, dev) if with_stats else None
    args = (
        v,
        codes if write_codes else dummy,
        scales if write_codes else dummy,
        _bits_if_bf16(out) if write_fake else dummy,
        stats if with_stats else dummy,
        *sizes,
    )
    launch_tuned(kernel, tuned, grid, interp, args, **flags)
    return fmt, g, rule, codes, scales, out, stats


def quantize(x: torch.Tensor, axis: int = -1, scale_rule: str | None = None) -> QuantizedTensor:
    fmt, g, rule, codes, scales, _, _ = _quant(x, axis, scale_rule, True, False, False)
    return QuantizedTensor(
        codes.reshape(*g.lead, -1), scales.reshape(*g.lead, -1), None, fmt, rule, x.shape, g.axis, x.dtype
    )


def fake_quantize(
    x: torch.Tensor, axis: int = -1, scale_rule: str | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """dequantize(quantize(x)) in one pass, in x's shape and layout."""
    _, g, _, _, _, out, _ = _quant(x, axis, scale_rule, False, True, False, dtype)
    return g.restore(out)


def fake_quantize_with_stats(x: torch.Tensor, axis: int = -1, scale_rule: str | None = None):
    """(fake-quantized x, stats) in one pass; stats are float64 device tensors (0-dim): the
    energies of the three components and of the total error, the cross term, deadzone and
    saturation counts and fractions, and ``n``. Nothing waits for the device."""
    _, g, _, _, _, out, partials = _quant(x, axis, scale_rule, False, True, True)
    sums = partials.sum(0)
    n = x.numel()
    stats = dict(zip(STAT_NAMES, sums.unbind()))
    stats["cross_term"] = stats["energy_total"] - stats["energy_scale"] - stats["energy_dead"] - stats["energy_grid"]
    stats["deadzone_fraction"] = stats["deadzone_count"] / n
    stats["saturation_fraction"] = stats["saturation_count"] / n
    stats["n"] = n
    return g.restore(out), stats


def fake_quantize_both(x: torch.Tensor, scale_rule: str | None = None, dtype: torch.dtype | None = None):
    """A 2D tensor fake-quantized with blocks along axis 1 and along axis 0, from one read:
    (fake along -1, fake along 0), both in x's layout (contiguous)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"fake_quantize_both takes a 2D tensor, got {getattr(x, 'shape', type(x).__name__)}")
    _, _, rule = check_input(x, MXFP4, 0, scale_rule)
    x = x.contiguous()
    r, c = x.shape
    along_rows = torch.empty_like(x, dtype=dtype or x.dtype)
    along_cols = torch.empty_like(along_rows)
    grid, interp = _cols_tiling(1, r, c, min_c=32)  # blocks along both axes: 32 columns at least
    args = (_bits_if_bf16(x), _bits_if_bf16(along_rows), _bits_if_bf16(along_cols), r, c, c, _bucket(r))
    flags = dict(RULE=RULE_IDS[rule], IN_BF16=x.dtype == torch.bfloat16, OUT_BF16=along_rows.dtype == torch.bfloat16)
    launch_tuned(_fake_both_kernel, _fake_both_tuned, grid, interp, args, **flags)
    return along_rows, along_cols


def dequantize(qt: QuantizedTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Values in the original tensor's shape and (contiguous) layout."""
    if qt.fmt.name != "mxfp4":
        raise ValueError(f"the Triton dequantize kernel takes mxfp4 only, got {qt.fmt.name!r}")
    shape, axis = qt.shape, qt.axis
    codes = qt.codes.reshape(-1, qt.codes.shape[-1]).contiguous()
    scales = qt.scales.reshape(-1, qt.scales.shape[-1]).contiguous()
    n_blocks = scales.shape[1]
    out = torch.empty(shape, dtype=dtype or qt.dtype, device=codes.device)
    o = _bits_if_bf16(out)
    b, r, c = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])
    flags = dict(OUT_BF16=out.dtype == torch.bfloat16)
    if c == 1:  # blocked axis last: b rows of r
        grid, interp = _rows_tiling(b, r)
        launch_tuned(
            _dequant_rows_kernel,
            _dequant_rows_tuned,
            grid,
            interp,
            (codes, scales, o, b, r, n_blocks, _bucket(b)),
            **flags,
        )
    else:
        grid, interp = _cols_tiling(b, r, c)
        launch_tuned(
            _dequant_cols_kernel,
            _dequant_cols_tuned,
            grid,
            interp,
            (codes, scales, o, r, c, n_blocks, _bucket(b * r)),
            **flags,
        )
    return out


# Fallback: (rows, columns, warps) of a tile; macro-block groups: (rows, warps), a row a thread. The first of
# each space is its pinned default.
FALLBACK_TILES = [(16, 512, 4), (8, 512, 4), (32, 256, 4), (16, 1024, 8)]
MACRO_TILES = [(128, 4), (64, 2), (256, 8), (32, 1)]
_fallback_tuned = triton.autotune(
    _configs(FALLBACK_TILES, ("BLOCK_R", "BLOCK_K")), key=["K", "R_BUCKET", "RULE", "IN_BF16", "OUT_BF16"],
    reset_to_zero=["flag_ptr"],
)(_fallback_rows_kernel)
_macro_tuned = triton.autotune(
    [triton.Config({"BLOCK_R": rows}, num_warps=warps) for rows, warps in MACRO_TILES],
    key=["K", "R_BUCKET", "RULE", "SPLIT", "NB"], reset_to_zero=["flag_ptr"],
)(_macro_groups_kernel)


def corrected_applies(x: torch.Tensor, split: bool, blocks: int) -> bool:
    """Whether this kernel computes the corrections for ``x``: float32 (or bfloat16 without macro-block
    groups, whose values need float32), groups of a power of two of at most ``MAX_GROUP_BLOCKS`` blocks."""
    if x.dtype not in (torch.float32, torch.bfloat16) or (blocks and x.dtype != torch.float32):
        return False
    groups = blocks or 1
    return (split or blocks > 0) and groups <= MAX_GROUP_BLOCKS and groups & (groups - 1) == 0


def output_strides(x: torch.Tensor, axis: int) -> tuple:
    """The strides of the plain Triton fake-quantization's result for an x of these shape and strides (the
    layout ``triton_kernels.fake_quantize`` writes: x's, or a transposed view for a 2D x stored transposed)."""
    meta = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    g = _Geometry(meta, axis % x.dim())
    return g.restore(torch.empty(g.view.shape, dtype=x.dtype, device="meta")).stride()


def corrected(x: torch.Tensor, axis: int, rule: str, split: bool, blocks: int, strides: tuple) -> torch.Tensor | None:
    """Outlier fallback (``split``) and/or macro-block scaling over ``blocks`` blocks of an MXFP4 x (float32,
    or bfloat16 with no macro-block groups) in one kernel, laid out with ``strides`` (the torch composition's);
    None where ``corrected_applies`` says no or an element is not finite (the torch composition then runs: one
    read of a device flag)."""
    if not corrected_applies(x, split, blocks) or not x.numel():
        return None
    ax = axis % x.dim()
    moved = x.movedim(ax, -1)
    k = moved.shape[-1]
    src = moved.reshape(-1, k)  # a view where the strides allow one
    if src.stride(-1) != 1 or (src.shape[0] > 1 and src.stride(0) < k):
        src = src.contiguous()
    r = src.shape[0]
    buf = torch.empty((r, k), dtype=x.dtype, device=x.device)
    flag = torch.zeros(1, dtype=torch.int32, device=x.device)
    if blocks:
        def grid(meta):
            return (triton.cdiv(r, meta["BLOCK_R"]), triton.cdiv(k, blocks * 32))

        args = (src, buf, flag, r, k, src.stride(0), k, _bucket(r))
        interp = {"BLOCK_R": min(256, triton.next_power_of_2(r))}  # few programs: the column loop runs in Python
        launch_tuned(_macro_groups_kernel, _macro_tuned, grid, interp, args, RULE=RULE_IDS[rule], SPLIT=bool(split),
                     NB=blocks)
    else:
        grid, interp = _rows_tiling(r, k)
        args = (_bits_if_bf16(src), _bits_if_bf16(buf), flag, r, k, src.stride(0), k, _bucket(r))
        launch_tuned(_fallback_rows_kernel, _fallback_tuned, grid, interp, args, RULE=RULE_IDS[rule],
                     IN_BF16=x.dtype == torch.bfloat16, OUT_BF16=x.dtype == torch.bfloat16)
    if int(flag.item()):
        return None
    values = buf.view(moved.shape).movedim(-1, ax)
    if values.stride() == tuple(strides):
        return values
    out = torch.empty_strided(x.shape, strides, dtype=x.dtype, device=x.device)
    return out.copy_(values)

"""Triton GEMMs with MXFP4 weights.

The method in full: docs/methods.md, ``mxfp4.numerics.triton_gemm``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .reference import QuantizedTensor
from .reference import dequantize as reference_dequantize
from .triton_kernels import bf16_bits_rne, decode_e2m1, launch_tuned, triton_interpreting

K_ALIGN = 256  # packed K is padded to this (a multiple of the 128-element chunk)
CHUNK = 128  # K elements per chunk of the packed layout: 64 bytes of codes and one 32-bit word of scales per row
FAST_SCALES = (0, 128)  # scale bytes for which the bfloat16 upcast (code bits times 2**(s - 1)) is exact


@dataclass
class PackedWeight:
    """An MXFP4 weight [N, K] in the W4A16 kernel's layout (see the module docstring)."""

    codes: torch.Tensor  # uint8 [N, K_pad / 2]
    scales: torch.Tensor  # int32 [K_pad / 128, N]: the four scale bytes of a row's chunk, block 4c + b in byte b
    n: int
    k: int
    fast_upcast: bool
    source: QuantizedTensor

    @property
    def k_pad(self) -> int:
        return self.codes.shape[1] * 2


def pack_weight(qt: QuantizedTensor) -> PackedWeight:
    """Repack a quantized weight (``mxfp4.quantize(w, axis=-1)`` of an [N, K] weight)."""
    if qt.fmt.name != "mxfp4" or len(qt.shape) != 2 or qt.axis != 1:
        raise ValueError("pack_weight takes an mxfp4 weight [N, K] quantized with blocks along K (axis=-1)")
    n, k = qt.shape
    k_pad = -(-k // K_ALIGN) * K_ALIGN
    codes = qt.codes
    lo, hi = codes & 0xF, codes >> 4
    elems = torch.stack((lo, hi), dim=-1).reshape(n, -1)  # one code per element, [N, K_blocks]
    elems = torch.nn.functional.pad(elems, (0, k_pad - elems.shape[1]))
    chunks = elems.reshape(n, k_pad // CHUNK, 2, CHUNK // 2)
    packed = (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(n, k_pad // 2).contiguous()
    scales = torch.nn.functional.pad(qt.scales, (0, k_pad // 32 - qt.scales.shape[1]), value=127)
    lo_ok, hi_ok = FAST_SCALES
    fast = bool(((scales >= lo_ok) & (scales <= hi_ok)).all())
    words = scales.reshape(n, k_pad // CHUNK, 4).to(torch.int32)
    words = words[..., 0] | (words[..., 1] << 8) | (words[..., 2] << 16) | (words[..., 3] << 24)
    return PackedWeight(packed, words.t().contiguous(), n, k, fast, qt)


@triton.jit
def _bytes_of(words, lane0, lane1):
    """The two chosen bytes of each 32-bit word, each in its own 16-bit lane (int32)."""
    return ((words >> (8 * lane0)) & 0xFF) | (((words >> (8 * lane1)) & 0xFF) << 16)


@triton.jit
def _lanes(pairs, INTERPRET: tl.constexpr):
    """The two 16-bit lanes of int32 words as bfloat16 (float32 under the interpreter, whose bfloat16
    conversions are wrong on subnormals): (low lanes, high lanes)."""
    if INTERPRET:
        return (pairs << 16).to(tl.float32, bitcast=True), (pairs & -65536).to(tl.float32, bitcast=True)
    lo = (pairs & 0xFFFF).to(tl.int16).to(tl.bfloat16, bitcast=True)
    hi = (pairs >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return lo, hi


@triton.jit
def _in_element_order(b0, b1, b2, b3):
    """[rows, 64] from four [rows, 16] tensors, ``bj`` holding element 4i + j of word i (joins stack
    on a new last axis, so the inner join pairs b0 with b2: the flattening reads b0 b1 b2 b3)."""
    return tl.reshape(tl.join(tl.join(b0, b2), tl.join(b1, b3)), (b0.shape[0], 64))


@triton.jit
def _upcast(codes4, factor, FAST: tl.constexpr, INTERPRET: tl.constexpr):
    """bfloat16 [BLOCK_N, 64] values of the 4-bit codes held one a byte, four a word, in ``codes4``
    (int32 [BLOCK_N, 16]: element 4i + b in byte b of word i) times 2**(s - 127), s the block's scale.

    FAST (every scale byte in 0..128): two codes at a time, one in each 16-bit lane of a word, become
    bfloat16 bits with one multiply and one mask, c * 0x1040 & 0x81C0 (the sign to bit 15, exponent
    and mantissa bits to bits 8..6; the lanes cannot carry into each other): bfloat16 numbers of value
    code * 2**-126 (subnormal for the codes 0 and 0.5), and one multiply by 2**(s - 1) gives the value
    exactly (a 2-bit significand times a power of two, inside bfloat16's range for these s).
    ``factor`` [BLOCK_N, 64] is then the bfloat16 bits of 2**(s - 1). Otherwise ``factor`` is the
    scale byte and each value is decoded exactly in float32. Under the interpreter the values stay
    float32 (the same numbers: every one is exact in bfloat16)."""
    if FAST:
        e0, e1 = _lanes((_bytes_of(codes4, 0, 1) * 0x1040) & -2118090304, INTERPRET)  # 0x81C081C0
        e2, e3 = _lanes((_bytes_of(codes4, 2, 3) * 0x1040) & -2118090304, INTERPRET)
        f, _ = _lanes(factor, INTERPRET)
        return _in_element_order(e0, e1, e2, e3) * f
    codes = _in_element_order(codes4 & 0xFF, (codes4 >> 8) & 0xFF, (codes4 >> 16) & 0xFF, (codes4 >> 24) & 0xFF)
    values = decode_e2m1(codes, factor)
    return values if INTERPRET else values.to(tl.bfloat16)


@triton.jit
def _grouped_tile(pid, major_tiles, minor_tiles, GROUP: tl.constexpr):
    """(major, minor) tile of program ``pid`` in grouped order: GROUP major tiles stay hot in L2
    while the minor index sweeps."""
    group = GROUP * minor_tiles
    first = (pid // group) * GROUP
    size = tl.minimum(major_tiles - first, GROUP)
    return first + (pid % group) % size, (pid % group) // size


@triton.jit
def _block_factors(s0, s1, FAST: tl.constexpr):
    """The [BLOCK_N, 64] scale operand of two consecutive blocks from their scale bytes (int32
    [BLOCK_N] each), broadcast over each block's 32 elements: the bfloat16 bits of 2**(s - 1)
    (FAST) or the bytes."""
    s = tl.join(s0, s1)
    if FAST:
        s = (s + 126) << 7
    return tl.reshape(tl.broadcast_to(s[:, :, None], (s.shape[0], 2, 32)), (s.shape[0], 64))


@triton.jit
def _w4a16_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    y_ptr,
    M,
    N,
    K,
    K_pad,
    stride_xm,
    stride_ym,
    M_BUCKET,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    CHUNKS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    GROUP_N: tl.constexpr,
    FAST: tl.constexpr,
    OUT_BF16: tl.constexpr,
    INTERPRET: tl.constexpr = False,
):
    """y[M, N] = x[M, K] @ W[N, K]^T, computed as acc[BLOCK_N, BLOCK_M] = W x^T, 128 K-elements a
    chunk: 64 code bytes read as 16 words (``w_ptr`` is the codes viewed as int32) and one 32-bit
    scale word per row."""
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_n, pid_m = _grouped_tile(pid, tl.cdiv(N, BLOCK_N), tl.cdiv(M, BLOCK_M), GROUP_N)  # weight tiles stay hot
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_ok = offs_n < N
    m_ok = offs_m < M
    j = tl.arange(0, 64)
    q = tl.arange(0, 16)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for c0 in range(pid_k * CHUNKS, K_pad // 128, SPLIT_K * CHUNKS):
        for u in tl.static_range(CHUNKS):
            c = c0 + u
            codes4 = tl.load(
                w_ptr + offs_n[:, None].to(tl.int64) * (K_pad // 8) + c * 16 + q[None, :], mask=n_ok[:, None], other=0
            )
            words = tl.load(s_ptr + c * N + offs_n, mask=n_ok, other=0x7F7F7F7F)
            f_lo = _block_factors(words & 0xFF, (words >> 8) & 0xFF, FAST)  # blocks 4c, 4c + 1: elements j
            f_hi = _block_factors((words >> 16) & 0xFF, (words >> 24) & 0xFF, FAST)  # 4c + 2, 4c + 3: 64 + j
            w_lo = _upcast(codes4 & 0x0F0F0F0F, f_lo, FAST, INTERPRET)
            w_hi = _upcast((codes4 >> 4) & 0x0F0F0F0F, f_hi, FAST, INTERPRET)
            k_lo = c * 128 + j
            k_hi = k_lo + 64
            x_lo = tl.load(
                x_ptr + offs_m[None, :].to(tl.int64) * stride_xm + k_lo[:, None],
                mask=m_ok[None, :] & (k_lo[:, None] < K),
                other=0.0,
            )
            x_hi = tl.load(
                x_ptr + offs_m[None, :].to(tl.int64) * stride_xm + k_hi[:, None],
                mask=m_ok[None, :] & (k_hi[:, None] < K),
                other=0.0,
            )
            if INTERPRET:  # the interpreter's bfloat16 tl.dot is wrong; float32 operands give the same exact products
                acc = tl.dot(w_lo, x_lo.to(tl.float32), acc, input_precision="ieee")
                acc = tl.dot(w_hi, x_hi.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(w_lo, x_lo, acc)
                acc = tl.dot(w_hi, x_hi, acc)
    y_offs = y_ptr + offs_m[None, :].to(tl.int64) * stride_ym + offs_n[:, None]
    mask = n_ok[:, None] & m_ok[None, :]
    if SPLIT_K == 1:
        if OUT_BF16:  # y_ptr: the bfloat16 output viewed as int16
            tl.store(y_offs, bf16_bits_rne(acc), mask=mask)
        else:
            tl.store(y_offs, acc, mask=mask)
    else:
        tl.atomic_add(y_offs, acc, mask=mask, sem="relaxed")


def _w4a16_configs(tiles):
    return [
        triton.Config(
            {"BLOCK_N": bn, "BLOCK_M": bm, "CHUNKS": ch, "SPLIT_K": sk, "GROUP_N": 8}, num_warps=w, num_stages=s
        )
        for bn, bm, ch, sk, w, s in tiles
    ]


# Autotune spaces of the decode path: (BLOCK_N, CHUNKS of 128 along K, SPLIT_K, warps, stages); BLOCK_M
# is set from M. Enough weight tiles fill the device without splitting K: each program streams whole
# rows and stores its tile in the output dtype (no zeroed buffer, no atomics, no conversion after).
# Fewer tiles split K over programs that add float32 partials into a zeroed output. BLOCK_N = 64 and 128
# tiles take wgmma; 32 takes mma.sync at about twice the loop instructions per weight element
# (kernels/bench/inspect_sass.py), kept for the smallest N only.
DIRECT_TILES = [(64, 1, 1, 4, 4), (64, 2, 1, 4, 3), (128, 1, 1, 8, 3), (128, 2, 1, 8, 3), (32, 1, 1, 4, 4)]
SPLIT_TILES = [
    (64, 1, 4, 4, 4),
    (64, 1, 2, 4, 4),
    (64, 1, 8, 4, 3),
    (128, 1, 4, 8, 3),
    (64, 2, 4, 4, 3),
    (32, 1, 8, 4, 4),
]
DIRECT_MIN_TILES = 96  # BLOCK_N = 64 tiles at which the direct space is used (about 3/4 of an H100's 132 SMs)
DECODE_MAX_M = 64


def _decode_space(tiles, bm):
    return triton.autotune(
        _w4a16_configs([(bn, bm, ch, sk, w, s) for bn, ch, sk, w, s in tiles]),
        key=["N", "K", "M_BUCKET", "FAST", "OUT_BF16"],
        reset_to_zero=["y_ptr"],
    )(_w4a16_kernel)


_w4a16_direct = {bm: _decode_space(DIRECT_TILES, bm) for bm in (16, 32, 64)}
_w4a16_split = {bm: _decode_space(SPLIT_TILES, bm) for bm in (16, 32, 64)}


def dequantize_packed(w: PackedWeight, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The [N, K] weight values of a packed weight, from its reference-layout source (the Triton
    dequantize kernel on CUDA, the reference elsewhere)."""
    from .triton_kernels import dequantize

    return dequantize(w.source, dtype) if w.source.codes.is_cuda else reference_dequantize(w.source, dtype)


def w4a16_matmul(
    x: torch.Tensor, w: PackedWeight, out_dtype: torch.dtype | None = None, fused: bool | None = None
) -> torch.Tensor:
    """x[..., K] (bfloat16) @ W^T -> [..., N] in ``out_dtype`` (default x's dtype).

    The fused upcast kernel is the decode path (M <= DECODE_MAX_M, where reading the 4-bit weight
    once is the whole cost); above it the weight is dequantized and multiplied by the BLAS (the
    upcast then costs once per weight, not once per M tile), in float32 when ``out_dtype`` is
    float32 and in bfloat16 otherwise. ``fused=None`` picks by M; ``fused=True`` with M > 64 is
    refused: at BLOCK_M = 128 the kernel was exact under the interpreter but not on an H100 with
    Triton 3.6 (results/bench/bench_h100.json notes), so no caller reaches it there."""
    if not isinstance(w, PackedWeight):
        raise ValueError(f"w4a16_matmul takes a PackedWeight (from pack_weight), got {type(w).__name__}")
    if x.shape[-1] != w.k:
        raise ValueError(f"w4a16_matmul: x has K = {x.shape[-1]}, the weight has K = {w.k}")
    out_dtype = out_dtype or x.dtype
    lead = x.shape[:-1]
    m = x.numel() // w.k
    if fused is None:
        fused = m <= DECODE_MAX_M
    elif fused and m > DECODE_MAX_M:
        raise ValueError(
            f"the fused W4A16 kernel is the decode path: M <= {DECODE_MAX_M}, got M = {m}; pass fused=None"
        )
    if not fused:
        dtype = torch.float32 if out_dtype == torch.float32 else torch.bfloat16
        return torch.nn.functional.linear(x.to(dtype), dequantize_packed(w, dtype)).to(out_dtype)
    x2 = x.reshape(-1, w.k).to(torch.bfloat16)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    bm = max(16, triton.next_power_of_2(m))
    direct = triton.cdiv(w.n, 64) * triton.cdiv(m, bm) >= DIRECT_MIN_TILES
    if direct:
        y = torch.empty((m, w.n), dtype=out_dtype if out_dtype == torch.bfloat16 else torch.float32, device=x.device)
    else:
        y = torch.zeros((m, w.n), dtype=torch.float32, device=x.device)  # split K adds into it
    y_arg = y.view(torch.int16) if y.dtype == torch.bfloat16 else y
    args = (
        x2,
        w.codes.view(torch.int32),
        w.scales,
        y_arg,
        m,
        w.n,
        w.k,
        w.k_pad,
        x2.stride(0),
        y.stride(0),
        triton.next_power_of_2(m),
    )
    flags = dict(FAST=w.fast_upcast, OUT_BF16=y.dtype == torch.bfloat16)

    def grid(meta):
        return (triton.cdiv(w.n, meta["BLOCK_N"]) * triton.cdiv(m, meta["BLOCK_M"]), meta["SPLIT_K"])

    interp = dict(
        BLOCK_N=min(64, max(16, triton.next_power_of_2(w.n))),
        BLOCK_M=bm,
        CHUNKS=1,
        SPLIT_K=1 if direct else 2,
        GROUP_N=8,
    )
    space = (_w4a16_direct if direct else _w4a16_split)[bm]
    launch_tuned(_w4a16_kernel, space, grid, interp, args, **flags, INTERPRET=triton_interpreting())
    return y.to(out_dtype).reshape(*lead, w.n)


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
    GROUP_M: tl.constexpr,
):
    """C[M, N] = A[M, K] @ B[N, K]^T; B packed E2M1 [N, K/2] + scales [N, K/32]; A likewise or bf16."""
    pid = tl.program_id(0)
    pid_m, pid_n = _grouped_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
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
        c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N)
    )


MX_MATMUL_TILES = [
    (128, 128, 128, 4, 3),
    (128, 128, 128, 8, 3),
    (128, 256, 128, 8, 3),
    (64, 128, 128, 4, 4),
    (128, 64, 256, 4, 3),
]
_mx_matmul_tuned = triton.autotune(
    [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=w, num_stages=s)
        for bm, bn, bk, w, s in MX_MATMUL_TILES
    ],
    key=["M", "N", "K_pad", "A_FORMAT"],
)(_mx_matmul_kernel)


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
    args = (a_data, a_scales, b.codes, b.scales, c, m, n, k_pad, stride_am, c.stride(0))

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    interp = dict(
        BLOCK_M=max(16, min(64, triton.next_power_of_2(m))),
        BLOCK_N=max(16, min(64, triton.next_power_of_2(n))),
        BLOCK_K=128 if k_pad % 128 == 0 else 64 if k_pad % 64 == 0 else 32,
        GROUP_M=8,
    )
    launch_tuned(_mx_matmul_kernel, _mx_matmul_tuned, grid, interp, args, A_FORMAT=a_format)
    return c


def autotune_spaces() -> dict[str, triton.runtime.Autotuner]:
    """Every autotune space of the package's kernels, by name: the one list that the device's every-config
    check (``kernel_checks.check_every_config``) and the compile and SASS reports (``kernels/bench/inspect_sass.py``)
    walk. Here because this module sees both kernel modules."""
    from . import triton_kernels as tk

    return {
        "quantize rows": tk._quant_rows_tuned,
        "quantize columns": tk._quant_cols_tuned,
        "fake-quant both axes": tk._fake_both_tuned,
        "dequantize rows": tk._dequant_rows_tuned,
        "dequantize columns": tk._dequant_cols_tuned,
        "outlier fallback": tk._fallback_tuned,
        "macro-block groups": tk._macro_tuned,
        "tl.dot_scaled GEMM": _mx_matmul_tuned,
        **{w4a16_space_name(False, bm): t for bm, t in _w4a16_split.items()},
        **{w4a16_space_name(True, bm): t for bm, t in _w4a16_direct.items()},
    }


def w4a16_space_name(direct: bool, block_m: int) -> str:
    """The name in ``autotune_spaces`` of the W4A16 decode space of one path (whole-K or split-K) and BLOCK_M."""
    return f"W4A16 decode {'whole-K' if direct else 'split-K'}, BLOCK_M {block_m}"

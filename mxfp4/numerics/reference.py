"""Reference quantizer (pure PyTorch): quantize, dequantize, fake-quantize for every block format.

This is the oracle that the Triton kernels are checked against bit for bit, and the CPU path.

Layout of a ``QuantizedTensor`` (the layout torchao uses and ``tl.dot_scaled`` takes):
the blocked axis is moved last and padded with zeros to whole blocks; ``codes`` holds the element
codes along it (four-bit formats packed two per byte, first element in the low nibble; six- and
eight-bit formats one code per byte); ``scales`` holds one raw scale byte per block (E8M0, or E4M3
bits for NVFP4, whose FP32 tensor scale is ``tensor_scale``). Padding is zero, never changes a
block's amax, and is cropped on the way back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .formats import (
    E4M3,
    E8M0_BIAS,
    E8M0_NAN,
    SUPPORTED_DTYPES,
    BlockFormat,
    decode_elements,
    e8m0_decode,
    e8m0_exponent,
    encode_elements,
    get_format,
    round_to_grid,
)

NVFP4_SCALE_MIN = 2.0**-6  # smallest normal E4M3, torchao's clamp for NVFP4 block scales


@dataclass
class QuantizedTensor:
    """What ``quantize`` returns: packed element codes and scale bytes, with what ``dequantize`` needs.

    Attributes:
        codes: the element codes (FP4: two a byte, the low nibble first).
        scales: the block scales (E8M0 bytes, or E4M3 for NVFP4).
        tensor_scale: NVFP4's per-tensor FP32 scale (None otherwise).
        fmt: the ``BlockFormat``.
        scale_rule: the scale rule used.
        shape: the input's shape.
        axis: the axis the blocks ran along.
        dtype: the input's dtype (what ``dequantize`` returns by default).
    """

    codes: torch.Tensor
    scales: torch.Tensor
    tensor_scale: torch.Tensor | None
    fmt: BlockFormat
    scale_rule: str
    shape: torch.Size
    axis: int
    dtype: torch.dtype

    @property
    def n_blocks(self) -> int:
        return self.scales.shape[-1]

    def element_codes(self) -> torch.Tensor:
        """Unpacked codes, one per element, shaped [..., n_blocks, block_size]."""
        codes = unpack_fp4(self.codes) if self.fmt.packed else self.codes
        want = self.scales.numel() * self.fmt.block_size
        if codes.numel() != want:
            per_byte = 2 if self.fmt.packed else 1
            raise ValueError(f"QuantizedTensor holds {self.codes.numel()} code bytes for {self.scales.numel()} blocks "
                             f"of {self.fmt.block_size} ({want // per_byte} bytes expected): its codes are truncated "
                             "or belong to another tensor")
        return codes.reshape(*self.scales.shape, self.fmt.block_size)

    def scale_values(self) -> torch.Tensor:
        """Effective float32 scale per block (the tensor scale included)."""
        return decode_scales(self.scales, self.fmt, self.tensor_scale)

    def to(self, device) -> QuantizedTensor:
        """The same quantized tensor with its storage on ``device``."""
        ts = None if self.tensor_scale is None else self.tensor_scale.to(device)
        return dataclasses.replace(self, codes=self.codes.to(device), scales=self.scales.to(device), tensor_scale=ts)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Two four-bit codes per byte along the last axis, first element in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_fp4 needs an even last dimension, got shape {tuple(codes.shape)}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    low, high = packed & 0x0F, packed >> 4
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def check_input(x: torch.Tensor, fmt: str | BlockFormat, axis: int, scale_rule: str | None, also=()):
    """Validate the arguments every entry point shares (``also``: dtypes accepted beside ``SUPPORTED_DTYPES``);
    returns (format, axis >= 0, rule)."""
    fmt = get_format(fmt)
    rule = fmt.check_scale_rule(scale_rule)
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES + tuple(also):
        names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES + tuple(also))
        raise ValueError(f"unsupported dtype {x.dtype}; accepted: {names}")
    if x.dim() == 0:
        raise ValueError("expected a tensor with at least one dimension, got a scalar")
    if x.numel() == 0:
        raise ValueError(f"expected a non-empty tensor, got shape {tuple(x.shape)}")
    if x.is_meta and type(x) in (torch.Tensor, torch.nn.Parameter):  # (subclasses may carry values: device_audit)
        raise ValueError("expected a tensor with data, got one on the meta device (it holds no values)")
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise ValueError(f"axis must be an int, got {axis!r} ({type(axis).__name__})")
    if not -x.dim() <= axis < x.dim():
        raise ValueError(f"axis {axis} is out of range for a {x.dim()}-d tensor; accepted: {-x.dim()} .. {x.dim() - 1}")
    return fmt, axis % x.dim(), rule


def to_blocks(x: torch.Tensor, axis: int, block_size: int, dtype: torch.dtype | None = torch.float32) -> torch.Tensor:
    """View [..., n_blocks, block_size] with ``axis`` moved last and zero padding, in ``dtype``
    (float32 by default; None keeps x's).

    Args:
        x: the operand.
        axis: the axis its blocks run along.
        block_size: the elements a block holds.
        dtype: the blocks' dtype; None keeps x's.
    """
    moved = x.movedim(axis, -1) if dtype is None else x.movedim(axis, -1).to(dtype)
    pad = -moved.shape[-1] % block_size
    if pad:
        moved = torch.nn.functional.pad(moved, (0, pad))
    return moved.reshape(*moved.shape[:-1], moved.shape[-1] // block_size, block_size)


def from_blocks(blocks: torch.Tensor, shape: torch.Size, axis: int) -> torch.Tensor:
    """Inverse of ``to_blocks``: crop the padding and move the axis back.

    Args:
        blocks: [..., n_blocks, block_size] as ``to_blocks`` laid them out.
        shape: the operand's shape.
        axis: the axis its blocks ran along.
    """
    flat = blocks.reshape(*blocks.shape[:-2], -1)[..., : shape[axis]]
    return flat.movedim(-1, axis)


def nvfp4_tensor_scale(x: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    """FP32 per-tensor scale of NVFP4: amax over finite elements / (6 * 448); 1 for all-zero."""
    a = x.abs().to(torch.float32)
    amax = torch.where(torch.isfinite(a), a, torch.zeros_like(a)).amax()
    top = fmt.element.max_value * 448.0
    return torch.where(amax > 0, amax / top, torch.ones_like(amax))


def block_scales(blocks: torch.Tensor, fmt: BlockFormat, rule: str, tensor_scale: torch.Tensor | None):
    """Scale bytes [..., n_blocks] (uint8) and the effective float32 scale of every block.

    Blocks with a NaN or infinite element get the NaN scale (0xFF for E8M0, 0x7F for E4M3).
    """
    amax = blocks.abs().amax(-1)
    finite = torch.isfinite(amax)
    amax = torch.where(finite, amax, torch.zeros_like(amax))
    if fmt.scale == "e8m0":
        e = e8m0_exponent(amax, fmt.element, rule)
        scale_bytes = torch.where(finite, e + E8M0_BIAS, E8M0_NAN).to(torch.uint8)
        return scale_bytes, e8m0_decode(scale_bytes)
    wanted = (amax / fmt.element.max_value) / tensor_scale
    stored = round_to_grid(wanted.clamp(NVFP4_SCALE_MIN, E4M3.max_value), E4M3)
    scale_bytes = torch.where(finite, encode_elements(stored, E4M3), 0x7F).to(torch.uint8)
    return scale_bytes, decode_scales(scale_bytes, fmt, tensor_scale)


def decode_scales(scale_bytes: torch.Tensor, fmt: BlockFormat, tensor_scale: torch.Tensor | None) -> torch.Tensor:
    if fmt.scale == "e8m0":
        return e8m0_decode(scale_bytes)
    return tensor_scale * decode_elements(scale_bytes, E4M3)


def quantize_blocks(blocks: torch.Tensor, fmt: BlockFormat, rule: str, tensor_scale=None):
    """Core of the reference: (grid values Q(x/s) [..., nb, bs] float32, scale bytes, scales).

    Non-finite blocks give zero grid values and a NaN scale.

    Args:
        blocks: [..., n_blocks, block_size] (``to_blocks``).
        fmt: the ``BlockFormat``.
        rule: the scale rule (``fmt.check_scale_rule`` resolves None).
        tensor_scale: NVFP4's per-tensor FP32 scale (None for the E8M0 formats).
    """
    scale_bytes, scale = block_scales(blocks, fmt, rule, tensor_scale)
    finite = torch.isfinite(scale)
    if fmt.scale == "e8m0":  # x / 2**e == x * 2**-e exactly; 2**-e from the byte 254 - b
        inverse = e8m0_decode((254 - scale_bytes.to(torch.int32)).clamp(0, 254).to(torch.uint8))
        y = blocks * torch.where(finite, inverse, 1.0).unsqueeze(-1)
    else:
        y = blocks / torch.where(finite, scale, 1.0).unsqueeze(-1)
    q = round_to_grid(y, fmt.element)
    q = torch.where(finite.unsqueeze(-1), q, torch.zeros_like(q))
    return q, scale_bytes, scale


def quantize(
    x: torch.Tensor, fmt: str | BlockFormat = "mxfp4", axis: int = -1, scale_rule: str | None = None
) -> QuantizedTensor:
    """Quantize ``x`` to the block format, blocks running along ``axis``."""
    fmt, axis, rule = check_input(x, fmt, axis, scale_rule)
    tensor_scale = nvfp4_tensor_scale(x, fmt) if fmt.tensor_scale else None
    q, scale_bytes, _ = quantize_blocks(to_blocks(x, axis, fmt.block_size), fmt, rule, tensor_scale)
    codes = encode_elements(q, fmt.element).reshape(*scale_bytes.shape[:-1], -1)
    if fmt.packed:
        codes = pack_fp4(codes)
    return QuantizedTensor(codes, scale_bytes, tensor_scale, fmt, rule, x.shape, axis, x.dtype)


def dequantize(qt: QuantizedTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Decode to ``dtype`` (default: the input's dtype), rounding the float32 decode once."""
    values = decode_elements(qt.element_codes(), qt.fmt.element) * qt.scale_values().unsqueeze(-1)
    return from_blocks(values, qt.shape, qt.axis).to(dtype or qt.dtype)


def fake_quantize(
    x: torch.Tensor, fmt: str | BlockFormat = "mxfp4", axis: int = -1, scale_rule: str | None = None
) -> torch.Tensor:
    """dequantize(quantize(x)) without materializing codes; same dtype and shape as ``x``."""
    fmt, axis, rule = check_input(x, fmt, axis, scale_rule)
    tensor_scale = nvfp4_tensor_scale(x, fmt) if fmt.tensor_scale else None
    q, _, scale = quantize_blocks(to_blocks(x, axis, fmt.block_size), fmt, rule, tensor_scale)
    return from_blocks(q * scale.unsqueeze(-1), x.shape, axis).to(x.dtype)


def stochastic_round_to_grid(y: torch.Tensor, elem, generator: torch.Generator) -> torch.Tensor:
    """Round onto the element grid stochastically: between the two grid values around |y|, up with
    probability (|y| - lower) / (upper - lower), so E[q] = y for |y| <= max_value (unbiased); values
    beyond max_value saturate. A value on the grid is returned exactly; the sign of zero is kept."""
    grid = elem.positive_grid.to(y.device, y.dtype)
    a = y.abs().clamp(max=elem.max_value)
    lo_i = (torch.searchsorted(grid, a.contiguous(), right=True) - 1).clamp_(0, len(grid) - 1)
    hi_i = (lo_i + 1).clamp_(max=len(grid) - 1)
    lo, hi = grid[lo_i], grid[hi_i]
    p = torch.where(hi > lo, (a - lo) / (hi - lo), torch.zeros_like(a))
    u = torch.rand(a.shape, generator=generator, device=y.device, dtype=y.dtype)
    q = torch.where(u < p, hi, lo)
    return torch.copysign(q, y)


def fake_quantize_stochastic(
    x: torch.Tensor, fmt: str | BlockFormat, axis: int, scale_rule: str | None, generator: torch.Generator
) -> torch.Tensor:
    """``fake_quantize`` with the elements rounded stochastically (``stochastic_round_to_grid``) under
    the same block scales: unbiased within the grid, the rounding noise drawn from ``generator``."""
    fmt, axis, rule = check_input(x, fmt, axis, scale_rule)
    if fmt.tensor_scale:
        raise ValueError(f"stochastic rounding takes a format with E8M0 block scales, not {fmt.name}")
    blocks = to_blocks(x, axis, fmt.block_size)
    _, scale = block_scales(blocks, fmt, rule, None)
    finite = torch.isfinite(scale)
    y = blocks / torch.where(finite, scale, 1.0).unsqueeze(-1)  # a power of two: exact
    q = stochastic_round_to_grid(y, fmt.element, generator)
    q = torch.where(finite.unsqueeze(-1), q, torch.zeros_like(q))
    return from_blocks(q * scale.unsqueeze(-1), x.shape, axis).to(x.dtype)

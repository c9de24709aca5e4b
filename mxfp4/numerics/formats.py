"""Number formats: element grids, scale encodings and the block formats built from them.

Every block format (MXFP4, MXFP6, MXFP8, NVFP4) is one ``BlockFormat``: an ``ElementFormat``
(the grid each element is rounded onto), a scale encoding (E8M0 powers of two, or an E4M3 value
with an FP32 tensor scale on top), and a block size. The rounding, encoding and decoding code
below is generic over these parameters, so every format goes through the same code path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

E8M0_BIAS = 127
E8M0_MIN_EXP = -127
E8M0_MAX_EXP = 127
E8M0_NAN = 0xFF


@dataclass(frozen=True)
class ElementFormat:
    """A sign-magnitude minifloat without infinities (OCP 'fn' style).

    ``max_value`` is the largest finite magnitude; codes above it (E4M3's 0x7F) are NaN.

    Args:
        name: the element type's name (``e2m1``, ...).
        ebits, mbits: exponent and mantissa bits.
        bias: the exponent bias.
        max_value: the largest finite magnitude.
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    max_value: float
    # Derived tables, filled in by __post_init__ (plain attributes, so torch.compile traces them).
    positive_grid: torch.Tensor = field(init=False, repr=False, compare=False)
    code_table: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        grid = self._positive_grid()
        object.__setattr__(self, "positive_grid", grid)
        object.__setattr__(self, "code_table", self._code_table(grid))

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number; below it the grid is uniform (subnormals)."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number (2 for E2M1: 6 = 1.5 * 2**2)."""
        return math.frexp(self.max_value)[1] - 1

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits

    @property
    def sign_bit(self) -> int:
        return 1 << (self.ebits + self.mbits)

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.mbits)

    def _positive_grid(self) -> torch.Tensor:
        """Finite non-negative values in code order (code i has value positive_grid[i])."""
        values = []
        for code in range(1 << (self.ebits + self.mbits)):
            exp_field, mant = code >> self.mbits, code & ((1 << self.mbits) - 1)
            if exp_field == 0:
                value = mant * 2.0 ** (self.emin - self.mbits)
            else:
                value = (1 + mant / (1 << self.mbits)) * 2.0 ** (exp_field - self.bias)
            if value > self.max_value:
                break
            values.append(value)
        return torch.tensor(values, dtype=torch.float64)

    def _code_table(self, grid: torch.Tensor) -> torch.Tensor:
        """float32 value of every code (sign bit included); NaN for codes beyond max_value."""
        n_pos = 1 << (self.ebits + self.mbits)
        table = torch.full((2 * n_pos,), float("nan"), dtype=torch.float32)
        grid = grid.to(torch.float32)
        table[: len(grid)] = grid
        table[n_pos : n_pos + len(grid)] = -grid
        return table


E2M1 = ElementFormat("e2m1", ebits=2, mbits=1, bias=1, max_value=6.0)
E2M3 = ElementFormat("e2m3", ebits=2, mbits=3, bias=1, max_value=7.5)
E3M2 = ElementFormat("e3m2", ebits=3, mbits=2, bias=3, max_value=28.0)
E4M3 = ElementFormat("e4m3", ebits=4, mbits=3, bias=7, max_value=448.0)

SCALE_RULES_E8M0 = ("floor", "ceil", "even", "rceil")
SCALE_RULES_E4M3 = ("nearest",)


@dataclass(frozen=True)
class BlockFormat:
    """A microscaling format: ``block_size`` consecutive elements share one scale.

    Args:
        name: the format's name (``FORMATS``' key).
        element: the element type.
        scale: ``e8m0`` (a power of two) or ``e4m3`` (NVFP4's).
        block_size: elements sharing a scale.
        tensor_scale: True for NVFP4's extra per-tensor FP32 scale.
    """

    name: str
    element: ElementFormat
    scale: str  # "e8m0" or "e4m3"
    block_size: int
    tensor_scale: bool = False  # NVFP4's extra FP32 per-tensor scale

    def __post_init__(self):
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"BlockFormat {self.name!r}: block_size must be an int >= 1, got {self.block_size!r}")
        if self.scale not in ("e8m0", "e4m3"):
            raise ValueError(f"BlockFormat {self.name!r}: scale must be e8m0 or e4m3, got {self.scale!r}")

    @property
    def scale_rules(self) -> tuple[str, ...]:
        return SCALE_RULES_E8M0 if self.scale == "e8m0" else SCALE_RULES_E4M3

    @property
    def default_scale_rule(self) -> str:
        return self.scale_rules[0]

    @property
    def packed(self) -> bool:
        """Four-bit elements are stored two per byte, first element in the low nibble."""
        return self.element.bits == 4

    def check_scale_rule(self, rule: str | None) -> str:
        rule = self.default_scale_rule if rule is None else rule
        if rule not in self.scale_rules:
            raise ValueError(
                f"unknown scale rule {rule!r} for format {self.name!r}; accepted: {', '.join(self.scale_rules)}"
            )
        return rule


FORMATS: dict[str, BlockFormat] = {}  # every block format by name: what get_format, the CLI, recipes and proofs list


def register_format(fmt: BlockFormat) -> BlockFormat:
    """Add a block format to ``FORMATS``, the one table every name, choice and check derives from (a name
    already taken is an error). Formats with E8M0 scales and blocks of at most 64 run on the fused CPU kernel
    too; every other one on the reference.

    Args:
        fmt: the ``BlockFormat`` (its ``name`` is the key recipes and the CLI use).
    """
    if fmt.name in FORMATS:
        raise ValueError(f"format {fmt.name!r} is registered already; accepted: a new name")
    FORMATS[fmt.name] = fmt
    return fmt


for _fmt in (
    BlockFormat("mxfp4", E2M1, "e8m0", 32),
    BlockFormat("mxfp6_e2m3", E2M3, "e8m0", 32),
    BlockFormat("mxfp6_e3m2", E3M2, "e8m0", 32),
    BlockFormat("mxfp8_e4m3", E4M3, "e8m0", 32),
    BlockFormat("nvfp4", E2M1, "e4m3", 16, tensor_scale=True),
):
    register_format(_fmt)

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def get_format(fmt: str | BlockFormat) -> BlockFormat:
    """The block format of a name (``FORMATS``), or ``fmt`` itself when it is one already.

    Args:
        fmt: a format's name (``mxfp4``, ``nvfp4``, ...) or a ``BlockFormat``.
    """
    if isinstance(fmt, BlockFormat):
        return fmt
    try:
        return FORMATS[fmt]
    except (KeyError, TypeError):
        raise ValueError(f"unknown format {fmt!r}; accepted: {', '.join(FORMATS)}") from None


_FLOAT_BITS = {torch.float32: (torch.int32, 23, 127), torch.float64: (torch.int64, 52, 1023)}


def round_to_grid(y: torch.Tensor, elem: ElementFormat) -> torch.Tensor:
    """Round onto the element grid: nearest, ties to even, saturating at +-max_value.

    Exact in the dtype of ``y`` (float32 or float64): the local grid step 2**(e - mbits), with e the
    binary exponent of |y| (read from its bits) floored at the grid's subnormal exponent, is a power of
    two; |y| / step is rounded half-to-even, and scaled back exactly. The sign of zero is kept.
    """
    if y.dtype not in _FLOAT_BITS:
        raise ValueError(f"round_to_grid takes float32 or float64, got {y.dtype}")
    int_dtype, mant_bits, bias = _FLOAT_BITS[y.dtype]
    a = y.abs()
    # exponent of |y|, kept within [emin, emax]: the clamp at emax only changes values that saturate
    e = ((a.view(int_dtype) >> mant_bits) - bias).clamp_(elem.emin, elem.emax)
    step = ((e - elem.mbits + bias) << mant_bits).view(y.dtype)
    inv_step = ((elem.mbits - e + bias) << mant_bits).view(y.dtype)  # 1 / step, exactly
    q = (torch.round(a * inv_step) * step).clamp_(max=elem.max_value)
    return torch.copysign(q, y)


def encode_elements(q: torch.Tensor, elem: ElementFormat) -> torch.Tensor:
    """Codes (uint8, sign in the top bit of the element) of values already on the grid.

    From the float32 bits: a normal value 1.m * 2**E has the code (E + bias) << mbits | the top
    mbits of m; a subnormal one (below 2**emin) is an integer multiple of the smallest step.
    """
    a = q.abs().to(torch.float32)
    bits = a.view(torch.int32)
    exp = (bits >> 23) - 127
    normal = ((exp + elem.bias) << elem.mbits) | ((bits & 0x7FFFFF) >> (23 - elem.mbits))
    subnormal = (a * (1.0 / elem.min_subnormal)).to(torch.int32)
    magnitude = torch.where(exp >= elem.emin, normal, subnormal)
    sign = torch.signbit(q).to(torch.uint8) * elem.sign_bit
    return magnitude.to(torch.uint8) | sign


def decode_elements(codes: torch.Tensor, elem: ElementFormat) -> torch.Tensor:
    return elem.code_table.to(codes.device)[codes.long()]


def e8m0_exponent(amax: torch.Tensor, elem: ElementFormat, rule: str) -> torch.Tensor:
    """Unbiased shared exponent per block from the block's max magnitude, as int32.

    The rules carry torchao's names and semantics (``ScaleCalculationMode``):
    - floor: floor(log2 amax) - emax (OCP MX v1.0, the default); the block max may saturate.
    - ceil:  ceil(log2 amax) - emax.
    - even:  amax rounded half-up to the element's mantissa width, then floor.
    - rceil: ceil(log2(amax / max_value)), the quotient rounded to float32 first
             (NVIDIA's cvt.rp.satfinite.ue8m0x2.f32); nothing saturates.
    An all-zero block gets the smallest exponent; the result is clamped to the E8M0 range.
    Callers map non-finite amax to the NaN scale themselves.
    """
    amax = amax.to(torch.float32)
    bits = amax.view(torch.int32)
    if rule == "floor":
        e = ((bits >> 23) & 0xFF) - 127 - elem.emax
    elif rule == "ceil":
        e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32) - elem.emax
    elif rule == "even":
        rounded = bits + (1 << (23 - elem.mbits - 1))
        e = ((rounded >> 23) & 0xFF) - 127 - elem.emax
    elif rule == "rceil":
        mant, exp = torch.frexp(amax / elem.max_value)
        e = exp.to(torch.int32) - 1 + (mant != 0.5).to(torch.int32)
    else:  # pragma: no cover - callers validate first
        raise ValueError(f"unknown scale rule {rule!r}; accepted: {', '.join(SCALE_RULES_E8M0)}")
    e = torch.where(amax > 0, e, torch.full_like(e, E8M0_MIN_EXP))
    return e.clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)


def e8m0_decode(scale_bytes: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes to float32 scale values (0xFF is NaN). 2**-127 is a float32 subnormal, exact."""
    biased = scale_bytes.to(torch.int32)
    # 2**e from its float32 bits; byte 0 (2**-127) is the subnormal with bits 0x00400000
    value = torch.where(biased == 0, 0x00400000, biased << 23).view(torch.float32)
    return torch.where(biased == E8M0_NAN, float("nan"), value)

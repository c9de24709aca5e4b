"""An independent MX oracle: numpy arithmetic and ml_dtypes casts, none of the package's code."""

from __future__ import annotations

import ml_dtypes
import numpy as np

ELEMENT_DTYPES = {
    "e2m1": ml_dtypes.float4_e2m1fn,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e4m3": ml_dtypes.float8_e4m3fn,
}
# (largest finite value, exponent of the largest power of two, mantissa bits)
ELEMENT_PARAMS = {"e2m1": (6.0, 2, 1), "e2m3": (7.5, 2, 3), "e3m2": (28.0, 4, 2), "e4m3": (448.0, 8, 3)}


def _e8m0_exponent(amax: np.ndarray, emax: int, mbits: int, max_value: float, rule: str) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        mant, ex = np.frexp(amax)  # amax = mant * 2**ex, mant in [0.5, 1)
        if rule == "floor":
            e = ex - 1 - emax
        elif rule == "ceil":
            e = ex - 1 + (mant != 0.5) - emax
        elif rule == "even":
            steps = 2.0 ** (mbits + 1)
            rounded = np.floor(mant * steps + 0.5) / steps
            e = np.frexp(np.ldexp(rounded, ex))[1] - 1 - emax
        elif rule == "rceil":
            ratio = (amax.astype(np.float32) / np.float32(max_value)).astype(np.float64)
            e = np.ceil(np.log2(ratio))
        else:
            raise AssertionError(rule)
    e = np.where(amax > 0, e, -127)
    return np.clip(e, -127, 127).astype(np.int64)


def oracle_quantize(x: np.ndarray, element: str, block: int, scale: str, rule: str):
    """Quantize a float32 [rows, K] array along its last axis.

    Returns (codes [rows, nb, block] uint8 unpacked, scale bytes [rows, nb] uint8, tensor_scale).
    """
    x = np.asarray(x, dtype=np.float32)
    rows, k = x.shape
    pad = -k % block
    xb = np.pad(x, ((0, 0), (0, pad))).reshape(rows, -1, block)
    max_value, emax, mbits = ELEMENT_PARAMS[element]
    amax = np.abs(xb.astype(np.float64)).max(-1)
    finite = np.isfinite(amax)
    amax = np.where(finite, amax, 0.0)
    tensor_scale = None
    if scale == "e8m0":
        e = _e8m0_exponent(amax, emax, mbits, max_value, rule)
        scale_f32 = np.ldexp(np.float32(1.0), e).astype(np.float32)
        scale_bytes = scale_f32.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8).copy()
        scale_bytes[~finite] = 0xFF
    else:  # NVFP4: E4M3 block scale under an FP32 tensor scale
        finite_x = np.where(np.isfinite(x), np.abs(x), 0)
        t_amax = np.float32(finite_x.max())
        tensor_scale = np.float32(t_amax / np.float32(6 * 448)) if t_amax > 0 else np.float32(1.0)
        wanted = (amax.astype(np.float32) / np.float32(6.0)) / tensor_scale
        stored = np.clip(wanted, 2.0**-6, 448.0).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
        scale_bytes = stored.view(np.uint8).copy()
        scale_bytes[~finite] = 0x7F
        scale_f32 = (tensor_scale * stored.astype(np.float32)).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = xb / np.where(finite, scale_f32, 1)[..., None]
    y = np.clip(y, -max_value, max_value).astype(np.float32)
    codes = y.astype(ELEMENT_DTYPES[element]).view(np.uint8).copy()
    codes[~finite] = 0
    return codes, scale_bytes, tensor_scale


def oracle_decode(codes: np.ndarray, element: str) -> np.ndarray:
    return codes.view(ELEMENT_DTYPES[element]).astype(np.float32)

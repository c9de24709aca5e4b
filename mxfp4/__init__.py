"""mxfp4: reference MXFP4 quantization, its exact error decomposition, and the RL harness around it."""

from .formats import FORMATS, BlockFormat, ElementFormat, get_format
from .quantize import QuantizedTensor, dequantize, fake_quantize, quantize

__all__ = [
    "FORMATS",
    "BlockFormat",
    "ElementFormat",
    "QuantizedTensor",
    "dequantize",
    "fake_quantize",
    "get_format",
    "quantize",
]

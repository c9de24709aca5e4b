"""mxfp4: reference MXFP4 quantization, its exact error decomposition, and the RL harness around it.

``quantize``, ``dequantize``, ``fake_quantize`` and ``fake_quantize_with_stats`` dispatch (see
``mxfp4.dispatch``): Triton kernels on CUDA, the pure-PyTorch reference (``mxfp4.reference``) on CPU.
"""

from .decompose import Decomposition, decompose
from .dispatch import dequantize, fake_quantize, fake_quantize_with_stats, quantize, use_backend
from .formats import FORMATS, BlockFormat, ElementFormat, get_format
from .reference import QuantizedTensor

__all__ = [
    "FORMATS",
    "BlockFormat",
    "Decomposition",
    "ElementFormat",
    "QuantizedTensor",
    "decompose",
    "dequantize",
    "fake_quantize",
    "fake_quantize_with_stats",
    "get_format",
    "quantize",
    "use_backend",
]

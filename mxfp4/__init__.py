"""mxfp4: reference MXFP4 quantization, its exact error decomposition, and the RL harness around it.

Layout (one home per concept):

- ``mxfp4.numerics``: formats, the reference quantizer, the decomposition, the recipe's
  ``Quantizer``, the Triton kernels and their one dispatch (no RL dependency);
- ``mxfp4.corrections``: the correction protocol, the registry, one module per correction;
- ``mxfp4.config``: typed, validated profiles and recipes;
- ``mxfp4.nn``: the quantized layers (linear, grouped MoE experts) and the model patcher;
- ``mxfp4.rl``: models, data, the GRPO trainer, the cell, lm-eval evaluation, pretraining;
- ``mxfp4.stats``: the statistics (intervals, paired tests, verdicts) that rl and report share;
- ``mxfp4.report``: aggregation, claims, comparison, figures;
- ``mxfp4.cli``: the ``mxfp4`` command.

``quantize``, ``dequantize``, ``fake_quantize`` and ``fake_quantize_with_stats`` dispatch (see
``mxfp4.numerics.dispatch``): Triton kernels on CUDA, the pure-PyTorch reference on CPU.
"""

from .corrections import Correction, register
from .numerics.decompose import Decomposition, decompose
from .numerics.dispatch import dequantize, fake_quantize, fake_quantize_with_stats, quantize, use_backend
from .numerics.formats import FORMATS, BlockFormat, ElementFormat, get_format
from .numerics.quantizer import Quantizer
from .numerics.reference import QuantizedTensor

__version__ = "0.2.0"

__all__ = [
    "FORMATS",
    "BlockFormat",
    "Correction",
    "Decomposition",
    "ElementFormat",
    "QuantizedTensor",
    "Quantizer",
    "decompose",
    "dequantize",
    "fake_quantize",
    "fake_quantize_with_stats",
    "get_format",
    "quantize",
    "register",
    "use_backend",
]

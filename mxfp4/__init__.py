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

import importlib

__version__ = "0.2.0"

# The public names, imported on first use (PEP 562): ``import mxfp4`` alone loads no torch, so the
# command line can pin the CPU's numerics before torch starts (mxfp4.machine).
_PUBLIC = {
    "Correction": "corrections",
    "register": "corrections",
    "Decomposition": "numerics.decompose",
    "decompose": "numerics.decompose",
    "dequantize": "numerics.dispatch",
    "fake_quantize": "numerics.dispatch",
    "fake_quantize_with_stats": "numerics.dispatch",
    "quantize": "numerics.dispatch",
    "use_backend": "numerics.dispatch",
    "FORMATS": "numerics.formats",
    "BlockFormat": "numerics.formats",
    "ElementFormat": "numerics.formats",
    "get_format": "numerics.formats",
    "Quantizer": "numerics.quantizer",
    "Recipe": "config.recipes",
    "MXLinear": "nn.linear",
    "quantize_": "nn.patch",
    "unpatch_model": "nn.patch",
    "QuantizedTensor": "numerics.reference",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mxfp4' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_PUBLIC])

"""mxfp4: reference MXFP4 quantization, its exact error decomposition, and the RL harness around it.

Sub-packages, each importing only those before it: ``numerics`` (formats, reference, decomposition,
kernels), ``verify``, ``corrections``, ``config``, ``nn`` (``MXLinear``, ``quantize_``), ``rl`` (the
GRPO harness), ``analysis`` (the pathway matrix, regime statistics), ``report``; ``cli`` on top.

``quantize``, ``dequantize``, ``fake_quantize`` and ``decompose`` dispatch to the Triton kernels on CUDA
and to the PyTorch reference on CPU; ``quantize_(model, recipe)`` quantizes a model in place.
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
    "register_format": "numerics.formats",
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

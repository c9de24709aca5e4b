"""Corrections: each targets one component of the MXFP4 error and one RL failure mode.

A correction is a class registered under a name (``@register("name")``, or the entry-point group
``mxfp4.corrections`` for outside packages, or a module named in ``$MXFP4_PLUGINS``). Its hooks are
listed in ``mxfp4.corrections.base.Correction``: numerics hooks composed by the recipe's quantizer
(``mxfp4.numerics.quantizer.Quantizer``) and lifecycle hooks the GRPO cell calls.

Helpers a correction may call, exported here: ``quantize_blocks`` (blocks quantized the plain way: grid values,
scale bytes, scales), ``to_blocks`` / ``from_blocks`` (an operand as ``[..., n_blocks, block]`` and back),
``stable_seed`` (a seed that is the same in every process), ``Operand`` (which operand a hook is told about) and
``HookError`` (what a hook's failure or broken return becomes).

Built in: the paper's ``macro_block`` (scale bias), ``outlier_fallback`` (deadzone), ``aqn`` (entropy);
the field's standard recipe, ``hadamard`` (random-sign block rotation, or the plain Hadamard matrix) and
``stochastic_rounding``; ``four_over_six`` (4/6 adaptive block scaling); ``smoothquant`` (per-channel smoothing
of each GEMM's operand pair, through ``gemm_transform``).
"""

from ..numerics.hooks import HookError
from ..numerics.quantizer import Operand
from ..numerics.reference import from_blocks, quantize_blocks, to_blocks
from .aqn import AdaptiveQuantizationNoise
from .base import Correction
from .four_over_six import FourOverSix
from .full_precision_roles import FullPrecisionRoles
from .hadamard import RandomHadamard, stable_seed
from .macro_block import MacroBlockScaling
from .ms_eden import MSEden
from .outlier_fallback import OutlierFallback
from .registry import ENTRY_POINT_GROUP, REGISTRY, available, build, register
from .smoothquant import SmoothQuant
from .stochastic_rounding import StochasticRounding
from .two_d_scales import TwoDScales

__all__ = [
    "ENTRY_POINT_GROUP",
    "AdaptiveQuantizationNoise",
    "Correction",
    "FourOverSix",
    "FullPrecisionRoles",
    "HookError",
    "MacroBlockScaling",
    "MSEden",
    "Operand",
    "OutlierFallback",
    "REGISTRY",
    "RandomHadamard",
    "SmoothQuant",
    "StochasticRounding",
    "TwoDScales",
    "available",
    "build",
    "from_blocks",
    "quantize_blocks",
    "register",
    "stable_seed",
    "to_blocks",
]

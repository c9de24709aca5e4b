"""Quantized layers: GEMMs through the recipe's quantizer (``linear``), grouped MoE experts
(``experts``), and swapping them into a transformers model (``patch``)."""

from .experts import DispatchPlan, MXGroupedExperts, grouped_experts_forward
from .linear import GemmContext, MXLinear, QuantLinearFunction, gemm_context, linear_forward, quant_linear
from .patch import (
    PatchState,
    bypassed,
    clear_weight_caches,
    gemm_weights,
    patch_model,
    patch_state,
    patched_modules,
    quantize_,
    quantized_class,
    quantized_weights,
    rollout_weight_cache,
    set_probe,
    targets,
    unpatch_model,
    weight_cache_pays,
)

__all__ = [
    "DispatchPlan",
    "GemmContext",
    "MXGroupedExperts",
    "MXLinear",
    "PatchState",
    "QuantLinearFunction",
    "bypassed",
    "clear_weight_caches",
    "gemm_context",
    "gemm_weights",
    "grouped_experts_forward",
    "linear_forward",
    "patch_model",
    "patch_state",
    "patched_modules",
    "quant_linear",
    "quantize_",
    "quantized_class",
    "quantized_weights",
    "rollout_weight_cache",
    "set_probe",
    "targets",
    "unpatch_model",
    "weight_cache_pays",
]

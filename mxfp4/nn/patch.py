"""Swap the quantized layers into a Hugging Face model, and undo it.

``patch_model(model, quantizer)`` swaps the class of every module of the quantizer's kinds
(``nn.Linear`` but ``lm_head`` by default; Qwen3-MoE's fused experts) to a quantized one
(``MXLinear``, ``MX<experts class>``), as torchao's module swap does. Parameter names do not change,
so TRL's, accelerate's and vLLM's view of the state dict is the same; ``unpatch_model`` restores the
classes. ``quantize_(model, recipe)`` does it from a recipe name; ``print(model)`` shows each
quantized module with its recipe; ``patch_state(model)`` gives the quantizer and the patched names.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

import torch

from ..config.recipes import Recipe
from ..numerics import dispatch
from ..numerics.quantizer import Quantizer
from .experts import MXGroupedExperts
from .linear import GEMM_ATTR, GemmContext, InputMemo, MXLinear, gemm_context


def _is_experts(module) -> bool:
    return (
        hasattr(module, "gate_up_proj")
        and hasattr(module, "down_proj")
        and isinstance(module.gate_up_proj, torch.nn.Parameter)
    )


def gemm_weights(module) -> dict[str, torch.nn.Parameter]:
    """The GEMM weights of a patchable module by attribute name; each reduces along its last axis
    (in_features of a Linear weight, H of gate_up_proj, I of down_proj).

    Args:
        module: a module of ``targets`` (a Linear or a fused MoE experts module).
    """
    if _is_experts(module):
        return {"gate_up_proj": module.gate_up_proj, "down_proj": module.down_proj}
    return {"weight": module.weight}


def _is_router(name: str, module) -> bool:
    return type(module).__name__.endswith("Router") or name.endswith("mlp.gate")


def targets(model, modules=("linear", "experts")) -> list[tuple[str, torch.nn.Module, str]]:
    """(name, module, kind) of every module of the given kinds (a Quantizer's ``modules``).

    Args:
        model: a transformers model.
        modules: the module kinds (``Quantizer.modules``: linear, experts, lm_head, router).
    """
    out = []
    kinds = set(modules)
    for name, module in model.named_modules():
        if _is_experts(module):
            if "experts" in kinds:
                out.append((name, module, "experts"))
        elif isinstance(module, torch.nn.Linear):
            if name.endswith("lm_head"):
                kind = "lm_head"
            elif _is_router(name, module):
                kind = "router"
            else:
                kind = "linear"
            if kind in kinds:
                out.append((name, module, kind))
        elif _is_router(name, module) and "router" in kinds and hasattr(module, "weight"):
            raise ValueError(
                f"quantizing the router {name} ({type(module).__name__}) is not supported; drop 'router' from modules"
            )
    return out


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def decoder_layer(name: str) -> int | None:
    """The decoder layer a module belongs to, from its name (transformers' ``model.layers.<i>.``); None outside."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def kept_layers(model, spec) -> set[int]:
    """The decoder layers a recipe's ``bf16_layers`` keeps unquantized in ``model`` (none without one); a
    ValueError where the model names no decoder layers or the kept ones would be all of them."""
    if spec is None:
        return set()
    layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if not layers:
        raise ValueError("bf16_layers needs the model's decoder layer count (config.num_hidden_layers); this model "
                         "has none")
    return spec.kept(int(layers))


@dataclass
class PatchState:
    """What ``patch_model`` did to a model: the quantizer (None for a full-precision recipe) and the
    patched module names."""

    quantizer: Quantizer | None
    modules: list[str]


_STATE_ATTR = "_mxfp4_patch"


def patch_state(model) -> PatchState | None:
    """The model's patch state, or None when ``patch_model`` never touched it.

    Args:
        model: a model, patched or not.
    """
    return getattr(model, _STATE_ATTR, None)


def patched_modules(model):
    """(name, module, GemmContext) of every patched module.

    Args:
        model: a model, patched or not (none yielded).
    """
    for name, module in model.named_modules():
        gemm = gemm_context(module)
        if gemm is not None:
            yield name, module, gemm


_QUANTIZED_CLASSES: dict[type, type] = {torch.nn.Linear: MXLinear}


def quantized_class(cls: type, kind: str) -> type:
    """The class a module of class ``cls`` and kind ``kind`` is swapped to: ``MXLinear`` for an
    ``nn.Linear``, else ``MX<cls name>`` with the quantized forward first in its MRO (made once per class).

    Args:
        cls: the module class swapped (``nn.Linear`` or an experts class, or a subclass).
        kind: its module kind (linear, experts, lm_head, router).
    """
    hit = _QUANTIZED_CLASSES.get(cls)
    if hit is None:
        mixin = MXGroupedExperts if kind == "experts" else MXLinear
        hit = type(f"MX{cls.__name__}", (mixin, cls), {"__module__": __name__, "__doc__": mixin.__doc__,
                                                         "base_class": cls})
        _QUANTIZED_CLASSES[cls] = hit
    return hit


# The quantized-weight cache saves re-quantizing each weight at every GEMM that reads it: worth it on
# CPU-sized models (kilobytes to megabytes), not at billions of parameters, where it would hold 11-22 GB
# (both axes) to save a memory-bound pass of a few milliseconds per micro-batch on a GPU, and pushes a
# Qwen2.5-3B GRPO step past an H100's 78 GiB (results/gpu/memory_plan_qwen2.5-3b.json).
WEIGHT_CACHE_LIMIT_BYTES = 2 * 1024**3


def _weight_elements(modules) -> int:
    """The elements of the modules' own weight matrices (and expert stacks): what a weight cache holds."""
    return sum(p.numel() for module in modules for p in module.parameters(recurse=False) if p.dim() >= 2)


def weight_cache_bytes(model, quantizer: Quantizer) -> int:
    """An upper bound on the cache ``patch_model(model, quantizer)`` would fill: every weight of every
    module it patches, quantized along both GEMM axes (forward and input gradient), in float32."""
    return 2 * 4 * _weight_elements(module for _, module, _ in targets(model, quantizer.modules))


def weight_cache_pays(model, quantizer: Quantizer | None, sharded: bool = False) -> bool:
    """Whether to cache quantized weights: not under sharded training (FSDP2, ZeRO-3: the cache would
    hold every layer's gathered weights) and only while the cache stays within
    ``WEIGHT_CACHE_LIMIT_BYTES``; a full-precision recipe caches nothing.

    Args:
        model: the model to patch.
        quantizer: the recipe's quantizer (None: full precision, nothing to cache).
        sharded: whether the parameters are sharded across ranks (FSDP, ZeRO-3).
    """
    return quantizer is not None and not sharded and weight_cache_bytes(model, quantizer) <= WEIGHT_CACHE_LIMIT_BYTES


# A generation without the cache re-quantizes every weight at every decoded token: on an H100 the rollout of
# Qwen2.5-3B's mxfp4+macro cell took 50 s of its 67 s step (mxfp4: 10 s, bf16: 4 s). For one rollout the
# forward copies alone are cached, float32 at most: Qwen2.5-3B's 10.4 GiB sit beside 34.5 GiB of masters and
# AdamW state and are dropped before the training forward, whose peak stays the step's.
ROLLOUT_CACHE_LIMIT_BYTES = 16 * 1024**3


@contextlib.contextmanager
def rollout_weight_cache(model, sharded: bool = False):
    """Inside: each patched layer quantizes a weight once (per version) instead of at every GEMM, for a
    model whose layers keep no cache across training; on exit those layers forget the weights and cache
    nothing again. The values are the same either way. Not under sharded training (FSDP2, ZeRO-3: the
    cache would hold every layer's gathered weights on every rank), nor where the forward copies would pass
    ``ROLLOUT_CACHE_LIMIT_BYTES``.

    Args:
        model: a patched model.
        sharded: whether the parameters are sharded across ranks (nothing is cached then).
    """
    uncached = [(module, gemm) for _, module, gemm in patched_modules(model) if not gemm.cache]
    if sharded or not uncached or 4 * _weight_elements(m for m, _ in uncached) > ROLLOUT_CACHE_LIMIT_BYTES:
        yield
        return
    for _, gemm in uncached:
        gemm.cache = True
    try:
        yield
    finally:
        for _, gemm in uncached:
            gemm.cache = False
            gemm.clear()


def patch_model(model, quantizer: Quantizer | None, probe=None, cache_weights: bool = True) -> list[str]:
    """Patch ``model`` in place so that the modules of ``quantizer.modules`` compute their GEMMs
    through ``quantizer``: each becomes an ``MXLinear`` (or ``MX<experts class>``). A tied lm_head is
    refused: quantizing it would also quantize the input embeddings.

    Args:
        model: a transformers model (or any module with a ``config``), not patched yet.
        quantizer: ``Recipe.quantizer()``; None (a full-precision recipe) patches nothing but records
            the state.
        probe: called as ``probe(layer_name, kind, tensor, axis)`` on every operand quantized.
        cache_weights: quantize each weight once per version (True) or at every use: False for sharded
            training (FSDP2, ZeRO-3), where a cache of gathered weights would hold the whole model on every
            rank, and for models too large for it (``weight_cache_pays``).

    Returns:
        The patched module names.
    """
    if patch_state(model) is not None:
        raise ValueError("model is already patched; unpatch it first")
    if quantizer is not None and not isinstance(quantizer, Quantizer):
        raise ValueError(f"patch_model takes a Quantizer (Recipe.quantizer()) or None, got {type(quantizer).__name__}")
    patched = []
    inputs = InputMemo()  # one for the model: the layers that read one input share its quantization
    kept = kept_layers(model, quantizer.bf16_layers) if quantizer is not None else set()
    for name, module, kind in targets(model, quantizer.modules) if quantizer is not None else []:
        if decoder_layer(name) in kept:
            continue
        if kind == "experts" and quantizer.transforms_gemm:
            raise ValueError(f"{name}: recipe {quantizer.name!r} transforms each Linear's GEMM from its two operands "
                             "(gemm_transform), which the fused experts' grouped GEMMs do not take; accepted: a "
                             "recipe without it, or modules without experts")
        if kind == "lm_head" and getattr(model.config, "tie_word_embeddings", False):
            raise ValueError("lm_head is tied to the input embeddings; quantizing it would quantize both")
        setattr(module, GEMM_ATTR, GemmContext(quantizer, name=name, probe=probe, cache=cache_weights, inputs=inputs))
        module.__class__ = quantized_class(type(module), kind)
        patched.append(name)
    setattr(model, _STATE_ATTR, PatchState(quantizer, patched))
    if patched and any(p.device.type == "cpu" for p in model.parameters()):
        dispatch.prepare(quantizer.fmt)  # a CPU kernel's one-off build here, not inside a timed step
    return patched


def quantize_(model, recipe: Recipe | str, cache_weights: bool | None = None):
    """Quantize a Hugging Face model in place with a recipe, as torchao's ``quantize_(model, config)``:

        model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-3B")
        mxfp4.quantize_(model, "mxfp4+all")   # every decoder Linear is now an MXLinear
        print(model)                          # ... MXLinear(in_features=2048, ..., mxfp4=Quantizer(...))

    Args:
        model: the model to patch (a ``PreTrainedModel`` or any module with ``nn.Linear`` layers).
        recipe: a ``Recipe`` or the name of one (``experiments/recipes.yaml``, plugins included); its
            corrections are built fresh.
        cache_weights: cache each weight's quantized values per version; default: when the cache is
            small enough (``weight_cache_pays``).

    Returns:
        The same model (patched in place; ``unpatch_model`` undoes it).
    """
    recipe = Recipe.named(recipe) if isinstance(recipe, str) else recipe
    quantizer = recipe.quantizer()
    if cache_weights is None:
        cache_weights = weight_cache_pays(model, quantizer)
    patch_model(model, quantizer, cache_weights=cache_weights)
    return model


def unpatch_model(model) -> None:
    """Undo ``patch_model``: every quantized module back to its own class, its GEMM context removed.

    Args:
        model: a model patched by ``patch_model`` or ``quantize_`` (its parameters are left as they are).
    """
    for name, module, _ in list(patched_modules(model)):
        if not isinstance(module, (MXLinear, MXGroupedExperts)):
            raise ValueError(f"{name} is a {type(module).__name__}, no longer the class patch_model gave it "
                             "(wrapped again after patching?); unpatch before wrapping")
        module.__class__ = type(module).base_class
        module.__dict__.pop(GEMM_ATTR, None)
    model.__dict__.pop(_STATE_ATTR, None)


def clear_weight_caches(model) -> None:
    """Forget every patched layer's quantized weights: the next GEMM quantizes the current values.

    Args:
        model: a patched model.
    """
    for _, _, gemm in patched_modules(model):
        gemm.clear()


def set_probe(model, probe) -> None:
    """Attach (or with None, detach) a statistics probe on every patched module.

    Args:
        model: a patched model.
        probe: called as ``probe(layer_name, kind, tensor, axis, valid)``; None detaches.
    """
    for _, _, gemm in patched_modules(model):
        gemm.probe = probe


class bypassed:
    """Context manager: the patched model computes in full precision inside, patched again after
    (the BF16 shadow pass of the gradient-accuracy metric)."""

    def __init__(self, model):
        self.model = model
        self.saved = []

    def __enter__(self):
        self.saved = [gemm for _, _, gemm in patched_modules(self.model) if not gemm.bypassed]
        for gemm in self.saved:
            gemm.bypassed = True
        return self.model

    def __exit__(self, *exc):
        for gemm in self.saved:
            gemm.bypassed = False
        self.saved = []
        return False


@contextlib.contextmanager
def weights_only(model):
    """Inside: every patched layer quantizes its weights only, its activations pass as they come (W4A16), as a
    recipe's weight-only rollouts generate; the weights' quantization (and its cache) is the training forward's.

    Args:
        model: a patched model.
    """
    switched = [gemm for _, _, gemm in patched_modules(model) if not gemm.weights_only]
    for gemm in switched:
        gemm.weights_only = True
    try:
        yield model
    finally:
        for gemm in switched:
            gemm.weights_only = False


def generation_precision(model, quantizer: Quantizer | None):
    """The precision a patched model generates in (rollouts, evaluations): ``weights_only`` where its recipe's
    rollouts are W4A16 while it trains W4A4, else as it trains.

    Args:
        model: a model patched with ``quantizer`` (or not patched, with None).
        quantizer: the recipe's quantizer (None: full precision).
    """
    switch = quantizer is not None and quantizer.weights_only_rollouts
    return weights_only(model) if switch else contextlib.nullcontext()


def quantized_weights(model):
    """Context manager: inside it the patched weights hold their forward-quantized values (same names,
    shapes and dtypes), so a weight sync (TRL's push to vLLM) ships the recipe's quantized weights.

    Args:
        model: a patched model.
    """

    transforming = [name for name, _, gemm in patched_modules(model) if gemm.quantizer.transforms_gemm]
    if transforming:
        raise ValueError(f"{transforming[0]}: its recipe changes the GEMM's basis from each batch's activation "
                         "(gemm_transform): its weight has no quantized values apart from a batch")

    @contextlib.contextmanager
    def swap():
        saved = []
        with torch.no_grad():
            for _, module, gemm in patched_modules(model):
                for p in gemm_weights(module).values():
                    quantized = gemm.weight(p, p.dim() - 1, True).to(p.dtype)
                    saved.append((p, p.data))
                    p.data = quantized
        try:
            yield model
        finally:
            for p, data in saved:
                p.data = data

    return swap()

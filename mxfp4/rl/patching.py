"""Patch a Hugging Face model so that its GEMMs run through the recipe's quantizer.

Every ``nn.Linear`` the recipe names (all but ``lm_head`` by default) and the fused 3D expert
weights of Qwen3-MoE (``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``) compute through
``QuantLinearFunction``, which fake-quantizes each operand of each GEMM along that GEMM's reduction
axis, as the MX spec's reference linear layer does:

    forward       Y  = Q(X, in)    . Q(W, in)^T          (blocks along in_features)
    input grad    dX = Q(dY, out)  . Q(W, out)           (blocks along out_features)
    weight grad   dW = Q(dY, tok)^T . Q(X, tok)          (blocks along the tokens)

Gradients reach the master weights straight through. Parameter names do not change (the
forward methods are swapped on the instances), so TRL's and vLLM's weight sync keep working, and
``unpatch`` restores the model exactly. Quantized weights are cached per weight version: a weight
is quantized once per optimizer step, not on every call. The version counter alone cannot be
trusted under FSDP2 / ZeRO-3, which write gathered weights into reused storage through ``.data`` or
collectives (no version bump), so the GRPO trainer also clears every cache at each optimizer step
(``clear_weight_caches``). Under bf16 autocast, where the quantizer's values are all bf16 numbers
(``Quantizer.exact_in_bf16``), the cache holds them in bf16: half the memory, the same values.

A weight-only recipe (``activations: false``) leaves activations and gradients unquantized; where the
dispatch runs Triton (CUDA) and no gradient is recorded (rollout generation), its Linear layers
multiply through the packed W4A16 kernel (``triton_gemm.w4a16_matmul``), the weight packed once per
version; the result equals the fake-quantized weight's product up to float32 accumulation order.

Patched state is public through two accessors: ``patch_state(model)`` (the quantizer and the patched
module names, or None) and ``gemm_context(module)``; a patched module's ``repr`` shows its recipe.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..numerics import dispatch
from ..numerics.quantizer import Quantizer
from .experts import grouped_experts_forward


@dataclass
class GemmContext:
    """What one patched layer needs: the quantizer, which GEMMs to quantize, a weight cache, and a
    probe that sees the activations and gradients it quantizes (weights are probed by the caller)."""

    quantizer: Quantizer
    name: str = ""
    probe: object = None  # called as probe(layer_name, kind, tensor, axis) when set
    cache: bool = True  # False under FSDP / ZeRO-3: a cache would hold every layer's gathered weights
    _cache: dict = field(default_factory=dict)

    @property
    def gemms(self) -> dict:
        return self.quantizer.gemms

    def weight(self, param: torch.Tensor, axis: int, enabled: bool) -> torch.Tensor:
        """The weight as a GEMM sees it: fake-quantized along ``axis`` (cached per version) or raw."""
        if not enabled:
            return param.detach()
        if not self.cache:
            with torch.no_grad():
                return self.quantizer(param.detach(), axis)
        slot = (param.data_ptr(), axis)
        hit = self._cache.get(slot)
        if hit is None or hit[0] != param._version:
            with torch.no_grad():
                q = self.quantizer(param.detach(), axis)
                if self.quantizer.exact_in_bf16 and _autocast_dtype(param) == torch.bfloat16:
                    q = q.to(torch.bfloat16)  # what the bf16 GEMM takes; lossless: every value is a bf16 number
            hit = (param._version, q)
            self._cache[slot] = hit
        return hit[1]

    def clear(self) -> None:
        """Drop every cached quantized weight (after an optimizer step)."""
        self._cache.clear()

    def packed(self, param: torch.Tensor):
        """The weight packed for the W4A16 kernel (cached per version)."""
        from ..numerics import triton_gemm, triton_kernels

        slot = (param.data_ptr(), "w4a16")
        hit = self._cache.get(slot)
        if hit is None or hit[0] != param._version:
            q = triton_kernels.quantize(param.detach(), -1, self.quantizer.scale_rule)
            hit = (param._version, triton_gemm.pack_weight(q))
            self._cache[slot] = hit
        return hit[1]

    def w4a16_applies(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        """Weight-only MXFP4 without corrections, a bf16 input, Triton dispatch, no autograd."""
        q = self.quantizer
        return (not q.activations and q.plain and self.gemms["forward"]
                and x.dtype == torch.bfloat16 and weight.dim() == 2 and not torch.is_grad_enabled()
                and dispatch.backend_for(weight, q.fmt) == "triton")

    def grad_both(self, dy2: torch.Tensor):
        """(dY along its rows, dY along its columns) from one read of dY (the fused Triton kernel),
        when both backward GEMMs quantize dY with the plain MXFP4 quantizer, nothing probes it and the
        dispatch runs Triton; None otherwise (each GEMM then quantizes dY itself). Bit-identical to
        the two separate quantizations."""
        q = self.quantizer
        if (q.activations and q.plain and self.probe is None
                and self.gemms["input_grad"] and self.gemms["weight_grad"] and dy2.dim() == 2
                and dispatch.backend_for(dy2, q.fmt) == "triton"):
            from ..numerics import triton_kernels

            return triton_kernels.fake_quantize_both(dy2, q.scale_rule)
        return None

    def act(self, x: torch.Tensor, axis: int, kind: str, enabled: bool, valid=None) -> torch.Tensor:
        """x fake-quantized along ``axis`` (``valid``: the real rows of a zero-padded x); x itself
        for a weight-only recipe."""
        if not enabled or not self.quantizer.activations:
            return x
        if self.probe is not None:
            self.probe(self.name, kind, x.detach(), axis, valid)
        return self.quantizer(x, axis, valid)


def _autocast_dtype(x: torch.Tensor):
    """The autocast dtype in force for x's device type, or None."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None


def _gemm_precision(ctx, fn):
    """Run ``fn`` under the autocast state the forward saw (autograd runs backward outside autocast),
    or with autocast off and float32 operands when the quantized values are not all bf16 numbers:
    a bf16 GEMM would round them (DESIGN.md: bf16 compute, exact quantized operands)."""
    if ctx.autocast is None:
        return fn(None)
    if ctx.exact:
        with torch.autocast(ctx.device_type, dtype=ctx.autocast):
            return fn(None)
    with torch.autocast(ctx.device_type, enabled=False):
        return fn(torch.float32)


class QuantLinearFunction(torch.autograd.Function):
    """y = Q(x) Q(w)^T + b with quantized backward GEMMs; w_fwd / w_bwd are the cached quantized weights.

    Under autocast (bf16 compute over fp32 master weights) the GEMMs take bf16 operands, which is
    exact for the quantized values of plain MX formats and outlier fallback; macro-block, NVFP4 and
    component injection make values that are not bf16 numbers, so their GEMMs run in float32 and the
    output is returned in the autocast dtype."""

    @staticmethod
    def forward(ctx, x, weight, bias, w_fwd, w_bwd, gemm: GemmContext):
        ctx.autocast, ctx.device_type = _autocast_dtype(x), x.device.type
        ctx.exact = gemm.quantizer.exact_in_bf16

        def run(cast):
            a = gemm.act(x, -1, "activation", gemm.gemms["forward"])
            if cast is None:
                return F.linear(a, w_fwd, bias)
            b = None if bias is None else bias.to(cast)
            return F.linear(a.to(cast), w_fwd.to(cast), b).to(ctx.autocast)

        y = _gemm_precision(ctx, run)
        ctx.save_for_backward(x, w_bwd)
        ctx.gemm = gemm
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        return _gemm_precision(ctx, lambda cast: QuantLinearFunction._backward(ctx, dy, cast))

    @staticmethod
    def _backward(ctx, dy, cast):
        x, w_bwd = ctx.saved_tensors
        if cast is not None:
            dy, x, w_bwd = dy.to(cast), x.to(cast), w_bwd.to(cast)
        gemm = ctx.gemm
        dy2 = dy.reshape(-1, dy.shape[-1])
        x2 = x.reshape(-1, x.shape[-1])
        dx = dw = db = None
        both = gemm.grad_both(dy2) if ctx.needs_input_grad[0] and ctx.needs_input_grad[1] else None
        if ctx.needs_input_grad[0]:
            g = both[0] if both is not None else gemm.act(dy2, -1, "grad", gemm.gemms["input_grad"])
            dx = (g @ w_bwd).reshape(x.shape)
        if ctx.needs_input_grad[1]:
            on = gemm.gemms["weight_grad"]
            g = both[1] if both is not None else gemm.act(dy2, 0, "grad_t", on)
            dw = g.T @ gemm.act(x2, 0, "activation_t", on)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(0)
        return dx, dw, db, None, None, None


def quant_linear(x, weight, bias, gemm: GemmContext, w_fwd=None, w_bwd=None):
    """F.linear through the recipe's quantizer (weights taken from the cache unless given)."""
    if w_fwd is None:
        w_fwd = gemm.weight(weight, 1, gemm.gemms["forward"])
    if w_bwd is None:
        w_bwd = gemm.weight(weight, 0, gemm.gemms["input_grad"])
    if _autocast_dtype(x) is None or not gemm.quantizer.exact_in_bf16:
        w_fwd, w_bwd = w_fwd.to(x.dtype), w_bwd.to(x.dtype)  # (under autocast the GEMM casts them itself)
    return QuantLinearFunction.apply(x, weight, bias, w_fwd, w_bwd, gemm)


def _linear_forward(self, x):
    gemm = gemm_context(self)
    if gemm.w4a16_applies(x, self.weight):
        from ..numerics.triton_gemm import w4a16_matmul

        y = w4a16_matmul(x, gemm.packed(self.weight))
        return y if self.bias is None else y + self.bias.to(y.dtype)
    return quant_linear(x, self.weight, self.bias, gemm)


def _is_experts(module) -> bool:
    return hasattr(module, "gate_up_proj") and hasattr(module, "down_proj") and isinstance(module.gate_up_proj, torch.nn.Parameter)


def gemm_weights(module) -> dict[str, torch.nn.Parameter]:
    """The GEMM weights of a patchable module by attribute name; each reduces along its last axis
    (in_features of a Linear weight, H of gate_up_proj, I of down_proj)."""
    if _is_experts(module):
        return {"gate_up_proj": module.gate_up_proj, "down_proj": module.down_proj}
    return {"weight": module.weight}


def _is_router(name: str, module) -> bool:
    return type(module).__name__.endswith("Router") or name.endswith("mlp.gate")


def targets(model, modules=("linear", "experts")) -> list[tuple[str, torch.nn.Module, str]]:
    """(name, module, kind) of every module of the given kinds (a Quantizer's ``modules``)."""
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
            raise ValueError(f"quantizing the router {name} ({type(module).__name__}) is not supported; drop 'router' from modules")
    return out


@dataclass
class PatchState:
    """What ``patch_model`` did to a model: the quantizer (None for a full-precision recipe) and the
    patched module names."""

    quantizer: Quantizer | None
    modules: list[str]


_STATE_ATTR = "_mxfp4_patch"
_GEMM_ATTR = "_mxfp4_gemm"


def patch_state(model) -> PatchState | None:
    """The model's patch state, or None when ``patch_model`` never touched it."""
    return getattr(model, _STATE_ATTR, None)


def gemm_context(module) -> GemmContext | None:
    """A patched module's GEMM context (quantizer, weight cache, probe), or None."""
    return module.__dict__.get(_GEMM_ATTR)


def patched_modules(model):
    """(name, module, GemmContext) of every patched module."""
    for name, module in model.named_modules():
        gemm = gemm_context(module)
        if gemm is not None:
            yield name, module, gemm


def _extra_repr(self) -> str:
    base = type(self).extra_repr(self)
    tag = f"mxfp4={gemm_context(self).quantizer!r}"
    return f"{base}, {tag}" if base else tag


def patch_model(model, quantizer: Quantizer | None, probe=None, cache_weights: bool = True) -> list[str]:
    """Patch ``model`` in place so that the modules of ``quantizer.modules`` compute their GEMMs
    through ``quantizer`` (``Recipe.quantizer()``); returns the patched module names.

    ``cache_weights=False`` quantizes a weight at every use instead of once per version: for sharded
    training (FSDP2, ZeRO-3), where a per-layer cache of gathered weights would hold the whole model
    unsharded on every rank.

    ``None`` (a full-precision recipe) patches nothing but records the state. A tied lm_head is
    refused: quantizing it would also quantize the input embeddings.
    """
    if patch_state(model) is not None:
        raise ValueError("model is already patched; unpatch it first")
    if quantizer is not None and not isinstance(quantizer, Quantizer):
        raise ValueError(f"patch_model takes a Quantizer (Recipe.quantizer()) or None, got {type(quantizer).__name__}")
    patched = []
    for name, module, kind in (targets(model, quantizer.modules) if quantizer is not None else []):
        if kind == "lm_head" and getattr(model.config, "tie_word_embeddings", False):
            raise ValueError("lm_head is tied to the input embeddings; quantizing it would quantize both")
        setattr(module, _GEMM_ATTR, GemmContext(quantizer, name=name, probe=probe, cache=cache_weights))
        module.forward = types.MethodType(grouped_experts_forward if kind == "experts" else _linear_forward, module)
        module.extra_repr = types.MethodType(_extra_repr, module)
        patched.append(name)
    setattr(model, _STATE_ATTR, PatchState(quantizer, patched))
    return patched


def unpatch_model(model) -> None:
    """Undo ``patch_model``: instance forwards removed, the class forwards back in force."""
    for _, module, _ in list(patched_modules(model)):
        for attr in ("forward", "extra_repr", _GEMM_ATTR):
            module.__dict__.pop(attr, None)
    model.__dict__.pop(_STATE_ATTR, None)


def clear_weight_caches(model) -> None:
    """Forget every patched layer's quantized weights: the next GEMM quantizes the current values."""
    for _, _, gemm in patched_modules(model):
        gemm.clear()


def set_probe(model, probe) -> None:
    """Attach (or with None, detach) a statistics probe on every patched module."""
    for _, _, gemm in patched_modules(model):
        gemm.probe = probe


class bypassed:
    """Context manager: the patched model computes in full precision inside, patched again after
    (the BF16 shadow pass of the gradient-accuracy metric)."""

    def __init__(self, model):
        self.model = model
        self.saved = []

    def __enter__(self):
        for _, module, _ in patched_modules(self.model):
            if "forward" in module.__dict__:
                self.saved.append((module, module.__dict__.pop("forward")))
        return self.model

    def __exit__(self, *exc):
        for module, fwd in self.saved:
            module.forward = fwd
        self.saved = []
        return False


def quantized_weights(model):
    """Context manager: inside it the patched weights hold their forward-quantized values (same names,
    shapes and dtypes), so a weight sync (TRL's push to vLLM) ships the recipe's quantized weights."""
    import contextlib

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

"""Grouped quantized MoE experts (Qwen3-MoE's fused ``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``).

One forward for all experts, with no Python loop over experts and no host sync: tokens dispatched
into aligned per-expert segments, each GEMM a grouped GEMM over them, the operands quantized as the
dense layer's are, so the result equals the per-expert loop's (bit for bit where the BLAS's sums do not
depend on a segment's zero padding: MKL's strict mode, ``mxfp4.machine.STRICT_GEMM``, which the suite pins).

The method in full: docs/methods.md, ``mxfp4.nn.experts``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .linear import autocast_dtype, gemm_context, gemm_precision


class DispatchPlan:
    """Where each (token, slot) row goes: sorted order, expert offsets, padded positions. Every
    routed expert id must be < E (Qwen3-MoE's router picks top-k of its E experts)."""

    def __init__(self, top_k_index: torch.Tensor, num_experts: int, align: int):
        t, k = top_k_index.shape
        device = top_k_index.device
        expert = top_k_index.reshape(-1).long()  # flat row r = token * k + slot
        slot = torch.arange(k, device=device).repeat(t)
        token = torch.arange(t, device=device).repeat_interleave(k)
        self.order = torch.argsort(expert * (t * k) + slot * t + token)  # sorted row -> flat row
        self.token = token[self.order]
        self.expert = expert[self.order]
        counts = torch.zeros(num_experts, dtype=torch.long, device=device)
        counts.scatter_add_(0, self.expert, torch.ones_like(self.expert))
        self.offsets = torch.cumsum(counts, 0).to(torch.int32)
        padded_counts = (counts + align - 1) // align * align
        self.padded_offsets = torch.cumsum(padded_counts, 0).to(torch.int32)
        shift = (self.padded_offsets.long() - padded_counts) - (self.offsets.long() - counts)  # per expert
        rows = t * k
        # static size (no host sync), a multiple of 8 rows: grouped_mm wants 16-byte strides
        self.padded_rows = -(-(rows + num_experts * (align - 1)) // 8) * 8
        self.position = torch.arange(rows, device=device) + shift[self.expert]
        self.valid_padded = torch.zeros(self.padded_rows, 1, dtype=torch.bool, device=device)
        self.valid_padded[self.position] = True

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """Sorted rows [S, D] -> the aligned, zero-padded buffer [padded_rows, D]."""
        return x.new_zeros(self.padded_rows, x.shape[-1]).index_copy(0, self.position, x)


class _Gather(torch.autograd.Function):
    """``x[token]`` whose backward adds each token's row gradients in descending expert order with
    one ``index_add_``: the order autograd adds them in in transformers' per-expert loop, so the
    input gradient is bit-equal to it (the default gather backward, ``index_put_`` with
    accumulation, adds in another order)."""

    @staticmethod
    def forward(ctx, x, token):
        ctx.save_for_backward(token)
        ctx.n = x.shape[0]
        return x[token]

    @staticmethod
    def backward(ctx, grad):
        (token,) = ctx.saved_tensors
        out = grad.new_zeros(ctx.n, grad.shape[-1])
        return out.index_add_(0, token.flip(0), grad.flip(0)), None


class GroupedQuantLinear(torch.autograd.Function):
    """``y[s] = Q(x)[s] . Q(W[e(s)])^T`` on expert-sorted rows, with quantized backward GEMMs.

    ``xq``: x already quantized along its last axis (or None to quantize here); ``w_fwd`` / ``w_bwd``:
    the cached quantized weights along K and along N (``w_bwd`` None: the backward quantizes it, as
    ``linear.QuantLinearFunction`` does).
    """

    @staticmethod
    def forward(ctx, x, weight, xq, w_fwd, w_bwd, plan: DispatchPlan, gemm):
        ctx.autocast, ctx.device_type = autocast_dtype(x), x.device.type
        ctx.exact, ctx.tf32 = gemm.quantizer.exact_in_bf16, gemm.quantizer.exact_in_tf32

        def run(cast):
            q = xq if xq is not None else gemm.act(x, -1, "activation", gemm.gemms["forward"])
            dtype = _operand_dtype(ctx, cast, q)
            y = F.grouped_mm(q.to(dtype), w_fwd.transpose(-2, -1).to(dtype), offs=plan.offsets)
            return y if cast is None else y.to(ctx.autocast)

        y = gemm_precision(ctx, run)
        ctx.save_for_backward(x, weight if w_bwd is None else w_bwd)
        ctx.lazy_weight = w_bwd is None
        ctx.plan, ctx.gemm = plan, gemm
        return y

    @staticmethod
    def backward(ctx, dy):
        return gemm_precision(ctx, lambda cast: GroupedQuantLinear._backward(ctx, dy, cast))

    @staticmethod
    def _backward(ctx, dy, cast):
        x, w_bwd = ctx.saved_tensors
        plan, gemm = ctx.plan, ctx.gemm
        if ctx.lazy_weight and ctx.needs_input_grad[0]:
            w_bwd = gemm.weight(w_bwd, 1, gemm.gemms["input_grad"], "input_grad")
        if cast is not None:
            dy, x, w_bwd = dy.to(cast), x.to(cast), w_bwd.to(cast)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dyq = gemm.act(dy, -1, "grad", gemm.gemms["input_grad"])
            dtype = _operand_dtype(ctx, cast, dyq)
            dx = F.grouped_mm(dyq.to(dtype), w_bwd.to(dtype), offs=plan.offsets)
        if ctx.needs_input_grad[1]:
            on = gemm.gemms["weight_grad"]
            valid = plan.valid_padded
            dy_t = gemm.act(plan.pad(dy), 0, "grad_t", on, valid=valid)
            x_t = gemm.act(plan.pad(x), 0, "activation_t", on, valid=valid)
            dtype = _operand_dtype(ctx, cast, dy_t)
            dw = F.grouped_mm(dy_t.T.contiguous().to(dtype), x_t.to(dtype), offs=plan.padded_offsets)
        return dx, dw, None, None, None, None, None


def _operand_dtype(ctx, cast, q: torch.Tensor) -> torch.dtype:
    """The dtype of a grouped GEMM's quantized operands, as ``linear.QuantLinearFunction`` chooses it
    (grouped_mm is not on autocast's list, so the cast is explicit): the autocast dtype when its values
    are bf16 numbers (exact, and CUDA's grouped_mm is fast only in bf16), float32 when they are not,
    the operand's own dtype without autocast."""
    if cast is not None:
        return cast
    return ctx.autocast if ctx.autocast is not None else q.dtype


class MXGroupedExperts(torch.nn.Module):
    """Mixed into a fused-experts class (Qwen3-MoE's) by ``patch_model`` as ``MX<its name>``: its GEMMs
    run grouped through the recipe's quantizer (``grouped_experts_forward``); parameter names unchanged."""

    def forward(self, hidden_states, top_k_index, top_k_weights):
        if gemm_context(self).bypassed:
            return super().forward(hidden_states, top_k_index, top_k_weights)
        return grouped_experts_forward(self, hidden_states, top_k_index, top_k_weights)

    def extra_repr(self) -> str:
        base = super().extra_repr()
        tag = f"mxfp4={gemm_context(self).quantizer!r}"
        return f"{base}, {tag}" if base else tag


def grouped_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """Drop-in forward of a patched Qwen3-MoE experts module (see the module docstring)."""
    gemm = gemm_context(self)
    on_fwd = gemm.gemms["forward"]
    up_f = gemm.weight(self.gate_up_proj, 2, on_fwd)
    down_f = gemm.weight(self.down_proj, 2, on_fwd)
    # the input-gradient GEMM's weights are quantized by the backward, where one runs (GroupedQuantLinear)
    plan = DispatchPlan(top_k_index, self.num_experts, gemm.quantizer.token_alignment())

    hq = gemm.act(hidden_states, -1, "activation", on_fwd)  # once per token, before dispatch
    x = _Gather.apply(hidden_states, plan.token)
    xq = hq[plan.token].detach() if on_fwd else None
    gate_up = GroupedQuantLinear.apply(x, self.gate_up_proj, xq, up_f, None, plan, gemm)
    gate, up = gate_up.chunk(2, dim=-1)
    h = GroupedQuantLinear.apply(self.act_fn(gate) * up, self.down_proj, None, down_f, None, plan, gemm)
    contrib = h * top_k_weights.reshape(-1)[plan.order].unsqueeze(-1)
    return torch.zeros_like(hidden_states).index_add_(0, plan.token, contrib.to(hidden_states.dtype))

"""The per-expert loop path of the quantized Qwen3-MoE experts (transformers' own loop with each
expert GEMM quantized), kept as the oracle that the grouped path (mxfp4.nn.experts) must equal."""

import torch
import torch.nn.functional as F

from mxfp4.nn import gemm_context, quant_linear


def per_expert_forward(self, hidden_states, top_k_index, top_k_weights):
    """Qwen3-MoE experts (transformers' loop) with each expert GEMM quantized; the fused weights are
    quantized once per version along their reduction axes (H for gate_up_proj, I for down_proj)."""
    gemm = gemm_context(self)
    up_f = gemm.weight(self.gate_up_proj, 2, gemm.gemms["forward"])
    up_b = gemm.weight(self.gate_up_proj, 1, gemm.gemms["input_grad"], "input_grad")
    down_f = gemm.weight(self.down_proj, 2, gemm.gemms["forward"])
    down_b = gemm.weight(self.down_proj, 1, gemm.gemms["input_grad"], "input_grad")
    final = torch.zeros_like(hidden_states)
    with torch.no_grad():
        mask = F.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in hit[:, 0].tolist():
        if e == self.num_experts:
            continue
        pos, tok = torch.where(mask[e])
        state = hidden_states[tok]
        gate, up = quant_linear(state, self.gate_up_proj[e], None, gemm, up_f[e], up_b[e]).chunk(2, dim=-1)
        h = quant_linear(self.act_fn(gate) * up, self.down_proj[e], None, gemm, down_f[e], down_b[e])
        final.index_add_(0, tok, (h * top_k_weights[tok, pos, None]).to(final.dtype))
    return final

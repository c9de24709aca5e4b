"""Weights pushed to vLLM under the names its model loaders take.

transformers keeps Qwen3-MoE experts fused (``mlp.experts.gate_up_proj [E, 2I, H]``,
``mlp.experts.down_proj [E, H, I]``), but vLLM's ``Qwen3MoeModel.load_weights`` matches checkpoint
names: per expert ``mlp.experts.{e}.gate_proj.weight [I, H]``, ``up_proj.weight [I, H]`` and
``down_proj.weight [H, I]`` (its ``FusedMoE.make_expert_params_mapping`` with ckpt names gate_proj,
up_proj, down_proj; shard 0 of ``w13`` is gate, shard 1 up). A fused name matches neither its stacked
nor its expert mapping and fails the load. ``vllm_named_weights`` splits the fused tensors into
exactly the names and layout ``save_pretrained`` writes for a checkpoint (views, no copies); every
other (dense) name passes through unchanged, as vLLM's Qwen2 loader takes HF names as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

FUSED_UP = "mlp.experts.gate_up_proj"
FUSED_DOWN = "mlp.experts.down_proj"


def vllm_named_weights(items: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) in checkpoint naming: fused expert tensors split per expert."""
    for name, t in items:
        if name.endswith(FUSED_UP):
            prefix = name[: -len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                yield f"{prefix}{e}.gate_proj.weight", t[e, :inter]
                yield f"{prefix}{e}.up_proj.weight", t[e, inter:]
        elif name.endswith(FUSED_DOWN):
            prefix = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                yield f"{prefix}{e}.down_proj.weight", t[e]
        else:
            yield name, t

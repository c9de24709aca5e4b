"""The weight push to vLLM: the names and layout vLLM's loaders take, the recipe's quantized values,
through TRL's own parameter stream (vLLM itself cannot run here)."""

import contextlib
import os
import types

import pytest
import torch
from safetensors.torch import load_file

from mxfp4.config.recipes import Recipe
from mxfp4.nn import gemm_context, patch_model, unpatch_model
from mxfp4.rl.grpo import MXGRPOTrainer
from mxfp4.rl.models import build_tiny
from mxfp4.rl.vllm_weights import vllm_named_weights


@pytest.mark.parametrize("arch", ["tiny-moe", "tiny-dense"])
def test_mapped_weights_are_exactly_the_checkpoint_that_save_pretrained_writes(arch, tmp_path):
    """transformers writes Qwen3-MoE checkpoints per expert (the format vLLM loads): the mapping of
    the fused in-memory tensors must give the same names, shapes and values."""
    model, _ = build_tiny(arch, seed=2)
    model.save_pretrained(tmp_path)
    saved = load_file(os.path.join(tmp_path, "model.safetensors"))
    mapped = dict(vllm_named_weights(model.named_parameters()))
    assert sorted(mapped) == sorted(saved)
    for name, t in mapped.items():
        assert torch.equal(t.detach(), saved[name]), name


def test_expert_names_follow_vllms_qwen3_moe_expert_mapping():
    """vLLM's Qwen3MoeModel.load_weights: expert tensors match 'experts.{e}.{gate,up,down}_proj.'
    (FusedMoE.make_expert_params_mapping), and no name may keep the fused 'mlp.experts.' form."""
    model, _ = build_tiny("tiny-moe")
    e_count = model.config.num_experts
    names = [n for n, _ in vllm_named_weights(model.named_parameters())]
    experts = [n for n in names if "mlp.experts." in n]
    assert len(experts) == model.config.num_hidden_layers * e_count * 3
    allowed = {f"experts.{e}.{p}." for e in range(e_count) for p in ("gate_proj", "up_proj", "down_proj")}
    assert all(any(a in n for a in allowed) for n in experts)
    fused = [n for n, _ in model.named_parameters() if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert fused and not any(a in n for n in fused for a in allowed)  # why the unmapped push fails


def test_trl_push_ships_quantized_weights_under_vllm_names():
    """TRL's colocate sync (VLLMGeneration.sync_weights over _iter_named_params), wrapped by the
    trainer: what reaches vLLM's load_weights is the recipe's forward-quantized weights, mapped."""
    from trl.generation.vllm_generation import VLLMGeneration

    model, _ = build_tiny("tiny-moe", seed=1)
    patch_model(model, Recipe.named("mxfp4").quantizer())
    received = []
    loader = types.SimpleNamespace(load_weights=lambda items: received.extend((n, t.clone()) for n, t in items))
    runner = types.SimpleNamespace(model=loader)
    gen = types.SimpleNamespace(
        model=model, mode="colocate", enable_sleep_mode=False, accelerator=None,
        _dist=types.SimpleNamespace(is_fsdp=False, gather_params=lambda params: contextlib.nullcontext()),
        llm=types.SimpleNamespace(llm_engine=types.SimpleNamespace(model_executor=types.SimpleNamespace(
            driver_worker=types.SimpleNamespace(model_runner=runner))), reset_prefix_cache=lambda: None),
    )
    gen._fix_param_name_to_vllm = types.MethodType(VLLMGeneration._fix_param_name_to_vllm, gen)
    gen._iter_named_params = types.MethodType(VLLMGeneration._iter_named_params, gen)
    gen.sync_weights = types.MethodType(VLLMGeneration.sync_weights, gen)
    trainer = types.SimpleNamespace(model=model, vllm_generation=gen)
    try:
        MXGRPOTrainer._push_quantized_weights_to_vllm(trainer)
        gen.sync_weights()
        experts = model.model.layers[1].mlp.experts
        q_up = gemm_context(experts).weight(experts.gate_up_proj, 2, True)
        got = dict(received)
        inter = experts.gate_up_proj.shape[1] // 2
        assert torch.equal(got["model.layers.1.mlp.experts.3.up_proj.weight"], q_up[3, inter:])
        assert not torch.equal(q_up, experts.gate_up_proj.detach())  # quantized, not the master weights
        assert sorted(got) == sorted(n for n, _ in vllm_named_weights(model.named_parameters()))
    finally:
        unpatch_model(model)

"""The recipe's quantized weights pushed to vLLM under its Qwen2 parameter names, stacked and tied."""


import pytest

from mxfp4.config.recipes import Recipe
from mxfp4.nn import patch_model
from mxfp4.rl.models import build_tiny
from mxfp4.rl.vllm_weights import vllm_named_weights

VLLM_STACKED = [
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
]

def _vllm_qwen2_params(config) -> set[str]:
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        names |= {
            p + "self_attn.qkv_proj.weight",
            p + "self_attn.qkv_proj.bias",
            p + "self_attn.o_proj.weight",
            p + "mlp.gate_up_proj.weight",
            p + "mlp.down_proj.weight",
            p + "input_layernorm.weight",
            p + "post_attention_layernorm.weight",
        }
    if not config.tie_word_embeddings:
        names.add("lm_head.weight")
    return names

def _vllm_qwen2_load(names, config) -> dict[str, set]:
    """Which vLLM parameter (and shard) each pushed name lands on, as vLLM's loader resolves it."""
    params, loaded = _vllm_qwen2_params(config), {}
    for name in names:
        if "rotary_emb.inv_freq" in name or (config.tie_word_embeddings and name.startswith("lm_head.")):
            continue
        for param, shard, shard_id in VLLM_STACKED:  # noqa: B007 - shard_id is read after the break
            if shard in name:
                target = name.replace(shard, param)
                break
        else:
            target, shard_id = name, None
        assert target in params, f"vLLM's Qwen2 loader has no parameter for {name!r}"
        loaded.setdefault(target, set()).add(shard_id)
    return loaded


@pytest.mark.parametrize("tied", [False, True])
def test_pushed_dense_weights_load_into_every_vllm_qwen2_parameter(tied):
    model, _ = build_tiny("tiny-dense", seed=0)
    model.config.tie_word_embeddings = tied
    patch_model(model, Recipe.named("mxfp4").quantizer())
    loaded = _vllm_qwen2_load([n for n, _ in vllm_named_weights(model.named_parameters())], model.config)
    assert set(loaded) == _vllm_qwen2_params(model.config)  # every vLLM parameter gets its weights
    for name, shards in loaded.items():
        want = {"q", "k", "v"} if "qkv_proj" in name else {0, 1} if "gate_up_proj" in name else {None}
        assert shards == want, name

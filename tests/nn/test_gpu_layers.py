"""The quantized layers as a GPU run uses them: sharded launches quantize at every use, operands that
are not bf16 numbers keep float32 under autocast, and the weight cache only where it fits."""


import pytest
import torch

from mxfp4.config.profiles import load_profile
from mxfp4.config.recipes import Recipe
from mxfp4.nn import gemm_context, patch_model
from mxfp4.rl.models import build_tiny


def test_sharded_launches_quantize_at_every_use_with_the_same_values():
    """Under FSDP / ZeRO-3 the cell patches without the weight cache (it would hold every gathered
    layer on every rank); the forward is the same."""
    paper = load_profile("paper")
    assert paper.model("qwen3-30b-a3b").sharded and not paper.model("qwen2.5-3b").sharded
    ids = torch.randint(4, 60, (2, 40), generator=torch.Generator().manual_seed(1))
    outs = []
    for cache in (True, False):
        model, _ = build_tiny("tiny-dense", seed=0)
        patch_model(model, Recipe.named("mxfp4+fallback").quantizer(), cache_weights=cache)
        with torch.no_grad():
            outs.append(model(input_ids=ids).logits)
        assert bool(gemm_context(model.model.layers[0].mlp.up_proj)._cache) == cache
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("recipe", ["mxfp4+macro", "inject-scale"])
def test_non_bf16_exact_operands_are_not_rounded_to_bf16_under_autocast(recipe):
    """Under bf16 autocast, o_proj and down_proj receive bf16 inputs; macro-block and component
    injection make values that are no bf16 numbers, so their GEMMs run in float32 on the exact
    quantized operands (before: the operands were rounded back to bf16 first)."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 64, bias=False)
    q = Recipe.named(recipe).quantizer()
    patch_model(torch.nn.Sequential(layer), q)
    x = torch.randn(16, 256).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    want = F.linear(q(x.float(), -1), q(layer.weight.detach(), 1)).to(torch.bfloat16)
    assert y.dtype == torch.bfloat16 and torch.equal(y, want)


def test_the_weight_cache_is_kept_for_small_models_and_dropped_at_billions_of_parameters():
    """The cache bound counted independently: 2 axes x 4 bytes x the patched weights' elements, here the
    decoder's linear layers (lm_head is not a quantized module of the default recipe)."""
    import torch
    from transformers import AutoModelForCausalLM

    from mxfp4.config.recipes import Recipe
    from mxfp4.nn import patch
    from mxfp4.rl.models import build_tiny, real_config

    q = Recipe.named("mxfp4+macro").quantizer(Recipe.named("mxfp4+macro").build_corrections())
    tiny, _ = build_tiny("tiny-dense", seed=0)
    linear = sum(m.weight.numel() for n, m in tiny.named_modules()
                 if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head"))
    assert patch.weight_cache_bytes(tiny, q) == 8 * linear
    assert patch.weight_cache_pays(tiny, q) and not patch.weight_cache_pays(tiny, q, sharded=True)
    assert not patch.weight_cache_pays(tiny, None)
    with torch.device("meta"):
        big = AutoModelForCausalLM.from_config(real_config("qwen2.5-3b"))
    assert patch.weight_cache_bytes(big, q) > 20 * 2**30 and not patch.weight_cache_pays(big, q)

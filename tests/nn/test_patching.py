"""Patching tiny Qwen2 and Qwen3-MoE models: quantized GEMMs forward and backward, exact undo."""

import pytest
import torch
import torch.nn.functional as F

from mxfp4.config.recipes import Recipe
from mxfp4.nn import (
    MXGroupedExperts,
    MXLinear,
    bypassed,
    clear_weight_caches,
    patch_model,
    targets,
    unpatch_model,
    weights_only,
)
from mxfp4.numerics import reference
from mxfp4.rl.grad_accuracy import gradient_accuracy
from mxfp4.rl.models import build_tiny

ARCHS = ["tiny-dense", "tiny-moe"]


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request):
    model, tok = build_tiny(request.param, seed=0)
    batch = tok(["Q: 12+7=? A: 19 #### 19", "Tom has 3 apples and buys 4."], return_tensors="pt", padding=True)
    return request.param, model, batch


def _loss(batch):
    return lambda m: m(**batch, labels=batch["input_ids"]).loss


def test_bf16_recipe_leaves_the_model_bitwise_identical(tiny):
    _, model, batch = tiny
    ref = model(**batch).logits
    assert patch_model(model, Recipe.named("bf16").quantizer()) == []
    assert torch.equal(model(**batch).logits, ref)
    unpatch_model(model)


def test_mxfp4_forward_and_backward_run_and_unpatch_restores_exactly(tiny):
    arch, model, batch = tiny
    names_before = [n for n, _ in model.named_parameters()]
    ref = model(**batch).logits
    patched = patch_model(model, Recipe.named("mxfp4").quantizer())
    assert not any(n.endswith("lm_head") for n in patched)
    assert any("experts" in n for n in patched) == (arch == "tiny-moe")
    assert [n for n, _ in model.named_parameters()] == names_before, "parameter names unchanged"
    out = model(**batch, labels=batch["input_ids"])
    assert not torch.equal(out.logits, ref)
    out.loss.backward()
    assert all(
        p.grad is not None and torch.isfinite(p.grad).all()
        for n, p in model.named_parameters()
        if "layers.0" in n and "norm" not in n
    )
    model.zero_grad(set_to_none=True)
    unpatch_model(model)
    assert torch.equal(model(**batch).logits, ref)
    assert not any(hasattr(m, "_mxfp4_gemm") for m in model.modules())


def test_quantize_swaps_each_decoder_linear_to_a_named_class_with_the_same_state_dict(tiny):
    """``quantize_`` swaps classes as torchao does: every decoder Linear becomes an MXLinear (the MoE
    experts an MXQwen3MoeExperts), print(model) shows them, the state dict keeps every name and tensor,
    and ``bypassed`` computes exactly as the unpatched model."""
    import mxfp4

    arch, model, batch = tiny
    state = {k: v.clone() for k, v in model.state_dict().items()}
    linears = [n for n, m in model.named_modules() if type(m) is torch.nn.Linear and not n.endswith("lm_head")]
    ref = model(**batch).logits
    mxfp4.quantize_(model, "mxfp4")
    try:
        swapped = {n: type(m).__name__ for n, m in model.named_modules() if isinstance(m, MXLinear)}
        assert sorted(swapped) == sorted(linears) and set(swapped.values()) == {"MXLinear"}
        assert type(model.lm_head) is torch.nn.Linear
        experts = [type(m).__name__ for m in model.modules() if isinstance(m, MXGroupedExperts)]
        assert experts == (["MXQwen3MoeExperts"] * model.config.num_hidden_layers if arch == "tiny-moe" else [])
        assert print_model_shows(model, "MXLinear(", "mxfp4=Quantizer(")
        after = model.state_dict()
        assert list(after) == list(state) and all(torch.equal(after[k], v) for k, v in state.items())
        assert not torch.equal(model(**batch).logits, ref)
        with bypassed(model):
            assert torch.equal(model(**batch).logits, ref)
    finally:
        unpatch_model(model)
    assert not any(isinstance(m, (MXLinear, MXGroupedExperts)) for m in model.modules())
    assert torch.equal(model(**batch).logits, ref)


def print_model_shows(model, *parts: str) -> bool:
    text = repr(model)
    return all(p in text for p in parts)


def test_patched_linear_equals_a_hand_composed_fake_quant_layer(tiny):
    _, model, batch = tiny
    layer = model.model.layers[0].self_attn.q_proj
    seen = {}
    hook = layer.register_forward_hook(lambda m, args, out: seen.update(x=args[0].detach(), y=out.detach()))
    patch_model(model, Recipe.named("mxfp4").quantizer())
    model(**batch)
    hook.remove()
    unpatch_model(model)
    x = seen["x"]
    expected = F.linear(
        reference.fake_quantize(x, axis=-1), reference.fake_quantize(layer.weight.detach(), axis=1), layer.bias
    )
    assert torch.equal(seen["y"], expected)


def test_weight_gradient_uses_operands_blocked_along_tokens():
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32, bias=False)
    holder = torch.nn.Module()
    holder.proj = lin
    holder.config = type("C", (), {"tie_word_embeddings": False})()
    patch_model(holder, Recipe(name="wgrad-only", gemms={"weight_grad": True}).quantizer())
    x = torch.randn(40, 64)
    dy = torch.randn(40, 32)
    lin(x).backward(dy)
    expected = reference.fake_quantize(dy, axis=0).T @ reference.fake_quantize(x, axis=0)
    assert torch.equal(lin.weight.grad, expected)


def test_moe_expert_weights_are_really_quantized():
    model, tok = build_tiny("tiny-moe", seed=1)
    batch = tok(["Q: 2+2=? A: 4"], return_tensors="pt")
    patch_model(model, Recipe.named("mxfp4").quantizer())
    model(**batch)
    experts = model.model.layers[0].mlp.experts
    cache = experts._mxfp4_gemm._cache
    w = cache[(experts.gate_up_proj.data_ptr(), 2)][1]
    raw = experts.gate_up_proj.detach()
    assert not torch.equal(w, raw)
    q = reference.quantize(raw, axis=2)
    assert torch.equal(w, reference.dequantize(q)), "values on the E2M1 grid times their E8M0 block scales"
    grid = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6.0])
    scaled = (w.reshape(-1, 32) / q.scale_values().reshape(-1, 1)).abs()
    assert torch.isin(scaled, grid).all()
    unpatch_model(model)


def test_gradient_accuracy_is_perfect_under_bf16_and_degraded_under_mxfp4(tiny):
    _, model, batch = tiny
    patch_model(model, Recipe.named("bf16").quantizer())
    exact = gradient_accuracy(model, _loss(batch))
    unpatch_model(model)
    assert exact["total"]["cosine"] == pytest.approx(1.0) and exact["total"]["rel_norm_error"] == 0
    patch_model(model, Recipe.named("mxfp4").quantizer())
    acc = gradient_accuracy(model, _loss(batch))
    unpatch_model(model)
    assert 0.5 < acc["total"]["cosine"] < 1.0
    assert acc["total"]["rel_norm_error"] > 0
    assert {"layer0", "layer1"} <= set(acc["per_layer"])


def test_recipe_targets_keep_lm_head_and_router_high_precision_by_default():
    model, _ = build_tiny("tiny-moe")
    kinds = {kind for _, _, kind in targets(model, Recipe.named("mxfp4").quantizer().modules)}
    assert kinds == {"linear", "experts"}
    kinds = {kind for _, _, kind in targets(model, Recipe(name="x", modules=["linear", "lm_head"]).quantizer().modules)}
    assert kinds == {"linear", "lm_head"}


def test_quantized_weights_context_ships_the_quantized_values_and_restores_the_masters():
    from mxfp4.nn import quantized_weights

    model, _ = build_tiny("tiny-moe", seed=2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    patch_model(model, Recipe.named("mxfp4").quantizer())
    experts = model.model.layers[0].mlp.experts
    with quantized_weights(model):
        names = [n for n, _ in model.named_parameters()]
        q = model.model.layers[0].self_attn.q_proj.weight
        assert torch.equal(q, reference.fake_quantize(before["model.layers.0.self_attn.q_proj.weight"], axis=1))
        assert torch.equal(
            experts.down_proj, reference.fake_quantize(before["model.layers.0.mlp.experts.down_proj"], axis=2)
        )
        assert torch.equal(model.lm_head.weight, before["lm_head.weight"]), "lm_head stays high precision"
    assert names == list(before)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    unpatch_model(model)


def test_patched_modules_show_their_recipe_and_state_is_public(tiny):
    from mxfp4.nn import gemm_context, patch_state

    _, model, _ = tiny
    assert patch_state(model) is None
    plain = repr(model)
    assert "mxfp4=" not in plain
    quantizer = Recipe.named("mxfp4+macro").quantizer()
    names = patch_model(model, quantizer)
    try:
        state = patch_state(model)
        assert state.quantizer is quantizer and state.modules == names
        q_proj = model.get_submodule(names[0])
        assert gemm_context(q_proj).quantizer is quantizer
        assert "recipe=mxfp4+macro" in repr(q_proj) and "macro_block" in repr(q_proj)
        assert all("recipe=mxfp4+macro" in repr(model.get_submodule(n)) for n in names)
        assert "recipe=mxfp4+macro" in repr(model)
        with pytest.raises(ValueError, match="already patched"):
            patch_model(model, quantizer)
    finally:
        unpatch_model(model)
    assert repr(model) == plain and patch_state(model) is None


def test_weight_only_recipe_generates_through_the_packed_w4a16_kernel_and_matches_fake_quant_weights():
    import mxfp4
    from mxfp4.nn import gemm_context, patched_modules

    model, tok = build_tiny("tiny-dense", seed=0)
    model = model.to(torch.bfloat16)
    batch = tok(["Q: 12+7=? A: 19"], return_tensors="pt")
    patch_model(model, Recipe.named("mxfp4-w4a16").quantizer())
    linear = next(m for _, m, _ in patched_modules(model) if isinstance(m, torch.nn.Linear))
    x = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(0)).bfloat16()
    w_fake = reference.fake_quantize(linear.weight.detach().float()).bfloat16()
    expected = F.linear(x.float(), w_fake.float(), None if linear.bias is None else linear.bias.float())
    with mxfp4.use_backend("triton"), torch.no_grad():
        assert gemm_context(linear).w4a16_applies(x, linear.weight)
        got = linear(x)
        logits = model(**batch).logits
    assert any(key[1] == "w4a16" for key in gemm_context(linear)._cache)  # the packed path ran
    torch.testing.assert_close(got.float(), expected, rtol=2**-7, atol=1e-3)  # bf16 output rounding
    with torch.no_grad():
        reference_logits = model(**batch).logits  # CPU dispatch: the fake-quantized weights, activations unquantized
    torch.testing.assert_close(logits.float(), reference_logits.float(), rtol=0.05, atol=0.05)
    assert not gemm_context(linear).w4a16_applies(x.float(), linear.weight)  # only bf16 inputs
    with mxfp4.use_backend("triton"):
        assert not gemm_context(linear).w4a16_applies(x, linear.weight)  # autograd on: the training path
    unpatch_model(model)


def patched_linear():
    """A [96, 64] Linear patched with plain MXFP4, an input of 40 rows that requires grad and an output gradient."""
    layer = torch.nn.Linear(64, 96)
    patch_model(torch.nn.Sequential(layer), Recipe.named("mxfp4").quantizer())
    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    dy = torch.randn(40, 96, generator=torch.Generator().manual_seed(1))
    return layer, x, dy


def test_backward_quantizes_dy_along_both_axes_in_one_read_bit_identically(monkeypatch):
    import mxfp4
    from mxfp4.nn.linear import GemmContext

    layer, x, dy = patched_linear()
    calls = []
    fused = GemmContext.grad_both

    def counting(self, dy2):
        out = fused(self, dy2)
        calls.append(out is not None)
        return out

    def grads():
        x.grad = layer.weight.grad = layer.bias.grad = None
        layer(x).backward(dy)
        return x.grad.clone(), layer.weight.grad.clone()

    with mxfp4.use_backend("triton"):
        monkeypatch.setattr(GemmContext, "grad_both", counting)
        one_read = grads()
        monkeypatch.setattr(GemmContext, "grad_both", lambda self, dy2: None)
        two_reads = grads()
    assert calls == [True]
    assert all(torch.equal(a, b) for a, b in zip(one_read, two_reads))


def test_a_plain_weight_is_quantized_along_both_axes_in_one_read(monkeypatch):
    """On the fast path a training forward quantizes a plain MXFP4 weight along K and N in one pass
    (``dispatch.fake_quantize_both``), caches both, and the backward reads the cached one: the output and
    gradients equal those of two separate quantizations bit for bit (Triton under the interpreter)."""
    import mxfp4
    from mxfp4.nn.linear import GemmContext
    from mxfp4.numerics import dispatch

    layer, x, dy = patched_linear()
    both = []
    real = dispatch.fake_quantize_both

    def counted(t, *args, **kwargs):
        both.append(tuple(t.shape))
        return real(t, *args, **kwargs)

    def step():
        clear_weight_caches(torch.nn.Sequential(layer))
        x.grad = layer.weight.grad = layer.bias.grad = None
        y = layer(x)
        y.backward(dy)
        return y.detach(), x.grad.clone(), layer.weight.grad.clone()

    with mxfp4.use_backend("triton"):
        monkeypatch.setattr(dispatch, "fake_quantize_both", counted)
        one_read = step()
        assert both.count((96, 64)) == 1  # the weight, once; dY's own pass is (40, 96)
        monkeypatch.setattr(GemmContext, "_both_axes", lambda self, *a: False)
        two_reads = step()
    assert all(torch.equal(a, b) for a, b in zip(one_read, two_reads))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("recipe", ["mxfp4", "mxfp4+macro"])
def test_a_rollout_quantizes_each_weight_once_for_a_model_without_a_weight_cache(arch, recipe, monkeypatch):
    """A generation of several tokens by a model patched without a cache (a 3B model's layers): inside
    ``rollout_weight_cache`` each weight is quantized once, outside once per decoded token; the tokens and
    scores are the same bit for bit, and after it the layers cache nothing again."""
    from mxfp4.nn import patched_modules, rollout_weight_cache
    from mxfp4.numerics.quantizer import Quantizer

    model, tok = build_tiny(arch, seed=0)
    batch = tok(["Q: 12+7=? A:", "Tom has 3 apples"], return_tensors="pt", padding=True, padding_side="left")
    patch_model(model, Recipe.named(recipe).quantizer(), cache_weights=False)
    weights = sum(1 for _, m, _ in patched_modules(model) for p in m.parameters(recurse=False) if p.dim() >= 2)
    roles = []
    real = Quantizer.__call__

    def counted(self, x, axis, *args, operand=None, **kwargs):
        roles.append(operand.role if operand is not None else None)
        return real(self, x, axis, *args, operand=operand, **kwargs)

    monkeypatch.setattr(Quantizer, "__call__", counted)
    settings = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, output_scores=True,
                    return_dict_in_generate=True, pad_token_id=tok.pad_token_id)
    with torch.no_grad():
        plain = model.generate(**batch, **settings)
        per_token = roles.count("weight")
        roles.clear()
        with rollout_weight_cache(model):
            cached = model.generate(**batch, **settings)
    assert per_token == 5 * weights and roles.count("weight") == weights
    assert torch.equal(plain.sequences, cached.sequences)
    assert all(torch.equal(a, b) for a, b in zip(plain.scores, cached.scores))
    assert all(not g.cache and not g._cache for _, _, g in patched_modules(model))
    roles.clear()
    with torch.no_grad(), rollout_weight_cache(model, sharded=True):  # FSDP2 / ZeRO-3: nothing cached
        model.generate(**batch, **settings)
    assert roles.count("weight") == per_token


@pytest.mark.parametrize("recipe, kept", [("mxfp4+bf16-edges", {0, 1, 4, 5, 6, 7}), ("mxfp4+bf16-last15", {6, 7})])
def test_edge_layers_stay_unquantized_and_the_first_ones_compute_as_the_unpatched_model(recipe, kept):
    """An 8-layer model: verl's edges keep layers 0-1 and 4-7, SkyRL's last 15% keeps ceil(1.2) = 2 layers. The
    patched modules are exactly the decoder Linears outside the kept layers (found from the module names here); the
    hidden states after each kept leading layer equal the unpatched model's bit for bit, the first quantized layer's
    differ; corrections compose with the setting; keeping every layer is one line."""
    model, tok = build_tiny("tiny-dense", seed=0, layers=8)
    batch = tok(["Q: 12+7=? A: 19 #### 19"], return_tensors="pt")
    with torch.no_grad():
        plain = model(**batch, output_hidden_states=True).hidden_states
    quantizer = Recipe.named(recipe).quantizer()
    patched = patch_model(model, quantizer)
    expected = [n for n, m in model.named_modules()
                if isinstance(m, torch.nn.Linear) and ".layers." in n and int(n.split(".layers.")[1].split(".")[0])
                not in kept]
    assert sorted(patched) == sorted(expected) and expected
    with torch.no_grad():
        mine = model(**batch, output_hidden_states=True).hidden_states
    first_quantized = min(set(range(8)) - kept)
    for i in range(first_quantized):  # hidden_states[i + 1]: after layer i
        assert torch.equal(mine[i + 1], plain[i + 1]), i
    assert not torch.equal(mine[first_quantized + 1], plain[first_quantized + 1])
    unpatch_model(model)
    with_all = Recipe.named("mxfp4+all").model_copy(update={"bf16_layers": Recipe.named(recipe).bf16_layers})
    assert sorted(patch_model(model, with_all.quantizer())) == sorted(expected)
    unpatch_model(model)
    every = Recipe.from_dict("all-kept", {"bf16_layers": {"first": 4, "last": 4}})
    with pytest.raises(ValueError, match="keeps the first 4 and last 4 of 8 decoder layers: nothing left to quantize"):
        patch_model(model, every.quantizer())


def test_a_bf16_backward_quantizes_the_forward_alone():
    """mxfp4+bf16-backward on one Linear, against the products written out with the reference quantizer: the output
    is Q(x) Q(W)^T, the input gradient g W and the weight gradient g^T x, both on unquantized operands."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 32, bias=False)
    model = torch.nn.Sequential(layer)
    model.config = type("Config", (), {})()
    x = torch.randn(4, 64, requires_grad=True)
    g = torch.randn(4, 32)
    patch_model(model, Recipe.named("mxfp4+bf16-backward").quantizer())
    y = model(x)
    y.backward(g)
    qx = reference.fake_quantize(x.detach(), "mxfp4", -1)
    qw = reference.fake_quantize(layer.weight.detach(), "mxfp4", -1)
    assert torch.allclose(y, qx @ qw.T, rtol=0, atol=1e-5)
    assert torch.allclose(x.grad, g @ layer.weight.detach(), rtol=0, atol=1e-5)
    assert torch.allclose(layer.weight.grad, g.T @ x.detach(), rtol=0, atol=1e-5)
    unpatch_model(model)


def test_w4a16_rollouts_generate_from_the_quantized_weights_alone_and_train_w4a4():
    """mxfp4+w4a16-rollouts: inside ``weights_only`` the patched model's logits equal, bit for bit, the unpatched
    model's with every decoder Linear's weight replaced by its reference MXFP4 fake-quantization (activations as
    they come); outside it, the plain mxfp4 recipe's W4A4 forward, exactly; a W4A16 recipe or a full-precision one
    cannot ask for it."""
    model, tok = build_tiny("tiny-dense", seed=0)
    batch = tok(["Q: 12+7=? A: 19 #### 19", "Tom has 3 apples and buys 4."], return_tensors="pt", padding=True)
    fresh, _ = build_tiny("tiny-dense", seed=0)
    with torch.no_grad():
        for name, module in fresh.named_modules():
            if isinstance(module, torch.nn.Linear) and ".layers." in name:
                module.weight.copy_(reference.fake_quantize(module.weight, "mxfp4", -1))
        reference_logits = fresh(**batch).logits
    recipe = Recipe.named("mxfp4+w4a16-rollouts")
    assert not recipe.quantizer().rollout_activations and recipe.quantizer().activations
    assert recipe.quantizer().weights_only_rollouts  # a weight-only recipe generates as it trains: nothing to switch
    assert not Recipe.named("mxfp4-w4a16").quantizer().weights_only_rollouts
    patch_model(model, recipe.quantizer())
    with torch.no_grad():
        with weights_only(model):
            rollout = model(**batch).logits
        training = model(**batch).logits
    unpatch_model(model)
    patch_model(model, Recipe.named("mxfp4").quantizer())
    with torch.no_grad():
        w4a4 = model(**batch).logits
    unpatch_model(model)
    assert torch.equal(rollout, reference_logits)
    assert torch.equal(training, w4a4) and not torch.equal(training, rollout)
    for bad in ({"activations": False}, {"quantize": False}):
        with pytest.raises(ValueError, match="rollout_precision sets how a W4A4 recipe generates"):
            Recipe.from_dict("bad", {**bad, "rollout_precision": "w4a16"})


def test_a_w4a4_rollout_on_vllm_is_refused_and_the_record_says_what_generated():
    from types import SimpleNamespace

    from mxfp4.rl.cell import rollout_record, rollout_settings

    asked = Recipe.from_dict("w4a4-rollouts", {"rollout_precision": "w4a4"})
    with pytest.raises(ValueError, match="which the vLLM engine cannot run"):
        rollout_settings(SimpleNamespace(rollout="vllm"), asked)
    hf = SimpleNamespace(uses_vllm=False, truncated_is_applied=False)
    assert rollout_record(hf, Recipe.named("mxfp4+w4a16-rollouts"))["precision"].startswith("W4A16")
    assert rollout_record(hf, Recipe.named("mxfp4"))["precision"].startswith("W4A4")

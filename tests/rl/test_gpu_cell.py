"""The paper profile's cell on a GPU, checked on CPU: precision under bf16 autocast, gradient
checkpointing, micro-batches, probes that observe without changing the run, the rollout backend and its
ledger, weight caches cleared at each step, the real Qwen2.5-3B configuration and its checkpoints' disk."""

import math

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig

from mxfp4.config.profiles import load_profile
from mxfp4.config.recipes import Recipe
from mxfp4.config.run import Run
from mxfp4.nn import clear_weight_caches, gemm_context, patch_model
from mxfp4.rl.cell import plan_cell, rollout_record, rollout_settings, weight_snapshot, weight_update
from mxfp4.rl.grpo import MXGRPOTrainer, mismatch_ledger, sample_blocks
from mxfp4.rl.models import build_random, build_tiny
from mxfp4.rl.training import common_args


def _reward(completions, **kw):
    return [float(len(c) % 2) for c in completions]  # not all equal: advantages are non-zero

def _one_step(model, tok, compute, lr=1e-6, steps=1, probe_every=0):
    args = GRPOConfig(max_steps=steps, learning_rate=lr, per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=8, top_k=0, beta=0.0, logging_steps=1, lr_scheduler_type="constant",
                      **common_args(0, compute=compute))
    data = Dataset.from_list([{"prompt": f"Question: {i}+1\nAnswer:"} for i in range(8)])
    trainer = MXGRPOTrainer(model=model, reward_funcs=[_reward], args=args, train_dataset=data, processing_class=tok,
                            probe_every=probe_every)
    trainer.train()
    return trainer


def test_a_1e6_learning_rate_step_moves_fp32_master_weights_under_bf16_compute():
    """The paper's lr 1e-6 with AdamW: about 1e-6 per element. On fp32 master weights with bf16
    autocast compute (what the cell does on GPU) nearly every weight moves; on pure-bf16 weights
    (what the cell did before) the update is below half an ulp and nearly none does."""
    model, tok = build_tiny("tiny-dense", seed=0)
    patch_model(model, Recipe.named("mxfp4").quantizer())
    snap = weight_snapshot(model)
    _one_step(model, tok, compute="bfloat16")
    moved = weight_update(model, snap)
    assert moved["changed_fraction"] > 0.9 and 0 < moved["norm"]

    model16, tok = build_tiny("tiny-dense", seed=0)
    model16.to(torch.bfloat16)
    patch_model(model16, Recipe.named("mxfp4").quantizer())
    snap16 = weight_snapshot(model16)
    _one_step(model16, tok, compute="float32")
    assert weight_update(model16, snap16)["changed_fraction"] < 0.05


def test_a_trainer_on_a_gpu_keeps_masked_attention_off_cudnn_and_one_on_the_cpu_changes_nothing(monkeypatch):
    enabled = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        common_args(0)  # this machine: no GPU, the process-wide backends untouched
        assert torch.backends.cuda.cudnn_sdp_enabled()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        common_args(0)
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()  # the kernel that takes masked rows instead
    finally:
        torch.backends.cuda.enable_cudnn_sdp(enabled)


def test_bf16_compute_is_autocast_over_fp32_masters_and_cpu_profiles_keep_float32():
    assert common_args(0, compute="bfloat16")["bf16"] is True
    assert common_args(0)["bf16"] is False
    for name in ("smoke", "embedded"):
        assert all(m.compute == "float32" for m in load_profile(name).models.values())
    assert all(m.compute == "bfloat16" for m in load_profile("paper").models.values())
    with pytest.raises(ValueError, match="compute must be"):
        common_args(0, compute="fp8")


@pytest.mark.parametrize("recipe", ["mxfp4", "mxfp4+macro"])
def test_gradient_checkpointing_gives_the_same_gradients(recipe):
    """Recomputing the patched forward in the backward pass re-quantizes identically."""
    grads = []
    for checkpointing in (False, True):
        model, _ = build_tiny("tiny-dense", seed=0)
        patch_model(model, Recipe.named(recipe).quantizer())
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable({"use_reentrant": False})
        ids = torch.randint(4, 60, (2, 48), generator=torch.Generator().manual_seed(0))
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        assert torch.equal(grads[0][n], grads[1][n]), n


def test_micro_batches_split_the_step_over_ranks_and_accumulation():
    grpo = load_profile("paper").grpo
    assert grpo.accumulation(1) == (8, 32) and grpo.accumulation(8) == (8, 4)
    with pytest.raises(ValueError, match="do not split over 3 processes"):
        grpo.accumulation(3)


def test_probes_observe_without_changing_the_run():
    """The probe's extra passes run on a forked random stream: a probed run trains exactly as an
    unprobed one (the same rollouts, the same weights), even when its forward passes draw random
    numbers (attention dropout here)."""
    final = []
    for probe_every in (0, 1):
        model, tok = build_tiny("tiny-dense", seed=0)
        for module in model.modules():
            if hasattr(module, "attention_dropout"):
                module.attention_dropout = 0.1
        patch_model(model, Recipe.named("mxfp4").quantizer())
        trainer = _one_step(model, tok, compute="float32", lr=1e-4, steps=2, probe_every=probe_every)
        final.append({n: p.detach().clone() for n, p in model.named_parameters()})
        if probe_every:
            assert trainer.mx_seconds["probe"] > 0  # the last step was probed
    for n in final[0]:
        assert torch.equal(final[0][n], final[1][n]), n


def test_a_requested_vllm_backend_that_cannot_run_is_an_error():
    grpo = load_profile("paper").grpo
    with pytest.raises(ValueError, match="grpo.rollout: vllm"):
        rollout_settings(grpo, Recipe.named("mxfp4"))
    assert rollout_settings(load_profile("smoke").grpo, Recipe.named("mxfp4")) == {"use_vllm": False}


def test_the_rollout_record_reads_the_backend_the_trainer_used():
    def trainer(**attributes):  # what TRL's __init__ sets, on an otherwise unbuilt MXGRPOTrainer
        t = MXGRPOTrainer.__new__(MXGRPOTrainer)
        t.__dict__.update(attributes)
        return t

    tis = Recipe.named("mxfp4+tis")
    vllm = trainer(use_vllm=True, vllm_importance_sampling_correction=True)
    assert rollout_record(vllm, tis) == {
        "backend": "vllm",
        "precision": "W4A16 (the recipe's quantized weights)",
        "truncated_is_cap": 2.0,
        "truncated_is_requested": 2.0,
    }
    rec = rollout_record(trainer(use_vllm=False), tis)
    assert rec["backend"] == "hf" and rec["precision"] == "W4A4 (the training forward)"
    assert rec["truncated_is_cap"] is None


def test_the_ledger_on_known_log_ratios():
    mask = torch.tensor([[1, 1, 1, 0]])
    rollout = torch.zeros(1, 4)
    train = torch.tensor([[math.log(2.0)] * 3 + [float("nan")]])
    m = mismatch_ledger(train, rollout, mask)
    assert m["mismatch/measured"] == 1.0 and m["mismatch/tokens"] == 3
    assert m["mismatch/log_ratio_mean"] == pytest.approx(math.log(2))
    assert m["mismatch/kl"] == pytest.approx(2 - 1 - math.log(2))
    assert m["mismatch/is_ratio_p50"] == pytest.approx(2.0) and m["mismatch/is_ratio_max"] == pytest.approx(2.0)
    same = mismatch_ledger(rollout, rollout, mask)
    assert same["mismatch/kl"] == 0 and same["mismatch/is_ratio_p99"] == 1.0
    assert mismatch_ledger(None, None, mask)["mismatch/measured"] == 0.0


def test_probe_samples_are_bounded_and_keep_whole_quantization_groups():
    x = torch.randn(2000, 160 * 128)  # 160 macro-groups of 4 x 32 elements per row
    q = Recipe.named("mxfp4+macro").quantizer()
    t, _ = sample_blocks(x, -1, 1024, q)
    assert t.shape == (1024, 128 * 128)
    t0, _ = sample_blocks(x.T, 0, 1024, q)  # blocked along the first axis (the weight-gradient operand)
    assert t0.shape == (1024, 128 * 128)
    small = torch.randn(64, 256)
    s, _ = sample_blocks(small, -1, 4096, q)
    assert torch.equal(s, small)  # below the bounds: the tensor itself
    # a sampled macro-group quantizes exactly as inside the whole tensor
    whole = q(x[:8], -1)
    part, _ = sample_blocks(x[:8], -1, 4096, q, groups=4)
    cols = torch.linspace(0, 159, 4).round().long()
    idx = (cols[:, None] * 128 + torch.arange(128)).flatten()
    assert torch.equal(q(part, -1), whole[:, idx])


def test_an_update_written_through_data_is_seen_after_the_step_clears_the_caches():
    """FSDP2 and ZeRO-3 write gathered weights into reused storage without a version bump: the
    version check alone would serve the old quantized weight; the per-step clear does not."""
    model, _ = build_tiny("tiny-dense", seed=0)
    patch_model(model, Recipe.named("mxfp4").quantizer())
    layer = model.model.layers[0].self_attn.q_proj
    gemm = gemm_context(layer)
    before = gemm.weight(layer.weight, 1, True).clone()
    version = layer.weight._version
    layer.weight.data.copy_(layer.weight.data * 4)  # no version bump on the parameter
    assert layer.weight._version == version
    assert torch.equal(gemm.weight(layer.weight, 1, True), before)  # stale: why the caches are cleared
    clear_weight_caches(model)
    assert torch.equal(gemm.weight(layer.weight, 1, True).float(), before.float() * 4)


def test_the_trainer_clears_the_caches_at_every_optimizer_step():
    from mxfp4.rl.grpo import WeightCacheReset

    model, tok = build_tiny("tiny-dense", seed=0)
    patch_model(model, Recipe.named("mxfp4").quantizer())
    trainer = _one_step(model, tok, compute="float32", lr=1e-4)
    assert any(isinstance(cb, WeightCacheReset) for cb in trainer.callback_handler.callbacks)
    layer = model.model.layers[0].self_attn.q_proj
    assert torch.equal(
        gemm_context(layer).weight(layer.weight, 1, True).float(),
        Recipe.named("mxfp4").quantizer()(layer.weight.detach(), -1),
    )


def test_the_gpu_smoke_model_is_the_real_qwen25_3b_configuration():
    model, tok = build_random("qwen2.5-3b", device="meta")
    n = sum(p.numel() for p in model.parameters())
    assert 3.08e9 < n < 3.10e9  # Qwen2.5-3B: 3.09 B parameters (embeddings tied)
    assert model.config.num_hidden_layers == 36 and model.config.vocab_size == 151936 == len(tok)
    assert model.config.tie_word_embeddings
    plan = plan_cell(Run.of("gpu-smoke").cell("qwen2.5-3b-random", "mxfp4", 0))
    assert plan.model_ref == "random:qwen2.5-3b"


def test_checkpointing_uses_the_name_the_installed_transformers_takes():
    """transformers 5.17 (the GPU machines') has gradient_checkpointing, later ones activation_checkpointing:
    either way the argument exists, so no cell raises TypeError at its first line."""
    from mxfp4.rl.training import checkpointing_args

    old = checkpointing_args(True, {"gradient_checkpointing", "gradient_checkpointing_kwargs", "seed"})
    assert old == {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False}}
    new = checkpointing_args(False, {"activation_checkpointing", "gradient_checkpointing"})
    assert new == {"activation_checkpointing": False, "activation_checkpointing_kwargs": None}
    with pytest.raises(ValueError, match="neither activation_checkpointing nor gradient_checkpointing"):
        checkpointing_args(True, {"seed"})
    GRPOConfig(**common_args(0, gradient_checkpointing=True))  # the installed version takes what it gets


def test_the_gpu_smoke_checkpoints_fit_the_stated_disk_budget():
    """A 3B checkpoint with Adam state is 34.5 GiB: two kept (and a third while rotating) would need
    103 GiB of a 64 GiB disk. The profile states its budget; one that exceeds it is refused."""
    from mxfp4.rl.cell import check_checkpoint_disk

    profile = load_profile("gpu-smoke")
    plan = check_checkpoint_disk(Run.of(profile).start("qwen2.5-3b-random"))
    assert plan is not None and plan["gib"] <= profile.grpo.checkpoint_disk_gib
    assert plan["gib_per_checkpoint"] == pytest.approx(3_085_938_688 * 12 / 2**30)
    saving = profile.model_copy(update={"grpo": profile.grpo.model_copy(update={"save_steps": 2})})
    with pytest.raises(ValueError, match=r"take 3 x 34.5 GiB = 103.5 GiB, over grpo.checkpoint_disk_gib 40"):
        check_checkpoint_disk(Run.of(saving).start("qwen2.5-3b-random"))


def test_random_weights_are_drawn_on_the_gpu_that_trains_them_and_loaded_weights_on_the_cpu(monkeypatch):
    from mxfp4.rl.models import initial_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert initial_device("random:qwen2.5-3b") == "cuda:1"   # each rank on its own GPU, not all on cuda:0
    assert initial_device("Qwen/Qwen2.5-3B") == "cpu" and initial_device("results/x/models/tiny") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert initial_device("random:qwen2.5-3b") == "cpu"
    # load() places by initial_device unless told, so a cell and its probe batch draw on the same device
    from mxfp4.rl import models

    monkeypatch.setattr(models, "initial_device", lambda ref: "meta")
    model, _ = models.load("random:qwen2.5-3b")
    assert {p.device.type for p in model.parameters()} == {"meta"}


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["bf16", "mxfp4"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("checkpointing", [True, False])
def test_the_smoke_models_policy_gradient_is_finite_on_cuda_with_left_padding(recipe, attention, checkpointing):
    """The GPU smoke cells' backward, cut to 4 layers of the real Qwen2.5-3B widths, under the attention
    backends every trainer of the harness sets (``finite_attention_gradients``): left-padded prompts (the
    rows a padded query attends nothing in), 192 tokens (64 mod 128, where cuDNN's Hopper backward gives NaN),
    bf16 autocast over fp32 masters, a policy-gradient loss with non-zero advantages on the completion
    tokens. Every gradient is finite; a failure names the parameters whose gradient is not, first in the
    model's order (where the NaN was born), per attention and checkpointing, which tells the kernels apart."""
    from transformers import AutoModelForCausalLM

    from mxfp4.rl.models import real_config
    from mxfp4.rl.training import finite_attention_gradients

    finite_attention_gradients()

    config = real_config("qwen2.5-3b")
    config.num_hidden_layers, config.layer_types = 4, config.layer_types[:4]
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attention)
    if recipe != "bf16":
        patch_model(model, Recipe.named(recipe).quantizer())
    if checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    pad, prompt, completion = 24, 128, 64
    ids = torch.randint(100, config.vocab_size, (8, prompt + completion), device="cuda")
    mask = torch.ones_like(ids)
    mask[::2, :pad] = 0  # every other row left-padded
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(input_ids=ids, attention_mask=mask).logits[:, prompt - 1:-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, prompt:, None]).squeeze(-1)
    advantages = torch.linspace(-1, 1, 8, device="cuda")[:, None]
    (-(advantages * logp).mean()).backward()
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"{len(bad)} parameters with non-finite gradients, first: {bad[:4]}"

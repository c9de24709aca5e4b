"""The paper profile's GPU path, checked on CPU: precision, the rollout backend and its ledger,
gradient checkpointing, bounded probes, the weight cache under sharded writes, vLLM's Qwen2 names."""

import importlib.metadata
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig

from mxfp4.config.profiles import load_profile
from mxfp4.config.recipes import Recipe
from mxfp4.nn import clear_weight_caches, gemm_context, patch_model
from mxfp4.rl.cell import plan_cell, rollout_record, rollout_settings, weight_snapshot, weight_update
from mxfp4.rl.grpo import MXGRPOTrainer, mismatch_ledger, sample_blocks
from mxfp4.rl.models import build_random, build_tiny
from mxfp4.rl.training import common_args
from mxfp4.rl.vllm_weights import vllm_named_weights


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


# --- precision --------------------------------------------------------------------------------

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
            assert trainer.mx_probe_seconds > 0  # the last step was probed
    for n in final[0]:
        assert torch.equal(final[0][n], final[1][n]), n


# --- rollout backend and the mismatch ledger ---------------------------------------------------------

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


# --- bounded probes -----------------------------------------------------------------------------------


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


# --- the weight cache under FSDP / ZeRO writes -------------------------------------------------------


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


# --- the paper's configurations, randomly initialised -------------------------------------------------


def test_the_gpu_smoke_model_is_the_real_qwen25_3b_configuration():
    model, tok = build_random("qwen2.5-3b", device="meta")
    n = sum(p.numel() for p in model.parameters())
    assert 3.08e9 < n < 3.10e9  # Qwen2.5-3B: 3.09 B parameters (embeddings tied)
    assert model.config.num_hidden_layers == 36 and model.config.vocab_size == 151936 == len(tok)
    assert model.config.tie_word_embeddings
    plan = plan_cell("gpu-smoke", "qwen2.5-3b-random", "mxfp4", 0)
    assert plan.model_ref == "random:qwen2.5-3b"


# --- vLLM's Qwen2 loader -----------------------------------------------------------------------------

# vLLM's Qwen2ForCausalLM.load_weights (vllm/model_executor/models/qwen2.py): AutoWeightsLoader skips
# "lm_head." when the embeddings are tied, then Qwen2Model.load_weights renames through
# stacked_params_mapping and skips rotary_emb.inv_freq; every other name must be a parameter.
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


def test_the_gpu_smoke_checkpoints_fit_the_stated_disk_budget():
    """A 3B checkpoint with Adam state is 34.5 GiB: two kept (and a third while rotating) would need
    103 GiB of a 64 GiB disk. The profile states its budget; one that exceeds it is refused."""
    from mxfp4.rl.cell import check_checkpoint_disk

    profile = load_profile("gpu-smoke")
    plan = check_checkpoint_disk(profile, "qwen2.5-3b-random")
    assert plan is not None and plan["gib"] <= profile.grpo.checkpoint_disk_gib
    assert plan["gib_per_checkpoint"] == pytest.approx(3_085_938_688 * 12 / 2**30)
    saving = profile.model_copy(update={"grpo": profile.grpo.model_copy(update={"save_steps": 2})})
    with pytest.raises(ValueError, match=r"take 3 x 34.5 GiB = 103.5 GiB, over grpo.checkpoint_disk_gib 40"):
        check_checkpoint_disk(saving, "qwen2.5-3b-random")


def _kernels_script(name: str):
    """A script of kernels/bench/ or kernels/gpu/ (not packages) as a module."""
    import importlib.util

    kernels = Path(__file__).resolve().parent.parent / "kernels"
    [path] = [p for p in (kernels / "bench" / f"{name}.py", kernels / "gpu" / f"{name}.py") if p.is_file()]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_gpu_wheel_bundle_pins_the_versions_the_harness_is_tested_with():
    bundle = _kernels_script("gpu_bundle")
    wheels, pins = bundle.read_packages(bundle.WHEELS), bundle.read_packages(bundle.ROOT / "constraints.txt")
    assert {"transformers", "trl", "lm-eval", "datasets", "pydantic", "pydantic-core", "torchao"} <= set(wheels)
    assert {name: v for name, v in wheels.items() if name in pins and pins[name] != v} == {}
    assert "torch" not in wheels and "triton" not in wheels  # the machines' own CUDA builds stay


def test_the_requirement_walk_reads_markers_for_the_gpu_python_and_finds_absent_and_outdated_packages():
    bundle = _kernels_script("gpu_bundle")
    roots = {"a": ["b>=2", "c", "d>=1.0", "e",
                   "tomli; python_version < '3.11'",     # false on the GPU's 3.12
                   "pywin32; sys_platform == 'win32'",   # false on Linux
                   "newer; python_version >= '3.12'"]}  # true there, false on this 3.11 interpreter
    present = {"b": "1.5", "c": "1.0", "d": None, "e": "2.0", "f": "0.9"}
    requires = {"c": ["f>=1"], "e": ["c"]}.get
    unmet, unverified = bundle.check(roots, present, requires, walk_into=lambda name: name in {"c", "e"})
    found = {(f.requirer, f.requirement, f.found) for f in unmet}
    assert found == {("a", "b>=2", "version 1.5"), ("a", "newer; python_version >= '3.12'", "absent"),
                     ("c", "f>=1", "version 0.9")}  # c is walked once though required twice
    assert [(f.requirer, f.requirement) for f in unverified] == [("a", "d>=1.0")]


def test_the_stand_in_for_the_gpu_image_takes_the_image_packages_required_at_the_image_versions(tmp_path):
    """What kernels/gpu/emulate_gpu_image.sh installs: the image's packages that the harness or a carried package
    requires, pinned where the image's version is known; never a carried one (the bundle shadows it) nor one
    nobody requires."""
    bundle = _kernels_script("gpu_bundle")
    image, wheels = tmp_path / "image.txt", tmp_path / "wheels.txt"
    image.write_text("torch==2.11.0\ntriton==3.6.0\nnumpy==2.5.2\npyyaml\njax==0.11.2\npydantic==2.9.0\n")
    wheels.write_text("pydantic==2.14.3  # carried: shadows the image's copy\n")
    needed = bundle.required_from_image(image=image, wheels=wheels)
    # triton's requirement carries a marker (Linux): true on the GPU machines
    assert needed == {"numpy": "2.5.2", "pyyaml": None, "torch": "2.11.0", "triton": "3.6.0"}
    real = bundle.required_from_image()
    assert real["torch"] == "2.11.0" and real["triton"] == "3.6.0" and "transformers" not in real  # 5.23 carried


def test_the_carried_wheels_and_the_gpu_image_meet_every_requirement_of_the_harness(tmp_path):
    bundle = _kernels_script("gpu_bundle")
    unmet, _, unread = bundle.check_here()
    assert unmet == []
    for name in unread:  # read from the wheel where .whl/ holds it, else from the installed copy
        with pytest.raises(importlib.metadata.PackageNotFoundError):
            importlib.metadata.version(name)
    # The walk reads the carried packages' real requirements: without httpx2, huggingface-hub 2 (and so
    # `import transformers`) would fail on the machine.
    without = tmp_path / "wheels.txt"
    without.write_text("".join(line + "\n" for line in bundle.WHEELS.read_text().splitlines()
                               if not line.startswith("httpx2==")))
    unmet, _, _ = bundle.check_here(wheels=without)
    assert [(f.requirer, f.found) for f in unmet if f.requirement.startswith("httpx2")] == [
        ("huggingface-hub", "absent")]
    with pytest.raises(ValueError, match=r"'torch==' is neither 'name' nor 'name==version'"):
        (tmp_path / "bad.txt").write_text("torch==\n")
        bundle.read_packages(tmp_path / "bad.txt")


def test_the_moe_bench_times_the_unquantized_grouped_and_per_expert_paths_and_writes_as_it_goes(tmp_path):
    bench = _kernels_script("bench_moe")
    bench.CASES = {"tiny": (8, 2, 64, 32, 1, 64)}  # the smallest case: this checks the report, not speed
    out = tmp_path / "moe.json"
    assert bench.main(["--out", str(out), "--reps", "1", "--device", "cpu", "--compute", "bfloat16"]) == 0
    report = json.loads(out.read_text())
    row = report["rows"][0]
    paths = {"bf16", "grouped", "per-expert loop"}
    assert report["complete"] and set(row["seconds_fwd_bwd"]) == set(row["seconds_generate"]) == paths
    assert row["grouped_over_bf16"] > 0 and row["generate_grouped_over_bf16"] > 0
    assert "compute bfloat16" in report["method"] and row["weight_cache"] is True and row["decode_tokens"] == 64


def test_the_memory_plan_accounts_weights_and_adam_state_exactly_and_writes_each_recipe(tmp_path):
    """One layer of the real Qwen2.5-3B configuration under FakeTensorMode (nothing allocated): the
    parameter bytes equal the model's parameter count (counted on the meta device, an independent path)
    times 4 (fp32 masters), Adam's state twice that (to its step counters); the probe's two gradient sets
    make the gradients exceed one set; a quantized recipe's weight caches and saved operands add to
    BF16's peak."""
    import json

    import torch
    from transformers import AutoModelForCausalLM

    from mxfp4.analysis import memory_plan as plan
    from mxfp4.rl.models import real_config

    out = tmp_path / "plan.json"
    plan.write_plan("gpu-smoke-quick", out, layers=1, recipes=["bf16", "mxfp4"])
    report = json.loads(out.read_text())
    config = real_config("qwen2.5-3b")
    config.num_hidden_layers = 1
    with torch.device("meta"):
        n = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    bf16, mxfp4 = (report["recipes"][r]["peak_gib_by_category"] for r in ("bf16", "mxfp4"))
    assert bf16["Parameter"] * plan.GIB == 4 * n
    assert abs(bf16["Optstate"] * plan.GIB - 8 * n) < 1024  # two fp32 moments (and Adam's scalar step counters)
    assert bf16["Gradient"] > bf16["Parameter"]
    assert report["recipes"]["mxfp4"]["peak_gib"] > report["recipes"]["bf16"]["peak_gib"]
    assert report["limit_gib"] == 78.0 and all(r["fits"] for r in report["recipes"].values())
    assert report["recipes"]["mxfp4"]["weight_cache"] and not report["recipes"]["bf16"]["weight_cache"]
    # another process's recipe joins the file; a recipe computed under other settings does not survive
    plan.write_plan("gpu-smoke-quick", out, layers=1, recipes=["bf16"])
    assert set(json.loads(out.read_text())["recipes"]) == {"bf16", "mxfp4"}
    plan.write_plan("gpu-smoke-quick", out, layers=2, recipes=["bf16"])
    assert set(json.loads(out.read_text())["recipes"]) == {"bf16"}


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


def _smoke_cell(results, recipe, step_times, peak=None, log=None, autotune=None):
    """A finished gpu-smoke-quick cell (rollout_time half of each step_time), or only the log of one that died;
    ``autotune``: per step (autotune_time, rollout_autotune_time, autotune_keys) as StepLogger logs them."""
    from mxfp4.layout import TRAIN_LOG, Layout

    layout = Layout(results, "gpu-smoke-quick")
    if log is not None:  # a cell that died before its metrics: only its log
        layout.cell_log("qwen2.5-3b-random", recipe, 0).parent.mkdir(parents=True, exist_ok=True)
        layout.cell_log("qwen2.5-3b-random", recipe, 0).write_text(log)
        return
    cell = layout.cell("qwen2.5-3b-random", recipe, 0)
    cell.mkdir(parents=True)
    (cell / "metrics.json").write_text(json.dumps({"steps": len(step_times), "device": "NVIDIA H100 80GB HBM3",
                                                   "versions": {"torch": "2.11.0"}}))
    tuned = [dict(zip(("autotune_time", "rollout_autotune_time", "autotune_keys"), t)) for t in autotune or []]
    (cell / TRAIN_LOG).write_text("".join(json.dumps({"step": i + 1, "step_time": s, "rollout_time": s / 2,
                                                      "peak_memory_gib": peak,
                                                      "peak_reserved_gib": None if peak is None else peak + i,
                                                      **(tuned[i] if tuned else {})}) + "\n"
                                          for i, s in enumerate(step_times)))


def test_the_gpu_smoke_report_times_each_recipe_against_its_own_runs_bf16(tmp_path):
    from mxfp4.report.gpu_smoke import report

    a, b = tmp_path / "a", tmp_path / "b"
    _smoke_cell(a, "bf16", [50.0, 2.0, 4.0], peak=40.0)     # median after the first step: 3.0
    _smoke_cell(a, "mxfp4", [90.0, 3.6, 3.6], peak=60.0)    # 3.6 / 3.0 = 1.2 <= 1.3
    _smoke_cell(a, "mxfp4+macro", [], log="Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory")
    _smoke_cell(b, "bf16", [50.0, 4.0, 4.0])                # a slower machine: 4.0
    _smoke_cell(b, "mxfp4+fallback", [90.0, 6.8, 6.8])      # 6.8 / 4.0 = 1.7 > 1.6 (against a's bf16: 2.27)
    plan = {"profile": "gpu-smoke-quick", "method": "FakeTensorMode", "recipes": {"mxfp4": {"peak_gib": 71.3}}}
    recipes = ["bf16", "mxfp4", "mxfp4+macro", "mxfp4+fallback", "mxfp4+aqn"]
    rec = report([a, b], "gpu-smoke-quick", "qwen2.5-3b-random", recipes, 0, plan)
    got = rec["recipes"]
    assert got["mxfp4"]["step_time_vs_bf16"] == pytest.approx(1.2) and got["mxfp4"]["meets_target"] is True
    assert got["mxfp4+fallback"]["step_time_vs_bf16"] == pytest.approx(1.7)
    assert got["mxfp4+fallback"]["meets_target"] is False and got["mxfp4+fallback"]["run"] == 1
    assert got["mxfp4"]["rollout_time_vs_bf16"] == pytest.approx(1.2)
    assert got["mxfp4"]["measured_over_planned_peak"] == pytest.approx(60.0 / 71.3)
    assert got["mxfp4"]["peak_reserved_gib"] == 62.0 and got["mxfp4+fallback"]["peak_reserved_gib"] is None
    assert "OutOfMemoryError" in got["mxfp4+macro"]["log_tail"] and rec["failed"] == ["mxfp4+macro"]
    assert rec["not_run"] == ["mxfp4+aqn"] and got["bf16"]["run"] == 0
    assert rec["bf16_step_time_a_a"] == {"step_time_s": [3.0, 4.0], "max_over_min": pytest.approx(4 / 3)}
    assert rec["device"] == "NVIDIA H100 80GB HBM3"
    other = report([a], "gpu-smoke-quick", "qwen2.5-3b-random", recipes, 0, {**plan, "profile": "gpu-smoke"})
    assert "planned_peak_gib" not in other["recipes"]["mxfp4"] and "not compared" in other["memory_plan"]


def test_the_gpu_smoke_report_times_steps_net_of_the_autotuning_inside_them(tmp_path):
    """A timed step that met a new shape bucket tuned it: its time counts net of that tuning, else one retune
    of three steps decides the median (here 9.6 s raw: 1.2x BF16 net, 2.2x raw)."""
    from mxfp4.report.gpu_smoke import report

    _smoke_cell(tmp_path, "bf16", [50.0, 3.0, 3.0])
    _smoke_cell(tmp_path, "mxfp4", [90.0, 3.6, 9.6], autotune=[(80.0, 20.0, 40), (0.0, 0.0, 0), (6.0, 3.0, 3)])
    rec = report([tmp_path], "gpu-smoke-quick", "qwen2.5-3b-random", ["bf16", "mxfp4"])["recipes"]["mxfp4"]
    assert rec["step_time_s"] == pytest.approx(3.6) and rec["step_time_vs_bf16"] == pytest.approx(1.2)
    assert rec["rollout_time_s"] == pytest.approx(1.8) and rec["rollout_time_vs_bf16"] == pytest.approx(1.2)
    assert rec["autotuning_in_timed_steps"] == {"seconds": pytest.approx(6.0), "keys": 3}  # step 1's not counted
    assert rec["meets_target"] is True and rec["timed_steps"] == 2


def test_bench_calls_of_one_device_merge_with_every_target_met_or_missed(tmp_path):
    bench = _kernels_script("bench_kernels")

    def memory(path, axis, fraction, shape=(8192, 4096)):
        return {"kind": "memory", "path": path, "shape": list(shape), "axis": axis, "seconds": 1.0,
                "fraction": fraction}

    def call(rows, **over):
        return {"device": "NVIDIA H100 80GB HBM3", "versions": {"torch": "2.11.0", "triton": "3.6.0"},
                "method": "CUDA graphs", "command": "python kernels/bench/bench_kernels.py", "rows": rows, "ratios": {},
                **over}

    one = call([memory("triton quantize", -1, 0.86), memory("triton quantize", 0, 0.84),
                memory("triton fake_quantize_with_stats", -1, 0.5), memory("triton fake_quantize", "both", 0.9)])
    two = call([{"kind": "gemm", "path": "w4a16_matmul (auto: fused at M<=64, else dequantize + cuBLAS)",
                 "shape": [64, 2048, 2048], "seconds": 1.0, "speedup_vs_cublas_bf16": 2.6},
                {"kind": "gemm", "path": "w4a16_matmul (auto: fused at M<=64, else dequantize + cuBLAS)",
                 "shape": [8192, 2048, 2048], "seconds": 1.0, "speedup_vs_cublas_bf16": 0.9}], partial=True)
    merged = bench.merge([one, two], ["a.json", "b.json"])
    assert [(t["target"], t["shape"], t["met"]) for t in merged["targets"]] == [
        ("triton quantize (axis -1) / copy bandwidth", [8192, 4096], True),
        ("triton quantize (axis 0) / copy bandwidth", [8192, 4096], False),
        ("W4A16 decode / cuBLAS bf16", [64, 2048, 2048], True)]  # prefill (M = 8192) has no such target
    assert [r["call"] for r in merged["rows"]] == [0, 0, 0, 0, 1, 1] and merged["partial"] is True
    with pytest.raises(ValueError, match="differ in device"):
        bench.merge([one, call([], device="NVIDIA H200")], ["a.json", "c.json"])


def _session_env(out: Path, work: Path, wheels: Path, **extra: str) -> dict:
    """The environment of a kernels/gpu/gpu_session.sh run here: this Python first on PATH (python3 there),
    ``wheels`` as the carried bundle, a deadline that leaves the step room."""
    import os

    return {**os.environ, "OUT": str(out), "WORK": str(work), "DEADLINE_S": "120", "WHEELS": str(wheels),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **extra}


def _wheel(folder: Path, name: str, version: str, module_text: str) -> Path:
    """A minimal pure-Python wheel of package ``name`` (one ``__init__.py``), as pip builds one."""
    import zipfile

    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": module_text,
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{dist}/RECORD"])
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for f, text in files.items():
            archive.writestr(f, text)
    return path


def test_the_carried_wheels_are_installed_once_and_shadow_the_images_own_packages(tmp_path):
    """On the device the carried wheels must win over the image's copies (transformers 5.23 over its 5.17), and a
    warm machine's next call must not install them again. A carried torchao 99.0 over this environment's own: the
    stack step reports the carried one, and a second call finds the bundle in place and leaves it."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    wheels, site = tmp_path / "whl", tmp_path / "site"
    wheels.mkdir()
    _wheel(wheels, "torchao", "99.0", "__version__ = '99.0'\n")
    for call in ("one", "two"):
        out = tmp_path / call
        env = _session_env(out, tmp_path / f"work-{call}", wheels, SITE=str(site))
        done = subprocess.run(["bash", "kernels/gpu/gpu_session.sh", "stack"], cwd=root, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert json.loads((out / "stack.json").read_text())["torchao"] == "99.0"
        if call == "one":
            installed = (site / "torchao" / "__init__.py").stat().st_mtime_ns
    assert (site / "torchao" / "__init__.py").stat().st_mtime_ns == installed and (site / ".bundle").is_file()


def test_a_session_over_the_device_tools_file_limit_still_brings_back_its_reports_and_logs(tmp_path):
    """Past 16 MiB packed, session.tgz keeps the reports and logs only: the tests step's JUnit XML, the
    steps' stdout and stderr and the device's CSV among them (kernels/gpu/collect_gpu_session.py reads them)."""
    import os
    import subprocess
    import tarfile

    root = Path(__file__).resolve().parent.parent
    out, work = tmp_path / "out", tmp_path / "work"
    work.mkdir()
    (work / "activations.dat").write_bytes(os.urandom(16 << 20))   # incompressible, over the limit alone
    (work / "tests_gpu.xml").write_text("<testsuites/>")
    env = _session_env(out, work, wheels=tmp_path)
    subprocess.run(["bash", "kernels/gpu/gpu_session.sh", "stack"], cwd=root, env=env, capture_output=True, text=True,
                   timeout=300, check=True)
    assert (out / "session.tgz").stat().st_size < 16 << 20
    with tarfile.open(out / "session.tgz") as archive:
        names = {Path(n).name for n in archive.getnames()}
    assert {"tests_gpu.xml", "stack.out", "stack.err", "stack.json", "steps.tsv"} <= names
    assert "activations.dat" not in names


def test_a_sessions_calls_are_collected_into_the_gpu_files_with_every_target_met_or_missed(tmp_path):
    """Three calls' $OUT as the device tool brings them back: two dense halves with the MoE slice on an H100, the
    kernel call on an H200 (the tool starts one where no H100 opens). Each device keeps its own files; a recipe
    that died, or was not run, misses its target with no number instead of vanishing from the list."""
    import subprocess
    import tarfile

    collect = _kernels_script("collect_gpu_session")
    root = tmp_path / "repo"

    def call(name, files, cells=(), device="NVIDIA H100 80GB HBM3"):
        out, work = tmp_path / name / "out", tmp_path / name / "work"
        out.mkdir(parents=True)
        work.mkdir()
        for recipe, times in cells:   # a finished cell, or (recipe, log text) one that died
            _smoke_cell(work / "results", recipe, *((times,) if isinstance(times, list) else ([], None, times)))
        (work / "steps.tsv").write_text("stack\t0\t7\n")
        with tarfile.open(out / "session.tgz", "w:gz") as tar:
            tar.add(work, arcname=".")
        for f, content in {"stack.json": {"device": device, "torch": "2.11.0"}, **files}.items():
            (out / f).write_text(json.dumps(content))
        return out

    moe = {"device": "cuda: NVIDIA H100 80GB HBM3", "complete": True, "rows": [
        {"case": "tiny-moe", "grouped_over_bf16": 3.0},
        {"case": "qwen3-30b-a3b layers", "grouped_over_bf16": 1.4, "target_grouped_over_bf16": 1.5,
         "meets_target": True}]}
    memory = {"kind": "memory", "path": "triton quantize", "shape": [8192, 4096], "axis": -1, "seconds": 1.0,
              "fraction": 0.9}
    bench = {"device": "NVIDIA H200", "versions": {"torch": "2.11.0"}, "method": "do_bench", "rows": [memory],
             "ratios": {}}
    checks = {"device": "NVIDIA H100 80GB HBM3", "complete": True, "n_checks": 3, "n_failed": 1, "passed": False,
              "matmul": {"w4a16": {"passed": True}}}
    suite = tmp_path / "test_three.py"   # a real JUnit XML, as the tests step writes it: 1 passed, 1 failed, 1 skipped
    suite.write_text("import pytest\ndef test_a(): pass\ndef test_b(): assert False\n"
                     "@pytest.mark.skip\ndef test_c(): pass\n")
    junit = tmp_path / "tests_gpu.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", str(suite)],
                   cwd=tmp_path, capture_output=True, timeout=120)
    one = call("one", {"gpu_smoke_moe.json": moe},
               [("bf16", [50.0, 2.0, 2.0]), ("mxfp4", [90.0, 2.4, 2.4]), ("mxfp4+macro", "torch.OutOfMemoryError")])
    configs = {"device": "NVIDIA H100 80GB HBM3", "complete": True, "n_checks": 132, "n_failed": 0, "n_skipped": 2,
               "passed": True, "matmul": {}}
    two = call("two", {"checks.json": checks, "checks_configs.json": configs},
               [("bf16", [50.0, 4.0, 4.0]), ("mxfp4+fallback", [90.0, 7.0, 7.0])])
    (two / "tests_gpu.xml").write_text(junit.read_text())
    three = call("three", {"bench_memory1.json": bench}, device="NVIDIA H200")
    got = collect.collect([one, two, three], root)

    h100 = {t["target"]: (t["value"], t["met"]) for t in got["h100"]}
    assert h100["no gpu-smoke-quick recipe fails"] == (["mxfp4+macro", "mxfp4+aqn", "mxfp4+all"], False)
    assert h100["mxfp4 step / bf16 step"] == (pytest.approx(1.2), True)
    assert h100["mxfp4+fallback step / bf16 step"] == (pytest.approx(1.75), False)   # against its own call's bf16
    assert h100["mxfp4+macro step / bf16 step"] == (None, False)
    assert h100["MoE grouped MXFP4 step / bf16 step, qwen3-30b-a3b layers"] == (1.4, True)
    assert h100["every kernel bit-exact on the device (check_kernels.py)"] == ("2/3 checks, matmul ok", False)
    assert h100["every autotune config checked on the device (--every-config)"] == (
        "132/132 checks, 2 not runnable here (never picked)", True)
    assert h100["the suite's CUDA tests pass (pytest -m gpu)"] == ("1 passed, 1 failed, 0 errors, 1 skipped", False)
    assert [t["met"] for t in got["h200"]] == [True] and got["h200"][0]["source"] == "results/bench/bench_h200.json"
    dense = json.loads((root / "results/gpu/gpu_smoke_dense.json").read_text())
    assert [r["results"] for r in dense["runs"]] == ["results/gpu/calls/h100/call1/results",
                                                     "results/gpu/calls/h100/call2/results"]
    assert (root / "results/gpu/gpu_smoke_moe.json").is_file() and (root / "results/gpu/targets_h200.json").is_file()
    assert (root / "results/gpu/calls/h200/call1/steps.tsv").is_file()
    assert sorted(p.name for p in (root / "results/gpu/calls").iterdir()) == ["h100", "h200"]  # no staging left
    with pytest.raises(FileExistsError, match="h100/call1 exists"):   # a second collection overwrites nothing
        collect.collect([one], root)
    with pytest.raises(FileNotFoundError, match="not a gpu_session.sh call"):
        collect.collect([tmp_path / "one" / "work" / "results"], root)


def test_the_stats_patch_the_device_times_applies_to_this_tree_whole(tmp_path):
    """gpu_session.sh's stats-patch step applies kernels/gpu/patches/stats_fewer_instructions.patch, times it and
    reverts it. The patch had stopped applying when the kernels were reformatted (two of its three hunks
    failed, and patch(1) would have left the first one applied); now the step applies all or nothing, and
    this holds the patch to the tree, both ways."""
    import shutil
    import subprocess

    root = Path(__file__).resolve().parent.parent
    patch = root / "kernels" / "gpu" / "patches" / "stats_fewer_instructions.patch"
    kernels = tmp_path / "mxfp4" / "numerics" / "triton_kernels.py"
    kernels.parent.mkdir(parents=True)
    shutil.copyfile(root / "mxfp4" / "numerics" / "triton_kernels.py", kernels)
    original = kernels.read_text()
    subprocess.run(["git", "apply", str(patch)], cwd=tmp_path, check=True, capture_output=True)
    assert "_run_energy" in kernels.read_text()
    subprocess.run(["git", "apply", "-R", str(patch)], cwd=tmp_path, check=True, capture_output=True)
    assert kernels.read_text() == original


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


def test_the_gpu_session_runs_every_gpu_smoke_recipe_each_half_against_its_own_bf16():
    import re

    script = (Path(__file__).resolve().parent.parent / "kernels" / "gpu" / "gpu_session.sh").read_text()
    halves = [line.split() for line in re.findall(r"smoke-dense\d\) smoke_dense ([^;]+);;", script)]
    assert len(halves) == 2 and all(half[0] == "bf16" for half in halves)
    assert set().union(*halves) == set(load_profile("gpu-smoke-quick").recipes)


def test_the_gpu_session_returns_what_the_device_tool_can_bring_back(tmp_path):
    """The device tool brings back at most 8 files of $OUT, 16 MiB each, two folders deep, named in letters,
    digits, '.', '_' and '-': the session keeps its work apart and publishes flat files and one archive."""
    import re
    import subprocess
    import tarfile

    root = Path(__file__).resolve().parent.parent
    out, work = tmp_path / "out", tmp_path / "work"
    env = _session_env(out, work, wheels=tmp_path)
    done = subprocess.run(["bash", "kernels/gpu/gpu_session.sh", "stack", "checks"], cwd=root,
                          env={**env, "DEADLINE_S": "1"}, capture_output=True, text=True,
                          timeout=60)  # a deadline already past: both skipped
    assert "step stack skipped" in done.stderr and "step checks skipped" in done.stderr
    typo = subprocess.run(["bash", "kernels/gpu/gpu_session.sh", "stack", "smoke-dense"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)
    assert typo.returncode == 2 and "unknown step 'smoke-dense'" in typo.stderr  # refused before any step runs
    subprocess.run(["bash", "kernels/gpu/gpu_session.sh", "stack"], cwd=root, env=env, capture_output=True, text=True,
                   timeout=300, check=True)
    files = sorted(p.name for p in out.iterdir())
    assert files == ["session.tgz", "stack.json", "steps.tsv"] and all(p.is_file() for p in out.iterdir())
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in files)
    assert json.loads((out / "stack.json").read_text())["torch"] == torch.__version__
    with tarfile.open(out / "session.tgz") as archive:
        assert {"./stack_requirements.json", "./stack.err", "./steps.tsv"} <= set(archive.getnames())
    steps = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()]
    assert [s[:2] for s in steps] == [["stack", "skipped"], ["checks", "skipped"], ["stack", "0"]]

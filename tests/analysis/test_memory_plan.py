"""The GPU memory plan computed on CPU under FakeTensorMode."""

import json

import torch

from mxfp4.config.profiles import load_profile


def test_the_memory_plan_accounts_weights_and_adam_state_exactly_and_writes_each_recipe(tmp_path):
    """One layer of the real Qwen2.5-3B configuration under FakeTensorMode (nothing allocated): the
    parameter bytes equal the model's parameter count (counted on the meta device, an independent path)
    times 4 (fp32 masters), Adam's state twice that (to its step counters); the probe's two gradient sets
    make the gradients exceed one set; a quantized recipe's weight caches and saved operands add to
    BF16's peak."""

    from transformers import AutoModelForCausalLM

    from mxfp4.analysis import memory_plan as plan
    from mxfp4.rl.models import real_config

    out = tmp_path / "plan.json"
    plan.write_plan(load_profile("gpu-smoke-quick"), out, layers=1, recipes=["bf16", "mxfp4"])
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
    plan.write_plan(load_profile("gpu-smoke-quick"), out, layers=1, recipes=["bf16"])
    assert set(json.loads(out.read_text())["recipes"]) == {"bf16", "mxfp4"}
    plan.write_plan(load_profile("gpu-smoke-quick"), out, layers=2, recipes=["bf16"])
    assert set(json.loads(out.read_text())["recipes"]) == {"bf16"}

"""The multi-process path on CPU: a smoke cell trained by two processes (DDP over gloo), started by the
same launcher the Snakemake cell rule uses; both ranks must end with identical weights."""

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from mxfp4.config import EXPERIMENTS
from mxfp4.config.profiles import launch_prefix, load_profile

pytestmark = pytest.mark.slow  # trains cells in two processes

PROMISED = ["gsm8k_strict_accuracy", "mean_entropy", "mean_grad_cosine", "decomposition_weights", "mean_step_time",
            "rollout", "precision", "world_size", "weight_digests", "config_hash"]


def test_two_cpu_processes_train_one_cell_to_identical_weights(smoke_results, tmp_path):
    profile = load_profile("smoke-ddp")
    spec = profile.model("tiny-dense")
    shutil.copytree(smoke_results / "smoke" / "models" / "tiny-dense", tmp_path / "smoke-ddp" / "models" / "tiny-dense")
    command = shlex.split(launch_prefix(spec, sys.executable)) + [
        "cell", "--profile", "smoke-ddp", "--model", "tiny-dense", "--recipe", "mxfp4", "--seed", "0",
        "--results", str(tmp_path)]
    assert "torch.distributed.run" in command and "--nproc_per_node" in command
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MXFP4_THREADS": "1"}
    refused = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    assert refused.returncode != 0 and "mxfp4 probe-batch" in refused.stderr  # never a hang: say what to run
    # the probe batch comes first, from one process (the snakemake rule probe_batch)
    made = subprocess.run([sys.executable, "-m", "mxfp4", "probe-batch", "--profile", "smoke-ddp", "--model",
                           "tiny-dense", "--seed", "0", "--results", str(tmp_path)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert made.returncode == 0, made.stderr[-3000:]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    cell = tmp_path / "smoke-ddp" / "cells" / "tiny-dense" / "mxfp4" / "seed0"
    m = json.loads((cell / "metrics.json").read_text())
    for key in PROMISED:
        assert m.get(key) is not None, key
    assert m["world_size"] == 2 and len(m["weight_digests"]) == 2 and m["eval_n"] == 16  # both ranks share the eval
    assert m["weight_digests"][0] == m["weight_digests"][1]
    rows = [json.loads(line) for line in (cell / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]  # one writer: the main process
    assert "grad/cosine" in rows[0] and "mismatch/kl" in rows[0]


@pytest.mark.parametrize("config", ["ddp.yaml", "fsdp2.yaml", "zero3.yaml", "fsdp2_qwen3_moe_8gpu.yaml"])
def test_gpu_launch_configs_go_through_accelerate_launch_with_bf16_mixed_precision(config):
    from mxfp4.config.profiles import ModelSpec

    cfg = yaml.safe_load((EXPERIMENTS / "accelerate" / config).read_text())
    assert cfg["mixed_precision"] == "bf16" and cfg["use_cpu"] is False
    if cfg["distributed_type"] == "FSDP":
        assert cfg["fsdp_config"]["fsdp_version"] == 2
    if cfg["distributed_type"] == "DEEPSPEED":
        assert cfg["deepspeed_config"]["zero_stage"] == 3
    prefix = launch_prefix(ModelSpec(hub="Qwen/Qwen2.5-3B", processes=4, launch=config), "python")
    assert prefix.startswith("python -m accelerate.commands.launch --config_file ")
    assert prefix.endswith(f"{config} --num_processes 4 -m mxfp4")
    assert launch_prefix(ModelSpec(hub="Qwen/Qwen2.5-3B"), "python") == "python -m mxfp4"


def test_several_processes_without_a_launch_config_are_refused():
    from mxfp4.config.profiles import ModelSpec

    with pytest.raises(ValueError, match="needs launch"):
        ModelSpec(hub="Qwen/Qwen2.5-3B", processes=2)
    with pytest.raises(ValueError, match="no experiments/accelerate/nope.yaml"):
        ModelSpec(hub="Qwen/Qwen2.5-3B", processes=2, launch="nope.yaml")

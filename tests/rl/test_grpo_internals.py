"""Every touch of TRL's private API (mxfp4/rl/grpo.py, "TRL INTERNALS") against the pinned TRL."""

import inspect
import json
import math
import re
import time
from pathlib import Path

import pytest
import trl
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from mxfp4.config.recipes import Recipe
from mxfp4.corrections import Correction
from mxfp4.nn import patch_model
from mxfp4.rl.grpo import MXGRPOTrainer, StepLogger
from mxfp4.rl.models import build_tiny
from mxfp4.rl.training import common_args

CONSTRAINTS = Path(__file__).resolve().parents[2] / "constraints.txt"


def test_installed_trl_is_the_pinned_version():
    pins = dict(re.findall(r"^([\w-]+)==([\w.]+)", CONSTRAINTS.read_text(), re.M))
    assert trl.__version__ == pins["trl"], "the TRL internals below were checked against the pinned version only"


def test_the_private_names_exist_with_the_signatures_used():
    assert list(inspect.signature(GRPOTrainer._generate_and_score_completions).parameters) == ["self", "inputs"]
    from trl.generation.vllm_generation import VLLMGeneration

    assert callable(VLLMGeneration.sync_weights)
    assert list(inspect.signature(VLLMGeneration._iter_named_params).parameters) == ["self"]
    assert "_entropy_window_stats" in inspect.getsource(GRPOTrainer.__init__)


class Recorder(Correction):
    name = "recorder"

    def __init__(self):
        self.rollout_steps, self.observed, self.bound = [], [], None
        self.in_rollout = False

    def bind(self, total_steps, seed):
        self.bound = (total_steps, seed)

    def rollout_context(self, model, step):
        import contextlib

        @contextlib.contextmanager
        def ctx():
            self.rollout_steps.append(step)
            self.in_rollout = True
            yield
            self.in_rollout = False

        return ctx()

    def observe(self, metrics):
        self.observed.append(metrics)

    def metrics(self):
        return {"recorder/calls": float(len(self.rollout_steps))}


def _reward(completions, **kw):
    return [float(len(c) % 2) for c in completions]  # not all equal: advantages are non-zero


def _tiny_trainer(model, tok, steps: int, **trainer_kwargs) -> MXGRPOTrainer:
    """A trainer of ``steps`` GRPO steps on eight one-line prompts, four completions of at most 8 tokens each."""
    args = GRPOConfig(max_steps=steps, learning_rate=1e-4, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, top_k=0, beta=0.0, logging_steps=1, **common_args(0))
    data = Dataset.from_list([{"prompt": f"Question: {i}+1\nAnswer:"} for i in range(8)])
    return MXGRPOTrainer(model=model, reward_funcs=[_reward], args=args, train_dataset=data, processing_class=tok,
                         **trainer_kwargs)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grpo")
    model, tok = build_tiny("tiny-dense", seed=0)
    rec = Recorder()
    rec.bind(2, 7)
    patch_model(model, Recipe.named("mxfp4").quantizer([rec]))
    trainer = _tiny_trainer(model, tok, 2, corrections=[rec], probe_every=1)
    trainer.add_callback(StepLogger(trainer, tmp / "log.jsonl"))
    trainer.train()
    return trainer, rec, tmp / "log.jsonl"


def test_rollout_contexts_wrap_generation_and_hooks_see_every_step(trained):
    trainer, rec, log = trained
    assert rec.rollout_steps == [0, 1] and not rec.in_rollout
    assert [m["step"] for m in rec.observed] == [1, 2]
    assert all("entropy" in m and "grad/cosine" in m for m in rec.observed)
    lines = log.read_text().splitlines()
    assert len(lines) == 2 and '"recorder/calls": 1.0' in lines[0]


def test_shadow_pass_leaves_trl_metric_buffers_as_they_were(trained):
    trainer, _, _ = trained
    trainer._metrics["train"]["entropy"].append(123.0)
    snapshot = {k: list(v) for k, v in trainer._metrics["train"].items()}

    def mutate():
        trainer._metrics["train"]["entropy"].append(-1.0)
        trainer._entropy_window_stats = "changed"

    window = trainer._entropy_window_stats
    trainer._without_logging(mutate)
    assert {k: list(v) for k, v in trainer._metrics["train"].items()} == snapshot
    assert trainer._entropy_window_stats == window


# TRL's private names (GRPOConfig's public fields, such as use_vllm, are not among them).
PRIVATE_TRL = ("_generate_and_score_completions", "_get_per_token_logps_and_entropies", "_entropy_window_stats",
               "_metrics", "_iter_named_params", "vllm_generation", "current_gradient_accumulation_steps")


def test_private_trl_names_appear_only_inside_the_fenced_block():
    package = Path(__file__).resolve().parents[2] / "mxfp4"
    grpo = package / "rl" / "grpo.py"
    text = grpo.read_text()
    begin, end = text.index("TRL INTERNALS (begin)"), text.index("TRL INTERNALS (end)")
    outside = text[:begin] + text[end:]
    for name in PRIVATE_TRL:
        assert not re.search(rf"\b{name}\b", outside), f"{name} outside the fenced block of grpo.py"
    for path in package.rglob("*.py"):
        if path != grpo:
            found = [n for n in PRIVATE_TRL if re.search(rf"\b{n}\b", path.read_text())]
            assert not found, (path, found)


def test_the_logged_step_time_is_the_loggers_own_not_trls(tmp_path):
    """TRL logs a ``step_time`` of its own (the whole step, the probe included); the row keeps the
    logger's, which leaves the probe out."""
    import types

    trainer = types.SimpleNamespace(mx_corrections=[], take_step_metrics=dict)
    logger = StepLogger(trainer, tmp_path / "log.jsonl")
    logger.step_time, logger.probe_time = 0.25, 1.0
    state = types.SimpleNamespace(global_step=1, is_world_process_zero=True)
    logger.on_log(None, state, None, logs={"step_time": 1.25, "loss": 0.5})
    row = json.loads((tmp_path / "log.jsonl").read_text())
    assert (row["step_time"], row["probe_time"], row["loss"]) == (0.25, 1.0, 0.5)


class Perturber(Recorder):
    name = "perturber"

    def perturbs_rollout(self, step):
        return True  # the ledger then scores every step's rollouts under both policies


class StepClock(TrainerCallback):
    """Each step's wall time, from the trainer's own step hooks (registered after the logger's)."""

    def __init__(self):
        self.t0, self.walls = None, []

    def on_step_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self.walls.append(time.perf_counter() - self.t0)


@pytest.mark.slow
def test_the_ledgers_scoring_passes_are_timed_apart_from_the_step(tmp_path, monkeypatch):
    """The mismatch ledger's two scoring passes measure the run, as the probe does: a slow pass shows in
    ``ledger_time`` and not in ``step_time``, and the two add up to the step's wall time."""
    delay = 0.4
    scored = MXGRPOTrainer._completion_logps

    def slow(self, output):
        time.sleep(delay)
        return scored(self, output)

    monkeypatch.setattr(MXGRPOTrainer, "_completion_logps", slow)
    model, tok = build_tiny("tiny-dense", seed=0)
    patch_model(model, Recipe.named("mxfp4").quantizer())
    trainer = _tiny_trainer(model, tok, 2, corrections=[Perturber()])
    clock = StepClock()
    trainer.add_callback(StepLogger(trainer, tmp_path / "log.jsonl"))
    trainer.add_callback(clock)
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert len(rows) == len(clock.walls) == 2
    for row, wall in zip(rows, clock.walls):
        assert row["mismatch/measured"] == 1.0 and row["ledger_time"] >= 2 * delay
        assert row["step_time"] < wall - 2 * delay
        assert row["step_time"] + row["ledger_time"] == pytest.approx(wall, abs=0.05)


def test_a_step_whose_gradient_is_not_finite_stops_the_run_with_its_row_logged(tmp_path):
    """A NaN gradient (as bf16 kernels can make) turns every weight NaN at the optimizer step; the next
    rollout would then stop on a sampling assert far from the cause. The run stops at that step, saying so."""
    model, tok = build_tiny("tiny-dense", seed=0)
    model.lm_head.weight.register_hook(lambda g: g * float("nan"))
    trainer = _tiny_trainer(model, tok, 3)
    trainer.add_callback(StepLogger(trainer, tmp_path / "log.jsonl"))
    with pytest.raises(FloatingPointError, match="step 1: the gradient norm is nan"):
        trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and math.isnan(rows[0]["grad_norm"])


@pytest.mark.slow
def test_a_trainer_that_saves_nothing_leaves_no_folder_behind(tmp_path):
    """The throwaway output folder of a probe trainer exists while the process runs and is gone when it exits."""
    import os
    import subprocess
    import sys

    code = ("from mxfp4.rl.training import common_args; import os; d = common_args(0)['output_dir']; "
            "assert os.path.isdir(d); print(d)")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    folder = Path(out.stdout.strip().splitlines()[-1])
    assert folder.parent == tmp_path and not folder.exists()
    assert common_args(0, output_dir=tmp_path / "kept")["output_dir"] == str(tmp_path / "kept")

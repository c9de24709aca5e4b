"""Smoke cells end to end on CPU: warm-start, GRPO under a recipe, lm-eval, metrics.json."""

import hashlib
import json
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerFast

from mxfp4.config.profiles import load_profile
from mxfp4.config.run import Run
from mxfp4.layout import Layout
from mxfp4.rl.cell import run_cell
from mxfp4.rl.models import load

PROMISED_METRICS = [
    "gsm8k_strict_accuracy", "gsm8k_flexible_accuracy", "mean_entropy", "mean_grad_cosine", "decomposition_weights",
    "wall_time_seconds", "config", "config_hash", "versions", "git_commit", "correction_costs", "mean_rollout_accuracy",
    "mean_step_time", "mean_kl", "mean_probe_time", "mean_ledger_time", "mean_mismatch_kl", "rollout", "precision",
    "weight_update", "world_size", "weight_digests",
]
PROMISED_LOG = [
    "step",
    "step_time",
    "probe_time",
    "rollout_time",
    "ledger_time",
    "autotune_time",
    "rollout_autotune_time",
    "autotune_keys",
    "reward",
    "reward_std",
    "rewards/accuracy_reward/mean",
    "entropy",
    "kl",
    "mismatch/kl",
    "mismatch/is_ratio_p99",
]
TIMING = {"wall_time_seconds", "train_seconds", "mean_step_time", "mean_probe_time", "mean_ledger_time",
          "train_log_sha256"}  # the log holds its step times


@pytest.fixture(scope="module")
def results(smoke_results):
    return smoke_results


@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe"])
def test_saved_tiny_model_loads_like_a_checkpoint(results, model):
    m, tok = load(str(Layout(results, "smoke").model(model)))
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert tok.decode(tok("Question: 3+4").input_ids) == "Question: 3+4"
    meta = json.loads((Layout(results, "smoke").model(model) / "mxfp4_meta.json").read_text())
    assert 0 <= meta["embedded_test_greedy_accuracy"] <= 1


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe"])
@pytest.mark.parametrize("recipe", ["bf16", "mxfp4+all"])
def test_smoke_cell_writes_every_promised_field(results, model, recipe):
    m = run_cell(Run.of("smoke", results).cell(model, recipe, 0))
    for key in PROMISED_METRICS:
        assert key in m, key
    assert 0 <= m["gsm8k_strict_accuracy"] <= 1 and m["eval_n"] == 16
    cell = results / "smoke" / "cells" / model / recipe / "seed0"
    rows = [json.loads(line) for line in (cell / "train_log.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    for key in PROMISED_LOG:
        assert key in rows[0], key
    assert (cell / "eval" / "results.json").exists()
    assert m["rollout"]["backend"] == "hf" and m["precision"] == {"master_weights": "float32", "compute": "float32"}
    assert m["weight_update"]["n"] > 0 and m["weight_update"]["norm"] >= 0
    if recipe == "bf16":
        assert m["decomposition_weights"] is None and m["mean_grad_cosine"] is None
        assert all(r["mismatch/measured"] == 0.0 and r["mismatch/kl"] == 0.0 for r in rows)  # the same policy
    else:
        # AQN perturbs the rollout policy only (noise at rollout, none in training): the ledger measures
        # it on every step whose sigma is non-zero (stage 0 is noise-free)
        noisy = [r for r in rows if r["aqn/sigma"] > 0]
        assert noisy and all(r["mismatch/measured"] == 1.0 and r["mismatch/kl"] > 0 for r in noisy)
        assert all(r["mismatch/measured"] == 0.0 for r in rows if r["aqn/sigma"] == 0)
        assert "grad/rel_norm_error" in rows[0] and "decomp/activation/share_dead" in rows[0]
        assert "decomp/grad/share_scale" in rows[0] and "aqn/sigma" in rows[0]
        assert set(m["correction_costs"]) == {"outlier_fallback", "macro_block", "aqn"}


@pytest.mark.slow
def test_w4a16_rollouts_open_a_gap_the_ledger_measures_on_every_step(results):
    """W4A16 rollouts with W4A4 training: every step's rollouts come from another policy than the one trained,
    so the mismatch ledger measures a positive KL on each, and the record says what generated them."""
    m = run_cell(Run.of("smoke", results).cell("tiny-dense", "mxfp4+w4a16-rollouts", 0))
    cell = results / "smoke" / "cells" / "tiny-dense" / "mxfp4+w4a16-rollouts" / "seed0"
    rows = [json.loads(line) for line in (cell / "train_log.jsonl").read_text().splitlines()]
    assert rows and all(r["mismatch/measured"] == 1.0 and r["mismatch/kl"] > 0 for r in rows)
    assert m["rollout"]["precision"].startswith("W4A16")


@pytest.mark.slow
def test_a_cell_that_never_updates_its_weights_gains_exactly_nothing(results, tmp_path, monkeypatch):
    """Learning rate 0: the before- and after-RL evaluations score the same problems (lm-eval's doc
    hashes, read from the files) with the same weights, so the RL gain is exactly 0 for every problem;
    the unquantized evaluation of the same weights scores those problems too."""
    import shutil

    from mxfp4.layout import EVAL_FOLDERS
    from mxfp4.report.aggregate import read_items

    base = load_profile("smoke")
    frozen = base.model_copy(update={"grpo": base.grpo.model_copy(update={"learning_rate": 0.0})})
    shutil.copytree(Layout(results, "smoke").model("tiny-dense"), Layout(tmp_path, "smoke").model("tiny-dense"))
    m = run_cell(Run.of(frozen, tmp_path).cell("tiny-dense", "mxfp4", 0))
    assert m["weight_update"]["norm"] == 0.0
    assert m["gsm8k_rl_gain"] == 0.0 and m["gsm8k_strict_accuracy_before"] == m["gsm8k_strict_accuracy"]
    cell = Layout(tmp_path, "smoke").cell("tiny-dense", "mxfp4", 0)
    hashes = {}
    for stage, folder in EVAL_FOLDERS.items():
        rows = [json.loads(line) for f in (cell / folder).glob("samples_*.jsonl")
                for line in f.read_text().splitlines()]
        hashes[stage] = sorted({(r["doc_id"], r["doc_hash"]) for r in rows})
    assert len(hashes["after"]) == m["eval_n"] == 16 and hashes["before"] == hashes["after"] == hashes["unquantized"]
    items = read_items(Layout(tmp_path, "smoke"))
    assert len(items) == 16 and all(r["strict"] == r["strict_before"] for r in items)
    assert all("strict_unquantized" in r for r in items)


@pytest.mark.slow
def test_a_frozen_bf16_compute_cell_evaluates_every_stage_in_the_precision_it_trains_in(results, tmp_path, monkeypatch):
    """Learning rate 0 under bf16 compute (the GPU profiles' setting): accelerate wraps the model's forward in
    bf16 autocast when training starts, so an evaluation before training would run in float32 and the RL
    gain would measure the change of precision. Every stage must compute as training does: each reaches
    the layers under bf16 autocast, and the frozen weights answer every problem the same before and after."""
    import shutil

    import torch

    from mxfp4.layout import EVAL_FOLDERS
    from mxfp4.rl import cell as cell_module

    base = load_profile("smoke")
    frozen = base.model_copy(update={
        "grpo": base.grpo.model_copy(update={"learning_rate": 0.0}),
        "models": {"tiny-dense": base.models["tiny-dense"].model_copy(update={"compute": "bfloat16"})},
    })
    shutil.copytree(Layout(results, "smoke").model("tiny-dense"), Layout(tmp_path, "smoke").model("tiny-dense"))
    autocast, evaluate = {}, cell_module.evaluate

    def recording(run, stage):
        layer = next(m for name, m in run.model.named_modules() if name.endswith("q_proj"))
        hook = layer.register_forward_pre_hook(
            lambda m, args: autocast.setdefault(stage, set()).add(torch.get_autocast_dtype("cpu")
                                                                  if torch.is_autocast_enabled("cpu") else None))
        try:
            return evaluate(run, stage)
        finally:
            hook.remove()

    monkeypatch.setattr(cell_module, "evaluate", recording)
    m = run_cell(Run.of(frozen, tmp_path).cell("tiny-dense", "mxfp4", 0))
    assert autocast == {stage: {torch.bfloat16} for stage in ("before", "after", "unquantized")}
    cell = Layout(tmp_path, "smoke").cell("tiny-dense", "mxfp4", 0)
    answers = {stage: {r["doc_id"]: r["resps"] for f in (cell / EVAL_FOLDERS[stage]).glob("samples_*.jsonl")
                       for r in map(json.loads, f.read_text().splitlines())} for stage in ("before", "after")}
    assert len(answers["before"]) == 16 and answers["before"] == answers["after"]
    assert m["gsm8k_rl_gain"] == 0.0


def test_evaluations_of_other_problems_give_no_rl_gain(tmp_path):
    """Before- and after-RL evaluations that scored different problems are refused, not subtracted."""
    from mxfp4.layout import EVAL_FOLDERS
    from mxfp4.rl.cell import rl_gain

    for stage, doc in (("before", "a"), ("after", "b")):
        folder = tmp_path / EVAL_FOLDERS[stage]
        folder.mkdir()
        (folder / "samples_gsm8k_local.jsonl").write_text(json.dumps({"doc_id": 0, "doc_hash": doc}) + "\n")
    score = {"strict_match": 0.5, "flexible_extract": 0.5}
    with pytest.raises(ValueError, match="the before evaluation scored other problems"):
        rl_gain({"before": score, "after": score, "unquantized": score}, tmp_path)


def test_the_evaluation_before_training_leaves_the_random_streams_as_they_were():
    """lm-eval reseeds Python's, NumPy's and torch's generators; inside ``preserved_rng`` that reseeding
    is undone on exit, so training draws what it would have drawn without the evaluation."""
    import random

    import numpy as np
    import torch

    from mxfp4.rl.training import preserved_rng

    def draws():
        return random.random(), float(np.random.rand()), float(torch.rand(1))

    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    expected = draws()
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    with preserved_rng():
        torch.manual_seed(0), random.seed(0), np.random.seed(0)
        draws()
    assert draws() == expected


@pytest.mark.slow
def test_same_seed_gives_identical_metrics(results):
    first = run_cell(Run.of("smoke", results).cell("tiny-dense", "mxfp4+all", 1))
    second = run_cell(Run.of("smoke", results).cell("tiny-dense", "mxfp4+all", 1))
    strip = lambda m: {k: v for k, v in m.items() if k not in TIMING}  # noqa: E731
    assert strip(first) == strip(second)


def _readme_block(header: str) -> str:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index(header)
    return readme[start : readme.index("```", start)]


@pytest.mark.slow
def test_the_readme_plugin_correction_gets_the_step_count_in_a_real_cell(results, tmp_path, monkeypatch):
    """The README's example, verbatim: bind() gives it the run's length, observe() the step, and its
    metrics() land in the log; its split hook switches on halfway through the run."""
    from mxfp4 import corrections as corr

    (tmp_path / "my_corrections.py").write_text(_readme_block("# my_corrections.py"))
    (tmp_path / "my_recipes.yaml").write_text(_readme_block("# my_recipes.yaml"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MXFP4_PLUGINS", "my_corrections")
    monkeypatch.setenv("MXFP4_RECIPES", str(tmp_path / "my_recipes.yaml"))
    try:
        m = run_cell(Run.of("smoke", results).cell("tiny-dense", "mxfp4+clip", 0))
    finally:
        corr.REGISTRY.pop("clip_outliers", None)
        sys.modules.pop("my_corrections", None)  # other tests import their own my_corrections
    rows = [
        json.loads(line)
        for line in (results / "smoke/cells/tiny-dense/mxfp4+clip/seed0/train_log.jsonl").read_text().splitlines()
    ]
    assert [r["clip/active"] for r in rows] == [0.0, 0.0, 1.0]  # 3 steps, start 0.5: on from step 1.5
    assert m["correction_costs"] == {"clip_outliers": {"extra_bits_per_element": 0.0, "bf16_fraction": 0.0}}


@pytest.mark.slow
def test_rl_processes_do_not_import_torchao_through_transformers():
    """torchao (the kernel benchmark's peer) costs 4.6 s to import; transformers imports it with its
    model classes whenever it is installed. A model command of the CLI must not pay that."""
    import subprocess
    import sys

    code = (
        "import sys, mxfp4.cli; mxfp4.cli.hide_torchao_from_transformers(); "
        "from transformers import AutoModelForCausalLM; "
        "from trl import GRPOTrainer; import lm_eval.models.huggingface; print('torchao' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip().splitlines()[-1] == "False"


def test_a_partial_warm_start_is_refused_before_any_model_loads(tmp_path):
    """A folder left by a pretraining killed while saving (config.json only) is not a warm start."""
    from mxfp4.rl.cell import plan_cell

    folder = Layout(tmp_path, "smoke").model("tiny-dense")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="lacks model.safetensors, tokenizer.json, mxfp4_meta.json"):
        plan_cell(Run.of("smoke", tmp_path).cell("tiny-dense", "mxfp4", 0))


def test_saving_a_model_is_all_or_nothing(tmp_path, monkeypatch):
    from mxfp4.rl.models import build_tiny, missing_warm_start_files, save

    model, tok = build_tiny("tiny-dense")
    save(model, tok, tmp_path / "done", {"steps": 1})
    assert missing_warm_start_files(tmp_path / "done") == []

    def dies(*args, **kwargs):
        raise RuntimeError("killed while saving")

    monkeypatch.setattr(type(tok), "save_pretrained", dies)
    with pytest.raises(RuntimeError, match="killed while saving"):
        save(model, tok, tmp_path / "new", {"steps": 1})
    assert not (tmp_path / "new").exists()  # no half-written folder under the final name
    with pytest.raises(RuntimeError, match="killed while saving"):
        save(model, tok, tmp_path / "done", {"steps": 2})
    meta = json.loads((tmp_path / "done" / "mxfp4_meta.json").read_text())
    assert meta["steps"] == 1  # the old one intact, with the digests of the files it saved
    assert meta["digests"]["model.safetensors"] == hashlib.sha256((tmp_path / "done" / "model.safetensors")
                                                                  .read_bytes()).hexdigest()


def test_cached_problems_are_remade_when_the_settings_that_made_them_change(tmp_path):
    from mxfp4.rl.data import cell_data

    profile = load_profile("smoke")
    _, folder = cell_data(Run.of(profile, tmp_path))
    assert len((folder / "test.jsonl").read_text().splitlines()) == profile.data.n_eval == 16
    edited = profile.model_copy(update={"data": profile.data.model_copy(update={"n_eval": 8, "max_problem_steps": 2})})
    _, again = cell_data(Run.of(edited, tmp_path))
    assert again == folder and len((folder / "test.jsonl").read_text().splitlines()) == 8
    assert json.loads((folder / "settings.json").read_text())["max_problem_steps"] == 2


@pytest.mark.slow
def test_recipes_are_probed_on_one_common_batch(results):
    """Every quantized recipe of a model and seed takes its gradient probes on the same stored batch
    (made by the first cell that needs it); making it leaves the cell's own random stream untouched."""
    from mxfp4.rl.grpo import batch_digest
    from mxfp4.rl.probe_batch import load_probe_batch

    path = Layout(results, "smoke").probe_batch("tiny-dense", 2)
    path.unlink(missing_ok=True)
    made = run_cell(Run.of("smoke", results).cell("tiny-dense", "mxfp4", 2))  # makes the batch on the way
    digest = batch_digest(load_probe_batch(path))
    again = run_cell(Run.of("smoke", results).cell("tiny-dense", "mxfp4", 2))  # finds it stored
    other = run_cell(Run.of("smoke", results).cell("tiny-dense", "mxfp4+all", 2))
    assert made["probe_batches"] == other["probe_batches"] == [digest]
    strip = lambda m: {k: v for k, v in m.items() if k not in TIMING}  # noqa: E731
    assert strip(made) == strip(again)
    assert run_cell(Run.of("smoke", results).cell("tiny-dense", "bf16", 2))["probe_batches"] == []  # no probes


@pytest.mark.slow
def test_a_policy_that_never_solves_still_gets_a_probe_batch(results, monkeypatch):
    """Random weights (the GPU smoke runs) earn no reward: no group has non-zero advantages. The probe
    batch is then the first batch, said so, never an error that would stop every quantized cell."""
    from mxfp4.rl import data
    from mxfp4.rl.probe_batch import make_probe_batch

    monkeypatch.setattr(data, "accuracy_reward", lambda completions, **kw: [0.0] * len(completions))
    batch = make_probe_batch(Run.of("smoke", results).start("tiny-dense", 3))
    assert batch["advantages"].abs().max() == 0 and batch["completion_ids"].shape[0] == 2 * 4


def test_the_token_parity_reward_gives_a_random_policy_advantages_that_are_not_all_zero(results):
    """The GPU smoke profiles' reward: the probe batch (and every step) of a policy that never solves has
    non-zero advantages, so its backward is the real work."""
    from mxfp4.rl.probe_batch import make_probe_batch

    smoke = load_profile("smoke")
    parity = smoke.model_copy(update={"grpo": smoke.grpo.model_copy(update={"reward": "token_parity"})})
    batch = make_probe_batch(Run.of(parity, results).start("tiny-dense", 3))
    assert batch["advantages"].abs().max() > 0


@given(st.lists(st.lists(st.integers(0, 151_935), min_size=1, max_size=64), min_size=1, max_size=8))
def test_token_parity_is_complementary_under_a_shift_of_every_id(ids):
    """Shifting every id by one flips each parity: the two rewards of a completion sum to 1."""
    from mxfp4.rl.data import token_parity_reward

    shifted = [[t + 1 for t in c] for c in ids]
    got = token_parity_reward([""] * len(ids), ids)
    assert all(0 <= r <= 1 for r in got)
    back = token_parity_reward([""] * len(ids), shifted)
    assert [a + b for a, b in zip(got, back)] == pytest.approx([1.0] * len(ids))


def test_the_probe_batch_frees_its_policy_before_the_cell_loads_its_own(results, monkeypatch):
    """The probe batch samples with its own copy of the starting policy; at 3B on a GPU a copy kept
    alive by reference cycles (trainer <-> callbacks) would sit beside the cell's model (12 GB)."""
    import weakref

    from mxfp4.layout import Layout
    from mxfp4.rl import probe_batch
    from mxfp4.rl.probe_batch import ensure_probe_batch

    loaded, real_load = [], probe_batch.load

    def tracked(*args, **kw):
        model, tokenizer = real_load(*args, **kw)
        loaded.append(weakref.ref(model))
        return model, tokenizer

    monkeypatch.setattr(probe_batch, "load", tracked)
    Layout(results, "smoke").probe_batch("tiny-dense", 4).unlink(missing_ok=True)
    ensure_probe_batch(Run.of("smoke", results).start("tiny-dense", 4))
    assert len(loaded) == 1 and loaded[0]() is None


def test_weight_digests_are_sha256_of_names_and_float32_bytes_in_name_order():
    import hashlib
    import types

    from accelerate import Accelerator

    from mxfp4.rl.cell import weight_digests
    from mxfp4.rl.models import build_tiny

    model, _ = build_tiny("tiny-dense", seed=0)
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode() + p.detach().numpy().astype("float32").tobytes())
    trainer = types.SimpleNamespace(accelerator=Accelerator(cpu=True), model=model)
    assert weight_digests(trainer) == [h.hexdigest()]


@pytest.mark.slow
def test_probe_batches_of_several_seeds_in_one_process_match_one_process_each(results, tmp_path):
    """The probe-batch rule makes all of a model's seeds in one process, in any order: each batch must be the
    bytes a process of its own makes (each seeded and loaded on its own, nothing carried between them)."""
    import shutil
    import subprocess

    apart = Layout(results, "smoke")
    together = Layout(tmp_path, "smoke")
    shutil.copytree(apart.root / "models", together.root / "models")
    for seed in (6, 5):
        apart.probe_batch("tiny-dense", seed).unlink(missing_ok=True)
        subprocess.run([sys.executable, "-m", "mxfp4", "probe-batch", "--profile", "smoke", "--model", "tiny-dense",
                        "--seed", str(seed), "--results", str(results)], check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "mxfp4", "probe-batch", "--profile", "smoke", "--model", "tiny-dense",
                    "--seed", "6", "--seed", "5", "--results", str(tmp_path)], check=True, capture_output=True)
    for seed in (5, 6):
        a, b = apart.probe_batch("tiny-dense", seed), together.probe_batch("tiny-dense", seed)
        assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest(), seed
    assert apart.probe_batch("tiny-dense", 5).read_bytes() != apart.probe_batch("tiny-dense", 6).read_bytes()


def test_the_plan_resolves_the_data_the_trainer_and_the_evaluations_read(smoke_results):
    """plan_cell hands the trainer its data resolved once: the training problems and the evaluation folder are the
    run's own (``cell_data``, computed here again); a profile holding out questions only has no arithmetic folder
    (tests/rl/test_arithmetic_holdout.py runs one that has)."""
    from mxfp4.rl import data
    from mxfp4.rl.cell import plan_cell

    run = Run.of("smoke", smoke_results)
    plan = plan_cell(run.cell("tiny-dense", "mxfp4", 0))
    train, folder = data.cell_data(run)
    assert plan.train == tuple(train) and plan.eval_folder == folder and plan.arithmetic_folder is None
    assert len(plan.train) == load_profile("smoke").data.n_train

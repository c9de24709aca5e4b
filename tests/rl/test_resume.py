"""Checkpoint and resume: a smoke cell killed mid-run (SIGKILL, as a preempted job dies) continues from
its last checkpoint when rerun, not from step 0, and ends with the metrics of an uninterrupted run."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mxfp4.config.run import Run
from mxfp4.rl.cell import run_cell

pytestmark = pytest.mark.slow  # trains, kills and resumes cells

TIMING = {"wall_time_seconds", "train_seconds", "mean_step_time", "mean_probe_time", "mean_ledger_time",
          "resumed_from_step", "git_commit", "train_log_sha256"}  # the log holds its step times
ROW_TIMING = {"step_time", "probe_time", "rollout_time", "ledger_time", "peak_memory_gib", "peak_reserved_gib",
              "autotune_time", "rollout_autotune_time", "autotune_keys"}
CELL = ("smoke", "tiny-dense", "mxfp4+all", 0)  # AQN noise and fallback counts: run state to restore


def _cell_command(results: Path) -> list[str]:
    profile, model, recipe, seed = CELL
    return [sys.executable, "-m", "mxfp4", "cell", "--profile", profile, "--model", model, "--recipe", recipe,
            "--seed", str(seed), "--results", str(results)]


def _kill_after_first_checkpoint(results: Path, cell: Path, pattern: str = "checkpoint-*") -> None:
    """Start the cell in a subprocess and SIGKILL it as soon as a checkpoint matching ``pattern`` is complete."""
    env = {**os.environ, "MXFP4_THREADS": str(torch.get_num_threads())}  # float64 sums: same reduction order
    proc = subprocess.Popen(_cell_command(results), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 600
    try:
        while not list((cell / "checkpoints").glob(f"{pattern}/mxfp4_state.json")):
            assert proc.poll() is None, "the cell ended before its first checkpoint"
            assert time.time() < deadline, "no checkpoint within 10 minutes"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def _rows(cell: Path) -> list[dict]:
    rows = [json.loads(line) for line in (cell / "train_log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ROW_TIMING} for r in rows]


@pytest.fixture(scope="module")
def uninterrupted(smoke_results, tmp_path_factory):
    root = tmp_path_factory.mktemp("uninterrupted")
    shutil.copytree(smoke_results / "smoke" / "models", root / "smoke" / "models")
    metrics = run_cell(Run.of(CELL[0], root).cell(*CELL[1:]))
    return metrics, root / "smoke" / "cells" / "tiny-dense" / "mxfp4+all" / "seed0"


def test_a_killed_cell_resumes_from_its_checkpoint_and_ends_as_an_uninterrupted_run(smoke_results, uninterrupted,
                                                                                     tmp_path):
    expected, expected_cell = uninterrupted
    shutil.copytree(smoke_results / "smoke" / "models", tmp_path / "smoke" / "models")
    cell = tmp_path / "smoke" / "cells" / "tiny-dense" / "mxfp4+all" / "seed0"
    _kill_after_first_checkpoint(tmp_path, cell)
    assert not (cell / "metrics.json").exists()
    saved = sorted(
        int(p.parent.name.split("-")[1]) for p in (cell / "checkpoints").glob("checkpoint-*/mxfp4_state.json")
    )
    (cell / "train_log.jsonl").unlink(missing_ok=True)  # as snakemake --rerun-incomplete deletes the outputs

    resumed = run_cell(Run.of(CELL[0], tmp_path).cell(*CELL[1:]))
    assert resumed["resumed_from_step"] == saved[-1] and 1 <= saved[-1] < resumed["steps"]
    assert [r["step"] for r in _rows(cell)] == [1, 2, 3]
    for got, want in zip(_rows(cell), _rows(expected_cell)):
        assert got == want, {k: (got.get(k), want.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k)}
    strip = lambda m: {k: v for k, v in m.items() if k not in TIMING}  # noqa: E731
    assert strip(resumed) == strip(expected)
    assert not (cell / "checkpoints").exists()  # a complete cell keeps no checkpoint


def _checkpoint(root: Path, step: int, config_hash: str, content: bytes = b"weights") -> Path:
    """A checkpoint folder as StepLogger.on_save leaves it: a file, then the state with its manifest."""
    from mxfp4.rl.grpo import STATE_FILE, checkpoint_manifest, sealed_state

    folder = root / "checkpoints" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(content)
    state = sealed_state({"step": step, "config_hash": config_hash, "corrections": [],
                          "files": checkpoint_manifest(folder)})
    (folder / STATE_FILE).write_text(json.dumps(state))
    return folder


def test_a_checkpoint_of_another_configuration_is_not_resumed(tmp_path):
    """A checkpoint written under a different config hash (say, an edited profile) is ignored."""
    from mxfp4.rl.grpo import last_checkpoint

    folder = _checkpoint(tmp_path, 2, "old")
    assert last_checkpoint(tmp_path / "checkpoints", "new") is None
    assert last_checkpoint(tmp_path / "checkpoints", "old") == folder
    (tmp_path / "checkpoints" / "checkpoint-3").mkdir()  # no state file: an interrupted save
    assert last_checkpoint(tmp_path / "checkpoints", "old") == folder


@pytest.mark.parametrize("damage,why", [
    (lambda f: f.write_bytes(b"weightz"), "model.safetensors differs from its manifest"),  # flipped bytes
    (lambda f: f.write_bytes(b"weig"), "model.safetensors differs from its manifest"),  # truncated
    (lambda f: f.unlink(), "model.safetensors is missing"),
])
def test_a_damaged_checkpoint_is_passed_over_for_the_previous_valid_one(tmp_path, damage, why):
    from mxfp4.rl.grpo import last_checkpoint

    older = _checkpoint(tmp_path, 1, "h", b"older")
    newer = _checkpoint(tmp_path, 2, "h")
    damage(newer / "model.safetensors")
    heard = []
    assert last_checkpoint(tmp_path / "checkpoints", "h", lambda d, w: heard.append((d, w))) == older
    assert heard == [(newer, heard[0][1])] and why in heard[0][1]
    damage(older / "model.safetensors")
    assert last_checkpoint(tmp_path / "checkpoints", "h") is None


def _state_edit(edit):
    def damage(state_file):
        state = json.loads(state_file.read_text())
        state_file.write_text(json.dumps(edit(state)))
    return damage


@pytest.mark.parametrize("damage,why", [
    (_state_edit(lambda s: {**s, "step": s["step"] + 1}), "differs from its own digest"),  # one flipped step
    (_state_edit(lambda s: {**s, "corrections": [{"kept": [1, 2]}]}), "differs from its own digest"),
    (_state_edit(lambda s: None), "holds NoneType, not a JSON object"),
    (_state_edit(lambda s: []), "holds list, not a JSON object"),
])
def test_a_damaged_state_file_marks_a_damaged_checkpoint(tmp_path, damage, why):
    """The state file is inside the checksums: an edited step or correction state, or a state that is no JSON
    object, is passed over like a damaged weight file (the untouched checkpoint resumes first)."""
    from mxfp4.rl.grpo import STATE_FILE, last_checkpoint

    older = _checkpoint(tmp_path, 1, "h", b"older")
    newer = _checkpoint(tmp_path, 2, "h")
    assert last_checkpoint(tmp_path / "checkpoints", "h") == newer
    damage(newer / STATE_FILE)
    heard = []
    assert last_checkpoint(tmp_path / "checkpoints", "h", lambda d, w: heard.append(w)) == older
    assert len(heard) == 1 and why in heard[0]


def test_a_cell_whose_newest_checkpoint_is_corrupt_resumes_from_the_one_before_and_ends_as_uninterrupted(
        smoke_results, uninterrupted, tmp_path):
    """64 bytes of the newest checkpoint's weights flipped after a kill: the rerun says so, passes it over,
    and its metrics are those of an uninterrupted run (a clean start if no earlier checkpoint is valid)."""
    expected, _ = uninterrupted
    shutil.copytree(smoke_results / "smoke" / "models", tmp_path / "smoke" / "models")
    cell = tmp_path / "smoke" / "cells" / "tiny-dense" / "mxfp4+all" / "seed0"
    _kill_after_first_checkpoint(tmp_path, cell, pattern="checkpoint-2")
    newest = max((cell / "checkpoints").glob("checkpoint-*/mxfp4_state.json"),
                 key=lambda p: int(p.parent.name.split("-")[1])).parent
    weights = newest / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = bytes(b ^ 0xFF for b in data[-64:])
    weights.write_bytes(bytes(data))
    rerun = subprocess.run(_cell_command(tmp_path), capture_output=True, text=True, timeout=900,
                           env={**os.environ, "MXFP4_THREADS": str(torch.get_num_threads())})
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"not resuming from {newest.name}: model.safetensors differs from its manifest" in rerun.stdout
    resumed = json.loads((cell / "metrics.json").read_text())
    assert resumed["resumed_from_step"] in (None, *range(1, int(newest.name.split("-")[1])))
    strip = lambda m: {k: v for k, v in m.items() if k not in TIMING}  # noqa: E731
    assert strip(resumed) == strip(expected)


def test_a_cell_killed_after_its_last_checkpoint_evaluates_without_training_another_step(smoke_results, uninterrupted,
                                                                                         tmp_path):
    """Killed after the final step's checkpoint (during evaluation): the rerun resumes into evaluation
    and reports the uninterrupted run's metrics, never a step past max_steps."""
    expected, _ = uninterrupted
    shutil.copytree(smoke_results / "smoke" / "models", tmp_path / "smoke" / "models")
    cell = tmp_path / "smoke" / "cells" / "tiny-dense" / "mxfp4+all" / "seed0"
    _kill_after_first_checkpoint(tmp_path, cell, pattern=f"checkpoint-{expected['steps']}")
    assert not (cell / "metrics.json").exists()
    resumed = run_cell(Run.of(CELL[0], tmp_path).cell(*CELL[1:]))
    assert resumed["resumed_from_step"] == expected["steps"] == 3
    assert [r["step"] for r in _rows(cell)] == [1, 2, 3]
    strip = lambda m: {k: v for k, v in m.items() if k not in TIMING}  # noqa: E731
    assert strip(resumed) == strip(expected)


def test_two_writers_on_one_cell_are_refused_and_a_killed_writer_leaves_no_stale_lock(smoke_results, tmp_path):
    """While a process writes a cell (it holds the cell's lock), a second cell process on it fails at
    once, naming the lock; once the holder is killed with SIGKILL, the cell runs."""
    shutil.copytree(smoke_results / "smoke" / "models", tmp_path / "smoke" / "models")
    cell = tmp_path / "smoke" / "cells" / "tiny-dense" / "mxfp4+all" / "seed0"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from mxfp4.io import exclusive\n"
        f"with exclusive({str(cell)!r}, 'cell'):\n    print('locked', flush=True); time.sleep(600)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        second = subprocess.run(_cell_command(tmp_path), capture_output=True, text=True, timeout=600)
        assert second.returncode == 2 and "being written by another process" in second.stderr, second.stderr[-2000:]
        assert not (cell / "train_log.jsonl").exists()  # refused before writing anything
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    after = subprocess.run(_cell_command(tmp_path), capture_output=True, text=True, timeout=600)
    assert after.returncode == 0, after.stderr[-2000:]
    assert json.loads((cell / "metrics.json").read_text())["steps"] == 3

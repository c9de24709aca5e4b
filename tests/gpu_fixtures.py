"""Helpers of the GPU-path tests: the scripts of kernels/ loaded as modules, a finished (or dead)
gpu-smoke cell written by hand, and the environment of a gpu_session.sh run here."""

import importlib.util
import json
import os
import sys
from pathlib import Path


def kernels_script(name: str):
    """A script of kernels/bench/ or kernels/gpu/ (not packages) as a module."""

    kernels = Path(__file__).resolve().parents[1] / "kernels"
    [path] = [p for p in (kernels / "bench" / f"{name}.py", kernels / "gpu" / f"{name}.py") if p.is_file()]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def session_env(out: Path, work: Path, wheels: Path | str = "none", **extra: str) -> dict:
    """The environment of a kernels/gpu/gpu_session.sh run here: this Python first on PATH (python3 there),
    ``wheels`` as the carried bundle ("none": this environment has every package), a deadline that leaves
    the step room."""

    return {**os.environ, "OUT": str(out), "WORK": str(work), "DEADLINE_S": "120", "WHEELS": str(wheels),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **extra}


def smoke_cell(results, recipe, step_times, peak=None, log=None, autotune=None, grad_norm=0.5, commit="a" * 40):
    """A finished gpu-smoke-quick cell (rollout_time half of each step_time, every step's gradient norm
    ``grad_norm``), or only the log of one that died; ``autotune``: per step (autotune_time,
    rollout_autotune_time, autotune_keys) as StepLogger logs them."""
    from mxfp4.layout import TRAIN_LOG, Layout

    layout = Layout(results, "gpu-smoke-quick")
    if log is not None:  # a cell that died before its metrics: only its log
        layout.cell_log("qwen2.5-3b-random", recipe, 0).parent.mkdir(parents=True, exist_ok=True)
        layout.cell_log("qwen2.5-3b-random", recipe, 0).write_text(log)
        return
    cell = layout.cell("qwen2.5-3b-random", recipe, 0)
    cell.mkdir(parents=True)
    (cell / "metrics.json").write_text(json.dumps({"steps": len(step_times), "device": "NVIDIA H100 80GB HBM3",
                                                   "versions": {"torch": "2.11.0"}, "git_commit": commit}))
    tuned = [dict(zip(("autotune_time", "rollout_autotune_time", "autotune_keys"), t)) for t in autotune or []]
    (cell / TRAIN_LOG).write_text("".join(json.dumps({"step": i + 1, "step_time": s, "rollout_time": s / 2,
                                                      "peak_memory_gib": peak, "grad_norm": grad_norm,
                                                      "peak_reserved_gib": None if peak is None else peak + i,
                                                      **(tuned[i] if tuned else {})}) + "\n"
                                          for i, s in enumerate(step_times)))

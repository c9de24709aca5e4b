"""The GPU smoke report (``results/gpu/gpu_smoke_dense.json``): per recipe of a profile's cells, the step
and generation times as ratios to the bf16 cell of the same run, peak memory, the weight update and
the rollout backend; a recipe whose cell did not finish is reported as failed, with its log's tail.

Times are medians over the steps after the first (the first pays Triton autotuning and CUDA
warm-up); ``step_time`` excludes the probe (logged apart as ``probe_time``); ``rollout_time``
(generation and reward scoring) is part of ``step_time``. The targets of issue 11 on an H100 are
checked and recorded: W4A4 (``mxfp4``) step <= 1.3x BF16, outlier fallback <= 1.6x, macro-block <= 1.4x.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from ..layout import REFERENCE_RECIPE, TRAIN_LOG, Layout

TARGETS = {"mxfp4": 1.3, "mxfp4+fallback": 1.6, "mxfp4+macro": 1.4}


def _median_after_first(rows: list[dict], key: str) -> tuple[float | None, int]:
    vals = [r[key] for r in rows[1:] if r.get(key) is not None]
    return (statistics.median(vals), len(vals)) if vals else (None, 0)


def recipe_record(cell: Path, log: Path | None) -> dict:
    """What one cell measured, or why it has no metrics."""
    metrics = cell / "metrics.json"
    if not metrics.exists():
        tail = log.read_text()[-2000:] if log is not None and log.exists() else "no log"
        return {"status": "failed", "log_tail": tail}
    m = json.loads(metrics.read_text())
    rows = [json.loads(line) for line in (cell / TRAIN_LOG).read_text().splitlines() if line.strip()]
    step, n = _median_after_first(rows, "step_time")
    gen, _ = _median_after_first(rows, "rollout_time")
    probe = [r["probe_time"] for r in rows if r.get("probe_time")]
    peaks = [r["peak_memory_gib"] for r in rows if r.get("peak_memory_gib") is not None]
    return {"status": "ok", "steps": m["steps"], "timed_steps": n, "step_time_s": step, "rollout_time_s": gen,
            "probe_time_s": max(probe) if probe else None, "peak_memory_gib": max(peaks) if peaks else None,
            "weight_update": m.get("weight_update"), "rollout": m.get("rollout"), "precision": m.get("precision"),
            "mean_mismatch_kl": m.get("mean_mismatch_kl"), "device": m.get("device")}


def report(results: Path | str, profile: str, model: str, recipes: list[str], seed: int = 0) -> dict:
    layout = Layout(results, profile)
    per = {r: recipe_record(layout.cell(model, r, seed), layout.cell_log(model, r, seed)) for r in recipes}
    base = per.get(REFERENCE_RECIPE, {})
    for name, rec in per.items():
        if rec["status"] != "ok" or base.get("status") != "ok":
            continue
        for key in ("step_time_s", "rollout_time_s"):
            if rec[key] is not None and base[key]:
                rec[key.replace("_s", "_vs_bf16")] = rec[key] / base[key]
        if name in TARGETS and "step_time_vs_bf16" in rec:
            rec["target_step_time_vs_bf16"] = TARGETS[name]
            rec["meets_target"] = rec["step_time_vs_bf16"] <= TARGETS[name]
    some = next((json.loads((layout.cell(model, r, seed) / "metrics.json").read_text())
                 for r in recipes if per[r]["status"] == "ok"), {})
    return {"profile": profile, "model": model, "seed": seed, "device": some.get("device"),
            "versions": some.get("versions"), "git_commit": some.get("git_commit"),
            "method": "median over steps 2..N of each cell (step 1 excluded: autotuning and warm-up); ratios to the "
                      "bf16 cell of the same run; step_time excludes the probe",
            "failed": [r for r, rec in per.items() if rec["status"] != "ok"], "recipes": per}


def run(results: Path | str, profile: str, out: Path | str) -> dict:
    from ..config.profiles import load_profile

    p = load_profile(profile)
    if len(p.models) != 1 or len(p.seeds) != 1:
        raise ValueError(f"the GPU smoke report reads one model and one seed; profile {profile!r} has "
                         f"{len(p.models)} models and {len(p.seeds)} seeds")
    rec = report(results, profile, next(iter(p.models)), list(p.recipes), p.seeds[0])
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rec, indent=2) + "\n")
    return rec

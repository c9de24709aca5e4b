"""The GPU smoke report (``results/gpu/gpu_smoke_dense.json``): per recipe of a profile's cells, the step
and generation times as ratios to the bf16 cell of the same run, peak memory (beside the memory plan's),
the weight update and the rollout backend; a recipe whose cell did not finish is reported as failed, with
its log's tail, and so is one whose gradient was zero at every step (its times would not be of the real
work). Several runs (results folders, e.g. the two halves of ``kernels/gpu/gpu_session.sh``, each with its
own bf16 cell) are joined: each recipe is timed within its run, and the bf16 cells of the runs
against each other.

The method in full: docs/methods.md, ``mxfp4.report.gpu_smoke``."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from ..config.profiles import load_profile
from ..io import write_json_atomic
from ..layout import METRICS, REFERENCE_RECIPE, TRAIN_LOG, Layout

# a step's time against the same run's bf16 step, per recipe; a quantized recipe's rollout against bf16's
TARGETS = {"mxfp4": 1.3, "mxfp4+aqn": 1.4, "mxfp4+fallback": 1.4, "mxfp4+macro": 1.4, "mxfp4+all": 1.5,
           "mxfp4+rht-sr": 1.5}
ROLLOUT_TARGET = 1.3


def _median_after_first(rows: list[dict], key: str, less: str) -> tuple[float | None, int]:
    """The median of ``key`` net of ``less`` (the autotuning inside it; absent in logs written before it was
    logged: 0) over the steps after the first, and how many steps."""
    vals = [r[key] - (r.get(less) or 0.0) for r in rows[1:] if r.get(key) is not None]
    return (statistics.median(vals), len(vals)) if vals else (None, 0)


def _most(rows: list[dict], key: str) -> float | None:
    """The largest ``key`` over the steps that logged one (on GPU only), or None."""
    vals = [r[key] for r in rows if r.get(key) is not None]
    return max(vals) if vals else None


def recipe_record(cell: Path, log: Path | None) -> dict:
    """What one cell measured, or why it has no metrics."""
    metrics, steps = cell / METRICS, cell / TRAIN_LOG
    rows = [json.loads(line) for line in steps.read_text().splitlines() if line.strip()] if steps.exists() else []
    if not metrics.exists():
        tail = log.read_text()[-2000:] if log is not None and log.exists() else "no log"
        rec = {"status": "failed", "log_tail": tail,  # the last step it logged: what the trace may not say
               "last_logged_step": {k: rows[-1].get(k) for k in ("step", "loss", "grad_norm", "reward_std")}
               if rows else None}
        if len(rows) > 1:  # stopped after some steps (in its evaluations, say): the steps it logged are timed
            rec["step_time_s"], rec["timed_steps"] = _median_after_first(rows, "step_time", less="autotune_time")
            rec["rollout_time_s"], _ = _median_after_first(rows, "rollout_time", less="rollout_autotune_time")
        return rec
    m = json.loads(metrics.read_text())
    step, n = _median_after_first(rows, "step_time", less="autotune_time")
    gen, _ = _median_after_first(rows, "rollout_time", less="rollout_autotune_time")
    tuned = {"seconds": sum(r.get("autotune_time") or 0.0 for r in rows[1:]),
             "keys": sum(r.get("autotune_keys") or 0 for r in rows[1:])}
    probe = [r["probe_time"] for r in rows if r.get("probe_time")]
    ledger = [r["ledger_time"] for r in rows[1:] if r.get("ledger_time") is not None]  # outside step_time
    norms = [r["grad_norm"] for r in rows if r.get("grad_norm") is not None]
    if not norms or not any(norms):  # a step that multiplies zero advantages is not the work being timed
        return {"status": "failed", "why": f"the gradient norm is 0 at every one of {len(rows)} steps (or never "
                "logged): no group's reward varied, so no step did the real backward work", "steps": len(rows)}
    return {"status": "ok", "zero_gradient_steps": sum(1 for g in norms if g == 0), "steps": m["steps"],
            "timed_steps": n, "step_time_s": step, "rollout_time_s": gen,
            "autotuning_in_timed_steps": tuned,
            "kernels_autotuned": any(r.get("autotune_keys") for r in rows),  # False: each space's first config
            "probe_time_s": max(probe) if probe else None,
            "ledger_time_s": statistics.median(ledger) if ledger else None,
            "peak_memory_gib": _most(rows, "peak_memory_gib"),
            "peak_reserved_gib": _most(rows, "peak_reserved_gib"),
            "weight_update": m.get("weight_update"), "rollout": m.get("rollout"), "precision": m.get("precision"),
            "mean_mismatch_kl": m.get("mean_mismatch_kl"), "device": m.get("device")}


def run_records(layout: Layout, model: str, recipes: list[str], seed: int = 0) -> dict:
    """The recipes run under one results folder (one device call), each timed against that run's bf16 cell;
    a recipe with neither a cell nor a log was not run there and is left out."""
    per = {r: recipe_record(layout.cell(model, r, seed), layout.cell_log(model, r, seed)) for r in recipes
           if layout.cell(model, r, seed).exists() or layout.cell_log(model, r, seed).exists()}
    base = per.get(REFERENCE_RECIPE, {})
    for name, rec in per.items():
        if base.get("status") != "ok" or rec.get("step_time_s") is None:  # a failed cell's logged steps count
            continue
        for key in ("step_time_s", "rollout_time_s"):
            if rec.get(key) is not None and base[key]:
                rec[key.replace("_s", "_vs_bf16")] = rec[key] / base[key]
        if name in TARGETS and "step_time_vs_bf16" in rec:
            rec["target_step_time_vs_bf16"] = TARGETS[name]
            rec["meets_target"] = rec["step_time_vs_bf16"] <= TARGETS[name]
        if name in TARGETS and "rollout_time_vs_bf16" in rec:
            rec["target_rollout_time_vs_bf16"] = ROLLOUT_TARGET
            rec["meets_rollout_target"] = rec["rollout_time_vs_bf16"] <= ROLLOUT_TARGET
    return per


def run_entry(layout: Layout, model: str, recipes: list[str], seed: int = 0) -> dict:
    """One run's part of the report: its results folder, its provenance from its first finished cell (runs of
    different sessions ran different trees) and its recipes' records (``run_records``)."""
    per = run_records(layout, model, recipes, seed)
    done = [r for r in recipes if per.get(r, {}).get("status") == "ok"]
    m = json.loads(layout.metrics(model, done[0], seed).read_text()) if done else {}
    return {"results": str(layout.results), "git_commit": m.get("git_commit"), "versions": m.get("versions"),
            "device": m.get("device"), "recipes": per}


def report(layouts: list[Layout], model: str, recipes: list[str], seed: int = 0, plan: dict | None = None) -> dict:
    """The report of one profile's runs (``layouts``: its run under each results folder, one a device call)."""
    if not layouts:
        raise ValueError("the GPU smoke report needs at least one results folder")
    profiles = {layout.profile for layout in layouts}
    if len(profiles) > 1:
        raise ValueError(f"the GPU smoke report reads the runs of one profile; got {', '.join(sorted(profiles))}")
    runs = [run_entry(layout, model, recipes, seed) for layout in layouts]
    return from_runs(runs, layouts[0].profile, model, recipes, seed, plan)


def from_runs(runs: list[dict], profile: str, model: str, recipes: list[str], seed: int = 0,
              plan: dict | None = None) -> dict:
    """Every run's records (``run_entry``: measured now, or a stored report's ``runs``), and per recipe the record
    of the first run where it finished, else of the first run that has it (a later session's finished cell stands
    over an earlier one that died); the bf16 cells of different runs timed against each other (an A/A check of the
    machines); the memory plan's peak beside each measured one."""
    if not runs:
        raise ValueError("the GPU smoke report needs at least one run")
    per_run = [run["recipes"] for run in runs]
    merged: dict[str, dict] = {}
    for index, per in enumerate(per_run):
        for name, rec in per.items():
            kept = merged.get(name)
            if kept is None or (kept["status"] != "ok" and rec["status"] == "ok"):
                merged[name] = {**rec, "run": index}
    for name in recipes:
        merged.setdefault(name, {"status": "not run"})
    if plan is not None and plan.get("profile") != profile:
        plan = {"method": f"not compared: the memory plan is of profile {plan.get('profile')!r}, not {profile!r}"}
    planned = (plan or {}).get("recipes", {})
    for name, rec in merged.items():
        if name in planned and rec.get("peak_memory_gib") is not None:
            rec["planned_peak_gib"] = planned[name]["peak_gib"]
            rec["measured_over_planned_peak"] = rec["peak_memory_gib"] / planned[name]["peak_gib"]
    bf16 = [per[REFERENCE_RECIPE]["step_time_s"] for per in per_run
            if per.get(REFERENCE_RECIPE, {}).get("status") == "ok" and per[REFERENCE_RECIPE]["step_time_s"]]
    known = [r for r in runs if r["git_commit"] or r["versions"] or r["device"]]
    some = known[0] if known else {}
    commits = list(dict.fromkeys(r["git_commit"] for r in known))
    return {"profile": profile, "model": model, "seed": seed, "device": some.get("device"),
            "versions": some.get("versions"),
            "git_commit": commits[0] if len(commits) == 1 else commits or None,   # a list: the runs' trees differ
            "method": "median over steps 2..N of each cell (step 1 excluded: autotuning and warm-up), each step net "
                      "of the Triton autotuning inside it (host time of the launches that tuned a new key); ratios to "
                      "the bf16 cell of the same run (results folder, one device call); step_time excludes the probe; "
                      "peak memory: torch.cuda.max_memory_allocated over each step, probes included (the plan's "
                      "measure); peak reserved: torch.cuda.max_memory_reserved, what the caching allocator held",
            "runs": runs,
            "bf16_step_time_a_a": {"step_time_s": bf16, "max_over_min": max(bf16) / min(bf16)} if len(bf16) > 1
            else None,
            "memory_plan": (plan or {}).get("method"),
            "failed": [r for r, rec in merged.items() if rec["status"] == "failed"],
            "not_run": [r for r, rec in merged.items() if rec["status"] == "not run"], "recipes": merged}


def run(layouts: list[Layout], out: Path | str | None, plan: Path | str | None = None) -> dict:
    """The report of a one-model, one-seed profile's runs (``layouts``: its run under each results folder), written
    to ``out`` (None: returned only)."""
    if not layouts:
        raise ValueError("the GPU smoke report needs at least one results folder")
    profile = layouts[0].profile
    p = load_profile(profile)
    if len(p.models) != 1 or len(p.seeds) != 1:
        raise ValueError(f"the GPU smoke report reads one model and one seed; profile {profile!r} has "
                         f"{len(p.models)} models and {len(p.seeds)} seeds")
    plan_data = json.loads(Path(plan).read_text()) if plan is not None and Path(plan).exists() else None
    rec = report(layouts, next(iter(p.models)), list(p.recipes), p.seeds[0], plan_data)
    if out is not None:  # rewritten after every cell of a GPU session: never half-written at a timeout
        write_json_atomic(out, rec)
    return rec

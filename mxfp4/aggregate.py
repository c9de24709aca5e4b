"""Aggregate cells into tidy CSVs, and the small statistics (t intervals) that summaries and comparisons use."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

# two-sided 95% Student-t quantiles by degrees of freedom (1..30); the normal value beyond
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]

CELL_METRICS = [
    "gsm8k_strict_accuracy", "gsm8k_flexible_accuracy", "mean_reward", "mean_rollout_accuracy", "mean_entropy",
    "final_entropy", "mean_kl", "mean_grad_cosine", "mean_grad_rel_norm_error", "mean_step_time", "wall_time_seconds",
]
WEIGHT_KEYS = ["share_scale", "share_dead", "share_grid", "cross_share", "deadzone_fraction"]
STEP_KEYS = {
    "reward": "reward", "rollout_accuracy": "rewards/accuracy_reward/mean", "entropy": "entropy", "kl": "kl",
    "grad_cosine": "grad/cosine", "grad_rel_norm_error": "grad/rel_norm_error", "step_time": "step_time",
    "aqn_sigma": "aqn/sigma", "act_share_dead": "decomp/activation/share_dead", "act_share_scale": "decomp/activation/share_scale",
    "grad_share_scale": "decomp/grad/share_scale", "weight_share_scale": "decomp/weight/share_scale",
}
# Direction of improvement, for verdicts.
HIGHER_IS_BETTER = {
    "gsm8k_strict_accuracy": True, "gsm8k_flexible_accuracy": True, "mean_reward": True, "mean_rollout_accuracy": True,
    "mean_grad_cosine": True, "mean_grad_rel_norm_error": False, "mean_step_time": False,
}


def t975(df: float) -> float:
    if df < 1:
        return float("inf")
    return _T975[min(int(df), 30) - 1] if df <= 30 else 1.96


def mean_ci(values: list[float]) -> dict:
    """Mean, sample std and 95% t interval of the mean (interval undefined for one value)."""
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    n = len(vals)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "ci_low": None, "ci_high": None}
    m = sum(vals) / n
    if n == 1:
        return {"n": 1, "mean": m, "std": None, "ci_low": None, "ci_high": None}
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": m, "std": sd, "ci_low": m - half, "ci_high": m + half}


def welch_diff(a: list[float], b: list[float]) -> dict:
    """mean(a) - mean(b) with a 95% Welch interval (undefined with fewer than two values a side)."""
    a = [v for v in a if v is not None]
    b = [v for v in b if v is not None]
    if not a or not b:
        return {"diff": None, "ci_low": None, "ci_high": None, "n_a": len(a), "n_b": len(b)}
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    out = {"diff": ma - mb, "ci_low": None, "ci_high": None, "n_a": len(a), "n_b": len(b)}
    if len(a) < 2 or len(b) < 2:
        return out
    va = sum((v - ma) ** 2 for v in a) / (len(a) - 1) / len(a)
    vb = sum((v - mb) ** 2 for v in b) / (len(b) - 1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        out["ci_low"] = out["ci_high"] = out["diff"]
        return out
    df = (va + vb) ** 2 / ((va**2 / (len(a) - 1)) + (vb**2 / (len(b) - 1)))
    half = t975(df) * se
    out.update(ci_low=out["diff"] - half, ci_high=out["diff"] + half)
    return out


def verdict(d: dict, higher_is_better: bool | None = True) -> str:
    if d["diff"] is None:
        return "n/a"
    if d["ci_low"] is None:
        return "n/a (needs two seeds a side)"
    if d["ci_low"] <= 0 <= d["ci_high"]:
        return "no significant difference"
    if higher_is_better is None:
        return "higher" if d["diff"] > 0 else "lower"
    return "better" if (d["diff"] > 0) == higher_is_better else "worse"


def read_cells(results: Path | str, profile: str) -> tuple[list[dict], list[dict]]:
    """(one row per cell, one row per cell-step) from every metrics.json and train_log.jsonl."""
    cells, steps = [], []
    root = Path(results) / profile / "cells"
    for metrics in sorted(root.glob("*/*/seed*/metrics.json")):
        m = json.loads(metrics.read_text())
        row = {"profile": profile, "model": m["model"], "recipe": m["recipe"], "seed": m["seed"]}
        row.update({k: m.get(k) for k in CELL_METRICS})
        w = m.get("decomposition_weights") or {}
        row.update({f"weight_{k}": w.get(k) for k in WEIGHT_KEYS})
        costs = m.get("correction_costs") or {}
        row["extra_bits_per_element"] = sum(c.get("extra_bits_per_element", 0) for c in costs.values())
        row["bf16_fraction"] = sum(c.get("bf16_fraction", 0) for c in costs.values())
        row["config_hash"] = m.get("config_hash")
        cells.append(row)
        for line in (metrics.parent / "train_log.jsonl").read_text().splitlines():
            s = json.loads(line)
            steps.append({"model": m["model"], "recipe": m["recipe"], "seed": m["seed"], "step": s["step"],
                          **{k: s.get(src) for k, src in STEP_KEYS.items()}})
    return cells, steps


def summarize(cells: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        groups.setdefault((c["model"], c["recipe"]), []).append(c)
    out = []
    for (model, recipe), rows in sorted(groups.items()):
        for metric in CELL_METRICS + [f"weight_{k}" for k in WEIGHT_KEYS] + ["extra_bits_per_element", "bf16_fraction"]:
            out.append({"model": model, "recipe": recipe, "metric": metric, **mean_ci([r.get(metric) for r in rows])})
    return out


def write_csv(rows: list[dict], path: Path | str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(k for r in rows for k in r)) if rows else []
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    tmp.replace(path)


def read_csv(path: Path | str) -> list[dict]:
    """Rows with numbers parsed back (empty cells are None)."""
    def parse(v):
        if v == "" or v is None:
            return None
        try:
            f = float(v)
        except ValueError:
            return v
        return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f

    with Path(path).open() as f:
        return [{k: parse(v) for k, v in row.items()} for row in csv.DictReader(f)]


def aggregate(results: Path | str, profile: str, out: Path | str) -> dict:
    cells, steps = read_cells(results, profile)
    if not cells:
        raise ValueError(f"no finished cells under {Path(results) / profile / 'cells'}")
    out = Path(out)
    write_csv(cells, out / "cells.csv")
    write_csv(steps, out / "steps.csv")
    write_csv(summarize(cells), out / "summary.csv")
    return {"cells": len(cells), "steps": len(steps)}

"""Aggregate cells into tidy CSVs: one row per cell, one per cell-step, and per (model, recipe) means
with 95% t intervals over seeds (``mxfp4.stats``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from ..config.profiles import Profile
from ..io import atomic_path
from ..layout import ARITHMETIC_EVAL_FOLDERS, EVAL_FOLDERS, TABLES, Layout
from ..problems import DEFAULT_FLAWS, problem_type, type_groups
from ..stats import crossed_mean, mean_ci
from .cell_records import check_provenance, check_recipe, read_log, read_metrics, read_samples

CELL_METRICS = [
    "gsm8k_strict_accuracy", "gsm8k_strict_accuracy_before", "gsm8k_strict_accuracy_unquantized", "gsm8k_rl_gain",
    "gsm8k_flexible_accuracy", "mean_reward", "mean_rollout_accuracy", "mean_entropy",
    "final_entropy", "mean_kl", "mean_grad_cosine", "mean_grad_rel_norm_error", "mean_step_time", "wall_time_seconds",
]
# a cell of a profile that holds out arithmetic (data.holdout): the same accuracies on never-trained arithmetic
ARITHMETIC_METRICS = ["gsm8k_strict_accuracy_arithmetic", "gsm8k_strict_accuracy_before_arithmetic",
                      "gsm8k_rl_gain_arithmetic"]
MACHINE_COLUMNS = ["cpu", "cpu_capability", "blas", "threads", "cpu_pinning"]  # from metrics.json's machine
WEIGHT_KEYS = ["share_scale", "share_dead", "share_grid", "cross_share", "deadzone_fraction"]
STEP_KEYS = {
    "reward": "reward",
    "rollout_accuracy": "rewards/accuracy_reward/mean",
    "entropy": "entropy",
    "kl": "kl",
    "frac_reward_zero_std": "frac_reward_zero_std",  # below 1: some group's rewards differed (a learning signal)
    "grad_cosine": "grad/cosine",
    "grad_rel_norm_error": "grad/rel_norm_error",
    "step_time": "step_time",
    "aqn_sigma": "aqn/sigma",
    "act_share_dead": "decomp/activation/share_dead",
    "act_share_scale": "decomp/activation/share_scale",
    "grad_share_scale": "decomp/grad/share_scale",
    "weight_share_scale": "decomp/weight/share_scale",
}


def grid_cells(layout: Layout, profile: Profile, allow_missing: bool = False,
               outside_grid: bool = False) -> list[tuple[Path, dict]]:
    """(metrics.json, its validated content) of the finished cells of the profile's grid (models x recipes x
    seeds): a cell outside it is named and left out (``outside_grid``: kept), a grid cell not finished is an error
    naming it (``allow_missing``: named, and the rest aggregated)."""
    grid = {(m, r, s) for m in profile.models for r in profile.recipes for s in profile.seeds}
    found, outside = {}, []
    for metrics in layout.finished_cells():
        m = read_metrics(metrics)
        key = (m["model"], m["recipe"], m["seed"])
        if key in grid or outside_grid:
            found[key] = (metrics, m)
        else:
            outside.append(f"{key[0]}/{key[1]}/seed{key[2]}")
    if outside:
        print(f"aggregate: left out {len(outside)} cell(s) outside profile {profile.name!r}'s grid: "
              f"{', '.join(outside)} (--outside-grid keeps them)", file=sys.stderr)
    missing = [f"{m}/{r}/seed{s}" for m, r, s in sorted(grid - set(found), key=str)]
    if missing:
        what = f"{len(missing)} cell(s) of profile {profile.name!r}'s grid not finished under {layout.cells}: " + \
            ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        if not allow_missing:
            raise ValueError(f"{what}; run them (snakemake ablations), or aggregate the rest with --allow-missing")
        print(f"aggregate: {what} (aggregating the rest: --allow-missing)", file=sys.stderr)
    return sorted(found.values(), key=lambda pair: pair[0])


def _check_complete(path: Path, m: dict, profile: Profile) -> None:
    """A cell that ran the profile's every step and has every evaluation it records."""
    if m["steps"] != profile.grpo.max_steps:
        raise ValueError(f"{path}: steps {m['steps']}, but profile {profile.name!r} trains {profile.grpo.max_steps} "
                         "(grpo.max_steps); rerun the cell")
    stages = set(m.get("eval_stages") or {}) | {"after"}
    if m.get("gsm8k_strict_accuracy_before") is not None:
        stages.add("before")
    folders = {stage: EVAL_FOLDERS.get(stage, str(stage)) for stage in sorted(stages)}
    folders |= {f"{stage} arithmetic": f for stage, f in (m.get("eval_stages_arithmetic") or {}).items()}
    if profile.data.arithmetic_held_out and ARITHMETIC_METRICS[0] not in m:
        raise ValueError(f"{path}: profile {profile.name!r} holds out arithmetic and the cell has no evaluation on "
                         "it; rerun the cell")
    for stage, name in folders.items():
        folder = path.parent / name
        if not any(folder.glob("samples_*.jsonl")):
            raise ValueError(f"{folder}: the cell records its {stage} evaluation, and no lm-eval samples_*.jsonl is "
                             "there (its per-problem results are lost); rerun the cell")


def read_cells(layout: Layout, profile: Profile | None = None, allow_missing: bool = False,
               outside_grid: bool = False) -> tuple[list[dict], list[dict]]:
    """(one row per cell, one row per cell-step) of a run, from every finished cell's metrics.json and
    train_log.jsonl, each validated (``cell_records``) and, given the run's ``profile``, those of its grid
    (``grid_cells``), each checked to be made from what the profile and its recipe say now, with every step
    and every evaluation it records."""
    cells, steps = [], []
    cells_read = ([(p, read_metrics(p)) for p in layout.finished_cells()] if profile is None
                  else grid_cells(layout, profile, allow_missing, outside_grid))
    for metrics, m in cells_read:
        log = read_log(metrics, m)
        if profile is not None:
            check_provenance(metrics, m, profile)
            _check_complete(metrics, m, profile)
        else:  # a partial run (compare's): each cell under the recipe definition in force, at least
            check_recipe(metrics, m)
        row = {"profile": layout.profile, "model": m["model"], "recipe": m["recipe"], "seed": m["seed"]}
        row.update({k: m.get(k) for k in CELL_METRICS})
        row.update({k: m[k] for k in ARITHMETIC_METRICS if k in m})
        row["learning_signal_steps"] = learning_signal_steps(log)
        w = m.get("decomposition_weights") or {}
        row.update({f"weight_{k}": w.get(k) for k in WEIGHT_KEYS})
        costs = m.get("correction_costs") or {}
        row["extra_bits_per_element"] = sum(c.get("extra_bits_per_element", 0) for c in costs.values())
        row["bf16_fraction"] = sum(c.get("bf16_fraction", 0) for c in costs.values())
        row["config_hash"] = m.get("config_hash")
        row["setting_hash"] = m.get("setting_hash")
        machine = m.get("machine") or {}
        row["cpu"], row["cpu_capability"] = machine.get("cpu"), machine.get("aten_cpu_capability")
        row["blas"], row["threads"] = machine.get("blas"), machine.get("threads")
        pins = machine.get("pinning") or {}
        row["cpu_pinning"] = ",".join(f"{k}={v}" for k, v in pins.items() if v is not None) or None
        cells.append(row)
        for s in log:
            steps.append(
                {
                    "model": m["model"],
                    "recipe": m["recipe"],
                    "seed": m["seed"],
                    "step": s["step"],
                    **{k: s.get(src) for k, src in STEP_KEYS.items()},
                }
            )
    return cells, steps


def read_items(layout: Layout, keep: set | None = None, folders: dict[str, str] = EVAL_FOLDERS) -> list[dict]:
    """One row per (cell, GSM8K problem) from lm-eval's per-sample output: strict and flexible
    correctness after RL, with lm-eval's ``doc_id`` and ``doc_hash`` (two runs pair a problem on both),
    and, where the cell evaluated them, strict correctness before RL (``strict_before``) and of the
    trained weights unquantized (``strict_unquantized``), paired on the same doc hash. ``folders``: the
    evaluations read (``ARITHMETIC_EVAL_FOLDERS``: those on the never-trained arithmetic)."""
    items = []
    for metrics in layout.finished_cells():
        m = read_metrics(metrics)
        if keep is not None and (m["model"], m["recipe"], m["seed"]) not in keep:  # the cells aggregated, only
            continue
        flaws = cell_flaws(m)
        by_doc: dict[int, dict] = {}
        if not any((metrics.parent / folders["after"]).glob("samples_*.jsonl")):
            raise ValueError(f"{metrics.parent / folders['after']}: no lm-eval samples_*.jsonl beside a finished "
                             "cell (its per-problem results are lost); rerun the cell")
        for stage, folder in folders.items():
            for samples in sorted((metrics.parent / folder).glob("samples_*.jsonl")):
                for s in read_samples(samples):
                    row = by_doc.setdefault(
                        s["doc_id"],
                        {"model": m["model"], "recipe": m["recipe"], "seed": m["seed"], "doc_hash": s["doc_hash"],
                         "doc_id": s["doc_id"], "problem_type": problem_type(s.get("target") or "", flaws)},
                    )
                    if row["doc_hash"] != s["doc_hash"]:
                        raise ValueError(f"{samples}: problem {s['doc_id']} is not the one the cell's other "
                                         "evaluations scored (doc hashes differ)")
                    kind = "strict" if s["filter"] == "strict-match" else "flexible"
                    if stage == "after":
                        row[kind] = float(s["exact_match"])
                    elif kind == "strict":
                        row[f"strict_{stage}"] = float(s["exact_match"])
        if "unquantized" in folders and "unquantized" not in (m.get("eval_stages") or {}) \
                and m.get("gsm8k_strict_accuracy_unquantized") is not None:
            for row in by_doc.values():  # a full-precision recipe: its after-RL evaluation is the unquantized one
                row["strict_unquantized"] = row.get("strict")
        items += by_doc.values()
    return items


def cell_flaws(metrics: dict) -> tuple[str, ...]:
    """The planted flaws of a cell's warm start, as its recorded setting gives them (one subtraction flaw
    where it names none)."""
    pretrain = (metrics.get("setting") or {}).get("pretrain") or {}
    return tuple(pretrain.get("flaws", DEFAULT_FLAWS))


RL_GAIN_PER_PROBLEM = "gsm8k_rl_gain (per problem)"
# Embedded problems with a step of a planted flaw (all of them, then each flaw where there are several) and
# the others.
PROBLEM_TYPES = ("flaw", "flaw:subtraction", "flaw:multiplication", "rest")


def typed(metric: str, kind: str) -> str:
    """The summary metric of one problem type: ``gsm8k_rl_gain (per problem, flaw problems)``."""
    return metric.replace(" (per problem)", f" (per problem, {kind} problems)")


def _crossed_row(model, recipe, metric, rows, value) -> dict:
    est = crossed_mean([value(r) for r in rows], [(r["doc_id"], r["doc_hash"]) for r in rows],
                       [r["seed"] for r in rows])
    return {"model": model, "recipe": recipe, "metric": metric, "n": est["n"], "mean": est["mean"],
            "ci_low": est["ci_low"], "ci_high": est["ci_high"], "seeds": est["cols"], "p": est["p"],
            "method": f"{est['interval']}: {est['rows']} problems x {est['cols']} seeds"}


def rl_gain_rows(items: list[dict], silent: frozenset | set = frozenset()) -> list[dict]:
    """Per (model, recipe): the RL gain paired by problem and seed (strict correctness after RL minus
    before, the same lm-eval doc), problems and seeds crossed random factors (``stats.crossed_mean``:
    every problem is evaluated under every seed, so the problems pair across seeds too). Where the
    problems have types (the embedded generator's: ``flaw``, ``rest``), the same per type, and the
    accuracies before and after RL per type (an RL gain on the planted flaw is not a gain on the rest). The cells
    of ``silent`` ((model, recipe, seed) without a learning signal, ``no_learning_signal``) are left out."""
    groups: dict[tuple, list[dict]] = {}
    for r in items:
        if (r["model"], r["recipe"], r["seed"]) in silent:
            continue
        if r.get("strict") is not None and r.get("strict_before") is not None:
            groups.setdefault((r["model"], r["recipe"]), []).append(r)
    def gain(r):
        return r["strict"] - r["strict_before"]

    out = []
    for (model, recipe), rows in sorted(groups.items()):
        out.append(_crossed_row(model, recipe, RL_GAIN_PER_PROBLEM, rows, gain))
        for kind in PROBLEM_TYPES:
            of_kind = [r for r in rows if kind in type_groups(r.get("problem_type"))]
            if not of_kind:
                continue
            out.append(_crossed_row(model, recipe, typed(RL_GAIN_PER_PROBLEM, kind), of_kind, gain))
            for stage, key in (("gsm8k_strict_accuracy_before", "strict_before"), ("gsm8k_strict_accuracy", "strict")):
                out.append(_crossed_row(model, recipe, typed(f"{stage} (per problem)", kind), of_kind,
                                        lambda r, key=key: r[key]))
    return out


def learning_signal_steps(log: list[dict]) -> int | None:
    """Steps of a cell's GRPO run with a learning signal: some group's rewards differed, so some advantage was
    non-zero (TRL's ``frac_reward_zero_std`` below 1); None where the log does not record it."""
    fractions = [s["frac_reward_zero_std"] for s in log if s.get("frac_reward_zero_std") is not None]
    return sum(1 for f in fractions if f < 1) if fractions else None


def no_learning_signal(cell: dict) -> bool:
    """A cell whose GRPO never had a learning signal (every advantage zero at every step): its weights never
    moved by the policy gradient, so its RL gain is no measurement of RL, not a gain of 0."""
    return cell.get("learning_signal_steps") == 0


RL_GAIN_METRICS = {"gsm8k_rl_gain", "gsm8k_rl_gain_arithmetic"}


def summarize(cells: list[dict]) -> list[dict]:
    """Per (model, recipe) and metric, the mean over seeds with a 95% t interval (one value per cell); the RL gain
    leaves out cells without a learning signal (``no_learning_signal``), and its method says how many."""
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        groups.setdefault((c["model"], c["recipe"]), []).append(c)
    out = []
    for (model, recipe), rows in sorted(groups.items()):
        silent = [r for r in rows if no_learning_signal(r)]
        arithmetic = [k for k in ARITHMETIC_METRICS if any(k in r for r in rows)]
        for metric in CELL_METRICS + arithmetic + [f"weight_{k}" for k in WEIGHT_KEYS] + ["extra_bits_per_element",
                                                                                           "bf16_fraction"]:
            kept, method = rows, "t over seeds (one value per cell)"
            if metric in RL_GAIN_METRICS and silent:
                kept = [r for r in rows if not no_learning_signal(r)]
                method += (f"; {len(silent)} of {len(rows)} cells had no learning signal (every advantage zero) and "
                           "are left out: no RL happened there")
            out.append({"model": model, "recipe": recipe, "metric": metric, **mean_ci([r.get(metric) for r in kept]),
                        "method": method})
    return out


def write_csv(rows: list[dict], path: Path | str) -> None:
    """Rows (dicts; the union of their keys, in first-seen order) as a CSV, atomically."""
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with atomic_path(path) as tmp:
        pd.DataFrame(rows, columns=fields).to_csv(tmp, index=False)


def read_csv(path: Path | str) -> list[dict]:
    """Rows as dicts with pandas' column types (empty cells are None)."""
    df = pd.read_csv(path)
    return df.astype(object).where(df.notna(), None).to_dict("records")


def aggregate(layout: Layout, out: Path | str | None = None, profile: Profile | None = None,
              allow_missing: bool = False, outside_grid: bool = False) -> dict:
    """The run's aggregate tables (``layout.table``), written to ``out`` (default: the run's aggregate
    folder) under their own names; given the run's ``profile``, exactly its grid (``read_cells``), every
    cell's provenance checked first."""
    cells, steps = read_cells(layout, profile, allow_missing, outside_grid)
    if not cells:
        raise ValueError(f"no finished cells under {layout.cells}")
    out = layout.aggregate if out is None else Path(out)
    write_csv(cells, out / TABLES["cells"])
    write_csv(steps, out / TABLES["steps"])
    items = read_items(layout, {(c["model"], c["recipe"], c["seed"]) for c in cells})
    silent = {(c["model"], c["recipe"], c["seed"]) for c in cells if no_learning_signal(c)}
    write_csv(summarize(cells) + rl_gain_rows(items, silent), out / TABLES["summary"])
    if items:
        write_csv(items, out / TABLES["items"])
    counts = {"cells": len(cells), "steps": len(steps), "items": len(items)}
    kept = {(c["model"], c["recipe"], c["seed"]) for c in cells if ARITHMETIC_METRICS[0] in c}
    if kept:  # the cells evaluated on never-trained arithmetic
        arithmetic = read_items(layout, kept, ARITHMETIC_EVAL_FOLDERS)
        write_csv(arithmetic, out / TABLES["items_arithmetic"])
        counts["items_arithmetic"] = len(arithmetic)
    return counts

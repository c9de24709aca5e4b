"""Compare a recipe's cells against stored baselines: per metric, the difference of means over seeds
(paired by seed where both sides have the same seeds: same initialisation, data order and sampling
RNG; a 95% Welch interval otherwise), and a verdict (better / worse / no significant difference).

Step times are compared only as ratios to a bf16 cell of the same run and seed (``step_time_vs_bf16``):
absolute seconds of two runs may come from two machines, so they get no verdict."""

from __future__ import annotations

import json
from pathlib import Path

from ..io import write_text_atomic
from ..layout import REFERENCE_RECIPE
from ..stats import HIGHER_IS_BETTER, paired_diff, verdict, welch_diff
from .aggregate import CELL_METRICS, MACHINE_COLUMNS, WEIGHT_KEYS, read_cells, read_csv, read_items

COMPARED = ["gsm8k_strict_accuracy", "gsm8k_flexible_accuracy", "mean_rollout_accuracy", "mean_entropy",
            "mean_grad_cosine", "mean_grad_rel_norm_error", "step_time_vs_bf16", "mean_step_time"]
TIMINGS = {"mean_step_time"}  # shown, never judged: the stored baselines may come from another machine
HIGHER_IS_BETTER = {**HIGHER_IS_BETTER, "step_time_vs_bf16": False}


def with_time_ratio(cells: list[dict]) -> list[dict]:
    """Each cell with ``step_time_vs_bf16``: its mean step time over the bf16 cell's of the same run,
    model and seed (None where that run has no such bf16 cell)."""
    bf16 = {(c["model"], c["seed"]): c.get("mean_step_time") for c in cells if c["recipe"] == REFERENCE_RECIPE}
    out = []
    for c in cells:
        ref, t = bf16.get((c["model"], c["seed"])), c.get("mean_step_time")
        out.append({**c, "step_time_vs_bf16": t / ref if t is not None and ref else None})
    return out


def difference(mine: list[dict], theirs: list[dict], metric: str) -> dict:
    """Paired by seed when both sides have the same seeds, else Welch; says which in ``method``."""
    a = {int(r["seed"]): r.get(metric) for r in mine}
    b = {int(r["seed"]): r.get(metric) for r in theirs}
    if set(a) == set(b) and len(a) >= 2:
        seeds = sorted(a)
        d = paired_diff([a[s] for s in seeds], [b[s] for s in seeds])
        return {"diff": d["diff"], "ci_low": d["ci_low"], "ci_high": d["ci_high"], "n_a": d["n"], "n_b": d["n"],
                "method": "paired by seed (t)"}
    return {**welch_diff(list(a.values()), list(b.values())), "method": "Welch (seeds differ)"}


def item_difference(mine: list[dict], theirs: list[dict], key: str = "strict") -> dict | None:
    """Problem by problem: the (seed, problem) pairs both sides answered, McNemar's exact test on the
    discordant ones (``scipy.stats.binomtest``). None when no pair is shared."""
    from scipy.stats import binomtest

    theirs_by = {(int(r["seed"]), int(r["doc_id"]), r["doc_hash"]): r.get(key) for r in theirs}
    pairs = [(r.get(key), theirs_by[k]) for r in mine
             if (k := (int(r["seed"]), int(r["doc_id"]), r["doc_hash"])) in theirs_by]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    if not pairs:
        return None
    gained = sum(1 for a, b in pairs if a > b)
    lost = sum(1 for a, b in pairs if a < b)
    p = binomtest(gained, gained + lost, 0.5).pvalue if gained + lost else 1.0
    return {"diff": (gained - lost) / len(pairs), "ci_low": None, "ci_high": None, "n_a": len(pairs), "n_b": len(pairs),
            "p": float(p), "method": f"McNemar exact over (seed, problem) pairs: {gained} gained, {lost} lost"}


def compare_rows(new: list[dict], baselines: list[dict], recipe: str, new_items=(), base_items=()) -> list[dict]:
    out = []
    models = sorted({r["model"] for r in new})
    for model in models:
        mine = [r for r in new if r["model"] == model and r["recipe"] == recipe]
        for base in sorted({r["recipe"] for r in baselines if r["model"] == model}):
            theirs = [r for r in baselines if r["model"] == model and r["recipe"] == base]
            for metric in COMPARED:
                d = difference(mine, theirs, metric)
                v = verdict(d, HIGHER_IS_BETTER.get(metric))
                if metric in TIMINGS:
                    v = "no verdict (seconds of different runs may come from different machines; see step_time_vs_bf16)"
                out.append({"model": model, "recipe": recipe, "baseline": base, "metric": metric, **d, "verdict": v})
            d = item_difference([r for r in new_items if r["model"] == model and r["recipe"] == recipe],
                                [r for r in base_items if r["model"] == model and r["recipe"] == base])
            if d is not None:
                v = "no significant difference" if d["p"] >= 0.05 else ("better" if d["diff"] > 0 else "worse")
                out.append(
                    {
                        "model": model,
                        "recipe": recipe,
                        "baseline": base,
                        "metric": "gsm8k_strict_accuracy (per problem)",
                        **d,
                        "verdict": v,
                    }
                )
    return out


def _fmt(v):
    return "—" if v is None else f"{v:+.4f}"


def setting_check(new: list[dict], baselines: list[dict]) -> str:
    """Whether the new cells and the baselines were made with the same profile setting and code
    version (``setting_hash``), in one sentence."""
    mine = {r.get("setting_hash") for r in new}
    theirs = {r.get("setting_hash") for r in baselines}
    if None in theirs or None in mine:
        return ("The baselines (or the new cells) carry no setting hash: whether they share the profile's setting "
                "cannot be checked.")
    if mine == theirs:
        return f"Same profile setting and code version as the baselines (setting hash {', '.join(sorted(mine))})."
    return (
        f"WARNING: the setting differs from the baselines' (new {', '.join(sorted(mine))}, baselines "
        f"{', '.join(sorted(theirs))}): a profile value or the code version changed, so differences mix both."
    )


def markdown(rows: list[dict], recipe: str, check: str = "") -> str:
    lines = [
        f"# `{recipe}` against the reference recipes",
        "",
        "Difference = mean over seeds of the new recipe minus the baseline's; 95% interval paired by seed",
        "(Welch where the seeds differ). Step time is judged only as a ratio to the same run's bf16 cell.",
        "",
        *([check, ""] if check else []),
        "| model | baseline | metric | difference | 95% CI | method | seeds (new/base) | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ci = "—" if r["ci_low"] is None else f"[{r['ci_low']:+.4f}, {r['ci_high']:+.4f}]"
        lines.append(
            f"| {r['model']} | {r['baseline']} | {r['metric']} | {_fmt(r['diff'])} | {ci} | {r['method']} | "
            f"{r['n_a']}/{r['n_b']} | {r['verdict']} |"
        )
    return "\n".join(lines) + "\n"


# What a rerun of a stored cell must reproduce exactly: every result column (timings, the machine and
# the hashes aside).
REPRODUCED = [*(k for k in CELL_METRICS if k not in ("mean_step_time", "wall_time_seconds")),
              *(f"weight_{k}" for k in WEIGHT_KEYS), "extra_bits_per_element", "bf16_fraction"]


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def _find(rows: list[dict], model: str, recipe: str, seed) -> dict | None:
    """The row of cell (model, recipe, seed), or None."""
    return next((r for r in rows if (r["model"], r["recipe"], int(r["seed"])) == (model, recipe, int(seed))), None)


def reproduction(rerun: dict, stored: list[dict]) -> dict:
    """Whether ``rerun`` (a cell row made on this machine) equals the stored row of the same model,
    recipe and seed in every ``REPRODUCED`` value, bit for bit."""
    key = (rerun["model"], rerun["recipe"], int(rerun["seed"]))
    row = _find(stored, *key)
    if row is None:  # nothing to reproduce: the references must come from this machine
        row = {}
        differing = ["the whole cell (the stored baselines hold no such cell)"]
    else:
        differing = [k for k in REPRODUCED if not _same(rerun.get(k), row.get(k))]
    return {"cell": dict(zip(("model", "recipe", "seed"), key)), "compared": len(REPRODUCED),
            "differing": {k: [row.get(k), rerun.get(k)] for k in differing}, "reproduces": not differing,
            "machine_here": {k: rerun.get(k) for k in MACHINE_COLUMNS},
            "machine_stored": {k: row.get(k) for k in MACHINE_COLUMNS}}


def check_reproduction(results, profile: str, baselines_csv, cells: list[tuple[str, str, int]]) -> dict:
    """Rerun-here check: this run's ``cells`` (model, recipe, seed) against their stored rows; the
    stored baselines reproduce only if every one of them does."""
    mine, _ = read_cells(results, profile)
    stored = read_csv(baselines_csv)
    checks = []
    for model, recipe, seed in cells:
        row = _find(mine, model, recipe, seed)
        if row is None:
            raise ValueError(f"cell {model}/{recipe}/seed{seed} has not run in this results folder; run it first")
        checks.append(reproduction(row, stored))
    return {"reproduces": all(c["reproduces"] for c in checks), "cells": checks}


def references_note(check: dict, references: list[str]) -> str:
    """One sentence: which references the comparison used, and why."""
    names = [f"{c['cell']['model']}/{c['cell']['recipe']}/seed{c['cell']['seed']}" for c in check["cells"]]
    if check["reproduces"]:
        return (f"References: the stored baselines, which reproduce on this machine (rerun here, "
                f"{' and '.join(names)} equal their stored rows in all {check['cells'][0]['compared']} values).")
    bad = next(c for c in check["cells"] if not c["reproduces"])
    name = f"{bad['cell']['model']}/{bad['cell']['recipe']}/seed{bad['cell']['seed']}"
    return (f"References: this machine's cells of {', '.join(references)} (same seeds), not the stored baselines, "
            f"which do not reproduce here (cell {name}, rerun here, differs from its stored row in "
            f"{len(bad['differing'])} of {bad['compared']} values, e.g. {', '.join(list(bad['differing'])[:3])}; "
            f"machine here {bad['machine_here']}, stored {bad['machine_stored']}).")


def run_compare(results, profile: str, recipe: str, baselines_csv, out_md, figure_stem=None,
                reproduction_json=None) -> list[dict]:
    """The report of ``recipe``'s cells against references: the stored baselines when
    ``reproduction_json`` (from ``check_reproduction``) says they reproduce here, or when no check is
    given; else this run's own cells of the other recipes (same machine, same seeds)."""
    cells = with_time_ratio(read_cells(results, profile)[0])
    items = read_items(results, profile)
    new = [c for c in cells if c["recipe"] == recipe]
    if not new:
        raise ValueError(f"no finished cells of recipe {recipe!r} in profile {profile!r}; run them first")
    check = None if reproduction_json is None else json.loads(Path(reproduction_json).read_text())
    if check is not None and not check["reproduces"]:
        baselines = [c for c in cells if c["recipe"] != recipe]
        base_items = [i for i in items if i["recipe"] != recipe]
        if not baselines:
            raise ValueError("the stored baselines do not reproduce here and no reference cell has run here")
        note = references_note(check, sorted({b["recipe"] for b in baselines}))
    else:
        baselines = with_time_ratio(read_csv(baselines_csv))
        items_csv = Path(baselines_csv).with_name("items.csv")
        base_items = read_csv(items_csv) if items_csv.exists() else []
        note = references_note(check, []) if check is not None else (
            "References: the stored baselines, unchecked on this machine (no reproduction check given): "
            "differences may include the machine's.")
    models = {r["model"] for r in new}
    rows = compare_rows(new, baselines, recipe, items, base_items)
    check_line = setting_check(new, [b for b in baselines if b["model"] in models])
    write_text_atomic(out_md, markdown(rows, recipe, f"{note}\n\n{check_line}"))
    if figure_stem:
        from .plots import compare_figure

        compare_figure(rows, recipe, figure_stem)
    return rows

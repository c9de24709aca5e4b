"""Accuracy and RL gain per problem type (the planted flaw and the rest) in the summary table."""

import random

import pytest

from mxfp4.report.aggregate import RL_GAIN_PER_PROBLEM, rl_gain_rows, typed


def _items(types, seeds=(0, 1, 2), seed=0):
    rng = random.Random(seed)
    out = []
    for s in seeds:
        for i, kind in enumerate(types):
            before = float(rng.random() < (0.1 if kind == "flaw" else 0.9))
            after = float(rng.random() < 0.6)
            out.append({"model": "m", "recipe": "r", "seed": s, "doc_id": i, "doc_hash": f"h{i}",
                        "problem_type": kind, "strict_before": before, "strict": after})
    return out


def test_typed_rows_are_the_means_over_their_own_problems():
    items = _items(["flaw"] * 30 + ["rest"] * 50)
    rows = {r["metric"]: r for r in rl_gain_rows(items)}
    for kind in ("flaw", "rest"):
        mine = [r for r in items if r["problem_type"] == kind]
        gain = sum(r["strict"] - r["strict_before"] for r in mine) / len(mine)
        before = sum(r["strict_before"] for r in mine) / len(mine)
        got = rows[typed(RL_GAIN_PER_PROBLEM, kind)]
        assert abs(got["mean"] - gain) < 1e-12 and got["n"] == len(mine) and got["seeds"] == 3
        assert abs(rows[typed("gsm8k_strict_accuracy_before (per problem)", kind)]["mean"] - before) < 1e-12
        assert got["ci_low"] <= got["mean"] <= got["ci_high"]
    overall = sum(r["strict"] - r["strict_before"] for r in items) / len(items)
    assert abs(rows[RL_GAIN_PER_PROBLEM]["mean"] - overall) < 1e-12


def test_problems_without_a_type_get_no_typed_rows():
    items = _items([None] * 20)
    assert [r["metric"] for r in rl_gain_rows(items)] == [RL_GAIN_PER_PROBLEM]


def test_with_two_planted_flaws_each_flaw_all_flaws_and_the_rest_have_rows():
    """A problem with steps of both flaws counts in each flaw's rows and once in the 'flaw' rows."""
    kinds = ["flaw:subtraction"] * 10 + ["flaw:multiplication"] * 8 + ["flaw:subtraction+multiplication"] * 4 + \
        ["rest"] * 12
    items = _items(kinds)
    rows = {r["metric"]: r for r in rl_gain_rows(items)}
    per_seed = {"flaw": 22, "flaw:subtraction": 14, "flaw:multiplication": 12, "rest": 12}
    for kind, n in per_seed.items():
        mine = [r for r in items if r["problem_type"] == kind or (kind == "flaw" and r["problem_type"] != "rest")
                or (kind.startswith("flaw:") and kind[5:] in r["problem_type"])]
        got = rows[typed(RL_GAIN_PER_PROBLEM, kind)]
        assert got["n"] == len(mine) == 3 * n
        assert abs(got["mean"] - sum(r["strict"] - r["strict_before"] for r in mine) / len(mine)) < 1e-12


def test_the_accuracy_figure_draws_each_types_rl_gain_from_the_summary(tmp_path, monkeypatch):
    """cells.csv with summary.csv beside it: a third row of panels whose bars are the summary's per-type RL
    gains, per recipe and type; without typed rows, two rows."""
    import pandas as pd

    from mxfp4.report import plots

    cells = pd.DataFrame([{"model": m, "recipe": r, "seed": s, "gsm8k_strict_accuracy_before": 0.5,
                           "gsm8k_strict_accuracy": 0.7, "gsm8k_strict_accuracy_unquantized": 0.7,
                           "gsm8k_rl_gain": 0.2} for m in ("a", "b") for r in ("bf16", "mxfp4") for s in (0, 1)])
    cells.to_csv(tmp_path / "cells.csv", index=False)
    gains = {("a", "bf16", "flaw"): 0.6, ("a", "bf16", "rest"): -0.05, ("a", "mxfp4", "flaw"): 0.4,
             ("a", "mxfp4", "rest"): 0.01, ("b", "bf16", "flaw"): 0.3, ("b", "mxfp4", "rest"): -0.2}
    summary = pd.DataFrame([{"model": m, "recipe": r, "metric": typed(RL_GAIN_PER_PROBLEM, k), "n": 10, "mean": g,
                             "ci_low": g - 0.1, "ci_high": g + 0.1, "method": "crossed"}
                            for (m, r, k), g in gains.items()])
    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, stem: figures.append(fig) or [])
    summary.to_csv(tmp_path / "summary.csv", index=False)
    plots.accuracy_bars(tmp_path / "cells.csv", tmp_path / "acc")
    axes = figures[-1].axes
    assert len(axes) == 6
    drawn = {}
    for ax, model in ((axes[4], "a"), (axes[5], "b")):
        bars = [c for c in ax.containers if hasattr(c, "patches")]  # the bar containers (not the error bars)
        for container, label in zip(bars, [t.get_text() for t in ax.get_legend().get_texts()], strict=True):
            kind = label.split(" ")[0]
            for bar in container.patches:
                recipe = ("bf16", "mxfp4")[round(bar.get_x() + bar.get_width() / 2)]
                drawn[(model, recipe, kind)] = bar.get_height()
    assert drawn == pytest.approx(gains)
    summary[summary["metric"] == RL_GAIN_PER_PROBLEM].to_csv(tmp_path / "summary.csv", index=False)
    plots.accuracy_bars(tmp_path / "cells.csv", tmp_path / "acc")
    assert len(figures[-1].axes) == 4

"""Aggregation statistics, comparisons against baselines and the claims table."""

import pytest

from mxfp4.report.stats import mean_ci, verdict, welch_diff
from mxfp4.report.claims import build_claims
from mxfp4.report.compare import compare_rows


def _cells(recipe, accs, cos=(0.9, 0.91, 0.92), model="tiny-dense"):
    return [{"model": model, "recipe": recipe, "seed": i, "gsm8k_strict_accuracy": a, "gsm8k_flexible_accuracy": a,
             "mean_rollout_accuracy": a, "mean_entropy": 0.1 + a / 10, "mean_grad_cosine": c, "mean_grad_rel_norm_error": 1 - c,
             "mean_step_time": 0.5} for i, (a, c) in enumerate(zip(accs, cos))]


def test_a_recipe_identical_to_a_baseline_shows_no_significant_difference():
    base = _cells("mxfp4", [0.40, 0.45, 0.50])
    new = _cells("mine", [0.40, 0.45, 0.50])
    rows = compare_rows(new, base, "mine")
    assert rows and all(r["verdict"] == "no significant difference" for r in rows if r["metric"] != "mean_step_time")
    assert all(r["diff"] == pytest.approx(0) for r in rows)


def test_a_clearly_better_recipe_is_called_better_and_a_worse_one_worse():
    base = _cells("mxfp4", [0.40, 0.41, 0.42])
    better = compare_rows(_cells("good", [0.60, 0.61, 0.62]), base, "good")
    worse = compare_rows(_cells("bad", [0.20, 0.21, 0.22]), base, "bad")
    pick = lambda rows: next(r for r in rows if r["metric"] == "gsm8k_strict_accuracy")  # noqa: E731
    assert pick(better)["verdict"] == "better" and pick(better)["ci_low"] > 0
    assert pick(worse)["verdict"] == "worse"


def test_intervals_use_student_t_and_need_two_values():
    s = mean_ci([1.0, 2.0, 3.0])
    # t(0.975, 2) = 4.3027 (a printed table's 4.303, to its three decimals)
    assert s["mean"] == 2.0 and s["ci_high"] - s["mean"] == pytest.approx(4.303 * 1.0 / 3**0.5, abs=1e-3 / 3**0.5)
    assert mean_ci([1.0])["ci_low"] is None
    assert verdict(welch_diff([1.0], [2.0])) == "n/a (needs two seeds a side)"


def test_claims_report_held_and_not_held_honestly():
    cells = (_cells("bf16", [0.50, 0.52, 0.51]) + _cells("mxfp4", [0.30, 0.31, 0.32], cos=(0.80, 0.81, 0.82))
             + _cells("mxfp4+macro", [0.35, 0.36, 0.37], cos=(0.90, 0.91, 0.92)) + _cells("mxfp4+fallback", [0.30, 0.32, 0.31])
             + _cells("mxfp4+aqn", [0.3, 0.3, 0.3]) + _cells("mxfp4+all", [0.20, 0.22, 0.21]))
    proofs = {"max_identity_residual_rel": 0.0, "passed": True, "cases": [1, 2]}
    rows = build_claims(cells, proofs, [])
    by = {r["claim"].split(" (")[0]: r["held"] for r in rows}
    assert by["The three-way split is exact: MX(x) - x = e_scale + e_dead + e_grid"] == "held"
    assert by["Scale bias hurts gradient accuracy"] == "held"
    assert by["Combined corrections recover BF16 GSM8K accuracy"] == "contradicted"
    assert by["Deadzone truncation hurts rollout quality"].startswith("not shown")

"""Aggregation statistics, comparisons against baselines and the claims table."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mxfp4.report.claims import build_claims
from mxfp4.report.compare import compare_rows
from mxfp4.stats import mean_ci, verdict, welch_diff


def _cells(recipe, accs, cos=(0.9, 0.91, 0.92), model="tiny-dense", step=0.5, entropy=None):
    return [{"model": model, "recipe": recipe, "seed": i, "gsm8k_strict_accuracy": a, "gsm8k_flexible_accuracy": a,
             "mean_rollout_accuracy": a, "mean_entropy": (0.1 + a / 10) if entropy is None else entropy[i],
             "mean_grad_cosine": c, "mean_grad_rel_norm_error": 1 - c,
             "mean_step_time": step * (1 + 0.01 * i)} for i, (a, c) in enumerate(zip(accs, cos))]


def test_a_recipe_identical_to_a_baseline_shows_no_significant_difference():
    base = _cells("mxfp4", [0.40, 0.45, 0.50])
    new = _cells("mine", [0.40, 0.45, 0.50])
    rows = compare_rows(new, base, "mine")
    judged = [r for r in rows if r["metric"] not in ("mean_step_time", "step_time_vs_bf16")]
    assert judged and all(r["verdict"] == "no significant difference" for r in judged)
    assert all(r["diff"] == pytest.approx(0) for r in judged)
    assert all(r["method"] == "paired by seed (t)" for r in judged)
    ratio = next(r for r in rows if r["metric"] == "step_time_vs_bf16")
    assert ratio["diff"] is None and ratio["verdict"].startswith("n/a")  # no bf16 cell in either run


def test_step_times_are_judged_only_as_ratios_to_the_same_runs_bf16():
    """A new run on a machine 2.5x slower than the baselines' gets no timing verdict from seconds,
    and its ratio to its own bf16 cells matches the baselines'."""
    from mxfp4.report.compare import with_time_ratio

    base = with_time_ratio(_cells("bf16", [0.5, 0.5, 0.5], step=0.4) + _cells("mxfp4", [0.4, 0.4, 0.4], step=0.8))
    new = with_time_ratio(_cells("bf16", [0.5, 0.5, 0.5], step=1.0) + _cells("mine", [0.4, 0.4, 0.4], step=2.0))
    rows = compare_rows([c for c in new if c["recipe"] == "mine"], base, "mine")
    seconds = next(r for r in rows if r["metric"] == "mean_step_time" and r["baseline"] == "mxfp4")
    ratio = next(r for r in rows if r["metric"] == "step_time_vs_bf16" and r["baseline"] == "mxfp4")
    assert seconds["verdict"].startswith("no verdict") and seconds["diff"] > 1
    assert ratio["diff"] == pytest.approx(0) and ratio["verdict"] == "no significant difference"


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


def test_claims_are_paired_by_seed_holm_corrected_and_label_what_is_by_construction():
    # seed effects shared by every recipe: unpaired intervals would be wide, paired ones are tight
    shift = [0.0, 0.10, -0.08]
    acc = lambda base, d=0.0: [base + s + d + 0.002 * i for i, s in enumerate(shift)]  # noqa: E731
    cells = (_cells("bf16", acc(0.50), entropy=[0.10 + s for s in shift])
             + _cells("mxfp4", acc(0.30), cos=(0.80, 0.90, 0.70), entropy=[0.13 + s for s in shift])
             + _cells("mxfp4+macro", acc(0.35), cos=(0.85, 0.951, 0.752), entropy=[0.13 + s for s in shift])
             + _cells("mxfp4+fallback", acc(0.30, 0.0), entropy=[0.13 + s for s in shift])
             + _cells("mxfp4+all", acc(0.20), entropy=[0.12 + s for s in shift]))
    proofs = {"max_identity_residual_rel": 0.0, "passed": True, "cases": [1, 2]}
    corrections = [{"correction": "macro_block(blocks=4)", "source": "tiny-dense weights",
                    "energy_scale_before": 2.0, "energy_scale_after": 1.0}]
    rows = build_claims(cells, proofs, corrections, [])
    by = {(r["claim"].split(" (")[0], r["test"]): r for r in rows}
    assert by[("The three-way split is exact: MX(x) - x = e_scale + e_dead + e_grid", "numerical check")][
        "verdict"
    ].startswith("held")
    assert (
        by[("macro_block reduces the scale-bias energy it targets", "by construction")]["verdict"] == "by construction"
    )
    macro = by[("Scale bias dominates gradient accuracy", "indirect (correction, cells)")]
    assert macro["verdict"] == "held" and macro["p_holm"] >= macro["p"]  # paired: the seed shift cancels
    assert (
        welch_diff(
            [c["mean_grad_cosine"] for c in cells if c["recipe"] == "mxfp4+macro"],
            [c["mean_grad_cosine"] for c in cells if c["recipe"] == "mxfp4"],
        )["ci_low"]
        < 0
    )  # unpaired would not
    recovery = by[("Combined corrections recover BF16 GSM8K accuracy", "recovery: non-inferiority")]
    assert recovery["verdict"].startswith("contradicted")
    assert (
        by[("Deadzone truncation dominates rollout quality", "indirect (correction, cells)")]["verdict"] == "not shown"
    )
    assert all(r["mde80"] is not None for r in rows if r["test"].startswith(("indirect", "recovery")))


def test_direct_claims_come_from_the_pathway_contrasts():
    pathways = [
        {
            "model": "tiny-dense",
            "checkpoint": "warm",
            "injection": "+scale vs +dead",
            "site": "both",
            "layer": "total",
            "metric": "gradient_harm_contrast",
            "mean": "0.2",
            "ci_low": "0.1",
            "ci_high": "0.3",
            "n": "12",
            "p": "",
            "method": "",
        },
        {
            "model": "tiny-dense",
            "checkpoint": "warm",
            "injection": "+dead vs +grid",
            "site": "forward",
            "layer": "total",
            "metric": "rollout_harm_contrast",
            "mean": "-0.01",
            "ci_low": "-0.05",
            "ci_high": "0.03",
            "n": "24",
            "p": "",
            "method": "",
        },
    ]
    proofs = {"max_identity_residual_rel": 0.0, "passed": True, "cases": [1]}
    rows = [r for r in build_claims([], proofs, [], pathways) if r["test"].startswith("direct")]
    assert [r["verdict"] for r in rows] == ["held", "not shown"]
    assert rows[1]["n_needed"] is None  # an estimate of the wrong sign: no n resolves it


def test_per_problem_comparison_is_mcnemar_on_the_discordant_pairs():
    from mxfp4.report.compare import item_difference

    def items(recipe, correct):
        return [
            {"model": "m", "recipe": recipe, "seed": s, "doc_id": i, "doc_hash": f"h{i}", "strict": float(c)}
            for s in (0, 1)
            for i, c in enumerate(correct)
        ]

    base = items("b", [1] * 20 + [0] * 20)
    same = item_difference(items("a", [1] * 20 + [0] * 20), base)
    assert same["diff"] == 0 and same["p"] == 1.0 and same["n_a"] == 80
    better = item_difference(items("a", [1] * 20 + [1] * 10 + [0] * 10), base)  # 20 gained, 0 lost over 80 pairs
    assert better["diff"] == 0.25 and better["p"] < 1e-5 and "20 gained, 0 lost" in better["method"]
    other_problems = [dict(r, doc_hash="x" + r["doc_hash"]) for r in items("a", [1] * 40)]
    assert item_difference(other_problems, base) is None  # a different test set pairs nothing


@given(st.floats(0.01, 10), st.floats(0.05, 5), st.booleans())
def test_n_needed_is_the_smallest_n_whose_design_power_detects_the_effect(sd, effect, one_sided):
    """The bisection against a direct scan (design power falls with n)."""
    from mxfp4.report.claims import design_power, n_needed

    n = n_needed(effect, sd, one_sided)
    scan = next((k for k in range(2, 20_000) if design_power(sd, k, one_sided) <= effect), None)
    if scan is not None:
        assert n == scan
    else:
        assert n is None or n >= 20_000

"""The compare report as one family of verdicts: the answer first (primary contrasts against the
recipe's base and BF16), intervals that match the adjusted verdicts, the power figures of a null
result, and the family-wise rate of false verdicts when a recipe is compared with itself."""

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mxfp4.report.compare import ALPHA, PER_PROBLEM, TIMINGS, answer_line, compare_rows, markdown
from mxfp4.stats import mcnemar_diff, mcnemar_pairs_needed, n_needed

FIRED = ("better", "worse", "higher", "lower")
METRICS = ["gsm8k_strict_accuracy", "gsm8k_flexible_accuracy", "mean_rollout_accuracy", "mean_entropy",
           "mean_grad_cosine", "mean_grad_rel_norm_error"]
STORED = Path(__file__).resolve().parents[2] / "results" / "baselines" / "embedded" / "cells.csv"


def _cell(model, recipe, seed, **values):
    return {"model": model, "recipe": recipe, "seed": seed, "mean_step_time": 1.0, **values}


def _items(model, recipe, correct_by_seed):
    return [{"model": model, "recipe": recipe, "seed": s, "doc_id": i, "doc_hash": f"h{i}", "strict": float(c)}
            for s, correct in enumerate(correct_by_seed) for i, c in enumerate(correct)]


def _setting(shift_new=0.0, seeds=3):
    """bf16 (0.50), mxfp4 (0.40) and a new recipe based on mxfp4, accuracy per seed with a seed
    effect shared by every recipe, and 100 problems a seed."""
    seed_effect = [0.0, 0.02, -0.01, 0.015, -0.005][:seeds]
    cells = []
    for recipe, acc in (("bf16", 0.50), ("mxfp4", 0.40), ("mine", 0.40 + shift_new)):
        jitter = [0.0, 0.006, -0.004, 0.002, -0.003] if recipe == "mine" else [0.0] * 5
        cells += [_cell("tiny-dense", recipe, s, gsm8k_strict_accuracy=acc + e + 0.003 * (s % 2) + jitter[s],
                        mean_grad_cosine=0.9 + e) for s, e in enumerate(seed_effect)]
    return cells


def test_the_report_opens_with_the_primary_contrasts_against_the_base_and_bf16():
    cells = _setting(shift_new=0.10)
    items = (_items("tiny-dense", "bf16", [[1] * 50 + [0] * 50] * 3)
             + _items("tiny-dense", "mxfp4", [[1] * 40 + [0] * 60] * 3)
             + _items("tiny-dense", "mine", [[1] * 50 + [0] * 50] * 3))
    new = [c for c in cells if c["recipe"] == "mine"]
    rows = compare_rows(new, [c for c in cells if c["recipe"] != "mine"], "mine",
                        [i for i in items if i["recipe"] == "mine"], [i for i in items if i["recipe"] != "mine"],
                        primary_references=["mxfp4", "bf16"])
    primary = [r for r in rows if r["part"] == "primary"]
    assert rows[: len(primary)] == primary  # primary rows come first
    assert [(r["baseline"], r["metric"]) for r in primary] == [
        ("mxfp4", "gsm8k_strict_accuracy"), ("mxfp4", PER_PROBLEM),
        ("bf16", "gsm8k_strict_accuracy"), ("bf16", PER_PROBLEM)]
    by = {(r["baseline"], r["metric"]): r for r in primary}
    assert by[("mxfp4", "gsm8k_strict_accuracy")]["verdict"] == "better"
    assert by[("mxfp4", PER_PROBLEM)]["verdict"] == "better"  # 30 gained, 0 lost
    assert by[("bf16", PER_PROBLEM)]["verdict"] == "no significant difference"
    line = answer_line(rows, "mine")
    assert line.startswith("**Answer**") and "vs mxfp4: after RL, per problem" in line and "vs bf16" in line
    seed_row = by[("mxfp4", "gsm8k_strict_accuracy")]
    assert (f"after RL, per seed {seed_row['mean_new']:.3f} vs {seed_row['mean_ref']:.3f}: +0.1007 "
            f"[{seed_row['ci95_low']:+.4f}, {seed_row['ci95_high']:+.4f}]") in line
    text = markdown(rows, "mine")
    assert text.index("**Answer**") < text.index("## Primary contrasts") < text.index("<details>")
    assert all(r["part"] == "secondary" for r in rows if r["metric"] == "mean_grad_cosine")


def test_a_null_primary_contrast_states_its_mde_and_the_seeds_the_papers_effects_need():
    rows = compare_rows([c for c in _setting() if c["recipe"] == "mine"],
                        [c for c in _setting() if c["recipe"] != "mine"], "mine", primary_references=["mxfp4", "bf16"])
    r = next(r for r in rows if r["part"] == "primary" and r["baseline"] == "mxfp4")
    assert r["verdict"] == "no significant difference" and r["mde80"] > 0
    # the seeds needed are those of a paired t test at the part's lone-effect level (Bonferroni within it)
    assert r["lone_alpha"] == pytest.approx(ALPHA * 0.8 / r["family_size"])
    assert r["seeds_for_0.7pt"] == n_needed(0.007, r["sd"], r["lone_alpha"])
    assert r["seeds_for_0.7pt"] >= r["seeds_for_1.0pt"] >= 2
    bf16 = next(r for r in rows if r["part"] == "primary" and r["baseline"] == "bf16")
    assert bf16["verdict"] == "worse" and "mde80" not in bf16  # a resolved contrast needs no power figures


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-0.2, 0.2), min_size=3, max_size=5), st.floats(0.0, 0.1), st.sampled_from(["holm", "fdr_bh"]))
def test_every_interval_excludes_zero_exactly_when_its_adjusted_verdict_fires(noise, shift, adjust):
    rng = np.random.default_rng(len(noise))
    cells = []
    for recipe, acc in (("bf16", 0.5), ("mxfp4", 0.4), ("mxfp4+x", 0.45), ("mine", 0.4 + shift)):
        cells += [_cell("m", recipe, s, **{k: acc + e + 0.05 * rng.standard_normal() for k in METRICS})
                  for s, e in enumerate(noise)]
    rows = compare_rows([c for c in cells if c["recipe"] == "mine"], [c for c in cells if c["recipe"] != "mine"],
                        "mine", primary_references=["mxfp4", "bf16"], adjust=adjust)
    judged = [r for r in rows if r["p_adj"] is not None]
    assert judged and all(r["p_adj"] >= r["p"] for r in judged)
    for r in judged:
        excludes = r["ci_low"] > 0 or r["ci_high"] < 0
        if not math.isclose(r["p_adj"], ALPHA, rel_tol=1e-9):  # the boundary itself is a tie
            assert excludes == (r["verdict"] in FIRED), r
    assert all(r["verdict"].startswith("no verdict") for r in rows if r["metric"] in TIMINGS)


def test_the_adjustment_is_statsmodels_within_each_part_on_the_familys_scale():
    from statsmodels.stats.multitest import multipletests

    cells = _setting(shift_new=0.03)
    rows = compare_rows([c for c in cells if c["recipe"] == "mine"], [c for c in cells if c["recipe"] != "mine"],
                        "mine", primary_references=["mxfp4", "bf16"], adjust="fdr_bh")
    for part, share in (("primary", 0.8), ("secondary", 0.2)):
        judged = [r for r in rows if r["part"] == part and r["p_adj"] is not None]
        expected = multipletests([r["p"] for r in judged], method="fdr_bh")[1] / share
        assert [r["p_adj"] for r in judged] == pytest.approx(np.minimum(expected, 1.0))
    with pytest.raises(ValueError, match="accepted: holm, fdr_bh"):
        compare_rows(cells, cells, "mine", adjust="bonferroni")


def test_the_per_problem_interval_is_clopper_pearson_dual_to_the_central_exact_p():
    for gained, lost in ((12, 3), (9, 2), (20, 20), (7, 0)):
        pairs = [(1, 0)] * gained + [(0, 1)] * lost + [(1, 1)] * 50
        d = mcnemar_diff(pairs)
        # the central two-sided p is twice the smaller tail of Binomial(discordant, 1/2)
        k, n = gained, gained + lost
        assert d["p"] == pytest.approx(min(1, 2 * min(stats.binom.cdf(k, n, 0.5), stats.binom.sf(k - 1, n, 0.5))))
        for level in (0.9, 0.95, 0.99):
            d = mcnemar_diff(pairs, level)
            assert (d["ci_low"] > 0 or d["ci_high"] < 0) == (d["p"] < 1 - level)
            assert d["ci_low"] <= d["diff"] <= d["ci_high"]


@pytest.mark.slow
def test_the_seeds_and_pairs_needed_have_the_power_they_promise_in_simulation():
    """n_needed (paired t over seeds) and mcnemar_pairs_needed (Connor's approximation) against Monte
    Carlo power of the test the report runs."""
    rng = np.random.default_rng(0)
    alpha, sd, effect = 0.01, 0.01, 0.01
    n = n_needed(effect, sd, alpha)
    x = effect + sd * rng.standard_normal((4000, n))
    power = (stats.ttest_1samp(x, 0, axis=1).pvalue < alpha).mean()
    assert 0.78 <= power <= 0.86, (n, power)
    x = effect + sd * rng.standard_normal((4000, n - 1))
    assert (stats.ttest_1samp(x, 0, axis=1).pvalue < alpha).mean() < 0.8

    p_d, delta = 0.2, 0.05
    pairs = mcnemar_pairs_needed(delta, p_d, alpha)
    discordant = rng.binomial(pairs, p_d, 2000)
    gained = rng.binomial(discordant, (1 + delta / p_d) / 2)
    p = [mcnemar_diff([(1, 0)] * g + [(0, 1)] * (m - g) + [(1, 1)] * (pairs - m))["p"]
         for g, m in zip(gained, discordant)]
    assert 0.72 <= np.mean(np.array(p) < alpha) <= 0.88, pairs  # the exact test is a little conservative


@pytest.mark.slow
@pytest.mark.skipif(not STORED.exists(), reason="needs the stored embedded baselines (results/baselines/embedded)")
def test_a_over_a_by_seed_keeps_the_familywise_rate_of_false_verdicts_at_the_stated_level(monkeypatch):
    """A recipe compared with itself on disjoint seeds (simulated cells drawn with the stored
    baselines' per-seed spread; every reference recipe the same distribution, so every verdict is
    false): the share of reports with any verdict is at most 5% (Holm), while unadjusted 95% intervals
    would fire in most reports."""
    import gc

    import pandas as pd

    monkeypatch.setattr(gc, "collect", lambda *args: 0)  # statsmodels' Holm collects garbage on every call
    stored = pd.read_csv(STORED)
    spread = stored.groupby("model")[METRICS].std().fillna(0.01).clip(lower=1e-3)
    centre = stored.groupby("model")[METRICS].mean()
    rng = np.random.default_rng(2026)
    recipes = sorted(stored["recipe"].unique())
    reps, any_fired, any_unadjusted = 200, 0, 0

    def draw(recipe, seeds):
        return [_cell(m, recipe, s, **{k: centre.loc[m, k] + spread.loc[m, k] * rng.standard_normal() for k in METRICS})
                for m in centre.index for s in seeds]

    for _ in range(reps):
        new = draw("mxfp4+macro", range(3, 6))
        references = [c for r in recipes for c in draw(r, range(3))]
        rows = compare_rows(new, references, "mxfp4+macro", primary_references=["mxfp4", "bf16"])
        judged = [r for r in rows if r["p_adj"] is not None]
        any_fired += any(r["verdict"] in FIRED for r in judged)
        any_unadjusted += any(r["p"] < ALPHA for r in judged)
    assert len(judged) >= 20 and all(r["method"] == "Welch (seeds differ)" for r in judged)
    # one-sided binomial test of H0: rate <= 0.05 must not reject at 1%
    assert stats.binomtest(any_fired, reps, ALPHA, alternative="greater").pvalue > 0.01, any_fired
    assert any_unadjusted / reps > 0.5, any_unadjusted  # the check has teeth: without the family it fails


def test_the_figure_draws_the_primary_contrasts_and_says_when_there_are_none(tmp_path):
    """Both files are written; a recipe with no base compared as the reference itself has no primary
    contrast, and the report says so instead of drawing an empty answer."""
    from mxfp4.report.plots import compare_figure

    cells = _setting(shift_new=0.10)
    rows = compare_rows([c for c in cells if c["recipe"] == "mine"], [c for c in cells if c["recipe"] != "mine"],
                        "mine", primary_references=["mxfp4", "bf16"])
    assert all(p.stat().st_size > 0 for p in compare_figure(rows, "mine", tmp_path / "fig"))
    alone = compare_rows([c for c in cells if c["recipe"] == "bf16"], [c for c in cells if c["recipe"] != "bf16"],
                         "bf16", primary_references=["bf16"])
    assert not [r for r in alone if r["part"] == "primary"] and "no primary contrast" in answer_line(alone, "bf16")
    assert all(p.exists() for p in compare_figure(alone, "bf16", tmp_path / "none"))


@pytest.mark.slow
def test_the_rl_gain_is_a_primary_contrast_where_the_cells_record_it():
    cells = [dict(c, gsm8k_rl_gain=0.05 + 0.01 * c["seed"] + (0.03 if c["recipe"] == "mine" else 0.0))
             for c in _setting()]
    rows = compare_rows([c for c in cells if c["recipe"] == "mine"], [c for c in cells if c["recipe"] != "mine"],
                        "mine", primary_references=["mxfp4", "bf16"])
    gains = [r for r in rows if r["metric"] == "gsm8k_rl_gain"]
    assert [(r["baseline"], r["part"]) for r in gains] == [("mxfp4", "primary"), ("bf16", "primary")]
    assert gains[0]["diff"] == pytest.approx(0.03)
    assert not [r for r in compare_rows(_setting(), _setting(), "mine") if r["metric"] == "gsm8k_rl_gain"]


def test_a_per_problem_p_that_underflows_keeps_a_finite_interval_that_excludes_zero():
    from mxfp4.report.compare import item_difference

    items = _items("m", "b", [[0] * 2000]) + _items("m", "new", [[1] * 2000])
    d = item_difference([i for i in items if i["recipe"] == "new"], [i for i in items if i["recipe"] == "b"])
    assert d["p"] == 0.0  # 2 * 0.5**2000 underflows
    cells = [_cell("m", r, s, gsm8k_strict_accuracy=0.5) for r in ("b", "new") for s in (0, 1)]
    rows = compare_rows([c for c in cells if c["recipe"] == "new"], [c for c in cells if c["recipe"] == "b"], "new",
                        [i for i in items if i["recipe"] == "new"], [i for i in items if i["recipe"] == "b"],
                        primary_references=["b"])
    row = next(r for r in rows if r["metric"] == PER_PROBLEM)
    assert row["verdict"] == "better" and 0 < row["ci_low"] <= row["ci_high"] <= 1


def test_the_answer_shows_where_a_gain_comes_from_before_after_unquantized_and_absolute():
    """A recipe that starts lower gains more yet ends no higher: the answer line gives before RL, after
    RL, the RL gain and the unquantized accuracy of both sides with 95% intervals; the report's accuracy
    table gives every recipe's absolute values; a timing row appears only where both sides have timings."""
    from mxfp4.report.compare import accuracy_rows, accuracy_table

    def cells(recipe, before, after, step_time):
        return [{"model": "m", "recipe": recipe, "seed": s, "gsm8k_strict_accuracy_before": before + 0.01 * s,
                 "gsm8k_strict_accuracy": after + 0.01 * s, "gsm8k_rl_gain": after - before,
                 "gsm8k_strict_accuracy_unquantized": after + 0.02, "gsm8k_flexible_accuracy": after,
                 "mean_step_time": step_time} for s in range(3)]

    new = cells("rht", 0.30, 0.40, None)
    base = cells("mxfp4", 0.35, 0.40, 1.0) + cells("bf16", 0.40, 0.45, 0.5)
    rows = compare_rows(new, base, "rht", primary_references=["mxfp4", "bf16"])
    line = answer_line(rows, "rht")
    for said in ("before RL 0.310 vs 0.360: -0.0500", "RL gain 0.100 vs 0.050: +0.0500",
                 "after RL, per seed 0.410 vs 0.410: +0.0000", "after RL, unquantized 0.420 vs 0.420"):
        assert said in line, said
    assert not [r for r in rows if r["metric"] in TIMINGS]  # the new cells have no step times
    table = "\n".join(accuracy_table(accuracy_rows(new + base, ["rht", "mxfp4", "bf16"])))
    assert "| m | rht | 3 | 0.310 [" in table and "| m | bf16 | 3 | 0.410 [" in table

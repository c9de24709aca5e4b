"""Two runs side by side (mxfp4.report.profile_contrast): unit-paired pathway differences recomputed by
hand, pairing refused on different data, recovery gaps per seed, one Holm family."""

import math

import numpy as np
import pytest
from scipy import stats

from mxfp4.report.profile_contrast import adjust, markdown, paired_pathway_rows, recovery_rows, regime_rows


def units(harms, keys=None, arm="+dead", pathway="rollout", model="tiny-dense"):
    keys = keys or [f"k{i}" for i in range(len(harms))]
    return [{"model": model, "checkpoint": "warm", "form": "canonical", "pathway": pathway, "arm": arm, "unit": str(i),
             "group": "warm", "key": k, "harm": repr(h)} for i, (h, k) in enumerate(zip(harms, keys))]


def t_interval(d):
    d = np.asarray(d, float)
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return d.mean(), d.mean() - half, d.mean() + half


def test_the_warm_start_rows_pair_each_unit_with_itself_across_the_runs():
    a = [-0.5, -0.25, -0.75, -1.0, -0.5, 0.0]
    b = [-0.25, -0.25, -0.5, -0.5, -0.5, 0.0]
    rows = paired_pathway_rows(units(a) + units(a, arm="none"), units(b) + units(a, arm="none"))
    dead = next(r for r in rows if r["arm"] == "+dead")
    mean, lo, hi = t_interval(np.subtract(b, a))
    assert (dead["diff"], dead["ci_low"], dead["ci_high"]) == pytest.approx((mean, lo, hi), abs=1e-12)
    assert dead["a"] == pytest.approx(np.mean(a)) and dead["b"] == pytest.approx(np.mean(b)) and dead["n"] == 6
    none = next(r for r in rows if r["arm"] == "none")
    assert none["diff"] == 0 and none["p"] is None  # the unchanged unquantized arm: a check, never a test


def test_units_that_measured_different_data_are_not_paired():
    with pytest.raises(ValueError, match=r"unit\(s\) \[2\] measured different data"):
        paired_pathway_rows(units([0.1, 0.2, 0.3]), units([0.1, 0.2, 0.3], keys=["k0", "k1", "other"]))


def items(scores: dict[str, list[tuple[float, float]]], seeds=(10, 11), docs=("d0", "d1", "d2")):
    """items.csv rows: per recipe, (strict_before, strict) for every (seed, problem) in order."""
    pairs = [(s, i, d) for s in seeds for i, d in enumerate(docs)]
    return [{"model": "tiny-moe", "recipe": r, "seed": str(s), "doc_id": str(i), "doc_hash": d,
             "strict_before": str(before), "strict": str(after)}
            for r, values in scores.items() for (s, i, d), (before, after) in zip(pairs, values)]


def test_recovery_rows_difference_each_problems_gap_to_bf16_between_the_runs():
    """Problems are told apart by lm-eval's doc id, so a problem that occurs twice (same hash) counts twice."""
    bf16 = [(0, 1), (0, 0), (1, 1), (0, 1), (1, 1), (0, 0)]
    docs = ("d0", "d1", "d1")  # the generator can repeat a problem
    a = items({"bf16": bf16, "mxfp4": [(0, 1), (0, 1), (1, 1), (0, 0), (1, 1), (0, 1)]}, docs=docs)
    b = items({"bf16": bf16, "mxfp4": [(0, 0), (0, 0), (1, 0), (0, 0), (1, 1), (0, 0)]}, docs=docs)
    rows = {r["measure"]: r for r in recovery_rows(a, b)}
    final, gain = rows["gsm8k_strict_accuracy"], rows["gsm8k_rl_gain"]
    # final accuracy: mxfp4 - bf16 per (seed, problem): a = (0, 1, 0, -1, 0, 1), b = (-1, 0, -1, -1, 0, 0)
    assert final["a"] == pytest.approx(1 / 6) and final["b"] == pytest.approx(-3 / 6)
    assert final["diff"] == pytest.approx(-4 / 6) and final["n"] == 6 and final["arm"] == "mxfp4 - bf16"
    assert final["ci_low"] < final["diff"] < final["ci_high"]
    # the warm starts score alike (strict_before equal), so the RL gain's gaps equal the final accuracy's
    assert (gain["a"], gain["b"], gain["diff"]) == pytest.approx((final["a"], final["b"], final["diff"]))
    moved = items({"bf16": bf16, "mxfp4": bf16}, docs=("d0", "d1", "other"))  # a different third problem
    with pytest.raises(ValueError, match="different \\(seed, problem\\) pairs"):
        recovery_rows(a, moved)


def test_one_holm_family_over_every_tested_row_and_the_report_names_its_size():
    rows = [{"section": "recovery", "model": "m", "arm": "x - bf16", "measure": "gsm8k_rl_gain", "a": 0.0, "b": 0.1,
             "diff": 0.1, "ci_low": 0.0, "ci_high": 0.2, "n": 3, "p": p} for p in (0.001, 0.02, 0.5)]
    rows.append({"section": "regime", "model": "m", "arm": "weight", "measure": "excess_kurtosis", "a": 0.1, "b": 9.0,
                 "n": 7})
    adjust(rows)
    assert rows[0]["p_holm"] == pytest.approx(0.003)  # Holm's first step: m * the smallest p
    assert rows[1]["p_holm"] == pytest.approx(0.04)  # then (m - 1) * the next
    assert "p_holm" not in rows[3]
    text = markdown(rows, "base", "knob")
    assert "One family of 3 tests, Holm-adjusted" in text and text.count("| differs |") == 2


def test_regime_rows_give_each_operands_median_over_gemms_in_both_runs():
    def rows(kurtosis):
        return [{"model": "tiny-dense", "operand": op, "excess_kurtosis": str(k), "deadzone_fraction": "0.1"}
                for op, ks in kurtosis.items() for k in ks]

    a = rows({"weight": [0.1, 0.3, 0.2], "activation": [0.0, 1.0, 2.0, 3.0]})
    b = rows({"weight": [0.1, 0.3, 0.2], "activation": [100.0, 1.0, 200.0, 3.0]})
    got = {(r["arm"], r["measure"]): (r["a"], r["b"]) for r in regime_rows(a, b)}
    assert got[("activation", "excess_kurtosis")] == (1.5, 51.5) and got[("weight", "excess_kurtosis")] == (0.2, 0.2)
    assert got[("weight", "deadzone_fraction")] == (0.1, 0.1)

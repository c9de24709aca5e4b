"""Accuracy and RL gain per problem type (the planted flaw and the rest) in the summary table."""

import random

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

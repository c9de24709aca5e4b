"""Symmetric verdicts of the claims table, and the Shapley attribution of the pathway matrix's outcomes."""

import math

import numpy as np
import pytest

from mxfp4.layout import Layout
from mxfp4.report.claims import build_claims, recovery_row

PROOFS = {"max_identity_residual_rel": 0.0, "passed": True, "cases": [1]}


def _pathway_row(mean, half, n=24, metric="rollout_harm_contrast", injection="+dead vs +grid"):
    return {"model": "tiny-dense", "checkpoint": "warm", "injection": injection, "site": "forward", "layer": "total",
            "metric": metric, "mean": str(mean), "ci_low": str(mean - half), "ci_high": str(mean + half), "n": str(n),
            "p": "", "method": ""}


def test_held_and_contradicted_are_the_two_signs_of_one_adjusted_test():
    rows = [r for r in build_claims([], PROOFS, [], [_pathway_row(0.05, 0.02), _pathway_row(-0.05, 0.02)])
            if r["test"].startswith("direct")]
    assert [r["verdict"] for r in rows] == ["held", "contradicted"]
    assert rows[0]["p_holm"] == pytest.approx(rows[1]["p_holm"])  # the same family, the same adjustment
    weak = [r for r in build_claims([], PROOFS, [], [_pathway_row(0.01, 0.02), _pathway_row(-0.01, 0.02)])
            if r["test"].startswith("direct")]
    assert [r["verdict"] for r in weak] == ["not shown", "not shown"]


@pytest.mark.parametrize("shift", [0.002, 0.02, 0.2])
def test_each_interval_excludes_the_null_exactly_when_its_verdict_fires(shift):
    pathways = [_pathway_row(shift * k, 0.03, injection=f"arm{k}") for k in (-2, -1, 1, 2, 3)]
    for r in (r for r in build_claims([], PROOFS, [], pathways) if r["test"].startswith("direct")):
        excludes = r["ci_low"] > 0 or r["ci_high"] < 0
        assert excludes == (r["verdict"] in ("held", "contradicted")), r
        assert r["level"] >= 0.95


def _cells(model, diffs, base=0.5):
    rows = []
    for seed, d in enumerate(diffs):
        rows.append({"model": model, "recipe": "bf16", "seed": seed, "gsm8k_strict_accuracy": base + 0.01 * seed})
        rows.append({"model": model, "recipe": "mxfp4+all", "seed": seed,
                     "gsm8k_strict_accuracy": base + 0.01 * seed + d})
    return rows


def test_a_moe_row_19_points_below_bf16_is_contradicted():
    cells = _cells("tiny-moe", [-0.19, -0.18, -0.20, -0.19])
    row = next(r for r in build_claims(cells, PROOFS, [], []) if r["test"] == "recovery: superiority")
    assert row["verdict"] == "contradicted" and row["ci_high"] < 0
    assert "problems of 100" not in row["measure"]  # no problem count given: it says so instead
    above = next(r for r in build_claims(_cells("tiny-moe", [0.05, 0.04, 0.06, 0.05]), PROOFS, [], [])
                 if r["test"] == "recovery: superiority")
    assert above["verdict"] == "held"


def test_the_dense_margin_states_its_source_and_resolution_and_can_be_contradicted():
    row = recovery_row(_cells("tiny-dense", [-0.10, -0.11, -0.09, -0.10]), "tiny-dense", problems=100)
    assert "within 0.7%" in row["measure"] and "0.7 problems of 100 evaluated a seed" in row["measure"]
    rows = build_claims(_cells("tiny-dense", [-0.10, -0.11, -0.09, -0.10]), PROOFS, [], [], problems=100)
    assert next(r for r in rows if r["test"] == "recovery: non-inferiority")["verdict"] == "contradicted"
    rows = build_claims(_cells("tiny-dense", [0.0, 0.001, -0.001, 0.0005]), PROOFS, [], [], problems=100)
    assert next(r for r in rows if r["test"] == "recovery: non-inferiority")["verdict"] == "held"


def test_a_one_seed_recovery_is_paired_over_the_held_out_problems():
    """One seed: no interval over seeds, so the recovery pairs each problem's strict correctness under
    mxfp4+all and bf16 (the same lm-eval doc). mxfp4+all misses 40 of the 200 problems bf16 solves: a
    paired t over 200 problems contradicts 'within 0.7%' (an independent count: 40/200 = 0.2 below)."""
    items = [{"model": "tiny-dense", "recipe": recipe, "seed": 0, "doc_id": i, "doc_hash": f"h{i}",
              "strict_before": 0.0, "strict": 0.0 if recipe == "mxfp4+all" and i % 5 == 0 else 1.0}
             for recipe in ("bf16", "mxfp4+all") for i in range(200)]
    cells = _cells("tiny-dense", [-0.2], base=1.0)
    alone = recovery_row(cells, "tiny-dense", problems=200)
    assert alone["p"] is None and alone["n"] == 1  # over seeds: one seed, no test
    row = recovery_row(cells, "tiny-dense", problems=200, items=items)
    assert row["n"] == 200 and row["diff"] == pytest.approx(-0.2)
    assert "200 held-out problems of one seed" in row["method"]
    rows = build_claims(cells, PROOFS, [], [], problems=200, items=items)
    assert next(r for r in rows if r["test"] == "recovery: non-inferiority" and r["family"] == "primary")[
        "verdict"] == "contradicted"


def test_energy_controlled_contrasts_are_direct_rows_of_their_own():
    rows = build_claims([], PROOFS, [], [_pathway_row(0.05, 0.02, metric="entropy_excess_contrast",
                                                      injection="+grid vs +scale (excess over ~gaussian)")])
    row = next(r for r in rows if r["test"].startswith("direct"))
    assert row["test"] == "direct, energy-controlled (pathway matrix)" and "higher is the harm" in row["measure"]


# ---- Shapley attribution of outcomes (mxfp4.analysis.pathways.shapley_rows) ----


def _harms(v, n=40, noise=0.0, seed=0):
    """Per-unit harms of the 8 arms from a set function v over coalitions of the components."""
    from mxfp4.analysis.pathways.spec import COALITIONS

    rng = np.random.default_rng(seed)
    unit = rng.normal(0, noise, n)
    return {arm: list(v(t) + unit) for arm, t in COALITIONS.items()}


def _one_policy(n):
    from mxfp4.analysis.pathways.measurement import Measured

    return Measured(grad_groups=["warm"] * n, roll_groups=["warm"] * n, seeds={0})


def test_shapley_of_an_additive_outcome_returns_each_components_contribution():
    from mxfp4.analysis.pathways.estimates import shapley_rows

    contribution = {"scale": 0.30, "dead": 0.05, "grid": 0.10}
    rows = shapley_rows("m", "warm", {"rollout": _harms(lambda t: sum(contribution[c] for c in t), noise=0.1)},
                        _one_policy(40), 0)
    got = {r["injection"]: r for r in rows}
    for c, a in contribution.items():
        assert got[f"shapley:{c}"]["mean"] == pytest.approx(a, abs=1e-12)
    assert got["shapley:interaction"]["mean"] == pytest.approx(0, abs=1e-12)
    assert all(r["n"] == 40 and r["metric"] == "rollout_shapley" for r in rows)


def test_a_synthetic_interaction_lands_in_the_interaction_term():
    from mxfp4.analysis.pathways.estimates import shapley_rows

    def v(t):  # the three together do 0.4 more than their parts; alone each does 0.1
        return 0.1 * len(t) + (0.4 if len(t) == 3 else 0.0)

    got = {r["injection"]: r for r in shapley_rows("m", "warm", {"entropy": _harms(v, noise=0.05)}, _one_policy(40), 0)}
    assert got["shapley:interaction"]["mean"] == pytest.approx(0.4, abs=1e-12)
    assert got["shapley:interaction"]["ci_low"] == pytest.approx(0.4) and got["shapley:interaction"]["ci_high"] == (
        pytest.approx(0.4))  # the unit noise is shared by every arm: no spread in the interaction
    for c in ("scale", "dead", "grid"):  # efficiency: the interaction is shared equally by symmetric players
        assert got[f"shapley:{c}"]["mean"] == pytest.approx(0.1 + 0.4 / 3, abs=1e-12)


def test_the_hierarchical_bootstrap_resamples_seeds_then_units():
    from mxfp4.stats import hierarchical_bootstrap

    rng = np.random.default_rng(1)
    one = hierarchical_bootstrap({0: list(rng.normal(1.0, 1.0, 400))})
    assert one["ci_low"] < one["mean"] < one["ci_high"] and one["ci_high"] - one["ci_low"] == pytest.approx(
        2 * 1.96 / 20, rel=0.15)  # the ordinary bootstrap over 400 units: about +-1.96 sd / sqrt(n)
    # seeds that disagree widen the interval beyond what the units alone would give
    seeds = {s: list(rng.normal(mu, 0.1, 100)) for s, mu in enumerate((0.0, 1.0, 2.0))}
    pooled = hierarchical_bootstrap({0: [x for v in seeds.values() for x in v]})
    nested = hierarchical_bootstrap(seeds)
    assert nested["ci_high"] - nested["ci_low"] > 3 * (pooled["ci_high"] - pooled["ci_low"])
    assert hierarchical_bootstrap({0: [None]})["mean"] is None


def test_a_row_over_several_seeds_policies_is_tested_on_the_seeds_degrees_of_freedom():
    """After GRPO each seed's policy is an outer unit: the claim's p is the t test on k - 1 df that the
    pathway row's interval came from, not one on its many prompts."""
    from scipy import stats

    k, mean, se = 6, 0.05, 0.02
    half = stats.t.ppf(0.975, k - 1) * se
    row = {**_pathway_row(mean, half, n=96), "checkpoint": "grpo", "policies": str(k)}
    got = next(r for r in build_claims([], PROOFS, [], [row]) if r["test"].startswith("direct"))
    assert got["p"] == pytest.approx(2 * stats.t.sf(mean / se, k - 1), rel=1e-9)
    assert got["n"] == k and "6 seeds' policies (96 prompts)" in got["method"]


def test_the_precondition_row_says_whether_bf16_rl_trains_and_stays_outside_holm():
    """Per problem and seed: a gain of about +14 points (a fifth of the 70% unsolved problems solved,
    the same 200 problems under 6 seeds) is met; no gain (after = before) is not met; neither row
    enters the Holm family."""
    from mxfp4.report.claims import precondition_rows

    rng = np.random.default_rng(0)
    before = rng.random(200) < 0.3
    items = []
    for model, lift in (("trains", 0.2), ("flat", 0.0)):
        for seed in range(6):
            after = np.where(rng.random(200) < lift, True, before)
            items += [{"model": model, "recipe": "bf16", "seed": seed, "doc_id": i, "doc_hash": f"h{i}",
                       "strict": float(a), "strict_before": float(b), "problem_type": ("flaw", "rest")[i % 2]}
                      for i, (a, b) in enumerate(zip(after, before))]
    rows = {r["model"]: r for r in precondition_rows(items)}  # one a model: the gain over every problem type
    assert rows["trains"]["verdict"] == "met" and rows["trains"]["ci_low"] > 0
    assert rows["flat"]["diff"] == 0 and rows["flat"]["verdict"].startswith("not met")
    full = build_claims([], PROOFS, [], [], items=items)
    assert [r["model"] for r in full if r["test"].startswith("precondition")] == ["flat", "trains"]


def test_the_stored_primary_summary_is_what_the_stored_baselines_make():
    """results/baselines/PRIMARY.md (linked from the README) is each named profile's claims from its stored per-unit
    files under the one three-outcome rule, each row with its scope, then the headline after RL of each profile with
    RL cells; no row carries the retired one-sided wording."""
    import re
    from pathlib import Path

    from mxfp4.report.claims import headline_summary
    from mxfp4.report.network_claims import network_summary

    results = Path(__file__).resolve().parents[2] / "results"
    text = (results / "baselines" / "PRIMARY.md").read_text()
    profiles = re.search(r"`mxfp4 primary-summary ([^`]+)`", text).group(1).split()
    assert {"embedded", "networks", "real-small-claims"} <= set(profiles)
    with_cells = [p for p in profiles if (results / "baselines" / p / "cells.csv").is_file()]
    assert network_summary([Layout(results, p) for p in profiles]) in text
    assert text.endswith(headline_summary([Layout(results, p) for p in with_cells]))
    assert "| smollm2-135m | about this model |" in text and "| tiny-dense | about the class |" in text


def test_no_stored_report_prints_the_retired_one_sided_verdict():
    """Every stored claims report decides under one rule: no "contradicted (a rival within the margin)" (a margin
    test that called a lead smaller than the margin a contradiction) outside the dose-response study, which names
    its own margin test."""
    from pathlib import Path

    baselines = Path(__file__).resolve().parents[2] / "results" / "baselines"
    reports = [p for p in baselines.rglob("*.md") if "dose-response" not in p.parts]
    assert len(reports) > 10
    assert [str(p) for p in reports if "a rival within the margin" in p.read_text()] == []


def _headline_items(rng, seeds: int, problems: int, network_sd: float, shift: float = 0.0):
    """(cells, items) of bf16 and mxfp4+all on one MoE model: each problem's difficulty shared by every seed, each
    seed's network moving mxfp4+all's log-odds by its own N(shift, network_sd) (the between-network variance the
    headline must carry), binary correctness."""
    import numpy as np

    difficulty = rng.normal(0, 1.5, problems)
    cells, items = [], []
    for s in range(seeds):
        net = rng.normal(shift, network_sd)
        for recipe, offset in (("bf16", 0.0), ("mxfp4+all", net)):
            correct = (rng.random(problems) < 1 / (1 + np.exp(-(difficulty + offset)))).astype(float)
            items += [{"model": "tiny-moe", "recipe": recipe, "seed": s, "doc_id": p, "doc_hash": f"h{p}",
                       "strict": c, "strict_before": 0.0} for p, c in enumerate(correct)]
            cells.append({"model": "tiny-moe", "recipe": recipe, "seed": s, "gsm8k_strict_accuracy": correct.mean()})
    return cells, items


@pytest.mark.slow
def test_the_headline_on_the_crossed_model_gives_at_most_five_percent_false_verdicts_in_an_aa_simulation():
    """bf16 against an mxfp4+all that is bf16 on average (networks differ around it): the crossed model (problems x
    networks) rejects the superiority null in at most 5% of 300 runs (within Monte Carlo error); pairing the 800
    (seed, problem) items as independent, as a paired t would, rejects far more often."""
    import numpy as np

    from mxfp4.report.claims import recovery_row
    from mxfp4.stats import paired_diff

    rng = np.random.default_rng(0)
    runs, crossed_false, pooled_false = 300, 0, 0
    for _ in range(runs):
        cells, items = _headline_items(rng, seeds=4, problems=200, network_sd=0.3)
        row = recovery_row(cells, "tiny-moe", 200, "gsm8k_strict_accuracy", items)
        crossed_false += row["p"] < 0.05
        a = [i["strict"] for i in items if i["recipe"] == "mxfp4+all"]
        b = [i["strict"] for i in items if i["recipe"] == "bf16"]
        pooled_false += paired_diff(a, b)["p"] < 0.05
    assert crossed_false / runs <= 0.05 + 1.96 * math.sqrt(0.05 * 0.95 / runs)
    assert pooled_false / runs > 0.2


def test_the_headline_states_its_mde_and_the_networks_the_papers_margin_needs():
    """The headline states the MDE of its design and the networks the paper's 1.0 point needs; the MDE falls as
    networks are added; a design detecting less than 3 points says so, and a profile that makes the headline
    exploratory before the run keeps it out of the primary family and tests it among the secondary rows."""
    from mxfp4.config.profiles import ClaimDesign
    from mxfp4.report.claims import build_claims, primary_family, recovery_row

    cells, items = _headline_items(np.random.default_rng(2), 3, 400, 0.5)
    few = recovery_row(cells, "tiny-moe", 400, "gsm8k_strict_accuracy", items)
    cells40, items40 = _headline_items(np.random.default_rng(2), 40, 400, 0.5)
    many = recovery_row(cells40, "tiny-moe", 400, "gsm8k_strict_accuracy", items40)
    assert few["mde80"] > 0.03 and few["n_needed"] > 3 and "belongs in the exploratory rows" in few["test"]
    assert many["mde80"] < few["mde80"] and few["design"]["networks"] == 3 and many["design"]["networks"] == 40
    assert "needs" in few["method"] and "networks" in few["method"]
    assert any(r["claim"].startswith("Combined corrections") for r in primary_family(cells, [], 400, None, items))
    one_network = recovery_row(cells, "tiny-moe", 400, "gsm8k_strict_accuracy", items, "seeds of one network")
    assert "x 3 seeds of one network" in one_network["method"] and "networks;" not in one_network["method"]
    design = ClaimDesign(margins={"gradient": 0.02, "rollout": 0.1, "entropy": 0.0025}, premise_margins=3,
                         exploratory=["headline"])
    assert not any(r["claim"].startswith("Combined") for r in primary_family(cells, [], 400, design, items))
    rows = build_claims(cells, PROOFS, [], [], 400, items, design)
    moved = [r for r in rows if r["claim"].startswith("Combined") and r["test"].startswith("exploratory")]
    assert len(moved) == 1 and moved[0]["family"] == "secondary"


def test_the_claims_table_says_what_each_correction_removes_from_each_component():
    """A correction that removes deadzone energy and one that removes scale bias: each row shows every component's
    energy before and after with its change, so a recovery can be read against the component it removed."""
    from mxfp4.report.claims import removal_table

    rows = removal_table([
        {"correction": "outlier_fallback(mode=element, k=1)", "source": "gaussian", "energy_scale_before": 10.0,
         "energy_scale_after": 9.0, "energy_dead_before": 4.0, "energy_dead_after": 1.0, "energy_grid_before": 8.0,
         "energy_grid_after": 6.0, "energy_total_before": 20.0, "energy_total_after": 15.0},
        {"correction": "macro_block(blocks=4)", "source": "gaussian", "energy_scale_before": 10.0,
         "energy_scale_after": 5.0, "energy_dead_before": 4.0, "energy_dead_after": 4.0},
    ])
    assert rows[0] == "## What each correction removes"
    assert "| outlier_fallback(mode=element, k=1) | gaussian | 10 -> 9 (-10%) | 4 -> 1 (-75%) | 8 -> 6 (-25%) | " \
           "20 -> 15 (-25%) |" in rows
    assert "| macro_block(blocks=4) | gaussian | 10 -> 5 (-50%) | 4 -> 4 (+0%) | — | — |" in rows
    assert removal_table([]) == []


def test_a_profile_names_its_seeds_networks_only_where_each_trains_its_own_warm_start():
    """embedded-large's seed i trains from warm start i (three networks); real-small's seeds are GRPO seeds of the
    one pretrained network, which its recovery rows must not call networks."""
    from mxfp4.config.profiles import load_profile
    from mxfp4.report.claims import seed_replicates

    assert seed_replicates(load_profile("embedded-large")) == "networks"
    assert seed_replicates(load_profile("real-small")) == "seeds of one network"


def test_a_crossed_headline_prints_its_interval_at_its_printed_level():
    """real-small's headline (problems x seeds crossed): the interval the claims table prints equals the t interval
    recomputed at the printed level from the stored items' crossed estimate (its mean, SE and df), not the 95% one
    under a stricter label."""
    from pathlib import Path

    from scipy import stats as sps

    from mxfp4.report.claims import ITEM_VALUES, decided_with, primary_family, stored_claim_inputs
    from mxfp4.report.tables import read_table
    from mxfp4.stats import crossed_differences

    stored = Path(__file__).resolve().parents[2] / "results" / "baselines" / "real-small"
    cells = read_table(stored / "cells.csv", "cells")
    with_units = stored_claim_inputs(Layout(stored.parents[1], "real-small"))  # its family: the units' claims too
    rows = primary_family(cells, [], outcome=with_units, **decided_with("real-small", stored / "cells.csv"))
    head = next(r for r in rows if r["claim"].startswith("Combined corrections"))
    assert head["level"] > 0.95
    value = ITEM_VALUES["gsm8k_strict_accuracy"]
    by: dict = {}
    for r in read_table(stored / "items.csv", "items"):
        if r["recipe"] in ("mxfp4+all", "bf16") and r.get("strict") is not None and r.get("strict_before") is not None:
            by.setdefault(((r["doc_id"], r["doc_hash"]), int(r["seed"])), {})[r["recipe"]] = value(r)
    est = crossed_differences({k: v["mxfp4+all"] - v["bf16"] for k, v in by.items() if len(v) == 2})
    half = sps.t.ppf(0.5 + head["level"] / 2, est["df"]) * est["se"]
    assert head["ci_low"] == pytest.approx(est["mean"] - half) and head["ci_high"] == pytest.approx(est["mean"] + half)
    assert head["ci_low"] < est["ci_low"]  # wider than the stored 95% interval

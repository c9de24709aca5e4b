"""Aggregation statistics, comparisons against baselines and the claims table."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mxfp4.config.run import Run
from mxfp4.layout import Layout
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
    assert not [r for r in rows if r["metric"] == "step_time_vs_bf16"]  # no bf16 cell in either run: no ratio row


def test_step_times_are_compared_as_ratios_to_the_same_runs_bf16_and_get_no_verdict():
    """A new run on a machine 2.5x slower than the baselines' differs in seconds, but its ratio to its
    own bf16 cells matches the baselines': only the ratio is compared (seconds of two runs never are), with no
    verdict and outside the family."""
    from mxfp4.report.compare import with_time_ratio

    base = with_time_ratio(_cells("bf16", [0.5, 0.5, 0.5], step=0.4) + _cells("mxfp4", [0.4, 0.4, 0.4], step=0.8))
    new = with_time_ratio(_cells("bf16", [0.5, 0.5, 0.5], step=1.0) + _cells("mine", [0.4, 0.4, 0.4], step=2.0))
    rows = compare_rows([c for c in new if c["recipe"] == "mine"], base, "mine")
    assert not [r for r in rows if r["metric"] == "mean_step_time"]
    ratio = next(r for r in rows if r["metric"] == "step_time_vs_bf16" and r["baseline"] == "mxfp4")
    assert ratio["diff"] == pytest.approx(0) and ratio["verdict"].startswith("no verdict") and ratio["p_adj"] is None


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


def test_per_problem_comparison_counts_a_repeated_measurement_once_and_crosses_seeds_that_differ():
    """Every seed giving every problem the same value (one warm start's evaluation copied per seed): McNemar over
    the problems once, not over seed copies; seeds that differ: the crossed model (problems x seeds), whose
    interval is wider than McNemar's over the pooled pairs."""
    from mxfp4.report.compare import item_difference
    from mxfp4.stats import mcnemar_diff

    def items(recipe, per_seed):
        return [{"model": "m", "recipe": recipe, "seed": s, "doc_id": i, "doc_hash": f"h{i}", "strict": float(c)}
                for s, correct in enumerate(per_seed) for i, c in enumerate(correct)]

    base = items("b", [[1] * 20 + [0] * 20] * 2)
    same = item_difference(items("a", [[1] * 20 + [0] * 20] * 2), base)
    assert same["diff"] == 0 and same["p"] == 1.0 and same["n_a"] == 40 and "counted once" in same["method"]
    better = item_difference(items("a", [[1] * 30 + [0] * 10] * 2), base)  # 10 gained, 0 lost over 40 problems
    assert better["diff"] == 0.25 and better["p"] < 0.01 and "10 gained, 0 lost" in better["method"]
    rng = np.random.default_rng(0)
    ref = [[int(v) for v in rng.random(200) < 0.5] for _ in range(4)]
    new = [[int(v) for v in rng.random(200) < 0.5 + 0.1 * (s % 2)] for s in range(4)]  # networks differ
    crossed = item_difference(items("a", new), items("b", ref))
    assert crossed["unit"].endswith("crossed") and crossed["seeds"] == 4 and crossed["n_a"] == 800
    pooled = mcnemar_diff([(a, b) for n, r in zip(new, ref) for a, b in zip(n, r)])
    assert crossed["ci_high"] - crossed["ci_low"] > pooled["ci_high"] - pooled["ci_low"]
    other_problems = [dict(r, doc_hash="x" + r["doc_hash"]) for r in items("a", [[1] * 40] * 2)]
    assert item_difference(other_problems, base) is None  # a different test set pairs nothing
    holed = [dict(r, strict=None) if (r["seed"], r["doc_id"]) == (1, 7) else r for r in base]
    with pytest.raises(ValueError, match="the baseline items hold no strict for seed 1, problem 7 while 79 of 80"):
        item_difference(items("a", [[1] * 20 + [0] * 20] * 2), holed)


@pytest.mark.slow
@given(st.floats(0.01, 10), st.floats(0.05, 5), st.booleans())
def test_n_needed_is_the_smallest_n_whose_design_power_detects_the_effect(sd, effect, one_sided):
    """The bisection against a direct scan (design power falls with n)."""
    from mxfp4.stats import min_detectable_effect, n_needed

    n = n_needed(effect, sd, one_sided=one_sided)
    scan = next((k for k in range(2, 20_000) if min_detectable_effect(sd, k, one_sided=one_sided) <= effect), None)
    if scan is not None:
        assert n == scan
    else:
        assert n is None or n >= 20_000


FIRED = ("better", "worse", "higher", "lower")


def _store(results, profile, where):
    """Aggregate a results folder's cells as stored baselines (cells.csv, items.csv) under ``where``."""
    from mxfp4.report.aggregate import aggregate

    aggregate(Layout(results, profile), where)
    return where / "cells.csv"


@pytest.mark.slow
def test_a_over_a_comparisons_fire_no_verdict_on_the_same_machine_or_another_instruction_set(smoke_results, tmp_path):
    """A recipe against its own stored cells: run here, the stored cells reproduce and serve as the
    references, and no A/A row fires; rerun with the libraries choosing their instruction set (not
    pinned to AVX2), the stored cells do not reproduce where that changes the numbers (AVX-512), so they
    are not used:
    the drift cannot pass for an effect. Each report says which references it used."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    from mxfp4.machine import PINNED
    from mxfp4.report.compare import check_reproduction, run_compare
    from mxfp4.rl.cell import run_cell

    here, other = tmp_path / "here", tmp_path / "other"
    for root in (here, other):
        shutil.copytree(smoke_results / "smoke" / "models", root / "smoke" / "models")
    grid = [(recipe, seed) for recipe in ("bf16", "mxfp4") for seed in (0, 1)]
    for recipe, seed in grid:
        run_cell(Run.of("smoke", here).cell("tiny-dense", recipe, seed))
    stored = _store(here, "smoke", tmp_path / "stored")

    def report(results, name):
        cells = [("tiny-dense", "bf16", 0), ("tiny-dense", "mxfp4", 0)]
        check = check_reproduction(Layout(results, "smoke"), stored, cells)
        (tmp_path / f"{name}.json").write_text(json.dumps(check))
        rows = run_compare(Layout(results, "smoke"), "mxfp4", stored, tmp_path / f"{name}.md",
                           reproduction_json=tmp_path / f"{name}.json")
        report.rows = rows
        return check, [r for r in rows if r["baseline"] == "mxfp4"], (tmp_path / f"{name}.md").read_text()

    check, aa, text = report(here, "here")
    assert check["reproduces"] and check["cells"][0]["compared"] > 10
    assert aa and not [r for r in aa if r["verdict"] in FIRED], aa
    assert all(r["diff"] in (0, None) for r in aa)
    assert "References: the stored baselines, which reproduce on this machine" in text
    # a seed the stored baselines lack: its reference cell, run here, extends them (paired over all 3 seeds)
    for recipe in ("bf16", "mxfp4"):
        run_cell(Run.of("smoke", here).cell("tiny-dense", recipe, 2))
    _, aa, text = report(here, "extended")
    per_seed = [r for r in report.rows if r["baseline"] == "bf16" and r["unit"] == "seeds"]
    accuracy = next(r for r in per_seed if r["metric"] == "gsm8k_strict_accuracy")
    assert accuracy["n_a"] == accuracy["n_b"] == 3, accuracy
    assert any(r["method"] == "paired by seed (t)" and r["n_a"] == 3 for r in per_seed), per_seed
    assert "Seeds the stored baselines lack ran here and extend them: tiny-dense/bf16/seed2." in text
    for recipe in ("bf16", "mxfp4"):
        shutil.rmtree(here / "smoke" / "cells" / "tiny-dense" / recipe / "seed2")

    code = ("from mxfp4.config.run import Run\nfrom mxfp4.rl.cell import run_cell\n"
            f"for recipe, seed in {grid!r}:\n"
            f"    run_cell(Run.of('smoke', {str(other)!r}).cell('tiny-dense', recipe, seed))")
    # the libraries' own choice (AVX-512 where the CPU has it) instead of the AVX2 pins
    env = {k: v for k, v in os.environ.items() if k not in PINNED} | {"MXFP4_CPU_ISA": "native"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True)
    machine = json.loads((other / "smoke/cells/tiny-dense/bf16/seed0/metrics.json").read_text())["machine"]
    assert machine["pinning"]["MXFP4_CPU_ISA"] == "native" and machine["pinning"]["MKL_CBWR"] is None
    check, aa, text = report(other, "other")
    assert not [r for r in aa if r["verdict"] in FIRED], aa
    if check["reproduces"]:  # the instruction set changed no number on this machine: the stored cells serve
        assert "which reproduce on this machine" in text
    else:
        assert not aa and "References: this machine's cells of bf16 (same seeds), not the stored baselines" in text


def test_a_cell_the_stored_baselines_lack_cannot_reproduce_them():
    """A reference recipe absent from the stored baselines (a user's base recipe) sends compare to this
    machine's own cells, never to a partial set of stored ones."""
    from mxfp4.report.compare import reproduction

    stored = [{"model": "tiny-dense", "recipe": "bf16", "seed": 0, "gsm8k_strict_accuracy": 0.5}]
    check = reproduction({"model": "tiny-dense", "recipe": "mine-base", "seed": 0, "gsm8k_strict_accuracy": 0.5},
                         stored)
    assert not check["reproduces"] and "no such cell" in next(iter(check["differing"]))
    assert reproduction(dict(stored[0]), stored)["reproduces"]
    changed = {**stored[0], "gsm8k_strict_accuracy": 0.5 + 1e-12}
    assert reproduction(changed, stored)["differing"] == {"gsm8k_strict_accuracy": [0.5, 0.5 + 1e-12]}


def test_the_cost_estimate_counts_the_cells_to_run_at_their_stored_wall_times():
    from mxfp4.report.compare import cost_estimate

    stored = [{"model": "d", "recipe": "bf16", "seed": s, "wall_time_seconds": 60.0} for s in (0, 1)]
    stored += [{"model": "d", "recipe": "mxfp4", "seed": s, "wall_time_seconds": w}
               for s, w in ((0, 100.0), (1, 140.0))]
    stored += [{"model": "e", "recipe": "bf16", "seed": 0, "wall_time_seconds": 120.0}]
    # a new recipe costs what its base (mxfp4) did; where its base is not stored, the model's slowest recipe
    line = cost_estimate(stored, [("d", "mxfp4+rht-sr", 0), ("d", "bf16", 3), ("e", "mxfp4+rht-sr", 0)], cores=2)
    assert line.startswith("compare: 3 cells to run, about 6 CPU-minutes") and "about 3 minutes on 2 core(s)" in line
    assert "no stored cell of m" in cost_estimate(stored, [("m", "bf16", 0)], cores=2)
    assert "only the report is left" in cost_estimate(stored, [], cores=2)


def test_a_measurement_no_seed_changes_is_tested_per_problem_not_per_seed():
    """Before RL every seed evaluates the same warm start: one value a side for all seeds. Three equal
    differences are no replicates, so the per-seed row stays untested (a t test would read their zero
    spread as certainty) and the per-problem row carries the test (McNemar, as scipy's binomial test), each
    problem's one measurement counted once, not once per seed."""
    from scipy.stats import binomtest

    def cells(recipe, before, after):
        return [dict(c, gsm8k_strict_accuracy_before=before) for c in _cells(recipe, after)]

    def items(recipe, before):
        return [{"model": "tiny-dense", "recipe": recipe, "seed": s, "doc_id": i, "doc_hash": f"h{i}",
                 "strict": 1.0, "strict_before": float(c)} for s in range(3) for i, c in enumerate(before)]

    # 6 problems gained and 1 lost, the same ones in every seed's copy: 6 gained, 1 lost over 40 problems
    base_before = [1] * 10 + [0] * 30
    new_before = [0] + [1] * 9 + [1] * 6 + [0] * 24
    rows = compare_rows(cells("mine", 0.4, [0.5, 0.6, 0.7]), cells("mxfp4", 0.25, [0.4, 0.45, 0.5]), "mine",
                        items("mine", new_before), items("mxfp4", base_before))
    per_seed = next(r for r in rows if r["metric"] == "gsm8k_strict_accuracy_before")
    assert per_seed["p"] is None and per_seed["diff"] == pytest.approx(0.15)
    assert per_seed["verdict"].startswith("untested per seed")
    per_problem = next(r for r in rows if r["metric"] == "gsm8k_strict_accuracy_before (per problem)")
    assert per_problem["diff"] == pytest.approx(5 / 40) and per_problem["n_a"] == 40
    assert per_problem["p"] == pytest.approx(binomtest(6, 7).pvalue) and "counted once" in per_problem["method"]
    # a metric that varies over seeds keeps its paired t test
    after = next(r for r in rows if r["metric"] == "gsm8k_strict_accuracy")
    assert after["method"] == "paired by seed (t)" and after["p"] is not None

"""The entropy claim during RL over networks: per-network gaps, three outcomes, fixed halves, refusals."""

import numpy as np
import pytest

from mxfp4.report import entropy_trajectory as et


def steps_rows(gap_plain, gap_aqn, networks=8, steps=24, noise=0.002, seed=0, model="tiny-dense"):
    """steps.csv rows: BF16 entropy per network and step, MXFP4 and AQN shifted by their network's gap."""
    rng = np.random.default_rng(seed)
    rows = []
    for k, net in enumerate(range(20, 20 + networks)):
        base = 0.2 + 0.01 * k + rng.normal(0, noise, steps)
        for recipe, gap in (("bf16", 0.0), ("mxfp4", gap_plain(k)), ("mxfp4+aqn", gap_aqn(k))):
            h = base + gap + (rng.normal(0, noise, steps) if recipe != "bf16" else 0)
            rows += [{"model": model, "recipe": recipe, "seed": str(net), "step": str(t + 1), "entropy": str(v)}
                     for t, v in enumerate(h)]
    return rows


def test_a_narrowed_gap_is_held_and_the_contrast_is_the_mean_of_per_network_absolute_gaps():
    rows = steps_rows(lambda k: -0.03 - 0.002 * k, lambda k: -0.005)
    result = et.analyse(rows, "tiny-dense")
    whole = result["rows"][0]
    assert whole["verdict"].startswith("held") and whole["networks"] == 8 and whole["decided_by"] == "mxfp4+aqn"
    # an independent computation of the contrast from the rows
    by = {}
    for r in rows:
        by.setdefault((r["recipe"], int(r["seed"])), []).append(float(r["entropy"]))
    diffs = [abs(np.mean(np.subtract(by["mxfp4", n], by["bf16", n]))) - abs(np.mean(np.subtract(by["mxfp4+aqn", n],
                                                                                               by["bf16", n])))
             for n in range(20, 28)]
    assert whole["diff"] == pytest.approx(float(np.mean(diffs)), abs=1e-12)
    assert [r["networks"] for r in result["rows"][1:]] == [4, 4] and result["halves"] == ([20, 22, 24, 26],
                                                                                           [21, 23, 25, 27])
    premise = {p["recipe"]: p for p in result["premise"]}
    assert premise["mxfp4"]["ci_high"] < 0 < premise["mxfp4+aqn"]["mean"] + 0.01


def test_a_widened_gap_is_contradicted_and_equal_gaps_are_no_dominance():
    widened = et.analyse(steps_rows(lambda k: -0.005, lambda k: -0.03 - 0.002 * k), "tiny-dense")["rows"][0]
    assert widened["verdict"] == "contradicted" and widened["decided_by"] == "mxfp4+aqn"
    equal = et.analyse(steps_rows(lambda k: -0.03, lambda k: -0.03, noise=0.0005), "tiny-dense")["rows"][0]
    assert equal["verdict"] == "no dominance" and abs(equal["diff"]) < et.MARGIN


def test_runs_of_different_lengths_or_without_entropy_are_refused():
    rows = steps_rows(lambda k: -0.03, lambda k: -0.01)
    short = [r for r in rows if not (r["recipe"] == "mxfp4+aqn" and r["seed"] == "23" and r["step"] == "24")]
    with pytest.raises(ValueError, match="rerun the shorter cell"):
        et.analyse(short, "tiny-dense")
    rows[5]["entropy"] = ""
    with pytest.raises(ValueError, match="no finite entropy"):
        et.analyse(rows, "tiny-dense")
    with pytest.raises(ValueError, match="no mxfp4\\+aqn run"):
        et.analyse([r for r in steps_rows(lambda k: 0, lambda k: 0) if r["recipe"] != "mxfp4+aqn"], "tiny-dense")


def test_the_report_names_method_n_verdicts_and_every_network(tmp_path):
    from mxfp4.report.aggregate import write_csv

    steps = tmp_path / "steps.csv"
    write_csv(steps_rows(lambda k: -0.03, lambda k: -0.005), steps)
    rows = et.run(steps, "networks-rl", tmp_path / "e.md", tmp_path / "e.csv")
    text = (tmp_path / "e.md").read_text()
    assert "t over the 8 networks (df 7)" in text and "half 1" in text and "| 27 |" in text
    assert len(rows) == 3 and all("verdict" in r and "_contrast" not in r for r in rows)
    assert len((tmp_path / "e.csv").read_text().splitlines()) == 1 + 2 * 8 * 24


@pytest.mark.parametrize("profile", ["networks-rl", "networks-moe-rl"])
def test_the_stored_entropy_test_is_what_its_stored_steps_make(tmp_path, profile):
    """results/baselines/<profile>/entropy_trajectory.md and .csv are recomputed from the stored steps.csv."""
    from pathlib import Path

    stored = Path(__file__).resolve().parents[2] / "results" / "baselines" / profile
    et.run(stored / "steps.csv", profile, tmp_path / "e.md", tmp_path / "e.csv")
    assert (tmp_path / "e.md").read_text() == (stored / "entropy_trajectory.md").read_text()
    assert (tmp_path / "e.csv").read_text() == (stored / "entropy_trajectory.csv").read_text()

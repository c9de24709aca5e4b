"""REPORT.md of a profile: its numbers against the per-cell values they summarise, its verdict counts
against a claims table of known verdicts, and a clear error where the run has not aggregated."""

import csv
import statistics
from pathlib import Path

import pytest

from mxfp4.layout import Layout
from mxfp4.report.profile_report import accuracy_table, claims_summary, run

STORED = Path(__file__).resolve().parents[2] / "results" / "baselines" / "embedded"


def _table(text: str) -> list[dict]:
    lines = [ln for ln in text.splitlines() if ln.startswith("| ")]
    header = [h.strip() for h in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[2:]]


def test_the_accuracy_table_is_the_mean_over_each_recipes_cells():
    """Before, after and unquantized accuracy equal the mean of the stored cells' values (cells.csv, one
    row per seed), to the table's three decimals; the RL gain carries its interval and its n."""
    cells = list(csv.DictReader((STORED / "cells.csv").open()))
    text = accuracy_table(STORED / "summary.csv")
    rows = _table(text)
    assert {(r["model"], r["recipe"]) for r in rows} == {(c["model"], c["recipe"]) for c in cells}
    for r in rows:
        mine = [c for c in cells if (c["model"], c["recipe"]) == (r["model"], r["recipe"])]
        for key, header in (("gsm8k_strict_accuracy_before", "before RL"), ("gsm8k_strict_accuracy", "after RL"),
                            ("gsm8k_strict_accuracy_unquantized", "after RL, unquantized")):
            assert float(r[header]) == pytest.approx(statistics.mean(float(c[key]) for c in mine), abs=5.01e-4)
        gain, interval = r["RL gain [95% CI]"].split(" [")
        low, high = (float(x) for x in interval.rstrip("]").split(", "))
        assert low < float(gain) < high
    assert "n = 1200" in text and f"mean over {len(cells) // len(rows)} seed(s)" in text


def test_the_accuracy_note_names_each_planted_flaw_whose_rows_the_table_has_and_the_warm_starts():
    """The confirmatory profile plants two flaws and starts each seed from its own warm start: the table has a
    gain column per flaw, and the note below it names each flaw and the warm starts."""
    from mxfp4.config.profiles import load_profile

    pretrain = load_profile("embedded-large").pretrain
    text = accuracy_table(STORED.parent / "embedded-large" / "summary.csv", pretrain.flaws, pretrain.warm_starts)
    heads, note = _table(text)[0].keys(), text.split("\n\n")[-1]
    assert len(pretrain.flaws) == 2 and pretrain.warm_starts == 3
    for flaw in pretrain.flaws:
        assert f"RL gain, flaw:{flaw} problems" in heads and flaw in note
    assert "the i-th from warm start i of 3" in note
    assert "warm start i" not in accuracy_table(STORED / "summary.csv")  # one warm start: nothing to say


def test_the_claims_summary_counts_each_verdict_and_lists_the_rows_that_resolved(tmp_path):
    header = "| claim | model | value | verdict |\n| --- | --- | --- | --- |\n"
    rows = [("A", "held"), ("B", "held"), ("C", "contradicted"), ("D", "not shown"), ("E", "not shown"),
            ("F", "not shown"), ("G", "by construction")]
    claims = tmp_path / "claims.md"
    claims.write_text("# Claims\n\nprose | with a bar\n\n" + header
                      + "".join(f"| {c} | m | +0.1 | {v} |\n" for c, v in rows))
    text = claims_summary(claims)
    assert text.startswith("7 rows (by construction: 1, contradicted: 1, held: 2, not shown: 3).")
    resolved = _table(text.split("Rows that resolved:")[1])
    assert [r["claim"] for r in resolved] == ["A", "B", "C"]


def test_a_run_without_its_aggregate_is_refused_with_the_step_that_makes_it(tmp_path):
    with pytest.raises(ValueError, match=r"summary.csv is missing: run the profile's aggregate step"):
        run(Layout(tmp_path, "embedded"))


def test_the_stored_reports_are_the_ones_their_baselines_make(tmp_path):
    """Each committed REPORT.md is what ``mxfp4 report --stored`` writes from the stored tables beside it."""
    for folder in sorted(STORED.parent.iterdir()):
        if (folder / "summary.csv").is_file():
            out = run(Layout(STORED.parents[1], folder.name), tmp_path / f"{folder.name}.md", stored=True)
            assert out.read_text() == (folder / "REPORT.md").read_text(), folder.name


def test_the_claims_summary_shows_the_primary_family_apart_from_the_secondary_rows(tmp_path):
    primary = "| claim | model | verdict |\n| --- | --- | --- |\n| P | m | **held** |\n"
    secondary = "| claim | model | value | verdict |\n| --- | --- | --- | --- |\n| S | m | +0.1 | contradicted |\n"
    claims = tmp_path / "claims.md"
    claims.write_text("# Claims\n\n## Primary family\n\nprose\n\n" + primary + "\n## Secondary rows\n\n" + secondary)
    text = claims_summary(claims)
    assert text.startswith("Primary family") and primary.strip() in text
    assert "Secondary rows: 1 rows (contradicted: 1)." in text
    resolved = _table(text.split("Rows that resolved:")[1])
    assert [r["claim"] for r in resolved] == ["S"] and "value" in resolved[0]


def test_a_packaged_models_weight_caveat_and_the_regime_table_open_the_report():
    """A packaged checkpoint's model line says where its weights come from (Q4_1 for SmolLM2): the report
    states it; the regime table of regime.md, its rows unchanged, has a section of its own."""
    from mxfp4.config.profiles import load_profile
    from mxfp4.report.profile_report import model_notes, regime_section

    notes = model_notes(load_profile("real-small"))
    assert len(notes) == 1 and notes[0].startswith("smollm2-135m: ") and "Q4_1" in notes[0]
    assert model_notes(load_profile("embedded")) == []  # tiny stand-ins: no model line
    regime = STORED / "regime.md"
    section = regime_section(regime)
    rows = [ln for ln in regime.read_text().splitlines() if ln.startswith("| tiny-")]
    assert rows and all(ln in section.splitlines() for ln in rows) and "Published figures" not in section


def _items(path, outcomes: dict[str, list[int]], before: dict[str, list[int]]):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "recipe", "seed", "doc_hash", "doc_id", "problem_type", "strict_before", "strict"])
        for recipe, after in outcomes.items():
            for i, (b, a) in enumerate(zip(before[recipe], after)):
                w.writerow(["m", recipe, 0, f"h{i}", i, "rest", b, a])


def test_each_correction_is_paired_per_problem_with_mxfp4_and_bf16(tmp_path):
    """A correction that solves 10 problems MXFP4 misses and misses 2 it solves reads +8/40 against MXFP4,
    with the exact binomial p of 10 in 12 (scipy's own test); recipes that are no MXFP4 plus corrections are
    not rows; a run with no corrected recipe has no table."""
    from scipy.stats import binomtest

    from mxfp4.report.profile_report import corrections_table

    n = 40
    mxfp4 = [1] * 20 + [0] * 20
    macro = [0] * 2 + [1] * 18 + [1] * 10 + [0] * 10  # loses 2 of mxfp4's, gains 10
    bf16 = [1] * 30 + [0] * 10
    _items(tmp_path / "items.csv", {"bf16": bf16, "mxfp4": mxfp4, "mxfp4+macro": macro},
           {"bf16": bf16, "mxfp4": mxfp4, "mxfp4+macro": mxfp4})
    rows = _table(corrections_table(tmp_path / "items.csv"))
    assert [(r["recipe"], r["stage"]) for r in rows] == [("mxfp4+macro", "before RL"), ("mxfp4+macro", "after RL")]
    after = rows[1]
    assert after["accuracy"] == f"{sum(macro) / n:.3f}"
    assert after["minus mxfp4 [95% CI], p"].startswith(f"{8 / n:+.3f} [")
    assert f"p {binomtest(10, 12).pvalue:.2g} (10 gained, 2 lost)" in after["minus mxfp4 [95% CI], p"]
    gained = sum(a > b for a, b in zip(macro, bf16))
    lost = sum(a < b for a, b in zip(macro, bf16))
    assert after["minus bf16 [95% CI], p"].startswith(f"{(gained - lost) / n:+.3f} [")
    assert rows[0]["minus mxfp4 [95% CI], p"].startswith("+0.000 [+0.000, +0.000], p 1 (0 gained, 0 lost)")
    _items(tmp_path / "plain.csv", {"bf16": bf16, "mxfp4": mxfp4}, {"bf16": bf16, "mxfp4": mxfp4})
    assert corrections_table(tmp_path / "plain.csv") == ""

"""The headline recovery over networks: the crossed estimate, symmetric verdicts, the fixed design, refusals."""

from pathlib import Path

import numpy as np
import pytest

from mxfp4.config.profiles import HEADLINE_MAX_MDE, HeadlineDesign, load_profile
from mxfp4.report import network_recovery as nr
from mxfp4.report.aggregate import read_csv, write_csv
from mxfp4.report.claims import NONINFERIORITY_MARGIN

STORED = Path(__file__).resolve().parents[2] / "results" / "baselines" / "networks-rl"


def design_of_profile(profile) -> HeadlineDesign | None:
    """A profile's headline design: its network-recovery block, checked against the rest of the profile."""
    from mxfp4.studies import registered

    return registered()["network-recovery"].settings_of(profile)


def design_of(name: str) -> HeadlineDesign | None:
    return design_of_profile(load_profile(name))


def grid(shift, networks=8, problems=60, flip=0.05, seed=0, model="tiny-dense", silent=()):
    """cells.csv and items.csv rows: BF16 right on a problem with its network's rate; mxfp4+all the same answers,
    each flipped with probability ``flip``, then ``shift`` of the problems made right (shift > 0) or wrong."""
    rng = np.random.default_rng(seed)
    cells, items = [], []
    for k, net in enumerate(range(20, 20 + networks)):
        before = (rng.random(problems) < 0.3).astype(float)
        ref = (rng.random(problems) < 0.55 + 0.02 * k).astype(float)
        fix = np.where(rng.random(problems) < flip, 1 - ref, ref)
        moved = rng.random(problems) < abs(shift)
        fix = np.where(moved, 1.0 if shift > 0 else 0.0, fix)
        for recipe, strict in (("bf16", ref), ("mxfp4+all", fix)):
            signal = 0 if (net, recipe) in silent else 24
            cells.append({"model": model, "recipe": recipe, "seed": net, "gsm8k_strict_accuracy": float(strict.mean()),
                          "gsm8k_strict_accuracy_before": float(before.mean()), "learning_signal_steps": signal})
            items += [{"model": model, "recipe": recipe, "seed": net, "doc_id": i, "doc_hash": f"h{i}",
                       "strict": float(s), "strict_before": float(b)} for i, (s, b) in enumerate(zip(strict, before))]
    return cells, items


def test_the_estimate_is_the_mean_paired_difference_and_the_halves_are_fixed():
    cells, items = grid(0.0)
    result = nr.analyse(cells, items, "tiny-dense", None)
    whole = result["rows"][0]
    by = {(r["recipe"], r["seed"], r["doc_id"]): r["strict"] for r in items}
    expected = np.mean([by["mxfp4+all", s, i] - by["bf16", s, i] for s in range(20, 28) for i in range(60)])
    assert whole["diff"] == pytest.approx(float(expected), abs=1e-12)
    assert (whole["networks"], whole["problems"], whole["family"]) == (8, 60, "secondary")
    assert result["halves"] == ([20, 22, 24, 26], [21, 23, 25, 27])
    assert [r["networks"] for r in result["rows"][1:3]] == [4, 4]
    assert {r["family"] for r in result["rows"][1:3]} == {"replication"}


def test_verdicts_are_symmetric_about_the_margin():
    held = nr.analyse(*grid(+0.3), "tiny-dense", None)["rows"][0]
    contradicted = nr.analyse(*grid(-0.4), "tiny-dense", None)["rows"][0]
    assert held["verdict"] == "held" and held["diff"] > held["null"]
    assert contradicted["verdict"] == "contradicted" and contradicted["diff"] < contradicted["null"]
    assert held["null"] == -NONINFERIORITY_MARGIN


def test_a_network_without_learning_signal_leaves_the_rl_gain_rows_only():
    cells, items = grid(0.0, silent={(23, "mxfp4+all")})
    result = nr.analyse(cells, items, "tiny-dense", None)
    final = [r for r in result["rows"] if r["metric"] == nr.FINAL]
    gain = [r for r in result["rows"] if r["metric"] == nr.GAIN]
    assert result["silent"] == [23]
    assert [r["networks"] for r in final] == [8, 4, 4] and [r["networks"] for r in gain] == [7, 4, 3]
    text = nr.markdown(result, "toy")
    assert "left out of the RL gain rows): 23 (of 8)" in text and "no learning signal" in text


def test_the_design_decides_the_family():
    cells, items = grid(0.0)
    design = HeadlineDesign(**nr.design_from(items, "tiny-dense", "mxfp4+all", "toy"))
    primary = design.model_copy(update={"mde": HEADLINE_MAX_MDE, "primary": True})
    rows = nr.analyse(cells, items, "tiny-dense", primary)["rows"]
    assert [r["family"] for r in rows if r["part"] == "all networks"] == ["primary", "secondary"]
    with pytest.raises(ValueError, match="primary exactly where"):
        HeadlineDesign(**{**design.model_dump(), "primary": not design.primary})


def test_too_few_networks_and_a_headline_without_its_recipes_are_refused():
    cells, items = grid(0.0, networks=1)
    with pytest.raises(ValueError, match="1 network\\(s\\) with both bf16 and mxfp4\\+all"):
        nr.analyse(cells, items, "tiny-dense", None)
    profile = load_profile("networks-rl")
    with pytest.raises(ValueError, match="studies.network-recovery: the headline compares mxfp4\\+all with bf16 .*"
                                         "recipes that include bf16, mxfp4, mxfp4\\+all"):
        design_of_profile(profile.model_copy(update={"recipes": ["bf16", "mxfp4"]}))


def test_the_report_names_method_n_and_every_network(tmp_path):
    cells, items = grid(0.0)
    write_csv(cells, tmp_path / "cells.csv")
    write_csv(items, tmp_path / "items.csv")
    rows = nr.run(tmp_path / "cells.csv", tmp_path / "items.csv", "toy", None, tmp_path / "r.md", tmp_path / "r.csv")
    text = (tmp_path / "r.md").read_text()
    assert "crossed random-effects model" in text and "| 27 |" in text and "None in the profile" in text
    assert len(rows) == 6 and len(read_csv(tmp_path / "r.csv")) == 6


@pytest.mark.parametrize(("profile", "model"), [("networks-rl", "tiny-dense"), ("networks-moe-rl", "tiny-moe")])
def test_the_stored_design_is_what_the_stored_pilot_cells_make(profile, model):
    """A profile's headline design recomputes from its stored bf16 and mxfp4 rows (the pilot contrast)."""
    design = design_of(profile)
    made = nr.design_from(read_csv(STORED.parent / profile / "items.csv"), model, design.stand_in, design.pilot)
    stored = design.model_dump()
    assert made["components"] == pytest.approx(stored.pop("components"), rel=1e-9)
    assert made.pop("mde") == pytest.approx(stored.pop("mde"), rel=1e-9)
    assert {k: v for k, v in made.items() if k != "components"} == stored


@pytest.mark.parametrize("profile", ["networks-rl", "networks-arithmetic", "networks-moe-rl"])
def test_the_stored_headline_is_what_its_stored_cells_make(tmp_path, profile):
    stored = STORED.parent / profile
    arithmetic = stored / "items_arithmetic.csv"
    nr.run(stored / "cells.csv", stored / "items.csv", profile, design_of(profile), tmp_path / "r.md",
           tmp_path / "r.csv", arithmetic if arithmetic.is_file() else None)
    assert (tmp_path / "r.md").read_text() == (stored / "recovery_networks.md").read_text()
    assert (tmp_path / "r.csv").read_text() == (stored / "recovery_networks.csv").read_text()
    assert arithmetic.is_file() == load_profile(profile).data.arithmetic_held_out


def test_the_command_prints_a_design_the_profile_accepts_and_writes_the_report(tmp_path, capsys):
    import yaml

    from mxfp4.cli import main

    cells, items = grid(0.0)
    write_csv(cells, tmp_path / "cells.csv")
    write_csv(items, tmp_path / "items.csv")
    assert main(["network-recovery", "--profile", "networks-rl", "--design", "--stand-in", "mxfp4+all",
                 "--items", str(tmp_path / "items.csv")]) == 0
    design = HeadlineDesign(**yaml.safe_load(capsys.readouterr().out)["studies"]["network-recovery"])
    assert design.problems == 60 and design.networks == 8 and design.pilot == "networks-rl"
    out = tmp_path / "r.md"
    assert main(["network-recovery", "--profile", "networks-rl", "--cells", str(tmp_path / "cells.csv"), "--items",
                 str(tmp_path / "items.csv"), "--out", str(out)]) == 0
    assert out.is_file() and out.with_suffix(".csv").is_file() and "wrote" in capsys.readouterr().out


def test_new_arithmetic_gets_every_row_again_as_secondary_rows():
    cells, items = grid(0.0)
    _, arithmetic = grid(-0.4, seed=1)
    for c in cells:
        c.update(gsm8k_strict_accuracy_arithmetic=0.1, gsm8k_strict_accuracy_before_arithmetic=0.05)
    design = HeadlineDesign(**{**nr.design_from(items, "tiny-dense", "mxfp4+all", "toy"), "mde": HEADLINE_MAX_MDE,
                               "primary": True})
    result = nr.analyse(cells, items, "tiny-dense", design, arithmetic)
    whole = {(r["split"], r["metric"]): r for r in result["rows"] if r["part"] == "all networks"}
    assert set(whole) == {(s, m) for s in ("wording", "arithmetic") for m in (nr.FINAL, nr.GAIN)}
    assert [k for k, r in whole.items() if r["family"] == "primary"] == [("wording", nr.FINAL)]
    assert whole[("arithmetic", nr.FINAL)]["verdict"] == "contradicted"
    by = {(r["recipe"], r["seed"], r["doc_id"]): r["strict"] for r in arithmetic}
    expected = np.mean([by["mxfp4+all", s, i] - by["bf16", s, i] for s in range(20, 28) for i in range(60)])
    assert whole[("arithmetic", nr.FINAL)]["diff"] == pytest.approx(float(expected), abs=1e-12)
    text = nr.markdown(result, "toy")
    assert nr.SPLITS["arithmetic"] in text and "; 0.10 (0.05)" in text and "No MXFP4 recipe but" in text

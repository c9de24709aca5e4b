"""A recipe's mechanism at the warm starts: its arms are the pathway matrix's, unit for unit, and its report decides
each contrast on network means, naming the rival."""

import csv

import numpy as np
import pytest

from mxfp4.analysis.mechanism import run_mechanism
from mxfp4.analysis.pathways.matrix import run_pathways
from mxfp4.analysis.pathways.spec import UNIT_FIELDS
from mxfp4.config.profiles import load_profile
from mxfp4.config.run import Run
from mxfp4.report.mechanism import markdown, mechanism_rows, run
from mxfp4.report.network_claims import read_units


def _harms(path):
    with open(path, newline="") as f:
        return {(u["pathway"], u["arm"], int(u["unit"])): u["harm"] for u in csv.DictReader(f)}


@pytest.mark.slow
def test_the_mechanism_arms_are_the_pathway_matrix_arms_unit_for_unit(smoke_results, tmp_path, monkeypatch):
    """MXFP4, BF16 and each correction arm measured by the mechanism run equal the pathway matrix's on the same
    batches and prompts, bit for bit; the recipe's arm is added; a recipe without numerics (AQN acts on the
    rollouts only) leaves every weight's error energy as it is."""
    profile = load_profile("smoke")
    settings = profile.pathways.model_copy(update={
        "checkpoints": ["warm"], "controls": [], "additivity_steps": [], "scale_rules": [], "batches": 3,
        "forms": ["canonical"], "corrections": ["mxfp4+macro", "mxfp4+fallback"]})
    profile = profile.model_copy(update={"pathways": settings})
    matrix, mech = tmp_path / "matrix.csv", tmp_path / "mech.csv"
    run_pathways(Run.of(profile, smoke_results), "tiny-dense", progress=lambda m: None, out_units=matrix)
    units, energies = run_mechanism(Run.of(profile, smoke_results), "tiny-dense", ["mxfp4+aqn"], out_units=mech,
                                    progress=lambda m: None)
    assert [e["operand"] for e in energies] == ["weights", "activations", "product"]
    a, b = _harms(matrix), _harms(mech)
    assert {arm for _, arm, _ in b} == {"none", "all", "mxfp4+aqn", "mxfp4+macro", "mxfp4+fallback"}
    shared = [k for k in b if k[1] != "mxfp4+aqn"]
    assert shared and all(b[k] == a[k] for k in shared)
    assert {u["seed"] for u in units} == set(profile.seeds)
    for energy in energies:
        assert energy["recipe"] == "mxfp4+aqn"
        for c in ("scale", "dead", "grid", "total") if energy["operand"] != "product" else ("total",):
            assert energy[f"energy_{c}_after"] == energy[f"energy_{c}_before"] > 0
    # placed against a stored board: its own anchors pass; one harm changed stops the run before any recipe's arm
    stored = read_units([mech])
    run_mechanism(Run.of(profile, smoke_results), "tiny-dense", ["mxfp4+aqn"], progress=lambda m: None,
                  energy=False, against=stored)
    moved = [dict(r, harm=r["harm"] + 1e-6) if r["arm"] == "all" and r["pathway"] == "rollout" else r for r in stored]
    with pytest.raises(ValueError, match=r"do not reproduce the stored board's, before any recipe was measured: the "
                                         r"first unit that differs is tiny-dense/warm/canonical/rollout/all/"):
        run_mechanism(Run.of(profile, smoke_results), "tiny-dense", ["mxfp4+aqn"], progress=lambda m: None,
                      energy=False, against=moved)
    # a plugin's GEMM-level recipe placed on that board: measured after the anchors reproduce, merged by full unit
    # identity, ranked beside the board's recipe with its energy taken in the basis it quantizes in
    from mxfp4 import corrections as corr
    from mxfp4.report.leaderboard import board, merged
    from plugins import PowerOfTwoSmoothing

    corr.register("test_smoothing")(PowerOfTwoSmoothing)
    try:
        (tmp_path / "mine.yaml").write_text("mine-smooth: {base: mxfp4, corrections: [test_smoothing]}\n")
        monkeypatch.setenv("MXFP4_RECIPES", str(tmp_path / "mine.yaml"))
        placed, energies = run_mechanism(Run.of(profile, smoke_results), "tiny-dense", ["mine-smooth"],
                                         out_units=tmp_path / "placed.csv", progress=lambda m: None, against=stored)
        assert {e["operand"] for e in energies} == {"weights", "activations", "product"}
        assert any(e["energy_scale_after"] != e["energy_scale_before"] for e in energies)
        units = merged(stored, read_units([tmp_path / "placed.csv"]), "mine-smooth")
        claims = load_profile("networks").pathways.claims.model_copy(update={"form": "canonical"})  # smoke fixes none
        ranked = board(units, profile.model_copy(update={"pathways": settings.model_copy(update={"claims": claims})}),
                       ["mxfp4+aqn", "mine-smooth"])["tiny-dense"]
        assert {r["recipe"] for r in ranked} == {"mxfp4+aqn", "mine-smooth", "mxfp4", "bf16"}
        assert sorted(r["rank"] for r in ranked) == [1, 2, 3, 4]
    finally:
        corr.REGISTRY.pop("test_smoothing", None)


def _units(profile, harm: dict[str, float], per_network_sd=0.002, n=6, seed=0):
    """Synthetic per-unit rows of every pathway: arm -> mean harm, each network (seed) shifted a little."""
    rng = np.random.default_rng(seed)
    harm = {**dict.fromkeys(profile.pathways.corrections, harm["all"]), **harm}  # every arm a mechanism run measures
    rows = []
    for pathway in ("gradient", "rollout", "entropy"):
        for arm, mean in harm.items():
            for s in profile.seeds:
                shift = rng.normal(0, per_network_sd)
                for i in range(n):
                    value = 0.0 if arm == "none" and pathway != "entropy" else mean + shift + rng.normal(0, 1e-4)
                    value += 1.0 if pathway == "entropy" else 0.0  # an entropy's level (>= 0); the gaps are the same
                    rows.append({"model": "tiny-dense", "checkpoint": "warm", "form": profile.pathways.claims.form,
                                 "pathway": pathway, "arm": arm, "unit": s * 100 + i, "group": "warm", "seed": s,
                                 "key": "", "harm": value})
    return rows


def test_the_report_decides_each_rival_on_network_means_and_ranks_the_recipe(tmp_path):
    profile = load_profile("embedded-large")
    units = _units(profile, {"none": 0.0, "all": 0.30, "mine": 0.10, "mxfp4+macro": 0.20, "mxfp4+fallback": 0.1001})
    rows = {(r["pathway"], r["rival"]): r for r in mechanism_rows(units, "mine", profile)}
    g = rows[("gradient", "mxfp4")]
    assert g["verdict"] == "lower harm than mxfp4" and g["networks"] == 3
    assert g["diff"] == pytest.approx(0.20, abs=0.01) and g["ci_low"] > 0
    assert rows[("gradient", "bf16")]["verdict"] == "higher harm than bf16"
    assert rows[("gradient", "mxfp4+macro")]["verdict"] == "lower harm than mxfp4+macro"
    assert rows[("gradient", "mxfp4+fallback")]["verdict"].startswith("within the margin of mxfp4+fallback")
    assert g["rank"] in (2, 3) and g["arms"] == 6  # bf16 first, then mine and fallback within a hair (and aqn)
    assert g["within"]["n"] == 18  # the units inside the networks, shown beside
    path = tmp_path / "u.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, UNIT_FIELDS)
        w.writeheader()
        w.writerows(units)
    out = run([path], "mine", "embedded-large", tmp_path / "mine.md", energy=[])
    assert len(out) == len(rows)
    text = (tmp_path / "mine.md").read_text()
    assert "| tiny-dense | gradient | mxfp4 |" in text and "lower harm than mxfp4" in text


def test_one_network_gives_inconclusive_verdicts_and_says_so():
    profile = load_profile("embedded-large")
    one = profile.model_copy(update={"seeds": [10], "pretrain": profile.pretrain.model_copy(update={"warm_starts": 1})})
    rows = mechanism_rows(_units(one, {"none": 0.0, "all": 0.3, "mine": 0.1}), "mine", one)
    assert rows and all(r["verdict"] == "inconclusive (fewer than two networks)" for r in rows)
    assert all(r["within"]["diff"] is not None for r in rows if r["rival"] == "mxfp4")
    assert "not about the model class" in markdown(rows, "mine", "x", [])


@pytest.mark.parametrize("seed", range(6))
def test_every_verdict_agrees_with_its_printed_interval(seed):
    """Harms close enough that some contrasts sit near their bound: over the model's rows (one Bonferroni family)
    a lower-harm verdict is exactly an interval above 0, a higher-harm one an interval below 0, printed at the
    family's level."""
    profile = load_profile("embedded-large")
    rng = np.random.default_rng(seed)
    harms = {"none": 0.0, "all": 0.3, "mine": 0.2, "mxfp4+macro": 0.2 + rng.normal(0, 0.004),
             "mxfp4+fallback": 0.2 + rng.normal(0, 0.004)}
    rows = mechanism_rows(_units(profile, harms, per_network_sd=0.004, seed=seed), "mine", profile)
    assert {r["family"] for r in rows} == {len(rows)} and rows[0]["level"] == pytest.approx(1 - 0.1 / len(rows))
    for r in rows:
        assert r["verdict"].startswith("lower harm") == (r["ci_low"] > 0), r
        assert r["verdict"].startswith("higher harm") == (r["ci_high"] < 0), r


def test_the_anchor_check_reads_the_anchors_of_a_run_part_way_through_its_seeds():
    """At the second seed's anchor check the first seed's correction arms cover only its own units: the check reads
    the mxfp4 and bf16 arms alone (every unit), where reading every arm failed on the shorter ones."""
    from mxfp4.analysis.pathways.estimates import unit_rows
    from mxfp4.analysis.pathways.measurement import Measured

    m = Measured()
    cos = lambda c: {"total": {"cosine": c}}  # noqa: E731
    m.grad[("all", "both")] = [cos(0.9), cos(0.8), cos(0.7), cos(0.6)]  # two seeds' batches
    m.grad[("mxfp4+macro", "both")] = [cos(0.95), cos(0.85)]  # the first seed's alone so far
    m.grad_groups, m.grad_seeds, m.grad_keys = ["warm"] * 4, [20, 20, 21, 21], ["a", "b", "c", "d"]
    with pytest.raises(ValueError, match="shorter"):
        unit_rows("tiny-dense", "warm", "gain", m, ["both"])
    rows = unit_rows("tiny-dense", "warm", "gain", m, ["both"], arms=("all", "none"))
    assert [(r["arm"], r["seed"]) for r in rows if r["seed"] == 21] == [("none", 21), ("none", 21), ("all", 21),
                                                                       ("all", 21)]
    assert [r["harm"] for r in rows if r["arm"] == "all"] == pytest.approx([0.1, 0.2, 0.3, 0.4])


def test_a_named_models_mechanism_takes_its_units_as_the_replicates():
    """real-small-board (one pretrained model; its design's replicate is the unit): each row is paired over the
    model's units, not read as one network and left inconclusive; the interval is the paired t over the units
    (scipy), at the family's level."""
    from pathlib import Path

    from scipy import stats

    profile = load_profile("real-small-board")
    units = read_units([Path(__file__).resolve().parents[2] / "results/baselines/real-small-board/leaderboard/"
                        "smollm2-135m_units.csv"])
    rows = {(r["pathway"], r["rival"]): r for r in mechanism_rows(units, "mxfp4+smooth", profile)}
    rollout = rows[("rollout", "mxfp4")]
    assert rollout["replicate"] == "units" and rollout["networks"] == 8 and rows[("gradient", "mxfp4")]["networks"] == 2
    assert not any(r["verdict"].startswith("inconclusive") for r in rows.values() if r["networks"] >= 2)
    harm = {a: [r["harm"] for r in sorted(units, key=lambda r: int(r["unit"]))
                if r["pathway"] == "rollout" and r["arm"] == a] for a in ("all", "mxfp4+smooth")}
    diff = np.subtract(harm["all"], harm["mxfp4+smooth"])
    half = stats.t.ppf(1 - (1 - rollout["level"]) / 2, len(diff) - 1) * diff.std(ddof=1) / np.sqrt(len(diff))
    assert rollout["diff"] == pytest.approx(diff.mean()) and rollout["ci_low"] == pytest.approx(diff.mean() - half)
    assert "About this model: its units" in markdown(list(rows.values()), "mxfp4+smooth", "real-small-board", [])

"""The claims decided from per-unit files with the network as the replicate: a per-unit file written by hand
(known harms per network) gives the verdicts its numbers imply, each naming its rival, with the energy question a
row of its own and each half of the networks decided apart."""

import csv

import numpy as np
import pytest

from mxfp4.analysis.pathways.spec import UNIT_FIELDS
from mxfp4.config.profiles import ClaimDesign
from mxfp4.report.network_claims import claim_rows, markdown, read_units, run

DESIGN = ClaimDesign(margins={"gradient": 0.02, "rollout": 0.1, "entropy": 0.0025},
                     premise_margins=3)


def _units(networks, arm_means, pathway="gradient", units=6, noise=0.01, seed=0, model="tiny-dense"):
    """Per-unit rows: arm a's harm on network g is arm_means[a] + a network shift shared by every arm + unit noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(networks):
        shift = rng.normal(0, 0.05)
        for i in range(units):
            base = rng.normal(0, 0.02)
            for arm, mean in arm_means.items():
                rows.append({"model": model, "checkpoint": "warm", "form": "gain", "pathway": pathway, "arm": arm,
                             "unit": g * units + i, "group": 10 + g, "key": f"k{g}-{i}",
                             "harm": mean + shift + base + rng.normal(0, noise)})
    return rows


def test_a_dominant_component_is_held_and_its_control_is_a_row_of_its_own():
    units = _units(8, {"+scale": 0.5, "+dead": 0.2, "+grid": 0.3, "+scale~signflip": 0.45, "none": 0.0})
    rows = claim_rows(units, DESIGN)
    primary = [r for r in rows if r["family"] == "primary"]
    assert [(r["claim"], r["verdict"], r["decided_by"]) for r in primary] == [
        ("Scale bias dominates gradient accuracy", "held", "+grid")]  # the weaker contrast decides
    energy = [r for r in rows if r["family"] == "secondary"]
    assert len(energy) == 1 and "+scale~signflip" in energy[0]["z"] and energy[0]["verdict"] == "held"
    assert primary[0]["networks"] == 8 and primary[0]["half_networks"] == [[10, 12, 14, 16], [11, 13, 15, 17]]
    assert primary[0]["half_verdicts"] == ["held", "held"] and primary[0]["replicates"] is True


def test_a_rival_that_harms_more_contradicts_and_a_tie_is_no_dominance():
    contra = claim_rows(_units(8, {"+scale": 0.3, "+dead": 0.5, "+grid": 0.1}), DESIGN)[0]
    assert (contra["verdict"], contra["decided_by"]) == ("contradicted", "+dead")
    tie = claim_rows(_units(12, {"+scale": 0.3, "+dead": 0.3, "+grid": 0.1}, noise=0.001), DESIGN)[0]
    assert (tie["verdict"], tie["decided_by"]) == ("no dominance", "+dead")


def test_the_network_not_the_unit_is_the_replicate():
    """Three networks of 200 units each, a lead that varies between networks: pooled units would call it held; over
    the networks (2 df) it is not shown."""
    rng = np.random.default_rng(4)
    rows = []
    for g, lead in enumerate([0.25, -0.05, 0.1]):
        for i in range(200):
            for arm, mean in {"+scale": lead, "+dead": 0.0, "+grid": -0.2}.items():
                rows.append({"model": "m", "checkpoint": "warm", "form": "gain", "pathway": "gradient", "arm": arm,
                             "unit": g * 200 + i, "group": g, "key": "", "harm": mean + rng.normal(0, 0.01)})
    r = claim_rows(rows, DESIGN)[0]
    assert r["verdict"] == "not shown" and r["networks"] == 3 and r["replicates"] is None


def test_the_table_recomputes_from_the_stored_files_and_refuses_a_file_that_is_not_one(tmp_path):
    path = tmp_path / "warm_units.csv"
    units = _units(3, {"+scale": 0.5, "+dead": 0.2, "+grid": 0.3}, noise=0.001) + _units(  # embedded-large's
        3, {"+dead": 0.9, "+scale": 0.2, "+grid": 0.3, "none": 0.3}, pathway="rollout", seed=1, noise=0.001)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, UNIT_FIELDS)
        w.writeheader()
        w.writerows(units)
    rows = run([path], "embedded-large", tmp_path / "net.md")
    assert [r["verdict"] for r in rows if r["family"] == "primary"] == ["held", "held"]
    text = (tmp_path / "net.md").read_text()
    assert "decided by" in text and "mean z²" in text and "over the 3 networks" in text
    assert read_units([path])[0]["harm"] == pytest.approx(units[0]["harm"])
    bad = tmp_path / "bad.csv"
    bad.write_text("model,harm\nm,1\n")
    with pytest.raises(ValueError, match=r"bad.csv: no checkpoint, form, pathway, arm, unit, group column"):
        read_units([bad])
    assert markdown(rows, "x").startswith("# Claims with the network as the replicate: x")


def test_the_network_power_design_powers_every_side_and_never_asks_for_fewer_than_eight():
    """A pilot of 3 networks with a clear lead: the held side needs few networks, but the floor is 8; a pilot whose
    networks disagree (a large between-network sd) asks for more, and the upper sd limit makes 3 pilot networks
    ask for more than the same spread estimated from 12."""
    from mxfp4.report.power_design import MIN_NETWORKS, network_claim_size, network_design
    from mxfp4.stats import network_contrast

    clear = network_design(_units(3, {"+scale": 0.9, "+dead": 0.2, "+grid": 0.3}, noise=0.001), DESIGN)
    size = next(iter(clear["claims"].values()))
    assert set(size["sides"]) == {"held", "contradicted", "no dominance"}
    assert clear["networks"] == MIN_NETWORKS == size["networks"] > size["sides"]["held"]["networks"]
    rng = np.random.default_rng(0)
    noisy = {g: float(rng.normal(0.05, 0.1)) for g in range(3)}
    wide = network_claim_size({"r": network_contrast(noisy, dict.fromkeys(range(3), 0.0), 0.02)}, 0.02, 0.001, 0.8)
    assert wide["networks"] > MIN_NETWORKS
    same_sd = {g: float(v) for g, v in enumerate(np.tile([-1.0, 0.0, 1.0], 4) * 0.1 + 0.05)}
    many = network_claim_size({"r": network_contrast(same_sd, dict.fromkeys(range(12), 0.0), 0.02)}, 0.02, 0.001, 0.8)
    few = network_claim_size({"r": network_contrast({0: -0.05, 1: 0.05, 2: 0.15}, dict.fromkeys(range(3), 0.0), 0.02)},
                             0.02, 0.001, 0.8)
    assert few["networks"] > many["networks"]
    with pytest.raises(ValueError, match="at least three networks"):
        network_design(_units(2, {"+scale": 0.9, "+dead": 0.2, "+grid": 0.3}), DESIGN)


def test_seeds_that_share_a_warm_start_are_one_network():
    """Six seeds measured from two warm starts (a seed's warm start: its place modulo 2, as a profile with
    pretrain.warm_starts 2 maps them) are two networks, not six; a profile with one warm start has one network
    for all its seeds, and no test is decided over it."""
    from mxfp4.config.profiles import load_profile
    from mxfp4.report.network_claims import profile_networks

    units = _units(6, {"+scale": 0.5, "+dead": 0.2, "+grid": 0.3})
    rows = claim_rows(units, DESIGN, network_of=lambda g: (int(g) - 10) % 2)
    assert rows[0]["networks"] == 2
    one = profile_networks(load_profile("embedded"))  # seeds 0-2 from its one warm start
    assert {one(s) for s in (0, 1, 2)} == {0}
    single = claim_rows(_units(3, {"+scale": 0.5, "+dead": 0.2, "+grid": 0.3}), DESIGN, network_of=lambda g: 0)
    assert single[0]["networks"] == 1 and single[0]["verdict"].startswith("inconclusive")


def _with_mxfp4(networks, arm_means, mxfp4=1.0, **kw):
    """``_units`` with plain MXFP4 (``all``) and the unquantized arm (``none``), MXFP4 harming by ``mxfp4``."""
    return _units(networks, {**arm_means, "all": mxfp4, "none": 0.0}, **kw)


def _split_row(diffs: dict[str, np.ndarray]) -> dict:
    """A claim row as ``claim_rows`` leaves it for the split-half check: per rival each network's contrast, the
    halves fixed by order (networks 10, 12, ... against 11, 13, ...) and each contrast's between-half z computed
    the production way (``network_contrast`` on each half, ``between_half_z``)."""
    from mxfp4.stats import between_half_z, network_contrast

    nets = list(range(10, 10 + len(next(iter(diffs.values())))))
    halves = [nets[0::2], nets[1::2]]
    contrasts, zs = {}, {}
    for rival, d in diffs.items():
        own = dict(zip(nets, map(float, d)))
        zero = dict.fromkeys(nets, 0.0)
        parts = [network_contrast({g: own[g] for g in h}, zero, 0.1) for h in halves]
        zs[rival] = between_half_z(*parts)
        contrasts[rival] = {"per_network": {str(g): v for g, v in own.items()}}
    return {"test": {"contrasts": contrasts}, "half_networks": halves, "z": zs}


def test_the_split_half_flag_fires_at_its_level_under_one_truth_and_catches_halves_that_differ():
    """1,000 rows of 8 networks and 3 correlated rival contrasts whose halves share one truth: "halves differ" fires
    on at most 5% of them (plus two standard errors of the simulation), where a verdict-disagreement rule fired on
    40-54%; halves whose truths are three between-network sds apart are flagged on most rows. The mean z² under one
    truth is above 1 (four networks a half: each SE on 3 df), and ``mean_z2_reference`` gives its mean."""
    from mxfp4.report.network_claims import mean_z2, mean_z2_reference, split_half_check

    rng = np.random.default_rng(0)
    same, shifted = [], []
    for _ in range(1000):
        shared = rng.normal(0, 1, 8)  # a network's own level, shared by its three contrasts
        diffs = {r: 0.2 + shared + rng.normal(0, 0.5, 8) for r in ("a", "b", "c")}
        same.append(_split_row(diffs))
        moved = {r: d + np.where(np.arange(8) % 2 == 0, 3.0, 0.0) for r, d in diffs.items()}  # half A moved
        shifted.append(_split_row(moved))
    split_half_check(same)
    split_half_check(shifted)
    assert np.mean([r["replicates"] is False for r in same]) <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / 1000)
    assert np.mean([r["replicates"] is False for r in shifted]) > 0.6
    observed = [mean_z2([r])[0] for r in same]
    reference = mean_z2_reference(same[:40], draws=400)
    assert np.mean(observed) > 1.2 and abs(reference["mean"] - np.mean(observed)) < 0.25
    assert reference["low"] < np.mean(observed[:40]) < reference["high"]


def test_a_named_models_units_are_its_replicates_and_too_few_for_halves_is_one_line(tmp_path):
    """One pretrained model, 40 gradient batches all from one seed: under the class design it is one network
    (inconclusive); under the named-model design each batch is a replicate and the lead is held over 40 units,
    with halves of 20 fixed by index. A file of 3 units cannot be split into two halves of two: one line."""
    units = [dict(u, group="warm", seed=0) for u in _units(1, {"+scale": 0.5, "+dead": 0.2, "+grid": 0.3},
                                                            units=40)]
    assert claim_rows(units, DESIGN)[0]["verdict"].startswith("inconclusive")
    named = DESIGN.model_copy(update={"replicate": "units"})
    r = claim_rows(units, named)[0]
    assert (r["verdict"], r["networks"], r["scope"]) == ("held", 40, "about this model")
    assert [len(h) for h in r["half_networks"]] == [20, 20] and r["half_networks"][0][:2] == ["0/u00000", "0/u00002"]
    path = tmp_path / "few_units.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, UNIT_FIELDS)
        w.writeheader()
        w.writerows([dict(u, seed=1) for u in units[:3 * 3]])  # real-small-claims measures seed 1
    with pytest.raises(ValueError, match=r"too few units for two halves of at least two on gradient \(3 units\)"):
        run([path], "real-small-claims", tmp_path / "out.md")


def test_a_pathway_mxfp4_barely_harms_reads_premise_not_met():
    """MXFP4's own harm under three margins: its claims read "premise not met", whatever their contrasts; ten
    margins: the verdict stands. Without plain MXFP4's arm the premise is not measured and the verdict stands."""
    lead = {"+scale": 0.5, "+dead": 0.2, "+grid": 0.3}
    weak = claim_rows(_with_mxfp4(8, lead, mxfp4=0.03), DESIGN)[0]
    assert weak["verdict"] == "premise not met" and weak["premise"]["met"] is False
    assert weak["premise"]["needed"] == pytest.approx(3 * 0.02)
    strong = claim_rows(_with_mxfp4(8, lead, mxfp4=0.2), DESIGN)[0]
    assert strong["verdict"] == "held" and strong["premise"]["met"] is True
    assert claim_rows(_units(8, lead), DESIGN)[0]["premise"]["met"] is None
    text = markdown(claim_rows(_with_mxfp4(8, lead, mxfp4=0.03), DESIGN), "x")
    assert "## Premise per pathway" in text and "**not met**" in text


def test_every_stored_verdict_agrees_with_its_printed_interval():
    """Every profile's stored claims: held excludes 0 from below, contradicted from above, no dominance lies inside
    the margin, not shown covers 0, each interval at the level its verdict uses (Holm and the rivals' Bonferroni);
    a pathway whose premise is not met keeps its test's interval."""
    from pathlib import Path

    from mxfp4.config.profiles import load_profile
    from mxfp4.layout import Layout
    from mxfp4.report.network_claims import profile_networks, stored_units

    results = Path(__file__).resolve().parents[2] / "results"
    checked = 0
    for name in ("networks", "networks-moe", "networks-outliers", "networks-pilot", "real-small",
                 "real-small-claims"):
        profile = load_profile(name)
        files = stored_units(Layout(results, name))
        assert files, f"{name} stores no per-unit file"
        for r in claim_rows(read_units(files), profile.pathways.claims,
                            network_of=profile_networks(profile)):
            if r["ci_low"] is None:
                continue
            checked += 1
            verdict = r["outcome"].split(" (")[0]  # a premise not met withholds the verdict, not the test
            if verdict == "held":
                assert r["ci_low"] > 0, r
            elif verdict == "contradicted":
                assert r["ci_high"] < 0, r
            elif verdict == "no dominance":
                assert -r["margin"] < r["ci_low"] and r["ci_high"] < r["margin"], r
            else:
                assert r["ci_low"] <= 0 <= r["ci_high"], r
    assert checked >= 54


def test_the_named_model_profile_took_its_margins_and_n_from_its_pilot():
    """real-small-claims' margins are a tenth of MXFP4's harm on each pathway in the pilot's stored units, and its
    power block is the pilot's own-effect sizing of each claim, both recomputed here."""
    from pathlib import Path

    from mxfp4.config.profiles import load_profile
    from mxfp4.report.network_claims import scaled_margins
    from mxfp4.report.power_design import unit_design

    design = load_profile("real-small-claims").pathways.claims
    rule = design.margin_rule
    pilot = Path(__file__).resolve().parents[2] / "results" / "baselines" / rule.pilot / "units"
    units = read_units(sorted(pilot.glob("*_warm_units.csv")))
    assert scaled_margins(units, rule.fraction) == design.margins
    block = unit_design(units, design)
    assert {k: v.networks for k, v in design.network_power.claims.items()} == \
        {k: v["networks"] for k, v in block["claims"].items()}
    with pytest.raises(ValueError, match="margin fraction 1.5; accepted"):
        scaled_margins(units, 1.5)


def test_a_design_without_a_premise_or_with_a_margin_of_zero_is_one_line():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="premise_margins"):
        ClaimDesign(margins={"gradient": 0.02, "rollout": 0.1, "entropy": 0.0025})
    with pytest.raises(ValidationError, match="greater than 0"):
        ClaimDesign(margins={"gradient": 0.0, "rollout": 0.1, "entropy": 0.0025}, premise_margins=3)

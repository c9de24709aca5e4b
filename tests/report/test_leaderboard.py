"""The leaderboard: each recipe's share of MXFP4's harm removed per network, ranked, told apart from the others by
paired tests over networks with Holm, and a user's recipe placed only when its run reproduces the board's anchors."""

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

from mxfp4.config.profiles import load_profile
from mxfp4.report.leaderboard import board, markdown, merged, removed_share

PATHWAYS = ("gradient", "rollout", "entropy")


def _spans(networks: int = 8, seed: int = 0) -> np.ndarray:
    """Each network's MXFP4 harm above BF16's (the same on every pathway)."""
    return 0.5 + np.random.default_rng(seed).random(networks)


def _units(shares: dict[str, list[float]], networks: int = 8, units: int = 4, seed: int = 0) -> list[dict]:
    """Per-unit rows of one model whose arms remove, in network k, ``shares[arm][k]`` of that network's MXFP4 harm on
    every pathway (bf16 harm 0.0 on gradient and entropy, 1.0 on rollout; MXFP4 adds the network's span)."""
    profile = load_profile("networks")
    rows = []
    for k, s in enumerate(profile.seeds[:networks]):
        span = _spans(networks, seed)[k]
        for pathway in PATHWAYS:
            base = 1.0 if pathway == "rollout" else 0.0
            harm = {"none": base, "all": base + span, **{a: base + span * (1 - v[k]) for a, v in shares.items()}}
            if pathway == "entropy":  # the entropy pathway's harm is the entropy; its gap to bf16's is what counts
                harm = {a: 2.0 + h for a, h in harm.items()}
            for i in range(units):
                for arm, h in harm.items():
                    rows.append({"model": "tiny-dense", "checkpoint": "warm", "form": "gain", "pathway": pathway,
                                 "arm": arm, "unit": k * 100 + i, "group": "warm", "seed": str(s),
                                 "key": f"{s}-{i}", "harm": h})
    return rows


def test_the_board_ranks_by_the_share_removed_and_tells_recipes_apart_as_paired_t_with_holm_does():
    rng = np.random.default_rng(1)
    shares = {"mxfp4+macro": list(0.6 + 0.05 * rng.standard_normal(8)),
              "mxfp4+fallback": list(0.55 + 0.05 * rng.standard_normal(8)),
              "mxfp4+aqn": list(-0.1 + 0.05 * rng.standard_normal(8))}
    rows = board(_units(shares), load_profile("networks"), list(shares))["tiny-dense"]
    by = {r["recipe"]: r for r in rows}
    assert [r["recipe"] for r in rows][0] == "bf16" and rows[-1]["recipe"] in ("mxfp4", "mxfp4+aqn")
    span = _spans()
    values = {"bf16": list(span / span.mean()), "mxfp4": [0.0] * 8,  # each network's removed harm over the mean span
              **{name: list(np.asarray(s) * span / span.mean()) for name, s in shares.items()}}
    for name, v in values.items():  # the same mean and interval as a t over the networks' values
        assert by[name]["mean"] == pytest.approx(np.mean(v), abs=1e-9)
        half = stats.t.ppf(0.975, 7) * np.std(v, ddof=1) / np.sqrt(8)
        assert by[name]["ci_high"] - by[name]["mean"] == pytest.approx(half, rel=1e-6, abs=1e-12)
    assert by["bf16"]["mean"] == pytest.approx(1.0) and by["mxfp4"]["mean"] == pytest.approx(0.0)
    names = [r["recipe"] for r in rows]
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    ps = []
    for a, b in pairs:
        d = np.subtract(values[a], values[b])
        ps.append(stats.ttest_1samp(d, 0).pvalue if np.ptp(d) > 1e-9 else (1.0 if abs(np.mean(d)) < 1e-9 else 0.0))
    reject = multipletests(ps, alpha=0.05, method="holm")[0]
    expected = {n: set() for n in names}
    for (a, b), r in zip(pairs, reject):
        if r:
            expected[a].add(by[b]["rank"])
            expected[b].add(by[a]["rank"])
    assert {n: set(by[n]["apart_from"]) for n in names} == expected
    assert by["mxfp4+aqn"]["rank"] in by["mxfp4+macro"]["apart_from"]


def test_a_pathway_where_mxfp4_does_no_harm_is_an_error_not_a_share():
    units = _units({"mxfp4+macro": [0.5] * 8})
    for r in units:
        if r["pathway"] == "gradient" and r["arm"] == "all":
            r["harm"] = 0.0
    from mxfp4.report.network_claims import by_network, profile_networks, unit_harms
    harms = by_network(unit_harms(units, "tiny-dense", "warm", "gain"), profile_networks(load_profile("networks")))
    with pytest.raises(ValueError, match="gradient pathway is not above BF16"):
        removed_share(harms, "mxfp4+macro", "tiny-dense")


def test_a_placed_recipe_joins_only_when_its_run_reproduces_the_board_anchors():
    stored = _units({"mxfp4+macro": [0.5] * 8})
    mine = [r for r in _units({"mine": [0.7] * 8}) if r["arm"] in ("none", "all", "mine")]
    both = merged(stored, mine, "mine")
    rows = board(both, load_profile("networks"), ["mxfp4+macro", "mine"])["tiny-dense"]
    assert [r["recipe"] for r in rows] == ["bf16", "mine", "mxfp4+macro", "mxfp4"]
    text = markdown({"tiny-dense": rows}, "networks", highlight="mine")
    assert "**mine** on tiny-dense: rank 2 of 4" in text
    moved = [dict(r, harm=r["harm"] + (1e-9 if r["arm"] == "all" else 0.0)) for r in mine]
    with pytest.raises(ValueError, match="do not reproduce the stored board's: the first unit that differs is "
                                         r"tiny-dense/warm/gain/\w+/all/"):
        merged(stored, moved, "mine")
    short = [r for r in mine if not (r["arm"] == "none" and int(r["unit"]) == 0)]
    with pytest.raises(ValueError, match=r"/none/.*/0 \(missing from the run\)"):
        merged(stored, short, "mine")


def test_the_stored_board_reproduces_against_itself_with_a_prompt_drawn_twice():
    """The stored networks board, its own anchors as a placed run's: every unit matches by its full identity, so a
    prompt drawn twice in one network (the same key, two units) is no mismatch."""
    from mxfp4.report.network_claims import read_units

    stored = read_units(["results/baselines/networks/leaderboard/tiny-dense_units.csv"])
    keys = [(r["pathway"], r["arm"], r["seed"], r["key"]) for r in stored if r["arm"] == "none"]
    assert len(keys) > len(set(keys))  # some prompt is drawn twice in a network
    again = [dict(r, arm="mine") if r["arm"] == "mxfp4+macro" else r for r in stored]
    both = merged(stored, again, "mine")
    assert sum(r["arm"] == "mine" for r in both) == sum(r["arm"] == "mxfp4+macro" for r in stored)


def test_a_placed_recipe_is_stored_in_the_order_a_full_run_writes(tmp_path):
    """The stored board without its last recipe, that recipe's arm placed back from a run of its own (anchors
    included): the stored file again, row for row, in a full run's order; a run whose anchors differ is refused."""
    from pathlib import Path

    from mxfp4.analysis.pathways.spec import UNIT_FIELDS
    from mxfp4.io import write_csv_atomic
    from mxfp4.report.leaderboard import placed_on_board, store_placed_units
    from mxfp4.report.network_claims import read_units

    path = Path(__file__).resolve().parents[2] / "results/baselines/networks/leaderboard/tiny-dense_units.csv"
    units = read_units([path])
    last = load_profile("networks").leaderboard[-1]
    without = [r for r in units if r["arm"] != last]
    run = [r for r in units if r["arm"] in ("all", "none", last)]
    assert placed_on_board(without, run, last) == units
    write_csv_atomic(tmp_path / "stored.csv", without, UNIT_FIELDS)  # what the store_placed rules rewrite
    write_csv_atomic(tmp_path / "run.csv", run, UNIT_FIELDS)
    store_placed_units(tmp_path / "stored.csv", [tmp_path / "run.csv"], last)
    assert (tmp_path / "stored.csv").read_bytes() == path.read_bytes()
    moved = [dict(r, harm=r["harm"] + 1e-9) if r["arm"] == "all" and r["unit"] == "3" else r for r in run]
    with pytest.raises(ValueError, match="do not reproduce the stored board's: the first unit that differs"):
        placed_on_board(without, moved, last)


def test_the_registered_figure_drawn_from_the_boards_json_is_the_figure_of_its_rows(tmp_path, monkeypatch):
    """`mxfp4 leaderboard` writes the page and its JSON and links the figure; the registered figure ``leaderboard``,
    drawn from the JSON by `mxfp4 plot`, is the figure of the rows in memory byte for byte."""
    import json
    import shutil
    from pathlib import Path

    from mxfp4.cli import main
    from mxfp4.report.leaderboard import figure

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)
    results = tmp_path / "results"
    shutil.copytree(repo / "results/baselines/networks/leaderboard", results / "networks/leaderboard")
    assert main(["leaderboard", "--profile", "networks", "--results", str(results)]) == 0
    page = results / "networks/leaderboard/LEADERBOARD.md"
    assert "](../../../figures/networks/leaderboard.png)" in page.read_text()
    assert not (tmp_path / "figures").exists()  # drawn by the figure's own rule, not by the page's command
    assert main(["plot", "leaderboard", str(page.with_suffix(".json")), "--out", str(tmp_path / "a.png")]) == 0
    figure(json.loads(page.with_suffix(".json").read_text())["boards"], tmp_path / "b.png")
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()

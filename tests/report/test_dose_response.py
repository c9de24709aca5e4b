"""The dose-response table: each dose's claim-level rows decided as one Holm family, against a Holm
adjustment computed here by hand; the figure's points are the excess harms over the design's control only."""

import pytest

from mxfp4.analysis.pathways.spec import MECHANISMS
from mxfp4.config.profiles import ClaimDesign, dose
from mxfp4.report.dose_response import claim_rows, excess_series, markdown

DESIGN = ClaimDesign(form="gain", control="signflip", margins={"gradient": 0.02, "rollout": 0.1, "entropy": 0.0025},
                     premise_margins=3)


def _claim(pathway: str, mean: float, p_held: float, p_contradicted: float) -> dict:
    return {"model": "tiny-dense", "checkpoint": "warm (gain)", "injection": "x", "site": "both", "layer": "total",
            "metric": f"{pathway}_claim", "mean": str(mean), "ci_low": str(mean - 0.1), "ci_high": str(mean + 0.1),
            "n": "18", "p": str(p_held), "p_contradicted": str(p_contradicted), "sd": "0.2", "method": "m"}


def _holm(ps: list[float]) -> list[float]:
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


def test_every_dose_is_a_hypothesis_of_one_holm_family():
    by_dose = {"c0x1": [_claim("gradient", 0.3, 1e-6, 0.9), _claim("entropy", -0.2, 0.9, 1e-5),
                        _claim("rollout", 0.01, 0.3, 0.4)],
               "c2x32": [_claim("gradient", 0.02, 0.2, 0.3), _claim("entropy", -0.3, 0.95, 1e-7),
                         _claim("rollout", 0.5, 1e-4, 0.99)]}
    rows = claim_rows(by_dose, DESIGN)
    assert [(r["dose"], r["channels"], r["factor"]) for r in rows][::3] == [("c0x1", 0, 1), ("c2x32", 2, 32)]
    two_sided = [min(1.0, 2 * min(float(c["p"]), float(c["p_contradicted"]))) for d in by_dose.values() for c in d]
    keys = [(d, MECHANISMS[c["metric"].removesuffix("_claim")][1]) for d, cs in by_dose.items() for c in cs]
    expected = dict(zip(keys, _holm(two_sided)))
    assert sorted((r["dose"], r["claim"]) for r in rows) == sorted(expected)
    for r in rows:
        assert r["p_holm"] == pytest.approx(expected[(r["dose"], r["claim"])])
    verdicts = {(r["dose"], r["claim"].split()[0]): r["verdict"] for r in rows}
    assert verdicts[("c0x1", "Scale")] == "held" and verdicts[("c2x32", "Deadzone")] == "held"
    assert verdicts[("c2x32", "Grid")].startswith("contradicted") and verdicts[("c0x1", "Deadzone")] == "not shown"
    text = markdown(by_dose, rows, "a source")
    assert "| claim | model | c0x1 | c2x32 |" in text and "a source" in text


def test_the_figure_reads_each_components_excess_over_the_designs_control_only():
    rows = [{"model": "m", "checkpoint": "warm (gain)", "metric": "rollout_excess_harm", "injection": inj,
             "mean": "0.5", "ci_low": "0.1", "ci_high": "0.9", "n": "24"}
            for inj in ("+dead vs +dead~signflip", "+dead vs +dead~gaussian", "+grid vs +grid~signflip")]
    rows.append({**rows[0], "checkpoint": "warm"})  # the canonical form's row: not the design's form
    got = excess_series({"c2x8": rows}, "gain", "signflip")
    assert [(s["component"], s["pathway"], s["dose"]) for s in got] == [("dead", "rollout", "c2x8"),
                                                                        ("grid", "rollout", "c2x8")]


def test_the_registered_figure_drawn_from_the_points_file_is_the_figure_of_the_points(tmp_path):
    """The dose-response's figure is drawn from the points its run writes (the registered figure dose-response):
    byte for byte the figure of the points in memory, the doses in the profile's order; points taken against two
    controls are refused in one line."""
    from mxfp4.report.aggregate import write_csv
    from mxfp4.report.dose_response import draw, figure

    series = [{"model": "m", "pathway": p, "component": c, "dose": d, "control": "signflip", "mean": m,
               "ci_low": m - 0.1, "ci_high": m + 0.2, "n": 24}
              for d, m in (("c0x1", 0.013), ("c4x16", 0.21), ("c2x8", 0.1 / 3))
              for p in ("gradient", "rollout") for c in ("scale", "dead")]
    write_csv(series, tmp_path / "series.csv")
    draw(tmp_path / "series.csv", tmp_path / "from_csv")
    figure(series, ["c0x1", "c4x16", "c2x8"], "signflip", tmp_path / "from_points")
    assert (tmp_path / "from_csv.png").read_bytes() == (tmp_path / "from_points.png").read_bytes()
    write_csv([*series, {**series[0], "control": "gaussian"}], tmp_path / "two.csv")
    with pytest.raises(ValueError, match="components taken against 2 controls .gaussian, signflip.; accepted"):
        draw(tmp_path / "two.csv", tmp_path / "two")


def test_a_dose_name_is_channels_and_a_power_of_two():
    assert dose("c2x32") == (2, 32) and dose("c0x1") == (0, 1)
    with pytest.raises(ValueError, match="accepted: c<channels>x<factor>"):
        dose("2x32")


def test_the_registered_study_writes_its_table_page_and_points_and_the_figure_draws_from_them(tmp_path, monkeypatch,
                                                                                              capsys):
    """`mxfp4 dose-response` (the registered study; target dose_response) writes the table, its page and the figure's
    points where the study declares them, from every dose's rows; `mxfp4 plot dose-response` draws from the points."""
    from mxfp4.cli import main
    from mxfp4.config.profiles import load_profile
    from mxfp4.layout import Layout
    from mxfp4.report import dose_response
    from mxfp4.studies import registered

    doses = registered()["dose-response"].settings_of(load_profile("dose-response")).doses
    excess = [{"model": "tiny-dense", "checkpoint": "warm (gain)", "metric": "rollout_excess_harm", "injection": inj,
               "mean": "0.5", "ci_low": "0.1", "ci_high": "0.9", "n": "24"}
              for inj in ("+dead vs +dead~signflip", "+grid vs +grid~signflip")]
    by_dose = {d: [_claim("gradient", 0.3, 1e-6, 0.9), _claim("rollout", 0.01, 0.3, 0.4), *excess] for d in doses}
    monkeypatch.setattr(dose_response, "read_doses", lambda layout, profile, names: {d: by_dose[d] for d in names})
    assert main(["dose-response", "--profile", "dose-response", "--results", str(tmp_path)]) == 0
    outputs = registered()["dose-response"].outputs(Layout(tmp_path, "dose-response"))
    assert [p.name for p in outputs] == ["dose_response.csv", "dose_response.md", "dose_response_series.csv"]
    assert all(p.is_file() for p in outputs) and f"wrote {outputs[0]}" in capsys.readouterr().out
    assert main(["plot", "dose-response", str(outputs[2]), "--out", str(tmp_path / "fig.png")]) == 0
    assert (tmp_path / "fig.png").is_file()

"""The shrinkage-bias rival to the depth law: each layer's gradient norm ratio split into the gradient's shrink
(its regression on the exact gradient) and its misalignment, and the symmetric test of which component's
shrink compounds."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxfp4.analysis.depth import UNIT_FIELDS, unit_rows
from mxfp4.report.depth_shrinkage import CONTRAST, EXCESS, batch_slopes, run, summary_rows
from mxfp4.rl.grad_accuracy import compare


def test_the_shrink_is_the_regression_of_the_quantized_gradient_on_the_exact_one():
    """norm ratio x cosine from the depth study's comparison equals <g_q, g> / |g|^2 computed from the raw
    tensors, per layer: a gradient shrunk by 0.7 with orthogonal noise added keeps the shrink 0.7."""
    g = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    noise = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    noise -= noise.dot(g) / g.dot(g) * g  # orthogonal to g
    exact = {"model.layers.0.proj.weight": g.reshape(8, 8), "model.layers.1.proj.weight": g.reshape(8, 8) * 2}
    quant = {"model.layers.0.proj.weight": (0.7 * g + noise).reshape(8, 8),
             "model.layers.1.proj.weight": (2 * 0.5 * g + 0.1 * noise).reshape(8, 8)}
    rows = unit_rows("m", 2, "gain", "+scale", "backward", 0, compare(quant, exact))
    by_layer = {r["layer"]: r["norm_ratio"] * r["cosine"] for r in rows}
    for layer, q in ((0, quant["model.layers.0.proj.weight"]), (1, quant["model.layers.1.proj.weight"])):
        e = exact[f"model.layers.{layer}.proj.weight"].flatten()
        assert by_layer[layer] == pytest.approx(float(q.flatten().dot(e) / e.dot(e)), rel=1e-9)
    assert by_layer[0] == pytest.approx(0.7, rel=1e-9) and by_layer[1] == pytest.approx(0.5, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(layers=st.integers(2, 8), data=st.data())
def test_the_norm_ratio_slope_is_the_shrink_slope_plus_the_misalignment_slope(layers, data):
    ratios = data.draw(st.lists(st.floats(0.05, 5.0), min_size=layers, max_size=layers))
    cosines = data.draw(st.lists(st.floats(0.05, 1.0), min_size=layers, max_size=layers))
    units = [{"batch": 0, "distance": d, "norm_ratio": r, "cosine": c}
             for d, (r, c) in enumerate(zip(ratios, cosines))]
    s = {k: v[0] for k, v in batch_slopes(units).items()}
    assert s["log_norm_ratio_slope"] == pytest.approx(s["log_shrink_slope"] + s["neg_log_cosine_slope"], abs=1e-9)
    d = np.arange(layers, dtype=float)  # an independent least-squares fit of log(r cos)
    assert s["log_shrink_slope"] == pytest.approx(np.polyfit(d, np.log(np.multiply(ratios, cosines)), 1)[0], abs=1e-9)


def test_a_cosine_that_is_not_positive_leaves_that_batch_without_shrink_and_misalignment_slopes():
    units = [{"batch": 0, "distance": 0, "norm_ratio": 1.0, "cosine": 0.9},
             {"batch": 0, "distance": 1, "norm_ratio": 1.0, "cosine": -0.1}]
    s = batch_slopes(units)
    assert s["log_shrink_slope"][0] is None and s["neg_log_cosine_slope"][0] is None
    assert s["log_norm_ratio_slope"][0] == 0.0


def _units(model: str, gains: dict[str, list[float]], layers: int = 4, cosine: float = 0.99) -> list[dict]:
    """Per arm a per-layer shrink g_b for each batch b (the ratio g_b^d / cosine at distance d, so each layer's
    shrink is g_b^d); every control arm shrinks by 1."""
    out = []
    for arm, per_batch in gains.items():
        for b, g in enumerate(per_batch):
            for d in range(layers):
                out.append({"model": model, "layers": layers, "form": "gain", "site": "backward", "arm": arm,
                            "batch": b, "layer": layers - 1 - d, "distance": d, "norm_ratio": g ** d / cosine,
                            "cosine": cosine})
    return out


CONTROLS = {f"{a}~signflip": [1.0] * 6 for a in ("+scale", "+dead", "+grid")}


@pytest.mark.parametrize("scale, dead, grid, verdict", [
    ([0.80, 0.82, 0.79, 0.81, 0.80, 0.83], [0.99] * 6, [0.98, 0.985, 0.99, 0.98, 0.975, 0.99], "scale bias"),
    ([0.99] * 6, [0.90, 0.92, 0.91, 0.90, 0.93, 0.91], [0.90, 0.89, 0.92, 0.90, 0.91, 0.90], "E2M1 rounding"),
    ([0.90, 0.95, 0.85, 0.92, 0.88, 0.94], [0.97, 0.94, 0.99, 0.95, 0.96, 0.98], [0.95] * 6, "not shown"),
])
def test_the_verdict_names_the_side_whose_shrink_compounds_and_a_tie_is_a_tie(scale, dead, grid, verdict):
    units = _units("m", {"+scale": scale, "+dead": dead, "+grid": grid, **CONTROLS})
    rows = summary_rows(units)
    (primary,) = [r for r in rows if r["measure"] == CONTRAST]
    expected = [math.log(s) - math.log(a) - math.log(b) for s, a, b in zip(scale, dead, grid)]
    assert primary["mean"] == pytest.approx(float(np.mean(expected)), abs=1e-9) and primary["n"] == 6
    assert primary["verdict"] == verdict
    excess = {r["arm"]: r["mean"] for r in rows if r["measure"] == EXCESS}
    assert excess["+scale"] == pytest.approx(float(np.mean(np.log(scale))), abs=1e-9)


def test_holm_runs_over_the_models_and_only_the_backward_site_is_tested():
    strong = {"+scale": [0.80, 0.82, 0.79, 0.81, 0.80, 0.83], "+dead": [0.99] * 6, "+grid": [0.99] * 6, **CONTROLS}
    units = _units("a", strong) + _units("b", strong, layers=8)
    units += [{**u, "site": "both"} for u in _units("a", strong)]
    rows = [r for r in summary_rows(units) if r["measure"] == CONTRAST]
    assert [(r["model"], r["site"]) for r in rows] == [("a", "backward"), ("b", "backward")]
    assert all(r["p_holm"] >= r["p"] for r in rows) and all(r["verdict"] == "scale bias" for r in rows)


def test_the_table_is_written_from_the_unit_files(tmp_path):
    from mxfp4.io import write_csv_atomic

    units = _units("m", {"+scale": [0.80, 0.82, 0.79, 0.81, 0.80, 0.83], "+dead": [0.99] * 6,
                         "+grid": [0.99] * 6, **CONTROLS})
    path = write_csv_atomic(tmp_path / "m_units.csv", [{k: u.get(k, "") for k in UNIT_FIELDS} for u in units],
                            UNIT_FIELDS)
    rows = run([path], tmp_path / "depth_shrinkage.csv")
    text = (tmp_path / "depth_shrinkage.md").read_text()
    assert "Hypothesis (fixed before the run)" in text and "| m | 4 | gain | 6 |" in text and "scale bias" in text
    assert (tmp_path / "depth_shrinkage.csv").is_file() and any(r["measure"] == CONTRAST for r in rows)


def test_the_depth_units_are_stored_apart_from_the_tables():
    """Every slope and test is recomputable from the stored per-batch files: they sit under units/, the tables flat."""
    from mxfp4.layout import Layout
    from mxfp4.studies import registered

    layout = Layout("results", "depth")
    units = registered()["depth-gradients"].output(layout, "tiny-moe-l8")
    assert layout.stored(units).relative_to(layout.baselines).parts == (
        "units", "tiny-moe-l8_units.csv")
    tables = registered()["depth"].outputs(layout)
    assert [layout.stored(t).relative_to(layout.baselines).parts for t in tables] == [
        ("depth.csv",), ("depth.md",), ("depth_shrinkage.csv",), ("depth_shrinkage.md",)]


STORED = Path(__file__).resolve().parents[2] / "results" / "baselines" / "depth"


@pytest.mark.skipif(not (STORED / "units").is_dir(), reason="needs the stored depth study (results/baselines/depth)")
def test_the_stored_tables_are_recomputed_from_the_stored_units():
    """The shrinkage test's rows and the depth law's slopes, from the per-batch files alone."""
    import csv

    from mxfp4.report.depth_table import read_units
    from mxfp4.report.depth_table import summary_rows as depth_rows

    units = read_units(sorted((STORED / "units").glob("*_units.csv")))
    again = {(r["model"], r["site"], r["arm"], r["measure"]): r for r in summary_rows(units)}
    for r in csv.DictReader((STORED / "depth_shrinkage.csv").open()):
        got = again[(r["model"], r["site"], r["arm"], r["measure"])]
        # numpy's mean sums in an order its build and the CPU's vector width choose: equal to 1e-12, not bit for bit
        assert (got["mean"] is None) == (r["mean"] == "") and (
            r["mean"] == "" or math.isclose(float(r["mean"]), got["mean"], rel_tol=1e-12, abs_tol=1e-15))
        assert (got["verdict"] or "") == r["verdict"]
    slopes = {(r["model"], r["site"], r["arm"], r["measure"], r["distance"]): r["mean"]
              for r in csv.DictReader((STORED / "depth.csv").open())}
    for r in depth_rows(units):
        distance = "" if r["distance"] is None else str(r["distance"])
        stored = slopes[(r["model"], r["site"], r["arm"], r["measure"], distance)]
        assert (r["mean"] is None and stored == "") or r["mean"] == pytest.approx(float(stored), rel=1e-12, abs=1e-15)

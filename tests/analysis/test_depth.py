"""The depth measure against a linear chain whose backward pass has a known gain per layer: the norm ratio
of each layer's gradient is the product of the gains from the output down to it, and the slope of its log
is log g where every layer has gain g."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxfp4.analysis.depth import unit_rows
from mxfp4.report.depth_table import log_slope, summary_rows
from mxfp4.rl.grad_accuracy import compare


class _Gain(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g):
        ctx.g = g
        return x.clone()

    @staticmethod
    def backward(ctx, dy):
        return dy * ctx.g, None


class _Chain(torch.nn.Module):
    """Linear layers named as a decoder's (model.layers.<i>.proj), each followed by a backward gain."""

    def __init__(self, layers: int, width: int, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList(torch.nn.Module() for _ in range(layers))
        for layer in self.model.layers:
            layer.proj = torch.nn.Linear(width, width, bias=False, dtype=torch.float64)

    def forward(self, x, gains):
        for layer, g in zip(self.model.layers, gains):
            x = _Gain.apply(layer.proj(x), g)
        return x


def _grads(chain, x, gains):
    chain.zero_grad()
    chain(x, gains).pow(2).sum().backward()
    return {n: p.grad.clone() for n, p in chain.named_parameters()}


@settings(max_examples=25, deadline=None)
@given(layers=st.integers(2, 8), seed=st.integers(0, 2**16),
       gains=st.lists(st.floats(0.25, 4.0), min_size=8, max_size=8))
def test_each_layers_norm_ratio_is_the_product_of_the_gains_above_it(layers, seed, gains):
    chain = _Chain(layers, 6, seed)
    x = torch.randn(5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    gains = gains[:layers]
    result = compare(_grads(chain, x, gains), _grads(chain, x, [1.0] * layers))
    rows = unit_rows("chain", layers, "gain", "+scale", "backward", 0, result)
    assert [r["distance"] for r in rows] == list(range(layers - 1, -1, -1))
    for r in rows:  # layer i's weight gradient has passed every gain from the output down to its own
        assert r["norm_ratio"] == pytest.approx(math.prod(gains[r["layer"]:]), rel=1e-9)
        assert r["cosine"] == pytest.approx(1.0, abs=1e-9)


@settings(max_examples=25, deadline=None)
@given(layers=st.integers(2, 8), g=st.floats(0.5, 2.0), seed=st.integers(0, 2**16))
def test_a_constant_gain_per_layer_is_the_slope_of_the_log_norm_ratio(layers, g, seed):
    chain = _Chain(layers, 4, seed)
    units = []
    for batch in range(3):
        x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + batch))
        result = compare(_grads(chain, x, [g] * layers), _grads(chain, x, [1.0] * layers))
        units += unit_rows("chain", layers, "gain", "+scale", "backward", batch, result)
        units += unit_rows("chain", layers, "gain", "+scale~signflip", "backward", batch,
                           compare(_grads(chain, x, [1.0] * layers), _grads(chain, x, [1.0] * layers)))
    rows = {r["measure"] + r["arm"]: r for r in summary_rows(units) if r["distance"] is None}
    assert rows["log_norm_ratio_slope+scale"]["mean"] == pytest.approx(math.log(g), abs=1e-9)
    assert rows["log_norm_ratio_slope+scale~signflip"]["mean"] == pytest.approx(0.0, abs=1e-9)
    assert rows["log_norm_ratio_slope_excess_over_~signflip+scale"]["mean"] == pytest.approx(math.log(g), abs=1e-9)
    assert rows["log_norm_ratio_slope+scale"]["n"] == 3


def test_a_slope_needs_two_layers_and_positive_ratios():
    assert log_slope({0: 1.0}) is None and log_slope({0: 1.0, 1: 0.0}) is None
    assert log_slope({0: 2.0, 1: 4.0, 2: 8.0}) == pytest.approx(math.log(2))


def test_the_depth_study_measures_every_arm_site_batch_and_layer_of_a_warm_start(smoke_results, monkeypatch):
    """Each arm (components, their sign-flip controls, full MXFP4) at each site has one row per gradient batch
    and decoder layer, distances 0 (last layer) to L - 1; with MXFP4 in the backward GEMMs only, the
    gradients differ from the unquantized ones (a ratio other than 1 somewhere)."""
    from mxfp4.analysis.depth import depth_arms, run_depth
    from mxfp4.config.profiles import load_profile
    from mxfp4.rl import data

    monkeypatch.setattr(data, "accuracy_reward", lambda completions, **kw: [float(i % 2) for i in
                                                                            range(len(completions))])
    base = load_profile("smoke")
    profile = base.model_copy(update={"seeds": [0], "pathways": base.pathways.model_copy(update={
        "sites": ["backward", "both"], "forms": ["gain"], "controls": ["signflip"]})})
    units = run_depth(profile, "tiny-dense", results=smoke_results, progress=lambda m: None)
    arms = depth_arms(["signflip"])
    assert "+scale~signflip" in arms and "all" in arms
    batches = sorted({u["batch"] for u in units})
    layers = profile.model("tiny-dense").layers or 2
    for site in ("backward", "both"):
        for arm in arms:
            mine = [u for u in units if (u["arm"], u["site"]) == (arm, site)]
            assert sorted((u["batch"], u["distance"]) for u in mine) == \
                [(b, d) for b in batches for d in range(layers)]
    assert any(abs(u["norm_ratio"] - 1) > 1e-6 for u in units if u["site"] == "backward")


def test_the_depth_table_reads_the_unit_files_back_into_the_slopes(tmp_path):
    """Unit rows of a chain with gain 2 per layer, written and read back: the table's slope is log 2 for each
    model, shallow to deep, and the figure is written."""
    from mxfp4.analysis.depth import UNIT_FIELDS
    from mxfp4.io import write_csv_atomic
    from mxfp4.report.depth_table import run

    paths = []
    for name, layers in (("chain-l4", 4), ("chain", 2)):
        chain = _Chain(layers, 4, 0)
        units = []
        for batch in range(2):
            x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(batch))
            units += unit_rows(name, layers, "gain", "+scale", "both", batch,
                               compare(_grads(chain, x, [2.0] * layers), _grads(chain, x, [1.0] * layers)))
        paths.append(write_csv_atomic(tmp_path / f"{name}.csv", units, UNIT_FIELDS))
    rows = run(paths, tmp_path / "depth.csv", figure_stem=tmp_path / "depth")
    text = (tmp_path / "depth.md").read_text()
    lines = [line for line in text.splitlines() if line.startswith("| both |")]
    assert [line.split(" | ")[2] for line in lines] == ["chain", "chain-l4"]
    assert all(f"{math.log(2):+.4f}" in line for line in lines)
    assert (tmp_path / "depth.png").is_file() and len([r for r in rows if r["distance"] is None]) == 2

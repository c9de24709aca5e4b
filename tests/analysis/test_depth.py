"""The depth measure against a linear chain whose backward pass has a known gain per layer: the norm ratio
of each layer's gradient is the product of the gains from the output down to it, and the slope of its log
is log g where every layer has gain g."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxfp4.analysis.depth import unit_rows
from mxfp4.config.run import Run
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


@pytest.mark.slow
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
    units = run_depth(Run.of(profile, smoke_results), "tiny-dense", progress=lambda m: None)
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
    from mxfp4.report.depth_table import draw, figure, run

    paths = []
    for name, layers in (("chain-l4", 4), ("chain", 2)):
        chain = _Chain(layers, 4, 0)
        units = []
        for batch in range(2):
            x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(batch))
            units += unit_rows(name, layers, "gain", "+scale", "both", batch,
                               compare(_grads(chain, x, [2.0] * layers), _grads(chain, x, [1.0] * layers)))
        paths.append(write_csv_atomic(tmp_path / f"{name}.csv", units, UNIT_FIELDS))
    rows = run(paths, tmp_path / "depth.csv")
    text = (tmp_path / "depth.md").read_text()
    lines = [line for line in text.splitlines() if line.startswith("| both |")]
    assert [line.split(" | ")[2] for line in lines] == ["chain", "chain-l4"]
    assert all(f"{math.log(2):+.4f}" in line for line in lines)
    assert len([r for r in rows if r["distance"] is None]) == 2
    # the registered figure, drawn from the table's CSV, is the figure of the rows in memory, byte for byte
    draw(tmp_path / "depth.csv", tmp_path / "from_csv")
    figure(rows, tmp_path / "from_rows")
    assert (tmp_path / "from_csv.png").read_bytes() == (tmp_path / "from_rows.png").read_bytes()


# The short runs: the gain reaches SGD's update and Adam divides it out ------------------------------------

def _fixed_gradients(chain, steps: int, seed: int) -> list[dict]:
    """One gradient per step that does not depend on the weights (so every arm's run sees the same ones)."""
    g = torch.Generator().manual_seed(seed)
    return [{n: torch.randn(p.shape, dtype=p.dtype, generator=g) for n, p in chain.named_parameters()}
            for _ in range(steps)]


def _scaled(grads: dict, gains: list[float]) -> dict:
    """Each decoder layer's gradient times the product of the gains from the output down to it."""
    return {n: g * math.prod(gains[int(n.split(".")[2]):]) for n, g in grads.items()}


@settings(max_examples=20, deadline=None)
@given(layers=st.integers(2, 6), g=st.floats(0.5, 2.0), steps=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_sgd_moves_each_layer_by_its_gain_product_and_adamw_divides_it_out(layers, g, steps, seed):
    from mxfp4.analysis.depth import displacement_rows, short_run
    from mxfp4.report.depth_table import log_slope

    chain = _Chain(layers, 4, seed)
    before = {n: p.detach().clone() for n, p in chain.named_parameters()}
    grads = _fixed_gradients(chain, steps, seed)
    for optimizer, expected in (("sgd", math.log(g)), ("adamw", 0.0)):
        moved = short_run(chain, lambda b: _scaled(b, [g] * layers), grads, optimizer, 1e-3)
        ref = short_run(chain, lambda b: b, grads, optimizer, 1e-3)
        rows = displacement_rows("chain", layers, optimizer, 1e-3, "+scale", "backward", 0, compare(moved, ref))
        assert log_slope({r["distance"]: r["norm_ratio"] for r in rows}) == pytest.approx(expected, abs=1e-6)
        assert all(r["cosine"] == pytest.approx(1.0, abs=1e-6) for r in rows)
    assert all(torch.equal(p, before[n]) for n, p in chain.named_parameters())  # restored after each run


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), magnitude=st.floats(1e-4, 1e2))
def test_the_matched_sgd_rate_moves_the_first_step_as_far_as_torchs_adamw(seed, magnitude):
    from mxfp4.analysis.depth import matched_sgd_lr, short_run

    chain = _Chain(3, 5, seed)
    grads = [{n: g * magnitude for n, g in _fixed_gradients(chain, 1, seed)[0].items()}]
    adam = short_run(chain, lambda b: b, grads, "adamw", 5e-5)
    sgd = short_run(chain, lambda b: b, grads, "sgd", matched_sgd_lr(5e-5, grads[0]))
    norm = lambda d: math.sqrt(sum(float(t.pow(2).sum()) for t in d.values()))  # noqa: E731
    assert norm(sgd) == pytest.approx(norm(adam), rel=1e-6)


def test_a_zero_first_gradient_has_no_matched_sgd_rate():
    from mxfp4.analysis.depth import matched_sgd_lr

    with pytest.raises(ValueError, match="squared norm 0"):
        matched_sgd_lr(5e-5, {"w": torch.zeros(3)})


def test_the_optimizer_table_holds_the_test_where_sgd_keeps_the_gain_and_adamw_does_not(tmp_path):
    """Unit rows with SGD's scale arm at gain 1/2 per layer and AdamW's at 1 (controls at 1, a little noise per
    run): the primary contrast is log(1/2) and held after Holm; a model whose two optimizers agree is not shown;
    the markdown and figure are written."""
    from mxfp4.analysis.depth import OPTIMIZER_FIELDS
    from mxfp4.io import write_csv_atomic
    from mxfp4.report.depth_optimizers import CONTRAST, draw, run
    from mxfp4.report.depth_table import figure

    rng = torch.Generator().manual_seed(0)
    units = []
    for model, sgd_gain in (("chain", 0.5), ("chain-l4", 1.0)):
        layers = 4 if model.endswith("l4") else 3
        for r in range(5):
            for optimizer, gain in (("sgd", sgd_gain), ("adamw", 1.0)):
                for arm, arm_gain in (("+scale", gain), ("+scale~signflip", 1.0)):
                    noise = 1 + 1e-3 * float(torch.randn(1, generator=rng))
                    for layer in range(layers):
                        d = layers - 1 - layer
                        units.append({"model": model, "layers": layers, "optimizer": optimizer, "lr": 1e-3, "arm": arm,
                                      "site": "backward", "run": r, "layer": layer, "distance": d,
                                      "norm_ratio": arm_gain ** d * noise ** d, "cosine": 1.0})
    path = write_csv_atomic(tmp_path / "units.csv", units, OPTIMIZER_FIELDS)
    rows = run([path], tmp_path / "depth_optimizers.csv")
    primary = {r["model"]: r for r in rows if r["measure"] == CONTRAST}
    assert primary["chain"]["mean"] == pytest.approx(math.log(0.5), abs=1e-2)
    assert primary["chain"]["verdict"] == "held" and primary["chain"]["p_holm"] < 0.05
    assert primary["chain-l4"]["verdict"] == "not shown"
    text = (tmp_path / "depth_optimizers.md").read_text()
    assert "| chain | 3 | 5 |" in text and "held" in text
    draw(tmp_path / "depth_optimizers.csv", tmp_path / "from_csv")  # the registered figure, from the CSV
    figure(rows, tmp_path / "from_rows", column="optimizer", quantity="displacement")
    assert (tmp_path / "from_csv.png").read_bytes() == (tmp_path / "from_rows.png").read_bytes()


def test_the_short_runs_measure_every_arm_optimizer_run_and_layer_of_a_warm_start(smoke_results, monkeypatch):
    """Each injected arm under each optimizer has one row per run and decoder layer; SGD's rate is its own per
    run and AdamW's GRPO's; the scale arm's displacement differs from the unquantized run's."""
    from mxfp4.analysis.depth import OPTIMIZER_ARMS, run_depth_optimizers
    from mxfp4.config.profiles import DepthOptimizerSettings, load_profile
    from mxfp4.rl import data

    monkeypatch.setattr(data, "accuracy_reward", lambda completions, **kw: [float(i % 2) for i in
                                                                            range(len(completions))])
    base = load_profile("smoke")
    profile = base.model_copy(update={"seeds": [0]})
    settings = DepthOptimizerSettings(optimizers=["sgd", "adamw"], runs_per_seed=2, steps=1)
    units = run_depth_optimizers(Run.of(profile, smoke_results), "tiny-dense", settings, progress=lambda m: None)
    layers = profile.model("tiny-dense").layers or 2
    for optimizer in ("sgd", "adamw"):
        for arm in OPTIMIZER_ARMS[1:]:
            mine = [u for u in units if (u["optimizer"], u["arm"]) == (optimizer, arm)]
            assert sorted((u["run"], u["distance"]) for u in mine) == [(r, d) for r in (0, 1) for d in range(layers)]
    assert {u["lr"] for u in units if u["optimizer"] == "adamw"} == {profile.grpo.learning_rate}
    assert len({u["lr"] for u in units if u["optimizer"] == "sgd"}) == 2
    assert any(abs(u["norm_ratio"] - 1) > 1e-6 for u in units if u["arm"] == "+scale")
    # skip_runs leaves the first runs' batches to a pilot: the scale arm's one run left is the second run above,
    # bit for bit (the controls' draws are seeded by the run's place among the runs measured)
    later = run_depth_optimizers(Run.of(profile, smoke_results), "tiny-dense", DepthOptimizerSettings(
        optimizers=["sgd"], runs_per_seed=1, skip_runs=1, steps=1), progress=lambda m: None)
    second = [{**u, "run": 0} for u in units if (u["run"], u["optimizer"], u["arm"]) == (1, "sgd", "+scale")]
    assert [u for u in later if u["arm"] == "+scale"] == second

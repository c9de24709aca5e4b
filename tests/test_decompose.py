"""The three-way decomposition: exact identity, components zero where they must be, Shapley efficiency."""

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mxfp4.cli import main
from mxfp4.numerics import reference
from mxfp4.numerics.decompose import decompose
from mxfp4.numerics.formats import FORMATS
from mxfp4.numerics.prove import IDENTITY_TOL_REL

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@st.composite
def tensors(draw):
    ndim = draw(st.integers(1, 3))
    shape = draw(st.lists(st.integers(1, 70), min_size=ndim, max_size=ndim))
    axis = draw(st.integers(-ndim, ndim - 1))
    dtype = draw(st.sampled_from(DTYPES))
    fmt = draw(st.sampled_from(list(FORMATS)))
    rule = draw(st.sampled_from(FORMATS[fmt].scale_rules))
    seed = draw(st.integers(0, 2**31 - 1))
    log_scale = draw(st.integers(-12, 12))
    heavy = draw(st.booleans())
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    if heavy:
        x = x / torch.rand(*shape, generator=g).clamp(min=1e-3)
    x = x * 2.0**log_scale
    if dtype == torch.float16:
        x = x.clamp(-60000.0, 60000.0)  # stay finite in float16
    return x.to(dtype), fmt, axis, rule


@given(tensors())
def test_identity_holds_to_float64_round_off(case):
    x, fmt, axis, rule = case
    d = decompose(x, fmt, axis=axis, scale_rule=rule)
    total = d.e_scale + d.e_dead + d.e_grid
    mag = torch.maximum(d.x.abs(), d.quantized.abs())
    assert ((d.error - total).abs() <= IDENTITY_TOL_REL * mag).all()
    assert d.stats["identity_residual_rel"] <= IDENTITY_TOL_REL
    # the decomposition's quantized tensor is the package's quantizer, not a copy of it
    assert torch.equal(d.quantized.to(x.dtype), reference.fake_quantize(x, fmt, axis, rule))


@given(tensors())
def test_components_are_zero_where_they_must_be(case):
    x, fmt, axis, rule = case
    d = decompose(x, fmt, axis=axis, scale_rule=rule)
    assert (d.e_dead[~d.dead] == 0).all(), "deadzone error outside the deadzone"
    assert (d.e_grid[d.dead] == 0).all(), "grid noise inside the deadzone"
    assert torch.equal(d.e_dead[d.dead], -d.x[d.dead])


@given(tensors())
def test_shapley_values_sum_to_the_total_error_energy(case):
    x, fmt, axis, rule = case
    s = decompose(x, fmt, axis=axis, scale_rule=rule).stats
    shapley_sum = s["shapley_scale"] + s["shapley_dead"] + s["shapley_grid"]
    assert shapley_sum == pytest.approx(s["energy_total"], rel=1e-12, abs=1e-300)
    assert s["cross_term"] == pytest.approx(
        s["energy_total"] - s["energy_scale"] - s["energy_dead"] - s["energy_grid"], rel=1e-9, abs=1e-300
    )


@given(
    st.integers(-30, 30),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3"]),
)
def test_scale_bias_vanishes_when_amax_is_max_value_times_a_power_of_two(k, seed, fmt):
    f = FORMATS[fmt]
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(4, 64, generator=g) * 2 - 1
    x[:, ::32] = f.element.max_value
    x = x * 2.0**k
    d = decompose(x, fmt)
    assert (d.e_scale == 0).all()
    assert d.stats["energy_scale"] == 0 and d.stats["share_scale"] == 0


def test_deadzone_is_below_amax_over_24_for_e2m1_with_ties_to_zero():
    x = torch.tensor([[24.0, 1.0, 1.0001, -1.0, 0.999] + [0.0] * 27])
    d = decompose(x)
    assert d.dead[0, :5].tolist() == [False, True, False, True, True]


def test_scale_bias_energy_exceeds_total_on_gaussian_so_cross_term_is_negative():
    """docs/decomposition.md's warning: energies do not add up; the cross term must be reported."""
    s = decompose(torch.randn(256, 1024, generator=torch.Generator().manual_seed(0))).stats
    assert s["energy_scale"] > s["energy_total"]
    assert s["cross_term"] < 0


def test_non_finite_input_is_rejected():
    with pytest.raises(ValueError, match="finite input; found 1 NaN or infinite"):
        decompose(torch.tensor([[1.0, float("nan")]]))


def test_prove_cli_writes_a_passing_report(tmp_path):
    out = tmp_path / "proofs.json"
    assert main(["prove", "--out", str(out), "--rows", "8", "--cols", "256"]) == 0
    report = json.loads(out.read_text())
    assert report["passed"]
    cases = {(c["distribution"], c["format"], c["scale_rule"], c["dtype"]) for c in report["cases"]}
    assert ("llm_rows", "nvfp4", "nearest", "float32") in cases
    assert ("e8m0_tiny", "mxfp4", "floor", "float32") in cases
    assert report["max_identity_residual_rel"] <= IDENTITY_TOL_REL


def test_decompose_cli_prints_the_table(capsys):
    assert main(["decompose", "--dist", "laplace", "--rows", "8", "--cols", "64"]) == 0
    out = capsys.readouterr().out
    for word in ("scale", "dead", "grid", "cross", "deadzone"):
        assert word in out
    assert main(["decompose", "--scale-rule", "bogus"]) == 2


def test_per_layer_breakdown_pools_energies_and_weights_fractions_by_size():
    from mxfp4.numerics.decompose import decompose_named

    g = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(8, 64, generator=g), "b": torch.randn(4, 32, generator=g) * 10}
    out = decompose_named(tensors)
    per, total = out["per_tensor"], out["total"]
    assert set(per) == {"a", "b"}
    assert total["energy_total"] == pytest.approx(per["a"]["energy_total"] + per["b"]["energy_total"])
    expected = (per["a"]["deadzone_fraction"] * 512 + per["b"]["deadzone_fraction"] * 128) / 640
    assert total["deadzone_fraction"] == pytest.approx(expected)

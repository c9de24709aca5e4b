"""The three-way decomposition: exact identity, components zero where they must be, Shapley efficiency."""

import json

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxfp4.cli import main
from mxfp4.numerics import reference
from mxfp4.numerics.decompose import decompose
from mxfp4.numerics.formats import FORMATS
from mxfp4.verify.prove import IDENTITY_TOL_REL
from oracle import oracle_decode, oracle_quantize

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


# ---- the gain form (docs/decomposition.md, "The gain form") ----


def _oracle_gain(x: np.ndarray):
    """The gain form of MXFP4 (floor rule) along the last axis in numpy float64 from the ml_dtypes oracle:
    (e_scale, e_dead, e_grid, MX(x)), none of the package's code."""
    rows, k = x.shape
    codes, scale_bytes, _ = oracle_quantize(x, "e2m1", 32, "e8m0", "floor")
    scale = scale_bytes.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)[..., None]
    xb = x.astype(np.float64).reshape(rows, -1, 32)
    mx = oracle_decode(codes, "e2m1").astype(np.float64) * scale
    s_star = np.abs(xb).max(-1, keepdims=True) / 6.0
    ideal = (xb / np.where(s_star > 0, s_star, 1.0)).astype(np.float32).astype(ml_dtypes.float4_e2m1fn)
    x_grid = ideal.astype(np.float64) * s_star
    kept = mx != 0
    induced = np.where(kept, mx - x_grid, 0.0)
    norm = (np.where(kept, xb, 0.0) ** 2).sum(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        gain = np.where(norm > 0, (induced * xb).sum(-1, keepdims=True) / norm, 0.0)
    e_scale = np.where(kept, gain * xb, 0.0)
    e_dead = np.where(kept, 0.0, -xb)
    e_grid = np.where(kept, mx - xb - e_scale, 0.0)
    return [a.reshape(rows, k) for a in (e_scale, e_dead, e_grid, mx)]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(1, 6), st.integers(0, 2**31 - 1), st.integers(-20, 20), st.booleans())
def test_gain_form_agrees_with_an_independent_computation(rows, blocks, seed, log_scale, heavy):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 32 * blocks, generator=g)
    if heavy:
        x = x / torch.rand(rows, 32 * blocks, generator=g).clamp(min=1e-3)
    x = x * 2.0**log_scale
    x[0, :3] = 0.0
    d = decompose(x, "mxfp4", form="gain")
    expected = _oracle_gain(x.numpy())
    mag = np.abs(x.numpy().astype(np.float64)) + np.abs(expected[3])
    for got, want in zip((d.e_scale, d.e_dead, d.e_grid, d.quantized), expected):
        assert (np.abs(got.numpy() - want) <= 1e-12 * mag + 1e-300).all()


@given(tensors())
def test_gain_form_identity_holds_and_its_parts_are_what_they_claim(case):
    x, fmt, axis, rule = case
    d = decompose(x, fmt, axis=axis, scale_rule=rule, form="gain")
    mag = torch.maximum(d.x.abs(), d.quantized.abs())
    assert ((d.error - (d.e_scale + d.e_dead + d.e_grid)).abs() <= IDENTITY_TOL_REL * mag).all()
    # the deadzone is what the stored scale flushes: exactly the elements MXFP4 sends to zero
    assert torch.equal(d.dead, d.quantized == 0)
    assert torch.equal(d.e_dead[d.dead], -d.x[d.dead]) and (d.e_scale[d.dead] == 0).all()
    # the scale bias is a gain: within each block, e_scale = g x on the kept elements
    size = FORMATS[fmt].block_size
    def blocks(t):  # float64 blocks along the axis, zero-padded
        t = t.movedim(axis, -1)
        t = torch.nn.functional.pad(t, (0, -t.shape[-1] % size))
        return t.reshape(*t.shape[:-1], -1, size)

    kept_x, e_scale = blocks(torch.where(d.dead, 0.0, d.x)), blocks(d.e_scale)
    gain = (e_scale * kept_x).sum(-1, keepdim=True) / kept_x.pow(2).sum(-1, keepdim=True).clamp(min=1e-300)
    assert ((e_scale - gain * kept_x).abs() <= 1e-9 * (gain * kept_x).abs() + 1e-300).all()
    shapley_sum = sum(d.stats[f"shapley_{c}"] for c in ("scale", "dead", "grid"))
    assert shapley_sum == pytest.approx(d.stats["energy_total"], rel=1e-9, abs=1e-300)


def test_gain_form_counts_the_stored_scale_deadzone_and_keeps_a_small_cross_term():
    """On Gaussian data: the canonical split counts the deadzone at the ideal scale
    and carries a cross term of about -1.5x the error energy; the gain form counts what MXFP4 flushes
    (about 3% of the error energy) and its components are nearly orthogonal (dead is exactly
    orthogonal to both: disjoint supports)."""
    x = torch.randn(256, 1024, generator=torch.Generator().manual_seed(0))
    canonical, gain = decompose(x).stats, decompose(x, form="gain").stats
    assert canonical["cross_share"] < -1.0 and abs(gain["cross_share"]) < 0.2
    flushed = float(x[decompose(x).quantized == 0].double().pow(2).sum()) / gain["energy_total"]
    assert gain["share_dead"] == pytest.approx(flushed, rel=1e-12) and 0.02 < flushed < 0.05
    assert gain["cosine_scale_dead"] == 0 and gain["cosine_dead_grid"] == 0
    assert gain["deadzone_fraction"] > canonical["deadzone_fraction"]  # s <= 1.5 s*: the stored grid is coarser


def test_component_cosines_match_an_independent_computation():
    x = torch.distributions.StudentT(3.0).sample((64, 256))
    for form in ("canonical", "gain"):
        d = decompose(x, form=form)
        parts = {"scale": d.e_scale.flatten(), "dead": d.e_dead.flatten(), "grid": d.e_grid.flatten()}
        for a, b in (("scale", "dead"), ("scale", "grid"), ("dead", "grid")):
            want = torch.nn.functional.cosine_similarity(parts[a], parts[b], dim=0, eps=1e-300).item()
            assert d.stats[f"cosine_{a}_{b}"] == pytest.approx(want, abs=1e-12)


def test_an_unknown_form_is_refused():
    with pytest.raises(ValueError, match="accepted: canonical, gain"):
        decompose(torch.randn(4, 32), form="projection")


@given(st.integers(0, 2**31 - 1))
@settings(max_examples=20, deadline=None)
def test_a_float64_operand_decomposes_exactly_as_a_correction_hands_it_over(seed):
    """docs/corrections.md: operands may arrive in float64. The identity holds exactly in float64, and where the
    values are float32 numbers the quantized tensor is the float32 path's, value for value."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(8, 96, generator=g) * torch.exp(torch.randn(8, 1, generator=g))).double()
    d = decompose(x)
    assert d.quantized.dtype == torch.float64
    assert torch.equal(d.e_scale + d.e_dead + d.e_grid, d.quantized - x)
    assert torch.equal(d.quantized, reference.fake_quantize(x.float(), "mxfp4", -1).double())

"""Component injection (mxfp4.numerics.injection): exact by the identity, each component what the
definition says, and applied at the GEMM site a recipe names."""

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxfp4.config.recipes import Recipe
from mxfp4.nn import patch_model, unpatch_model
from mxfp4.numerics.injection import ROWS, SITES, ComponentQuantizer, row_spec
from mxfp4.rl.models import build_tiny
from oracle import oracle_decode, oracle_quantize


def oracle_mx(x: torch.Tensor, rule="floor") -> torch.Tensor:
    """MXFP4 fake-quantization along the last axis from the ml_dtypes oracle (none of the package's code)."""
    codes, scale_bytes, _ = oracle_quantize(x.numpy(), "e2m1", 32, "e8m0", rule)
    scales = scale_bytes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    out = (oracle_decode(codes, "e2m1") * scales[..., None]).reshape(x.shape[0], -1)[:, : x.shape[1]]
    return torch.from_numpy(out)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 6), cols=st.integers(1, 130), scale=st.floats(1e-3, 1e3), seed=st.integers(0, 2**16),
       rule=st.sampled_from(["floor", "ceil", "even", "rceil"]), form=st.sampled_from(["canonical", "gain"]))
def test_the_three_injections_add_up_to_mxfp4(rows, cols, scale, seed, rule, form):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * scale
    x[0, 0] = 0.0
    total = (
        sum(ComponentQuantizer(scale_rule=rule, inject=c, form=form)(x, -1).double() for c in ("scale", "dead", "grid"))
        - 2 * x.double()
    )
    expected = oracle_mx(x, rule).double()
    tol = 4 * torch.finfo(torch.float32).eps * (x.abs().double() + expected.abs()) + 1e-30
    assert ((total - expected).abs() <= tol).all()


def test_remove_is_mxfp4_minus_the_injected_component():
    x = torch.randn(16, 96, generator=torch.Generator().manual_seed(1)) * 3
    mx = oracle_mx(x)
    for c in ("scale", "dead", "grid"):
        injected = ComponentQuantizer(inject=c)(x, -1) - x
        removed = ComponentQuantizer(remove=c)(x, -1)
        torch.testing.assert_close(removed, mx - injected, rtol=0, atol=1e-5)


def test_inject_dead_zeroes_exactly_the_deadzone_and_keeps_the_rest():
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(2))
    blocks = x.reshape(8, 2, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    dead = (blocks.abs() <= amax / 24).reshape(8, 64)  # |x| <= amax/24, ties to zero
    out = ComponentQuantizer(inject="dead")(x, -1)
    assert (out[dead] == 0).all() and torch.equal(out[~dead], x[~dead])
    assert dead.any()


def test_inject_scale_vanishes_where_the_ideal_scale_is_a_power_of_two():
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(3))
    x[:, 0] = 6.0 * 2.0 ** torch.tensor([-3.0, 0.0, 1.0, 4.0])  # amax = 6 * 2^k: s* = s
    x[:, 1:] = x[:, 1:].clamp(-5.9 * 2.0**-3, 5.9 * 2.0**-3)
    assert torch.equal(ComponentQuantizer(inject="scale")(x, -1), x)


def test_blocks_run_along_the_axis_asked_for():
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(4))
    along0 = ComponentQuantizer(inject="grid")(x, 0)
    torch.testing.assert_close(along0, ComponentQuantizer(inject="grid")(x.T.contiguous(), -1).T)


def test_bad_arguments_are_refused_with_what_is_accepted():
    with pytest.raises(ValueError, match="exactly one of inject= or remove="):
        ComponentQuantizer(inject="scale", remove="dead")
    with pytest.raises(ValueError, match="scale, dead, grid"):
        ComponentQuantizer(inject="noise")
    with pytest.raises(ValueError, match="accepted: none"):
        row_spec("+bias")
    with pytest.raises(ValueError, match="no corrections"):
        Recipe(name="x", inject="scale", corrections=[{"name": "macro_block"}])
    assert [row_spec(r) for r in ROWS][:2] == [None, {"inject": "scale"}]


def _grads_and_logits(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("site", list(SITES))
def test_the_site_decides_which_gemms_see_the_component(site):
    model, _ = build_tiny("tiny-dense", seed=0)
    ids = torch.randint(3, 60, (2, 24), generator=torch.Generator().manual_seed(0))
    ref_logits, ref_grads = _grads_and_logits(model, ids)
    patch_model(model, Recipe(name="g", inject="grid", gemms=SITES[site]).quantizer())
    logits, grads = _grads_and_logits(model, ids)
    unpatch_model(model)
    assert torch.equal(logits, ref_logits) == (site == "backward")
    changed = any(not torch.equal(grads[n], ref_grads[n]) for n in ref_grads)
    assert changed


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 5), cols=st.integers(1, 100), seed=st.integers(0, 2**16), axis=st.sampled_from([0, -1]),
       component=st.sampled_from(["scale", "dead", "grid"]),
       kind=st.sampled_from(["gaussian", "permuted", "signflip"]))
def test_a_control_carries_its_components_energy_in_every_block(rows, cols, seed, axis, component, kind):
    """Per block of 32 along the axis: the same energy as e_c (to float32 round-off); the permuted
    control the same multiset of values; the sign-flip control each element's magnitude exactly (so its
    block energy exactly too); all the same every call (seeded)."""
    from mxfp4.numerics.decompose import error_components
    from mxfp4.numerics.injection import matched_control

    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 3
    e = error_components(x, axis=axis, dtype=torch.float32)[component]
    ctrl = matched_control(e, axis, 32, kind)
    assert ctrl.shape == e.shape and ctrl.dtype == e.dtype
    assert torch.equal(ctrl, matched_control(e, axis, 32, kind))
    eb, cb = (t.movedim(axis, -1) for t in (e, ctrl))
    for start in range(0, eb.shape[-1], 32):
        want, got = eb[..., start : start + 32], cb[..., start : start + 32]
        energy_want, energy_got = want.double().pow(2).sum(-1), got.double().pow(2).sum(-1)
        assert torch.allclose(energy_got, energy_want, rtol=8 * torch.finfo(torch.float32).eps, atol=1e-30)
        if kind == "permuted":
            assert torch.equal(want.sort(-1).values, got.sort(-1).values)
    if kind == "signflip":
        assert torch.equal(ctrl.abs(), e.abs())
        assert torch.equal(ctrl.double().pow(2).movedim(axis, -1).sum(-1), e.double().pow(2).movedim(axis, -1).sum(-1))


def test_a_control_arm_injects_matched_noise_not_the_component():
    from mxfp4.numerics.decompose import error_components

    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(3))
    e = error_components(x, dtype=torch.float32)["scale"]
    for kind in ("gaussian", "permuted", "signflip"):
        injected = ComponentQuantizer(inject="scale", control=kind)(x, -1) - x
        assert injected.pow(2).sum() == pytest.approx(e.pow(2).sum().item(), rel=1e-5)
        # the structure is gone: the control is nearly uncorrelated with e_scale, which x determines
        cos = torch.nn.functional.cosine_similarity(injected.flatten(), e.flatten(), dim=0)
        assert abs(cos) < 0.1
    removed = ComponentQuantizer(remove="dead", control="permuted")(x, -1)
    assert (removed - oracle_mx(x)).pow(2).sum() > 0  # MXFP4 with dead's structure swapped for its noise
    assert row_spec("+grid~gaussian") == {"inject": "grid", "control": "gaussian"}
    from mxfp4.numerics.injection import matched_control

    flipped = (matched_control(e, -1, 32, "signflip") / e)[e != 0]
    assert torch.equal(flipped.abs(), torch.ones_like(flipped))  # every element +-e_c, the sign drawn alone
    assert 0.4 < (flipped < 0).double().mean() < 0.6
    with pytest.raises(ValueError, match="accepted: gaussian, permuted, signflip"):
        ComponentQuantizer(inject="scale", control="uniform")


def test_a_pathway_arm_injects_the_component_of_the_form_it_names():
    from mxfp4.analysis.pathways.measurement import row_quantizer
    from mxfp4.numerics.decompose import error_components

    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(5))
    for form in ("canonical", "gain"):
        q = row_quantizer("+scale", "both", form=form)
        want = x + error_components(x, dtype=torch.float32, form=form)["scale"]
        assert q.form == form and torch.equal(q(x, -1), want)
    assert row_quantizer("all", form="gain") is not None  # full MXFP4 has no form: accepted, ignored

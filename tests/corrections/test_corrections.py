"""Corrections shrink the component they target; the identity still holds for what stays quantized."""

import sys

import pytest
import torch

from mxfp4 import corrections as corr
from mxfp4.config.recipes import Recipe, load_recipe_table
from mxfp4.corrections import AdaptiveQuantizationNoise
from mxfp4.numerics.quantizer import Quantizer
from mxfp4.verify.distributions import sample
from mxfp4.verify.prove import IDENTITY_TOL_REL

DISTS = ["gaussian", "laplace", "student_t3", "llm_rows"]


@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize(
    "params", [{"blocks": 1}, {"blocks": 4}, {"blocks": 4, "rows": 4}, {"blocks": 4, "candidates": "all"}]
)
def test_macro_block_scaling_reduces_scale_bias_energy(dist, params):
    x = sample(dist, 64, 512, seed=1)
    base = Quantizer().decompose(x, -1).stats
    q = Quantizer(corrections=[corr.build({"name": "macro_block", **params})])
    after = q.decompose(x, -1).stats
    assert after["energy_scale"] < base["energy_scale"]
    assert after["energy_total"] <= base["energy_total"]  # never worse than plain MXFP4 per group
    assert after["identity_residual_rel"] <= IDENTITY_TOL_REL
    assert torch.equal(q(x, -1), q.decompose(x, -1).quantized.float())


@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize(
    "params", [{"mode": "element", "k": 1}, {"mode": "element", "k": 2}, {"mode": "block", "fraction": 0.1}]
)
def test_outlier_fallback_reduces_deadzone_fraction_and_reports_its_cost(dist, params):
    x = sample(dist, 64, 512, seed=2)
    base = Quantizer().decompose(x, -1).stats
    fb = corr.build({"name": "outlier_fallback", **params})
    q = Quantizer(corrections=[fb])
    d = q.decompose(x, -1)
    assert d.stats["deadzone_fraction"] < base["deadzone_fraction"]
    assert d.stats["identity_residual_rel"] <= IDENTITY_TOL_REL
    y = q(x, -1)
    kept = fb.outlier_mask(x, -1)
    assert torch.equal(y[kept], x[kept].bfloat16().float()), "outliers stay in BF16"
    assert torch.equal(y[~kept], d.quantized.float()[~kept])
    expected = params.get("k", 0) / 32 if params["mode"] == "element" else params["fraction"]
    assert fb.cost()["bf16_fraction"] == pytest.approx(expected, rel=0.02)


def test_aqn_schedule_matches_its_formula_and_stage_zero_is_noise_free():
    a = AdaptiveQuantizationNoise(sigma_start=1e-2, sigma_end=1e-4, stages=5, total_steps=100)
    assert [a.stage(s) for s in (0, 19, 20, 99)] == [0, 0, 1, 4]
    assert a.sigma(0) == 0 and a.sigma(19) == 0
    for k in range(1, 5):
        assert a.sigma(20 * k) == pytest.approx(1e-2 * (1e-4 / 1e-2) ** ((k - 1) / 3))
    assert a.sigma(99) == pytest.approx(1e-4)


class _Norms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = type("FakeRMSNorm", (torch.nn.Module,), {})()
        self.a.weight = torch.nn.Parameter(torch.ones(64))
        self.lin = torch.nn.Linear(4, 4)


def test_aqn_noise_is_deterministic_restored_and_only_on_rmsnorm():
    m = _Norms()
    lin_before = m.lin.weight.detach().clone()
    a = AdaptiveQuantizationNoise(stages=2, total_steps=10, seed=3)
    with a.rollout_context(m, 0) as sigma:
        assert sigma == 0 and torch.equal(m.a.weight, torch.ones(64))
    with a.rollout_context(m, 7):
        noisy1 = m.a.weight.detach().clone()
        assert torch.equal(m.lin.weight, lin_before)
    assert torch.equal(m.a.weight, torch.ones(64)), "weights restored after the rollout"
    with a.rollout_context(m, 7):
        noisy2 = m.a.weight.detach().clone()
    with a.rollout_context(m, 8):
        noisy3 = m.a.weight.detach().clone()
    assert torch.equal(noisy1, noisy2) and not torch.equal(noisy1, noisy3)
    assert (noisy1 - 1).std().item() == pytest.approx(1e-2, rel=0.3)


def test_aqn_adaptive_mode_raises_sigma_when_entropy_is_below_target():
    a = AdaptiveQuantizationNoise(stages=2, total_steps=10, adaptive=True, target_entropy=1.0)
    s0 = a.sigma(5)
    a.observe({"entropy": 0.5})
    assert a.sigma(5) > s0
    a.observe({"entropy": 2.0})
    a.observe({"entropy": 2.0})
    assert a.sigma(5) < s0
    with pytest.raises(ValueError, match="target_entropy"):
        AdaptiveQuantizationNoise(adaptive=True)


def test_named_recipes_exist_and_resolve_their_base():
    table = load_recipe_table()
    for name in ("bf16", "mxfp4", "mxfp4+macro", "mxfp4+fallback", "mxfp4+aqn", "mxfp4+all"):
        assert name in table
    r = Recipe.named("mxfp4+all")
    assert r.format == "mxfp4" and r.gemms["weight_grad"]
    assert [c["name"] for c in r.corrections] == ["outlier_fallback", "macro_block", "aqn"]
    assert not Recipe.named("bf16").quantize


def test_unknown_names_are_errors_that_list_the_known_ones():
    with pytest.raises(ValueError, match="unknown recipe 'nope'; known: bf16, mxfp4"):
        Recipe.named("nope")
    with pytest.raises(ValueError, match="unknown correction 'magic'; known: aqn, four_over_six, "
                                         r"full_precision_roles, hadamard, macro_block, ms_eden, outlier_fallback, "
                                         r"smoothquant, stochastic_rounding, two_d_scales "
                                         r"\(a correction of your own: name its module in MXFP4_PLUGINS"):
        Recipe(name="x", corrections=[{"name": "magic"}])
    with pytest.raises(ValueError, match="correction 'macro_block': size: unknown parameter; accepted: blocks, rows"):
        Recipe(name="x", corrections=[{"name": "macro_block", "size": 3}])
    with pytest.raises(ValueError, match="unknown GEMM"):
        Recipe(name="x", gemms={"fwd": True})


def test_a_correction_registered_from_outside_plugs_into_a_recipe():
    @corr.register("test_halve_outliers")
    class Halve(corr.Correction):
        def __init__(self, k=1):
            self.k = k

        def split(self, x, axis, valid=None):
            mask = x.abs() > 3
            return mask, torch.where(mask, 0.0, x)

    try:
        r = Recipe(name="mine", corrections=[{"name": "test_halve_outliers", "k": 2}])
        (c,) = r.build_corrections()
        x = sample("student_t3", 8, 64)
        y = Quantizer(corrections=[c])(x, -1)
        assert torch.equal(y[x.abs() > 3], x[x.abs() > 3].bfloat16().float())
    finally:
        corr.REGISTRY.pop("test_halve_outliers")


def test_outside_correction_and_recipe_files_plug_in_through_the_environment(tmp_path, monkeypatch):
    (tmp_path / "my_corrections.py").write_text(
        "import torch\n"
        "from mxfp4.corrections import Correction, register\n\n"
        "@register('test_clip')\n"
        "class Clip(Correction):\n"
        "    def __init__(self, limit=3.0):\n"
        "        self.limit = limit\n"
        "    def split(self, x, axis, valid=None):\n"
        "        mask = x.abs() > self.limit\n"
        "        return mask, torch.where(mask, 0.0, x)\n"
    )
    (tmp_path / "my_recipes.yaml").write_text(
        "mxfp4+clip:\n  base: mxfp4\n  corrections: [{name: test_clip, limit: 2.5}]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MXFP4_PLUGINS", "my_corrections")
    monkeypatch.setenv("MXFP4_RECIPES", str(tmp_path / "my_recipes.yaml"))
    try:
        r = Recipe.named("mxfp4+clip")
        assert r.format == "mxfp4" and r.corrections == [{"name": "test_clip", "limit": 2.5}]
        assert r.build_corrections()[0].limit == 2.5
    finally:
        corr.REGISTRY.pop("test_clip", None)
        sys.modules.pop("my_corrections", None)


def test_the_aqn_recipe_uses_qerls_schedule_from_1e_2_to_1e_4_over_10_stages():
    from mxfp4.config.recipes import Recipe

    (a,) = Recipe.named("mxfp4+aqn").build_corrections()
    a.bind(total_steps=100, seed=0)
    sigmas = [a.scheduled_sigma(step) for step in range(0, 100, 10)]  # one step per stage
    assert sigmas[0] == 0.0 and sigmas[1] == pytest.approx(1e-2) and sigmas[-1] == pytest.approx(1e-4)
    ratios = [b / a_ for a_, b in zip(sigmas[1:], sigmas[2:])]
    assert ratios == pytest.approx([ratios[0]] * len(ratios))  # exponential decay


def test_adaptive_aqn_takes_its_target_from_the_bf16_cell():
    from mxfp4.config.recipes import Recipe

    (a,) = Recipe.named("mxfp4+aqn-adaptive").build_corrections()
    assert a.needs_reference and a.adaptive
    with pytest.raises(ValueError, match="never bound"):
        a.observe({"entropy": 0.1})
    a.bind_reference({"mean_entropy": 0.25})
    assert a.target_entropy == 0.25 and not a.needs_reference
    with pytest.raises(ValueError, match="a number or 'bf16'"):
        AdaptiveQuantizationNoise(adaptive=True, target_entropy="fp32")


def test_the_papers_ties_are_declared_on_the_correction_classes(monkeypatch):
    """The pathway each paper correction restores, its correction arm and what it lowers come from its class: the
    tables the reports use are read off the registry, and a plugin claiming a held pathway is one line."""
    from mxfp4 import corrections as corr
    from mxfp4.analysis.correction_table import TABLE_CORRECTIONS
    from mxfp4.analysis.pathways.spec import RECOVERIES
    from mxfp4.corrections.registry import paper_corrections
    from mxfp4.report.network_claims import CORRECTION_ARMS

    ties = paper_corrections()
    assert {p: c.name for p, c in ties.items()} == RECOVERIES == {"gradient": "macro_block",
                                                                  "rollout": "outlier_fallback", "entropy": "aqn"}
    assert CORRECTION_ARMS == {c.name: c.arm for c in ties.values()}
    assert all(Recipe.named(arm).build_corrections()[0].name == name for name, arm in CORRECTION_ARMS.items())
    assert [t["name"] for t in TABLE_CORRECTIONS] == ["macro_block"] * 2 + ["outlier_fallback"] * 2
    monkeypatch.setattr(corr.registry, "REGISTRY", dict(corr.registry.REGISTRY))

    @corr.register("rival")
    class Rival(corr.Correction):
        pathway = "gradient"

    with pytest.raises(ValueError, match="corrections 'macro_block' and 'rival' both declare the gradient pathway"):
        paper_corrections()

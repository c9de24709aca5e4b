"""A GEMM-level correction: a change of basis of one forward GEMM's operand pair, computed from both operands
(``Correction.gemm_transform``), against independent computations of Q(X T^-1) Q(W T^T)^T."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxfp4 import corrections as corr
from mxfp4.config.recipes import Recipe
from mxfp4.corrections import Correction
from mxfp4.corrections.smoothquant import smoothing_scale
from mxfp4.nn import patch_model
from mxfp4.numerics.hooks import HookError
from mxfp4.numerics.quantizer import Operand, Quantizer
from mxfp4.numerics.transform import GemmTransform
from plugins import PowerOfTwoSmoothing

PLAIN = Quantizer()


@dataclass
class MatrixTransform(Correction):
    """Any invertible change of basis: a fixed well-conditioned matrix T."""

    matrix: object = None
    name = "test_matrix"
    transforms_gemm = True

    def gemm_transform(self, activation, weight, operand):
        return self.matrix


def outlier_input(rows=16, k=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g)
    x[:, 5] *= 200.0  # an outlier channel, as LLM activations have
    x[:, 77] *= 50.0
    return x


def patched_linear(correction, k=128, n=64, bias=True, seed=0):
    torch.manual_seed(seed)
    holder = torch.nn.Sequential(torch.nn.Linear(k, n, bias=bias))
    patch_model(holder, Quantizer(corrections=[correction], name="test"))
    return holder, holder[0]


def test_the_plugin_reaches_the_exact_product_of_the_smoothed_quantized_operands():
    """Forward: Q(X/s) Q(W s)^T + b, bit for bit (s powers of two: every scaling is exact); the built-in
    smoothquant gives the plugin's values; the input gradient's GEMM is untransformed, Q(dY) Q(W along out)."""
    plugin = PowerOfTwoSmoothing()
    holder, lin = patched_linear(plugin)
    x = outlier_input().requires_grad_()
    w = lin.weight.detach()
    s = plugin.gemm_transform(x.detach(), w, None)
    assert bool((torch.log2(s) == torch.log2(s).round()).all()) and not torch.equal(s, torch.ones_like(s))
    expected = PLAIN(x.detach() / s, -1) @ PLAIN(w * s, -1).T + lin.bias.detach()
    y = holder(x)
    assert torch.equal(y, expected)
    assert not torch.equal(y, PLAIN(x.detach(), -1) @ PLAIN(w, -1).T + lin.bias.detach())  # the transform acted
    dy = torch.randn_like(y)
    y.backward(dy)
    assert torch.equal(x.grad, PLAIN(dy, -1) @ PLAIN(w, 0))
    built_in = Recipe.named("mxfp4+smooth").quantizer()
    torch.manual_seed(0)
    other = torch.nn.Sequential(torch.nn.Linear(128, 64))
    patch_model(other, built_in)
    assert torch.equal(other(x.detach()), expected)


def test_the_weight_cache_keys_on_the_transform_and_hooks_are_told_their_operand():
    """A batch of the same channel maxima reuses the cached weight; a batch with other maxima gives another s and
    quantizes the weight again in its basis. The value hook is told each operand it quantizes."""
    plugin = PowerOfTwoSmoothing()
    holder, lin = patched_linear(plugin, bias=False)
    x = outlier_input()
    with torch.no_grad():
        holder(x)
        holder(x.flip(0))  # the same channel maxima: the same s
    assert plugin.split_operands == [("weight", "forward"), ("activation", "forward"), ("activation", "forward")]
    other = outlier_input(seed=1) * torch.linspace(0.1, 8.0, 128)
    s_other = PowerOfTwoSmoothing().gemm_transform(other, lin.weight.detach(), None)
    with torch.no_grad():
        y = holder(other)
    assert plugin.split_operands[-2:] == [("weight", "forward"), ("activation", "forward")]
    assert torch.equal(y, PLAIN(other / s_other, -1) @ PLAIN(lin.weight.detach() * s_other, -1).T)
    assert plugin.asked == 3


def test_a_matrix_transform_gives_the_product_of_the_transformed_quantized_operands():
    """An invertible, non-orthogonal T: the product equals Q(X T^-1) Q(W T^T)^T to float rounding, computed in
    float64 apart from the quantizer."""
    g = torch.Generator().manual_seed(3)
    t = torch.eye(64) + 0.1 * torch.randn(64, 64, generator=g)
    holder, lin = patched_linear(MatrixTransform(matrix=t), k=64, n=32, bias=False)
    x = torch.randn(8, 64, generator=g)
    w = lin.weight.detach()
    t64 = t.double()
    qx = PLAIN((x.double() @ torch.linalg.inv(t64)).float(), -1).double()
    qw = PLAIN((w.double() @ t64.T).float(), -1).double()
    expected = qx @ qw.T
    with torch.no_grad():
        y = holder(x)
    assert torch.allclose(y.double(), expected, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(y, PLAIN(x, -1) @ PLAIN(w, -1).T, rtol=1e-3, atol=1e-3)


def test_the_decomposition_and_the_probe_are_taken_in_the_transformed_basis():
    """Quantizer.decompose with the step's transform decomposes X/s (and W s); a probe set on the patched layer sees
    those transformed operands, so it decomposes what the step quantizes."""
    plugin = PowerOfTwoSmoothing()
    quantizer = Quantizer(corrections=[plugin])
    x, w = outlier_input(), torch.randn(64, 128)
    transform = quantizer.gemm_transform(x, w, "layer")
    s = transform.scale
    act, weight = Operand("activation", "forward", "layer"), Operand("weight", "forward", "layer")
    for t, op, moved, back in ((x, act, x / s, s), (w, weight, w * s, 1 / s)):
        got = quantizer.decompose(t, -1, operand=op, transform=transform)
        there = PLAIN.decompose(moved, -1)  # taken in the transformed basis, each component mapped back by hand
        assert torch.equal(got.x, t.double()) and torch.equal(got.quantized, there.quantized * back)
        for c in ("scale", "dead", "grid"):
            assert torch.equal(getattr(got, f"e_{c}"), getattr(there, f"e_{c}") * back)
            assert got.stats[f"energy_{c}"] == float((getattr(there, f"e_{c}") * back).pow(2).sum())
        assert got.stats["energy_total"] == pytest.approx(float((PLAIN(moved, -1) * back - t).double().pow(2).sum()),
                                                          rel=1e-12)
        assert got.stats["identity_residual"] < 1e-9 and "shapley_scale" not in got.stats
        assert got.stats["n"] == t.numel() and got.stats["deadzone_fraction"] == there.stats["deadzone_fraction"]
    seen = {}
    torch.manual_seed(0)
    holder = torch.nn.Sequential(torch.nn.Linear(128, 64, bias=False))
    patch_model(holder, Quantizer(corrections=[PowerOfTwoSmoothing()]),
                probe=lambda layer, kind, tensor, axis, valid=None: seen.setdefault(kind, tensor))
    with torch.no_grad():
        holder(x)
    s = PowerOfTwoSmoothing().gemm_transform(x, holder[0].weight.detach(), None)
    assert torch.equal(seen["activation"], x / s) and torch.equal(seen["weight"], holder[0].weight.detach() * s)


def test_smoothing_on_an_outlier_tensor_what_each_measure_shows():
    """The energy table's path (``recipe_energy`` with the layer's partner operand, ``product_error``): on activations
    with outlier channels, SmoothQuant lowers the activation's deadzone (its energy and fraction) and the GEMM
    output error by more than 4x, against a direct computation; in the operand's own basis the outlier channels'
    rounding error is multiplied back by s, so its scale-bias energy does not fall."""
    from mxfp4.analysis.correction_table import product_error, recipe_energy

    x = outlier_input(rows=64, k=256)
    w = torch.randn(96, 256, generator=torch.Generator().manual_seed(1)) * 0.05
    w[:, 5] /= 200.0  # every channel contributes alike to the product, as in a trained network: the outlier
    w[:, 77] /= 50.0  # channel's weights are small
    acts = {"l": (x, -1, Operand("activation", "forward", "l"))}
    weights = {"l.weight": (w, -1, Operand("weight", "forward", "l"))}
    energy = recipe_energy(acts, "mxfp4+smooth", "canonical", alongside=weights)
    assert energy["energy_dead_after"] < 0.8 * energy["energy_dead_before"]
    assert energy["deadzone_fraction_after"] < 0.5 * energy["deadzone_fraction_before"]
    assert energy["energy_scale_after"] > energy["energy_scale_before"]
    s = smoothing_scale(x, w, 0.5)
    exact = x.double() @ w.double().T
    plain_err = float(((PLAIN(x, -1) @ PLAIN(w, -1).T).double() - exact).square().sum())
    smooth_err = float(((PLAIN(x / s, -1) @ PLAIN(w * s, -1).T).double() - exact).square().sum())
    product = product_error(weights, acts, "mxfp4+smooth")
    assert product["energy_total_before"] == pytest.approx(plain_err, rel=1e-9)
    assert product["energy_total_after"] == pytest.approx(smooth_err, rel=1e-9) and smooth_err < 0.25 * plain_err
    assert product["signal"] == float(exact.square().sum())
    with pytest.raises(ValueError, match=r"layer 'l' has its activation alone"):
        recipe_energy(acts, "mxfp4+smooth", "canonical")


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 40), st.floats(0.0, 1.0), st.integers(0, 2**16))
def test_the_smoothing_scale_matches_its_definition(rows, k, alpha, seed):
    """s is the power of two nearest SmoothQuant's max|X_j|^a / max|W_j|^(1-a) in log2 (numpy, float64), 1 where
    a channel is all zero."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, k)) * np.exp(rng.uniform(-8, 8, k))
    w = rng.standard_normal((3, k)) * np.exp(rng.uniform(-8, 8, k))
    x[:, 0] = 0.0
    xt, wt = torch.tensor(x, dtype=torch.float32), torch.tensor(w, dtype=torch.float32)
    s = smoothing_scale(xt, wt, alpha).double().numpy()
    a, b = np.abs(xt.double().numpy()).max(0), np.abs(wt.double().numpy()).max(0)
    for j in range(k):
        if a[j] == 0 or b[j] == 0:
            assert s[j] == 1.0
            continue
        target = alpha * math.log2(a[j]) - (1 - alpha) * math.log2(b[j])
        assert s[j] == 2.0 ** math.floor(target + 0.5)


def test_the_smoothing_scale_of_an_empty_batch_is_one_and_a_transform_is_one_kind():
    assert torch.equal(smoothing_scale(torch.empty(0, 8), torch.randn(4, 8), 0.5), torch.ones(8))
    with pytest.raises(ValueError, match="takes one of scale .* not both"):
        GemmTransform(scale=torch.ones(4), matrix=torch.eye(4))
    with pytest.raises(ValueError, match="not neither"):
        GemmTransform()


@pytest.mark.parametrize("returned,message", [
    (torch.zeros(128), r"returned a scale with 128 entries <= 0; expected a positive vector"),
    (torch.ones(64), r"returned a torch.float32 tensor of shape \(64,\); expected None, a positive vector of shape "
                     r"\(128,\) or an invertible \[128, 128\] matrix"),
    (torch.full((128,), float("nan")), r"returned non-finite values"),
    (torch.ones(128, 128), r"returned a matrix of condition number .* expected an invertible one"),
    ("s", r"returned str; expected None"),
])
def test_a_broken_transform_is_one_line_naming_the_correction(returned, message):
    holder, _ = patched_linear(MatrixTransform(matrix=returned))
    with torch.no_grad(), pytest.raises(HookError, match=r"correction 'test_matrix' .* gemm_transform hook: "
                                                         + message) as err:
        holder(outlier_input())
    assert "\n" not in str(err.value)


def test_a_transform_is_refused_where_it_cannot_act():
    """Beside a rotation, on fused MoE experts, and on a backward GEMM's operand: one line each."""
    with pytest.raises(ValueError, match="at most one correction may change a GEMM's basis"):
        Quantizer(corrections=[PowerOfTwoSmoothing(), corr.build({"name": "hadamard"})])
    transform = GemmTransform(scale=torch.ones(64))
    with pytest.raises(ValueError, match="a GEMM transform applies to the forward GEMM's activation and weight"):
        Quantizer(corrections=[PowerOfTwoSmoothing()])(torch.randn(4, 64), -1, operand=Operand("grad", "input_grad"),
                                                      transform=transform)
    from mxfp4.config.profiles import load_profile
    from mxfp4.nn.patch import quantized_weights
    from mxfp4.rl.cell import rollout_settings
    from mxfp4.rl.models import build_tiny

    holder, _ = patched_linear(PowerOfTwoSmoothing())
    holder.config = type("C", (), {"tie_word_embeddings": False})()
    with pytest.raises(ValueError, match="its weight has no quantized values apart from a batch"):
        quantized_weights(holder)
    grpo = load_profile("smoke").grpo.model_copy(update={"rollout": "vllm"})
    with pytest.raises(ValueError, match=r"changes each GEMM's basis .* the vLLM engine takes one. Accepted: "
                                         "grpo.rollout: hf"):
        rollout_settings(grpo, Recipe.named("mxfp4+smooth"))
    model = build_tiny("tiny-moe")[0]
    with pytest.raises(ValueError, match=r"transforms each Linear's GEMM from its two operands \(gemm_transform\), "
                                         "which the fused experts' grouped GEMMs do not take"):
        patch_model(model, Recipe.named("mxfp4+smooth").quantizer())

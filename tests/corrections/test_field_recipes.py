"""The field's corrections built in beside the paper's, each equal to an independent computation of its source's
definition: Four Over Six on E8M0 scales, the deterministic Hadamard transform, torchao's scale rules as recipes."""

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mxfp4
from mxfp4.config.recipes import Recipe
from mxfp4.corrections.hadamard import hadamard_matrix
from mxfp4.numerics.quantizer import Operand, Quantizer
from mxfp4.verify.adversarial import adversarial_rows
from oracle import _e8m0_exponent


def oracle_four_over_six(x: np.ndarray, rule: str = "floor") -> np.ndarray:
    """4/6 on E8M0 scales, with numpy and ml_dtypes only: per 32-block along the last axis, the rule's scale and
    the smallest power of two putting the block maximum at or below 4; each candidate's error energy summed in
    float64 in the block's order; the smaller wins, the rule's on a tie."""
    x = np.asarray(x, dtype=np.float32)
    rows, k = x.shape
    pad = -k % 32
    xb = np.pad(x, ((0, 0), (0, pad))).reshape(rows, -1, 32).astype(np.float64)
    amax = np.abs(xb).max(-1)

    def on_grid(scale):
        y = np.clip(xb / scale[..., None], -6.0, 6.0).astype(np.float32)
        return y.astype(ml_dtypes.float4_e2m1fn).astype(np.float64) * scale[..., None]

    own = on_grid(np.ldexp(1.0, _e8m0_exponent(amax, 2, 1, 6.0, rule)))
    mant, ex = np.frexp(amax)
    four_exp = np.where(amax > 0, np.clip(ex - 2 - (mant == 0.5), -127, 127), -127)
    four = on_grid(np.ldexp(1.0, four_exp))
    err_own = np.cumsum((own - xb) ** 2, axis=-1)[..., -1]
    err_four = np.cumsum((four - xb) ** 2, axis=-1)[..., -1]
    out = np.where((err_four < err_own)[..., None], four, own)
    return out.reshape(rows, -1)[:, :k].astype(np.float32)


def _four_over_six(x: torch.Tensor, rule: str = "floor") -> torch.Tensor:
    return Quantizer("mxfp4", rule, [mxfp4.corrections.build("four_over_six")])(x, -1)


@pytest.mark.parametrize("rule", ["floor", "ceil", "even", "rceil"])
@pytest.mark.parametrize("case", sorted(adversarial_rows()))
def test_four_over_six_equals_its_definition_on_every_adversarial_row(case, rule):
    x = adversarial_rows()[case]
    finite = torch.isfinite(x).all(-1)
    x = x[finite] if finite.any() else torch.zeros(1, x.shape[1])
    np.testing.assert_array_equal(_four_over_six(x, rule).numpy(), oracle_four_over_six(x.numpy(), rule))


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 6), cols=st.integers(1, 130), log_scale=st.integers(-30, 30), seed=st.integers(0, 2**16),
       heavy=st.booleans())
def test_four_over_six_equals_its_definition(rows, cols, log_scale, seed, heavy):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, cols, generator=g) if not heavy else
         torch.distributions.StudentT(2.0).sample((rows, cols))) * 2.0 ** log_scale
    np.testing.assert_array_equal(_four_over_six(x).numpy(), oracle_four_over_six(x.numpy()))


def test_four_over_six_never_errs_more_than_plain_mxfp4_and_sometimes_less():
    x = torch.randn(64, 256) * torch.logspace(-1, 1, 256)
    plain, four = mxfp4.fake_quantize(x), _four_over_six(x)
    per_block = lambda q: ((q - x).double() ** 2).view(64, 8, 32).sum(-1)  # noqa: E731
    assert (per_block(four) <= per_block(plain) + 1e-12).all() and (per_block(four) < per_block(plain)).any()


def test_four_over_six_refuses_a_format_without_e8m0_scales():
    with pytest.raises(ValueError, match="four_over_six chooses between E8M0 block scales; format 'nvfp4'"):
        Quantizer("nvfp4", None, [mxfp4.corrections.build("four_over_six")])


def test_the_deterministic_hadamard_is_the_plain_normalised_hadamard_on_every_operand():
    """signs: none rotates by H itself (no random signs), the same matrix for every layer and seed: Q(b H) H^T
    per block, against an independent float64 rotation and plain MXFP4."""
    recipe = Recipe.named("mxfp4+dht")
    c = recipe.build_corrections()[0]
    h = hadamard_matrix(32)
    assert torch.equal(c.rotation(Operand("grad", "weight_grad", "a"), 32, "cpu"), h)
    c.bind(10, seed=123)
    assert torch.equal(c.rotation(Operand("grad", "weight_grad", "b"), 32, "cpu"), h)
    assert c.rotation(Operand("grad", "input_grad", "b"), 32, "cpu") is None
    assert torch.allclose(h @ h.T, torch.eye(32, dtype=torch.float64), atol=1e-12)
    dy = torch.randn(8, 64)
    op = Operand("grad", "weight_grad", "layer")
    rotated = (dy.double().view(8, 2, 32) @ h).float().view(8, 64)
    want = (mxfp4.fake_quantize(rotated).double().view(8, 2, 32) @ h.T).float().view(8, 64)
    assert torch.equal(recipe.quantizer([c])(dy, -1, operand=op), want)
    random = Recipe.named("mxfp4+rht-sr").build_corrections()[0]
    assert not torch.equal(random.rotation(op, 32, "cpu"), h)


@pytest.mark.parametrize("rule", ["ceil", "even", "rceil"])
def test_torchaos_scale_rules_are_recipes_of_their_own(rule):
    x = torch.randn(16, 128) * 3
    assert Recipe.named(f"mxfp4-{rule}").quantizer().scale_rule == rule
    assert torch.equal(Recipe.named(f"mxfp4-{rule}").quantizer()(x, -1), mxfp4.fake_quantize(x, scale_rule=rule))

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
from mxfp4.corrections.hadamard import hadamard_matrix, stable_seed
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


def oracle_two_d(w: np.ndarray, rule: str = "floor", tile: int = 32) -> np.ndarray:
    """2D scales with numpy and ml_dtypes only: per tile of 32 rows by 32 columns of a [rows, cols] weight, the
    rule's E8M0 scale of the tile's largest magnitude, every element rounded to E2M1 under it (saturating)."""
    w = np.asarray(w, dtype=np.float32)
    rows, cols = w.shape
    pr, pc = -rows % tile, -cols % tile
    t = np.pad(w, ((0, pr), (0, pc))).reshape((rows + pr) // tile, tile, (cols + pc) // tile, tile).astype(np.float64)
    amax = np.abs(t).max(axis=(1, 3))
    scale = np.ldexp(1.0, _e8m0_exponent(amax, 2, 1, 6.0, rule))[:, None, :, None]
    y = np.clip(t / scale, -6.0, 6.0).astype(np.float32).astype(ml_dtypes.float4_e2m1fn).astype(np.float64) * scale
    return y.reshape(rows + pr, cols + pc)[:rows, :cols].astype(np.float32)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 80), cols=st.integers(1, 100), log_scale=st.integers(-20, 20), seed=st.integers(0, 2**16),
       rule=st.sampled_from(["floor", "ceil", "even", "rceil"]))
def test_two_d_scales_equal_their_definition_and_a_weight_quantizes_as_its_transpose(rows, cols, log_scale, seed,
                                                                                       rule):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * 2.0 ** log_scale
    q = Quantizer("mxfp4", rule, [mxfp4.corrections.build("two_d_scales")])
    forward = q(w, -1, operand=Operand("weight", "forward"))
    np.testing.assert_array_equal(forward.numpy(), oracle_two_d(w.numpy(), rule))
    assert torch.equal(q(w, 0, operand=Operand("weight", "input_grad")), forward)  # the transpose's tiles
    assert torch.equal(q(w.T.contiguous(), -1, operand=Operand("weight", "input_grad")).T, forward)
    activation = q(w, -1, operand=Operand("activation", "forward"))  # other roles keep the 1 x 32 blocks
    assert torch.equal(activation, mxfp4.fake_quantize(w, scale_rule=rule))


@pytest.mark.parametrize("case", sorted(adversarial_rows()))
def test_two_d_scales_on_every_adversarial_row(case):
    x = adversarial_rows()[case]
    finite = torch.isfinite(x).all(-1)
    x = x[finite] if finite.any() else torch.zeros(1, x.shape[1])
    q = Quantizer("mxfp4", None, [mxfp4.corrections.build("two_d_scales")])
    np.testing.assert_array_equal(q(x, -1, operand=Operand("weight", "forward")).numpy(), oracle_two_d(x.numpy()))


def test_two_d_scales_answer_whether_they_tile_an_operand_and_a_wrong_answer_is_named():
    c = mxfp4.corrections.build({"name": "two_d_scales", "roles": ["weight", "grad"]})
    assert c.quantizes_blocks_of(Operand("grad", "weight_grad")) and not c.quantizes_blocks_of(
        Operand("activation", "forward"))
    with pytest.raises(ValueError, match="two_d_scales roles"):
        mxfp4.corrections.build({"name": "two_d_scales", "roles": ["bias"]})

    class Says(type(c)):
        def quantizes_blocks_of(self, operand):
            return "yes"

    with pytest.raises(mxfp4.corrections.HookError, match="quantizes_blocks_of hook: returned str; expected a bool"):
        Quantizer("mxfp4", None, [Says()])(torch.randn(4, 32), -1, operand=Operand("weight", "forward"))


def oracle_eden(blocks: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """MS-EDEN's dequantized blocks with numpy and ml_dtypes only, from Quartet II's reference quantizer (E8M0):
    scale 2^floor(log2 amax) / 3, elements to nearest E2M1, the scale times sum(y^2) / sum(y q) rounded to a power
    of two up where ``uniform`` is below the fraction it lies above the lower one."""
    x = np.asarray(blocks, dtype=np.float64)
    amax = np.abs(x).max(-1)
    pow2 = np.where(amax > 0, 2.0 ** np.floor(np.log2(np.where(amax > 0, amax, 1.0))), 1.0)
    y = x * (3.0 / pow2)[..., None]
    q = y.astype(np.float32).astype(ml_dtypes.float4_e2m1fn).astype(np.float64)  # y is exact in float32 here
    num, den = (y * y).sum(-1), (y * q).sum(-1)
    v = pow2 * np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)
    low = 2.0 ** np.floor(np.log2(v))
    scale = np.where(uniform < v / low - 1.0, 2 * low, low) / 3.0
    return q * scale[..., None]


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 6), blocks=st.integers(1, 4), log_scale=st.integers(-20, 20), seed=st.integers(0, 2**16))
def test_ms_eden_equals_its_definition(rows, blocks, log_scale, seed):
    from mxfp4.corrections.ms_eden import eden_scales

    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, blocks, 32, generator=g) * 2.0 ** log_scale).to(torch.bfloat16).float()
    uniform = torch.rand(rows, blocks, generator=g, dtype=torch.float64)
    grid, scale = eden_scales(x, mxfp4.get_format("mxfp4").element, uniform)
    want = oracle_eden(x.numpy(), uniform.numpy())
    np.testing.assert_allclose((grid * scale.unsqueeze(-1)).numpy(), want, rtol=1e-15, atol=0)


def test_ms_eden_rotates_the_backward_gemms_and_its_projection_is_unbiased():
    """On a backward GEMM's operand: Q(x R) R^T with R the hadamard correction's matrix for that GEMM and MS-EDEN's
    blocks (the draws of its first call); the forward GEMM's operands plain MXFP4; over many calls the quantized
    block's inner product with the block averages to the block's squared norm (EDEN's unbiased projection)."""
    recipe = Recipe.named("mxfp4+ms-eden")
    c = recipe.build_corrections()[0]
    c.bind(10, seed=7)
    q = recipe.quantizer([c])
    x = torch.randn(8, 64)
    op = Operand("grad", "weight_grad", "layer")
    r = c.rotation(op, 32, "cpu")
    rotated = (x.double().view(8, 2, 32) @ r).float()
    uniform = torch.rand((8, 2), generator=torch.Generator().manual_seed(stable_seed(7, "ms_eden", 0)),
                         dtype=torch.float64)
    want = (torch.from_numpy(oracle_eden(rotated.numpy(), uniform.numpy())).float().double() @ r.T).float()
    assert torch.equal(q(x, -1, operand=op), want.view(8, 64))
    assert torch.equal(q(x, -1, operand=Operand("activation", "forward", "layer")), mxfp4.fake_quantize(x))
    state = c.state_dict()
    again = recipe.build_corrections()[0]
    again.bind(10, seed=7)
    again.load_state_dict(state)  # a resumed cell draws what the uninterrupted one would
    assert torch.equal(recipe.quantizer([again])(x, -1, operand=op), q(x, -1, operand=op))
    n, acc = 1500, torch.zeros(8, 2, dtype=torch.float64)
    for _ in range(n):
        acc += (q(x, -1, operand=op).double().view(8, 2, 32) * x.double().view(8, 2, 32)).sum(-1)
    ratio = acc / n / (x.double().view(8, 2, 32) ** 2).sum(-1)
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=0.02)  # unbiased, each block's sd of the mean ~0.006


def test_two_d_scales_tile_each_expert_of_a_grouped_weight_apart():
    """A grouped experts' weight [E, out, in]: each expert tiled as the 2D weight it is (no tile spans two)."""
    w = torch.randn(3, 40, 70)
    q = Quantizer("mxfp4", None, [mxfp4.corrections.build("two_d_scales")])
    out = q(w, -1, operand=Operand("weight", "forward"))
    for e in range(3):
        np.testing.assert_array_equal(out[e].numpy(), oracle_two_d(w[e].numpy()))
    assert torch.equal(q(w, 1, operand=Operand("weight", "input_grad")), out)

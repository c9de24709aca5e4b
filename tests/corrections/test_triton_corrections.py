"""Macro-block scaling and outlier fallback inside one Triton kernel (under the interpreter here; the same
source compiles for CUDA): the values and layout of the torch path on the reference backend (the block path,
the torch split: an independent computation) bit for bit, over shapes, axes, strides, dtypes, scale rules,
group sizes and the adversarial rows."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxfp4.corrections import AdaptiveQuantizationNoise, MacroBlockScaling, OutlierFallback
from mxfp4.numerics import dispatch
from mxfp4.numerics.formats import SCALE_RULES_E8M0
from mxfp4.numerics.quantizer import Quantizer
from mxfp4.verify.adversarial import adversarial_rows
from mxfp4.verify.kernel_checks import same
from operands import correction_operand


def _strides(t: torch.Tensor) -> list:
    return [s for n, s in zip(t.shape, t.stride()) if n > 1]


def _quantizer(kind: str, rule: str = "floor", blocks: int = 4):
    def make():
        macro = MacroBlockScaling(blocks=blocks)
        return Quantizer("mxfp4", rule, {"macro": [macro], "fallback": [OutlierFallback(k=1)],
                                         "both": [OutlierFallback(k=1), macro],
                                         "all": [OutlierFallback(k=1), macro, AdaptiveQuantizationNoise()]}[kind])
    return make


def _fused(make, x, axis):
    """(result, quantizer, whether each call of the fused kernel gave its result) of a fresh quantizer from
    ``make`` on the Triton backend."""
    quantizer, launched = make(), []
    real = dispatch.fake_quantize_corrected

    def counting(*args):
        out = real(*args)
        launched.append(out is not None)
        return out

    dispatch.fake_quantize_corrected = counting
    try:
        with dispatch.use_backend("triton"):
            return quantizer(x, axis), quantizer, launched
    finally:
        dispatch.fake_quantize_corrected = real


def _check(make, x, axis):
    """The fused Triton result against the reference backend's values and layout (computed on CPU, its float64
    sums sequential there); returns the quantizers (fused, reference) and the fused kernel's calls."""
    got, fused, launched = _fused(make, x, axis)
    ref = make()
    with dispatch.use_backend("reference"):
        want = ref(x.cpu(), axis)
    assert same(got.cpu(), want), (tuple(x.shape), x.dtype, axis)
    assert got.dtype == want.dtype and _strides(got) == _strides(want), (tuple(x.shape), x.dtype, axis)
    return fused, ref, launched


@pytest.mark.slow
@settings(max_examples=30, deadline=None)  # the interpreter runs each group's column loop in Python
@given(shape=st.lists(st.sampled_from([1, 2, 3, 31, 32, 33, 70, 130]), min_size=1, max_size=3), data=st.data(),
       kind=st.sampled_from(["macro", "fallback", "both", "all"]), rule=st.sampled_from(SCALE_RULES_E8M0),
       blocks=st.sampled_from([1, 2, 4, 8]), log_scale=st.integers(-130, 120), spread=st.integers(0, 12),
       ties=st.booleans(), bf16=st.booleans(), transposed=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_the_triton_corrections_equal_the_torch_path(shape, data, kind, rule, blocks, log_scale, spread, ties, bf16,
                                                     transposed, seed):
    g = torch.Generator().manual_seed(seed)
    x = correction_operand(g, shape, log_scale, spread, ties).to(torch.bfloat16 if bf16 else torch.float32)
    if transposed and x.dim() >= 2:
        x = x.transpose(0, -1)
    axis = data.draw(st.integers(-x.dim(), x.dim() - 1))
    fused, ref, launched = _check(_quantizer(kind, rule, blocks), x, axis)
    assert fused.cost() == ref.cost()  # the fallback counts the same elements kept
    finite = bool(torch.isfinite(x.float()).all())
    assert launched == [finite]  # the kernel ran (bfloat16 macro-block inputs are widened to float32 first)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["macro", "fallback", "both"])
@pytest.mark.parametrize("rule", ["floor", "rceil"])
def test_every_adversarial_row_equals_the_torch_path(kind, rule):
    """Ties, saturation, subnormals, huge values, zeros, NaN and infinities (the kernel's flag hands a tensor with
    a non-finite element back to the torch path), along either axis; the scale rules' exponents are the plain
    kernels' (checked there for every rule), so the default and the dividing one."""
    for name, x in adversarial_rows().items():
        for axis in (-1, 0):
            try:
                _check(_quantizer(kind, rule=rule), x, axis)
            except AssertionError as err:
                raise AssertionError(f"{name}, axis {axis}") from err


def test_a_near_tie_is_decided_by_the_sequential_sums():
    """Groups whose two candidates' error energies differ in the last bits of a float64 sum: the choice is the
    sequential sum's (``MacroBlockScaling._best``), which a tree reduction could reverse."""
    g = torch.Generator().manual_seed(5)
    base = torch.randn(64, 128, generator=g)
    scales = 2.0 ** torch.randint(-40, 40, (64, 128), generator=g).float()
    _check(_quantizer("macro"), base * scales, -1)
    _check(_quantizer("both"), base * scales, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["macro", "fallback", "both"])
def test_the_compiled_kernel_equals_the_torch_path(kind):
    """Compiled for CUDA: the real shapes of a dense layer's operands (a weight along either axis, activations
    and gradients along their rows and along the token axis), random shapes, the adversarial rows, bfloat16
    where the values allow it; against the reference backend on CPU (its float64 sums sequential there)."""
    g = torch.Generator().manual_seed(11)
    shapes = [((2048, 11008), 0, 2, False, -1), ((2048, 2048), -20, 4, True, 0), ((512, 2048), 3, 0, False, -1),
              ((512, 2048), 3, 8, False, 0), ((7, 33, 70), -100, 12, True, 1), ((130, 31), 100, 3, True, -1)]
    cases = [(correction_operand(g, shape, *drawn), axis) for shape, *drawn, axis in shapes]
    cases += [(x, axis) for x in adversarial_rows().values() for axis in (-1, 0)]
    if kind == "fallback":
        cases += [(x.to(torch.bfloat16), axis) for x, axis in cases[:4]]
    for x, axis in cases:
        _, _, launched = _check(_quantizer(kind), x.cuda(), axis)
        assert launched == [bool(torch.isfinite(x.float()).all())]

"""Macro-block scaling, outlier fallback and stochastic rounding on the fused CPU kernels: the values and
layouts of the torch path (the reference backend: the block path, the torch split and the reference's
draws, an independent computation), bit for bit, over shapes, axes, strides, dtypes, formats, scale rules
and the adversarial inputs."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxfp4.corrections import MacroBlockScaling, OutlierFallback
from mxfp4.numerics import dispatch, fused_cpu, reference
from mxfp4.numerics.formats import FORMATS, SCALE_RULES_E8M0
from mxfp4.numerics.quantizer import Quantizer
from mxfp4.verify.adversarial import adversarial_rows
from mxfp4.verify.kernel_checks import same
from operands import correction_operand

E8M0_FORMATS = [name for name, f in FORMATS.items() if f.scale == "e8m0"]


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    strides = [(sa, sb) for n, sa, sb in zip(a.shape, a.stride(), b.stride()) if n > 1]
    return same(a, b) and all(sa == sb for sa, sb in strides)


def _both(make, x, axis):
    """(fused backend, reference backend) results of fresh quantizers from ``make``, and the two quantizers."""
    fused, ref = make(), make()
    assert dispatch.backend_for(x) == "fused"
    got = fused(x, axis)
    with dispatch.use_backend("reference"):
        want = ref(x, axis)
    return got, want, fused, ref


def _quantizer(kind: str, fmt: str = "mxfp4", rule: str = "floor", blocks: int = 4):
    macro = MacroBlockScaling(blocks=blocks)
    return lambda: Quantizer(fmt, rule, {"macro": [macro], "fallback": [OutlierFallback(k=1)],
                                         "both": [OutlierFallback(k=1), macro]}[kind])


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(shape=st.lists(st.sampled_from([1, 2, 3, 31, 32, 33, 64, 70, 130]), min_size=1, max_size=3), data=st.data(),
       kind=st.sampled_from(["macro", "fallback", "both"]), fmt=st.sampled_from(E8M0_FORMATS),
       rule=st.sampled_from(SCALE_RULES_E8M0), blocks=st.sampled_from([1, 2, 4, 8]),
       log_scale=st.integers(-130, 120), spread=st.integers(0, 12), ties=st.booleans(),
       bf16=st.booleans(), transposed=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_the_fused_corrections_equal_the_torch_path(shape, data, kind, fmt, rule, blocks, log_scale, spread, ties,
                                                    bf16, transposed, seed):
    g = torch.Generator().manual_seed(seed)
    x = correction_operand(g, shape, log_scale, spread, ties).to(torch.bfloat16 if bf16 else torch.float32)
    if transposed and x.dim() >= 2:
        x = x.transpose(0, -1)
    axis = data.draw(st.integers(-x.dim(), x.dim() - 1))
    got, want, fused, ref = _both(_quantizer(kind, fmt, rule, blocks), x, axis)
    assert _same_layout(got, want)
    assert fused.cost() == ref.cost()  # the fallback counts the same elements kept


@pytest.mark.parametrize("kind", ["macro", "fallback", "both"])
@pytest.mark.parametrize("rule", SCALE_RULES_E8M0)
def test_every_adversarial_row_equals_the_torch_path(kind, rule):
    """Ties, saturation, subnormals, huge values, zeros, NaN and infinities (the kernels hand a tensor with a
    non-finite element back to the torch path), along either axis."""
    for name, x in adversarial_rows().items():
        for axis in (-1, 0):
            got, want, _, _ = _both(_quantizer(kind, rule=rule), x, axis)
            assert _same_layout(got, want), (name, axis)


def test_the_fused_kernels_run_and_hand_non_finite_tensors_back(monkeypatch):
    """On finite float32 tensors the corrections take their kernels (the one-pass corrected kernel where every
    correction has kernel terms, the per-correction kernels otherwise); a NaN makes each kernel decline (None),
    and the quantizer's result is still the torch path's."""
    x = torch.randn(8, 128)
    macro, fallback = MacroBlockScaling(blocks=4), OutlierFallback(k=1)
    fmt = FORMATS["mxfp4"]
    assert fused_cpu.macro_block(x, fmt, 1, "floor", 4, x.stride()) is not None
    assert fused_cpu.split_max(x, 1, 32, x.stride(), x.stride()) is not None
    assert fused_cpu.corrected(x, fmt, 1, "floor", True, 4, x.stride()) is not None
    x[3, 5] = math.nan
    assert fused_cpu.macro_block(x, fmt, 1, "floor", 4, x.stride()) is None
    assert fused_cpu.split_max(x, 1, 32, x.stride(), x.stride()) is None
    assert fused_cpu.corrected(x, fmt, 1, "floor", True, 4, x.stride()) is None
    calls = {"corrected": [], "macro_block": []}
    for name in calls:
        real = getattr(fused_cpu, name)
        monkeypatch.setattr(fused_cpu, name, lambda *a, real=real, name=name: calls[name].append(a) or real(*a))
    Quantizer(corrections=[fallback, macro])(torch.randn(4, 64), -1)
    assert len(calls["corrected"]) == 1 and not calls["macro_block"]
    Quantizer(corrections=[MacroBlockScaling(blocks=16)])(torch.randn(4, 1024), -1)  # 512 a group: beyond the lanes
    assert len(calls["corrected"]) == 1 and len(calls["macro_block"]) == 1
    assert fallback._fused_split(torch.randn(4, 64), -1) is not None
    with dispatch.use_fused_corrections(False):  # the switch the benchmarks flip: the composition runs
        Quantizer(corrections=[fallback, macro])(torch.randn(4, 64), -1)
    assert len(calls["corrected"]) == 1


def test_a_padding_mask_keeps_the_counted_split_on_the_torch_path():
    """With ``valid`` (grouped experts' zero padding) the fallback counts only real elements, which needs its
    mask: the values are the torch path's and so is the count."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(70, 48, generator=g)
    valid = torch.arange(70).unsqueeze(1) < 50
    x = torch.where(valid, x, torch.zeros_like(x))
    for make in (_quantizer("both"), _quantizer("macro")):
        fused, ref = make(), make()
        got = fused(x, 0, valid)
        with dispatch.use_backend("reference"):
            want = ref(x, 0, valid)
        assert _same_layout(got, want) and fused.cost() == ref.cost()


def test_the_macro_choice_is_never_worse_than_plain_mxfp4_under_its_float64_sequential_sum():
    """Over a wide exponent range, each group's chosen values have an error energy, summed in float64 element
    by element in order by a Python loop (the rule both paths implement), no larger than plain MXFP4's."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(256, 128, generator=g) * 2.0 ** torch.randint(-30, 30, (256, 128), generator=g).float()
    q = Quantizer(corrections=[MacroBlockScaling(blocks=4)])
    got = q(x, -1)
    plain = Quantizer()(x, -1)
    for row in range(0, 256, 17):  # one group of 4 blocks per row
        e_plain = e_got = 0.0
        for a, p, v in zip(*(t[row].tolist() for t in (x, plain, got))):
            e_plain += (p - a) ** 2
            e_got += (v - a) ** 2
        assert e_got <= e_plain  # the chosen candidate is never worse than plain MXFP4 under the rule


@settings(max_examples=80, deadline=None)
@given(shape=st.lists(st.sampled_from([1, 2, 3, 31, 32, 33, 64, 70]), min_size=1, max_size=3), data=st.data(),
       fmt=st.sampled_from(E8M0_FORMATS), rule=st.sampled_from(SCALE_RULES_E8M0), log_scale=st.integers(-130, 120),
       spread=st.integers(0, 12), transposed=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_fused_stochastic_rounding_equals_the_reference_draw_for_draw(shape, data, fmt, rule, log_scale, spread,
                                                                      transposed, seed):
    """The fused kernel takes the reference's uniform draws in the reference's order: the same values and layout,
    and the generator left where the reference leaves it (the next draw equal)."""
    g = torch.Generator().manual_seed(seed)
    x = correction_operand(g, shape, log_scale, spread, ties=False)
    if transposed and x.dim() >= 2:
        x = x.transpose(0, -1)
    axis = data.draw(st.integers(-x.dim(), x.dim() - 1))
    g_fused, g_ref = torch.Generator().manual_seed(seed + 1), torch.Generator().manual_seed(seed + 1)
    got = dispatch.fake_quantize_stochastic(x, fmt, axis, rule, g_fused)
    want = reference.fake_quantize_stochastic(x, fmt, axis, rule, g_ref)
    assert _same_layout(got, want)
    assert torch.rand(1, generator=g_fused).item() == torch.rand(1, generator=g_ref).item()


def test_fused_stochastic_rounding_runs_and_hands_adversarial_rows_back():
    """On a finite float32 tensor the kernel runs; on every adversarial row (NaN and infinities included, which it
    hands back to the reference with the generator restored) the result is the reference's."""
    fmt = FORMATS["mxfp4"]
    assert fused_cpu.stochastic(torch.randn(4, 64), fmt, 1, "floor", torch.Generator().manual_seed(0)) is not None
    for name, x in adversarial_rows().items():
        for axis in (-1, 0):
            got = dispatch.fake_quantize_stochastic(x, "mxfp4", axis, "floor", torch.Generator().manual_seed(5))
            want = reference.fake_quantize_stochastic(x, "mxfp4", axis, "floor", torch.Generator().manual_seed(5))
            assert _same_layout(got, want), (name, axis)


@pytest.mark.parametrize("axis, transposed", [(0, False), (-1, True), (1, False)])
def test_fused_stochastic_rounding_runs_along_any_axis_and_layout(monkeypatch, axis, transposed):
    """A gradient blocked along its first axis, or laid out transposed, is rounded by the kernel (the reference,
    made to fail here, never runs), with the reference's values, layout and draws."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(3, 70, 96, generator=g)
    if transposed:
        x = x.transpose(0, -1)
    want = reference.fake_quantize_stochastic(x, "mxfp4", axis, "floor", torch.Generator().manual_seed(4))

    def refused(*args):
        raise AssertionError("the reference ran")

    monkeypatch.setattr(reference, "fake_quantize_stochastic", refused)
    got = dispatch.fake_quantize_stochastic(x, "mxfp4", axis, "floor", torch.Generator().manual_seed(4))
    assert _same_layout(got, want)


def _sequential_energy(x: list, v: list) -> float:
    e = 0.0
    for a, b in zip(x, v):
        e += (b - a) ** 2  # Python floats: float64, summed in order, as the reference's cumulative sum
    return e


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 1024), seed=st.integers(0, 2**31 - 1), log_range=st.integers(0, 60),
       zero_x=st.booleans(), nudge=st.integers(-2, 2))
def test_the_kernels_energy_rule_is_the_sequential_sums_at_near_ties(n, seed, log_range, zero_x, nudge):
    """The kernels compare the two error energies from partial sums in vector lanes and only near a tie from
    the sequential sums. Near-ties built on purpose (macro's errors a permutation of plain's, spread over 2^±60,
    one of them moved by a few ulps) must still decide as the sequential float64 sums do."""
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(n) if zero_x else torch.randn(n, generator=g)
    err = torch.randn(n, generator=g) * 2.0 ** torch.randint(-log_range, log_range + 1, (n,), generator=g).float()
    plain = x + err
    macro = x + err[torch.randperm(n, generator=g)]
    if nudge:
        i = int(torch.randint(0, n, (1,), generator=g))
        macro[i] = float(torch.nextafter(macro[i], torch.tensor(math.copysign(math.inf, nudge))))
    xs, ps, ms = x.tolist(), plain.tolist(), macro.tolist()
    want = _sequential_energy(xs, ms) < _sequential_energy(xs, ps)
    assert fused_cpu.macro_beats_plain(x, plain, macro) == want
    assert fused_cpu.macro_beats_plain(x, macro, plain) == (_sequential_energy(xs, ps) < _sequential_energy(xs, ms))

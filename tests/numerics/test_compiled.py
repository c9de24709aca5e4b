"""The CPU fast path (torch.compile of the reference) against the eager reference, bit for bit and
layout for layout, and the forward-only GEMM that rollouts and evaluation take."""

import warnings

import pytest
import torch

import mxfp4
from mxfp4.config.recipes import Recipe
from mxfp4.nn import GemmContext, patch_model
from mxfp4.numerics import compiled, dispatch, reference
from mxfp4.numerics.formats import FORMATS
from mxfp4.verify.adversarial import adversarial_rows
from mxfp4.verify.kernel_checks import same

# Each (format, rule, dtype) compiles a graph of its own (about 20 s on 2 cores the first time): the
# formats' cases cover every format once and MXFP4's rules, the exhaustive test MXFP4's default rule.
CASES = [("mxfp4", rule, dtype) for rule in ("floor", "ceil", "even", "rceil") for dtype in (torch.float32,)]
CASES += [("mxfp4", "floor", torch.bfloat16), ("nvfp4", None, torch.float32), ("mxfp8_e4m3", "floor", torch.float32),
          ("mxfp6_e2m3", "floor", torch.float32), ("mxfp6_e3m2", "floor", torch.float32)]


def _compiled_fake_quantize(x, fmt, axis, rule):
    with dispatch.use_backend("compiled"):
        return dispatch.fake_quantize(x, fmt, axis, rule)


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same values bit for bit (NaN payloads and signed zeros included), dtype, shape and strides (of the
    dimensions longer than 1): the strides decide how a later GEMM reads the operand."""
    strides = [(sa, sb) for n, sa, sb in zip(a.shape, a.stride(), b.stride()) if n > 1]
    return same(a, b) and all(sa == sb for sa, sb in strides)


@pytest.mark.parametrize(("fmt", "rule", "dtype"), CASES)
def test_every_adversarial_row_equals_the_reference(fmt, rule, dtype):
    assert {c[0] for c in CASES} == set(FORMATS)
    for name, x in adversarial_rows().items():
        xx = x.to(dtype)
        for axis in (-1, 0):
            want = reference.fake_quantize(xx, fmt, axis, rule)
            assert _same_layout(_compiled_fake_quantize(xx, fmt, axis, rule), want), (name, axis)


def test_three_dimensional_tensors_along_every_axis_and_lengths_that_pad():
    """Expert stacks are 3D and blocked along any axis; a length that is not a multiple of 32 pads."""
    torch.manual_seed(0)
    for shape in ((4, 64, 96), (3, 40, 70), (1, 1, 33)):
        x = torch.randn(shape) * torch.logspace(-3, 3, shape[-1])
        for axis in range(3):
            assert _same_layout(_compiled_fake_quantize(x, "mxfp4", axis, None),
                                reference.fake_quantize(x, "mxfp4", axis)), (shape, axis)
    x = torch.randn(64, 128).t()  # a transposed weight, read in place
    assert _same_layout(_compiled_fake_quantize(x, "mxfp4", -1, None), reference.fake_quantize(x, "mxfp4", -1))


def test_every_bfloat16_value_quantizes_as_the_reference(rule="floor"):
    """All finite bfloat16 values below a block max of 7.9375 (one scale for every block: the whole grid,
    its midpoints and the saturating range) or 5.625 (inexact ideal scales), blocks along either axis:
    the same values. (Along axis 0 of a 32-row tensor the reference's reshape into one block is a view,
    and its output comes back contiguous; the compiled path's is the transposed layout.)"""
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    for anchor in (7.9375, 5.625):
        values = every[every.float().abs() <= anchor]
        values = torch.cat([values, torch.zeros((-len(values)) % 31, dtype=torch.bfloat16)]).reshape(-1, 31)
        x = torch.cat([torch.full((len(values), 1), anchor, dtype=torch.bfloat16), values], dim=1)
        for axis, xx in ((-1, x), (0, x.t().contiguous())):
            for dtype in (torch.bfloat16, torch.float32):
                got = _compiled_fake_quantize(xx.to(dtype), "mxfp4", axis, rule)
                assert same(got, reference.fake_quantize(xx.to(dtype), "mxfp4", axis, rule)), (anchor, axis)


def test_the_dispatch_takes_the_compiled_path_on_cpu_only_when_asked(monkeypatch):
    x = torch.randn(8, 64)
    calls = []
    real = compiled.fake_quantize
    monkeypatch.setattr(compiled, "fake_quantize", lambda *a: calls.append(a) or real(*a))
    assert dispatch.backend_for(x) == "reference" and same(mxfp4.fake_quantize(x), reference.fake_quantize(x))
    assert not calls
    monkeypatch.setenv("MXFP4_BACKEND", "compiled")
    assert dispatch.backend_for(x) == "compiled" and same(mxfp4.fake_quantize(x), reference.fake_quantize(x))
    assert len(calls) == 1


def test_a_machine_that_cannot_compile_gets_the_reference_with_one_warning(monkeypatch):
    def broken(fmt_name, rule):
        def fail(*args):
            raise RuntimeError("no C++ compiler")
        return fail

    monkeypatch.setattr(compiled, "_compiled", broken)
    monkeypatch.setattr(compiled, "_failed", [])
    x = torch.randn(16, 64)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler.*the reference runs instead"):
        first = _compiled_fake_quantize(x, "mxfp4", -1, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        second = _compiled_fake_quantize(x, "mxfp4", 0, None)
    assert _same_layout(first, reference.fake_quantize(x, "mxfp4", -1))
    assert _same_layout(second, reference.fake_quantize(x, "mxfp4", 0))


@pytest.mark.parametrize("recipe", ["mxfp4", "mxfp4+all"])
def test_a_forward_without_autograd_is_the_autograd_forward_and_quantizes_no_backward_operand(recipe, monkeypatch):
    """Rollouts and evaluation run under no_grad: the patched Linear's output equals the training
    forward's bit for bit, and no weight is quantized along the backward GEMM's axis."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(128, 96)
    holder = torch.nn.Module()
    holder.proj = lin
    holder.config = type("C", (), {"tie_word_embeddings": False})()
    corrections = Recipe.named(recipe).build_corrections()
    for c in corrections:
        c.bind(total_steps=10, seed=0)
    patch_model(holder, Recipe.named(recipe).quantizer(corrections), cache_weights=False)
    axes = []
    real = GemmContext.weight
    monkeypatch.setattr(GemmContext, "weight",
                        lambda self, p, axis, on, gemm="forward": axes.append(axis) or real(self, p, axis, on, gemm))
    x = torch.randn(2, 5, 128)
    with torch.no_grad():
        fast = lin(x)
    assert axes == [1]
    trained = lin(x.requires_grad_())
    assert trained.grad_fn is not None and same(fast, trained.detach())

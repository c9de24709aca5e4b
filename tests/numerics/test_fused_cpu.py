"""The CPU fast path (the fused C++ kernel) against the eager reference, bit for bit and layout for
layout, and the forward-only GEMM that rollouts and evaluation take."""

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mxfp4
from mxfp4.config.recipes import Recipe
from mxfp4.nn import GemmContext, patch_model
from mxfp4.numerics import dispatch, fused_cpu, reference
from mxfp4.numerics.formats import FORMATS, SCALE_RULES_E8M0, get_format
from mxfp4.verify.adversarial import adversarial_rows
from mxfp4.verify.kernel_checks import same

E8M0_FORMATS = [name for name, f in FORMATS.items() if f.scale == "e8m0"]
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _fused(x, fmt, axis, rule):
    """Through the dispatch, which must pick the fused kernel (not a fallback)."""
    assert dispatch.backend_for(x, fmt) == "fused"
    return dispatch.fake_quantize(x, fmt, axis, rule)


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same values bit for bit (NaN payloads and signed zeros included), dtype, shape and strides (of the
    dimensions longer than 1): the strides decide how a later GEMM reads the operand."""
    strides = [(sa, sb) for n, sa, sb in zip(a.shape, a.stride(), b.stride()) if n > 1]
    return same(a, b) and all(sa == sb for sa, sb in strides)


@pytest.mark.parametrize("fmt", E8M0_FORMATS)
@pytest.mark.parametrize("rule", SCALE_RULES_E8M0)
def test_every_adversarial_row_equals_the_reference(fmt, rule):
    for dtype in DTYPES:
        for name, x in adversarial_rows().items():
            xx = x.to(dtype)
            for axis in (-1, 0):
                want = reference.fake_quantize(xx, fmt, axis, rule)
                assert _same_layout(_fused(xx, fmt, axis, rule), want), (dtype, name, axis)


def test_three_dimensional_tensors_along_every_axis_and_lengths_that_pad():
    """Expert stacks are 3D and blocked along any axis; a length that is not a multiple of 32 pads."""
    torch.manual_seed(0)
    for shape in ((4, 64, 96), (3, 40, 70), (1, 1, 33), (2, 32, 40)):
        x = torch.randn(shape) * torch.logspace(-3, 3, shape[-1])
        for axis in range(3):
            for dtype in DTYPES:
                xx = x.to(dtype)
                assert _same_layout(_fused(xx, "mxfp4", axis, None), reference.fake_quantize(xx, "mxfp4", axis)), (
                    shape, axis, dtype)
    x = torch.randn(64, 128).t()  # a transposed weight, read in place
    assert _same_layout(_fused(x, "mxfp4", -1, None), reference.fake_quantize(x, "mxfp4", -1))


@pytest.mark.parametrize("rule", SCALE_RULES_E8M0)
def test_every_bfloat16_value_quantizes_as_the_reference(rule):
    """All finite bfloat16 values below a block max of 7.9375 (one scale for every block: the whole grid,
    its midpoints and the saturating range) or 5.625 (inexact ideal scales), blocks along either axis,
    in bfloat16, float16 (where representable) and float32: the same values and layout."""
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    for anchor in (7.9375, 5.625):
        values = every[every.float().abs() <= anchor]
        values = torch.cat([values, torch.zeros((-len(values)) % 31, dtype=torch.bfloat16)]).reshape(-1, 31)
        x = torch.cat([torch.full((len(values), 1), anchor, dtype=torch.bfloat16), values], dim=1)
        for axis, xx in ((-1, x), (0, x.t().contiguous())):
            for dtype in DTYPES:
                got = _fused(xx.to(dtype), "mxfp4", axis, rule)
                assert _same_layout(got, reference.fake_quantize(xx.to(dtype), "mxfp4", axis, rule)), (anchor, axis)


@settings(max_examples=150, deadline=None)
@given(rows=st.integers(1, 70), cols=st.integers(1, 100), log_scale=st.integers(-140, 120),
       spread=st.integers(0, 12), axis=st.sampled_from([0, 1]), fmt=st.sampled_from(E8M0_FORMATS),
       rule=st.sampled_from(SCALE_RULES_E8M0), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       transposed=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_the_fused_kernel_equals_the_reference_on_random_tensors(rows, cols, log_scale, spread, axis, fmt, rule,
                                                                  dtype, transposed, seed):
    """Float32 values over the whole exponent range (each row its own magnitude, elements spread over
    2^spread, subnormals and huge scales included), every E8M0 format and rule, either axis, read in
    place from a transposed view: the reference's values and strides."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.rand(rows, cols, generator=g) ** spread
    x = (x * 2.0 ** (log_scale + torch.randint(-8, 8, (rows, 1), generator=g).float())).to(dtype)
    if transposed:
        x = x.t()
    assert _same_layout(fused_cpu.fake_quantize(x.detach(), get_format(fmt), axis, rule),
                        reference.fake_quantize(x, fmt, axis, rule))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(shape=st.lists(st.sampled_from([1, 2, 3, 31, 32, 33, 64, 70, 96]), min_size=1, max_size=4),
       data=st.data(), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_the_output_strides_are_the_references(shape, data, dtype):
    """The strides the fused path gives its output (a rule where it is known to hold, the reference on
    a meta tensor elsewhere) equal those of the reference's own result on real data."""
    axis = data.draw(st.integers(0, len(shape) - 1))
    x = torch.zeros(shape, dtype=dtype)
    fmt = get_format("mxfp4")
    assert fused_cpu.output_strides(x, axis, fmt, "floor") == reference.fake_quantize(x, fmt, axis).stride()


def test_a_machine_that_cannot_build_the_fused_kernel_gets_the_reference_with_one_warning(monkeypatch):
    def broken():
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(fused_cpu, "_extension", broken)
    monkeypatch.setattr(fused_cpu, "_failed", [])
    x = torch.randn(16, 64)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler.*the reference runs instead"):
        assert dispatch.backend_for(x) == "reference"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        assert _same_layout(mxfp4.fake_quantize(x, axis=0), reference.fake_quantize(x, "mxfp4", 0))


def test_the_dispatch_takes_the_fused_path_on_cpu_for_e8m0_formats_unless_told_otherwise(monkeypatch):
    x = torch.randn(8, 64)
    calls = []
    real = fused_cpu.fake_quantize
    monkeypatch.setattr(fused_cpu, "fake_quantize", lambda *a: calls.append(a) or real(*a))
    assert dispatch.backend_for(x) == "fused" and same(mxfp4.fake_quantize(x), reference.fake_quantize(x))
    assert len(calls) == 1
    assert dispatch.backend_for(x, "nvfp4") == "reference"
    monkeypatch.setenv("MXFP4_BACKEND", "reference")
    assert dispatch.backend_for(x) == "reference" and same(mxfp4.fake_quantize(x), reference.fake_quantize(x))
    assert len(calls) == 1


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
                        lambda self, p, axis, on, gemm="forward", **kw: axes.append(axis) or real(self, p, axis, on,
                                                                                                  gemm, **kw))
    x = torch.randn(2, 5, 128)
    with torch.no_grad():
        fast = lin(x)
    assert axes == [1]
    trained = lin(x.requires_grad_())
    assert trained.grad_fn is not None and same(fast, trained.detach())


def test_a_tensor_subclass_goes_through_the_reference():
    """A tensor without data of its own (a fake tensor under tracing, the memory audit's) is not read by
    the kernel: the reference's torch ops run, which the subclass intercepts."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(64, 96)
        assert dispatch.backend_for(x) == "reference"
        y = mxfp4.fake_quantize(x, axis=0)
    assert tuple(y.shape) == (64, 96) and y.stride() == reference.fake_quantize(torch.zeros(64, 96), axis=0).stride()


def test_the_ninja_pip_installed_is_found_when_none_is_on_path(monkeypatch):
    """``cpp_extension`` runs ``ninja`` by name; a venv that is not activated has its bin folder off PATH."""
    import os
    import shutil

    import ninja

    monkeypatch.setenv("PATH", "/nonexistent")
    assert shutil.which("ninja") is None
    fused_cpu._find_ninja()
    assert os.environ["PATH"].split(os.pathsep)[0] == ninja.BIN_DIR and shutil.which("ninja")


def _components_both_ways(x, fmt, axis, rule, form):
    """``error_components`` through the dispatch (which must take the fused path: counted) and on the eager
    torch path (``MXFP4_BACKEND=reference``)."""
    from mxfp4.numerics.dispatch import error_components

    calls = []
    real = fused_cpu.components
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fused_cpu, "components", lambda *a: calls.append(1) or real(*a))
        got = error_components(x, fmt, axis, rule, dtype=torch.float32, form=form)
    with dispatch.use_backend("reference"):
        want = error_components(x, fmt, axis, rule, dtype=torch.float32, form=form)
    return got, want, len(calls)


@pytest.mark.parametrize("form", ["canonical", "gain"])
@pytest.mark.parametrize("rule", SCALE_RULES_E8M0)
def test_the_fused_components_equal_the_torch_paths_on_every_adversarial_row(form, rule):
    """Ties of the stored and the ideal grid, saturation, subnormals, huge values, zero blocks, either axis:
    each component and the quantized tensor, values (signed zeros included) and strides; a row with a NaN or
    an infinity goes back to the torch path."""
    for name, x in adversarial_rows().items():
        for axis in (-1, 0):
            finite = bool(torch.isfinite(x).all())
            got, want, fused = _components_both_ways(x, "mxfp4", axis, rule, form)
            assert fused == 1, (name, axis)
            for key in want:
                assert _same_layout(got[key], want[key]) or (not finite and same(got[key], want[key])), (
                    name, axis, key)


@settings(max_examples=120, deadline=None)
@given(shape=st.lists(st.integers(1, 80), min_size=1, max_size=3), data=st.data(), log_scale=st.integers(-130, 120),
       spread=st.integers(0, 12), fmt=st.sampled_from(E8M0_FORMATS), rule=st.sampled_from(SCALE_RULES_E8M0),
       form=st.sampled_from(["canonical", "gain"]), transposed=st.booleans(), zero_rows=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_the_fused_components_equal_the_torch_paths_on_random_tensors(shape, data, log_scale, spread, fmt, rule, form,
                                                                      transposed, zero_rows, seed):
    """Any shape and blocked axis (lengths that pad, blocks across a non-last axis, a transposed view read as
    given), magnitudes over the whole float32 range, every E8M0 format and rule, both forms: the components and
    the quantized tensor equal the eager torch path's bit for bit and in layout (the gain form's sums are
    taken by torch on the torch path's layout, so in its order)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.rand(shape, generator=g) ** spread * 2.0 ** log_scale
    if zero_rows:
        x[..., ::3] = 0.0
    if transposed and x.dim() >= 2:
        x = x.transpose(0, -1)
    axis = data.draw(st.integers(0, x.dim() - 1))
    got, want, fused = _components_both_ways(x, fmt, axis, rule, form)
    assert fused == 1
    for key in want:
        assert _same_layout(got[key], want[key]), key


@pytest.mark.slow
def test_a_build_killed_midway_leaves_no_lock_that_stops_the_next_one(tmp_path):
    """SIGKILL to a process while it builds the kernel (in a fresh extensions folder) leaves torch's lock file
    behind, which torch alone would wait on forever; the next build removes it, says so in one line, and loads."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    code = "from mxfp4.numerics import fused_cpu; print(fused_cpu.available())"
    first = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    try:
        while not list(tmp_path.glob("*/lock")):
            assert first.poll() is None and time.time() < deadline, "the build ended before its lock was seen"
            time.sleep(0.05)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert list(tmp_path.glob("*/lock")), "the killed build left torch's lock"
    again = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert again.stdout.strip() == "True", again.stderr[-2000:]
    assert "removed the lock a killed build of the fused CPU kernel left" in again.stderr
    assert not list(tmp_path.glob("*/lock"))

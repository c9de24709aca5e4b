"""Triton kernels under TRITON_INTERPRET=1 (set by conftest on CPU): bit-exact with the reference."""

import pytest
import torch

import mxfp4
from mxfp4.numerics import kernel_checks
from mxfp4.numerics import reference
from mxfp4.numerics.adversarial import adversarial_rows

RESULTS = list(kernel_checks.check_cases("cuda" if torch.cuda.is_available() else "cpu"))


@pytest.mark.parametrize("kernel", kernel_checks.KERNELS)
def test_kernel_is_bit_exact_with_reference_on_every_case(kernel):
    mine = [r for r in RESULTS if r["kernel"] == kernel]
    assert len(mine) == (len(adversarial_rows()) + 1) * 3 * 4 * 2  # cases x dtypes x rules x axes
    failed = [r for r in mine if not r["passed"]]
    assert not failed, failed[:5]


def test_matmul_on_mxfp4_operands_matches_exact_products():
    results = kernel_checks.check_matmul("cuda" if torch.cuda.is_available() else "cpu")
    for name, r in results.items():
        assert r["passed"], (name, r)


def test_same_tells_negative_zero_and_nan_apart():
    assert kernel_checks.same(torch.tensor([float("nan"), 1.0]), torch.tensor([float("nan"), 1.0]))
    assert not kernel_checks.same(torch.tensor([-0.0]), torch.tensor([0.0]))
    assert not kernel_checks.same(torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.bfloat16))


def test_dispatch_uses_triton_when_asked_and_reference_by_default():
    x = adversarial_rows()["ties"]
    assert mxfp4.numerics.dispatch.backend_for(x) == "reference"
    with mxfp4.use_backend("triton"):
        assert mxfp4.numerics.dispatch.backend_for(x) == "triton"
        assert mxfp4.numerics.dispatch.backend_for(x, "nvfp4") == "reference"
        q = mxfp4.quantize(x)
        y, stats = mxfp4.fake_quantize_with_stats(x)
    ref_y, ref_stats = mxfp4.fake_quantize_with_stats(x)
    assert torch.equal(q.codes, reference.quantize(x).codes)
    assert torch.equal(y, ref_y)
    assert stats["deadzone_count"] == ref_stats["deadzone_count"]


def test_unknown_backend_is_an_error_naming_the_accepted_ones():
    with pytest.raises(ValueError, match="accepted: auto, reference, compiled, triton"):
        with mxfp4.use_backend("cuda"):
            pass


@pytest.mark.gpu
def test_cuda_tensors_dispatch_to_triton():
    x = torch.randn(256, 256, device="cuda")
    assert mxfp4.numerics.dispatch.backend_for(x) == "triton"
    assert torch.equal(mxfp4.fake_quantize(x).cpu(), reference.fake_quantize(x.cpu()))

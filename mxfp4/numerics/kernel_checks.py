"""Kernel unit checks: every Triton kernel against the reference, bit for bit, over the adversarial
cases, both blocking axes, a ragged last block and every input dtype. Used by the pytest suite
(under TRITON_INTERPRET=1 on CPU) and by ``kernels/check_kernels.py`` (the Snakemake ``kernels``
target, on the GPU when there is one)."""

from __future__ import annotations

import itertools

import torch

from . import reference
from .adversarial import adversarial_rows
from .formats import SCALE_RULES_E8M0

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
KERNELS = ("quantize", "dequantize", "fake_quantize", "fake_quantize_with_stats")


_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (so -0 != +0), with every NaN equal to every NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return bool(torch.equal(a, b))
    a_nan, b_nan = a.isnan(), b.isnan()
    if not torch.equal(a_nan, b_nan):
        return False
    view = _INT_VIEW[a.element_size()]
    a = torch.where(a_nan, torch.zeros_like(a), a).contiguous().view(view)
    b = torch.where(b_nan, torch.zeros_like(b), b).contiguous().view(view)
    return bool(torch.equal(a, b))


def check_one(kernel: str, x: torch.Tensor, axis: int, rule: str) -> tuple[bool, str]:
    from . import triton_kernels as tk

    ref_q = reference.quantize(x.cpu(), "mxfp4", axis, rule)
    if kernel == "quantize":
        q = tk.quantize(x, axis, rule)
        ok = torch.equal(q.codes.cpu(), ref_q.codes) and torch.equal(q.scales.cpu(), ref_q.scales)
        return ok, "" if ok else f"{int((q.codes.cpu() != ref_q.codes).sum())} code bytes differ"
    ref_fake = reference.dequantize(ref_q)
    if kernel == "dequantize":
        out = tk.dequantize(ref_q.to(x.device)).cpu()
    elif kernel == "fake_quantize":
        out = tk.fake_quantize(x, axis, rule).cpu()
    else:
        if not torch.isfinite(x).all():
            return True, "skipped: statistics need finite input"
        out, stats = tk.fake_quantize_with_stats(x, axis, rule)
        out = out.cpu()
        from .decompose import decompose

        ref = decompose(x.cpu(), "mxfp4", axis, rule)
        exact = stats["deadzone_count"] == int(ref.dead.sum()) and stats["saturation_count"] == int(ref.saturated.sum())
        close = all(
            abs(stats[k] - ref.stats[k]) <= 1e-9 * max(abs(ref.stats[k]), ref.stats["energy_total"], 1e-300)
            for k in ("energy_scale", "energy_dead", "energy_grid", "energy_total")
        )
        if not (exact and close):
            return False, f"stats differ: kernel {stats} reference {ref.stats}"
    ok = same(out, ref_fake)
    return ok, "" if ok else f"{int((out != ref_fake).sum())} values differ"


def check_cases(device: str = "cpu", k: int = 96):
    """Yield one result dict per (kernel, case, dtype, rule, axis)."""
    cases = adversarial_rows(k)
    cases["ragged_3d"] = torch.randn(3, 5, 45, generator=torch.Generator().manual_seed(5))
    for (name, x), dtype, rule, kernel in itertools.product(cases.items(), DTYPES, SCALE_RULES_E8M0, KERNELS):
        x_dev = x.to(device=device, dtype=dtype)
        for axis in ((-1, 0) if x.dim() == 2 else (-1, 1)):
            ok, detail = check_one(kernel, x_dev, axis, rule)
            yield {"kernel": kernel, "case": name, "dtype": str(dtype).removeprefix("torch."), "scale_rule": rule, "axis": axis, "passed": ok, "detail": detail}


def check_matmul(device: str = "cpu", m: int = 48, n: int = 40, k: int = 200, seed: int = 0) -> dict:
    """mx_matmul against float64 products of the dequantized operands (the products are exact;
    only the float32 accumulation order differs), for MXFP4 and bf16 activations."""
    from . import triton_kernels as tk

    g = torch.Generator().manual_seed(seed)
    a, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    qa, qw = reference.quantize(a), reference.quantize(w)
    wq = reference.dequantize(qw).double()
    results = {}
    for name, lhs, lhs_exact in (
        ("mxfp4_x_mxfp4", qa.to(device), reference.dequantize(qa).double()),
        ("bf16_x_mxfp4", a.bfloat16().to(device), a.bfloat16().double()),
    ):
        c = tk.mx_matmul(lhs, qw.to(device)).cpu().double()
        exact = lhs_exact @ wq.T
        bound = (lhs_exact.abs() @ wq.abs().T) * k * torch.finfo(torch.float32).eps
        worst = float(((c - exact).abs() / bound.clamp(min=1e-30)).max())
        results[name] = {"passed": worst <= 1.0, "max_error_over_bound": worst, "shape": [m, n, k]}
    return results

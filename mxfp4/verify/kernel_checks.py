"""Kernel unit checks: every Triton kernel against the reference, bit for bit, over the adversarial
cases, both blocking axes, a ragged last block and every input dtype. Used by the pytest suite
(under TRITON_INTERPRET=1 on CPU) and by ``kernels/check_kernels.py`` (the Snakemake ``kernels``
target, on the GPU when there is one)."""

from __future__ import annotations

import itertools

import torch

from ..numerics import reference
from ..numerics.formats import FORMATS, SCALE_RULES_E8M0
from ..numerics.reference import from_blocks, quantize_blocks, to_blocks
from .adversarial import adversarial_rows

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
KERNELS = ("quantize", "dequantize", "fake_quantize", "fake_quantize_with_stats", "fake_quantize_both")
ENERGY_RTOL = 1e-5  # the stats kernel works in float32; the reference in float64
ENERGY_KEYS = ("energy_scale", "energy_dead", "energy_grid", "energy_total")


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
    from ..numerics import triton_kernels as tk

    ref_q = reference.quantize(x.cpu(), "mxfp4", axis, rule)
    if kernel == "quantize":
        q = tk.quantize(x, axis, rule)
        ok = torch.equal(q.codes.cpu(), ref_q.codes) and torch.equal(q.scales.cpu(), ref_q.scales)
        return ok, "" if ok else f"{int((q.codes.cpu() != ref_q.codes).sum())} code bytes differ"
    ref_fake = reference.dequantize(ref_q)
    if kernel == "fake_quantize_both":
        if x.dim() != 2:
            return True, "skipped: 2D tensors only"
        along = tk.fake_quantize_both(x, rule)[0 if axis in (-1, 1) else 1].cpu()
        ok = same(along, ref_fake)
        return ok, "" if ok else f"{int((along != ref_fake).sum())} values differ"
    if kernel == "dequantize":
        out = tk.dequantize(ref_q.to(x.device)).cpu()
    elif kernel == "fake_quantize":
        out = tk.fake_quantize(x, axis, rule).cpu()
    else:
        if not torch.isfinite(x).all():
            return True, "skipped: statistics need finite input"
        out, stats = tk.fake_quantize_with_stats(x, axis, rule)
        out = out.cpu()
        stats = {k: float(v) for k, v in stats.items()}
        from ..numerics.decompose import decompose

        ref = decompose(x.cpu(), "mxfp4", axis, rule)
        exact = stats["deadzone_count"] == int(ref.dead.sum()) and stats["saturation_count"] == int(ref.saturated.sum())
        close = all(
            abs(stats[k] - ref.stats[k]) <= ENERGY_RTOL * max(abs(ref.stats[k]), ref.stats["energy_total"])
            for k in ENERGY_KEYS
        )
        if not (exact and close):
            return False, f"stats differ: kernel {stats} reference {ref.stats}"
    ok = same(out, ref_fake)
    return ok, "" if ok else f"{int((out != ref_fake).sum())} values differ"


AXES = {2: (-1, 0), 3: (-1, 1, 0)}


def kernel_cases(k: int = 96) -> dict[str, torch.Tensor]:
    """The inputs every kernel is checked on: the adversarial rows, two 3D tensors and a transposed view."""
    cases = adversarial_rows(k)
    cases["ragged_3d"] = torch.randn(3, 5, 45, generator=torch.Generator().manual_seed(5))
    cases["experts_3d"] = torch.randn(40, 3, 64, generator=torch.Generator().manual_seed(6))  # blocked along 0 too
    cases["transposed"] = torch.randn(64, 72, generator=torch.Generator().manual_seed(7)).t()  # read without a copy
    return cases


def check_cases(device: str = "cpu", k: int = 96, kernels=KERNELS, dtypes=DTYPES):
    """Yield one result dict per (kernel, case, dtype, rule, axis)."""
    cases = kernel_cases(k)
    for (name, x), dtype, rule, kernel in itertools.product(cases.items(), dtypes, SCALE_RULES_E8M0, kernels):
        x_dev = x.to(device=device, dtype=dtype)
        if name == "transposed":
            x_dev = x_dev.t().contiguous().t()
        for axis in AXES[x.dim()]:
            ok, detail = check_one(kernel, x_dev, axis, rule)
            yield {
                "kernel": kernel,
                "case": name,
                "dtype": str(dtype).removeprefix("torch."),
                "scale_rule": rule,
                "axis": axis,
                "passed": ok,
                "detail": detail,
            }


def _error_over_bound(c: torch.Tensor, lhs: torch.Tensor, rhs: torch.Tensor, half_ulp: float = 0.0) -> float:
    """max |c - exact| / (K eps_fp32 sum|a||b|): <= 1 for any order of float32 accumulation of
    exact products (a bfloat16 or MXFP4 value times an MXFP4 value is exact in float32). ``half_ulp``:
    the relative half ulp of an output rounded once more after the float32 sum (2**-8 for bfloat16),
    added to the bound."""
    exact = lhs @ rhs.T
    bound = (lhs.abs() @ rhs.abs().T) * lhs.shape[1] * torch.finfo(torch.float32).eps
    bound = bound * (1 + half_ulp) + half_ulp * exact.abs()
    return float(((c.double() - exact).abs() / bound.clamp(min=1e-30)).max())


def _mx_matmul_error(lhs, lhs_exact: torch.Tensor, qw, w_exact: torch.Tensor, device: str) -> float:
    """``mx_matmul(lhs, qw)`` on ``device`` (``lhs`` already there) over the bound: <= 1 passes."""
    from ..numerics import triton_gemm as tg

    return _error_over_bound(tg.mx_matmul(lhs, qw.to(device)).cpu(), lhs_exact, w_exact)


def _w4a16_error(x: torch.Tensor, packed, deq: torch.Tensor, out_dtype: torch.dtype, device: str):
    """``w4a16_matmul`` of the bfloat16 ``x`` by ``packed`` (whose bfloat16 values are ``deq``) in
    ``out_dtype`` on ``device``: (passed, error over the bound), the bound plus half a bfloat16 ulp (at
    most 2**-8 relative) for a bfloat16 output."""
    from ..numerics import triton_gemm as tg

    c = tg.w4a16_matmul(x.to(device), packed, out_dtype).cpu()
    worst = _error_over_bound(c, x.double(), deq, 2.0**-8 if out_dtype == torch.bfloat16 else 0.0)
    return c.dtype == out_dtype and worst <= 1.0, worst


def check_matmul(device: str = "cpu", m: int = 48, n: int = 40, k: int = 200, seed: int = 0) -> dict:
    """The GEMMs against float64 products of the dequantized operands (the products are exact;
    only the float32 accumulation order differs): ``mx_matmul`` for MXFP4 and bf16 activations,
    ``w4a16_matmul`` at a decode and a prefill M, for weights on the bit-built upcast path and
    for weights with extreme scales (the exact float32 decode path)."""
    from ..numerics import triton_gemm as tg

    g = torch.Generator().manual_seed(seed)
    a, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    qa, qw = reference.quantize(a), reference.quantize(w)
    wq = reference.dequantize(qw).double()
    results = {}
    for name, lhs, lhs_exact in (
        ("mxfp4_x_mxfp4", qa.to(device), reference.dequantize(qa).double()),
        ("bf16_x_mxfp4", a.bfloat16().to(device), a.bfloat16().double()),
    ):
        worst = _mx_matmul_error(lhs, lhs_exact, qw, wq, device)
        results[name] = {"passed": worst <= 1.0, "max_error_over_bound": worst, "shape": [m, n, k]}
    extreme = (
        w * torch.logspace(-44, 30, n, dtype=torch.float64).float()[:, None]
    )  # scale bytes 0 .. 227: float32 decode
    tiny = (
        w * torch.logspace(-38, 0, n, dtype=torch.float64).float()[:, None]
    )  # scale bytes 0 .. 127: bfloat16 subnormals
    for wname, weight in (("w4a16", w), ("w4a16_extreme_scales", extreme), ("w4a16_tiny_scales", tiny)):
        qt = reference.quantize(weight)
        packed = tg.pack_weight(qt.to(device))
        deq = reference.dequantize(qt, torch.bfloat16).double()  # the bf16 values the kernel upcasts to
        for rows in (3, 64, 96):  # decode (the fused kernel, split K) and above (dequantize + BLAS)
            x = torch.randn(rows, k, generator=g).bfloat16()
            passed, worst = _w4a16_error(x, packed, deq, torch.float32, device)
            results[f"{wname}_m{rows}"] = {
                "passed": passed,
                "max_error_over_bound": worst,
                "shape": [rows, n, k],
                "fast_upcast": packed.fast_upcast,
            }
    # the whole-K path needs DIRECT_MIN_TILES weight tiles (tests/numerics/test_kernels.py forces it on CPU)
    if device != "cpu":
        results.update(_check_w4a16_direct(device, k, g))
    return results


def _check_w4a16_direct(device: str, k: int, g: torch.Generator) -> dict:
    """``w4a16_matmul`` on the whole-K path at the smallest N that takes it, float32 output against
    the bound and bfloat16 output against it plus half a bfloat16 ulp (at most 2**-8 relative)."""
    from ..numerics import triton_gemm as tg

    n = tg.DIRECT_MIN_TILES * 64
    qt = reference.quantize(torch.randn(n, k, generator=g))
    packed = tg.pack_weight(qt.to(device))
    deq = reference.dequantize(qt, torch.bfloat16).double()
    x = torch.randn(16, k, generator=g).bfloat16()
    results = {}
    for out_dtype in (torch.float32, torch.bfloat16):
        passed, worst = _w4a16_error(x, packed, deq, out_dtype, device)
        results[f"w4a16_direct_{str(out_dtype).removeprefix('torch.')}"] = {
            "passed": passed,
            "max_error_over_bound": worst,
            "shape": [16, n, k],
        }
    return results


def corrected_oracle(x: torch.Tensor, axis: int, split: bool, blocks: int) -> torch.Tensor:
    """Outlier fallback (``split``) and/or macro-block scaling over ``blocks`` blocks of an MXFP4 x, from the
    reference's block path in torch ops on CPU: each block's first largest magnitude kept in bfloat16, the rest
    quantized plain or with the group's BF16 mantissa m (m . Q(x / m)), whichever errs less in a float64 sum
    taken element by element in the group's order (plain on ties). The values ``triton_kernels.corrected`` must
    give (the quantizer's hooks compute them in ``mxfp4.corrections``, a layer above this one)."""
    fmt = FORMATS["mxfp4"]
    ax = axis % x.dim()
    b = to_blocks(x.cpu().float(), ax, 32)  # [..., nb, 32]
    keep = torch.zeros_like(b, dtype=torch.bool)
    if split:
        keep.scatter_(-1, b.abs().argmax(-1, keepdim=True), True)
    rest = torch.where(keep, torch.zeros_like(b), b)
    q, _, scale = quantize_blocks(rest, fmt, "floor")
    out = q * scale.unsqueeze(-1)
    if blocks:
        nb = rest.shape[-2]
        g = torch.nn.functional.pad(rest, (0, 0, 0, -nb % blocks)).unflatten(-2, (-1, blocks))  # [..., G, n, 32]
        ratio = (g.abs().amax((-2, -1)) / fmt.element.max_value).clamp(min=torch.finfo(torch.float32).tiny)
        mant = torch.frexp(ratio).mantissa * 2
        down = mant.to(torch.bfloat16).float()
        up = torch.nextafter(down.to(torch.bfloat16), torch.tensor(float("inf"), dtype=torch.bfloat16)).float()
        m = torch.where(down >= mant, down, up)[..., None, None]
        qm, _, sm = quantize_blocks(g / m, fmt, "floor")
        macro = qm * (sm * m[..., 0])[..., None]
        plain = torch.nn.functional.pad(out, (0, 0, 0, -nb % blocks)).unflatten(-2, (-1, blocks))
        energy = [(v.double() - g.double()).pow(2).flatten(-2).cumsum(-1)[..., -1] for v in (plain, macro)]
        out = torch.where((energy[1] < energy[0])[..., None, None], macro, plain).flatten(-3, -2)[..., :nb, :]
    out = torch.where(keep, b.to(torch.bfloat16).float(), out)
    return from_blocks(out, x.shape, ax).to(x.dtype)


def checks_per_autotune_space(device: str = "cpu", seed: int = 0) -> list[tuple[str, object, list]]:
    """(name, autotuner, checks) per autotune space of ``triton_gemm.autotune_spaces``: each check a (what,
    thunk) whose thunk calls the public wrapper at a shape that launches that space and returns (passed,
    detail). bfloat16 inputs (training's dtype), ragged last blocks, tile-unaligned extents."""
    from ..numerics import triton_gemm as tg

    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(40, 1000, generator=g).bfloat16().to(device)  # 31 blocks + 8 along K
    cols = torch.randn(3, 70, 100, generator=g).bfloat16().to(device)  # blocked along R = 70, C = 100

    def memory(x, axis, kernels):
        return [(f"{k} axis {axis}", lambda k=k, a=axis: check_one(k, x, a, "floor")) for k in kernels]

    quantizing = ("quantize", "fake_quantize", "fake_quantize_with_stats")
    checks = {
        "quantize rows": memory(rows, -1, quantizing),
        "quantize columns": memory(cols, 1, quantizing),
        "fake-quant both axes": memory(cols[0], -1, ["fake_quantize_both"])
        + memory(cols[0], 0, ["fake_quantize_both"]),
        "dequantize rows": memory(rows, -1, ["dequantize"]),
        "dequantize columns": memory(cols, 1, ["dequantize"]),
    }
    from ..numerics import triton_kernels as tk  # here: importing it decides compiled or interpreted

    def corrections(x, axis, split, blocks):
        got = tk.corrected(x, axis, "floor", split, blocks, tk.output_strides(x, axis))
        if got is None:
            return False, "the kernel gave no result (its flag said a non-finite element)"
        return same(got.cpu(), corrected_oracle(x, axis, split, blocks)), "values against corrected_oracle"

    # small: the interpreter runs each group's column loop in Python (9 blocks + 12 along K; 38 rows along axis 0)
    wide = (torch.randn(4, 300, generator=g) * 2.0 ** torch.randint(-8, 8, (4, 300), generator=g)).to(device)
    tall = (torch.randn(38, 5, generator=g) * 2.0 ** torch.randint(-8, 8, (38, 5), generator=g)).to(device)
    checks["outlier fallback"] = [("bf16, axis -1", lambda: corrections(rows, -1, True, 0)),
                                  ("float32, axis 0", lambda: corrections(tall, 0, True, 0))]
    checks["macro-block groups"] = [("macro 4, axis -1", lambda: corrections(wide, -1, False, 4)),
                                    ("fallback + macro 2, axis 0", lambda: corrections(tall, 0, True, 2))]
    k = 200  # a ragged last chunk of 128 and a ragged last block
    a, w = torch.randn(48, k, generator=g), torch.randn(40, k, generator=g)
    qa, qw = reference.quantize(a), reference.quantize(w)
    exact_w = reference.dequantize(qw).double()

    def gemm(lhs, lhs_exact):
        worst = _mx_matmul_error(lhs, lhs_exact, qw, exact_w, device)
        return worst <= 1.0, f"max error over bound {worst:.3g}"

    checks["tl.dot_scaled GEMM"] = [
        ("mxfp4 x mxfp4", lambda: gemm(qa.to(device), reference.dequantize(qa).double())),
        ("bf16 x mxfp4", lambda: gemm(a.bfloat16().to(device), a.bfloat16().double())),
    ]
    # W4A16 decode: the split-K spaces at a small N, the whole-K ones at the least N that takes them
    for direct, n in ((False, 40), (True, tg.DIRECT_MIN_TILES * 64)):
        qt = reference.quantize(torch.randn(n, k, generator=g))
        packed, deq = tg.pack_weight(qt.to(device)), reference.dequantize(qt, torch.bfloat16).double()
        for bm, m in ((16, 3), (32, 20), (64, 50)):
            x = torch.randn(m, k, generator=g).bfloat16()

            def decode(out_dtype, x=x, packed=packed, deq=deq):
                passed, worst = _w4a16_error(x, packed, deq, out_dtype, device)
                return passed, f"max error over bound {worst:.3g}"

            outputs = (torch.float32, torch.bfloat16) if direct else (torch.float32,)  # split K adds float32
            checks[tg.w4a16_space_name(direct, bm)] = [
                (f"M {m}, {str(o).removeprefix('torch.')} out", lambda o=o, d=decode: d(o)) for o in outputs
            ]
    spaces = tg.autotune_spaces()
    if set(checks) != set(spaces):  # a space added without checks would go unchecked on the device
        raise RuntimeError(f"autotune spaces without checks: {sorted(set(spaces) - set(checks))}; "
                           f"checks without a space: {sorted(set(checks) - set(spaces))}")
    return [(name, tuned, checks[name]) for name, tuned in spaces.items()]


def check_every_config(device: str = "cpu", seed: int = 0, pick=None):
    """Yield one result per (autotune space, config, check): each config of each space forced
    (``triton_kernels.forced_config``) and checked against the reference as the other checks are
    (memory kernels bit for bit, GEMMs within the float32 accumulation bound). On CUDA the autotuner
    may pick any config of a space at a shape; the other checks run only the first one (MXFP4_AUTOTUNE=0)
    or, under the interpreter, the interpreter's own tiles. A check that launches no kernel of its
    space fails (it would check nothing); one that raises fails with the error, and the rest still run.
    A config this device cannot run (out of shared memory or registers, refused by the compiler) is
    skipped, not failed: Triton's autotuner skips it for the same errors, so it is never picked. ``pick``: the
    (space, config index) pairs to check (default every one)."""
    from triton.compiler.errors import CompileTimeAssertionFailure
    from triton.runtime.errors import OutOfResources, PTXASError

    from ..numerics import triton_kernels as tk

    for space, tuned, checks in checks_per_autotune_space(device, seed):
        for index, config in enumerate(tuned.configs):
            if pick is not None and (space, index) not in pick:
                continue
            row = {"space": space, "config": {**config.kwargs, "num_warps": config.num_warps,
                                              "num_stages": config.num_stages}}
            for what, check in checks:
                skipped = False
                with tk.forced_config(tuned, config) as forced:
                    try:
                        ok, detail = check()
                    except (OutOfResources, CompileTimeAssertionFailure, PTXASError) as err:
                        ok, skipped = True, True
                        detail = f"not runnable here, so never picked by the autotuner: {type(err).__name__}: {err}"
                    except Exception as err:  # a fault of one config, recorded: the other configs still run
                        ok, detail = False, f"{type(err).__name__}: {err}"
                if not forced.launches:
                    ok, detail = False, f"the check launched no kernel of this space ({detail})"
                yield {**row, "check": what, "passed": ok, "skipped": skipped, "detail": detail}


def summary(report: dict) -> str:
    """One line for a ``kernels/check_kernels.py`` report: the checks passed of those run, the GEMMs'
    verdict (where they ran), the configs this device could not run, and whether it was cut off."""
    matmul = report["matmul"]
    said = "" if not matmul else ", matmul " + ("ok" if all(m["passed"] for m in matmul.values()) else "FAILED")
    skipped = f", {report['n_skipped']} not runnable here (never picked)" if report.get("n_skipped") else ""
    cut = "" if report["complete"] else ", cut off before the end"
    return f"{report['n_checks'] - report['n_failed']}/{report['n_checks']} checks{said}{skipped}{cut}"

"""Microbenchmark of the MXFP4 paths, side by side with their peers in the same run; writes JSON.

On CUDA: the Triton kernels (quantize, fake-quant, fake-quant with fused decomposition stats,
dequantize) against the device's own device-to-device copy bandwidth (measured here, same sizes),
torchao's MX cast of the same tensor, and torch.compile of the reference.
On CPU: the eager reference and its torch.compile against torchao's ``to_mx`` (+ dequantize),
and the CPU's copy bandwidth.

    python kernels/bench_kernels.py --out results/bench/bench_cpu.json
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

import torch
from tqdm import tqdm

import mxfp4
from mxfp4.numerics import reference
from mxfp4.io import write_json_atomic


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def timer(device: str, fn, reps: int) -> float:
    """Seconds per call: triton's do_bench on CUDA (L2 flushed), best of ``reps`` on CPU."""
    if device == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=100) / 1e3
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def torchao_paths():
    """torchao's MX cast and its dequantize, or None when torchao is missing."""
    try:
        from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
    except ImportError:
        return None
    elem = torch.float4_e2m1fn_x2

    def cast(x):
        return to_mx(x, elem, 32)

    def round_trip(x):
        scale, data = to_mx(x, elem, 32)
        return to_dtype(data, scale, elem, 32, x.dtype)

    return cast, round_trip


def bench(device: str, shapes: list[tuple[int, int]], reps: int) -> dict:
    dtype = torch.bfloat16
    ao = torchao_paths()
    compiled = torch.compile(reference.fake_quantize, dynamic=False)
    rows = []
    for shape in shapes:
        x = torch.randn(shape, device=device, dtype=dtype)
        n = x.numel()
        in_bytes = n * x.element_size()
        packed_bytes = n // 2 + n // 32
        dst = torch.empty_like(x)  # preallocated: time the copy, not the allocation
        copy_s = timer(device, lambda: dst.copy_(x), reps)
        copy_gbps = 2 * in_bytes / copy_s / 1e9
        paths = {}
        if device == "cuda":
            from mxfp4.numerics import triton_kernels as tk

            q = tk.quantize(x)
            paths["triton quantize"] = (lambda: tk.quantize(x), in_bytes + packed_bytes)
            paths["triton fake_quantize"] = (lambda: tk.fake_quantize(x), 2 * in_bytes)
            paths["triton fake_quantize_with_stats"] = (lambda: tk.fake_quantize_with_stats(x), 2 * in_bytes)
            paths["triton dequantize"] = (lambda: tk.dequantize(q), packed_bytes + in_bytes)
        else:
            paths["reference quantize"] = (lambda: reference.quantize(x), in_bytes + packed_bytes)
            paths["reference fake_quantize"] = (lambda: reference.fake_quantize(x), 2 * in_bytes)
        paths["torch.compile(reference) fake_quantize"] = (lambda: compiled(x), 2 * in_bytes)
        if ao is not None:
            paths["torchao to_mx"] = (lambda: ao[0](x), in_bytes + packed_bytes)
            paths["torchao to_mx + dequantize"] = (lambda: ao[1](x), 2 * in_bytes)
        for name, (fn, moved) in tqdm(paths.items(), desc=f"bench {shape[0]}x{shape[1]}", unit="path", file=sys.stderr):
            s = timer(device, fn, reps)
            rows.append(
                {
                    "path": name,
                    "shape": list(shape),
                    "dtype": "bfloat16",
                    "MiB": in_bytes / 2**20,
                    "seconds": s,
                    "bytes_moved": moved,
                    "GBps": moved / s / 1e9,
                    "fraction_of_copy_bandwidth": moved / s / 1e9 / copy_gbps,
                    "copy_GBps": copy_gbps,
                }
            )
    return {"rows": rows, "ratios": ratios(rows)}


def ratios(rows: list[dict]) -> dict:
    """Speed-ups against torchao in the same run, per shape (time of torchao / time of ours)."""
    out = {}
    by = {(r["path"], tuple(r["shape"])): r["seconds"] for r in rows}
    for shape in {tuple(r["shape"]) for r in rows}:
        key = "x".join(map(str, shape))
        peer_rt = by.get(("torchao to_mx + dequantize", shape))
        peer_cast = by.get(("torchao to_mx", shape))
        for ours, peer, label in (
            ("torch.compile(reference) fake_quantize", peer_rt, "compiled_fake_vs_torchao_roundtrip"),
            ("reference fake_quantize", peer_rt, "reference_fake_vs_torchao_roundtrip"),
            ("reference quantize", peer_cast, "reference_quantize_vs_torchao_to_mx"),
            ("triton fake_quantize", peer_rt, "triton_fake_vs_torchao_roundtrip"),
            ("triton quantize", peer_cast, "triton_quantize_vs_torchao_to_mx"),
        ):
            if peer and (ours, shape) in by:
                out[f"{label}@{key}"] = peer / by[(ours, shape)]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--shapes", default=None, help="e.g. 4096x4096,8192x8192 (defaults by device)")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    elif args.device == "cuda":  # 64 MiB and up, as the speed targets are stated
        shapes = [(8192, 4096), (16384, 8192), (32768, 8192)]
    else:
        shapes = [(1024, 4096), (4096, 4096)]
    torch.manual_seed(0)
    report = {
        "device": device_name(args.device),
        "device_type": args.device,
        "versions": {"torch": torch.__version__, "mxfp4": getattr(mxfp4, "__version__", "0.1.0")},
        "command": " ".join(["python", "kernels/bench_kernels.py", *(argv or sys.argv[1:])]),
    }
    for mod in ("triton", "torchao"):
        try:
            report["versions"][mod] = __import__(mod).__version__
        except ImportError:
            report["versions"][mod] = None
    report.update(bench(args.device, shapes, args.reps))
    write_json_atomic(args.out, report)
    for k, v in report["ratios"].items():
        print(f"{k}: {v:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

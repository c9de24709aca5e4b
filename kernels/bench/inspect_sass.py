"""Static report of the memory-bound kernels compiled for Hopper (sm_90a) on a machine without a GPU.

Every kernel is launched through its real host wrapper on CPU tensors of the benchmark's shapes with
the launch intercepted: the wrapper's own arguments are specialised as Triton specialises them at a
CUDA launch (16-divisible integers and pointers, integers equal to 1 as constants) and compiled with
``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` under every config of the kernel's autotune
space. From the cubin (Triton's bundled ``cuobjdump``) it reports per config:

- registers, local memory (spills) and shared memory;
- SASS instructions per element: the static count times the threads of a program over the elements
  of a program (the memory kernels are straight-line code, so this is also the dynamic count);
- the widths of the global loads and stores (``LDG.E.128`` is 16 bytes a thread), the warp shuffles
  and the shared-memory traffic that layout conversions cost;
- ``convert_layout`` operations left in the TTGIR.

and for the W4A16 decode GEMM (``--gemm``), per config of its autotune space at the Qwen2.5-3B and
Qwen3-30B-A3B decode shapes: the instructions of the main loop's body per weight element, the MMA
instructions (``HGMMA``: wgmma; ``HMMA``: mma.sync), the bfloat16 pair multiplies (``HMUL2``) and which
global loads are asynchronous copies (``LDGSTS``, pipelined) and which are plain loads in the loop.

It is a compiler's report, not a measurement: it says where instructions go, not how fast a kernel
runs. The device budget it informs: an H100's 132 SMs x 4 schedulers x 32 lanes at about 1.755 GHz
issue about 29.6 T lane instructions a second, so at about 3.0 TB/s a kernel can spend about 9.7
instructions per byte it moves and stay memory-bound: 24.8 per bfloat16 element of a quantize (2.56
bytes), 38.8 of a fake-quant (4 bytes). Measured fractions of copy bandwidth follow this budget over the
counts (docs/kernels.md).

    python kernels/bench/inspect_sass.py --out results/bench/sass_sm90.json
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU target, never interpret

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import BaseBackend, GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import native_specialize_impl  # noqa: E402

import mxfp4  # noqa: E402
from mxfp4.io import write_json_atomic  # noqa: E402
from mxfp4.numerics import reference  # noqa: E402
from mxfp4.numerics import triton_gemm as tg  # noqa: E402
from mxfp4.numerics import triton_kernels as tk  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
ISSUE_BUDGET = 24.8  # lane instructions per bf16 element of a quantize (2.56 bytes) at full issue rate and 3 TB/s


def specialise(fn, args: tuple, constexprs: dict):
    """(signature, constexprs, attrs) as a CUDA launch of ``fn`` with these arguments would build them."""
    names = fn.arg_names
    signature, consts, attrs = {}, {}, {}
    for i, (name, value) in enumerate(zip(names, args)):
        kind, attr = native_specialize_impl(BaseBackend, value, False, True, True)
        signature[name] = kind
        if kind == "constexpr":
            consts[name] = attr
        elif attr:
            attrs[(i,)] = BaseBackend.parse_attr(attr)
    for name, value in constexprs.items():
        signature[name] = "constexpr"
        consts[name] = value
    missing = [n for n in names if n not in signature]
    if missing:
        raise ValueError(f"{fn.__name__}: no value for {missing}")
    return signature, consts, attrs


def compile_hopper(fn, args: tuple, constexprs: dict, num_warps: int, num_stages: int = 3):
    signature, consts, attrs = specialise(fn, args, constexprs)
    src = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=HOPPER, options={"num_warps": num_warps, "num_stages": num_stages})


def _tool(name: str, *argv: str, data: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(data)
        f.flush()
        return subprocess.run([str(TOOLS / name), *argv, f.name], check=True, capture_output=True, text=True).stdout


SASS_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
SASS_ADDRESSED = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")


def loop_body(sass: str) -> Counter:
    """Opcode counts of the largest loop (from a backward branch's target to the branch)."""
    lines = [(int(m.group(1), 16), m.group(2).strip()) for m in SASS_ADDRESSED.finditer(sass)]
    best: Counter = Counter()
    for addr, ins in lines:
        target = re.search(r"BRA\s.*0x([0-9a-f]+)", ins)
        if target and int(target.group(1), 16) < addr:
            body = [i for a, i in lines if int(target.group(1), 16) <= a <= addr]
            ops = Counter((i.split()[1] if i.startswith("@") else i.split()[0]).split(".")[0] for i in body)
            if sum(ops.values()) > sum(best.values()):
                best = ops
    return best


def sass_profile(cubin: bytes, sass: str | None = None) -> dict:
    """Opcode counts of the cubin's SASS (``sass``: its disassembly, when already made) and its
    resource usage."""
    sass = _tool("cuobjdump", "-sass", data=cubin) if sass is None else sass
    ops = [m.group(2) for m in SASS_LINE.finditer(sass)]
    ops = [op for op in ops if op not in ("NOP", "BRA", "EXIT")]  # padding and the tail loop
    res = _tool("cuobjdump", "-res-usage", data=cubin)
    usage = {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", res)}
    base = Counter(op.split(".")[0] for op in ops)
    return {
        "instructions": len(ops),
        "registers": usage.get("REG"),
        "shared_bytes_static": usage.get("SHARED", 0),
        "global_loads": dict(Counter(op for op in ops if op.startswith("LDG"))),
        "global_stores": dict(Counter(op for op in ops if op.startswith("STG"))),
        "shuffles": base["SHFL"],
        "shared_loads": base["LDS"],
        "shared_stores": base["STS"],
        "barriers": base["BAR"],
        "spill_ops": base["LDL"] + base["STL"],
        "top_opcodes": dict(base.most_common(12)),
    }


@contextlib.contextmanager
def intercepted_launches():
    """Record (kernel, tuned, grid_of, args, constexprs) of every ``launch_tuned`` that the host
    wrappers (``triton_kernels``, ``triton_gemm``) make, instead of launching."""
    calls = []
    saved = tk.launch_tuned, tg.launch_tuned

    def record(kernel, tuned, grid_of, interp_meta, args, **constexprs):
        calls.append((kernel, tuned, grid_of, args, constexprs))

    tk.launch_tuned = tg.launch_tuned = record
    try:
        yield calls
    finally:
        tk.launch_tuned, tg.launch_tuned = saved


def cases(shape: tuple, dtype: torch.dtype):
    """(name, thunk) per host path, each thunk calling the real wrapper on CPU tensors."""
    x = torch.empty(shape, dtype=dtype)
    x2 = x if x.dim() == 2 else x[0]
    qt = mxfp4.quantize(torch.zeros(shape, dtype=dtype), axis=-1)  # reference layout, for dequantize
    qt0 = mxfp4.quantize(torch.zeros(shape, dtype=dtype), axis=0)
    return [
        ("quantize rows", lambda: tk.quantize(x, axis=-1)),
        ("fake-quant rows", lambda: tk.fake_quantize(x, axis=-1)),
        ("quantize axis 0", lambda: tk.quantize(x, axis=0)),
        ("fake-quant axis 0", lambda: tk.fake_quantize(x, axis=0)),
        ("fake-quant + stats rows", lambda: tk.fake_quantize_with_stats(x, axis=-1)),
        ("fake-quant + stats axis 0", lambda: tk.fake_quantize_with_stats(x, axis=0)),
        ("dequantize rows", lambda: tk.dequantize(qt)),
        ("dequantize axis 0", lambda: tk.dequantize(qt0)),
        ("fake-quant both axes", lambda: tk.fake_quantize_both(x2)),
    ]


def report_case(name: str, thunk, elements: int) -> list[dict]:
    with intercepted_launches() as calls:
        thunk()
    if len(calls) != 1:
        raise RuntimeError(f"{name}: expected one kernel launch, intercepted {len(calls)}")
    kernel, tuned, grid_of, args, constexprs = calls[0]
    rows = []
    for cfg in tuned.configs:
        meta = dict(cfg.kwargs)
        compiled = compile_hopper(kernel, args, {**constexprs, **meta}, cfg.num_warps, cfg.num_stages)
        prof = sass_profile(compiled.asm["cubin"])
        programs = math.prod(grid_of(meta))
        per_program = elements / programs
        threads = 32 * cfg.num_warps
        rows.append({
            "path": name,
            "kernel": kernel.__name__,
            "config": {**meta, "num_warps": cfg.num_warps},
            "programs": programs,
            "elements_per_thread": per_program / threads,
            "instructions_per_element": prof["instructions"] * threads / per_program,
            "convert_layouts": compiled.asm["ttgir"].count("ttg.convert_layout"),
            **prof,
        })
    return rows


DECODE_SHAPES = {  # name: (N, K, M)
    "Qwen2.5-3B gate_proj, M = 16": (11008, 2048, 16),
    "Qwen2.5-3B q_proj, M = 16": (2048, 2048, 16),
    "Qwen2.5-3B down_proj, M = 64": (2048, 11008, 64),
    "Qwen3-30B-A3B expert gate_proj, M = 16": (768, 2048, 16),
}


def report_gemm(name: str, n: int, k: int, m: int) -> list[dict]:
    """The W4A16 decode kernel's configs at one shape, launched through ``w4a16_matmul`` on CPU
    tensors with the launch intercepted (as on CUDA: this script runs with the interpreter off)."""
    w = tg.pack_weight(reference.quantize(torch.randn(n, k)))
    with intercepted_launches() as calls:
        tg.w4a16_matmul(torch.randn(m, k).bfloat16(), w)
    kernel, tuned, grid_of, args, constexprs = calls[0]
    space = "direct" if any(tuned is t for t in tg._w4a16_direct.values()) else "split-K"
    rows = []
    for cfg in tuned.configs:
        compiled = compile_hopper(kernel, args, {**constexprs, **cfg.kwargs}, cfg.num_warps, cfg.num_stages)
        sass = _tool("cuobjdump", "-sass", data=compiled.asm["cubin"])
        prof, body = sass_profile(compiled.asm["cubin"], sass), loop_body(sass)
        per_thread = cfg.kwargs["BLOCK_N"] * 128 * cfg.kwargs["CHUNKS"] / (32 * cfg.num_warps)
        rows.append(
            {
                "path": f"w4a16 decode: {name}",
                "kernel": kernel.__name__,
                "space": space,
                "config": {k: cfg.kwargs[k] for k in ("BLOCK_N", "CHUNKS", "SPLIT_K")}
                | {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages},
                "programs": math.prod(grid_of(cfg.kwargs)),
                "loop_instructions_per_weight_element": sum(body.values()) / per_thread,
                "loop_mma": {"HGMMA": body["HGMMA"], "HMMA": body["HMMA"]},
                "loop_bf16x2_multiplies": body["HMUL2"],
                "loop_plain_global_loads": body["LDG"],
                "async_copies": sum(v for op, v in prof["global_loads"].items() if op.startswith("LDGSTS")),
                "registers": prof["registers"],
                "spill_ops": prof["spill_ops"],
                "convert_layouts": compiled.asm["ttgir"].count("ttg.convert_layout"),
            }
        )
        print(
            f"{rows[-1]['path']:50s} {space:8s} {str(rows[-1]['config']):90s} loop instr/weight "
            f"{rows[-1]['loop_instructions_per_weight_element']:5.2f} plain LDG {body['LDG']}",
            flush=True,
        )
    return rows


def every_launch(shape: tuple = (256, 1024)):
    """(name, thunk) for every variant the host wrappers launch: each input dtype, scale rule and
    layout of the memory kernels (rows, axis 0, a 3D middle axis), their float32 and bfloat16 outputs, the
    corrections kernel's split and macro-block variants (its axis-0 operands are copied to rows first),
    the W4A16 decode spaces (split-K and whole-K at BLOCK_M 16, 32, 64) and both operand formats of
    the ``tl.dot_scaled`` GEMM."""
    thunks = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x, x3 = torch.empty(shape, dtype=dtype), torch.empty((4, 64, 96), dtype=dtype)
        for rule in tk.RULE_IDS:
            for axis, xx in ((-1, x), (0, x), (1, x3)):
                thunks += [
                    (f"quantize {dtype} {rule} axis {axis}", lambda xx=xx, a=axis, r=rule: tk.quantize(xx, a, r)),
                    (f"fake-quant {dtype} {rule} axis {axis}",
                     lambda xx=xx, a=axis, r=rule: tk.fake_quantize(xx, a, r)),
                    (f"fake-quant + stats {dtype} {rule} axis {axis}",
                     lambda xx=xx, a=axis, r=rule: tk.fake_quantize_with_stats(xx, a, r)),
                ]
            thunks.append((f"fake-quant both axes {dtype} {rule}", lambda x=x, r=rule: tk.fake_quantize_both(x, r)))
        for out in (torch.bfloat16, torch.float32):
            thunks.append((f"fake-quant {dtype} to {out}", lambda x=x, o=out: tk.fake_quantize(x, -1, dtype=o)))
        for axis in (-1, 0):
            qt = mxfp4.quantize(torch.zeros(shape, dtype=dtype), axis=axis)
            thunks.append((f"dequantize {dtype} axis {axis}", lambda qt=qt: tk.dequantize(qt)))
    corrections = {torch.bfloat16: [(True, 0)], torch.float32: [(True, 0), (False, 4), (True, 4), (True, 8)]}
    for dtype, variants in corrections.items():
        x = torch.empty(shape, dtype=dtype)
        for rule in tk.RULE_IDS:
            for split, blocks in variants:
                thunks.append((f"corrections {dtype} {rule} split {split} macro {blocks}",
                               lambda x=x, r=rule, s=split, b=blocks: tk.corrected(x, -1, r, s, b, x.stride())))
    weight = reference.quantize(torch.randn(tg.DIRECT_MIN_TILES * 64, 1024))
    for n in (512, tg.DIRECT_MIN_TILES * 64):  # split-K, whole-K
        packed = tg.pack_weight(reference.quantize(torch.randn(n, 1024)))
        for m in (1, 16, 32, 64):
            x = torch.randn(m, 1024).bfloat16()
            thunks.append((f"w4a16 N {n} M {m}", lambda p=packed, x=x: tg.w4a16_matmul(x, p)))
    a = reference.quantize(torch.randn(64, 1024))
    thunks += [("tl.dot_scaled mxfp4 x mxfp4", lambda: tg.mx_matmul(a, weight)),
               ("tl.dot_scaled bf16 x mxfp4", lambda: tg.mx_matmul(torch.randn(64, 1024), weight))]
    return thunks


def compile_every_variant(only: list[str] | None = None) -> dict:
    """Every launch of ``every_launch`` compiled for sm_90a under each config of its autotune space
    (``only``: launches whose name contains one of these): a compile error of the device's Triton found
    at no device time. Each distinct (kernel, specialisation, config) compiled once."""
    seen, failures = set(), []
    for name, thunk in every_launch():
        if only and not any(o in name for o in only):
            continue
        with intercepted_launches() as calls:
            thunk()
        for kernel, tuned, _, args, constexprs in calls:
            for cfg in tuned.configs:
                consts = {**constexprs, **cfg.kwargs}
                key = (kernel.__name__, repr(specialise(kernel, args, consts)), cfg.num_warps, cfg.num_stages)
                if key in seen:
                    continue
                seen.add(key)
                try:
                    compile_hopper(kernel, args, consts, cfg.num_warps, cfg.num_stages)
                except Exception as err:  # every failure listed, not only the first
                    failures.append({"launch": name, "kernel": kernel.__name__, "config": str(cfg),
                                     "error": f"{type(err).__name__}: {str(err)[:500]}"})
                    print(f"FAILED {name} {cfg}: {type(err).__name__}", flush=True)
        print(f"{name}: {len(seen)} compiled, {len(failures)} failed", flush=True)
    return {"compiled": len(seen), "failed": len(failures), "failures": failures}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shape", default="16384x8192", help="memory kernels' shape, e.g. 16384x8192 or 128x768x2048")
    p.add_argument("--only", action="append", help="paths whose name contains this (repeatable)")
    p.add_argument("--first-config", action="store_true", help="only each autotune space's first config")
    p.add_argument("--no-gemm", action="store_true", help="skip the W4A16 decode kernel")
    p.add_argument(
        "--compile-all",
        action="store_true",
        help="instead: compile every launch variant (dtypes, rules, layouts, GEMM spaces) under every config "
        "(--first-config: the first) and report what failed",
    )
    args = p.parse_args(argv)
    if args.first_config:  # both modes: every autotune space cut to its first config
        for t in tg.autotune_spaces().values():
            t.configs = t.configs[:1]
    if args.compile_all:
        report = compile_every_variant(args.only)
        write_json_atomic(args.out, {
            "method": "static: triton.compile for sm_90a on CPU (no device); compiles, not runs",
            "triton": triton.__version__, "torch": torch.__version__, **report,
            "configs": "first of each space" if args.first_config else "every config of each space",
        })
        print(f"{report['compiled']} compiled for sm_90a, {report['failed']} failed -> {args.out}")
        return 1 if report["failed"] else 0
    shape = tuple(int(s) for s in args.shape.split("x"))
    elements = math.prod(shape)
    rows = []
    for name, thunk in cases(shape, torch.bfloat16):
        if args.only and not any(o in name for o in args.only):
            continue
        n = elements if name != "fake-quant both axes" or len(shape) == 2 else shape[-2] * shape[-1]
        for row in report_case(name, thunk, n):
            rows.append(row)
            print(
                f"{name:28s} {str(row['config']):60s} instr/elem {row['instructions_per_element']:6.1f} "
                f"regs {row['registers']:3d} spills {row['spill_ops']:3d} shfl {row['shuffles']:4d} "
                f"ldg {row['global_loads']} stg {row['global_stores']} cvt {row['convert_layouts']}",
                flush=True,
            )
    gemm = [] if args.no_gemm else [r for name, (n, k, m) in DECODE_SHAPES.items() for r in report_gemm(name, n, k, m)]
    write_json_atomic(
        args.out,
        {
            "method": "static: triton.compile for sm_90a on CPU (no device), cuobjdump of the cubin; memory kernels: "
            "instructions per element = static SASS count x threads per program / elements per program "
            "(straight-line kernels); W4A16: the largest loop's SASS count over the weight elements a thread "
            "upcasts per iteration. Not a measurement of speed.",
            "triton": triton.__version__,
            "torch": torch.__version__,
            "shape": list(shape),
            "dtype": "bfloat16",
            "issue_budget_per_element": ISSUE_BUDGET,
            "rows": rows,
            "w4a16_decode": gemm,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

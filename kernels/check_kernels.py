"""Kernel unit checks: every Triton kernel bit-exact against the reference; writes a JSON report.

On a machine without CUDA the kernels run under TRITON_INTERPRET=1 (set here, before triton loads).
``--every-config``: instead, each config of every autotune space forced in turn and checked (on CUDA the
autotuner may pick any of them; the default checks run each space's first config there).

    python kernels/check_kernels.py --out results/embedded/kernels/checks.json
    python kernels/check_kernels.py --every-config --out checks_configs.json
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from tqdm import tqdm

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from mxfp4.io import write_json_atomic  # noqa: E402
from mxfp4.verify import kernel_checks  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--kernel", action="append", choices=kernel_checks.KERNELS, help="only these kernels (repeatable)")
    p.add_argument("--no-matmul", action="store_true", help="skip the GEMM checks")
    p.add_argument(
        "--every-config",
        action="store_true",
        help="check each config of every autotune space (kernels and GEMMs) instead of the cases",
    )
    p.add_argument(
        "--interpreter-dtype",
        action="append",
        choices=[str(d).removeprefix("torch.") for d in kernel_checks.DTYPES],
        help="under the interpreter (no CUDA), only these input dtypes (repeatable; the test suite checks all); "
        "on CUDA every dtype is checked",
    )
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtypes = kernel_checks.DTYPES
    if device == "cpu" and args.interpreter_dtype:
        dtypes = tuple(getattr(torch, d) for d in args.interpreter_dtype)
    results, matmul = [], {}
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu (TRITON_INTERPRET=1)"

    def report(complete: bool) -> dict:
        """The report so far, rewritten after every check: a run cut off by a time limit keeps what it
        measured (``complete``: false)."""
        out = {
            "device": device_name,
            "mode": "every config of every autotune space" if args.every_config else "cases",
            "complete": complete,
            "n_checks": len(results),
            "n_failed": sum(not r["passed"] for r in results),
            "n_skipped": sum(r.get("skipped", False) for r in results),  # --every-config: not runnable here
            "matmul": matmul,
            "passed": complete and all(r["passed"] for r in results) and all(m["passed"] for m in matmul.values()),
            "checks": results,
        }
        write_json_atomic(args.out, out)
        return out

    with tqdm(desc="bit-exact kernel checks", unit="check", file=sys.stderr) as bar:
        if args.every_config:
            checks = kernel_checks.check_every_config(device)
        else:
            kernels = tuple(args.kernel or kernel_checks.KERNELS)
            checks = kernel_checks.check_cases(device, kernels=kernels, dtypes=dtypes)
        for r in checks:
            results.append(r)
            if not r["passed"]:
                tqdm.write(f"FAIL {r}", file=sys.stderr)
            bar.set_postfix_str(r["space"] if args.every_config else r["case"])
            bar.update(1)
            if device == "cuda" or len(results) % 64 == 0:
                report(complete=False)
    matmul.update({} if args.no_matmul or args.every_config else kernel_checks.check_matmul(device))
    final = report(complete=True)
    passed = final["passed"]
    print(f"{kernel_checks.summary(final)} -> {args.out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())

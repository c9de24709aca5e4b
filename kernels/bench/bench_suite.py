"""Where the test suite's time goes: one pytest run (or a JUnit XML of one) summed by file, by kind of work and by
tier, the slowest tests listed, written as JSON beside the other benchmarks.

    python kernels/bench/bench_suite.py --out results/bench/suite_durations.json            # runs the suite
    python kernels/bench/bench_suite.py --tier fast --out results/bench/suite_fast.json       # pytest -m "not slow"
    python kernels/bench/bench_suite.py --junit run.xml --out ...                             # an earlier run's XML

A test's time is its setup, call and teardown (pytest's JUnit "time"), so a module or session fixture's cost falls
on the first test that asks for it. The wall time is the whole pytest process's (collection and workers included):
with several workers it is less than the tests' sum.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIERS = {"full": [], "fast": ["-m", "not slow"], "slow": ["-m", "slow"]}
# What a test file's time is spent on, by the work its tests do (the first matching prefix).
KINDS = [
    ("tests/test_workflow.py", "snakemake subprocesses (dry runs, the smoke DAG, a hard kill)"),
    ("tests/test_packaging.py", "a wheel build"),
    ("tests/rl/", "GRPO cells, SFT warm starts and lm-eval passes"),
    ("tests/report/test_compare", "GRPO cells behind a comparison, and its simulations"),
    ("tests/numerics/test_kernels.py", "Triton kernels under the interpreter, sm_90a compiles"),
    ("tests/corrections/test_triton", "Triton kernels under the interpreter"),
    ("tests/numerics/test_fused_cpu.py", "the fused C++ kernel against the torch paths"),
    ("tests/kernels/", "the GPU session's scripts, run on CPU"),
    ("tests/analysis/", "the pathway matrix, depth and regime measurements"),
    ("tests/verify/", "device-safety checks through the kernels"),
    ("tests/report/", "reports and their simulations"),
    ("tests/", "other unit and property tests"),
]


def kind_of(path: str) -> str:
    return next(kind for prefix, kind in KINDS if path.startswith(prefix))


def read_junit(path: Path) -> list[dict]:
    """One row per test case of a JUnit XML written by pytest: its file, name and seconds; a case without its
    file or time is an error naming it."""
    rows = []
    for case in ET.parse(path).iter("testcase"):
        name, classname, seconds = case.get("name"), case.get("classname"), case.get("time")
        if not name or not classname or seconds is None:
            raise ValueError(f"{path}: a test case without its name, class or time: {case.attrib}")
        outcome = "skipped" if case.find("skipped") is not None else \
            "failed" if case.find("failure") is not None or case.find("error") is not None else "passed"
        rows.append({"file": classname.replace(".", "/") + ".py", "test": name, "seconds": float(seconds),
                     "outcome": outcome})
    if not rows:
        raise ValueError(f"{path}: no test case")
    return rows


def summary(rows: list[dict], wall: float | None, command: list[str] | None, top: int = 30) -> dict:
    """Seconds summed by file and by kind of work (with their counts), the slowest ``top`` tests, the outcomes."""
    by_file: dict = defaultdict(lambda: {"seconds": 0.0, "tests": 0})
    by_kind: dict = defaultdict(lambda: {"seconds": 0.0, "tests": 0})
    for r in rows:
        for table, key in ((by_file, r["file"]), (by_kind, kind_of(r["file"]))):
            table[key]["seconds"] += r["seconds"]
            table[key]["tests"] += 1

    def ordered(table):
        return {k: {"seconds": round(v["seconds"], 2), "tests": v["tests"]}
                for k, v in sorted(table.items(), key=lambda kv: -kv[1]["seconds"])}

    outcomes: dict = defaultdict(int)
    for r in rows:
        outcomes[r["outcome"]] += 1
    return {
        "method": "pytest's JUnit time per test (setup + call + teardown), summed; wall: the pytest process",
        "command": command, "wall_seconds": None if wall is None else round(wall, 1),
        "tests_seconds": round(sum(r["seconds"] for r in rows), 1), "n": len(rows), "outcomes": dict(outcomes),
        "by_kind": ordered(by_kind), "by_file": ordered(by_file),
        "slowest": [{k: r[k] for k in ("file", "test", "seconds")}
                    for r in sorted(rows, key=lambda r: -r["seconds"])[:top]],
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
    }


def run_suite(tier: str, workers: str, junit: Path) -> tuple[float, list[str]]:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TIERS[tier],
               *(["-n", workers, "--dist", "loadfile"] if workers != "0" else []), f"--junitxml={junit}"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO)
    wall = time.perf_counter() - start
    if not junit.is_file():
        raise SystemExit(f"pytest wrote no JUnit XML (exit {done.returncode})")
    return wall, command[1:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tier", choices=sorted(TIERS), default="full")
    p.add_argument("--workers", default="auto", help="pytest-xdist workers, a file to a worker (0: one process)")
    p.add_argument("--junit", type=Path, default=None, help="summarise this JUnit XML instead of running pytest")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.junit is not None:
        if not args.junit.is_file():
            raise SystemExit(f"--junit {args.junit}: no such file")
        wall, command, rows = None, None, read_junit(args.junit)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            junit = Path(tmp) / "suite.xml"
            wall, command = run_suite(args.tier, args.workers, junit)
            rows = read_junit(junit)
    report = summary(rows, wall, command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{report['n']} tests, {report['tests_seconds']} s of tests, wall {report['wall_seconds']} s")
    for kind, v in report["by_kind"].items():
        print(f"{v['seconds']:8.1f} s {v['tests']:5d}  {kind}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

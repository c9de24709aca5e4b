"""Collect the device calls of one GPU session (kernels/gpu/gpu_session.sh) into the GPU result files, with
every target met or missed; run here, after the calls, on the folders the device tool brought back.

    python kernels/gpu/collect_gpu_session.py CALL1 CALL2 CALL3      # each: what one call left in $OUT
    python kernels/gpu/collect_gpu_session.py                        # the reports anew from the stored calls

Each call's ``session.tgz`` is unpacked into ``results/gpu/calls/<device>/call<N>/`` (cell logs and results,
lm-eval outputs, stack.json, steps.tsv, each step's stderr; weights were left out on the device), numbered on
after that device's stored calls. Then, for every device with stored calls (with no calls named, that alone:
the reports made anew after a target changed), from all of that device's calls:
- ``results/gpu/gpu_smoke_dense_<device>.json``: ``mxfp4 gpu-smoke-report`` over every call that ran
  gpu-smoke-quick cells, each recipe against its own call's bf16, the memory plan's peaks beside;
- ``results/gpu/gpu_smoke_moe_<device>.json``: the MoE slice (the last call that ran ``smoke-moe``);
- ``results/bench/layer_<device>.json``: the real-shape layers, each (layer, recipe) row from the last call that
  measured it (``sources`` names it; its ratio is to that call's own bf16 row);
- ``results/bench/layer_unfused_<device>.json``: the correction recipes' layers with the fused kernels off, alike;
- ``results/bench/layer_unshared_<device>.json``: plain and combined recipes with each layer quantizing its own
  copy of a shared input, alike;
- ``results/bench/bench_<device>.json``: the kernel calls (memory1, memory2, gemm) of one device merged (where
  no call of the device timed kernels, a stored file is judged as it is and left unchanged);
- ``results/gpu/targets_<device>.json``: every GPU target with its number, met or missed, and the two
  checks of correctness on the device (every kernel bit-exact; every autotune config; the suite's CUDA tests).
Calls that landed on different devices (the device tool may start an H200 where no H100 opens) are kept
apart: each device gets its own folder, benchmark file and targets; times are compared only within a call.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # bench_kernels, bench_moe
from mxfp4.io import write_json_atomic  # noqa: E402
from mxfp4.layout import Layout  # noqa: E402
from mxfp4.report.gpu_smoke import ROLLOUT_TARGET, TARGETS  # noqa: E402
from mxfp4.report.gpu_smoke import run as smoke_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SMOKE_PROFILE = "gpu-smoke-quick"
PLAN = "results/gpu/memory_plan_qwen2.5-3b.json"
HOST_US_PER_CALL_TARGET = 50
BENCH_STEPS = ("bench_memory1.json", "bench_memory2.json", "bench_gemm.json")
# a line of pytest -q progress: one character a test, and " [ NN%]" once the line is full or the run ends
PYTEST_PROGRESS = re.compile(r"([.FEsxX]+)(?:\s+\[\s*\d+%\])?")
# a finished test under pytest -v: "[gw3] [ 40%] PASSED tests/test_stats.py::t[x]" (xdist), or the id first
PYTEST_VERBOSE = re.compile(r"(?:\[gw\d+\] \[\s*\d+%\] (?P<o1>[A-Z]+) (?P<id1>\S+::\S+))"
                            r"|(?:(?P<id2>\S+::\S+) (?P<o2>[A-Z]+)\s+\[\s*\d+%\])")
OUTCOME_MARK = {"PASSED": ".", "FAILED": "F", "ERROR": "E", "SKIPPED": "s", "XFAIL": "x", "XPASS": "X"}


def finished_tests(log: str) -> tuple[str, dict[str, str]]:
    """A killed pytest log's outcomes so far: the -q progress marks, and under -v each test's id and outcome
    (pytest's mark for it, as -q prints it), so the tests that never finished can be named."""
    marks, named = [], {}
    for line in map(str.strip, log.splitlines()):
        if m := PYTEST_PROGRESS.fullmatch(line):
            marks.append(m.group(1))
        elif (m := PYTEST_VERBOSE.fullmatch(line)) and (outcome := m["o1"] or m["o2"]) in OUTCOME_MARK:
            named[m["id1"] or m["id2"]] = OUTCOME_MARK[outcome]
    return "".join(marks) + "".join(named.values()), named


def gpu_test_ids() -> list[str]:
    """The ids of the suite's CUDA tests (pytest -m gpu), collected here: collection needs no device."""
    import subprocess

    out = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-p",
                          "no:cacheprovider", "tests"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:  # an empty list would claim every test finished
        raise RuntimeError(f"collecting the CUDA tests failed (pytest exit {out.returncode}):\n{out.stdout[-2000:]}"
                           f"{out.stderr[-2000:]}")
    return [line.strip() for line in out.stdout.splitlines() if "::" in line]


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100', 'cuda: NVIDIA H200' -> 'h200'; else the name in lower-case words."""
    model = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    return model.group(1).lower() if model else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _in_calls(root: Path, rel: list[Path], name: str) -> list[Path]:
    """``name`` in each of these calls' folders that has it, in call order (relative to root)."""
    return [f / name for f in rel if (root / f / name).is_file()]


def _latest_report(root: Path, rel: list[Path], name: str, out: str) -> dict | None:
    """The last of these calls' ``name``, written to ``out`` (relative to root) with its source; None where no
    call ran it."""
    found = _in_calls(root, rel, name)
    if not found:
        return None
    report = _json(root / found[-1])
    write_json_atomic(root / out, {**report, "source": str(found[-1])})
    return report


def _merged_layer_report(root: Path, rel: list[Path], name: str, out: str) -> dict | None:
    """The real-shape layer reports of these calls merged: each (layer, recipe) row from the last call that
    measured it, its ratio to that call's own reference (times compare only within a call), the call named in
    ``sources``; the last call's header. Written to ``out``; None where no call ran it."""
    found = _in_calls(root, rel, name)
    if not found:
        return None
    reports = [_json(root / f) for f in found]
    layers: dict = {}
    sources: dict = {}
    for path, report in zip(found, reports):
        for layer, recipes in report["layers"].items():
            for recipe, row in recipes.items():
                layers.setdefault(layer, {})[recipe] = row
                sources.setdefault(layer, {})[recipe] = str(path)
    merged = {**reports[-1], "layers": layers, "sources": sources, "source": [str(f) for f in found]}
    write_json_atomic(root / out, merged)
    return merged


def unpack(call: Path, into: Path) -> Path:
    """One call's session.tgz unpacked (its flat headline files, the newest copies, laid over it)."""
    if not call.is_dir():
        raise FileNotFoundError(f"{call} is not a folder; pass the folders the device tool brought back")
    archive = call / "session.tgz"
    if not archive.is_file() and not any(call.glob("*.json")):
        raise FileNotFoundError(f"{call} holds neither session.tgz nor any JSON: not a gpu_session.sh call")
    into.mkdir(parents=True, exist_ok=True)
    if archive.is_file():
        with tarfile.open(archive) as tar:
            tar.extractall(into, filter="data")  # refuses absolute paths and links out of the folder
    for f in call.iterdir():
        if f.is_file() and f.name != "session.tgz":
            shutil.copyfile(f, into / f.name)
    return into


def call_device(folder: Path) -> str:
    """The device a call ran on, as torch named it: stack.json, else any report of the call."""
    stack = _json(folder / "stack.json") or {}
    if stack.get("device"):
        return stack["device"]
    for name in ("gpu_smoke_moe.json", *BENCH_STEPS, "checks.json"):
        device = (_json(folder / name) or {}).get("device")
        if device:
            return device.removeprefix("cuda: ")
    for metrics in Layout(folder / "results", SMOKE_PROFILE).finished_cells():
        device = _json(metrics).get("device")
        if device:
            return device
    smi = folder / "device.csv"  # nvidia-smi's line, written before any step: a call whose every step failed
    rows = smi.read_text().splitlines()[1:] if smi.is_file() else []
    name = rows[0].split(",")[0].strip() if rows else ""
    if name:
        return name
    raise ValueError(f"{folder}: no file of this call names its device (stack.json, a report, a cell's metrics "
                     "or device.csv)")


def collect(calls: list[Path], root: Path = ROOT) -> dict[str, list[dict]]:
    """Unpack, report, merge and check every target; returns the targets per device slug."""
    import bench_kernels

    folders = place(calls, root)
    calls_root = root / "results/gpu/calls"
    for device in sorted(calls_root.iterdir() if calls_root.is_dir() else []):  # every device, reported anew
        if device.is_dir() and not device.name.startswith(".") and device.name not in folders:
            folders[device.name] = stored_calls(root, device.name)

    out: dict[str, list[dict]] = {}
    for slug, rel in folders.items():
        targets: list[dict] = []
        smoke = [f / "results" for f in rel if (root / f / "results" / SMOKE_PROFILE).is_dir()]
        if smoke:
            dense_out = f"results/gpu/gpu_smoke_dense_{slug}.json"
            rec = smoke_report([Layout(root / s, SMOKE_PROFILE) for s in smoke], out=None, plan=root / PLAN)
            for run, results in zip(rec["runs"], smoke):  # paths as the repository sees them
                run["results"] = str(results)
            write_json_atomic(root / dense_out, rec)
            targets += dense_targets(rec, dense_out)
        moe_out = f"results/gpu/gpu_smoke_moe_{slug}.json"
        if (report := _latest_report(root, rel, "gpu_smoke_moe.json", moe_out)) is not None:
            targets += moe_targets(report, moe_out)
        kernel_calls = [k for step in BENCH_STEPS for k in _in_calls(root, rel, step)]
        bench_out = f"results/bench/bench_{slug}.json"
        if kernel_calls:
            merged = bench_kernels.merge([_json(root / k) for k in kernel_calls], [str(k) for k in kernel_calls])
            write_json_atomic(root / bench_out, merged)
            kernel_targets = merged["targets"]
        elif (root / bench_out).is_file():  # measured in calls made before the call folders: judged as stored
            kernel_targets = bench_kernels.targets(_json(root / bench_out)["rows"])
        else:
            kernel_targets = []
        targets += [{"source": bench_out, "target": f"{t['target']} at {'x'.join(map(str, t['shape']))}",
                     "value": t["value"], "threshold": f">= {t['threshold']}", "met": t["met"]}
                    for t in kernel_targets]
        layer_out = f"results/bench/layer_{slug}.json"
        if (report := _merged_layer_report(root, rel, "bench_layer.json", layer_out)) is not None:
            targets += layer_targets(report, layer_out)
        # the correction recipes with their hooks composed in torch ops: the "before" of the fused kernels
        _merged_layer_report(root, rel, "bench_layer_unfused.json", f"results/bench/layer_unfused_{slug}.json")
        # each layer quantizing its own copy of a shared input: the "before" of the shared quantizations
        _merged_layer_report(root, rel, "bench_layer_unshared.json", f"results/bench/layer_unshared_{slug}.json")
        targets += device_checks(root, rel)
        write_json_atomic(root / f"results/gpu/targets_{slug}.json",
                          {"device_calls": [str(f) for f in rel], "targets": targets})
        out[slug] = targets
    return out


def place(calls: list[Path], root: Path) -> dict[str, list[Path]]:
    """Each call unpacked into results/gpu/calls/<device>/call<N>/, N counted on after the device's stored calls
    (a later session adds to a device's record); nothing moved into place unless every call unpacks. Returns
    every call of each device these calls landed on, stored ones first, as folders relative to root."""
    staging = root / "results/gpu/calls/.staging"
    try:
        unpacked = [unpack(call, staging / str(i)) for i, call in enumerate(calls)]
        by_device: dict[str, list[Path]] = {}
        for folder in unpacked:
            slug = device_slug(call_device(folder))
            by_device.setdefault(slug, []).append(folder)
        stored = {slug: stored_calls(root, slug) for slug in by_device}
        moves = {folder: Path("results/gpu/calls") / slug / f"call{len(stored[slug]) + n}"
                 for slug, group in by_device.items() for n, folder in enumerate(group, start=1)}
        for folder, dest in moves.items():
            (root / dest).parent.mkdir(parents=True, exist_ok=True)
            folder.rename(root / dest)
        return {slug: stored[slug] + [moves[f] for f in group] for slug, group in by_device.items()}
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def stored_calls(root: Path, slug: str) -> list[Path]:
    """The device's collected calls, call1, call2, ... in order; a gap in the numbering is an error (a call
    folder removed by hand would otherwise be overwritten)."""
    folder = root / "results/gpu/calls" / slug
    numbers = sorted(int(m.group(1)) for f in (folder.iterdir() if folder.is_dir() else [])
                     if (m := re.fullmatch(r"call(\d+)", f.name)))
    if numbers != list(range(1, len(numbers) + 1)):
        raise ValueError(f"{folder} holds calls {numbers}: expected call1..callN without gaps")
    return [Path("results/gpu/calls") / slug / f"call{n}" for n in numbers]


def dense_targets(rec: dict, source: str) -> list[dict]:
    """No recipe fails (every recipe of the profile finished), and each targeted recipe's step time against its
    call's BF16: missed, with no number, where either cell did not finish."""
    unfinished = rec["failed"] + rec["not_run"]
    rows = [{"source": source, "target": "no gpu-smoke-quick recipe fails", "value": unfinished or "all finished",
             "threshold": "none failed or not run", "met": not unfinished}]
    for name, threshold in TARGETS.items():
        ratio = rec["recipes"].get(name, {}).get("step_time_vs_bf16")
        rows.append({"source": source, "target": f"{name} step / bf16 step", "value": ratio,
                     "threshold": f"<= {threshold}", "met": ratio is not None and ratio <= threshold})
        rollout = rec["recipes"].get(name, {}).get("rollout_time_vs_bf16")
        rows.append({"source": source, "target": f"{name} rollout / bf16 rollout", "value": rollout,
                     "threshold": f"<= {ROLLOUT_TARGET}", "met": rollout is not None and rollout <= ROLLOUT_TARGET})
    return rows


def device_checks(root: Path, rel: list[Path]) -> list[dict]:
    """The checks of correctness a call may have run on this device: every kernel bit-exact (``checks``:
    kernels/check_kernels.py), every config of every autotune space (``configs``: its --every-config) and
    the suite's CUDA tests (``tests``: pytest -m gpu, its JUnit XML)."""
    import xml.etree.ElementTree as ET

    from mxfp4.verify.kernel_checks import summary  # (imports torch, as collect's bench_kernels does)

    rows = []
    for name, target in (("checks.json", "every kernel bit-exact on the device (check_kernels.py)"),
                         ("checks_configs.json", "every autotune config checked on the device (--every-config)")):
        for f in _in_calls(root, rel, name)[-1:]:  # the last call that ran it
            c = _json(root / f)
            rows.append({"source": str(f), "target": target, "value": summary(c),
                         "threshold": "all passed, complete", "met": c["passed"]})
    logs = _in_calls(root, rel, "tests_gpu.log")
    if logs and not _in_calls(root, rel, "tests_gpu.xml"):  # killed at its time limit: only pytest's progress
        progress, named = finished_tests((root / logs[-1]).read_text())
        row = {"source": str(logs[-1]), "target": "the suite's CUDA tests pass (pytest -m gpu)",
               "value": f"stopped before its summary: {progress.count('.')} passed, {progress.count('F')} "
                        f"failed, {progress.count('E')} errors so far", "threshold": "none failed", "met": False}
        if named:  # a -v log names them: which failed, and which never finished
            row["failed"] = sorted(t for t, mark in named.items() if mark in "FE")
            row["not_finished"] = [t for t in gpu_test_ids() if t not in named]
        rows.append(row)
    for f in _in_calls(root, rel, "tests_gpu.xml")[-1:]:
        suite = ET.parse(root / f).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        rows.append({"source": str(f), "target": "the suite's CUDA tests pass (pytest -m gpu)",
                     "value": f"{n['tests'] - n['failures'] - n['errors'] - n['skipped']} passed, {n['failures']} "
                              f"failed, {n['errors']} errors, {n['skipped']} skipped",
                     "threshold": "none failed", "met": n["tests"] > n["skipped"] and not n["failures"] + n["errors"]})
    return rows


def layer_targets(report: dict, source: str) -> list[dict]:
    """The host cost of one quantizer call in each real-shape layer (kernels/bench/bench_layer.py), per recipe
    and pass (decode, train): at most 50 us, so that a layer's launches, not its Python, set its time."""
    return [{"source": source, "target": f"{layer} layer, {recipe}, {mode}: host us per quantizer call",
             "value": m["quantizer_host_us_per_call"], "threshold": f"<= {HOST_US_PER_CALL_TARGET}",
             "met": m["quantizer_host_us_per_call"] <= HOST_US_PER_CALL_TARGET}
            for layer, recipes in report["layers"].items() for recipe, modes in recipes.items()
            for mode, m in modes.items() if m.get("quantizer_host_us_per_call") is not None]


def moe_targets(report: dict, source: str) -> list[dict]:
    """The MoE step target per real-layer row: undecided (met None) where the report's baseline did not run a
    bf16 model's experts (a report without ``baseline_weights`` timed the experts' fp32 master weights, which
    transformers' grouped_mm multiplies in fp32 under the autocast)."""
    bf16_baseline = report.get("baseline_weights") == "compute dtype"
    rows = [{"source": source, "target": f"MoE grouped MXFP4 step / bf16 step, {r['case']}",
             "value": r["grouped_over_bf16"], "threshold": f"<= {r['target_grouped_over_bf16']}",
             "met": r["meets_target"] if bf16_baseline else None,
             **({} if bf16_baseline else {"why_undecided": "the baseline ran fp32 master weights (fp32 grouped "
                                                           "GEMMs), not a bf16 model's experts"})}
            for r in report["rows"] if "meets_target" in r]
    if not rows:  # the call stopped before the real layers: the target is missed, not silently absent
        from bench_moe import TARGET_GROUPED_OVER_BF16  # (imports transformers)

        rows.append({"source": source, "target": "MoE grouped MXFP4 step / bf16 step, real layers",
                     "value": None, "threshold": f"<= {TARGET_GROUPED_OVER_BF16}",
                     "met": False})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("calls", nargs="*", type=Path, help="the folders of the calls' $OUT, in the order they ran "
                   "(none: every device's files reported anew from its stored calls)")
    p.add_argument("--root", type=Path, default=ROOT, help="the repository the files go into (default: this one)")
    args = p.parse_args(argv)
    collected = collect(args.calls, args.root)
    for slug, targets in collected.items():
        print(f"{slug}: results/gpu/targets_{slug}.json")
        for t in targets:
            value = f"{t['value']:.3f}" if isinstance(t["value"], float) else str(t["value"])
            verdict = "UNDECIDED" if t["met"] is None else "met      " if t["met"] else "MISSED   "
            print(f"  {verdict} {t['target']:<70} {value:>14} (target {t['threshold']})")
    sources = {t["source"] for targets in collected.values() for t in targets}
    for what, prefix in (("the dense gpu-smoke-quick cells", "results/gpu/gpu_smoke_dense"),
                         ("the real-shape layers", "results/bench/layer_"),
                         ("the MoE slice", "results/gpu/gpu_smoke_moe"), ("the kernel benchmarks", "results/bench/")):
        if not any(s.startswith(prefix) for s in sources):
            print(f"NOT MEASURED in any call: {what} (their targets are missed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Collect the device calls of one GPU session (kernels/gpu/gpu_session.sh) into the GPU result files, with
every target met or missed; run here, after the calls, on the folders the device tool brought back.

    python kernels/gpu/collect_gpu_session.py CALL1 CALL2 CALL3      # each: what one call left in $OUT
    python kernels/gpu/collect_gpu_session.py                        # the targets anew from the stored reports
    python kernels/gpu/collect_gpu_session.py --keep ../gpu-calls CALL1   # the unpacked calls kept outside the tree

Each call's ``session.tgz`` is unpacked into a scratch folder (or, with ``--keep DIR``, into ``DIR/<device>/call<N>/``
outside the repository: cell logs and results, lm-eval outputs, each step's stderr; weights were left out on the
device) and named ``<device>/call<N>``, numbered on after that device's stored calls (``device_calls`` of its targets
file). What the calls measured is merged into the device's stored reports, which are the record (the raw dumps never
enter the tree):
- ``results/gpu/gpu_smoke_dense_<device>.json``: the stored runs and each new call that ran gpu-smoke-quick cells
  (``mxfp4.report.gpu_smoke``), each recipe against its own call's bf16, the memory plan's peaks beside;
- ``results/gpu/gpu_smoke_moe_<device>.json``: the MoE slice (the last call that ran ``smoke-moe``);
- ``results/bench/layer_<device>.json``: the real-shape layers, each (layer, recipe) row from the last call that
  measured it (``sources`` names it; its ratio is to that call's own bf16 row);
- ``results/bench/layer_unfused_<device>.json``: the correction recipes' layers with the fused kernels off, alike;
- ``results/bench/layer_unshared_<device>.json``: plain and combined recipes with each layer quantizing its own
  copy of a shared input, alike;
- ``results/bench/bench_<device>.json``: the kernel calls (memory1, memory2, gemm) of one device merged, the stored
  rows kept (with no new kernel call, the stored file is judged as it is and left unchanged);
- ``results/gpu/targets_<device>.json``: every GPU target with its number, met or missed, and the two
  checks of correctness on the device (every kernel bit-exact; every autotune config; the suite's CUDA tests; a
  check no new call ran is the stored one).
Calls that landed on different devices (the device tool may start an H200 where no H100 opens) are kept
apart: each device gets its own reports, benchmark file and targets; times are compared only within a call.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # bench_kernels, bench_moe
from mxfp4.config.profiles import load_profile  # noqa: E402
from mxfp4.io import write_json_atomic  # noqa: E402
from mxfp4.layout import Layout  # noqa: E402
from mxfp4.report.gpu_smoke import ROLLOUT_TARGET, TARGETS, from_runs, run_entry  # noqa: E402

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


def _in_calls(calls: list[tuple[str, Path]], name: str) -> list[tuple[str, Path]]:
    """(label/name, file) of ``name`` in each of these calls' folders that has it, in call order."""
    return [(f"{label}/{name}", folder / name) for label, folder in calls if (folder / name).is_file()]


def _stored(root: Path, out: str) -> dict | None:
    return _json(root / out)


def _latest_report(root: Path, calls: list[tuple[str, Path]], name: str, out: str) -> dict | None:
    """The last of these calls' ``name``, written to ``out`` (relative to root) with its source; else the stored
    ``out`` as it is; None where neither exists."""
    found = _in_calls(calls, name)
    if not found:
        return _stored(root, out)
    source, path = found[-1]
    report = {**_json(path), "source": source}
    write_json_atomic(root / out, report)
    return report


def _merged_layer_report(root: Path, calls: list[tuple[str, Path]], name: str, out: str) -> dict | None:
    """The stored real-shape layer report (``out``, relative to root) with these calls' reports laid over it: each
    (layer, recipe) row from the last call that measured it, its ratio to that call's own reference (times compare
    only within a call), the call named in ``sources``; the last call's header. Written to ``out``; the stored one
    where no call ran it; None where neither exists."""
    stored = _stored(root, out)
    found = _in_calls(calls, name)
    if not found:
        return stored
    layers = {layer: dict(rows) for layer, rows in (stored or {}).get("layers", {}).items()}
    sources = {layer: dict(rows) for layer, rows in (stored or {}).get("sources", {}).items()}
    last = None
    for source, path in found:
        last = _json(path)
        for layer, recipes in last["layers"].items():
            for recipe, row in recipes.items():
                layers.setdefault(layer, {})[recipe] = row
                sources.setdefault(layer, {})[recipe] = source
    merged = {**last, "layers": layers, "sources": sources,
              "source": [*(stored or {}).get("source", []), *(s for s, _ in found)]}
    write_json_atomic(root / out, merged)
    return merged


def _merged_bench(root: Path, calls: list[tuple[str, Path]], out: str) -> list[dict]:
    """The stored kernel report of a device (``out``) with these calls' kernel reports added (each row keeps the
    call it was measured in); its targets. The stored file is judged as it is where no call timed kernels."""
    import bench_kernels

    stored = _stored(root, out)
    found = [hit for call in calls for step in BENCH_STEPS for hit in _in_calls([call], step)]  # as they ran
    if not found:
        return bench_kernels.targets(stored["rows"]) if stored else []
    reports = [_json(path) for _, path in found]
    sources = [source for source, _ in found]
    if stored is not None:  # its rows keep their calls: a merged report is one report per source it names
        parts = stored.get("sources") or [stored.get("source", "stored")]
        commands = stored.get("commands") or [stored.get("command")]
        method = stored["method"].removesuffix(bench_kernels.MERGED_METHOD)
        reports = [{**stored, "method": method, "command": commands[i],
                    "rows": [r for r in stored["rows"] if r.get("call", 0) == i]} for i in range(len(parts))] + reports
        sources = list(parts) + sources
    merged = bench_kernels.merge(reports, sources)
    write_json_atomic(root / out, merged)
    return merged["targets"]


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


def collect(calls: list[Path], root: Path = ROOT, keep: Path | None = None) -> dict[str, list[dict]]:
    """Unpack, merge into the stored reports and check every target; returns the targets per device slug. Every
    device with a stored targets file is reported anew (after a target changed, with no calls at all)."""
    if keep is not None and keep.resolve().is_relative_to(root.resolve()):
        raise ValueError(f"--keep {keep}: inside the repository; the raw calls stay out of the tree "
                         "(e.g. ../gpu-calls)")
    with tempfile.TemporaryDirectory(prefix="gpu-calls-") as scratch:
        unpacked = [unpack(call, Path(scratch) / str(i)) for i, call in enumerate(calls)]
        by_device: dict[str, list[Path]] = {}
        for folder in unpacked:
            by_device.setdefault(device_slug(call_device(folder)), []).append(folder)
        for target in sorted((root / "results/gpu").glob("targets_*.json")):
            by_device.setdefault(target.stem.removeprefix("targets_"), [])
        out: dict[str, list[dict]] = {}
        for slug, folders in by_device.items():
            stored = stored_calls(root, slug)
            labelled = [(f"{slug}/call{len(stored) + n}", folder) for n, folder in enumerate(folders, start=1)]
            out[slug] = report_device(root, slug, stored, labelled)
            if keep is not None:
                for label, folder in labelled:
                    shutil.copytree(folder, keep / label)
        return out


def report_device(root: Path, slug: str, stored: list[str], calls: list[tuple[str, Path]]) -> list[dict]:
    """One device's stored reports with these (label, folder) calls merged in; its targets, written."""
    targets: list[dict] = []
    dense_out = f"results/gpu/gpu_smoke_dense_{slug}.json"
    runs = (_stored(root, dense_out) or {}).get("runs", [])
    profile = load_profile(SMOKE_PROFILE)
    model, recipes, seed = next(iter(profile.models)), list(profile.recipes), profile.seeds[0]
    for label, folder in calls:
        if (folder / "results" / SMOKE_PROFILE).is_dir():
            entry = run_entry(Layout(folder / "results", SMOKE_PROFILE), model, recipes, seed)
            runs.append({**entry, "results": f"{label}/results"})
    if runs:
        plan = _json(root / PLAN)
        rec = from_runs(runs, SMOKE_PROFILE, model, recipes, seed, plan)
        write_json_atomic(root / dense_out, rec)
        targets += dense_targets(rec, dense_out)
    moe_out = f"results/gpu/gpu_smoke_moe_{slug}.json"
    if (report := _latest_report(root, calls, "gpu_smoke_moe.json", moe_out)) is not None:
        targets += moe_targets(report, moe_out)
    bench_out = f"results/bench/bench_{slug}.json"
    targets += [{"source": bench_out, "target": f"{t['target']} at {'x'.join(map(str, t['shape']))}",
                 "value": t["value"], "threshold": f">= {t['threshold']}", "met": t["met"]}
                for t in _merged_bench(root, calls, bench_out)]
    layer_out = f"results/bench/layer_{slug}.json"
    if (report := _merged_layer_report(root, calls, "bench_layer.json", layer_out)) is not None:
        targets += layer_targets(report, layer_out)
    # the correction recipes with their hooks composed in torch ops: the "before" of the fused kernels
    _merged_layer_report(root, calls, "bench_layer_unfused.json", f"results/bench/layer_unfused_{slug}.json")
    # each layer quantizing its own copy of a shared input: the "before" of the shared quantizations
    _merged_layer_report(root, calls, "bench_layer_unshared.json", f"results/bench/layer_unshared_{slug}.json")
    checks = device_checks(calls)
    ran = {row["target"] for row in checks}
    stored_targets = (_stored(root, f"results/gpu/targets_{slug}.json") or {}).get("targets", [])
    checks += [row for row in stored_targets if row["target"] in CHECK_TARGETS and row["target"] not in ran]
    targets += sorted(checks, key=lambda row: CHECK_TARGETS.index(row["target"]))  # as one collection orders them
    write_json_atomic(root / f"results/gpu/targets_{slug}.json",
                      {"device_calls": stored + [label for label, _ in calls], "targets": targets})
    return targets


def stored_calls(root: Path, slug: str) -> list[str]:
    """The device's collected calls, as its targets file names them."""
    return list((_stored(root, f"results/gpu/targets_{slug}.json") or {}).get("device_calls", []))


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


CHECK_TARGETS = ("every kernel bit-exact on the device (check_kernels.py)",
                 "every autotune config checked on the device (--every-config)",
                 "the suite's CUDA tests pass (pytest -m gpu)")


def device_checks(calls: list[tuple[str, Path]]) -> list[dict]:
    """The checks of correctness a call may have run on this device: every kernel bit-exact (``checks``:
    kernels/check_kernels.py), every config of every autotune space (``configs``: its --every-config) and
    the suite's CUDA tests (``tests``: pytest -m gpu, its JUnit XML)."""
    import xml.etree.ElementTree as ET

    from mxfp4.verify.kernel_checks import summary  # (imports torch, as collect's bench_kernels does)

    rows = []
    for name, target in (("checks.json", CHECK_TARGETS[0]), ("checks_configs.json", CHECK_TARGETS[1])):
        for source, path in _in_calls(calls, name)[-1:]:  # the last call that ran it
            c = _json(path)
            rows.append({"source": source, "target": target, "value": summary(c),
                         "threshold": "all passed, complete", "met": c["passed"]})
    logs = _in_calls(calls, "tests_gpu.log")
    if logs and not _in_calls(calls, "tests_gpu.xml"):  # killed at its time limit: only pytest's progress
        progress, named = finished_tests(logs[-1][1].read_text())
        row = {"source": logs[-1][0], "target": CHECK_TARGETS[2],
               "value": f"stopped before its summary: {progress.count('.')} passed, {progress.count('F')} "
                        f"failed, {progress.count('E')} errors so far", "threshold": "none failed", "met": False}
        if named:  # a -v log names them: which failed, and which never finished
            row["failed"] = sorted(t for t, mark in named.items() if mark in "FE")
            row["not_finished"] = [t for t in gpu_test_ids() if t not in named]
        rows.append(row)
    for source, path in _in_calls(calls, "tests_gpu.xml")[-1:]:
        suite = ET.parse(path).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        rows.append({"source": source, "target": CHECK_TARGETS[2],
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
                   "(none: every device's targets anew from its stored reports)")
    p.add_argument("--root", type=Path, default=ROOT, help="the repository the files go into (default: this one)")
    p.add_argument("--keep", type=Path, default=None, help="a folder outside the repository to keep the unpacked "
                   "calls in (<device>/call<N>/: logs, cell results, lm-eval outputs)")
    args = p.parse_args(argv)
    collected = collect(args.calls, args.root, args.keep)
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

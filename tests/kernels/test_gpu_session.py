"""The GPU session's scripts, rehearsed on CPU: the benchmarks' output, the session's steps and what it
brings back, the collector, and the stats patch the device times."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from gpu_fixtures import kernels_script, session_env, smoke_cell
from mxfp4.config.profiles import load_profile


def test_the_moe_bench_times_the_unquantized_grouped_and_per_expert_paths_and_writes_as_it_goes(tmp_path):
    bench = kernels_script("bench_moe")
    bench.CASES = {"tiny": (8, 2, 64, 32, 1, 64)}  # the smallest case: this checks the report, not speed
    out = tmp_path / "moe.json"
    assert bench.main(["--out", str(out), "--reps", "1", "--device", "cpu", "--compute", "bfloat16"]) == 0
    report = json.loads(out.read_text())
    row = report["rows"][0]
    paths = {"bf16", "fp32 masters", "grouped", "per-expert loop"}  # bf16 weights, and fp32 ones under autocast
    assert report["complete"] and set(row["seconds_fwd_bwd"]) == set(row["seconds_generate"]) == paths
    assert row["grouped_over_bf16"] > 0 and row["generate_grouped_over_bf16"] > 0
    assert row["grouped_over_fp32_masters"] > 0
    assert "compute bfloat16" in report["method"] and row["weight_cache"] is True and row["decode_tokens"] == 64


def test_the_moe_benchs_unquantized_baseline_runs_transformers_grouped_mm_experts(tmp_path, monkeypatch):
    """The baseline is the experts as a real model runs them (transformers' grouped_mm implementation), not
    the per-expert Python loop a bare config falls back to: the grouped function is called, once per layer
    and pass, and the report names it."""
    from transformers.integrations import moe

    bench = kernels_script("bench_moe")
    bench.CASES = {"tiny": (8, 2, 64, 32, 1, 64)}
    calls = []
    grouped = moe.ALL_EXPERTS_FUNCTIONS["grouped_mm"]

    def spy(*args, **kw):
        calls.append(1)
        return grouped(*args, **kw)

    monkeypatch.setitem(moe.ALL_EXPERTS_FUNCTIONS._global_mapping, "grouped_mm", spy)
    out = tmp_path / "moe.json"
    assert bench.main(["--out", str(out), "--reps", "1", "--device", "cpu"]) == 0
    assert len(calls) == 4  # unquantized only: (warm-up + 1 rep) x (training step, generation), 1 layer
    assert json.loads(out.read_text())["baseline_experts_implementation"] == "grouped_mm"


def test_bench_calls_of_one_device_merge_with_every_target_met_or_missed(tmp_path):
    bench = kernels_script("bench_kernels")

    def memory(path, axis, fraction, shape=(8192, 4096)):
        return {"kind": "memory", "path": path, "shape": list(shape), "axis": axis, "seconds": 1.0,
                "fraction": fraction}

    def call(rows, **over):
        return {"device": "NVIDIA H100 80GB HBM3", "versions": {"torch": "2.11.0", "triton": "3.6.0"},
                "method": "CUDA graphs", "command": "python kernels/bench/bench_kernels.py", "rows": rows, "ratios": {},
                **over}

    auto = "w4a16_matmul (auto: fused at M<=64, else dequantize + cuBLAS)"
    one = call([memory("triton quantize", -1, 0.86), memory("triton quantize", 0, 0.79),
                memory("triton fake_quantize", 0, 0.5),
                memory("triton fake_quantize_with_stats", -1, 0.5), memory("triton fake_quantize", "both", 0.9)])
    def gemm(shape, speedup):
        return {"kind": "gemm", "path": auto, "shape": shape, "seconds": 1.0, "speedup_vs_cublas_bf16": speedup}

    two = call([gemm([16, 11008, 2048], 2.6), gemm([64, 11008, 2048], 0.9), gemm([16, 2048, 2048], 0.9),
                memory("triton fake_quantize", 0, 0.81)], partial=True)   # a later timing of a row of the first call
    merged = bench.merge([one, two], ["a.json", "b.json"])
    assert [(t["target"], t["shape"], t["met"]) for t in merged["targets"]] == [
        ("triton quantize (axis -1) / copy bandwidth", [8192, 4096], True),    # rows: 85%
        ("triton quantize (axis 0) / copy bandwidth", [8192, 4096], False),    # axis 0: 80%
        ("triton fake_quantize (axis 0) / copy bandwidth", [8192, 4096], True),  # judged on its last timing
        ("W4A16 decode / cuBLAS bf16", [16, 11008, 2048], True)]  # the gate projection at M <= 16 only
    assert [r["call"] for r in merged["rows"]] == [0] * 5 + [1] * 4 and merged["partial"] is True
    with pytest.raises(ValueError, match="differ in device"):
        bench.merge([one, call([], device="NVIDIA H200")], ["a.json", "c.json"])


@pytest.mark.slow
def test_a_session_over_the_device_tools_file_limit_still_brings_back_its_reports_and_logs(tmp_path):
    """Past 16 MiB packed, session.tgz keeps the reports and logs only: the tests step's JUnit XML, the
    steps' stdout and stderr and the device's CSV among them (kernels/gpu/collect_gpu_session.py reads them)."""
    import os
    import subprocess
    import tarfile

    root = Path(__file__).resolve().parents[2]
    out, work = tmp_path / "out", tmp_path / "work"
    work.mkdir()
    (work / "activations.dat").write_bytes(os.urandom(16 << 20))   # incompressible, over the limit alone
    (work / "tests_gpu.xml").write_text("<testsuites/>")
    env = session_env(out, work)
    subprocess.run(["bash", "kernels/gpu/gpu_session.sh", "stack"], cwd=root, env=env, capture_output=True, text=True,
                   timeout=300, check=True)
    assert (out / "session.tgz").stat().st_size < 16 << 20
    with tarfile.open(out / "session.tgz") as archive:
        names = {Path(n).name for n in archive.getnames()}
    assert {"tests_gpu.xml", "stack.out", "stack.err", "stack.json", "steps.tsv"} <= names
    assert "activations.dat" not in names


def test_a_sessions_calls_are_collected_into_the_gpu_files_with_every_target_met_or_missed(tmp_path):
    """Three calls' $OUT as the device tool brings them back: two dense halves with the MoE slice on an H100, the
    kernel call on an H200 (the tool starts one where no H100 opens). Each device keeps its own files; a recipe
    that died, or was not run, misses its target with no number instead of vanishing from the list."""
    import subprocess
    import tarfile

    collect = kernels_script("collect_gpu_session")
    root = tmp_path / "repo"

    def call(name, files, cells=(), device="NVIDIA H100 80GB HBM3"):
        out, work = tmp_path / name / "out", tmp_path / name / "work"
        out.mkdir(parents=True)
        work.mkdir()
        for recipe, times in cells:   # a finished cell, or (recipe, log text) one that died
            smoke_cell(work / "results", recipe, *((times,) if isinstance(times, list) else ([], None, times)))
        (work / "steps.tsv").write_text("stack\t0\t7\n")
        with tarfile.open(out / "session.tgz", "w:gz") as tar:
            tar.add(work, arcname=".")
        for f, content in {"stack.json": {"device": device, "torch": "2.11.0"}, **files}.items():
            (out / f).write_text(json.dumps(content))
        return out

    moe = {"device": "cuda: NVIDIA H100 80GB HBM3", "complete": True, "baseline_weights": "compute dtype", "rows": [
        {"case": "tiny-moe", "grouped_over_bf16": 3.0},
        {"case": "qwen3-30b-a3b layers", "grouped_over_bf16": 1.4, "target_grouped_over_bf16": 1.5,
         "meets_target": True}]}
    memory = {"kind": "memory", "path": "triton quantize", "shape": [8192, 4096], "axis": -1, "seconds": 1.0,
              "fraction": 0.9}
    bench = {"device": "NVIDIA H200", "versions": {"torch": "2.11.0"}, "method": "do_bench", "rows": [memory],
             "ratios": {}}
    checks = {"device": "NVIDIA H100 80GB HBM3", "complete": True, "n_checks": 3, "n_failed": 1, "passed": False,
              "matmul": {"w4a16": {"passed": True}}}
    suite = tmp_path / "test_three.py"   # a real JUnit XML, as the tests step writes it: 1 passed, 1 failed, 1 skipped
    suite.write_text("import pytest\ndef test_a(): pass\ndef test_b(): assert False\n"
                     "@pytest.mark.skip\ndef test_c(): pass\n")
    junit = tmp_path / "tests_gpu.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", str(suite)],
                   cwd=tmp_path, capture_output=True, timeout=120)
    one = call("one", {"gpu_smoke_moe.json": moe},
               [("bf16", [50.0, 2.0, 2.0]), ("mxfp4", [90.0, 2.4, 2.4]), ("mxfp4+macro", "torch.OutOfMemoryError")])
    configs = {"device": "NVIDIA H100 80GB HBM3", "complete": True, "n_checks": 132, "n_failed": 0, "n_skipped": 2,
               "passed": True, "matmul": {}}
    two = call("two", {"checks.json": checks, "checks_configs.json": configs},
               [("bf16", [50.0, 4.0, 4.0]), ("mxfp4+fallback", [90.0, 7.0, 7.0])])
    (two / "tests_gpu.xml").write_text(junit.read_text())
    layer = {"device": "cuda", "layers": {"dense": {
        "bf16": {"decode": {"quantizer_calls": 0, "quantizer_host_us_per_call": None}},
        "mxfp4": {"decode": {"quantizer_calls": 7, "quantizer_host_us_per_call": 40.0},
                  "train": {"quantizer_calls": 28, "quantizer_host_us_per_call": 140.0}}}}}
    three = call("three", {"bench_memory1.json": bench, "bench_layer.json": layer}, device="NVIDIA H200")
    relayer = {"device": "cuda", "layers": {"dense": {   # a later call: each row from the last call that measured it
        "mxfp4+fallback": {"decode": {"quantizer_calls": 7, "quantizer_host_us_per_call": 60.0}}}}}
    three_more = call("three_more", {"bench_layer.json": relayer}, device="NVIDIA H200")
    got = collect.collect([one, two, three, three_more], root)

    h100 = {t["target"]: (t["value"], t["met"]) for t in got["h100"]}
    assert h100["no gpu-smoke-quick recipe fails"] == (["mxfp4+macro", "mxfp4+aqn", "mxfp4+all"], False)
    assert h100["mxfp4 step / bf16 step"] == (pytest.approx(1.2), True)
    assert h100["mxfp4+fallback step / bf16 step"] == (pytest.approx(1.75), False)   # against its own call's bf16
    assert h100["mxfp4+macro step / bf16 step"] == (None, False)
    assert h100["MoE grouped MXFP4 step / bf16 step, qwen3-30b-a3b layers"] == (1.4, True)
    assert h100["every kernel bit-exact on the device (check_kernels.py)"] == ("2/3 checks, matmul ok", False)
    assert h100["every autotune config checked on the device (--every-config)"] == (
        "132/132 checks, 2 not runnable here (never picked)", True)
    assert h100["the suite's CUDA tests pass (pytest -m gpu)"] == ("1 passed, 1 failed, 0 errors, 1 skipped", False)
    assert [(t["target"], t["met"]) for t in got["h200"]] == [
        ("triton quantize (axis -1) / copy bandwidth at 8192x4096", True),
        ("dense layer, mxfp4, decode: host us per quantizer call", True),
        ("dense layer, mxfp4, train: host us per quantizer call", False),
        ("dense layer, mxfp4+fallback, decode: host us per quantizer call", False)]
    merged = json.loads((root / "results/bench/layer_h200.json").read_text())
    assert merged["source"] == ["h200/call1/bench_layer.json", "h200/call2/bench_layer.json"]
    assert merged["sources"]["dense"] == {"bf16": merged["source"][0], "mxfp4": merged["source"][0],
                                          "mxfp4+fallback": merged["source"][1]}
    dense = json.loads((root / "results/gpu/gpu_smoke_dense_h100.json").read_text())
    assert [r["results"] for r in dense["runs"]] == ["h100/call1/results", "h100/call2/results"]
    assert (root / "results/gpu/gpu_smoke_moe_h100.json").is_file()
    assert json.loads((root / "results/gpu/targets_h200.json").read_text())["device_calls"] == ["h200/call1",
                                                                                              "h200/call2"]
    assert not (root / "results/gpu/calls").exists()  # the raw dumps stay out of the tree
    four = call("four", {"bench_layer.json": relayer},
                [("bf16", [50.0, 5.0, 5.0]), ("mxfp4+macro", [90.0, 6.5, 6.5])])
    stored_bench = json.dumps({**bench, "device": "NVIDIA H100 80GB HBM3", "rows": [{**memory, "fraction": 0.5}]})
    (root / "results/bench/bench_h100.json").write_text(stored_bench)   # kernels timed before any collected call
    h200_before = (root / "results/gpu/targets_h200.json").read_text()
    with pytest.raises(ValueError, match="inside the repository"):
        collect.collect([four], root, keep=root / "calls")
    keep = tmp_path / "kept"
    later = {t["target"]: (t["value"], t["met"]) for t in collect.collect([four], root, keep)["h100"]}  # later
    assert (keep / "h100/call3/steps.tsv").is_file()                                      # kept outside, if asked
    assert later["mxfp4+macro step / bf16 step"] == (pytest.approx(1.3), True)          # its own call's bf16
    assert later["mxfp4 step / bf16 step"] == (pytest.approx(1.2), True)                # the stored runs still count
    assert later["MoE grouped MXFP4 step / bf16 step, qwen3-30b-a3b layers"] == (1.4, True)   # the stored slice
    assert later["triton quantize (axis -1) / copy bandwidth at 8192x4096"] == (0.5, False)   # judged as stored
    assert later["the suite's CUDA tests pass (pytest -m gpu)"] == h100["the suite's CUDA tests pass (pytest -m gpu)"]
    assert (root / "results/bench/bench_h100.json").read_text() == stored_bench
    dense = json.loads((root / "results/gpu/gpu_smoke_dense_h100.json").read_text())
    assert [r["results"] for r in dense["runs"]] == [f"h100/call{n}/results" for n in (1, 2, 3)]
    layers = json.loads((root / "results/bench/layer_h100.json").read_text())
    assert layers["sources"]["dense"] == {"mxfp4+fallback": "h100/call3/bench_layer.json"}
    assert (root / "results/gpu/targets_h200.json").read_text() == h200_before   # reported anew: nothing new there
    anew = {t["target"]: (t["value"], t["met"]) for t in collect.collect([], root)["h100"]}   # from the stored reports
    assert anew == later
    with pytest.raises(FileNotFoundError, match="not a gpu_session.sh call"):
        collect.collect([tmp_path / "one" / "work" / "results"], root)


def test_the_stored_reports_merge_calls_one_session_at_a_time_as_all_at_once(tmp_path):
    """Collecting a device's calls a session at a time gives the files that collecting them all at once gives: the
    stored reports are the record each later session merges into."""
    import tarfile

    collect = kernels_script("collect_gpu_session")
    memory = {"kind": "memory", "path": "triton quantize", "shape": [8192, 4096], "axis": -1, "seconds": 1.0,
              "fraction": 0.9}

    def call(name, files, cells=()):
        out, work = tmp_path / name / "out", tmp_path / name / "work"
        out.mkdir(parents=True)
        work.mkdir()
        for recipe, times in cells:
            smoke_cell(work / "results", recipe, times)
        with tarfile.open(out / "session.tgz", "w:gz") as tar:
            tar.add(work, arcname=".")
        for f, content in {"stack.json": {"device": "NVIDIA H200", "torch": "2.11.0"}, **files}.items():
            (out / f).write_text(json.dumps(content))
        return out

    def bench(fraction, command):
        return {"device": "NVIDIA H200", "versions": {"torch": "2.11.0"}, "method": "do_bench", "command": command,
                "rows": [{**memory, "fraction": fraction}], "ratios": {}}

    def layer(us):
        return {"device": "cuda", "layers": {"dense": {"mxfp4": {"decode": {"quantizer_host_us_per_call": us}}}}}

    calls = [call("a", {"bench_memory1.json": bench(0.5, "a"), "bench_layer.json": layer(90.0)},
                  [("bf16", [50.0, 2.0, 2.0]), ("mxfp4", [90.0, 2.6, 2.6])]),
             call("b", {"bench_gemm.json": bench(0.7, "b")}, [("bf16", [50.0, 3.0, 3.0])]),
             call("c", {"bench_memory1.json": bench(0.95, "c"), "bench_layer.json": layer(40.0)},
                  [("bf16", [50.0, 2.0, 2.0]), ("mxfp4+aqn", [90.0, 2.4, 2.4])])]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    collect.collect(calls, whole)
    collect.collect(calls[:1], parts)
    collect.collect(calls[1:], parts)
    files = sorted(p.relative_to(whole) for p in whole.rglob("*.json"))
    assert files == sorted(p.relative_to(parts) for p in parts.rglob("*.json"))
    for f in files:
        assert (whole / f).read_text() == (parts / f).read_text(), f
    targets = {t["target"]: t["value"] for t in json.loads((whole / "results/gpu/targets_h200.json").read_text())
               ["targets"]}
    assert targets["triton quantize (axis -1) / copy bandwidth at 8192x4096"] == 0.95   # the last call's timing
    assert targets["dense layer, mxfp4, decode: host us per quantizer call"] == 40.0


def test_the_stats_patch_the_device_times_applies_to_this_tree_whole(tmp_path):
    """gpu_session.sh's stats-patch step applies kernels/gpu/patches/stats_fewer_instructions.patch, times it and
    reverts it. A reformatted kernel breaks its hunks silently (patch(1) leaves the hunks that applied), so the
    step applies all or nothing, and this holds the patch to the tree, both ways."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    patch = root / "kernels" / "gpu" / "patches" / "stats_fewer_instructions.patch"
    kernels = tmp_path / "mxfp4" / "numerics" / "triton_kernels.py"
    kernels.parent.mkdir(parents=True)
    shutil.copyfile(root / "mxfp4" / "numerics" / "triton_kernels.py", kernels)
    original = kernels.read_text()
    subprocess.run(["git", "apply", str(patch)], cwd=tmp_path, check=True, capture_output=True)
    assert "_run_energy" in kernels.read_text()
    subprocess.run(["git", "apply", "-R", str(patch)], cwd=tmp_path, check=True, capture_output=True)
    assert kernels.read_text() == original


def test_the_gpu_session_runs_every_gpu_smoke_recipe_each_half_against_its_own_bf16():
    import re

    script = (Path(__file__).resolve().parents[2] / "kernels" / "gpu" / "gpu_session.sh").read_text()
    halves = [line.split() for line in re.findall(r"smoke-dense\d\) smoke_dense ([^;]+);;", script)]
    assert len(halves) == 2 and all(half[0] == "bf16" for half in halves)
    assert set().union(*halves) == set(load_profile("gpu-smoke-quick").recipes)
    (named,) = re.findall(r'^SMOKE_RECIPES="([^"]+)"', script, flags=re.M)   # what a smoke:<recipes> step accepts
    assert sorted(named.split()) == sorted(load_profile("gpu-smoke-quick").recipes)


@pytest.mark.slow
def test_the_gpu_session_returns_what_the_device_tool_can_bring_back(tmp_path):
    """The device tool brings back at most 8 files of $OUT, 16 MiB each, two folders deep, named in letters,
    digits, '.', '_' and '-': the session keeps its work apart and publishes flat files and one archive."""
    import re
    import subprocess
    import tarfile

    root = Path(__file__).resolve().parents[2]
    out, work = tmp_path / "out", tmp_path / "work"
    env = session_env(out, work)
    done = subprocess.run(["bash", "kernels/gpu/gpu_session.sh", "stack", "checks"], cwd=root,
                          env={**env, "DEADLINE_S": "1"}, capture_output=True, text=True,
                          timeout=60)  # a deadline already past: both skipped
    assert "step stack skipped" in done.stderr and "step checks skipped" in done.stderr
    typo = subprocess.run(["bash", "kernels/gpu/gpu_session.sh", "stack", "smoke-dense"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)
    assert typo.returncode == 2 and "unknown step 'smoke-dense'" in typo.stderr  # refused before any step runs
    for step, why in (("smoke:mxfp4+al", "unknown recipe 'mxfp4+al'"), ("smoke:", "names no recipe"),
                      ("smoke:bf16,mxfp4", "bf16 runs first")):
        refused = subprocess.run(["bash", "kernels/gpu/gpu_session.sh", "stack", step], cwd=root,
                                 env=session_env(tmp_path / "refused", work), capture_output=True, text=True,
                                 timeout=60)
        assert refused.returncode == 2 and why in refused.stderr and not (tmp_path / "refused").exists()
    for knob, value in (("DEADLINE_S", "8m"), ("SMOKE_CELL_CAP_S", "290.5")):
        refused = subprocess.run(["bash", "kernels/gpu/gpu_session.sh", "stack"], cwd=root,
                                 env={**session_env(tmp_path / "refused", work), knob: value}, capture_output=True,
                                 text=True, timeout=60)
        assert refused.returncode == 2 and f"{knob}='{value}' is not a whole number" in refused.stderr
        assert not (tmp_path / "refused").exists()
    picked = subprocess.run(["bash", "kernels/gpu/gpu_session.sh", "smoke:mxfp4+all,mxfp4+macro"], cwd=root,
                            env={**env, "DEADLINE_S": "1"}, capture_output=True, text=True, timeout=60)
    assert picked.returncode == 0 and "step smoke:mxfp4+all,mxfp4+macro skipped" in picked.stderr
    bare = subprocess.run(["bash", "kernels/gpu/gpu_session.sh", "stack"], cwd=root,
                          env=session_env(tmp_path / "bare", work, wheels=tmp_path), capture_output=True, text=True,
                          timeout=60)  # no bundle carried: every step would die at its first import
    assert bare.returncode == 3 and "no wheels in" in bare.stderr and not (tmp_path / "bare" / "steps.tsv").exists()
    subprocess.run(["bash", "kernels/gpu/gpu_session.sh", "stack"], cwd=root, env=env, capture_output=True, text=True,
                   timeout=300, check=True)
    files = sorted(p.name for p in out.iterdir())
    assert files == ["session.tgz", "stack.json", "steps.tsv"] and all(p.is_file() for p in out.iterdir())
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in files)
    assert json.loads((out / "stack.json").read_text())["torch"] == torch.__version__
    with tarfile.open(out / "session.tgz") as archive:
        assert {"./stack_requirements.json", "./stack.err", "./steps.tsv"} <= set(archive.getnames())
    steps = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()]
    assert [s[:2] for s in steps] == [["stack", "skipped"], ["checks", "skipped"],
                                      ["smoke:mxfp4+all,mxfp4+macro", "skipped"], ["stack", "0"]]


def test_a_call_whose_every_step_failed_is_still_placed_by_nvidia_smis_device_name(tmp_path):
    """stack.json and every report missing (each step died): the device comes from the device.csv that
    gpu_session.sh writes before any step, so the other calls are still collected."""
    collect = kernels_script("collect_gpu_session")
    folder = tmp_path / "call"
    folder.mkdir()
    (folder / "device.csv").write_text("name, clocks.max.sm [MHz], clocks.max.memory [MHz]\n"
                                       "NVIDIA H200, 1980 MHz, 3201 MHz\n")
    assert collect.call_device(folder) == "NVIDIA H200"
    (folder / "device.csv").write_text("name, clocks.max.sm [MHz], clocks.max.memory [MHz]\n")
    with pytest.raises(ValueError, match="or device.csv"):
        collect.call_device(folder)


def test_the_tests_steps_status_is_pytests(tmp_path):
    """A failing or killed pytest is the step's status in steps.tsv (not that of the tail printed after it)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").write_text(f'#!/bin/sh\ncase "$*" in *pytest*) echo "1 failed"; exit 5;; esac\n'
                                  f'exec {sys.executable} "$@"\n')
    (shim / "python3").chmod(0o755)
    out, work = tmp_path / "out", tmp_path / "work"
    env = session_env(out, work)
    env["PATH"] = f"{shim}:{env['PATH']}"
    subprocess.run(["bash", "kernels/gpu/gpu_session.sh", "tests"], cwd=root, env=env, capture_output=True, text=True,
                   timeout=120)
    assert (out / "steps.tsv").read_text().split("\t")[:2] == ["tests", "5"]


def test_the_collector_neither_decides_a_moe_target_against_fp32_masters_nor_drops_a_killed_test_step(tmp_path):
    """A MoE report whose baseline ran fp32 master weights (no baseline_weights) leaves its target undecided;
    a tests step killed before pytest's summary (a log, no JUnit XML) misses its target with the count so far."""
    collect = kernels_script("collect_gpu_session")
    row = {"case": "real", "grouped_over_bf16": 0.4, "target_grouped_over_bf16": 1.5, "meets_target": True}
    old, new = {"rows": [row]}, {"rows": [row], "baseline_weights": "compute dtype"}
    (undecided,) = collect.moe_targets(old, "m")
    assert undecided["met"] is None and "fp32" in undecided["why_undecided"]
    assert collect.moe_targets(new, "m")[0]["met"] is True
    call = tmp_path / "call1"
    call.mkdir()
    full_line = "." * 60 + "E" + "." * 11 + " [ 55%]"  # pytest -q writes the share done at a full line's end
    (call / "tests_gpu.log").write_text(f"bringing up nodes...\n\n{full_line}\n...F.s\n")
    (got,) = collect.device_checks([("h100/call1", call)])
    assert got["met"] is False and got["value"] == "stopped before its summary: 75 passed, 1 failed, 1 errors so far"


@pytest.mark.slow
def test_a_killed_verbose_test_step_names_its_failures_and_the_tests_that_never_finished(tmp_path):
    """Under pytest -v (xdist's form and the plain one) each finished test is named; the row lists the
    failed ones and, against the suite's collected CUDA tests, the ones the cut left unfinished."""
    collect = kernels_script("collect_gpu_session")
    ids = collect.gpu_test_ids()
    assert len(ids) > 3 and all("::" in t for t in ids)
    lines = ["bringing up nodes...", f"8 workers [{len(ids)} items]"]
    lines += [f"[gw{i % 8}] [{100 * (i + 1) // len(ids):3d}%] PASSED {t} " for i, t in enumerate(ids[:-3])]
    lines += [f"[gw1] [ 97%] FAILED {ids[-3]} ", f"{ids[-2]} ERROR [ 98%]"]
    call = tmp_path / "call1"
    call.mkdir()
    (call / "tests_gpu.log").write_text("\n".join(lines) + "\n")
    (got,) = collect.device_checks([("h100/call1", call)])
    assert got["value"] == f"stopped before its summary: {len(ids) - 3} passed, 1 failed, 1 errors so far"
    assert got["failed"] == sorted(ids[-3:-1]) and got["not_finished"] == [ids[-1]] and got["met"] is False


@pytest.mark.slow
def test_the_layer_bench_reports_host_device_quantizer_calls_and_launches_per_recipe_and_phase(tmp_path):
    """On CPU, the dense layer (the real shape) at 8 tokens: each recipe has both phases with positive times, the
    quantizer's calls counted (none for bf16) and the reference's ratio 1; the fused corrections' and the shared
    inputs' switches are recorded, each layer quantizing its own input without the second."""
    bench = kernels_script("bench_layer")
    out = tmp_path / "layer.json"
    assert bench.main(["--out", str(out), "--reps", "1", "--tokens", "8", "--layers", "dense", "--recipes", "bf16",
                       "mxfp4+fallback", "--fused-corrections", "off"]) == 0
    report = json.loads(out.read_text())
    assert report["settings"]["fused_corrections"] == "off" and set(report["layers"]) == {"dense"}
    rows = report["layers"]["dense"]
    assert rows["bf16"]["train"]["quantizer_calls"] == 0 and rows["bf16"]["train"]["device_vs_reference"] == 1
    dense = rows["mxfp4+fallback"]
    for phase in ("decode", "train"):
        assert dense[phase]["host_ms"] > 0 and dense[phase]["launches"] > 0
        assert dense[phase]["quantizer_host_us_per_call"] > 0
    # the inputs of the 7 Linears, q/k/v's and gate/up's quantized once (4); the weights stay cached while decoding
    assert dense["decode"]["quantizer_calls"] == 4
    assert dense["train"]["quantizer_calls"] == 7 * 4 + 4 * 2  # weight on both axes, dY twice; x, x along tokens
    assert bench.main(["--out", str(out), "--reps", "1", "--tokens", "8", "--layers", "dense", "--recipes", "bf16",
                       "mxfp4+fallback", "--shared-inputs", "off"]) == 0
    report = json.loads(out.read_text())
    alone = report["layers"]["dense"]["mxfp4+fallback"]
    assert report["settings"]["shared_inputs"] == "off"
    assert alone["decode"]["quantizer_calls"] == 7 and alone["train"]["quantizer_calls"] == 7 * 6  # each its own


def test_the_cpu_kernel_bench_leaves_out_the_compile_peer_when_asked_and_keeps_every_other_path(tmp_path):
    """--no-compile (the main job's short benchmark) drops only the torch.compile row and its ratio; the fused
    rows still equal the reference bit for bit."""
    bench = kernels_script("bench_kernels")
    out = tmp_path / "bench.json"
    assert bench.main(["--out", str(out), "--device", "cpu", "--shapes", "64x128", "--runs", "1", "--reps", "1",
                       "--no-compile"]) == 0
    report = json.loads(out.read_text())
    paths = {r["path"] for r in report["rows"]}
    assert not any("torch.compile" in p for p in paths) and not any("torch.compile" in k for k in report["ratios"])
    for dtype in ("float32", "bfloat16"):
        assert {f"cells' path (fused) fake_quantize, {dtype}", f"reference fake_quantize, {dtype}"} <= paths
    fused = [r for r in report["rows"] if r["path"].startswith("cells' path")]
    assert len(fused) == 4 and all(r["equals_reference"] for r in fused)
    assert "fused_vs_reference@64x128@float32" in report["ratios"]

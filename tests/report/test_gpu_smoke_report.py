"""The GPU smoke report: each recipe timed against its own run's bf16, net of the autotuning."""


import pytest

from gpu_fixtures import smoke_cell
from mxfp4.layout import Layout


def test_the_gpu_smoke_report_times_each_recipe_against_its_own_runs_bf16(tmp_path):
    from mxfp4.report.gpu_smoke import report

    a, b = tmp_path / "a", tmp_path / "b"
    smoke_cell(a, "bf16", [50.0, 2.0, 4.0], peak=40.0)     # median after the first step: 3.0
    smoke_cell(a, "mxfp4", [90.0, 3.6, 3.6], peak=60.0)    # 3.6 / 3.0 = 1.2 <= 1.3
    smoke_cell(a, "mxfp4+macro", [], log="Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory")
    smoke_cell(b, "bf16", [50.0, 4.0, 4.0])                # a slower machine: 4.0
    smoke_cell(b, "mxfp4+fallback", [90.0, 6.8, 6.8])      # 6.8 / 4.0 = 1.7 > 1.4 (against a's bf16: 2.27)
    plan = {"profile": "gpu-smoke-quick", "method": "FakeTensorMode", "recipes": {"mxfp4": {"peak_gib": 71.3}}}
    recipes = ["bf16", "mxfp4", "mxfp4+macro", "mxfp4+fallback", "mxfp4+aqn"]
    rec = report([Layout(a, "gpu-smoke-quick"), Layout(b, "gpu-smoke-quick")], "qwen2.5-3b-random", recipes, 0, plan)
    got = rec["recipes"]
    assert got["mxfp4"]["step_time_vs_bf16"] == pytest.approx(1.2) and got["mxfp4"]["meets_target"] is True
    assert got["mxfp4+fallback"]["step_time_vs_bf16"] == pytest.approx(1.7)
    assert got["mxfp4+fallback"]["meets_target"] is False and got["mxfp4+fallback"]["run"] == 1
    assert got["mxfp4"]["rollout_time_vs_bf16"] == pytest.approx(1.2)
    assert got["mxfp4"]["measured_over_planned_peak"] == pytest.approx(60.0 / 71.3)
    assert got["mxfp4"]["peak_reserved_gib"] == 62.0 and got["mxfp4+fallback"]["peak_reserved_gib"] is None
    assert "OutOfMemoryError" in got["mxfp4+macro"]["log_tail"] and rec["failed"] == ["mxfp4+macro"]
    assert rec["not_run"] == ["mxfp4+aqn"] and got["bf16"]["run"] == 0
    assert rec["bf16_step_time_a_a"] == {"step_time_s": [3.0, 4.0], "max_over_min": pytest.approx(4 / 3)}
    assert rec["device"] == "NVIDIA H100 80GB HBM3"
    other = report([Layout(a, "gpu-smoke-quick")], "qwen2.5-3b-random", recipes, 0, {**plan, "profile": "gpu-smoke"})
    assert "planned_peak_gib" not in other["recipes"]["mxfp4"] and "not compared" in other["memory_plan"]


def test_a_recipe_that_finished_in_a_later_run_stands_over_its_earlier_failure(tmp_path):
    from mxfp4.report.gpu_smoke import report

    early, late = tmp_path / "early", tmp_path / "late"
    smoke_cell(early, "bf16", [50.0, 3.0, 3.0])
    smoke_cell(early, "mxfp4+macro", [], log="cut at the call's deadline")
    smoke_cell(late, "bf16", [50.0, 5.0, 5.0])
    smoke_cell(late, "mxfp4+macro", [90.0, 6.0, 6.0], commit="b" * 40)   # against late's bf16: 1.2 (early's: 2.0)
    rec = report([Layout(early, "gpu-smoke-quick"), Layout(late, "gpu-smoke-quick")], "qwen2.5-3b-random",
                 ["bf16", "mxfp4+macro"])
    # the late run's provenance is its first finished cell's (bf16), not the header's first run's
    assert [r["git_commit"] for r in rec["runs"]] == ["a" * 40, "a" * 40] and rec["git_commit"] == "a" * 40
    smoke_cell(late / "other", "bf16", [50.0, 5.0, 5.0], commit="b" * 40)
    mixed = report([Layout(early, "gpu-smoke-quick"), Layout(late / "other", "gpu-smoke-quick")], "qwen2.5-3b-random",
                   ["bf16", "mxfp4+macro"])
    assert mixed["git_commit"] == ["a" * 40, "b" * 40] and mixed["runs"][1]["git_commit"] == "b" * 40
    got = rec["recipes"]["mxfp4+macro"]
    assert got["status"] == "ok" and got["run"] == 1 and got["step_time_vs_bf16"] == pytest.approx(1.2)
    assert rec["failed"] == [] and rec["recipes"]["bf16"]["run"] == 0
    assert rec["runs"][0]["recipes"]["mxfp4+macro"]["status"] == "failed"   # the failure stays on record


def test_the_gpu_smoke_report_times_steps_net_of_the_autotuning_inside_them(tmp_path):
    """A timed step that met a new shape bucket tuned it: its time counts net of that tuning, else one retune
    of three steps decides the median (here 9.6 s raw: 1.2x BF16 net, 2.2x raw)."""
    from mxfp4.report.gpu_smoke import report

    smoke_cell(tmp_path, "bf16", [50.0, 3.0, 3.0])
    smoke_cell(tmp_path, "mxfp4", [90.0, 3.6, 9.6], autotune=[(80.0, 20.0, 40), (0.0, 0.0, 0), (6.0, 3.0, 3)])
    rec = report([Layout(tmp_path, "gpu-smoke-quick")], "qwen2.5-3b-random", ["bf16", "mxfp4"])["recipes"]["mxfp4"]
    assert rec["step_time_s"] == pytest.approx(3.6) and rec["step_time_vs_bf16"] == pytest.approx(1.2)
    assert rec["rollout_time_s"] == pytest.approx(1.8) and rec["rollout_time_vs_bf16"] == pytest.approx(1.2)
    assert rec["autotuning_in_timed_steps"] == {"seconds": pytest.approx(6.0), "keys": 3}  # step 1's not counted
    assert rec["meets_target"] is True and rec["timed_steps"] == 2


def test_a_smoke_cell_whose_gradient_was_zero_at_every_step_fails(tmp_path):
    """Zero advantages make a backward of zeros: its step time is not the work the targets are about."""
    from mxfp4.report.gpu_smoke import report

    smoke_cell(tmp_path, "bf16", [50.0, 3.0, 3.0])
    smoke_cell(tmp_path, "mxfp4", [90.0, 3.6, 3.6], grad_norm=0.0)
    rec = report([Layout(tmp_path, "gpu-smoke-quick")], "qwen2.5-3b-random", ["bf16", "mxfp4"])
    assert rec["failed"] == ["mxfp4"] and "gradient norm is 0 at every one of 3 steps" in rec["recipes"]["mxfp4"]["why"]
    assert rec["recipes"]["bf16"]["status"] == "ok" and rec["recipes"]["bf16"]["zero_gradient_steps"] == 0


def test_a_cell_that_died_after_logging_a_step_reports_that_steps_gradient_norm(tmp_path):
    """A cell that died in its second step (a NaN gradient at the first made every weight NaN, and sampling
    asserted): the report carries the first step's row beside the trace."""
    import json
    import math

    from mxfp4.layout import TRAIN_LOG, Layout
    from mxfp4.report.gpu_smoke import report

    layout = Layout(tmp_path, "gpu-smoke-quick")
    smoke_cell(tmp_path, "bf16", [], log="torch.AcceleratorError: CUDA error: device-side assert triggered")
    cell = layout.cell("qwen2.5-3b-random", "bf16", 0)
    cell.mkdir(parents=True)
    (cell / TRAIN_LOG).write_text(json.dumps({"step": 1, "loss": 0.0, "grad_norm": float("nan")}) + "\n")
    got = report([Layout(tmp_path, "gpu-smoke-quick")], "qwen2.5-3b-random", ["bf16"])["recipes"]["bf16"]
    assert got["status"] == "failed" and "device-side assert" in got["log_tail"]
    last = got["last_logged_step"]
    assert last["step"] == 1 and math.isnan(last["grad_norm"])


def test_a_cell_cut_in_its_evaluations_after_its_steps_is_failed_with_its_steps_timed(tmp_path):
    """A call's deadline that cuts a cell in its evaluations leaves every training step logged: the cell has
    failed (no metrics), and its steps are still timed against the run's bf16, the rollout too."""
    from mxfp4.layout import METRICS, Layout
    from mxfp4.report.gpu_smoke import report

    layout = Layout(tmp_path, "gpu-smoke-quick")
    smoke_cell(tmp_path, "bf16", [50.0, 3.0, 3.0])
    smoke_cell(tmp_path, "mxfp4+fallback", [90.0, 6.0, 9.0])
    (layout.cell("qwen2.5-3b-random", "mxfp4+fallback", 0) / METRICS).unlink()
    log = layout.cell_log("qwen2.5-3b-random", "mxfp4+fallback", 0)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("Running generate_until requests")
    rec = report([Layout(tmp_path, "gpu-smoke-quick")], "qwen2.5-3b-random", ["bf16", "mxfp4+fallback"])
    got = rec["recipes"]["mxfp4+fallback"]
    assert rec["failed"] == ["mxfp4+fallback"] and got["timed_steps"] == 2
    assert got["step_time_vs_bf16"] == pytest.approx(2.5) and got["meets_target"] is False
    assert got["rollout_time_vs_bf16"] == pytest.approx(2.5) and got["meets_rollout_target"] is False

"""A profile's ``report_to`` reaches TRL's config as any TRL run's would, and records nothing in a cell's setting."""

import os

from mxfp4.config.profiles import load_profile, setting_hash
from mxfp4.config.run import Run
from mxfp4.rl.cell import grpo_args, plan_cell


def test_a_profiles_report_to_reaches_trls_config_and_not_the_setting(smoke_results, monkeypatch):
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", "elsewhere")  # restored after the test
    plain = load_profile("smoke")
    profile = plain.model_copy(update={"report_to": ["tensorboard"]})
    plan = plan_cell(Run.of(profile, smoke_results).cell("tiny-dense", "bf16", 0))
    args = grpo_args(plan, plan.out / "checkpoints")
    assert args.report_to == ["tensorboard"]
    assert os.environ["TENSORBOARD_LOGGING_DIR"] == str(plan.out / "tensorboard")
    plain_plan = plan_cell(Run.of(plain, smoke_results).cell("tiny-dense", "bf16", 0))
    assert grpo_args(plain_plan, plan.out / "c").report_to == []
    assert setting_hash(profile, "tiny-dense") == setting_hash(plain, "tiny-dense")

"""Every field of a profile's ``grpo`` block reaches TRL's GRPOConfig through the cell's one translation
(``rl.cell.grpo_args`` -> ``rl.training.grpo_config``) or is named as the harness's own."""

from mxfp4.config.profiles import GRPOSettings, load_profile
from mxfp4.config.run import Run
from mxfp4.rl.cell import grpo_args, plan_cell
from mxfp4.rl.training import HARNESS_FIELDS, TRL_FIELDS

# distinctive values, each unlike the smoke profile's and TRL's defaults
CHANGED = {"max_steps": 7, "learning_rate": 3.25e-5, "num_generations": 3, "prompts_per_step": 4,
           "micro_batch_size": 6, "max_completion_length": 33, "temperature": 0.85, "beta": 0.0125,
           "loss_type": "bnpo", "router_aux_loss_coef": 0.0075, "gradient_checkpointing": True, "save_steps": 5}


def test_every_grpo_field_is_declared_once():
    assert set(TRL_FIELDS) | set(HARNESS_FIELDS) == set(GRPOSettings.model_fields)
    assert not set(TRL_FIELDS) & set(HARNESS_FIELDS)
    assert set(CHANGED) | {"rollout"} == set(TRL_FIELDS)  # each TRL field is checked below


def test_each_trl_field_of_the_profile_reaches_grpo_config(smoke_results):
    plain = load_profile("smoke")
    profile = plain.model_copy(update={"grpo": plain.grpo.model_copy(update=CHANGED)})
    plan = plan_cell(Run.of(profile, smoke_results).cell("tiny-dense", "bf16", 0))
    args = grpo_args(plan, plan.out / "checkpoints")
    for field in ("max_steps", "learning_rate", "num_generations", "max_completion_length", "temperature", "beta",
                  "loss_type", "router_aux_loss_coef", "gradient_checkpointing", "save_steps"):
        assert getattr(args, field) == CHANGED[field], field
    assert args.per_device_train_batch_size == 6 and args.gradient_accumulation_steps == 2  # 4 prompts x 3 = 12
    assert args.save_strategy == "steps" and args.use_vllm is False  # rollout: hf
    base = grpo_args(plan_cell(Run.of(plain, smoke_results).cell("tiny-dense", "bf16", 0)), plan.out / "c")
    assert all(getattr(base, f) != CHANGED[f] for f in ("max_steps", "learning_rate", "temperature", "beta"))

"""TrainingArguments that SFT and GRPO share in this harness.

Precision: the master weights and the optimizer state stay float32 (the cell loads them so); with
``compute="bfloat16"`` the forward and backward run under bf16 autocast (``bf16=True``: accelerate's
mixed precision, or the mixed-precision policy of FSDP2 / DeepSpeed in a launch config). On CPU the
default, float32 compute, is what every CPU profile runs (TRL 1.x defaults would turn bf16 on).
"""

from __future__ import annotations

import atexit
import contextlib
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch


def checkpointing_args(enabled: bool, fields: set[str] | None = None) -> dict:
    """TrainingArguments for non-reentrant activation recomputation, under the name the installed
    transformers takes (``fields``: its TrainingArguments fields): ``activation_checkpointing`` in
    recent versions, ``gradient_checkpointing`` in older ones (5.17, the GPU machines')."""
    if fields is None:
        import dataclasses

        from transformers import TrainingArguments

        fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    kwargs = {"use_reentrant": False} if enabled else None
    for name in ("activation_checkpointing", "gradient_checkpointing"):
        if name in fields:
            return {name: enabled, f"{name}_kwargs": kwargs}
    raise ValueError("the installed transformers' TrainingArguments has neither activation_checkpointing nor "
                     "gradient_checkpointing; accepted: transformers >= 4.57")


def finite_attention_gradients() -> None:
    """Keep masked attention off cuDNN's SDPA kernel. Its Hopper backward (the default backend from torch
    2.11) returns NaN in grad_q when the sequence length is 64 mod 128 and a query row's logsumexp is under
    ln(FLT_MAX), which every left-padded row of a GRPO batch is (pytorch/pytorch#196678); the loss stays
    finite, the gradient norm is NaN and the next rollout samples from NaN weights. With the
    memory-efficient kernel in its place every step of the H100 smoke cells had a finite gradient."""
    torch.backends.cuda.enable_cudnn_sdp(False)


SAVE_TOTAL_LIMIT = 2  # checkpoints kept; one more exists while the newest is written, before rotation
CHECKPOINT_BYTES_PER_PARAMETER = 12  # fp32 master weight + AdamW's two fp32 moments


def checkpoint_disk(parameters: int, save_steps: int | None) -> dict:
    """The disk a cell's checkpoints take at most: (save_total_limit + 1) copies of the weights and the
    Adam state, in GiB (0 without checkpoints)."""
    each = parameters * CHECKPOINT_BYTES_PER_PARAMETER / 2**30
    copies = SAVE_TOTAL_LIMIT + 1 if save_steps else 0
    return {"parameters": parameters, "gib_per_checkpoint": each, "copies": copies, "gib": each * copies}


def scratch_folder() -> str:
    """A throwaway output folder for a trainer that saves nothing, removed when the process exits (a probe trainer
    is built per seed and batch: the folders would otherwise pile up in the temporary directory)."""
    folder = tempfile.mkdtemp(prefix="mxfp4-trainer-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def common_args(seed: int, *, compute: str = "float32", output_dir: Path | str | None = None,
                save_steps: int | None = None, gradient_checkpointing: bool = False, report_to=()) -> dict:
    """Seeded data order, progress bars on, the trackers of ``report_to`` (TRL's; none by default).
    ``output_dir`` (with ``save_steps``) is where checkpoints go; without it the trainer writes to a
    throwaway temporary folder and saves nothing.
    ``gradient_checkpointing`` is non-reentrant (it composes with the patched layers' autograd
    function and with DDP / FSDP2). On a GPU it also keeps attention off cuDNN
    (``finite_attention_gradients``) for every trainer built from these arguments."""
    if compute not in ("float32", "bfloat16"):
        raise ValueError(f"compute must be float32 or bfloat16, got {compute!r}")
    if save_steps is not None and output_dir is None:
        raise ValueError("save_steps needs an output_dir for the checkpoints")
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        finite_attention_gradients()
    return dict(
        output_dir=str(output_dir) if output_dir is not None else scratch_folder(),
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        save_total_limit=SAVE_TOTAL_LIMIT if save_steps else None,
        report_to=list(report_to),
        seed=seed,
        data_seed=seed,
        bf16=compute == "bfloat16",
        fp16=False,
        **checkpointing_args(gradient_checkpointing),
        use_cpu=not on_gpu,
        dataloader_num_workers=0,
        disable_tqdm=False,
    )


# Where each field of a profile's ``grpo`` block (``GRPOSettings``) goes: TRL's ``GRPOConfig`` argument it becomes
# (``grpo_config``), or the harness's own use of it. A field in neither would be read by nothing.
TRL_FIELDS = {
    "max_steps": "max_steps",
    "learning_rate": "learning_rate",
    "num_generations": "num_generations",
    "prompts_per_step": "per_device_train_batch_size x gradient_accumulation_steps (x processes) / num_generations",
    "micro_batch_size": "per_device_train_batch_size (with accumulation: GRPOSettings.accumulation)",
    "max_completion_length": "max_completion_length",
    "temperature": "temperature",
    "beta": "beta",
    "loss_type": "loss_type",
    "router_aux_loss_coef": "router_aux_loss_coef",
    "gradient_checkpointing": "gradient_checkpointing",
    "save_steps": "save_steps (and save_strategy)",
    "rollout": "use_vllm (and the vllm_* arguments: rl.cell.rollout_settings)",
}
HARNESS_FIELDS = {
    "reward": "the reward function handed to the trainer (rl.training.build_trainer)",
    "checkpoint_disk_gib": "the disk budget checked before a cell starts (rl.cell)",
}


def grpo_config(grpo, seed: int, *, micro_batch: int, accumulation: int = 1, max_steps: int | None = None,
                beta: float | None = None, rollout: dict | None = None, **common):
    """TRL's ``GRPOConfig`` from a profile's GRPO settings (``GRPOSettings``): the one place a GRPO
    run of this harness is configured. ``micro_batch`` sequences per device per forward/backward,
    ``accumulation`` micro-batches per step; ``max_steps`` and ``beta`` override the profile's;
    ``rollout``: the rollout backend's arguments (default: generate through the model itself);
    ``common``: what ``common_args`` takes (compute, output_dir, save_steps, gradient_checkpointing)."""
    from trl import GRPOConfig

    return GRPOConfig(
        max_steps=grpo.max_steps if max_steps is None else max_steps,
        learning_rate=grpo.learning_rate,
        lr_scheduler_type="constant",
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=accumulation,
        num_generations=grpo.num_generations,
        max_completion_length=grpo.max_completion_length,
        temperature=grpo.temperature,
        top_k=0,
        beta=grpo.beta if beta is None else beta,
        loss_type=grpo.loss_type,
        router_aux_loss_coef=grpo.router_aux_loss_coef,
        logging_steps=1,
        **common_args(seed, **common),
        **(rollout or {"use_vllm": False}),
    )


@contextlib.contextmanager
def preserved_rng():
    """Python's, NumPy's and torch's (CPU and CUDA) random states restored on exit: lm-eval reseeds
    all three, and an evaluation before training must not change what training draws."""
    py, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count()))):
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(np_state)

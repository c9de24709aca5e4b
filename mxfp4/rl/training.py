"""TrainingArguments that SFT and GRPO share in this harness."""

from __future__ import annotations

import tempfile

import torch


def common_args(seed: int) -> dict:
    """No checkpoints or trackers (the trainer's output folder is a throwaway temporary one); full
    precision and no gradient checkpointing on CPU (TRL 1.x defaults turn on bf16 and gradient
    checkpointing); seeded data order; progress bars on."""
    on_gpu = torch.cuda.is_available()
    return dict(
        output_dir=tempfile.mkdtemp(prefix="mxfp4-trainer-"),
        save_strategy="no",
        report_to=[],
        seed=seed,
        data_seed=seed,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=not on_gpu,
        dataloader_num_workers=0,
        disable_tqdm=False,
    )

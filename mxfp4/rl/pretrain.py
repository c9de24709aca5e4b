"""Warm-start the tiny stand-ins with TRL's SFTTrainer on the embedded problems, then save them.

RL needs a policy that already solves a useful share of its problems; the tiny random-init models
solve none. The saved folder loads back like any checkpoint (``mxfp4.models.load``).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .data import PROMPT, embedded_split
from .models import build_tiny, save
from .training import common_args


def sft_dataset(records: list[dict], eos: str):
    """Prompt-completion records (TRL computes the loss on the completion only)."""
    from datasets import Dataset

    return Dataset.from_list(
        [{"prompt": PROMPT.format(question=r["question"]), "completion": " " + r["answer"] + eos} for r in records]
    )


def greedy_accuracy(model, tokenizer, records: list[dict], max_new_tokens: int = 48, batch_size: int = 64) -> float:
    """Share of problems whose greedy completion ends in the right ``#### n`` (quick check, not the eval)."""
    from .data import is_correct

    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(records), batch_size):
            chunk = records[i : i + batch_size]
            enc = tokenizer([PROMPT.format(question=r["question"]) for r in chunk], return_tensors="pt", padding=True)
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            correct += sum(is_correct(t, r["answer"]) for t, r in zip(texts, chunk))
    return correct / len(records)


def pretrain(arch: str, out: Path | str, steps: int = 600, lr: float = 2e-3, batch_size: int = 32, n_train: int = 8000,
             max_steps_per_problem: int = 2, seed: int = 0, n_check: int = 200) -> dict:
    import datasets
    from trl import SFTConfig, SFTTrainer

    datasets.disable_progress_bars()
    t0 = time.time()
    model, tokenizer = build_tiny(arch, seed=seed)
    train = embedded_split("train", n_train, seed=seed, max_steps=max_steps_per_problem)
    config = SFTConfig(
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=lr,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, steps // 20),
        weight_decay=0.0,
        logging_steps=max(1, steps // 10),
        **common_args(seed),
        max_length=256,
        # No MoE load-balancing loss: transformers' aux-loss reduction fails on padded SFT batches
        # (attention mask rows != router rows), and 8 tiny experts need no balancing push.
        router_aux_loss_coef=0.0,
    )
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=sft_dataset(train, tokenizer.eos_token), processing_class=tokenizer
    )
    trainer.train()
    test = embedded_split("test", n_check, seed=seed, max_steps=max_steps_per_problem)
    acc = greedy_accuracy(model, tokenizer, test)
    meta = {
        "arch": arch,
        "sft_steps": steps,
        "lr": lr,
        "batch_size": batch_size,
        "seed": seed,
        "embedded_test_greedy_accuracy": acc,
        "n_check": n_check,
        "seconds": time.time() - t0,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    save(model, tokenizer, out, meta)
    return meta

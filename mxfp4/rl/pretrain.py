"""Warm-start the tiny stand-ins with TRL's SFTTrainer on the embedded problems, then save them.

RL needs a policy that already solves a useful share of its problems; the tiny random-init models
solve none. The saved folder loads back like any checkpoint (``mxfp4.models.load``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from ..config.run import Run
from ..io import writable_folder
from ..problems import DEFAULT_FLAWS, embedded_split, flawed_answer
from .data import PROMPT, is_correct
from .models import TINY_LAYERS, WARM_START_META, build_tiny, load, provenance_refusal, save
from .outlier_channels import add_outlier_channels
from .training import common_args


def sft_dataset(records: list[dict], eos: str, flawed_fraction: float = 0.0, seed: int = 0, flaws=DEFAULT_FLAWS):
    """Prompt-completion records (TRL computes the loss on the completion only). With
    ``flawed_fraction``, that share of the problems with a step of a planted flaw (``flaws``; drawn from
    ``seed``) is demonstrated with ``problems.flawed_answer``: the warm start then holds a systematic error
    that the RL reward can correct (``PretrainSettings.flawed_fraction``)."""
    import random

    from datasets import Dataset

    if not 0.0 <= flawed_fraction <= 1.0:
        raise ValueError(f"flawed_fraction {flawed_fraction} is outside [0, 1]")
    rng = random.Random(f"flawed-{seed}")
    rows = []
    for r in records:
        answer = r["answer"]
        if flawed_fraction and rng.random() < flawed_fraction:
            answer = flawed_answer(answer, flaws) or answer
        rows.append({"prompt": PROMPT.format(question=r["question"]), "completion": " " + answer + eos})
    return Dataset.from_list(rows)


def greedy_accuracy(model, tokenizer, records: list[dict], max_new_tokens: int = 48, batch_size: int = 64) -> float:
    """Share of problems whose greedy completion ends in the right ``#### n`` (quick check, not the eval)."""
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


def with_outlier_channels(model, outlier_channels: int, outlier_scale: float, seed: int) -> dict:
    """``outlier_channels`` added to ``model`` in place from ``seed`` (``mxfp4.rl.outlier_channels``) and what
    a warm start's meta records of them: one path for a warm start's own SFT and one made ``--sft-from``."""
    channels = add_outlier_channels(model, outlier_channels, outlier_scale, seed)
    return {"outlier_channels": channels, "outlier_scale": outlier_scale if channels else None}


def pretrain(arch: str, out: Path | str, steps: int = 600, lr: float = 2e-3, batch_size: int = 32, n_train: int = 8000,
             max_steps_per_problem: int = 2, seed: int = 0, n_check: int = 200, layers: int = TINY_LAYERS,
             flawed_fraction: float = 0.0, flaws=DEFAULT_FLAWS, outlier_channels: int = 0,
             outlier_scale: float = 32.0, provenance: dict | None = None, holdout: str = "questions") -> dict:
    """SFT of a tiny stand-in of ``layers`` decoder layers on the embedded problems (``flawed_fraction``
    of the problems with a step of a planted flaw demonstrated wrongly: ``sft_dataset``), from the pretraining
    ``seed`` (its initialisation, problems and flawed draws), its greedy accuracy checked,
    ``outlier_channels`` added (``mxfp4.rl.outlier_channels``; the function unchanged), then saved whole
    with ``provenance`` (the profile's ``warm_start_setting``, which every job that loads it checks). ``holdout``:
    what the problems' held-out side keeps from training (``problems.embedded_split``)."""
    import datasets
    from trl import SFTConfig, SFTTrainer

    datasets.disable_progress_bars()
    t0 = time.time()
    model, tokenizer = build_tiny(arch, seed=seed, layers=layers)
    train = embedded_split("train", n_train, seed=seed, max_steps=max_steps_per_problem, holdout=holdout)
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
        model=model, args=config, train_dataset=sft_dataset(train, tokenizer.eos_token, flawed_fraction, seed, flaws),
        processing_class=tokenizer,
    )
    trainer.train()
    test = embedded_split("test", n_check, seed=seed, max_steps=max_steps_per_problem, holdout=holdout)
    acc = greedy_accuracy(model, tokenizer, test)
    outliers = with_outlier_channels(model, outlier_channels, outlier_scale, seed)
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
        "layers": layers,
        "flawed_fraction": flawed_fraction,
        "flaws": list(flaws),
        **outliers,
        "provenance": provenance,
    }
    save(model, tokenizer, out, meta)
    return meta


def pretrain_model(run: Run, model: str, out: Path | str | None = None, warm_start: int = 0,
                   sft_from: Path | str | None = None) -> dict:
    """Warm start ``warm_start`` (its pretraining seed) of the run's tiny model ``model``, made from the
    profile's settings and saved with them (``Profile.warm_start_setting``) to ``out`` (default: its folder
    in the run). With ``sft_from``, a warm start made from the same SFT without outlier channels
    (``Profile.sft_setting``, checked) has the profile's channels added instead of a new SFT run."""
    profile = run.profile
    spec = profile.model(model)
    if not spec.arch:
        raise ValueError(f"{model!r} is a hub model, not a tiny stand-in; accepted: {', '.join(profile.tiny_models())}")
    profile.check_warm_start(warm_start)
    out = run.layout.model(model, warm_start) if out is None else Path(out)
    try:
        writable_folder(out.parent)  # before the SFT run, not after it
    except OSError as err:
        raise ValueError(f"cannot write the warm start to {out} ({err.strerror or err}); accepted: a writable "
                         "folder (--out, or --results)") from None
    if sft_from is not None:
        return outliers_added(Path(sft_from), out, profile.sft_setting(model, warm_start),
                              profile.pretrain_seed(warm_start),
                              profile.pretrain.outlier_channels, profile.pretrain.outlier_scale,
                              profile.warm_start_setting(model, warm_start))
    settings = profile.pretrain.model_dump(exclude={"warm_starts", "first_seed"})
    return pretrain(spec.arch, out, max_steps_per_problem=profile.data.max_problem_steps,
                    layers=spec.layers or TINY_LAYERS, provenance=profile.warm_start_setting(model, warm_start),
                    seed=profile.pretrain_seed(warm_start), holdout=profile.data.holdout, **settings)


def outliers_added(source: Path, out: Path | str, sft_setting: dict, seed: int, outlier_channels: int,
                   outlier_scale: float, provenance: dict) -> dict:
    """The warm start ``source`` (made from ``sft_setting``: checked) with ``outlier_channels`` added from the
    pretraining ``seed``, as ``pretrain`` adds them after its SFT, saved to ``out`` with ``provenance``."""
    if not outlier_channels:
        raise ValueError("--sft-from adds outlier channels, and this profile has none (pretrain.outlier_channels 0); "
                         "accepted: a profile with outlier_channels >= 1")
    remake = "accepted: a warm start made from the same SFT without outlier channels"
    why = provenance_refusal(source, sft_setting, remake)
    if why:
        raise ValueError(f"--sft-from {source} {why}; {remake}")
    model, tokenizer = load(str(source), device="cpu")
    meta = json.loads((source / WARM_START_META).read_text())
    meta.update(with_outlier_channels(model, outlier_channels, outlier_scale, seed), provenance=provenance,
                sft_from=str(source))
    save(model, tokenizer, out, meta)
    return meta

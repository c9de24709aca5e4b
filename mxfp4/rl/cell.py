"""One ablation cell ``(profile, model, recipe, seed)``: GRPO (TRL) under a recipe, then GSM8K through lm-eval.

A cell is one object from the entry point down: ``Run.cell`` makes the ``CellSpec``, ``plan_cell`` checks and
resolves every input before the cell's folder is made and returns it as a ``CellPlan``; ``execute`` runs
``prepare`` (model, corrections, trainer, resume point), ``train``, ``evaluate`` and ``record``
(``metrics.json``). What a cell writes, and where (``mxfp4.layout``), is in docs/design.md ("Outputs", "The cell").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from datasets import Dataset
from transformers import set_seed

from ..config import REPO_ROOT
from ..config.run import CellSpec, Start
from ..io import exclusive, writable_folder, write_json_atomic
from ..layout import ARITHMETIC_EVAL_FOLDERS, EVAL_FOLDERS, EVAL_RESULTS, METRICS, REFERENCE_RECIPE, TRAIN_LOG
from ..machine import describe
from ..nn import bypassed, patch_model, patch_state, weight_cache_pays
from ..numerics.hooks import lifecycle
from . import data as gsm
from .evaluate import doc_hashes, evaluate_gsm8k, hf_lm, read_summary
from .grpo import StepLogger, build_trainer, last_checkpoint, resume_state, weight_decomposition
from .models import load, model_reference, parameter_count
from .probe_batch import ensure_probe_batch, load_probe_batch
from .training import checkpoint_disk, grpo_config, preserved_rng


def rollout_settings(grpo, recipe) -> dict:
    """GRPOConfig arguments of the profile's rollout backend. ``hf``: generate through the patched
    model (W4A4, exact to the training forward; W4A16 where the recipe's ``rollout_precision`` says). ``vllm``:
    TRL's colocated vLLM engine fed the recipe's quantized weights (W4A16; W4A4 is refused), with the recipe's
    truncated importance sampling if it sets a cap. A requested backend that cannot run is an error, never a
    fallback."""
    if grpo.rollout == "hf":
        return {"use_vllm": False}
    quantizer = recipe.quantizer()
    if quantizer is not None and quantizer.transforms_gemm:
        raise ValueError(f"recipe {recipe.name!r} changes each GEMM's basis from the batch's activation "
                         "(gemm_transform), so no one set of quantized weights is what its step computes; the vLLM "
                         "engine takes one. Accepted: grpo.rollout: hf")
    if recipe.rollout_precision == "w4a4":
        raise ValueError(f"recipe {recipe.name!r} asks for W4A4 rollouts (rollout_precision: w4a4), which the vLLM "
                         "engine cannot run (it generates from the quantized weights with BF16 activations); "
                         "accepted: rollout_precision w4a16 or unset, or grpo.rollout: hf")
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise ValueError(
            "the profile asks for vLLM rollouts (grpo.rollout: vllm) but vLLM is not installed; "
            "pip install -e '.[gpu]', or set grpo.rollout: hf (generate through the patched model)"
        ) from None
    if not torch.cuda.is_available():
        raise ValueError(
            "the profile asks for vLLM rollouts (grpo.rollout: vllm), which need a CUDA device; "
            "set grpo.rollout: hf to roll out on this machine"
        )
    cap = recipe.truncated_is_cap
    # Colocated with training on the same GPUs: a quarter of the memory (bf16 weights and KV cache,
    # docs/scaling.md) and asleep (offloaded) while the policy trains.
    return {
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": 0.25,
        "vllm_enable_sleep_mode": True,
        "vllm_importance_sampling_correction": cap is not None,
        "vllm_importance_sampling_mode": "token_truncate",
        "vllm_importance_sampling_clip_max": cap or 3.0,
    }


def rollout_record(trainer, recipe) -> dict:
    """What actually generated the rollouts (read back from the trainer, not from the request)."""
    vllm = trainer.uses_vllm
    if not recipe.quantize:
        precision = "full precision"
    elif vllm or not recipe.activations or recipe.rollouts_weights_only:
        precision = "W4A16 (the recipe's quantized weights)"
    else:
        precision = "W4A4 (the training forward)"
    applied = trainer.truncated_is_applied
    return {
        "backend": "vllm" if vllm else "hf",
        "precision": precision,
        "truncated_is_cap": recipe.truncated_is_cap if applied else None,
        "truncated_is_requested": recipe.truncated_is_cap,
    }


def versions() -> dict:
    out = {"python": platform.python_version()}
    for mod in ("torch", "transformers", "trl", "lm_eval", "datasets", "triton"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - a missing optional package is reported as None
            out[mod] = None
    return out


def git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=REPO_ROOT
        ).stdout.strip()
    except Exception:  # noqa: BLE001
        return None


@dataclass(frozen=True)
class CellPlan(CellSpec):
    """A cell whose inputs are every one checked and resolved: what ``execute`` needs before it trains.

    Args:
        model_ref: what ``models.load`` loads as its starting policy.
        train: the training problems, in the data source's order.
        eval_folder: the folder lm-eval reads the held-out problems from.
        arithmetic_folder: the never-trained arithmetic's problems (``data.holdout: arithmetic``), else None.
    """

    model_ref: str
    train: tuple[dict, ...]
    eval_folder: Path
    arithmetic_folder: Path | None

    @property
    def log_path(self) -> Path:
        """The cell's step log (one JSON line per GRPO step)."""
        return self.out / TRAIN_LOG

    @property
    def checkpoints(self) -> Path:
        """Where the trainer saves the cell's resumable checkpoints."""
        return self.out / "checkpoints"


def plan_cell(cell: CellSpec) -> CellPlan:
    """Check and resolve every input of a cell (the starting policy, the disk its checkpoints take, its data: the
    GSM8K files checked, an embedded source's made), then make its folder; a bad input is a ValueError saying what
    is wrong and what is accepted.

    Args:
        cell: the cell (``Run.cell(model, recipe, seed)``).
    """
    model_ref = model_reference(cell.start)
    check_checkpoint_disk(cell.start)
    train, eval_folder = gsm.cell_data(cell.run)
    arithmetic = gsm.arithmetic_eval_folder(cell.run) if cell.profile.data.arithmetic_held_out else None
    try:
        writable_folder(cell.out)  # every input checked: make it
    except OSError as err:
        raise ValueError(
            f"cannot write the cell's folder {cell.out} ({err.strerror}); accepted: a writable results folder"
        ) from None
    return CellPlan(cell.run, cell.model, cell.seed, cell.recipe, model_ref, tuple(train), eval_folder, arithmetic)


def check_checkpoint_disk(start: Start) -> dict | None:
    """The checkpoints' disk plan of a model of a real configuration (``start``: the model of a profile), refused
    when it exceeds the profile's ``grpo.checkpoint_disk_gib``; None when the profile states no budget."""
    grpo, spec = start.profile.grpo, start.spec
    if grpo.checkpoint_disk_gib is None or not spec.config:
        return None
    plan = checkpoint_disk(parameter_count(spec.config), grpo.save_steps)
    budget = grpo.checkpoint_disk_gib
    if plan["gib"] > budget:
        raise ValueError(
            f"profile {start.profile.name!r}: the checkpoints of {start.model!r} take {plan['copies']} x "
            f"{plan['gib_per_checkpoint']:.1f} GiB = {plan['gib']:.1f} GiB, over grpo.checkpoint_disk_gib "
            f"{budget:g}; accepted: a save_steps that writes none (null), or a larger budget on a larger disk"
        )
    return plan


def run_cell(cell: CellSpec) -> dict | None:
    """Run one cell: GRPO under a recipe from the profile's starting policy, then the three lm-eval
    evaluations; every input is checked before any work (``plan_cell``).

    Args:
        cell: the cell (``Run.of(profile, results).cell(model, recipe, seed)``); it writes ``cell.out``.

    Returns:
        The cell's metrics (what ``metrics.json`` holds); None on the ranks other than the main process
        of a multi-process cell.
    """
    plan = plan_cell(cell)
    return execute(plan)


def grpo_args(plan: CellPlan, checkpoints: Path, processes: int = 1):
    """TRL's GRPOConfig of a cell: the profile's GRPO settings, its precision (fp32 masters, bf16
    autocast when the model computes in bf16), micro-batches with gradient accumulation, gradient
    checkpointing, checkpoints every ``save_steps`` (if set) under ``checkpoints``, the rollout backend, and the
    profile's ``report_to`` (TensorBoard: the cell's ``tensorboard/`` folder)."""
    grpo, spec = plan.profile.grpo, plan.spec
    micro, accumulation = grpo.accumulation(processes)
    if "tensorboard" in plan.profile.report_to:  # transformers' TensorBoard callback reads its folder from here
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(plan.out / "tensorboard")
    return grpo_config(
        grpo,
        plan.seed,
        micro_batch=micro,
        accumulation=accumulation,
        compute=spec.compute,
        output_dir=checkpoints if grpo.save_steps else None,
        save_steps=grpo.save_steps,
        gradient_checkpointing=grpo.gradient_checkpointing,
        rollout=rollout_settings(grpo, plan.recipe),
        report_to=plan.profile.report_to,
    )


@dataclass
class CellRun:
    """A cell under way: what ``prepare`` set up for ``train``, ``evaluate`` and ``record`` beside its plan (the
    plan's own paths and hash are read from it, never copied)."""

    plan: CellPlan
    dist: object  # accelerate's PartialState
    started: float
    resume: Path | None
    model: torch.nn.Module
    tokenizer: object
    corrections: list
    trainer: object = None
    resumed_from: int | None = None


def execute(plan: CellPlan) -> dict | None:
    """Run a planned cell: prepare, train, evaluate, record (the main process returns the metrics),
    the cell's folder locked by the main process throughout: a second writer fails at once."""
    dist = PartialState(cpu=not torch.cuda.is_available())  # one process, or the ranks the launcher started
    lock = exclusive(plan.out, f"cell {plan.out}") if dist.is_main_process else contextlib.nullcontext()
    with lock:
        run = prepare(plan, dist)
        scores = {"before": evaluate(run, "before")}  # the warm start, under the recipe's quantization
        arithmetic = {"before": evaluate(run, "before", arithmetic=True)} if plan.arithmetic_folder else {}
        trained = train(run)
        scores["after"] = evaluate(run, "after")
        scores["unquantized"] = evaluate(run, "unquantized") if plan.recipe.quantize else scores["after"]
        if arithmetic:
            arithmetic["after"] = evaluate(run, "after", arithmetic=True)
        return record(run, trained, scores, arithmetic)


def prepare(plan: CellPlan, dist) -> CellRun:
    """The resume point, the seeded model patched with the recipe, its corrections bound, the data,
    and TRL's trainer (``dist``: accelerate's PartialState of this process)."""
    started = time.time()
    profile, recipe, seed, out = plan.profile, plan.recipe, plan.seed, plan.out
    spec, grpo = plan.spec, profile.grpo
    if dist.num_processes != spec.processes:
        raise ValueError(
            f"model {plan.model!r} of profile {profile.name!r} trains on processes: {spec.processes}, but "
            f"{dist.num_processes} were launched; launch it as the cell rule does "
            f"(accelerate launch --config_file experiments/accelerate/{spec.launch} ...) or fix processes"
        )
    c_hash, log_path, checkpoints = plan.config_hash, plan.log_path, plan.checkpoints
    out.mkdir(parents=True, exist_ok=True)
    if dist.is_main_process:  # the completion marker goes first: a run stopped from here on leaves no finished cell
        (out / METRICS).unlink(missing_ok=True)
    passed_over = []
    resume = last_checkpoint(checkpoints, c_hash, lambda d, why: passed_over.append((d, why))) \
        if grpo.save_steps else None
    dist.wait_for_everyone()
    if dist.is_main_process:
        for d, why in passed_over:  # never resumed, and in the way of the trainer's next save of that step
            print(f"{out}: not resuming from {d.name}: {why}; "
                  + (f"falling back to {resume.name}" if resume else "starting from step 0"), flush=True)
            shutil.rmtree(d, ignore_errors=True)
        if resume is None:
            log_path.unlink(missing_ok=True)
            shutil.rmtree(checkpoints, ignore_errors=True)  # another configuration's, or a run that never saved
            shutil.rmtree(out / EVAL_FOLDERS["before"], ignore_errors=True)
            shutil.rmtree(out / ARITHMETIC_EVAL_FOLDERS["before"], ignore_errors=True)
    probe_batch = None
    if profile.probe_every and recipe.quantize:  # the batch every recipe of this model and seed is probed on
        stored = plan.layout.probe_batch(plan.model, seed)
        if dist.num_processes > 1 and not stored.exists():  # sampling it is one process's work (TRL gathers)
            raise ValueError(
                f"the probe batch {stored} is missing; a launch of {dist.num_processes} processes cannot sample "
                f"it: make it first (mxfp4 probe-batch --profile {profile.name} --model {plan.model} --seed {seed}"
                f" --results {plan.run.results}; the snakemake rule probe_batch does)"
            )
        ensure_probe_batch(plan.start, plan.train)  # made by its snakemake rule, or now
        probe_batch = load_probe_batch(stored, plan.model, seed)
    set_seed(seed)  # after the probe batch, whose making draws random numbers

    model, tokenizer = load(plan.model_ref, dtype=torch.float32)  # fp32 master weights on every device
    corrections = recipe.build_corrections()
    for c in corrections:
        lifecycle(c.bind, total_steps=grpo.max_steps, seed=seed)
    if any(c.needs_reference for c in corrections):
        reference = plan.layout.metrics(plan.model, REFERENCE_RECIPE, seed)
        if not reference.exists():
            raise ValueError(
                f"recipe {recipe.name!r} steers toward the {REFERENCE_RECIPE} cell of the same model and "
                f"seed, which has not run ({reference} missing); run that cell first"
            )
        for c in corrections:
            lifecycle(c.bind_reference, json.loads(reference.read_text()))
    quantizer = recipe.quantizer(corrections)
    patch_model(model, quantizer, cache_weights=weight_cache_pays(model, quantizer, spec.sharded))
    run = CellRun(plan, dist, started, resume, model, tokenizer, corrections)

    dataset = Dataset.from_list(
        [{"prompt": gsm.prompt(r["question"], tokenizer, spec.chat), "answer": r["answer"]} for r in plan.train]
    )
    run.trainer = build_trainer(
        model,
        tokenizer,
        grpo_args(plan, checkpoints, dist.num_processes),
        dataset,
        reward=grpo.reward,
        corrections=corrections,
        probe_every=profile.probe_every,
        probe_rows=profile.probe_rows,
        probe_batch=probe_batch,
    )
    run.trainer.add_callback(StepLogger(run.trainer, log_path, config_hash=c_hash))
    if resume is not None:
        run.resumed_from = resume_state(resume, log_path if dist.is_main_process else None, corrections)
        print(f"resuming {out} from {resume} (step {run.resumed_from} of {grpo.max_steps})", flush=True)
    return run


def train(run: CellRun) -> dict:
    """GRPO (from the resume point, if any); how far the weights moved, their digests, the training
    time; the reference recipe's policy saved for the pathway matrix."""
    t_train = time.time()
    snapshot = weight_snapshot(run.model)  # the initial weights (a resumed run loads its checkpoint inside train)
    if run.resumed_from is not None and run.resumed_from >= run.plan.profile.grpo.max_steps:
        run.trainer.load_checkpoint_weights(run.resume)  # training had finished: evaluate, never train a step more
    else:
        run.trainer.train(resume_from_checkpoint=str(run.resume) if run.resume is not None else None)
    trained = {
        "train_seconds": time.time() - t_train,
        "weight_update": weight_update(run.model, snapshot),
        "weight_digests": weight_digests(run.trainer),
    }
    if not run.plan.recipe.quantize and run.plan.profile.keeps_reference_policy:
        save_policy(run.trainer, run.tokenizer, run.plan.out / "policy")
    return trained


def evaluate(run: CellRun, stage: str, arithmetic: bool = False) -> dict | None:
    """GSM8K through lm-eval on the in-memory policy at one ``stage`` (``EVAL_FOLDERS``): ``before``
    RL (the warm start under the recipe's quantization: the RNG streams of training are left as they
    were, and a resumed cell reads back what it measured), ``after`` RL under the recipe's quantization,
    or the trained weights ``unquantized`` (the patched layers bypassed). Each weight is quantized once
    for the whole evaluation (``MXGRPOTrainer.generation_weight_cache``). Every rank evaluates its share;
    the main process gets the summary. ``arithmetic``: on the never-trained arithmetic's problems instead
    (``ARITHMETIC_EVAL_FOLDERS``: before and after)."""
    folders = ARITHMETIC_EVAL_FOLDERS if arithmetic else EVAL_FOLDERS
    if stage not in folders:
        raise ValueError(f"unknown evaluation stage {stage!r}; accepted: {', '.join(folders)}")
    data = run.plan.arithmetic_folder if arithmetic else run.plan.eval_folder
    if data is None:
        raise ValueError(f"{run.plan.out}: no held-out arithmetic to evaluate (the profile's data.holdout is "
                         f"{run.plan.profile.data.holdout!r}); accepted: data.holdout arithmetic")
    ev, out = run.plan.profile.eval, run.plan.out / folders[stage]
    if stage == "before" and run.resume is not None and (out / EVAL_RESULTS).is_file():  # the same on every rank
        return read_summary(out) if run.dist.is_main_process else None
    run.model.eval()
    lm = hf_lm(run.model, run.tokenizer, batch_size=ev.batch_size, compute_dtype=compute_dtype(run))
    full_precision = bypassed(run.model) if stage == "unquantized" else contextlib.nullcontext()
    keep_rng = preserved_rng() if stage == "before" else contextlib.nullcontext()
    generating = run.trainer.generation_precision() if stage != "unquantized" else contextlib.nullcontext()
    with full_precision, keep_rng, generating, run.trainer.generation_weight_cache():
        return evaluate_gsm8k(lm, data, num_fewshot=ev.num_fewshot, limit=ev.limit,
                              max_gen_toks=ev.max_gen_toks, output_dir=out, seed=run.plan.seed,
                              chat=run.plan.spec.chat)


def compute_dtype(run: CellRun) -> torch.dtype | None:
    """The autocast dtype the policy trains and samples in (None: no autocast), for the evaluations.
    Accelerate wraps the model's own forward in bf16 autocast only when training starts, and lm-eval's
    HFLM turns autocast off around its calls unless told a dtype: without it, under bf16 compute the
    evaluation before RL ran in float32 and the one after RL in bf16, and the RL gain held the change."""
    return torch.bfloat16 if run.plan.spec.compute == "bfloat16" else None


def rl_gain(scores: dict, cell: Path) -> dict:
    """Accuracy before RL, after, after unquantized, and the RL gain (after minus before, strict
    match); the three evaluations must have scored the same problems (lm-eval's per-sample doc hashes),
    or the gain would compare different problems: a ValueError then."""
    folders = {stage: cell / EVAL_FOLDERS[stage] for stage in scores}
    hashes = {stage: doc_hashes(folder) for stage, folder in folders.items() if folder.is_dir()}
    first = hashes.get("after")
    for stage, h in hashes.items():
        if h != first:
            raise ValueError(
                f"{cell}: the {stage} evaluation scored other problems than the after-RL one "
                f"({len(h)} against {len(first or [])} doc hashes, not the same); the RL gain needs the same problems"
            )
    return {
        "gsm8k_strict_accuracy_before": scores["before"]["strict_match"],
        "gsm8k_strict_accuracy_unquantized": scores["unquantized"]["strict_match"],
        "gsm8k_rl_gain": scores["after"]["strict_match"] - scores["before"]["strict_match"],
        "gsm8k_flexible_rl_gain": scores["after"]["flexible_extract"] - scores["before"]["flexible_extract"],
        "eval_problems_digest": hashlib.sha256(json.dumps(first).encode()).hexdigest()[:16] if first else None,
        "eval_stages": {stage: EVAL_FOLDERS[stage] for stage in hashes},
    }


def arithmetic_gain(scores: dict, cell: Path) -> dict:
    """The held-out arithmetic's accuracy before RL, after, and its RL gain (strict match), from the two
    evaluations of ``ARITHMETIC_EVAL_FOLDERS``, which must have scored the same problems."""
    hashes = {stage: doc_hashes(cell / folder) for stage, folder in ARITHMETIC_EVAL_FOLDERS.items()}
    if hashes["before"] != hashes["after"]:
        raise ValueError(f"{cell}: the held-out arithmetic's before and after evaluations scored other problems "
                         "(doc hashes differ); the RL gain needs the same problems")
    return {
        "gsm8k_strict_accuracy_arithmetic": scores["after"]["strict_match"],
        "gsm8k_strict_accuracy_before_arithmetic": scores["before"]["strict_match"],
        "gsm8k_rl_gain_arithmetic": scores["after"]["strict_match"] - scores["before"]["strict_match"],
        "eval_stages_arithmetic": dict(ARITHMETIC_EVAL_FOLDERS),
    }


def record(run: CellRun, trained: dict, scores: dict[str, dict], arithmetic: dict[str, dict] | None = None
           ) -> dict | None:
    """metrics.json (main process, written atomically), then the checkpoints removed: the cell is
    complete. ``scores``: the evaluations by stage; ``arithmetic``: those on the never-trained arithmetic
    (before, after), where the profile holds it out. The main process returns the metrics, the others None."""
    plan, dist = run.plan, run.dist
    profile, recipe, spec = plan.profile, plan.recipe, plan.spec
    metrics = None
    if dist.is_main_process:
        metrics = summarize(
            run.plan.log_path, scores["after"], run.model, patch_state(run.model).quantizer, run.corrections,
            profile.probe_rows,
        )
        metrics.update(rl_gain(scores, plan.out))
        if arithmetic:
            metrics.update(arithmetic_gain(arithmetic, plan.out))
        metrics.update(
            profile=profile.name,
            model=plan.model,
            recipe=recipe.name,
            seed=plan.seed,
            wall_time_seconds=time.time() - run.started,
            train_seconds=trained["train_seconds"],
            rollout=rollout_record(run.trainer, recipe),
            precision={"master_weights": "float32", "compute": spec.compute},
            world_size=dist.num_processes,
            weight_digests=trained["weight_digests"],
            resumed_from_step=run.resumed_from,
            weight_update=trained["weight_update"],
            config={
                "recipe": recipe.to_dict(),
                "grpo": profile.grpo.model_dump(),
                "data": profile.data.model_dump(),
                "eval": profile.eval.model_dump(),
                "model": spec.model_dump(),
            },
            config_hash=run.plan.config_hash,
            setting_hash=plan.run.setting_hash(plan.model),
            setting=profile.setting(plan.model),
            train_log_sha256=hashlib.sha256(run.plan.log_path.read_bytes()).hexdigest(),
            versions=versions(),
            git_commit=git_commit(),
            device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            machine=describe(),
        )
        write_json_atomic(plan.out / METRICS, metrics)
        shutil.rmtree(run.plan.checkpoints, ignore_errors=True)  # the cell is complete: nothing to resume
    dist.wait_for_everyone()
    return metrics


def _is_shard(p: torch.Tensor) -> bool:
    """A parameter that holds only this rank's shard: an FSDP2 DTensor or a DeepSpeed ZeRO-3 partition."""
    return type(p).__name__ == "DTensor" or hasattr(p, "ds_id")


def weight_snapshot(model) -> dict[str, torch.Tensor]:
    """CPU float32 copies of the first and last decoder layers' parameters (bounded at any model
    size): the reference of ``weight_update``."""
    last = getattr(model.config, "num_hidden_layers", 1) - 1
    keep = (".layers.0.", f".layers.{last}.")
    return {
        n: p.detach().float().cpu().clone()
        for n, p in model.named_parameters()
        if any(k in n for k in keep) and not _is_shard(p)
    }


def weight_update(model, snapshot: dict[str, torch.Tensor]) -> dict:
    """How far training moved the snapshot's parameters: the update norm, relative to the weights'
    norm, and the fraction of elements that changed at all (an update below half an ulp of a
    bfloat16 master weight rounds away: this fraction is then near 0)."""
    params = dict(model.named_parameters())
    delta2 = base2 = changed = total = 0.0
    for name, before in snapshot.items():
        d = params[name].detach().float().cpu() - before
        delta2 += float(d.double().pow(2).sum())
        base2 += float(before.double().pow(2).sum())
        changed += int((d != 0).sum())
        total += d.numel()
    return {
        "scope": "parameters of the first and last decoder layers",
        "n": int(total),
        "norm": math.sqrt(delta2),
        "relative": math.sqrt(delta2 / base2) if base2 else None,
        "changed_fraction": changed / total if total else None,
    }


def weight_digests(trainer) -> list[str] | None:
    """SHA-256 of every rank's trained weights (gathered; identical under DDP), or None when the
    parameters are sharded (FSDP / ZeRO-3: no rank holds them whole)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if any(_is_shard(p) for p in model.parameters()):
        return None
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().contiguous().numpy())  # the buffer itself: no copy of 12 GB at 3B
    return gather_object([h.hexdigest()])


def save_policy(trainer, tokenizer, folder: Path) -> None:
    """The full-precision policy after GRPO (the pathway matrix's second checkpoint) through the
    trainer's own ``save_model`` (which gathers FSDP / ZeRO shards), written whole or not at all."""
    tmp = folder.with_name(folder.name + ".tmp")
    if trainer.accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    trainer.save_model(str(tmp))
    if trainer.accelerator.is_main_process:
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
    trainer.accelerator.wait_for_everyone()


def summarize(log_path: Path, scores: dict, model, quantizer, corrections, probe_rows: int = 4096) -> dict:
    rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]

    def mean(key):
        vals = [r[key] for r in rows if r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    out = {
        "gsm8k_strict_accuracy": scores["strict_match"],
        "gsm8k_flexible_accuracy": scores["flexible_extract"],
        "eval_n": scores["n"],
        "steps": len(rows),
        "mean_reward": mean("reward"),
        "mean_rollout_accuracy": mean("rewards/accuracy_reward/mean"),
        "mean_entropy": mean("entropy"),
        "final_entropy": rows[-1].get("entropy") if rows else None,
        "mean_kl": mean("kl"),
        "mean_grad_cosine": mean("grad/cosine"),
        "mean_grad_rel_norm_error": mean("grad/rel_norm_error"),
        "mean_step_time": mean("step_time"),
        "mean_probe_time": mean("probe_time"),
        "mean_ledger_time": mean("ledger_time"),
        "probe_batches": sorted({r["probe/batch"] for r in rows if r.get("probe/batch")}),  # digests, from the log
        "mean_mismatch_kl": mean("mismatch/kl"),
        "mean_mismatch_log_ratio": mean("mismatch/log_ratio_mean"),
        "correction_costs": {c.name: lifecycle(c.cost) for c in corrections},
    }
    out["decomposition_weights"] = weight_decomposition(model, quantizer, probe_rows) if quantizer is not None else None
    return out



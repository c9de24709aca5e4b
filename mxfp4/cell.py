"""One ablation cell: GRPO (TRL's GRPOTrainer) under a recipe, then GSM8K evaluation through lm-eval.

A cell is ``(profile, model, recipe, seed)``; it writes ``results/<profile>/cells/<model>/<recipe>/seed<seed>/``:
``train_log.jsonl`` (one line per step), ``eval/`` (lm-eval's own output) and ``metrics.json``.

Per step the log holds TRL's own metrics (reward mean and std, the accuracy reward = rollout
accuracy, policy entropy, KL when beta > 0, completion lengths) plus, through this module's
callback and trainer hooks: step time, AQN's sigma, and every ``probe_every`` steps the gradient
cosine and relative norm error against a full-precision shadow backward pass on the same batch
(per layer and total) and decomposition statistics of the weights, activations and gradients of
the probed layers.
"""

from __future__ import annotations

import contextlib
import copy
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from . import data as gsm
from .decompose import COMPONENTS, pool_stats
from .grad_accuracy import compare
from .io import write_json_atomic
from .patching import bypassed, gemm_weights, patch_model, quantized_weights, set_probe
from .profiles import load_profile, model_dir
from .recipes import Recipe
from .training import common_args

SUMMARY_KEYS = ("share_scale", "share_dead", "share_grid", "cross_share", "shapley_share_scale",
                "shapley_share_dead", "shapley_share_grid", "deadzone_fraction", "saturation_fraction")


def accuracy_reward(completions, answer, **kwargs) -> list[float]:
    """1 when the completion's ``#### n`` is the reference answer, else 0 (TRL reward signature)."""
    return [1.0 if gsm.is_correct(c, a) else 0.0 for c, a in zip(completions, answer)]


class DecompositionProbe:
    """Collects the decomposition statistics of tensors that patched layers see, by kind."""

    def __init__(self, quantizer, layers: set[str]):
        self.quantizer, self.layers = quantizer, layers
        self.stats: dict[str, list[dict]] = {}

    def __call__(self, layer: str, kind: str, tensor: torch.Tensor, axis: int):
        if layer in self.layers and torch.isfinite(tensor).all():
            kind = kind.removesuffix("_t")
            self.stats.setdefault(kind, []).append(self.quantizer.decompose(tensor.float(), axis).stats)

    def summary(self) -> dict:
        out = {}
        for kind, items in self.stats.items():
            pooled = pool_stats(items)
            for k in SUMMARY_KEYS:
                if k in pooled:
                    out[f"decomp/{kind}/{k}"] = pooled[k]
        return out


def _trainer_class():
    from trl import GRPOTrainer

    class MXGRPOTrainer(GRPOTrainer):
        """GRPOTrainer with the recipe's rollout-time corrections and the gradient/decomposition probes."""

        def setup_mx(self, corrections, quantizer, probe_every: int, probe_layers: set[str]):
            self.mx_corrections, self.mx_quantizer = corrections, quantizer
            self.mx_probe_every, self.mx_probe_layers = probe_every, probe_layers
            self.mx_step_metrics: dict = {}
            if getattr(self, "use_vllm", False) and quantizer is not None:
                # push the recipe's quantized weights (not the master weights) to the vLLM engine
                sync = self.vllm_generation.sync_weights

                def sync_quantized():
                    with quantized_weights(self.model):
                        sync()

                self.vllm_generation.sync_weights = sync_quantized

        def _generate_and_score_completions(self, inputs):
            with contextlib.ExitStack() as stack:
                for c in self.mx_corrections:
                    sigma = stack.enter_context(c.rollout_context(self.model, self.state.global_step))
                    if c.name == "aqn":
                        self.mx_step_metrics["aqn/sigma"] = sigma
                return super()._generate_and_score_completions(inputs)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            step = self.state.global_step
            probing = self.mx_quantizer is not None and self.mx_probe_every and step % self.mx_probe_every == 0
            if not probing:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            probe = DecompositionProbe(self.mx_quantizer, self.mx_probe_layers)
            for name, module in model.named_modules():
                if name in self.mx_probe_layers:
                    w = module.gate_up_proj if hasattr(module, "gate_up_proj") else module.weight
                    probe(name, "weight", w.detach(), -1)
            set_probe(model, probe)
            try:
                loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
                params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
                g_q = torch.autograd.grad(loss, [p for _, p in params], retain_graph=True, allow_unused=True)
            finally:
                set_probe(model, None)
            # the shadow pass must not leak into TRL's logged metrics (entropy, KL, clip ratios)
            logged, window = copy.deepcopy(self._metrics), copy.deepcopy(getattr(self, "_entropy_window_stats", None))
            with bypassed(model):
                ref_loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
                g_r = torch.autograd.grad(ref_loss, [p for _, p in params], allow_unused=True)
            self._metrics, self._entropy_window_stats = logged, window
            quant = {n: g for (n, _), g in zip(params, g_q) if g is not None}
            ref = {n: g for (n, _), g in zip(params, g_r) if g is not None and n in quant}
            acc = compare(quant, ref)
            metrics = {"grad/cosine": acc["total"]["cosine"], "grad/rel_norm_error": acc["total"]["rel_norm_error"]}
            for layer, v in acc["per_layer"].items():
                metrics[f"grad/{layer}/cosine"] = v["cosine"]
                metrics[f"grad/{layer}/rel_norm_error"] = v["rel_norm_error"]
            metrics.update(probe.summary())
            self.mx_step_metrics.update(metrics)
            return loss

    return MXGRPOTrainer


def _callback_class():
    from transformers import TrainerCallback

    class StepLogger(TrainerCallback):
        """Writes one JSON line per step: TRL's logged metrics, the probes' metrics, step time."""

        def __init__(self, trainer, path: Path, corrections):
            self.trainer, self.path, self.corrections = trainer, path, corrections
            self.t0 = None
            self.step_time = None

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.step_time = time.perf_counter() - self.t0

        def on_log(self, args, state, control, logs=None, **kw):
            if logs is None or "train_runtime" in logs:
                return
            row = {"step": state.global_step, "step_time": self.step_time, **logs, **self.trainer.mx_step_metrics}
            self.trainer.mx_step_metrics = {}
            if "entropy" in row:
                for c in self.corrections:
                    if hasattr(c, "observe_entropy"):
                        c.observe_entropy(row["entropy"])
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")

    return StepLogger


def probe_layers(model) -> set[str]:
    """The first attention projection and the last MLP (experts for MoE) get decomposition probes."""
    names = [n for n, m in model.named_modules() if hasattr(m, "_mx_gemm")]
    first = next((n for n in names if n.endswith("q_proj")), None)
    last_mlp = [n for n in names if n.endswith("down_proj") or n.endswith("experts")]
    return {n for n in (first, last_mlp[-1] if last_mlp else None) if n}


def rollout_backend(grpo: dict) -> dict:
    """vLLM on a GPU when asked and installed (with TRL's importance-sampling correction); else HF generate."""
    if not grpo.get("use_vllm") or not torch.cuda.is_available():
        return {"use_vllm": False}
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("mxfp4 cell: vLLM is not installed (pip install -e '.[gpu]'); rollouts fall back to HF generate", file=sys.stderr)
        return {"use_vllm": False}
    return {"use_vllm": True, "vllm_mode": "colocate", "vllm_importance_sampling_correction": True}


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
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except Exception:  # noqa: BLE001
        return None


def cell_dir(results: Path | str, profile: str, model: str, recipe: str, seed: int) -> Path:
    return Path(results) / profile / "cells" / model / recipe / f"seed{seed}"


def cell_data(profile: dict, seed: int) -> tuple[list[dict], Path]:
    """(training problems, folder with train/test jsonl for lm-eval) for the profile's data source."""
    d = profile["data"]
    if d["source"] == "embedded":
        train = gsm.embedded_split("train", d["n_train"], seed=0, max_steps=d["max_problem_steps"])
        folder = Path(profile["results_dir"]) / profile["name"] / "data"
        if not (folder / "test.jsonl").exists():
            gsm.write_jsonl(gsm.embedded_split("train", 64, seed=1, max_steps=d["max_problem_steps"]), folder / "train.jsonl")
            gsm.write_jsonl(gsm.embedded_split("test", d["n_eval"], seed=0, max_steps=d["max_problem_steps"]), folder / "test.jsonl")
        return train, folder
    folder = gsm.default_gsm8k_dir() if d.get("dir") is None else Path(d["dir"])
    if folder is None:
        raise ValueError("the gsm8k data source needs the GSM8K jsonl folder: set data.dir or MXFP4_GSM8K_DIR")
    return gsm.load_gsm8k("train", folder), folder


def run_cell(profile_name: str, model_name: str, recipe_name: str, seed: int, results: Path | str = "results",
             recipes_file: str | None = None) -> dict:
    from datasets import Dataset
    from transformers import set_seed
    from trl import GRPOConfig

    from .evaluate import evaluate_gsm8k, hf_lm
    from .models import load

    t_start = time.time()
    profile = load_profile(profile_name, results)
    if model_name not in profile["models"]:
        raise ValueError(f"model {model_name!r} is not in profile {profile_name!r}; known: {', '.join(profile['models'])}")
    recipe = Recipe.named(recipe_name, recipes_file)
    out = cell_dir(results, profile_name, model_name, recipe_name, seed)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "train_log.jsonl"
    log_path.unlink(missing_ok=True)
    set_seed(seed)

    spec = profile["models"][model_name]
    model, tokenizer = load(spec.get("hub") or str(model_dir(results, profile_name, model_name)),
                            dtype=getattr(torch, spec.get("dtype", "float32")))
    grpo = dict(profile["grpo"])
    corrections = recipe.build_corrections()
    for c in corrections:
        if c.name == "aqn":
            c.total_steps, c.seed = grpo["max_steps"], seed
    patch_model(model, recipe, corrections)
    quantizer = getattr(model, "_mx_quantizer", None)

    train, eval_folder = cell_data(profile, seed)
    dataset = Dataset.from_list([{"prompt": gsm.PROMPT.format(question=r["question"]), "answer": r["answer"]} for r in train])
    n_gen = grpo["num_generations"]
    config = GRPOConfig(
        max_steps=grpo["max_steps"],
        learning_rate=grpo["learning_rate"],
        lr_scheduler_type="constant",
        per_device_train_batch_size=n_gen * grpo["prompts_per_step"],
        gradient_accumulation_steps=1,
        num_generations=n_gen,
        max_completion_length=grpo["max_completion_length"],
        temperature=grpo["temperature"],
        top_k=0,
        beta=grpo["beta"],
        loss_type=grpo["loss_type"],
        router_aux_loss_coef=grpo.get("router_aux_loss_coef"),
        logging_steps=1,
        **common_args(seed),
        **rollout_backend(grpo),
    )
    trainer = _trainer_class()(model=model, reward_funcs=[accuracy_reward], args=config, train_dataset=dataset,
                               processing_class=tokenizer)
    trainer.setup_mx(corrections, quantizer, profile.get("probe_every", 0), probe_layers(model))
    trainer.add_callback(_callback_class()(trainer, log_path, corrections))
    t_train = time.time()
    trainer.train()
    train_seconds = time.time() - t_train

    ev = profile["eval"]
    model.eval()
    lm = hf_lm(model, tokenizer, batch_size=ev.get("batch_size", 32))
    scores = evaluate_gsm8k(lm, eval_folder, num_fewshot=ev["num_fewshot"], limit=ev.get("limit"),
                            max_gen_toks=ev.get("max_gen_toks"), output_dir=out / "eval", seed=seed)
    metrics = summarize(log_path, scores, model, quantizer, recipe, corrections)
    metrics.update(
        profile=profile_name, model=model_name, recipe=recipe_name, seed=seed,
        wall_time_seconds=time.time() - t_start, train_seconds=train_seconds,
        config={"recipe": recipe.to_dict(), "grpo": grpo, "data": profile["data"], "eval": ev, "model": spec},
        config_hash=recipe.hash() + "-" + _hash(profile),
        versions=versions(), git_commit=git_commit(), device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    )
    write_json_atomic(out / "metrics.json", metrics)
    return metrics


def _hash(obj) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def summarize(log_path: Path, scores: dict, model, quantizer, recipe: Recipe, corrections) -> dict:
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
        "correction_costs": {c.name: c.cost() for c in corrections},
    }
    out["decomposition_weights"] = weight_decomposition(model, quantizer) if quantizer is not None else None
    return out


def weight_decomposition(model, quantizer) -> dict:
    """Pooled decomposition shares of every quantized weight, as the recipe's quantizer sees it."""
    stats = []
    for _, module in model.named_modules():
        if not hasattr(module, "_mx_gemm"):
            continue
        for p in gemm_weights(module).values():
            stats.append(quantizer.decompose(p.detach().float(), -1).stats)
    pooled = pool_stats(stats)
    return {k: pooled[k] for k in SUMMARY_KEYS} | {f"energy_{c}": pooled[f"energy_{c}"] for c in COMPONENTS} | {"energy_total": pooled["energy_total"]}


def cell_main(args) -> int:
    m = run_cell(args.profile, args.model, args.recipe, args.seed, results=args.results, recipes_file=args.recipes)
    print(json.dumps({k: m[k] for k in ("gsm8k_strict_accuracy", "gsm8k_flexible_accuracy", "mean_entropy",
                                        "mean_grad_cosine", "mean_step_time", "wall_time_seconds")}, indent=2))
    return 0

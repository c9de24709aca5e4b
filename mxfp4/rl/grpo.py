"""The GRPO trainer of a cell: TRL's ``GRPOTrainer`` with the recipe's lifecycle hooks and the probes.

``MXGRPOTrainer`` calls the corrections' hooks (AQN's rollout noise), runs the gradient-accuracy and
decomposition probes every ``probe_every`` steps, keeps the rollout/train mismatch ledger and pushes
the recipe's quantized weights to vLLM; ``StepLogger`` writes ``train_log.jsonl`` and makes every
checkpoint resumable. What each logs is in docs/design.md ("The cell"). Every use of TRL's private
API is in the block marked "TRL INTERNALS" (``tests/rl/test_grpo_internals.py`` checks it against the
pinned TRL, and that no other module names it).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import math
import shutil
import time
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from ..io import file_sha256
from ..layout import TRAIN_LOG
from ..nn import (
    bypassed,
    clear_weight_caches,
    gemm_weights,
    generation_precision,
    patch_state,
    patched_modules,
    quantized_weights,
    rollout_weight_cache,
    set_probe,
)
from ..nn.linear import KIND_OPERANDS
from ..numerics.decompose import COMPONENTS, SUMMARY_KEYS, pool_stats
from ..numerics.dispatch import autotune_spent
from ..numerics.hooks import lifecycle
from ..numerics.quantizer import Operand
from . import data as gsm
from .grad_accuracy import compare
from .vllm_weights import vllm_named_weights


def batch_digest(batch: dict) -> str:
    """sha256 (first 16 hex digits) of a batch's prompt and completion token ids and masks."""
    h = hashlib.sha256()
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask"):
        h.update(batch[key].detach().cpu().to(torch.int64).numpy().tobytes())
    return h.hexdigest()[:16]


def synced_clock() -> float:
    """perf_counter after the device's queued work is done (a step's time on GPU is its kernels')."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def observer_rng():
    """A forked random stream for passes that observe the run (probes, the ledger): whatever they
    draw, the run's own stream continues as if they had not run."""
    return torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else [])


PROBE_BLOCKS = 128  # quantization groups along the blocked axis a float64 probe keeps per row


def _runs(n: int, unit: int, keep: int, device) -> torch.Tensor | None:
    """Indices of ``keep`` evenly spaced runs of ``unit`` consecutive positions out of n (None: keep all)."""
    runs = n // unit
    if runs <= keep or n % unit:
        return None
    start = torch.linspace(0, runs - 1, keep, device=device).round().long() * unit
    return (start[:, None] + torch.arange(unit, device=device)).flatten()


def sample_blocks(t: torch.Tensor, axis: int, rows: int, quantizer=None, groups: int = PROBE_BLOCKS,
                  valid: torch.Tensor | None = None):
    """(t, valid) as a 2D tensor blocked along its last axis, cut to about ``rows`` rows across
    ``axis`` and ``groups`` quantization groups along it, evenly spaced and deterministic. A group is
    what the quantizer treats together (a 32-block; a macro-block's run of blocks and its rows), so
    the sample is quantized exactly as inside the whole tensor (up to corrections that rank blocks
    across the whole tensor, such as outlier fallback's block mode)."""
    unit, row_unit = 32, 1
    if quantizer is not None:
        unit = quantizer.token_alignment()
        row_unit = quantizer.row_alignment()
    axis = axis % t.dim()
    t2 = t.movedim(axis, -1).reshape(-1, t.shape[axis])
    v2 = None if valid is None else valid.expand_as(t).movedim(axis, -1).reshape(-1, t.shape[axis])
    pick = _runs(t2.shape[0], row_unit, max(1, rows // row_unit), t.device)
    if pick is not None:
        t2 = t2.index_select(0, pick)
        v2 = None if v2 is None else v2.index_select(0, pick)
    cols = _runs(t2.shape[1], unit, groups, t.device)
    if cols is not None:
        t2 = t2.index_select(1, cols)
        v2 = None if v2 is None else v2.index_select(1, cols)
    return t2, v2


def weight_decomposition(model, quantizer, rows: int | None = None, form: str = "canonical") -> dict:
    """Pooled decomposition shares of every quantized weight, as the recipe's quantizer sees it, in the
    decomposition ``form``; with ``rows``, on at most that many evenly spaced rows and 128 blocks of
    each weight (float64 memory bounded at any model size)."""
    def view(p):
        t = p.detach().float()
        return sample_blocks(t, -1, rows, quantizer)[0] if rows else t

    stats = [
        quantizer.decompose(view(p), -1, form=form, operand=Operand("weight", "forward", name)).stats
        for name, module, _ in patched_modules(model)
        for p in gemm_weights(module).values()
    ]
    pooled = pool_stats(stats)
    return (
        {k: pooled[k] for k in SUMMARY_KEYS}
        | {f"energy_{c}": pooled[f"energy_{c}"] for c in COMPONENTS}
        | {"energy_total": pooled["energy_total"]}
    )


class DecompositionProbe:
    """Collects the decomposition statistics of tensors that patched layers see, by kind.

    On GPU, for a quantizer without corrections, the fused stats kernel gives the energies and
    counts in the same pass as a fake-quantization (float32, device tensors, synced once in
    ``summary``; no Shapley shares); elsewhere the float64 decomposition with Shapley shares on at
    most ``rows`` rows and 128 quantization groups of each tensor (``sample_blocks``)."""

    def __init__(self, quantizer, layers: set[str], rows: int = 4096):
        self.quantizer, self.layers, self.rows = quantizer, layers, rows
        self.stats: dict[str, list[dict]] = {}

    def __call__(self, layer: str, kind: str, tensor: torch.Tensor, axis: int, valid=None):
        if layer not in self.layers:
            return
        kind_of, kind = kind, kind.removesuffix("_t")
        fused = self.quantizer.fused_stats(tensor, axis) if valid is None else None
        if fused is not None:
            self.stats.setdefault(kind, []).append(fused)
            return
        t, v = sample_blocks(tensor, axis, self.rows, self.quantizer, valid=valid)
        if torch.isfinite(t).all():
            operand = Operand(*KIND_OPERANDS[kind_of], layer)  # in the basis the operand is quantized in
            self.stats.setdefault(kind, []).append(self.quantizer.decompose(t.float(), -1, v, operand=operand).stats)

    def summary(self) -> dict:
        out = {}
        for kind, items in self.stats.items():
            # one sync
            items = [{k: float(v) if isinstance(v, torch.Tensor) else v for k, v in s.items()} for s in items]
            items = [s for s in items if all(math.isfinite(v) for v in s.values() if isinstance(v, float))]
            if not items:
                continue
            pooled = pool_stats(items)
            for k in SUMMARY_KEYS:
                if k in pooled:
                    out[f"decomp/{kind}/{k}"] = pooled[k]
        return out


def mismatch_ledger(train: torch.Tensor | None, rollout: torch.Tensor | None, mask: torch.Tensor) -> dict:
    """The rollout/train mismatch over the completion tokens (``mask``): the token log-ratio
    log pi_train - log pi_rollout (mean), KL(rollout || train) by the k3 estimator
    E[r - 1 - log r] (non-negative, unbiased for tokens sampled from the rollout policy), and the
    quantiles of the importance ratio r = pi_train / pi_rollout. ``train`` None: the rollout policy
    is the training policy by construction (HF generate through the same patched model with no
    rollout perturbation), the ledger is exactly zero and ``mismatch/measured`` is 0."""
    if train is None:
        return {
            "mismatch/measured": 0.0,
            "mismatch/log_ratio_mean": 0.0,
            "mismatch/kl": 0.0,
            **{f"mismatch/is_ratio_{q}": 1.0 for q in ("p01", "p50", "p99", "max")},
            "mismatch/tokens": 0.0,
        }
    keep = mask.bool() & torch.isfinite(rollout) & torch.isfinite(train)
    log_r = (train - rollout)[keep].double()
    if log_r.numel() == 0:
        raise ValueError("the mismatch ledger got no completion token with finite log-probs under both policies")
    r = log_r.exp()
    qs = torch.quantile(r, torch.tensor([0.01, 0.5, 0.99], dtype=r.dtype, device=r.device)).tolist()
    return {
        "mismatch/measured": 1.0,
        "mismatch/log_ratio_mean": log_r.mean().item(),
        "mismatch/kl": (r - 1 - log_r).mean().item(),
        "mismatch/is_ratio_p01": qs[0],
        "mismatch/is_ratio_p50": qs[1],
        "mismatch/is_ratio_p99": qs[2],
        "mismatch/is_ratio_max": r.max().item(),
        "mismatch/tokens": float(log_r.numel()),
    }


def probe_layers(model) -> set[str]:
    """The first attention projection and the last MLP (experts for MoE) get decomposition probes."""
    names = [n for n, _, _ in patched_modules(model)]
    first = next((n for n in names if n.endswith("q_proj")), None)
    last_mlp = [n for n in names if n.endswith("down_proj") or n.endswith("experts")]
    return {n for n in (first, last_mlp[-1] if last_mlp else None) if n}


class MXGRPOTrainer(GRPOTrainer):
    """GRPOTrainer with the recipe's corrections' lifecycle hooks and the gradient/decomposition probes.

    Built as TRL's trainer, with options of its own: ``corrections`` (the recipe's correction
    objects, whose lifecycle hooks it calls), ``probe_every`` (steps between probes; 0: never),
    ``probe_rows`` and ``probe_batch`` (a scored GRPO batch, ``mxfp4.rl.probe_batch``: every probe is
    taken on it, so recipes are probed on the same prompts and completions; None: on the step's own
    first micro-batch). The quantizer is read from the patched model (``patch_state``). Outside a
    training run, ``scored_batch`` and ``batch_loss`` give the pathway matrix TRL's own batches and loss.
    """

    def __init__(self, *args, corrections=(), probe_every: int = 0, probe_rows: int = 4096, probe_batch=None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.mx_probe_batch = probe_batch
        state = patch_state(self.model)
        self.mx_corrections = list(corrections)
        self.mx_quantizer = state.quantizer if state is not None else None
        self.mx_probe_every = probe_every
        self.mx_probe_rows = probe_rows
        self.mx_probe_layers = probe_layers(self.model)
        self.mx_step_metrics: dict = {}
        self.begin_step()
        self._mx_probed_step = None
        self.add_callback(WeightCacheReset(self))
        if self.uses_vllm and self.mx_quantizer is not None:
            self._push_quantized_weights_to_vllm()

    TIMED_PARTS = ("probe", "rollout", "ledger")

    def begin_step(self) -> None:
        """Start a step's accounting: the seconds of each timed part (``mx_seconds``) and the Triton autotuning
        inside each (``mx_autotune``), from zero."""
        self.mx_seconds = dict.fromkeys(self.TIMED_PARTS, 0.0)
        self.mx_autotune = dict.fromkeys(self.TIMED_PARTS, 0.0)

    @contextlib.contextmanager
    def timed(self, part: str):
        """Adds the block's seconds and the autotuning inside it to ``part``'s accounts."""
        t0, tuned0 = synced_clock(), autotune_spent()[0]
        yield
        self.mx_seconds[part] += synced_clock() - t0
        self.mx_autotune[part] += autotune_spent()[0] - tuned0

    def take_step_metrics(self) -> dict:
        """The metrics the probes and the ledger gathered since the last call (then forgotten)."""
        metrics, self.mx_step_metrics = self.mx_step_metrics, {}
        return metrics

    # ---------------------------------------------------------------- TRL INTERNALS (begin)
    # Every use of TRL's private API is in this block (pinned in constraints.txt; checked by
    # tests/rl/test_grpo_internals.py, which also checks that no other module names them):
    # 1. ``_generate_and_score_completions``: the one method that generates a step's rollouts; it is
    #    wrapped so the corrections' rollout contexts (AQN's noise) hold during generation only, and
    #    called by ``scored_batch``.
    # 2. ``_metrics`` and ``_entropy_window_stats``: TRL's per-step metric buffers; the probe's
    #    passes and ``batch_loss`` call ``compute_loss`` again, so they are saved and restored around each.
    #    ``current_gradient_accumulation_steps``, which TRL's training loop sets and the loss reads.
    # 3. ``vllm_generation.sync_weights``: TRL's weight push to vLLM, wrapped to ship the recipe's
    #    quantized weights (same names and shapes) instead of the master weights; and
    #    ``vllm_generation._iter_named_params``, the (name, tensor) stream it pushes, mapped to the
    #    checkpoint names vLLM's loaders take (fused MoE experts split per expert: vllm_weights.py).
    # 4. ``_get_per_token_logps_and_entropies`` and the keys of the dict that
    #    ``_generate_and_score_completions`` returns (prompt/completion ids and masks, vLLM's
    #    ``sampling_per_token_logps``): the mismatch ledger scores the rollouts under both policies.
    # 5. ``use_vllm`` and ``vllm_importance_sampling_correction``: what the trainer actually runs.
    # 6. transformers' ``Trainer._load_from_checkpoint``: a checkpoint's weights (plain, sharded, FSDP,
    #    DeepSpeed) for a cell whose training had finished before it was killed.

    @property
    def uses_vllm(self) -> bool:
        """Whether this trainer generates its rollouts with vLLM."""
        return bool(getattr(self, "use_vllm", False))

    @property
    def truncated_is_applied(self) -> bool:
        """Whether TRL applies its importance-sampling correction to vLLM rollouts."""
        return self.uses_vllm and bool(getattr(self, "vllm_importance_sampling_correction", False))

    def load_checkpoint_weights(self, checkpoint: Path) -> None:
        """The model's weights as this trainer saved them in ``checkpoint`` (no optimizer state, no step)."""
        self._load_from_checkpoint(str(checkpoint))
        clear_weight_caches(self.model)

    def scored_batch(self, inputs: list[dict]) -> dict:
        """A GRPO batch of ``inputs`` (prompt and reward columns, each prompt repeated
        ``num_generations`` times): rollouts generated by the model as it is, scored, with advantages."""
        with torch.no_grad():
            return self._generate_and_score_completions(inputs)

    def batch_loss(self, batch: dict) -> torch.Tensor:
        """TRL's GRPO loss of ``batch`` (from ``scored_batch``) on the model, TRL's logged metrics left
        as they were (outside a training run: one micro-batch makes the step)."""
        if not hasattr(self, "current_gradient_accumulation_steps"):
            self.current_gradient_accumulation_steps = 1
        return self._without_logging(lambda: self.compute_loss(self.model, batch))

    def _generate_and_score_completions(self, inputs):
        step = self.state.global_step
        perturbed = (self.rollouts_weights_only and not self.uses_vllm
                     or any(lifecycle(c.perturbs_rollout, step) for c in self.mx_corrections))
        with contextlib.ExitStack() as stack:
            for c in self.mx_corrections:
                stack.enter_context(lifecycle(c.rollout_context, self.model, step))
            stack.enter_context(self.generation_precision())
            stack.enter_context(self.generation_weight_cache())
            with self.timed("rollout"):
                output = super()._generate_and_score_completions(inputs)
            # the ledger's scoring passes are an instrument, like the probe: timed apart from the step (the
            # rollout context's exit, the recipe's own work, stays in the step)
            with self.timed("ledger"):
                rollout = output.get("sampling_per_token_logps")  # vLLM's own log-probs of what it sampled
                if rollout is None and perturbed:
                    rollout = self._completion_logps(output)  # the policy that sampled: under the rollout context
        with self.timed("ledger"):
            train = self._completion_logps(output) if rollout is not None else None
            self.mx_step_metrics.update(self._gathered_ledger(train, rollout, output["completion_mask"]))
        return output

    @property
    def rollouts_weights_only(self) -> bool:
        """Whether the recipe generates with its weights alone quantized while it trains W4A4."""
        return self.mx_quantizer is not None and self.mx_quantizer.weights_only_rollouts

    def generation_precision(self):
        """The precision the policy generates in, for a rollout or an evaluation: weights only (W4A16) where the
        recipe says so, else the training forward's."""
        return generation_precision(self.model, self.mx_quantizer)

    def generation_weight_cache(self):
        """``rollout_weight_cache`` of the policy, for a rollout or an evaluation: nothing cached where
        accelerate shards the parameters (FSDP, DeepSpeed)."""
        return rollout_weight_cache(self.model, sharded=self.is_fsdp_enabled or self.is_deepspeed_enabled)

    def _completion_logps(self, output) -> torch.Tensor:
        """Per-token log-probs of the completions under the model as it is now (no grad; the run's
        random stream untouched)."""
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        with torch.no_grad(), observer_rng():
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model,
                ids,
                mask,
                output["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size,
            )
        return logps.float()

    def _without_logging(self, fn):
        """Run ``fn()`` leaving TRL's logged metrics as they were."""
        logged = copy.deepcopy(self._metrics)
        window = copy.deepcopy(getattr(self, "_entropy_window_stats", None))  # absent in some TRL versions
        try:
            return fn()
        finally:
            self._metrics, self._entropy_window_stats = logged, window

    def _push_quantized_weights_to_vllm(self):
        gen = self.vllm_generation
        stream = gen._iter_named_params
        gen._iter_named_params = lambda: vllm_named_weights(stream())
        sync = gen.sync_weights

        def sync_quantized():
            with quantized_weights(self.model):
                sync()

        gen.sync_weights = sync_quantized

    # ---------------------------------------------------------------- TRL INTERNALS (end)

    def _gathered_ledger(self, train, rollout, mask) -> dict:
        """The mismatch ledger over the tokens of every process (padded to one width, gathered)."""
        if train is not None and self.accelerator.num_processes > 1:
            train, rollout, mask = (
                self.accelerator.gather(self.accelerator.pad_across_processes(t, dim=1)) for t in (train, rollout, mask)
            )
        return mismatch_ledger(train, rollout, mask)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        step = self.state.global_step
        probing = (
            self.mx_quantizer is not None
            and self.mx_probe_every
            and step % self.mx_probe_every == 0
            and self._mx_probed_step != step
        )  # the step's first micro-batch only
        if not probing:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self._mx_probed_step = step
        with self.timed("probe"):  # the probe's time is not the step's
            probed = inputs
            if self.mx_probe_batch is not None:
                device = self.accelerator.device
                probed = {k: v.to(device) if torch.is_tensor(v) else v for k, v in self.mx_probe_batch.items()}
            with observer_rng():
                self._probe(model, probed, num_items_in_batch)
            self.mx_step_metrics["probe/batch"] = batch_digest(probed)  # which batch this probe scored
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _probe(self, model, inputs, num_items_in_batch):
        """Gradient accuracy and decomposition statistics on this micro-batch, in passes of its own
        (the training loss is computed as on any step). DDP's wrapper is stepped around: the probe's
        forward and backward passes run on the module itself and reduce nothing."""
        model = self.accelerator.unwrap_model(model)
        probe = DecompositionProbe(self.mx_quantizer, self.mx_probe_layers, self.mx_probe_rows)
        for name, module, _ in patched_modules(model):
            if name in self.mx_probe_layers and not self.mx_quantizer.transforms_gemm:  # else: in each step's basis
                probe(name, "weight", next(iter(gemm_weights(module).values())).detach(), -1)
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

        @contextlib.contextmanager
        def probed():
            set_probe(model, probe)
            try:
                yield
            finally:
                set_probe(model, None)

        def grads(context):
            """The loss's gradients under ``context``, TRL's logged metrics left as they were."""

            def run():
                with context:
                    loss = super(MXGRPOTrainer, self).compute_loss(model, inputs, False, num_items_in_batch)
                    return torch.autograd.grad(loss, [p for _, p in params], allow_unused=True)

            return self._without_logging(run)

        g_q = grads(probed())  # the recipe's quantized passes, statistics collected on the way
        g_r = grads(bypassed(model))  # the full-precision shadow passes
        quant = {n: g for (n, _), g in zip(params, g_q) if g is not None}
        ref = {n: g for (n, _), g in zip(params, g_r) if g is not None and n in quant}
        acc = compare(quant, ref)
        metrics = {"grad/cosine": acc["total"]["cosine"], "grad/rel_norm_error": acc["total"]["rel_norm_error"]}
        for layer, v in acc["per_layer"].items():
            metrics[f"grad/{layer}/cosine"] = v["cosine"]
            metrics[f"grad/{layer}/rel_norm_error"] = v["rel_norm_error"]
        metrics.update(probe.summary())
        self.mx_step_metrics.update(metrics)


def build_trainer(model, tokenizer, args, train_dataset, reward: str = "accuracy", **probes) -> MXGRPOTrainer:
    """TRL's GRPO trainer of this harness: the policy ``model``, the ``reward`` (``data.<reward>_reward``,
    looked up at the call; GSM8K accuracy by default), ``args`` (a ``GRPOConfig``, ``training.grpo_config``) and
    the prompts of ``train_dataset``; ``probes`` are ``MXGRPOTrainer``'s own arguments (corrections,
    probe_every, probe_rows, probe_batch)."""
    return MXGRPOTrainer(model=model, reward_funcs=[getattr(gsm, f"{reward}_reward")], args=args,
                         train_dataset=train_dataset, processing_class=tokenizer, **probes)


class WeightCacheReset(TrainerCallback):
    """Clears the patched layers' quantized-weight caches after every optimizer step: under FSDP2 /
    ZeRO-3 an updated weight can come back in the same storage with the same version counter."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_optimizer_step(self, args, state, control, **kw):
        clear_weight_caches(self.trainer.model)


STATE_FILE = "mxfp4_state.json"


class StepLogger(TrainerCallback):
    """Writes one JSON line per step (TRL's logs, the probes' metrics, the ledger, the corrections'
    metrics, ``step_time`` without the probe and the ledger, ``probe_time``, ``ledger_time`` (the ledger's
    scoring passes), ``rollout_time`` (generation and scoring, inside ``step_time``), the Triton
    autotuning inside them (``autotune_time`` of ``step_time``,
    ``rollout_autotune_time`` of ``rollout_time``, ``autotune_keys`` new keys in the step, probe included:
    a step that meets a new shape bucket tunes it, on CUDA only) and on GPU the step's ``peak_memory_gib``
    (the most bytes in tensors) and ``peak_reserved_gib`` (the most the caching allocator held: the margin to
    an out-of-memory error that fragmentation eats)),
    passes the step's metrics to every correction's ``observe``, stops the run at a step whose gradient
    norm is not finite, and adds to every checkpoint what a resumed cell needs (``on_save``). Only the main
    process writes."""

    def __init__(self, trainer: MXGRPOTrainer, path: Path, progress=None, config_hash: str | None = None):
        self.trainer, self.path, self.progress, self.config_hash = trainer, Path(path), progress, config_hash
        self.t0 = self.tuned0 = None
        self.step_time = None
        self.probe_time = self.rollout_time = self.ledger_time = 0.0
        self.autotune = {"autotune_time": 0.0, "rollout_autotune_time": 0.0, "autotune_keys": 0}
        self.memory = {"peak_memory_gib": None, "peak_reserved_gib": None}  # on GPU only

    def on_step_begin(self, args, state, control, **kw):
        self.t0, self.tuned0 = synced_clock(), autotune_spent()
        self.trainer.begin_step()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

    def on_step_end(self, args, state, control, **kw):
        spent, tuned = self.trainer.mx_seconds, self.trainer.mx_autotune
        self.probe_time, self.rollout_time, self.ledger_time = spent["probe"], spent["rollout"], spent["ledger"]
        self.step_time = synced_clock() - self.t0 - self.probe_time - self.ledger_time
        seconds, keys = autotune_spent()
        self.autotune = {
            "autotune_time": seconds - self.tuned0[0] - tuned["probe"] - tuned["ledger"],
            "rollout_autotune_time": tuned["rollout"],
            "autotune_keys": keys - self.tuned0[1],
        }
        if torch.cuda.is_available():
            self.memory = {"peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
                           "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30}

    def on_log(self, args, state, control, logs=None, **kw):
        if logs is None or "train_runtime" in logs:
            return
        row = {
            "step": state.global_step,
            **logs,  # first: TRL logs a "step_time" of its own (the whole step, the probe included)
            "step_time": self.step_time,
            "probe_time": self.probe_time,
            "rollout_time": self.rollout_time,
            "ledger_time": self.ledger_time,
            **self.autotune,
            **self.memory,
            **self.trainer.take_step_metrics(),
        }
        for c in self.trainer.mx_corrections:
            row.update(lifecycle(c.metrics))
        for c in self.trainer.mx_corrections:
            lifecycle(c.observe, row)
        if state.is_world_process_zero:
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            if self.progress is not None:
                self.progress(row)
        norm = logs.get("grad_norm")
        if norm is not None and not math.isfinite(norm):
            # the optimizer has applied it: every weight is now non-finite, and the next rollout would stop
            # on a device-side assert far from the cause
            raise FloatingPointError(
                f"step {state.global_step}: the gradient norm is {norm}, so the optimizer step made the weights "
                f"non-finite; stopping the run (the step's row is in {self.path.name})")

    def on_save(self, args, state, control, **kw):
        """The checkpoint the trainer just wrote gets the log so far, the corrections' state and a
        manifest of its files' SHA-256 (``checkpoint_manifest``); ``mxfp4_state.json`` last, so that its
        presence marks a complete checkpoint and its manifest lets a resume verify it."""
        self.trainer.accelerator.wait_for_everyone()  # every rank's files of this checkpoint are written
        if not state.is_world_process_zero:
            return
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        shutil.copyfile(self.path, folder / TRAIN_LOG)
        payload = sealed_state({
            "step": state.global_step,
            "config_hash": self.config_hash,
            "corrections": [lifecycle(c.state_dict) for c in self.trainer.mx_corrections],
            "files": checkpoint_manifest(folder),
        })
        tmp = folder / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(payload))
        tmp.rename(folder / STATE_FILE)


def _state_digest(state: dict) -> str:
    """SHA-256 of a checkpoint state's content (every key but the digest, canonical JSON)."""
    body = {k: v for k, v in state.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def sealed_state(state: dict) -> dict:
    """The checkpoint state with the digest of its own content, so that the state file is inside the checksums
    too (a flipped step or correction state is found like a flipped weight)."""
    return {**state, "digest": _state_digest(state)}


def checkpoint_manifest(folder: Path) -> dict[str, str]:
    """SHA-256 of every file of a checkpoint folder (paths relative to it), the state file aside."""
    out = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(STATE_FILE)):
        out[str(f.relative_to(folder))] = file_sha256(f)
    return out


def checkpoint_problem(checkpoint: Path, config_hash: str | None) -> str | None:
    """Why ``checkpoint`` cannot be resumed (None: it can): no state file (an interrupted save), a state that is
    no JSON object or differs from its own digest (``sealed_state``) or names another step, another
    configuration's, no manifest, or a file missing or changed since it was written (a truncated or corrupted
    write)."""
    try:
        state = json.loads((checkpoint / STATE_FILE).read_text())
    except FileNotFoundError:
        return "no state file (the save was interrupted)"
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"{STATE_FILE} is not JSON"
    if not isinstance(state, dict):
        return f"{STATE_FILE} holds {type(state).__name__}, not a JSON object"
    if state.get("digest") != _state_digest(state):
        return f"{STATE_FILE} differs from its own digest (SHA-256), a changed or corrupted state"
    if not checkpoint.name.endswith(f"-{state.get('step')}"):
        return f"{STATE_FILE} names step {state.get('step')!r}, the folder another"
    if state.get("config_hash") != config_hash:
        return "a checkpoint of another configuration (config hash differs)"
    files = state.get("files")
    if not isinstance(files, dict) or not files:
        return "no manifest of its files"
    now = checkpoint_manifest(checkpoint)
    for name, digest in files.items():
        if name not in now:
            return f"{name} is missing"
        if now[name] != digest:
            return f"{name} differs from its manifest (SHA-256), a truncated or corrupted file"
    return None


def last_checkpoint(folder: Path, config_hash: str | None, report=None) -> Path | None:
    """The newest checkpoint under ``folder`` that this exact cell configuration can resume from
    (``checkpoint_problem`` finds nothing wrong with it), or None; ``report(checkpoint, why)`` hears of
    each newer one passed over."""
    if not folder.is_dir():
        return None
    found = sorted(((int(d.name.split("-")[-1]), d) for d in folder.glob(f"{PREFIX_CHECKPOINT_DIR}-*")
                    if d.name.split("-")[-1].isdigit()), reverse=True)
    for _, d in found:
        why = checkpoint_problem(d, config_hash)
        if why is None:
            return d
        if report is not None:
            report(d, why)
    return None


def resume_state(checkpoint: Path, log_path: Path | None, corrections) -> int:
    """Restore the corrections' run state saved with ``checkpoint`` and (``log_path`` given: the main
    process) the log up to it; the checkpoint's step."""
    payload = json.loads((checkpoint / STATE_FILE).read_text())
    if len(payload["corrections"]) != len(corrections):
        raise ValueError(
            f"{checkpoint} holds the state of {len(payload['corrections'])} corrections, the recipe has "
            f"{len(corrections)}: it is not a checkpoint of this cell"
        )
    for c, st in zip(corrections, payload["corrections"]):
        lifecycle(c.load_state_dict, st)
    if log_path is not None:
        shutil.copyfile(checkpoint / TRAIN_LOG, log_path)
    return int(payload["step"])

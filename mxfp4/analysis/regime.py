"""Is the miniature in the regime of real LLMs? The statistics MXFP4 cares about, of every GEMM operand.

The method in full: docs/methods.md, ``mxfp4.analysis.regime``."""

from __future__ import annotations

import csv
import random
import re

import numpy as np
import torch

from ..config import EXPERIMENTS, load_yaml
from ..config.data_files import gsm8k_folder
from ..config.recipes import Recipe
from ..config.run import Run, Start
from ..layout import Layout
from ..nn import gemm_weights, patch_model, patched_modules, unpatch_model
from ..numerics.decompose import COMPONENTS, decompose
from ..numerics.quantizer import Quantizer
from ..rl import data as gsm
from ..rl.batches import probe_trainer
from ..rl.models import load, model_reference
from ..rl.probe_batch import ensure_probe_batch, load_probe_batch
from .teacher_forced import completion_nll, token_pairs
from .weight_components import regime_stats

LITERATURE_FILE = EXPERIMENTS / "regime_literature.yaml"
OPERANDS = ("weight", "activation", "grad")  # the probe's kinds: forward input X and input-gradient dY
BATCHES = {  # what each ``regime_batch`` puts through the GEMMs (the table's batch column)
    "grpo-probe": "the model and seed's GRPO probe batch (its prompts and sampled completions, the GRPO loss)",
    "gsm8k-test": "real GSM8K test questions with their reference solutions (the solutions' teacher-forced loss)",
}
GAIN_PREFIX = "gain_"  # the same Shapley shares in the gain form (docs/decomposition.md)
STAT_KEYS = ("excess_kurtosis", "max_over_median", "outlier_block_fraction", "deadzone_fraction",
             "saturation_fraction", *(f"shapley_share_{c}" for c in COMPONENTS),
             *(f"{GAIN_PREFIX}shapley_share_{c}" for c in COMPONENTS))


class ObservingQuantizer(Quantizer):
    """A quantizer that rounds nothing: every patched GEMM computes in full precision, and the probe
    sees each operand where the recipe's quantizer would take it."""

    @property
    def plain(self) -> bool:  # never the fused Triton paths (they would quantize)
        return False

    def __call__(self, x: torch.Tensor, axis: int, valid: torch.Tensor | None = None, operand=None) -> torch.Tensor:
        return x


class OperandCollector:
    """The probe: every tensor of the ``kinds`` it is shown, as rows blocked along their last axis
    (the quantization axis moved last), by (layer, kind, width of that axis); repeated calls append
    rows. The width tells a fused experts module's two GEMMs apart (gate_up reads H and writes 2I,
    down reads I and writes H)."""

    def __init__(self, kinds=("activation", "grad")):
        self.kinds = set(kinds)
        self.tensors: dict[tuple[str, str, int], list[torch.Tensor]] = {}

    def __call__(self, layer: str, kind: str, tensor: torch.Tensor, axis: int, valid=None) -> None:
        if kind not in self.kinds:
            return
        t = tensor.detach().float().movedim(axis, -1)
        self.tensors.setdefault((layer, kind, t.shape[-1]), []).append(t.reshape(-1, t.shape[-1]).cpu())

    def operand(self, layer: str, kind: str, width: int) -> torch.Tensor | None:
        parts = self.tensors.get((layer, kind, width))
        return torch.cat(parts) if parts else None


def operand_stats(t: torch.Tensor, quantizer: Quantizer, rows: int | None = 4096) -> dict:
    """Regime statistics and the decomposition's fractions and Shapley shares (canonical and gain form) of a
    2D operand (blocks along its last axis), on at most ``rows`` evenly spaced rows (float64 memory
    bounded). Rows that are entirely zero are dropped first (counted in ``zero_rows``): the gradient rows of
    padding and of positions outside the loss, which carry no quantization error and would read as deadzone."""
    nonzero = t.abs().amax(-1) > 0
    zero_rows = int((~nonzero).sum())
    t = t[nonzero]
    if t.shape[0] == 0:
        return {"elements": 0, "zero_rows": zero_rows}
    if rows is not None and t.shape[0] > rows:
        t = t[torch.linspace(0, t.shape[0] - 1, rows).long()]
    s = decompose(t.float(), quantizer.fmt, -1, quantizer.scale_rule).stats  # float64 inside
    g = decompose(t.float(), quantizer.fmt, -1, quantizer.scale_rule, form="gain").stats
    return {"elements": t.numel(), "zero_rows": zero_rows, **regime_stats(t, quantizer.fmt.block_size),
            **{k: s[k] for k in STAT_KEYS if k in s},
            **{f"{GAIN_PREFIX}{k}": g[k] for k in (f"shapley_share_{c}" for c in COMPONENTS)}}


def depth(layer: str) -> int | None:
    m = re.search(r"\.layers\.(\d+)\.", layer)
    return int(m.group(1)) if m else None


def observe(model, loss_fn, quantizer: Quantizer | None = None) -> tuple[OperandCollector, list]:
    """Run ``loss_fn(model)`` forward and backward with every layer ``quantizer`` (default: the mxfp4
    recipe's) would quantize patched to observe, not round; (the collector, [(layer, module)]). The
    model is unpatched after."""
    q = quantizer or Recipe.named("mxfp4").quantizer()
    collector = OperandCollector()
    patch_model(model, ObservingQuantizer(q.fmt.name, q.scale_rule, modules=q.modules), probe=collector)
    try:
        layers = [(name, module) for name, module, _ in patched_modules(model)]
        params = [p for p in model.parameters() if p.requires_grad]
        torch.autograd.grad(loss_fn(model), params, allow_unused=True)
    finally:
        unpatch_model(model)
    return collector, layers


def regime_rows(model, model_name: str, loss_fn, recipe: str = "mxfp4", rows: int | None = 4096,
                batch: str = "grpo-probe") -> list[dict]:
    """One row per (GEMM weight, operand) of ``model`` (``OPERANDS``) on the batch ``loss_fn`` scores
    (named by ``batch``, a key of ``BATCHES``):
    the weight, the forward GEMM's input (as wide as the weight's input dimension) and the input-gradient
    GEMM's dY (as wide as its output dimension); a fused experts module has a gate_up and a down row each."""
    quantizer = Recipe.named(recipe).quantizer()
    collector, layers = observe(model, loss_fn, quantizer)
    out = []
    for name, module in layers:
        for attr, w in gemm_weights(module).items():
            label = name if attr == "weight" else f"{name}.{attr}"
            operands = {"weight": w.detach().float().reshape(-1, w.shape[-1]),
                        "activation": collector.operand(name, "activation", w.shape[-1]),
                        "grad": collector.operand(name, "grad", w.shape[-2])}
            for kind, t in operands.items():
                if t is not None:
                    out.append({"model": model_name, "batch": batch, "layer": label, "depth": depth(name),
                                "operand": kind, "shape": "x".join(map(str, t.shape)),
                                **operand_stats(t, quantizer, rows)})
    return out


def literature() -> list[dict]:
    """The published figures for real LLMs (``experiments/regime_literature.yaml``), each with its source."""
    return load_yaml(LITERATURE_FILE)["figures"]


def summary_markdown(rows: list[dict]) -> str:
    """Per model and operand: the median [min, max] over the model's GEMMs (every layer's) of each
    statistic; then the published figures for real LLMs beside them."""
    out = ["| model | batch | operand | GEMMs | " + " | ".join(STAT_KEYS) + " |",
           "| --- | --- | --- | --- | " + " | ".join("---" for _ in STAT_KEYS) + " |"]
    for model, batch in dict.fromkeys((r["model"], r["batch"]) for r in rows):
        for kind in OPERANDS:
            sel = [r for r in rows if (r["model"], r["batch"], r["operand"]) == (model, batch, kind)]
            if not sel:
                continue
            cells = []
            for k in STAT_KEYS:
                v = np.array([float(r[k]) for r in sel if r.get(k) is not None])
                cells.append(f"{np.median(v):.3g} [{v.min():.3g}, {v.max():.3g}]" if v.size else "n/a")
            out.append(f"| {model} | {batch} | {kind} | {len(sel)} | " + " | ".join(cells) + " |")
    lit = ["| quantity | operand | published value | model | source |", "| --- | --- | --- | --- | --- |"]
    for f in literature():
        lit.append(f"| {f['quantity']} | {f['operand']} | {f['value']} | {f['model']} | {f['source']} |")
    batches = "; ".join(f"{k}: {BATCHES[k]}" for k in dict.fromkeys(r["batch"] for r in rows))
    return ("Regime statistics of the GEMM operands, median [min, max] over every layer's GEMMs (blocks along the "
            "axis each GEMM reduces; the activations and gradients of one batch through the policy in full "
            f"precision ({batches}); excess kurtosis: 0 for a Gaussian).\n\n" + "\n".join(out)
            + "\n\nPublished figures for real LLMs (what each source reports, on the tensor it names):\n\n"
            + "\n".join(lit) + "\n")


def run_regime(run: Run, seed: int | None = None, progress=lambda msg: None) -> list[dict]:
    """Rows of every model of the profile at its starting policy, on the batch of ``seed`` (default: the
    profile's first seed) that ``regime_batch`` names: the probe batch (made if missing), or as many GSM8K
    test questions as a GRPO batch has sequences, with their reference solutions."""
    profile = run.profile
    seed = profile.seeds[0] if seed is None else seed
    out = []
    for model_name in profile.models:
        progress(f"regime statistics of {model_name} (seed {seed}, {profile.regime_batch} batch)")
        start = run.start(model_name, seed)
        model, tokenizer = load(model_reference(start), dtype=torch.float32)
        model.train()
        if profile.regime_batch == "gsm8k-test":
            loss = gsm8k_loss(start, tokenizer)
        else:
            batch = load_probe_batch(ensure_probe_batch(start), model_name, seed)
            trainer = probe_trainer(model, tokenizer, profile, seed, prompts=profile.grpo.prompts_per_step)
            loss = lambda m, t=trainer, b=batch: t.batch_loss(b)  # noqa: E731
        out += regime_rows(model, model_name, loss, rows=profile.probe_rows, batch=profile.regime_batch)
    for other in profile.regime_beside:
        out += stored_rows(run.layout.sibling(other))
    return out


def gsm8k_loss(start: Start, tokenizer):
    """The teacher-forced loss of reference solutions to GSM8K test questions drawn with ``start``'s seed, as many
    as a GRPO batch has sequences, prompted as the model's policy is (``data.prompt``)."""
    profile, model_name, seed = start.profile, start.model, start.seed
    test = gsm.load_gsm8k("test", gsm8k_folder(profile))
    problems = random.Random(seed).sample(test, profile.grpo.prompts_per_step * profile.grpo.num_generations)
    chat = profile.model(model_name).chat
    ids = token_pairs(tokenizer, [gsm.prompt(r["question"], tokenizer, chat) for r in problems],
                      [r["answer"] for r in problems])
    return lambda m: completion_nll(m, *ids, tokenizer.pad_token_id or 0)


TEXT_FIELDS = ("model", "batch", "layer", "operand", "shape")


def stored_rows(layout: Layout) -> list[dict]:
    """The regime rows of another profile's stored baselines (``layout``: that profile's), each model named with
    that profile: what a profile shows beside its own measurements (``regime_beside``), read, not measured
    again."""
    profile_name = layout.profile
    path = layout.stored(layout.regime)
    if not path.is_file():
        raise ValueError(f"regime_beside names {profile_name!r}, whose stored baselines hold no {path}; store them "
                         f"(snakemake --cores all store_baselines --config profile={profile_name}) or drop the name")
    with path.open() as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k, v in r.items():
            if k not in TEXT_FIELDS:
                r[k] = None if v == "" else int(v) if k == "depth" else float(v)
        r["model"] = f"{r['model']} ({profile_name}, stored)"
    return rows

"""The decomposition over every quantized weight tensor of a profile's models, in both forms: per tensor
the energies, shares, cross term, Shapley shares and the pairwise cosine similarity of the three
components (the paper's Figure 1 shows these cosines over 18,624 Qwen3-30B weight tensors), with the
tensor's regime statistics (excess kurtosis, max/median |x|, outlier-block, deadzone and saturation
fractions: whether the tiny models are as heavy-tailed as real LLMs). Blocks run along the weight's
input dimension, as the forward GEMM quantizes it."""

from __future__ import annotations

import numpy as np
import torch

from ..config.recipes import Recipe
from ..config.run import Run
from ..nn import gemm_weights, patch_model, patched_modules
from ..numerics.decompose import COMPONENTS, FORMS, PAIRS, decompose
from ..rl.models import load, warm_start_folder

KEYS = ("n", "energy_total", *(f"{k}_{c}" for k in ("energy", "share", "shapley_share") for c in COMPONENTS),
        "cross_share", *(f"cosine_{a}_{b}" for a, b in PAIRS), "deadzone_fraction", "saturation_fraction")


OUTLIER_RATIO = 2.0  # a block's largest |x| at least this many times its second largest: it alone sets the scale


def regime_stats(w: torch.Tensor, block_size: int = 32) -> dict:
    """How heavy-tailed a tensor is, in the terms MXFP4 cares about: excess kurtosis (Fisher; 0 for a
    Gaussian), max/median |x|, and the fraction of blocks (along the last axis; trailing partial block
    dropped) whose largest |x| is at least ``OUTLIER_RATIO`` times the second largest, so that one
    outlier sets the shared scale and pushes the block's other values down by a binade or more."""
    x = w.detach().double().flatten()
    centred = x - x.mean()
    var = centred.pow(2).mean()
    kurtosis = float(centred.pow(4).mean() / var.pow(2) - 3) if var > 0 else 0.0
    a = x.abs()
    median = float(np.median(a.numpy()))  # the midpoint of the two middle values (torch's median takes the lower)
    full = w.shape[-1] // block_size * block_size
    blocks = w.detach().double()[..., :full].abs().reshape(-1, block_size) if full else a.new_zeros(0, block_size)
    top2 = blocks.topk(2, dim=-1).values if blocks.shape[0] else blocks[:, :2]
    outlier = (top2[:, 0] >= OUTLIER_RATIO * top2[:, 1]) & (top2[:, 0] > 0)
    return {"excess_kurtosis": kurtosis, "max_over_median": float(a.max()) / median if median > 0 else float("inf"),
            "outlier_block_fraction": float(outlier.double().mean()) if blocks.shape[0] else 0.0}


def tensor_rows(model, model_name: str, recipe: str = "mxfp4") -> list[dict]:
    """One row per (quantized weight tensor, form) of ``model`` under ``recipe``'s format and rule."""
    quantizer = Recipe.named(recipe).quantizer()
    patch_model(model, quantizer)
    rows = []
    for name, module, _ in patched_modules(model):
        for key, weight in gemm_weights(module).items():
            for tensor, w in _tensors(f"{name}.{key}", weight.detach().float()):
                regime = regime_stats(w, quantizer.fmt.block_size)
                for form in FORMS:
                    s = decompose(w, quantizer.fmt, -1, quantizer.scale_rule, form=form).stats
                    rows.append({"model": model_name, "tensor": tensor, "shape": "x".join(map(str, w.shape)),
                                 "form": form, **{k: s[k] for k in KEYS}, **regime})
    return rows


def _tensors(name: str, w: torch.Tensor):
    """The paper's tensors: a fused expert weight [E, ...] is E tensors, and a fused gate_up [E, 2I, H]
    is a gate and an up projection per expert (18,624 = 48 layers x (128 experts x 3 + 4 attention))."""
    if w.ndim == 2:
        yield name, w
        return
    for e in range(w.shape[0]):
        if name.endswith("gate_up_proj"):
            half = w.shape[1] // 2
            yield f"{name.removesuffix('gate_up_proj')}{e}.gate_proj", w[e, :half]
            yield f"{name.removesuffix('gate_up_proj')}{e}.up_proj", w[e, half:]
        else:
            yield f"{name}.{e}", w[e]


def summary_markdown(rows: list[dict]) -> str:
    """Per model and form: the number of tensors and the median [25th, 75th percentile] over tensors of
    each share and each pairwise cosine."""
    cols = [*(f"share_{c}" for c in COMPONENTS), "cross_share", *(f"shapley_share_{c}" for c in COMPONENTS),
            *(f"cosine_{a}_{b}" for a, b in PAIRS), "deadzone_fraction", "saturation_fraction", "excess_kurtosis",
            "max_over_median", "outlier_block_fraction"]
    out = ["| model | form | tensors | " + " | ".join(cols) + " |",
           "| --- | --- | --- | " + " | ".join("---" for _ in cols) + " |"]
    for model in dict.fromkeys(r["model"] for r in rows):
        for form in FORMS:
            sel = [r for r in rows if r["model"] == model and r["form"] == form]
            if not sel:
                continue
            cells = []
            for c in cols:
                q25, q50, q75 = np.percentile([float(r[c]) for r in sel], [25, 50, 75])
                cells.append(f"{q50:+.3f} [{q25:+.3f}, {q75:+.3f}]")
            out.append(f"| {model} | {form} | {len(sel)} | " + " | ".join(cells) + " |")
    return ("Median [25th, 75th percentile] over weight tensors (blocks along the input dimension, the recipe "
            "mxfp4).\n\n" + "\n".join(out) + "\n")


def run_weight_components(run: Run) -> list[dict]:
    """Rows of every tiny warm-started model (or hub model) of the run's profile."""
    rows = []
    for model_name, spec in run.profile.models.items():
        path = warm_start_folder(run, model_name) if spec.arch else spec.hub
        model, _ = load(str(path), dtype=torch.float32)
        rows += tensor_rows(model, model_name)
    return rows

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
from ..nn import gemm_weights, patch_model, patched_modules, unpatch_model
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
        path = warm_start_folder(run.start(model_name)) if spec.arch else spec.hub
        model, _ = load(str(path), dtype=torch.float32)
        rows += tensor_rows(model, model_name)
    return rows


Q41_BLOCK = 32  # GGUF's Q4_1 block: 32 consecutive weights of a row share a step d and an offset m, w = m + d q


def q41_dithered(weight: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A Q4_1-dequantized weight moved off its 16-level grid: each value plus a uniform draw within its own grid
    cell (+-d/2, d = the block's (max - min) / 15, the step Q4_1 gives a block whose extremes are codes 0 and 15).
    What the Q4_1 source changes in a weight's MXFP4 decomposition is then the difference between the two: the
    dithered tensor has the block's continuous spread, as a BF16 checkpoint's would, with the same coarse shape.
    Blocks run along the last axis, as GGUF stores a row; a row whose length is not a multiple of 32 is an error."""
    if weight.shape[-1] % Q41_BLOCK:
        raise ValueError(f"a Q4_1 weight's rows are whole blocks of {Q41_BLOCK}; got a last axis of {weight.shape[-1]}")
    w = weight.detach().double().reshape(*weight.shape[:-1], -1, Q41_BLOCK)
    step = (w.amax(-1, keepdim=True) - w.amin(-1, keepdim=True)) / 15
    noise = torch.rand(w.shape, generator=generator, dtype=torch.float64) - 0.5
    return (w + noise * step).reshape(weight.shape).to(weight.dtype)


def q41_sensitivity(model, quantizer, seed: int = 0) -> dict:
    """The pooled MXFP4 weight decomposition of ``model`` (``grpo.weight_decomposition``) as loaded and with every
    quantized weight moved off its Q4_1 grid (``q41_dithered``, in place on a copy of the values, restored after),
    with each component's share and the change."""
    from ..rl.grpo import weight_decomposition

    def shares(d):
        return {c: d[f"energy_{c}"] / d["energy_total"] for c in COMPONENTS}

    patch_model(model, quantizer)
    try:
        before = shares(weight_decomposition(model, quantizer))
        g = torch.Generator().manual_seed(seed)
        saved = {}
        with torch.no_grad():
            for name, module, _ in patched_modules(model):
                for key, p in gemm_weights(module).items():
                    saved[(name, key)] = p.detach().clone()
                    p.copy_(q41_dithered(p, g))
        try:
            after = shares(weight_decomposition(model, quantizer))
        finally:
            with torch.no_grad():
                for name, module, _ in patched_modules(model):
                    for key, p in gemm_weights(module).items():
                        p.copy_(saved[(name, key)])
    finally:
        unpatch_model(model)
    return {"method": "pooled MXFP4 energy shares of every decoder weight, as loaded (Q4_1-dequantized) and each "
                      "value moved uniformly within its Q4_1 grid cell (seeded)",
            "seed": seed, "tensors": len(saved), "as_loaded": before, "off_grid": after,
            "change": {c: after[c] - before[c] for c in COMPONENTS}}

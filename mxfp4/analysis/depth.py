"""The depth law of scale bias: does its error compound multiplicatively through the backward pass?

A per-layer gain on the backward GEMMs shows in the gradient's norm, not its direction: were every layer's
backward pass scaled by g, the gradient of the layer d layers below the output would be g^(d+1) times the
unquantized one, so log(norm ratio) falls on a line in d whose slope is log g. Per gradient batch, arm
(each component injected alone, its sign-flip control, full MXFP4) and site, the per-layer norm ratio and
cosine against the unquantized gradient of the same batch; per batch the least-squares slope of
log(norm ratio) against d; the slope's mean and t interval over batches. Models of several depths
(their own warm starts) say whether the slope holds as the model deepens.

The method in full: docs/methods.md, ``mxfp4.analysis.depth``."""

from __future__ import annotations

import re

import numpy as np

from ..config.profiles import Profile
from ..io import write_csv_atomic
from ..rl import data as gsm
from ..rl.batches import batch_gradient, gradient_batches, probe_trainer
from ..rl.grad_accuracy import compare
from ..rl.models import load, warm_start_folder
from ..stats import mean_ci
from .pathways import Arm, row_quantizer, seed_problems

DEPTH_ARMS = ("+scale", "+dead", "+grid", "all")
UNIT_FIELDS = ["model", "layers", "form", "arm", "site", "batch", "layer", "distance", "norm_ratio", "cosine"]
ROW_FIELDS = ["model", "layers", "form", "arm", "site", "measure", "distance", "mean", "ci_low", "ci_high", "n",
              "method"]
_LAYER = re.compile(r"^layer(\d+)$")


def depth_arms(controls) -> list[str]:
    """Each component injected alone, its control of each kind, and full MXFP4."""
    return [*DEPTH_ARMS[:3], *(f"+{c}~{k}" for k in controls for c in ("scale", "dead", "grid")), "all"]


def decoder_layers(per_layer: dict[str, dict]) -> dict[int, dict]:
    """The decoder layers of a ``compare`` result by index (embeddings, final norm and head left out)."""
    return {int(m.group(1)): v for k, v in per_layer.items() if (m := _LAYER.match(k))}


def log_slope(ratio_by_distance: dict[int, float]) -> float | None:
    """Least-squares slope of log(norm ratio) against the distance from the output: log of the per-layer gain
    a product of gains would give. None with fewer than two layers or a ratio that is not positive."""
    pts = [(d, r) for d, r in sorted(ratio_by_distance.items()) if r is not None]
    if len(pts) < 2 or any(r <= 0 for _, r in pts):
        return None
    d = np.array([p[0] for p in pts], dtype=float)
    y = np.log([p[1] for p in pts])
    return float(np.polyfit(d, y, 1)[0])


def unit_rows(model_name: str, layers: int, form: str, arm: str, site: str, batch: int, result: dict) -> list[dict]:
    """One row per decoder layer of one batch's ``compare`` result: norm ratio and cosine, the layer's
    distance from the output (0: the last decoder layer)."""
    out = []
    for index, v in sorted(decoder_layers(result["per_layer"]).items()):
        out.append({"model": model_name, "layers": layers, "form": form, "arm": arm, "site": site, "batch": batch,
                    "layer": index, "distance": layers - 1 - index, "norm_ratio": v["norm_ratio"],
                    "cosine": v["cosine"]})
    return out


def summary_rows(units: list[dict]) -> list[dict]:
    """Per model, form, arm and site: per distance the mean norm ratio and cosine over batches (95% t), and
    the slope of log(norm ratio) per layer, one slope a batch, its mean and 95% t interval over batches."""
    groups: dict[tuple, list[dict]] = {}
    for u in units:
        groups.setdefault((u["model"], u["layers"], u["form"], u["arm"], u["site"]), []).append(u)
    out = []
    for (model, layers, form, arm, site), rows in groups.items():
        key = {"model": model, "layers": layers, "form": form, "arm": arm, "site": site}
        for distance in sorted({u["distance"] for u in rows}):
            at = [u for u in rows if u["distance"] == distance]
            for measure in ("norm_ratio", "cosine"):
                est = mean_ci([u[measure] for u in at])
                out.append({**key, "measure": measure, "distance": distance, **_estimate(est),
                            "method": f"mean over {est['n']} gradient batches, 95% t"})
        est = mean_ci([s for s in batch_slopes(rows).values() if s is not None])
        out.append({**key, "measure": "log_norm_ratio_slope", "distance": None, **_estimate(est),
                    "method": f"least-squares slope of log(norm ratio) against layers from the output, one a batch; "
                              f"mean over {est['n']} batches, 95% t (per-layer gain = exp(slope))"})
        if "~" in arm:  # the component's slope beyond its control's, paired by batch
            own = batch_slopes(groups.get((model, layers, form, arm.split("~")[0], site), []))
            control = batch_slopes(rows)
            diffs = [own[b] - control[b] for b in control if own.get(b) is not None and control[b] is not None]
            est = mean_ci(diffs)
            out.append({**key, "arm": arm.split("~")[0], "measure": f"log_norm_ratio_slope_excess_over_~"
                        f"{arm.split('~')[1]}", "distance": None, **_estimate(est),
                        "method": f"per batch: slope(component) - slope(its control); mean over {est['n']} batches, "
                                  "95% t"})
    return out


def batch_slopes(rows: list[dict]) -> dict[int, float | None]:
    """Each batch's ``log_slope`` over the layers of ``rows`` (one model, form, arm and site)."""
    return {b: log_slope({u["distance"]: u["norm_ratio"] for u in rows if u["batch"] == b})
            for b in sorted({u["batch"] for u in rows})}


def _estimate(est: dict) -> dict:
    return {"mean": est["mean"], "ci_low": est["ci_low"], "ci_high": est["ci_high"], "n": est["n"]}


def run_depth(profile: Profile, model_name: str, results="results", out_units=None, progress=print) -> list[dict]:
    """Per gradient batch of the warm start (``pathways.batches`` of each seed, drawn as the pathway matrix
    draws them), every arm of ``depth_arms`` at every site of ``pathways.sites`` in every form: the per-layer
    norm ratio and cosine against the unquantized gradient of the same batch. Returns the unit rows."""
    import torch

    settings = profile.pathways
    if settings is None:
        raise ValueError(f"profile {profile.name!r} has no pathways section: the depth study draws its gradient "
                         "batches as the pathway matrix does (see experiments/profiles/depth.yaml)")
    spec = profile.model(model_name)
    if not spec.arch:
        raise ValueError(f"the depth study measures tiny stand-ins of chosen depth; {model_name!r} is not one")
    layers = spec.layers or 2
    train, _ = gsm.cell_data(profile, results)
    units = []
    batch_index = 0
    for seed in profile.seeds:
        model, tokenizer = load(str(warm_start_folder(profile, model_name, results)), dtype=torch.float32)
        trainer = probe_trainer(model, tokenizer, profile, seed)
        batches, _ = gradient_batches(trainer, seed_problems(train, settings, seed)[0], profile, settings.batches,
                                      seed)
        model.train()
        reference = [batch_gradient(trainer, b) for b in batches]
        for form in settings.forms:
            for site in settings.sites:
                for arm in depth_arms(settings.controls):
                    with Arm(model, row_quantizer(arm, site, form=form)):
                        for i, (b, ref) in enumerate(zip(batches, reference)):
                            units += unit_rows(model_name, layers, form, arm, site, batch_index + i,
                                               compare(batch_gradient(trainer, b), ref))
        batch_index += len(batches)
        progress(f"{model_name} ({layers} layers) seed {seed}: {len(batches)} gradient batches")
    if out_units is not None:
        write_csv_atomic(out_units, units, UNIT_FIELDS)
    return units


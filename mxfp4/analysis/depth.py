"""The depth law of scale bias: does its error compound multiplicatively through the backward pass?

A per-layer gain on the backward GEMMs shows in the gradient's norm, not its direction: were every layer's
backward pass scaled by g, the gradient of the layer d layers below the output would be g^(d+1) times the
unquantized one, so log(norm ratio) falls on a line in d whose slope is log g. Per gradient batch, arm
(each component injected alone, its sign-flip control, full MXFP4) and site, the per-layer norm ratio and
cosine against the unquantized gradient of the same batch (the slopes: ``report.depth_table``). Models of
several depths (their own warm starts) say whether the slope holds as the model deepens.

The method in full: docs/methods.md, ``mxfp4.analysis.depth``."""

from __future__ import annotations

import re

from ..config.profiles import Profile
from ..io import write_csv_atomic
from ..numerics.decompose import COMPONENTS
from ..rl import data as gsm
from ..rl.batches import batch_gradient, gradient_batches, probe_trainer
from ..rl.grad_accuracy import compare
from ..rl.models import load, warm_start_folder
from .pathway_spec import control_rows
from .pathways import Arm, row_quantizer, seed_problems

UNIT_FIELDS = ["model", "layers", "form", "arm", "site", "batch", "layer", "distance", "norm_ratio", "cosine"]
_LAYER = re.compile(r"^layer(\d+)$")


def depth_arms(controls) -> list[str]:
    """Each component injected alone, its control of each kind, and full MXFP4."""
    return [*(f"+{c}" for c in COMPONENTS), *control_rows(controls), "all"]


def decoder_layers(per_layer: dict[str, dict]) -> dict[int, dict]:
    """The decoder layers of a ``compare`` result by index (embeddings, final norm and head left out)."""
    return {int(m.group(1)): v for k, v in per_layer.items() if (m := _LAYER.match(k))}


def unit_rows(model_name: str, layers: int, form: str, arm: str, site: str, batch: int, result: dict) -> list[dict]:
    """One row per decoder layer of one batch's ``compare`` result: norm ratio and cosine, the layer's
    distance from the output (0: the last decoder layer)."""
    out = []
    for index, v in sorted(decoder_layers(result["per_layer"]).items()):
        out.append({"model": model_name, "layers": layers, "form": form, "arm": arm, "site": site, "batch": batch,
                    "layer": index, "distance": layers - 1 - index, "norm_ratio": v["norm_ratio"],
                    "cosine": v["cosine"]})
    return out


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
    model, tokenizer = load(str(warm_start_folder(profile, model_name, results)), dtype=torch.float32)
    units = []
    batch_index = 0
    for seed in profile.seeds:  # one policy (the warm start, unchanged by the arms): each seed its own batches
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


"""The depth law of scale bias: does its error compound multiplicatively through the backward pass?

A per-layer gain on the backward GEMMs shows in the gradient's norm, not its direction: were every layer's
backward pass scaled by g, the gradient of the layer d layers below the output would be g^(d+1) times the
unquantized one, so log(norm ratio) falls on a line in d whose slope is log g. Per gradient batch, arm
(each component injected alone, its sign-flip control, full MXFP4) and site, the per-layer norm ratio and
cosine against the unquantized gradient of the same batch (the slopes: ``report.depth_table``). Models of
several depths (their own warm starts) say whether the slope holds as the model deepens.

The method in full: docs/methods.md, ``mxfp4.analysis.depth``."""

from __future__ import annotations

import functools
import math
import re

from ..config.profiles import DepthOptimizerSettings, Profile
from ..config.run import Run
from ..io import write_csv_atomic
from ..numerics.decompose import COMPONENTS
from ..rl import data as gsm
from ..rl.batches import batch_gradient, gradient_batches, probe_trainer
from ..rl.grad_accuracy import compare
from ..rl.models import load, warm_start_folder
from .pathways.matrix import seed_problems
from .pathways.measurement import Arm, row_quantizer
from .pathways.spec import control_rows

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


def _layers(profile: Profile, model_name: str) -> int:
    """The decoder layers of a tiny stand-in (the study's models are of chosen depth)."""
    spec = profile.model(model_name)
    if not spec.arch:
        raise ValueError(f"the depth study measures tiny stand-ins of chosen depth; {model_name!r} is not one")
    return spec.layers or 2


def _seed_batches(run: Run, model_name: str, n_batches: int, skip: int = 0):
    """Per seed: (seed, model, trainer, batches), the seed's warm start in float32 in train mode (loaded again
    only where it is another seed's than the last) and ``n_batches`` of its GRPO batches drawn as the pathway
    matrix draws them, after the first ``skip``."""
    import torch

    profile = run.profile
    train, _ = gsm.cell_data(run)
    loaded = None
    for seed in profile.seeds:
        folder = warm_start_folder(run.start(model_name, seed))
        if loaded is None or loaded[0] != folder:
            loaded = (folder, *load(str(folder), dtype=torch.float32))
        model, tokenizer = loaded[1], loaded[2]
        trainer = probe_trainer(model, tokenizer, profile, seed)
        batches, _ = gradient_batches(trainer, seed_problems(train, profile.pathways, seed)[0], profile,
                                      skip + n_batches, seed)
        model.train()
        yield seed, model, trainer, batches[skip:]


def run_depth(run: Run, model_name: str, out_units=None, progress=print) -> list[dict]:
    """Per gradient batch of the warm start (``pathways.batches`` of each seed, drawn as the pathway matrix
    draws them), every arm of ``depth_arms`` at every site of ``pathways.sites`` in every form: the per-layer
    norm ratio and cosine against the unquantized gradient of the same batch. Returns the unit rows."""
    profile = run.profile
    settings = profile.pathways
    if settings is None:
        raise ValueError(f"profile {profile.name!r} has no pathways section: the depth study draws its gradient "
                         "batches as the pathway matrix does (see experiments/profiles/depth.yaml)")
    layers = _layers(profile, model_name)
    units = []
    batch_index = 0
    # The seed's warm start, unchanged by the arms: each seed its own batches.
    for seed, model, trainer, batches in _seed_batches(run, model_name, settings.batches):
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


# The short runs: does the gain reach training? -------------------------------------------------------------

OPTIMIZER_ARMS = ("none", "+scale", "+scale~signflip")
OPTIMIZER_FIELDS = ["model", "layers", "optimizer", "lr", "arm", "site", "run", "layer", "distance", "norm_ratio",
                    "cosine"]
ADAM_EPS = 1e-8  # torch's and transformers' default: the rate SGD is matched at reads it


def make_optimizer(name: str, params, lr: float):
    """The optimizer of a short run: plain SGD, or AdamW with the defaults GRPO's trainer uses (weight decay 0)."""
    import torch

    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, eps=ADAM_EPS, weight_decay=0.0)
    raise ValueError(f"optimizer {name!r}; accepted: sgd, adamw")


def matched_sgd_lr(adam_lr: float, gradient: dict) -> float:
    """The SGD rate whose first step on ``gradient`` moves the parameters as far as AdamW's first step at
    ``adam_lr`` does (bias-corrected, that step is ``lr g / (|g| + eps)`` elementwise)."""
    adam = sum(float((g.double() / (g.double().abs() + ADAM_EPS)).pow(2).sum()) for g in gradient.values())
    plain = sum(float(g.double().pow(2).sum()) for g in gradient.values())
    if not 0 < plain < math.inf:
        raise ValueError(f"the first batch's gradient has squared norm {plain}: no SGD rate matches AdamW's step; "
                         "accepted: a finite, non-zero gradient")
    return adam_lr * math.sqrt(adam / plain)


def short_run(model, gradient, batches, optimizer: str, lr: float) -> dict:
    """Each trainable parameter's displacement after one ``optimizer`` step per batch (``gradient(batch)``
    the gradient by parameter name), from the parameters as they are; they are restored afterwards."""
    import torch

    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    start = {n: p.detach().clone() for n, p in params.items()}
    opt = make_optimizer(optimizer, list(params.values()), lr)
    try:
        for batch in batches:
            grads = gradient(batch)
            for name, p in params.items():
                p.grad = grads.get(name)
            opt.step()
        return {n: p.detach() - start[n] for n, p in params.items()}
    finally:
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(start[name])
                p.grad = None


def displacement_rows(model_name: str, layers: int, optimizer: str, lr: float, arm: str, site: str, run: int,
                      result: dict) -> list[dict]:
    """One row per decoder layer of ``compare(displacement of the arm, displacement of the unquantized run)``."""
    return [{"model": model_name, "layers": layers, "optimizer": optimizer, "lr": lr, "arm": arm, "site": site,
             "run": run, "layer": index, "distance": layers - 1 - index, "norm_ratio": v["norm_ratio"],
             "cosine": v["cosine"]}
            for index, v in sorted(decoder_layers(result["per_layer"]).items())]


def run_depth_optimizers(run: Run, model_name: str, settings: DepthOptimizerSettings, out_units=None,
                         progress=print) -> list[dict]:
    """Per run (``settings.runs_per_seed`` per seed, each on its own ``steps`` GRPO batches of the warm start, drawn
    as the pathway matrix draws them, after the ``skip_runs`` runs' batches) and optimizer: each arm's per-layer
    displacement against the unquantized run's (norm ratio and cosine), every arm at the rate the unquantized run's
    first batch sets. ``settings`` is the profile's depth-optimizers block. Returns the unit rows."""
    import torch

    profile = run.profile
    layers = _layers(profile, model_name)
    units, run_index = [], 0
    for seed, model, trainer, batches in _seed_batches(run, model_name, settings.runs_per_seed * settings.steps,
                                                       skip=settings.skip_runs * settings.steps):
        if len(batches) < settings.steps:
            raise ValueError(f"{model_name} seed {seed}: {len(batches)} GRPO batches with a non-zero advantage, "
                             f"fewer than one run's {settings.steps} steps")
        gradient = functools.partial(batch_gradient, trainer)
        for r in range(len(batches) // settings.steps):
            run_batches = batches[r * settings.steps:(r + 1) * settings.steps]
            for optimizer in settings.optimizers:
                lr = profile.grpo.learning_rate
                if optimizer == "sgd":
                    lr = matched_sgd_lr(lr, batch_gradient(trainer, run_batches[0]))
                moved = {}
                for arm in OPTIMIZER_ARMS:
                    torch.manual_seed(seed * 1000 + r)  # a control's draws: the same for either optimizer
                    with Arm(model, row_quantizer(arm, settings.site, form="gain")):
                        moved[arm] = short_run(model, gradient, run_batches, optimizer, lr)
                for arm in OPTIMIZER_ARMS[1:]:
                    units += displacement_rows(model_name, layers, optimizer, lr, arm, settings.site, run_index,
                                               compare(moved[arm], moved["none"]))
            run_index += 1
        progress(f"{model_name} ({layers} layers) seed {seed}: {len(batches) // settings.steps} runs of "
                 f"{settings.steps} steps, each with {', '.join(settings.optimizers)}")
    if out_units is not None:
        write_csv_atomic(out_units, units, OPTIMIZER_FIELDS)
    return units

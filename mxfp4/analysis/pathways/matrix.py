"""The pathway matrix of one model: every seed's policy at each checkpoint measured on its own batches and prompts
(``measurement``), the rows estimated over them (``estimates``) and written (``spec.FIELDS``, ``spec.UNIT_FIELDS``).

The method in full: docs/methods.md."""

from __future__ import annotations

import csv
import random
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from ...config.data_files import gsm8k_folder
from ...config.profiles import dose as parse_dose
from ...config.run import Run
from ...io import write_csv_atomic
from ...rl import data as gsm
from ...rl.batches import batch_prompts, gradient_batches, probe_trainer
from ...rl.models import load, warm_start_folder
from ...rl.outlier_channels import add_outlier_channels
from ..regime import regime_rows
from .estimates import form_rows, make_row, scalar_estimate, unit_rows
from .measurement import Measured, additivity, measure_corrections, measure_gradients, measure_rollouts
from .spec import (
    FIELDS,
    UNIT_FIELDS,
)

OUTLIER_SEED = 0  # the channels a warm start's outlier dose scales: those pretrain's knob draws


def outlier_block_row(model, model_name: str, trainer, batch, dose: str) -> dict:
    """What a dose does to the operands: the fraction of outlier-dominated blocks in the GEMMs' activations,
    median [min, max] over the GEMMs, on one gradient batch (``regime.regime_rows``)."""
    model.train()  # as the batches are scored
    rows = regime_rows(model, model_name, lambda m: trainer.batch_loss(batch))
    fractions = [r["outlier_block_fraction"] for r in rows
                 if r["operand"] == "activation" and r.get("outlier_block_fraction") is not None]
    est = {"mean": float(np.median(fractions)), "ci_low": min(fractions), "ci_high": max(fractions),
           "n": len(fractions), "p": None, "sd": None}
    return make_row(model_name, "warm", "none", "-", "total", "activation_outlier_block_fraction", est,
                f"dose {dose}: the activations' outlier-block fraction (regime statistics), median [min, max] over "
                f"{len(fractions)} GEMMs, on the first gradient batch")


def checkpoints(run: Run, model_name: str) -> dict[str, dict[int, Path]]:
    """The policies the run's profile asks for (``pathways.checkpoints``), per measured seed
    (``Profile.pathway_seeds``): the warm-started policy (one for every seed) and the bf16 cell's policy after
    GRPO of every seed (an error when a seed's has not run)."""
    profile, layout = run.profile, run.layout
    spec = profile.model(model_name)
    if spec.config:
        raise ValueError(
            f"model {model_name!r} is a random initialisation (config: {spec.config}); the pathway matrix "
            "needs a warm-started tiny model or a hub checkpoint"
        )
    out: dict[str, dict[int, Path]] = {}
    if "warm" in profile.pathways.checkpoints:  # each seed's own warm start (one for all where there is one)
        out["warm"] = {s: layout.model(model_name, profile.warm_start_of(s)) if spec.arch else Path(spec.hub)
                       for s in profile.pathway_seeds}
    if "grpo" in profile.pathways.checkpoints:
        out["grpo"] = {s: layout.policy(model_name, s) for s in profile.pathway_seeds}
        missing = [str(p) for p in out["grpo"].values() if not (p / "config.json").exists()]
        if missing:
            raise ValueError(f"pathways.checkpoints asks for grpo, but these bf16 policies after GRPO are missing: "
                             f"{', '.join(missing)}; run the bf16 cells first (snakemake runs them before)")
    return out


def seed_problems(train: list[dict], settings, seed: int, held_out: list[dict] | None = None
                  ) -> tuple[list[dict], list[dict]]:
    """(gradient problems, rollout problems) of one seed: the first half of the training problems
    drawn in a seed's own order for the gradient batches, ``settings.prompts`` of the second half for
    the rollouts (so seeds measure different data, every arm of a seed the same); with ``held_out``
    (``pathways.prompts_from``), every training problem for the gradients and the rollouts drawn from those."""
    rng = random.Random(seed)
    if held_out is not None:
        return rng.sample(train, len(train)), rng.sample(held_out, min(settings.prompts, len(held_out)))
    half = len(train) // 2
    return rng.sample(train[:half], half), rng.sample(train[half:], min(settings.prompts, len(train) - half))


def pilot_problems(profile, train: list[dict], held_out: list[dict] | None, skipped: int) -> set[str]:
    """The questions a pilot profile's pathway draw could have reached: per measured seed, its rollout prompts and
    the first (batches + ``skipped``) x batch-size gradient problems of its order (``skipped``: the all-zero-advantage
    batches the pilot passed over, from its stored rows; their problems were drawn too)."""
    settings, size = profile.pathways, batch_prompts(profile)
    reached: set[str] = set()
    for seed in profile.pathway_seeds:
        grad, roll = seed_problems(train, settings, seed, held_out)
        reached |= {r["question"] for r in grad[: (settings.batches + skipped) * size]}
        reached |= {r["question"] for r in roll}
    return reached


def without_pilot(profile, model_name: str, train: list[dict], held_out: list[dict] | None, layout
                  ) -> tuple[list[dict], list[dict] | None, int]:
    """``train`` and ``held_out`` without every problem the profile's ``pathways.held_out_from`` pilot could have
    measured (``pilot_problems``), and how many were taken out. The pilot must draw from the same data, and its
    stored rows must say how many gradient batches it skipped."""
    from ...config.profiles import load_profile

    pilot = load_profile(profile.pathways.held_out_from)
    same = pilot.pathways is not None and pilot.pathways.prompts_from == profile.pathways.prompts_from
    if pilot.data != profile.data or not same:
        raise ValueError(f"pathways.held_out_from: {pilot.name!r} draws from other data or prompts than "
                         f"{profile.name!r}; accepted: a pilot with the same data and pathways.prompts_from")
    pilot_files = layout.sibling(pilot.name)  # the run's layout: the pilot's stored baselines beside it
    stored = pilot_files.stored(pilot_files.pathways())
    if not stored.is_file():
        raise ValueError(f"pathways.held_out_from: {pilot.name!r} has no stored pathway rows ({stored}): its draw "
                         "cannot be reconstructed; store its baselines first")
    with open(stored, newline="") as f:  # this module's own rows (FIELDS)
        skips = [r for r in csv.DictReader(f) if r.get("model") == model_name and r.get("checkpoint") == "warm"
                 and r.get("metric") == "skipped_zero_advantage_batches"]
    if not skips:
        raise ValueError(f"pathways.held_out_from: {stored} has no skipped_zero_advantage_batches row of "
                         f"{model_name!r} at the warm start")
    reached = pilot_problems(pilot, train, held_out, int(round(float(skips[0]["mean"]))))
    kept = [r for r in train if r["question"] not in reached]
    kept_out = None if held_out is None else [r for r in held_out if r["question"] not in reached]
    return kept, kept_out, len(train) - len(kept) + (0 if held_out is None else len(held_out) - len(kept_out))


def run_pathways(run: Run, model_name: str, out_csv=None, progress=print, checkpoint: str | None = None,
                 out_units=None, dose: str | None = None) -> list[dict]:
    """The pathway matrix of one model on every seed it measures (``Profile.pathway_seeds``): per checkpoint,
    each seed's policy measured on its own batches and prompts, the rows estimated with the policy as the outer
    unit (``stats.nested_mean``).

    Args:
        run: the run (warm starts, the bf16 cells' policies after GRPO); its profile's ``pathways`` section
            sets the design.
        model_name: a model line of the profile.
        out_csv: where to write the rows (``pathways.spec.FIELDS``); None writes nothing.
        progress: called with one line per seed and form.
        checkpoint: one checkpoint only (``warm`` or ``grpo``); default every one the profile names.
        out_units: where to write every unit's harm (``UNIT_FIELDS``).
        dose: an outlier dose of ``dose_response.doses`` (``c2x32``) given to the warm start before it is
            measured (the warm checkpoint only), with a row of the activations' outlier-block fraction.

    Returns:
        The rows.
    """
    profile = run.profile
    settings = profile.pathways
    if settings is None:
        raise ValueError(
            f"profile {profile.name!r} has no pathways section; add one (see experiments/profiles/embedded.yaml)"
        )
    spec = profile.model(model_name)
    if checkpoint is not None:
        if checkpoint not in settings.checkpoints:
            raise ValueError(f"checkpoint {checkpoint!r} is not one the profile measures; accepted: "
                             f"{', '.join(settings.checkpoints)} (pathways.checkpoints)")
        profile = profile.model_copy(update={"pathways": settings.model_copy(update={"checkpoints": [checkpoint]})})
        run = replace(run, profile=profile)
    if dose is not None and checkpoint != "warm":
        raise ValueError(f"an outlier dose ({dose}) is given to the warm start; accepted: checkpoint 'warm', got "
                         f"{checkpoint!r}")
    ckpts = checkpoints(run, model_name)
    if spec.arch:
        for seed in profile.pathway_seeds:
            warm_start_folder(run.start(model_name, seed))
    train, _ = gsm.cell_data(run)
    held_out = gsm.load_gsm8k("test", gsm8k_folder(profile)) if settings.prompts_from == "gsm8k-test" else None
    if settings.held_out_from:
        train, held_out, removed = without_pilot(profile, model_name, train, held_out, run.layout)
        progress(f"{removed} problems the pilot {settings.held_out_from!r} could have measured taken out of the pools")
    rows: list[dict] = []
    units: list[dict] = []
    t0 = time.time()

    def say(msg):
        progress(f"[{time.time() - t0:6.1f}s] {msg}")

    for ckpt, paths in ckpts.items():
        measured = {form: Measured() for form in settings.forms}
        skipped = usable = 0
        for seed, path in paths.items():
            # The outer unit: the policy measured. The warm starts of several are pooled: the claims are about
            # the measured warm starts, their units the batches and prompts the power calculation counts.
            group = ckpt if ckpt == "warm" else f"{ckpt}/seed{seed}"
            model, tokenizer = load(str(path), dtype=torch.float32)  # float32 compute: arms differ only by MXFP4
            if dose is not None:
                add_outlier_channels(model, *parse_dose(dose), seed=OUTLIER_SEED)
            trainer = probe_trainer(model, tokenizer, profile, seed)
            grad_problems, roll_problems = seed_problems(train, settings, seed, held_out)
            batches, n_skipped = gradient_batches(trainer, grad_problems, profile, settings.batches, seed,
                                                  chat=spec.chat)
            if dose is not None and seed == profile.pathway_seeds[0] and batches:
                rows.append(outlier_block_row(model, model_name, trainer, batches[0], dose))
            skipped, usable = skipped + n_skipped, usable + len(batches)
            say(f"{model_name}/{ckpt} seed {seed}: {len(batches)} gradient batches drawn ({n_skipped} skipped: "
                "all-zero advantages)")
            for form, m in measured.items():
                m.seeds.add(seed)
                model.train()  # as the batches were scored (rollouts leave it in eval mode)
                reference = (measure_gradients(m, trainer, model, batches, settings, form, group, seed)
                             if batches else [])
                fixed = measure_rollouts(m, model, tokenizer, roll_problems, profile, form, group, seed, spec.chat)
                say(f"{model_name}/{ckpt} seed {seed} ({form}): {len(batches)} gradient batches, "
                    f"{len(roll_problems)} prompts x {settings.samples_per_prompt}")
            if settings.corrections:
                measure_corrections(list(measured.values()), model, trainer, batches, reference, fixed, profile, seed)
                say(f"{model_name}/{ckpt} seed {seed}: correction arms {', '.join(settings.corrections)}")
            if ckpt == "warm" and seed == profile.pathway_seeds[0] and settings.additivity_steps and batches:
                for k, ratio in additivity(model, trainer, batches[0], settings.additivity_steps,
                                           profile.grpo.learning_rate).items():
                    rows.append(make_row(model_name, ckpt, "interaction", "both", "total", f"interaction_ratio_k{k}",
                                     scalar_estimate(ratio), f"one batch, {k} AdamW update(s) per arm: "
                                     "|D_all - (D_scale + D_dead + D_grid)| / |D_all|"))
                say(f"{model_name}/{ckpt}: additivity k={settings.additivity_steps}")
        rows.append(make_row(model_name, ckpt, "none", "-", "total", "skipped_zero_advantage_batches",
                         scalar_estimate(float(skipped), skipped + usable), f"count over {len(paths)} seeds"))
        for form, m in measured.items():
            if len(m.grad_groups) < 2:
                say(f"{model_name}/{ckpt}: fewer than 2 usable gradient batches: no gradient rows")
            for r in form_rows(model_name, ckpt, m, settings, profile.pathway_seeds[0]):
                rows.append({**r, "form": form})
            units += unit_rows(model_name, ckpt, form, m, settings.sites)
    for r in rows:
        r.setdefault("form", "canonical")  # rows that no decomposition form shapes (counts, full MXFP4)
        if r["seeds"] is None:
            r["seeds"] = len(profile.pathway_seeds)
    if out_csv is not None:
        write_csv_atomic(out_csv, rows, FIELDS)
    if out_units is not None:
        write_csv_atomic(out_units, units, UNIT_FIELDS)
    return rows

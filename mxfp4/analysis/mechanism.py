"""A recipe's mechanism measured first: its arm in the pathway matrix at the warm starts, beside plain MXFP4,
BF16 and each of the profile's correction arms, unit by unit (minutes: no RL, no component injections).

The same measures as the pathway matrix (``analysis.pathways``), on the same batches and prompts, restricted to
the arms a new recipe is judged against: per gradient batch its cosine to the unquantized gradient with MXFP4 (or
the arm) in the forward and backward GEMMs; per prompt the teacher-forced log-likelihood of the correct solution
and the token entropy along the unquantized arm's sampled completions. The per-unit file is what
``report.mechanism`` decides from, the network (the seed's warm start) the replicate. The weights' error
energies per component under MXFP4 and under the recipe come with it.
"""

from __future__ import annotations

import time

import torch

from ..config.data_files import gsm8k_folder
from ..config.profiles import Profile
from ..config.recipes import Recipe
from ..config.run import Run
from ..io import write_csv_atomic
from ..rl import data as gsm
from ..rl.batches import batch_gradient, gradient_batches, probe_trainer
from ..rl.grad_accuracy import compare
from ..rl.models import load, model_reference
from .correction_table import product_error, recipe_energy, recorded_activations, weight_operands
from .pathways.estimates import unit_rows
from .pathways.matrix import seed_problems
from .pathways.measurement import (
    Arm,
    FixedTokens,
    Measured,
    add_teacher,
    batch_key,
    measure_corrections,
    rollout_scores,
    row_quantizer,
    unit_digest,
)
from .pathways.spec import UNIT_FIELDS, first_unit_difference
from .teacher_forced import completion_batch, token_pairs


def mechanism_arms(profile: Profile, recipes: list[str]) -> list[str]:
    """The correction arms measured: the recipes', then each of the profile's (``pathways.corrections``)."""
    if profile.pathways is None:
        raise ValueError(f"profile {profile.name!r} has no pathways section; the mechanism is measured in its design")
    for recipe in recipes:
        r = Recipe.named(recipe)
        if not r.quantize or r.format != "mxfp4":
            raise ValueError(f"recipe {recipe!r} does not quantize to mxfp4; accepted: a recipe of MXFP4 and "
                             "corrections (its arm is set against plain MXFP4's)")
    return list(dict.fromkeys([*recipes, *profile.pathways.corrections]))


def run_mechanism(run: Run, model_name: str, recipes: list[str], out_units=None, progress=print,
                  energy: bool = True, against: list[dict] | None = None) -> tuple[list[dict], list[dict]]:
    """The per-unit harms of MXFP4, BF16, each of ``recipes`` and the profile's correction arms at the warm start
    of ``model_name`` of every measured seed (``Profile.pathway_seeds``; ``UNIT_FIELDS``, written to
    ``out_units``), and the error energies of the first warm start's weights and of the activations recorded on its
    teacher-forced solutions, under MXFP4 and under each recipe, in the claims' decomposition form
    (``correction_table.recipe_energy``).

    Args:
        run: the run (its warm starts); its profile's ``pathways`` section sets the batches, prompts and samples.
        model_name: a model line of the profile.
        recipes: the recipes whose mechanism is measured (MXFP4 and corrections), each an arm of its own.
        out_units: where to write the per-unit file; None writes nothing.
        progress: called with one line per seed.
        against: a stored board's per-unit rows: each seed's mxfp4 and bf16 arms must equal them unit for unit
            before any recipe's arm is measured (a run that cannot be placed stops at once, naming the unit).
        energy: False measures no error energies (a named model's hundred million weights, decomposed per recipe,
            would take longer than its units).

    Returns:
        (the unit rows, one energy row per recipe and operand: weights, activations, the GEMM product).
    """
    profile = run.profile
    names = mechanism_arms(profile, list(recipes))
    settings = profile.pathways.model_copy(update={"corrections": names})
    arms_profile = profile.model_copy(update={"pathways": settings})
    form = settings.claims.form if settings.claims else settings.forms[0]
    spec, g = profile.model(model_name), profile.grpo
    train, _ = gsm.cell_data(run)
    held_out = gsm.load_gsm8k("test", gsm8k_folder(profile)) if settings.prompts_from == "gsm8k-test" else None
    m = Measured()
    t0 = time.time()
    activations = weights = None
    for seed in profile.pathway_seeds:
        model, tokenizer = load(model_reference(run.start(model_name, seed)), dtype=torch.float32)
        trainer = probe_trainer(model, tokenizer, profile, seed)
        grad_problems, roll_problems = seed_problems(train, settings, seed, held_out)
        batches, _ = gradient_batches(trainer, grad_problems, profile, settings.batches, seed, chat=spec.chat)
        m.seeds.add(seed)
        model.train()
        reference = [batch_gradient(trainer, b) for b in batches]
        with Arm(model, row_quantizer("all", "both", form=form)):
            m.grad.setdefault(("all", "both"), []).extend(
                compare(batch_gradient(trainer, b), ref) for b, ref in zip(batches, reference))
        m.grad_groups.extend(["warm"] * len(batches))
        m.grad_keys.extend(batch_key(b) for b in batches)
        m.grad_seeds.extend([seed] * len(batches))
        prompts = [gsm.prompt(r["question"], tokenizer, spec.chat) for r in roll_problems]
        solutions = token_pairs(tokenizer, prompts, [r["answer"] for r in roll_problems])
        _, _, prompt_ids, completion_ids = rollout_scores(model, tokenizer, roll_problems, settings.samples_per_prompt,
                                                          g.max_completion_length, g.temperature, seed, spec.chat)
        fixed = FixedTokens(prompt_ids, completion_ids, None, solutions, settings.samples_per_prompt, g.temperature,
                            tokenizer.pad_token_id or 0)
        for row in ("none", "all"):  # the unquantized arm first: its log-probabilities are every arm's reference
            with Arm(model, row_quantizer(row, "forward", form=form)):
                measured, logp = fixed.measure(model)
            if fixed.logp is None:
                fixed.logp = logp
            add_teacher(m, row, measured)
        m.roll_groups.extend(["warm"] * len(roll_problems))
        m.roll_keys.extend(unit_digest(r["question"], seed) for r in roll_problems)
        m.roll_seeds.extend([seed] * len(roll_problems))
        if against is not None:  # the anchors first: a run that does not reproduce the board measures no arm
            here = [r for r in unit_rows(model_name, "warm", form, m, ["both"], arms=("all", "none"))
                    if int(r["seed"]) == seed]
            stored = [r for r in against if r["model"] == model_name and r["arm"] in ("all", "none")
                      and str(r["seed"]) == str(seed)]
            differs = first_unit_difference(stored, here)
            if differs:
                raise ValueError(f"{model_name} seed {seed}: the mxfp4 and bf16 arms do not reproduce the stored "
                                 f"board's, before any recipe was measured: the first unit that differs is {differs}; "
                                 "accepted: the board's stored warm starts with the same numerics, or the board rerun")
        measure_corrections([m], model, trainer, batches, reference, fixed, arms_profile, seed)
        if energy and activations is None:  # the first measured warm start's, on its teacher-forced solutions
            batch = completion_batch(*solutions, tokenizer.pad_token_id or 0)
            activations = recorded_activations(model, {k: batch[k] for k in ("input_ids", "attention_mask")})
            weights = weight_operands(model)
        progress(f"[{time.time() - t0:6.1f}s] {model_name} seed {seed}: {len(batches)} gradient batches, "
                 f"{len(roll_problems)} prompts x {settings.samples_per_prompt}; arms mxfp4, bf16, {', '.join(names)}")
    units = unit_rows(model_name, "warm", form, m, ["both"])
    if out_units is not None:
        write_csv_atomic(out_units, units, UNIT_FIELDS)
    if not energy:
        return units, []
    energies = []
    for r in recipes:  # each operand with the other alongside: a GEMM transform is computed from the pair
        energies += [{"model": model_name, "recipe": r, "operand": operand, "form": form,
                      **recipe_energy(tensors, r, form, alongside=other)}
                     for operand, tensors, other in (("weights", weights, activations),
                                                     ("activations", activations, weights))]
        energies.append({"model": model_name, "recipe": r, "operand": "product", "form": "output",
                         **product_error(weights, activations, r)})
    return units, energies

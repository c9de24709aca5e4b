"""The pathway matrix: each MXFP4 error component injected alone (or removed), measured on the three
RL pathways the paper maps it to (gradient accuracy, rollout quality, policy entropy) on the same data
for every arm, with energy-matched controls, Shapley attribution and the additivity test. Every seed
measures its own batches and prompts; the rows take the policy as the outer unit. Output: a tidy CSV
(``pathway_spec.FIELDS``) and every unit's harm beside it (``UNIT_FIELDS``), with a digest of its data.

The method in full: docs/methods.md, ``mxfp4.analysis.pathways``."""

from __future__ import annotations

import contextlib
import hashlib
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..config.data_files import gsm8k_folder
from ..config.profiles import Profile
from ..config.profiles import dose as parse_dose
from ..config.recipes import Recipe
from ..io import write_csv_atomic
from ..layout import Layout
from ..nn import patch_model, unpatch_model
from ..numerics.decompose import COMPONENTS, interaction, shapley_values
from ..numerics.hooks import lifecycle
from ..numerics.injection import ROWS, SITES, row_spec
from ..rl import data as gsm
from ..rl.batches import batch_gradient, gradient_batches, probe_trainer
from ..rl.grad_accuracy import compare
from ..rl.grpo import weight_decomposition
from ..rl.models import load, warm_start_folder
from ..rl.outlier_channels import add_outlier_channels
from ..stats import dominance_test, hierarchical_bootstrap, nested_mean, nested_paired, paired_diff
from .pathway_spec import (
    CLAIM_METHOD,
    COALITIONS,
    CONTRAST_METHOD,
    EXCESS_METHOD,
    FIELDS,
    GRAD_METHOD,
    HARMS,
    MAPPING,
    PAIRED_METHOD,
    RECOVERIES,
    RECOVERY_CLAIM_METHOD,
    RECOVERY_HARMS,
    RECOVERY_METHOD,
    SHAPLEY_METHOD,
    SITE_ARMS,
    TEACHER_FORCED,
    UNIT_FIELDS,
    UNITS,
    control_rows,
)
from .regime import regime_rows
from .teacher_forced import teacher_forced, token_pairs


def row_quantizer(row: str, site: str = "both", scale_rule: str = "floor", form: str = "canonical"):
    """The quantizer of a pathway arm (None for ``none``), its operands at ``site``, its component of
    the decomposition ``form``."""
    spec = row_spec(row)
    if spec is None:
        return None
    if "inject" in spec or "remove" in spec:
        spec = {**spec, "form": form}
    return Recipe(name=f"pathway{row}", scale_rule=scale_rule, gemms=SITES[site], **spec).quantizer()


class Arm:
    """Context manager: the model patched as one arm (and unpatched after)."""

    def __init__(self, model, quantizer):
        self.model, self.quantizer = model, quantizer

    def __enter__(self):
        if self.quantizer is not None:
            patch_model(self.model, self.quantizer)
        return self.model

    def __exit__(self, *exc):
        if self.quantizer is not None:
            unpatch_model(self.model)
        return False


@dataclass
class CorrectionArm:
    """A correction arm (``pathways.corrections``): its recipe's quantizer at one site, and its corrections'
    rollout context at the first optimizer step where one of them perturbs the rollout policy (AQN's first
    noisy stage; step 0 where none does), which the rollout and entropy measures run under, as the cell's
    rollouts would. The gradient runs without it: the cell's training forward does."""

    name: str
    quantizer: object
    corrections: list
    step: int

    def rollout(self, model):
        stack = contextlib.ExitStack()
        for c in self.corrections:
            stack.enter_context(lifecycle(c.rollout_context, model, self.step))
        return stack


def correction_arm(name: str, site: str, profile: Profile, seed: int) -> CorrectionArm:
    """The correction arm of recipe ``name`` with its quantized GEMMs at ``site``, its corrections bound to
    the profile's GRPO run (``grpo.max_steps``) and ``seed``."""
    recipe = Recipe.named(name)
    recipe = recipe.model_copy(update={"gemms": SITES[site]})
    corrections = recipe.build_corrections()
    total = profile.grpo.max_steps
    for c in corrections:
        lifecycle(c.bind, total, seed)
    step = next((s for s in range(total) if any(lifecycle(c.perturbs_rollout, s) for c in corrections)), 0)
    return CorrectionArm(name, recipe.quantizer(corrections), corrections, step)


def rollout_scores(
    model, tokenizer, problems: list[dict], samples: int, max_new_tokens: int, temperature: float, seed: int,
    chat: bool = False,
) -> tuple[list[float], list[float], list[list[int]], list[list[int]]]:
    """Per prompt: accuracy of ``samples`` sampled completions and their mean token entropy; per sample,
    its prompt's token ids and the completion's (up to and including the first EOS), which the
    teacher-forced measures score under every arm. The sampling RNG is seeded, so arms that differ only
    in their logits are paired sample by sample."""
    repeated = [r for r in problems for _ in range(samples)]
    enc = tokenizer([gsm.prompt(r["question"], tokenizer, chat) for r in repeated], return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    model.eval()
    with torch.no_grad():
        out = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=True,
            top_k=0,
            top_p=1.0,
            temperature=temperature,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=tokenizer.pad_token_id,
        )
    completion = out.sequences[:, enc["input_ids"].shape[1] :]
    logits = torch.stack(out.logits, 1).float() / temperature  # [B, T, V]
    logp = torch.log_softmax(logits, -1)
    entropy = -(logp.exp() * logp).sum(-1)  # [B, T]
    eos = tokenizer.eos_token_id
    ended = (completion == eos).int().cumsum(1)
    live = (ended == 0) | ((ended == 1) & (completion == eos))  # tokens up to and including the first EOS
    tok_entropy = (entropy * live).sum(1) / live.sum(1).clamp(min=1)
    texts = tokenizer.batch_decode(completion, skip_special_tokens=True)
    correct = torch.tensor([float(gsm.is_correct(t, r["answer"])) for t, r in zip(texts, repeated)])
    prompt_ids = [ids[m.bool()].tolist() for ids, m in zip(enc["input_ids"], enc["attention_mask"])]
    completion_ids = [c[: int(n)].tolist() for c, n in zip(completion, live.sum(1))]
    return (correct.view(-1, samples).mean(1).tolist(), tok_entropy.view(-1, samples).mean(1).tolist(),
            prompt_ids, completion_ids)



def _paired(a: list, b: list, groups: list) -> dict:
    """A row estimate of the mean per-unit difference a - b, paired unit by unit (``nested_paired``)."""
    d = nested_paired(a, b, groups)
    return {**d, "mean": d.pop("diff")}


def _row(model, checkpoint, injection, site, layer, metric, est, method) -> dict:
    how = est.get("interval")
    return {
        "model": model,
        "checkpoint": checkpoint,
        "injection": injection,
        "site": site,
        "layer": layer,
        "metric": metric,
        "mean": est["mean"],
        "ci_low": est["ci_low"],
        "ci_high": est["ci_high"],
        "n": est["n"],
        "seeds": None,  # filled in by the caller: the seeds whose data the row pools
        "policies": est.get("seeds"),  # the outer units (policies) of the interval
        "p": est.get("p"),
        "method": f"{method} [{how}]" if how and how != "constant" else method,
    }


def _scalar(value, n: int = 1) -> dict:
    return {"mean": value, "ci_low": None, "ci_high": None, "n": n}


@dataclass
class Measured:
    """The raw measurements of one checkpoint and decomposition form, unit by unit, over every seed:
    gradient comparisons per batch (per arm and site, per scale rule), rollout accuracy and entropy per
    prompt (per arm), the outer unit (policy) of each batch and prompt, the seeds whose data each
    unit came from, and per policy the pooled weight statistics."""

    grad: dict = field(default_factory=dict)  # (arm, site) -> [compare() per batch]
    rules: dict = field(default_factory=dict)  # scale rule -> [compare() per batch]
    rule_weights: dict = field(default_factory=dict)  # scale rule -> [pooled weight decomposition per policy]
    grad_groups: list = field(default_factory=list)
    scores: dict = field(default_factory=dict)  # arm -> ([accuracy per prompt], [entropy per prompt])
    teacher: dict = field(default_factory=dict)  # arm -> {teacher-forced metric: [value per prompt]}
    roll_groups: list = field(default_factory=list)
    shares: list = field(default_factory=list)  # per policy: e_c's weight energy / MXFP4 error energy
    seeds: set = field(default_factory=set)
    grad_keys: list = field(default_factory=list)  # per gradient batch: digest of its tokens
    roll_keys: list = field(default_factory=list)  # per rollout prompt: digest of its question and seed
    grad_seeds: list = field(default_factory=list)  # per gradient batch: the seed whose policy it was measured on
    roll_seeds: list = field(default_factory=list)  # per rollout prompt: likewise (the network is its warm start)

    def groups(self, pathway: str) -> list:
        return self.grad_groups if pathway == "gradient" else self.roll_groups

    def keys(self, pathway: str) -> list:
        return self.grad_keys if pathway == "gradient" else self.roll_keys

    def unit_seeds(self, pathway: str) -> list:
        return self.grad_seeds if pathway == "gradient" else self.roll_seeds

    def harms(self, sites) -> dict[str, dict[str, list]]:
        """Per pathway and arm, the harm of every unit (larger = worse, ``HARMS``): 1 - the gradient's
        cosine per batch at site both (none: 0); per prompt, minus the teacher-forced log-likelihood of the
        correct solution and the teacher-forced token entropy on the unquantized arm's completions."""
        harms: dict[str, dict[str, list]] = {}
        if len(self.grad_groups) >= 2 and "both" in sites:
            harms["gradient"] = {"none": [0.0] * len(self.grad_groups)}
            for (row, site), per_batch in self.grad.items():
                if site == "both":
                    harms["gradient"][row] = [None if b["total"]["cosine"] is None else 1 - b["total"]["cosine"]
                                              for b in per_batch]
        if self.teacher:
            harms["rollout"] = {row: [-v for v in t["tf_solution_loglik"]] for row, t in self.teacher.items()}
            harms["entropy"] = {row: list(t["tf_entropy"]) for row, t in self.teacher.items()}
        return harms


def unit_digest(*parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.detach().cpu().numpy().tobytes() if isinstance(part, torch.Tensor) else str(part).encode())
        h.update(b"|")
    return h.hexdigest()[:16]


def batch_key(batch: dict) -> str:
    """A gradient batch's identity: its prompt and completion tokens."""
    return unit_digest(batch["prompt_ids"], batch["completion_ids"])


def unit_rows(model: str, checkpoint: str, form: str, m: Measured, sites) -> list[dict]:
    """Every unit's harm, per pathway and arm (``UNIT_FIELDS``), with its outer unit and data digest."""
    rows = []
    for pathway, per_arm in m.harms(sites).items():
        groups, keys, seeds = m.groups(pathway), m.keys(pathway), m.unit_seeds(pathway)
        for arm, values in per_arm.items():
            rows += [{"model": model, "checkpoint": checkpoint, "form": form, "pathway": pathway, "arm": arm,
                      "unit": i, "group": g, "seed": s, "key": k, "harm": v}
                     for i, (g, s, k, v) in enumerate(zip(groups, seeds, keys, values, strict=True))]
    return rows


def contrast_rows(model, checkpoint, harms: dict[str, dict[str, list]], m: Measured) -> list[dict]:
    """For each pathway, the claimed dominant component's harm minus each other component's, paired
    over the same units (metric ``<pathway>_harm_contrast``; positive = the claimed one hurts more)."""
    rows = []
    for pathway, top in MAPPING.items():
        per = harms.get(pathway, {})
        for other in (c for c in COMPONENTS if c != top):
            if f"+{top}" not in per or f"+{other}" not in per:
                continue
            rows.append(
                _row(
                    model,
                    checkpoint,
                    f"+{top} vs +{other}",
                    "forward" if pathway != "gradient" else "both",
                    "total",
                    f"{pathway}_harm_contrast",
                    _paired(per[f"+{top}"], per[f"+{other}"], m.groups(pathway)),
                    CONTRAST_METHOD.format(units=UNITS[pathway], a=top, b=other, harm=HARMS[pathway]),
                )
            )
    return rows


def shapley_rows(model, checkpoint, harms: dict[str, dict[str, list]], m: Measured, seed: int) -> list[dict]:
    """Per pathway with every corner measured: each component's Shapley value and the interaction of
    the game v(T) = harm of the arm injecting T, per unit, then their means with bootstrap intervals
    (outer unit the policy; metric ``<pathway>_shapley``; injection ``shapley:<c>`` or
    ``shapley:interaction``)."""
    rows = []
    for pathway, per_arm in harms.items():
        if not all(per_arm.get(a) for a in COALITIONS):
            continue
        per = {c: {} for c in (*COMPONENTS, "interaction")}
        for i, group in enumerate(m.groups(pathway)):
            v = {COALITIONS[a]: per_arm[a][i] for a in COALITIONS}
            if any(x is None for x in v.values()):
                continue
            for c, phi in shapley_values(v).items():
                per[c].setdefault(group, []).append(phi)
            per["interaction"].setdefault(group, []).append(interaction(v))
        for name, values in per.items():
            est = {**hierarchical_bootstrap(values, seed=seed), "seeds": len(m.seeds)}
            rows.append(_row(model, checkpoint, f"shapley:{name}", "both" if pathway == "gradient" else "forward",
                             "total", f"{pathway}_shapley", est,
                             SHAPLEY_METHOD.format(unit=UNITS[pathway], harm=HARMS[pathway])))
    return rows


def excess_rows(model, checkpoint, harms: dict[str, dict[str, list]], controls, m: Measured) -> list[dict]:
    """Per pathway and component: the excess harm over each energy-matched control (paired over units),
    the component's harm per unit of injected energy (its weight energy relative to MXFP4's error
    energy, averaged over the policies), and the paper's mapping tested on excess harms:
    excess(+claimed) - excess(+other)."""
    rows = []
    share = {c: sum(s[c] for s in m.shares) / len(m.shares) for c in COMPONENTS} if m.shares else {}
    for pathway, per_arm in harms.items():
        site = "both" if pathway == "gradient" else "forward"
        unit, harm, groups = UNITS[pathway], HARMS[pathway], m.groups(pathway)
        excess: dict[str, dict[str, list]] = {}
        for k in controls:
            excess[k] = {}
            for c in COMPONENTS:
                a, b = per_arm.get(f"+{c}"), per_arm.get(f"+{c}~{k}")
                if not a or not b:
                    continue
                excess[k][c] = [None if x is None or y is None else x - y for x, y in zip(a, b)]
                rows.append(_row(model, checkpoint, f"+{c} vs +{c}~{k}", site, "total", f"{pathway}_excess_harm",
                                 _paired(a, b, groups), EXCESS_METHOD.format(unit=unit, c=c, k=k, harm=harm)))
            top = MAPPING[pathway]
            for other in (c for c in COMPONENTS if c != top):
                if top in excess[k] and other in excess[k]:
                    rows.append(_row(
                        model, checkpoint, f"+{top} vs +{other} (excess over ~{k})", site, "total",
                        f"{pathway}_excess_contrast",
                        _paired(excess[k][top], excess[k][other], groups),
                        f"paired over {unit}: excess harm(+{top}) - excess harm(+{other}), each over its ~{k} "
                        f"control; 95% t interval, two-sided p"))
        base = per_arm.get("none")
        for c in COMPONENTS:
            if not per_arm.get(f"+{c}") or not share.get(c) or not base:
                continue
            est = _paired(per_arm[f"+{c}"], base, groups)
            for key in ("mean", "ci_low", "ci_high"):
                est[key] = None if est[key] is None else est[key] / share[c]
            method = (f"(harm(+{c}) - harm(none)) / (weight energy of e_{c} / MXFP4 error energy = {share[c]:.3f}), "
                      f"paired over {unit}; 95% t interval")
            rows.append(_row(model, checkpoint, f"+{c}", site, "total", f"{pathway}_harm_per_energy", est, method))
    return rows


def _dominance_row(model, checkpoint, injection: str, pathway: str, metric: str, own: list, rivals: dict[str, list],
                   margin: float, method) -> dict | None:
    """``stats.dominance_test`` of ``own`` against ``rivals`` (harms per unit, larger = the claimed side) as a
    row: the weakest contrast's mean and 95% t interval, p held (``p``), p contradicted and the contrast's
    sd; ``method(weakest)`` states it. None where a contrast has too few units."""
    test = dominance_test(own, rivals, margin)
    if test["weakest"] is None:
        return None
    weakest = test["contrasts"][test["weakest"]]
    est = paired_diff(own, rivals[test["weakest"]])
    row = _row(model, checkpoint, injection, _site(pathway), "total", metric,
               {**est, "mean": weakest["diff"], "p": test["p_held"]}, method(test["weakest"]))
    return {**row, "p_contradicted": test["p_contradicted"], "sd": weakest["sd"]}


def claim_rows(model, checkpoint, m: Measured, design) -> list[dict]:
    """The claim-level test of each mechanism claim (``design``: the profile's ``pathways.claims``):
    ``stats.dominance_test`` of the claimed component's harm against each other component's and its own
    control's, on the pathway harms (``Measured.harms``: the low-variance measures), paired over units.
    One row a pathway (metric ``<pathway>_claim``): the weakest contrast's mean and 95% t interval, p held
    (``p``) and p contradicted (``p_contradicted``). The warm start only: its units share one policy."""
    rows = []
    for pathway, per_arm in m.harms(["both"]).items():
        top = MAPPING[pathway]
        names = [f"+{c}" for c in COMPONENTS if c != top] + [f"+{top}~{design.control}"]
        if f"+{top}" not in per_arm or any(r not in per_arm for r in names):
            continue
        margin = design.margins[pathway]
        row = _dominance_row(
            model, checkpoint, f"+{top} dominates", pathway, f"{pathway}_claim", per_arm[f"+{top}"],
            {r: per_arm[r] for r in names}, margin,
            lambda weakest, top=top, names=names, margin=margin, pathway=pathway: CLAIM_METHOD.format(
                unit=UNITS[pathway], c=top, rivals=", ".join(names), margin=margin, harm=HARMS[pathway],
                weakest=f"+{top} vs {weakest}"))
        rows += [row] if row else []
    return rows


def recovery_harms(m: Measured) -> dict[str, dict[str, list]]:
    """Per pathway and arm, the harm a correction recovers, per unit (``RECOVERY_HARMS``): the pathway harms
    (``Measured.harms``), with the entropy pathway's the gap to the unquantized arm's entropy."""
    harms = m.harms(["both"])
    if "entropy" in harms:
        base = harms["entropy"]["none"]
        harms["entropy"] = {arm: [abs(h - b) for h, b in zip(values, base, strict=True)]
                            for arm, values in harms["entropy"].items()}
    return harms


def _site(pathway: str) -> str:
    return "both" if pathway == "gradient" else "forward"


def recovery_rows(model, checkpoint, m: Measured, corrections) -> list[dict]:
    """Per pathway and correction arm: what the correction recovers, MXFP4's harm (arm ``all``) minus the
    arm's, paired over units (metric ``<pathway>_recovery``; > 0: it recovers)."""
    rows = []
    for pathway, per_arm in recovery_harms(m).items():
        for k in corrections:
            if k in per_arm and "all" in per_arm:
                rows.append(_row(model, checkpoint, k, _site(pathway), "total", f"{pathway}_recovery",
                                 _paired(per_arm["all"], per_arm[k], m.groups(pathway)),
                                 RECOVERY_METHOD.format(unit=UNITS[pathway], k=k, harm=RECOVERY_HARMS[pathway])))
    return rows


def _arm_name(arm: str) -> str:
    """An arm as the recovery rows name it: plain MXFP4's arm (``all``) is ``mxfp4``."""
    return "mxfp4" if arm == "all" else arm


def _negated(values: list) -> list:
    return [None if v is None else -v for v in values]


def recovery_claim_rows(model, checkpoint, m: Measured, corrections, design) -> list[dict]:
    """The claim-level test of each recovery claim (``RECOVERIES``) whose correction has an arm: on its
    pathway, the correction arm's harm is below plain MXFP4's and below each other correction arm's
    (``stats.dominance_test`` on the negated harms, paired over units; margin ``design.margins``). One row a
    pathway (metric ``<pathway>_recovery_claim``), as ``claim_rows``. The first arm of ``corrections`` that
    holds the claimed correction is the claimed one."""
    rows = []
    for pathway, per_arm in recovery_harms(m).items():
        arms = [correction_arm_targets(k) for k in corrections if k in per_arm]
        claimed = next((k for k, targets in arms if pathway in targets), None)
        if claimed is None or "all" not in per_arm:
            continue
        rivals = ["all"] + [k for k, _ in arms if k != claimed]
        margin = design.margins[pathway]

        def method(weakest, claimed=claimed, rivals=rivals, margin=margin, pathway=pathway) -> str:
            return RECOVERY_CLAIM_METHOD.format(unit=UNITS[pathway], k=claimed,
                                                rivals=", ".join(map(_arm_name, rivals)), margin=margin,
                                                harm=RECOVERY_HARMS[pathway],
                                                weakest=f"{_arm_name(weakest)} vs {claimed}")

        row = _dominance_row(model, checkpoint, f"{claimed} recovers most", pathway, f"{pathway}_recovery_claim",
                             _negated(per_arm[claimed]), {r: _negated(per_arm[r]) for r in rivals}, margin, method)
        rows += [row] if row else []
    return rows


def correction_arm_targets(name: str) -> tuple[str, set[str]]:
    """(recipe name, the pathways its corrections are the paper's recovery of)."""
    names = {c["name"] for c in Recipe.named(name).corrections}
    return name, {p for p, c in RECOVERIES.items() if c in names}


def _grad_rows(model_name, ckpt, injection, site, per_batch: list[dict], groups: list) -> list[dict]:
    rows = []
    layers = ["total"] + sorted(per_batch[0]["per_layer"], key=_depth)
    for layer in layers:
        for metric in ("cosine", "rel_norm_error", "norm_ratio"):
            vals = [(b["total"] if layer == "total" else b["per_layer"][layer])[metric] for b in per_batch]
            rows.append(_row(model_name, ckpt, injection, site, layer, f"grad_{metric}", nested_mean(vals, groups),
                             GRAD_METHOD))
    return rows


def _depth(layer: str):
    return (0, int(layer[5:])) if layer.startswith("layer") and layer[5:].isdigit() else (1, layer)


def additivity(model, trainer, batch, steps: list[int], lr: float) -> dict[int, float]:
    """Interaction ratio ``|D_all - sum_c D_c| / |D_all|`` after k AdamW updates on one batch, where
    D_arm is the arm's parameter deviation from the unquantized arm's after the same updates."""
    start = {n: p.detach().clone() for n, p in model.named_parameters()}

    def restore():
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(start[n])

    finals: dict[str, dict[int, dict]] = {}
    for row in ("none", "+scale", "+dead", "+grid", "all"):
        restore()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
        finals[row] = {}
        with Arm(model, row_quantizer(row)):
            for k in range(1, max(steps) + 1):
                opt.zero_grad(set_to_none=True)
                trainer.batch_loss(batch).backward()
                opt.step()
                if k in steps:
                    finals[row][k] = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    restore()
    out = {}
    for k in steps:
        base = finals["none"][k]
        dev = {
            r: torch.cat([(finals[r][k][n] - base[n]).double().flatten() for n in base]) for r in finals if r != "none"
        }
        full = dev["all"]
        out[k] = (
            float((full - dev["+scale"] - dev["+dead"] - dev["+grid"]).norm() / full.norm())
            if full.norm() > 0
            else None
        )
    return out



def measure_gradients(m: Measured, trainer, model, batches, settings, form: str, group, seed: int) -> list:
    """Every arm's (and control arm's) gradient comparison per batch at every site, and (canonical
    form) the scale-rule group with its pooled weight statistics, appended to ``m``; returns the
    unquantized gradient of every batch."""
    reference = [batch_gradient(trainer, b) for b in batches]

    def grads_under(quantizer):
        with Arm(model, quantizer):
            return [compare(batch_gradient(trainer, b), ref) for b, ref in zip(batches, reference)]

    for site in settings.sites:
        # site both: every arm and control; forward or backward alone: each component injected and full
        # MXFP4 (the per-site, per-layer view of each component; the removals and controls at site both)
        arms = (*ROWS[1:], *control_rows(settings.controls)) if site == "both" else SITE_ARMS
        for row in arms:
            m.grad.setdefault((row, site), []).extend(grads_under(row_quantizer(row, site, form=form)))
    for rule in settings.scale_rules if form == "canonical" else ():  # full MXFP4 has no form
        q = row_quantizer("all", "both", rule)
        # the floor rule's arm is the "all" arm at site both: measured once
        per_batch = m.grad[("all", "both")][-len(batches):] if rule == "floor" and "both" in settings.sites \
            else grads_under(q)
        m.rules.setdefault(rule, []).extend(per_batch)
        with Arm(model, q):
            m.rule_weights.setdefault(rule, []).append(weight_decomposition(model, q))
    m.grad_groups.extend([group] * len(batches))
    m.grad_keys.extend(batch_key(b) for b in batches)
    m.grad_seeds.extend([seed] * len(batches))
    return reference


@dataclass
class FixedTokens:
    """What every arm's teacher-forced measures score, the same tokens for each: the completions the
    unquantized arm sampled (prompt and completion ids, ``samples`` per prompt) with its log-probabilities
    along them, and each problem's correct worked solution."""

    prompt_ids: list
    completion_ids: list
    logp: torch.Tensor | None
    solutions: tuple
    samples: int
    temperature: float
    pad: int

    def measure(self, model) -> tuple[dict[str, list[float]], torch.Tensor]:
        """The model's teacher-forced measures per prompt (``TEACHER_FORCED``): the mean token entropy and
        KL to the unquantized arm along the fixed completions, and the solution's log-likelihood; and its
        log-probabilities along the completions (the unquantized arm's are every other arm's reference)."""
        on_fixed = teacher_forced(model, self.prompt_ids, self.completion_ids, self.logp, self.temperature, self.pad)
        on_solution = teacher_forced(model, *self.solutions, None, self.temperature, self.pad)
        prompts = len(on_solution["loglik"])

        def per_prompt(per_sample) -> list[float]:
            """The mean over each prompt's samples (rollout_scores lays them out prompt by prompt)."""
            return torch.tensor(per_sample).view(prompts, self.samples).mean(1).tolist()

        return {"tf_entropy": per_prompt(on_fixed["entropy"]),
                "tf_kl": per_prompt(on_fixed["kl"]) if "kl" in on_fixed else [0.0] * prompts,
                "tf_solution_loglik": on_solution["loglik"]}, on_fixed["logp"]


def add_teacher(m: Measured, row: str, measured: dict[str, list[float]]) -> None:
    teacher = m.teacher.setdefault(row, {k: [] for k in measured})
    for k, values in measured.items():
        teacher[k].extend(values)


def measure_rollouts(m: Measured, model, tokenizer, problems, profile: Profile, form: str, group, seed: int,
                     chat: bool = False) -> FixedTokens:
    """Every arm's per-prompt rollout accuracy and entropy (one sampling seed for every arm, so arms
    pair sample by sample), and the policy's weight energy shares, appended to ``m`` (``chat``: the
    model's prompts are chat turns, ``data.prompt``); returns the tokens every arm was scored on."""
    settings, g = profile.pathways, profile.grpo
    samples = settings.samples_per_prompt
    solutions = token_pairs(tokenizer, [gsm.prompt(r["question"], tokenizer, chat) for r in problems],
                            [r["answer"] for r in problems])
    pad = tokenizer.pad_token_id or 0
    fixed = None
    for row in (*ROWS, *control_rows(settings.controls)):  # "none" first: its completions are the fixed ones
        with Arm(model, row_quantizer(row, "forward", form=form)):
            if fixed is None or settings.sample_every_arm:
                acc, ent, prompt_ids, completion_ids = rollout_scores(
                    model, tokenizer, problems, samples, g.max_completion_length, g.temperature, seed, chat)
                if fixed is None:
                    fixed = FixedTokens(prompt_ids, completion_ids, None, solutions, samples, g.temperature, pad)
                have = m.scores.setdefault(row, ([], []))
                have[0].extend(acc)
                have[1].extend(ent)
            measured, logp = fixed.measure(model)
        if fixed.logp is None:
            fixed.logp = logp
        add_teacher(m, row, measured)
    m.roll_groups.extend([group] * len(problems))
    m.roll_keys.extend(unit_digest(r["question"], seed) for r in problems)
    m.roll_seeds.extend([seed] * len(problems))
    full = row_quantizer("all")
    with Arm(model, full):
        weights = weight_decomposition(model, full, form=form)
    if weights["energy_total"]:
        m.shares.append({c: weights[f"energy_{c}"] / weights["energy_total"] for c in COMPONENTS})
    return fixed


def measure_corrections(ms: list[Measured], model, trainer, batches, reference: list, fixed: FixedTokens,
                        profile: Profile, seed: int) -> None:
    """Every correction arm (``pathways.corrections``) of one policy: its gradient comparison per batch at
    site both and its teacher-forced measures on ``fixed``'s tokens, appended to each ``Measured`` in ``ms``
    (a correction arm has no decomposition form: every form's measurements hold the same values)."""
    for name in profile.pathways.corrections:
        grads = []
        if batches:
            model.train()
            with Arm(model, correction_arm(name, "both", profile, seed).quantizer):
                grads = [compare(batch_gradient(trainer, b), ref) for b, ref in zip(batches, reference)]
        arm = correction_arm(name, "forward", profile, seed)
        with Arm(model, arm.quantizer), arm.rollout(model):
            measured, _ = fixed.measure(model)
        for m in ms:
            if grads:
                m.grad.setdefault((name, "both"), []).extend(grads)
            add_teacher(m, name, measured)


def teacher_forced_rows(model_name: str, ckpt: str, m: Measured) -> list[dict]:
    """The teacher-forced measures of every arm (``TEACHER_FORCED``), per prompt: each arm's mean, and
    its difference from the unquantized arm paired per prompt (the KL is a difference already)."""
    rows = []
    for row, per_metric in m.teacher.items():
        for metric, values in per_metric.items():
            rows.append(_row(model_name, ckpt, row, "forward", "total", metric, nested_mean(values, m.roll_groups),
                             TEACHER_FORCED[metric]))
            if row != "none" and metric != "tf_kl":
                rows.append(_row(model_name, ckpt, row, "forward", "total", f"{metric}_diff",
                                 _paired(values, m.teacher["none"][metric], m.roll_groups),
                                 f"{TEACHER_FORCED[metric]}; {PAIRED_METHOD}"))
    return rows


def form_rows(model_name: str, ckpt: str, m: Measured, settings, seed: int) -> list[dict]:
    """The rows of one checkpoint and decomposition form from its measurements: gradient rows (and the
    scale-rule group), rollout and entropy rows, the contrasts, the Shapley rows and the excess harm
    over the matched controls."""
    rows: list[dict] = []
    harms = m.harms(settings.sites)
    if len(m.grad_groups) >= 2:
        for (row, site), per_batch in m.grad.items():
            rows += _grad_rows(model_name, ckpt, row, site, per_batch, m.grad_groups)
        for rule, per_batch in m.rules.items():
            rows += [r for r in _grad_rows(model_name, ckpt, f"rule:{rule}", "both", per_batch, m.grad_groups)
                     if r["layer"] == "total"]
            pooled = m.rule_weights[rule]
            for metric in ("energy_scale", "share_scale"):
                value = sum(w[metric] for w in pooled) / len(pooled)
                rows.append(_row(model_name, ckpt, f"rule:{rule}", "weights", "total", f"weight_{metric}",
                                 _scalar(value, len(pooled)),
                                 "pooled over all quantized weights (float64), mean over the policies"))
    scores = m.scores
    for row in scores:
        for i, metric in enumerate(("rollout_accuracy", "entropy")):
            rows.append(_row(model_name, ckpt, row, "forward", "total", metric,
                             nested_mean(scores[row][i], m.roll_groups), "mean over prompts, 95% t interval"))
            if row != "none":
                rows.append(_row(model_name, ckpt, row, "forward", "total", f"{metric}_diff",
                                 _paired(scores[row][i], scores["none"][i], m.roll_groups), PAIRED_METHOD))
    rows += teacher_forced_rows(model_name, ckpt, m)
    rows += contrast_rows(model_name, ckpt, harms, m)
    rows += shapley_rows(model_name, ckpt, harms, m, seed)
    rows += excess_rows(model_name, ckpt, harms, settings.controls, m)
    rows += recovery_rows(model_name, ckpt, m, settings.corrections)
    if ckpt == "warm" and settings.claims is not None:
        rows += claim_rows(model_name, ckpt, m, settings.claims)
        rows += recovery_claim_rows(model_name, ckpt, m, settings.corrections, settings.claims)
    for r in rows:
        r["seeds"] = len(m.seeds)
    return rows


def checkpoints(profile: Profile, model_name: str, results) -> dict[str, dict[int, Path]]:
    """The policies the profile asks for (``pathways.checkpoints``), per seed: the warm-started policy
    (one for every seed) and the bf16 cell's policy after GRPO of every seed (an error when a seed's
    has not run)."""
    spec = profile.model(model_name)
    if spec.config:
        raise ValueError(
            f"model {model_name!r} is a random initialisation (config: {spec.config}); the pathway matrix "
            "needs a warm-started tiny model or a hub checkpoint"
        )
    layout = Layout(results, profile.name)
    out: dict[str, dict[int, Path]] = {}
    if "warm" in profile.pathways.checkpoints:  # each seed's own warm start (one for all where there is one)
        out["warm"] = {s: layout.model(model_name, profile.warm_start_of(s)) if spec.arch else Path(spec.hub)
                       for s in profile.seeds}
    if "grpo" in profile.pathways.checkpoints:
        out["grpo"] = {s: layout.policy(model_name, s) for s in profile.seeds}
        missing = [str(p) for p in out["grpo"].values() if not (p / "config.json").exists()]
        if missing:
            raise ValueError(f"pathways.checkpoints asks for grpo, but these bf16 policies after GRPO are missing: "
                             f"{', '.join(missing)}; run the bf16 cells first (snakemake runs them before)")
    return out


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
    return _row(model_name, "warm", "none", "-", "total", "activation_outlier_block_fraction", est,
                f"dose {dose}: the activations' outlier-block fraction (regime statistics), median [min, max] over "
                f"{len(fractions)} GEMMs, on the first gradient batch")


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


def run_pathways(profile: Profile, model_name: str, results="results", out_csv=None,
                 progress=print, checkpoint: str | None = None, out_units=None, dose: str | None = None
                 ) -> list[dict]:
    """The pathway matrix of one model on every seed of the profile: per checkpoint, each seed's policy
    measured on its own batches and prompts, the rows estimated with the policy as the outer unit
    (``stats.nested_mean``).

    Args:
        profile: the run's profile; its ``pathways`` section sets the design.
        model_name: a model line of the profile.
        results: the results root (warm starts, the bf16 cells' policies after GRPO).
        out_csv: where to write the rows (``pathway_spec.FIELDS``); None writes nothing.
        progress: called with one line per seed and form.
        checkpoint: one checkpoint only (``warm`` or ``grpo``); default every one the profile names.
        out_units: where to write every unit's harm (``UNIT_FIELDS``).
        dose: an outlier dose of ``dose_response.doses`` (``c2x32``) given to the warm start before it is
            measured (the warm checkpoint only), with a row of the activations' outlier-block fraction.

    Returns:
        The rows.
    """
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
    if dose is not None and checkpoint != "warm":
        raise ValueError(f"an outlier dose ({dose}) is given to the warm start; accepted: checkpoint 'warm', got "
                         f"{checkpoint!r}")
    ckpts = checkpoints(profile, model_name, results)
    if spec.arch:
        for seed in profile.seeds:
            warm_start_folder(profile, model_name, results, seed)
    train, _ = gsm.cell_data(profile, results)
    held_out = gsm.load_gsm8k("test", gsm8k_folder(profile)) if settings.prompts_from == "gsm8k-test" else None
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
            if dose is not None and seed == profile.seeds[0] and batches:
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
            if ckpt == "warm" and seed == profile.seeds[0] and settings.additivity_steps and batches:
                for k, ratio in additivity(model, trainer, batches[0], settings.additivity_steps,
                                           profile.grpo.learning_rate).items():
                    rows.append(_row(model_name, ckpt, "interaction", "both", "total", f"interaction_ratio_k{k}",
                                     _scalar(ratio), f"one batch, {k} AdamW update(s) per arm: "
                                     "|D_all - (D_scale + D_dead + D_grid)| / |D_all|"))
                say(f"{model_name}/{ckpt}: additivity k={settings.additivity_steps}")
        rows.append(_row(model_name, ckpt, "none", "-", "total", "skipped_zero_advantage_batches",
                         _scalar(float(skipped), skipped + usable), f"count over {len(paths)} seeds"))
        for form, m in measured.items():
            if len(m.grad_groups) < 2:
                say(f"{model_name}/{ckpt}: fewer than 2 usable gradient batches: no gradient rows")
            for r in form_rows(model_name, ckpt, m, settings, profile.seeds[0]):
                rows.append({**r, "form": form})
            units += unit_rows(model_name, ckpt, form, m, settings.sites)
    for r in rows:
        r.setdefault("form", "canonical")  # rows that no decomposition form shapes (counts, full MXFP4)
        if r["seeds"] is None:
            r["seeds"] = len(profile.seeds)
    if out_csv is not None:
        write_csv_atomic(out_csv, rows, FIELDS)
    if out_units is not None:
        write_csv_atomic(out_units, units, UNIT_FIELDS)
    return rows

"""The pathway matrix: each MXFP4 error component injected alone (or removed), measured on the three
RL pathways the paper maps it to: gradient accuracy (TRL's own batches and loss through
``MXGRPOTrainer.scored_batch`` / ``batch_loss``), rollout quality and policy entropy (the same prompts
sampled under each arm from one seed), with the scale rules as a row group and the additivity test.
Each injected component also has energy-matched control arms (``+c~gaussian``, ``+c~permuted``: the
same per-block energy, no alignment with x): the excess harm of a component is its harm minus its
control's, paired over the same units. The eight corners none, +c, all, -c form a three-player game
per unit; its Shapley values and interaction are reported per pathway with bootstrap intervals.
The design is docs/design.md, "The pathway matrix". Output: a tidy CSV (model, checkpoint,
injection, site, layer, metric, mean, ci_low, ci_high, n, p, method, form).
"""

from __future__ import annotations

import csv
import time
from pathlib import Path

import torch

from ..config.profiles import Profile, load_profile
from ..config.recipes import Recipe
from ..io import write_text_atomic
from ..layout import Layout
from ..nn import patch_model, unpatch_model
from ..numerics.decompose import COMPONENTS, interaction, shapley_values
from ..numerics.injection import ROWS, SITES, row_spec
from ..stats import hierarchical_bootstrap, mean_ci, paired_diff
from . import data as gsm
from .cell import accuracy_reward, cell_data, weight_decomposition
from .grad_accuracy import compare
from .models import warm_start_folder

FIELDS = [
    "model",
    "checkpoint",
    "injection",
    "site",
    "layer",
    "metric",
    "mean",
    "ci_low",
    "ci_high",
    "n",
    "p",
    "method",
    "form",
]
# The paper's mapping: which component dominates which pathway, and the harm measure of that pathway
# (larger = worse), per unit (gradient batch or prompt).
MAPPING = {"gradient": "scale", "rollout": "dead", "entropy": "grid"}
CONTRAST_METHOD = (
    "paired over {units}: harm(+{a}) - harm(+{b}), harm = {harm}; 95% t interval, two-sided p (scipy.stats.ttest_rel)"
)
SCALE_RULES = ("floor", "ceil", "even", "rceil")
GRAD_METHOD = "mean over batches, 95% t interval"
PAIRED_METHOD = (
    "paired difference from the unquantized arm, mean over prompts, 95% t interval (same prompts and sampling seed)"
)


# The arms as coalitions of the three-player game: +c = {c}, all = every component, -c = the other two.
COALITIONS = {"none": frozenset(), "all": frozenset(COMPONENTS),
              **{f"+{c}": frozenset({c}) for c in COMPONENTS},
              **{f"-{c}": frozenset(COMPONENTS) - {c} for c in COMPONENTS}}
HARMS = {"gradient": "1 - gradient cosine", "rollout": "- rollout accuracy", "entropy": "mean token entropy"}
UNITS = {"gradient": "gradient batches", "rollout": "prompts", "entropy": "prompts"}
SHAPLEY_METHOD = ("per {unit}: Shapley value over the 8 arms none/+c/all/-c (harm = {harm}), mean with a 95% "
                  "percentile bootstrap interval (seeds outer, {unit} within; 2000 draws)")
EXCESS_METHOD = ("paired over {unit}: harm(+{c}) - harm(+{c}~{k}), harm = {harm}; the control has the same energy in "
                 "every block and no alignment with x; 95% t interval, two-sided p")


def control_rows(controls) -> list[str]:
    """The control arms of a profile: +c~k for every component c and control kind k."""
    return [f"+{c}~{k}" for k in controls for c in COMPONENTS]


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


def _trainer(model, tokenizer, profile: Profile, seed: int):
    """TRL's GRPO trainer on this model, used for its batch generation and its loss (never trained;
    no KL term: the arms are compared on the policy gradient alone)."""
    from datasets import Dataset

    from .grpo import MXGRPOTrainer
    from .training import grpo_config

    g = profile.grpo
    args = grpo_config(g, seed, micro_batch=g.num_generations * batch_prompts(profile), max_steps=1, beta=0.0)
    dummy = Dataset.from_list([{"prompt": "x", "answer": "0"}])
    return MXGRPOTrainer(
        model=model, reward_funcs=[accuracy_reward], args=args, train_dataset=dummy, processing_class=tokenizer
    )


def batch_prompts(profile: Profile) -> int:
    return profile.pathways.prompts_per_batch or profile.grpo.prompts_per_step


def gradient_batches(trainer, problems: list[dict], profile: Profile, n_batches: int, seed: int):
    """(batches, skipped): up to ``n_batches`` GRPO batches with non-zero advantages, generated by
    the model as it is (unquantized), and the number of all-zero-advantage batches skipped on the way
    (fewer batches when the problems run out)."""
    g, size = profile.grpo, batch_prompts(profile)
    torch.manual_seed(seed)
    batches, skipped, i = [], 0, 0
    trainer.model.train()
    while len(batches) < n_batches:
        chunk = problems[i * size : (i + 1) * size]
        i += 1
        if len(chunk) < size:  # out of problems: the rows say how many batches were usable
            break
        inputs = [
            {"prompt": gsm.PROMPT.format(question=r["question"]), "answer": r["answer"]}
            for r in chunk
            for _ in range(g.num_generations)
        ]
        batch = trainer.scored_batch(inputs)
        if batch["advantages"].abs().max() == 0:
            skipped += 1
            continue
        batches.append(batch)
    return batches, skipped


def batch_gradient(trainer, batch) -> dict[str, torch.Tensor]:
    """The GRPO loss gradient of one batch, by parameter name (TRL's ``compute_loss``)."""
    model = trainer.model
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    loss = trainer.batch_loss(batch)
    grads = torch.autograd.grad(loss, [p for _, p in params], allow_unused=True)
    return {n: g.detach() for (n, _), g in zip(params, grads) if g is not None}


def rollout_scores(
    model, tokenizer, problems: list[dict], samples: int, max_new_tokens: int, temperature: float, seed: int
) -> tuple[list[float], list[float]]:
    """Per prompt: accuracy of ``samples`` sampled completions and their mean token entropy. The
    sampling RNG is seeded, so arms that differ only in their logits are paired sample by sample."""
    repeated = [r for r in problems for _ in range(samples)]
    enc = tokenizer([gsm.PROMPT.format(question=r["question"]) for r in repeated], return_tensors="pt", padding=True)
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
    return correct.view(-1, samples).mean(1).tolist(), tok_entropy.view(-1, samples).mean(1).tolist()


def _paired(d: dict) -> dict:
    """A row estimate from a ``paired_diff`` result."""
    return {"mean": d["diff"], "ci_low": d["ci_low"], "ci_high": d["ci_high"], "n": d["n"], "p": d["p"]}


def _row(model, checkpoint, injection, site, layer, metric, est, method) -> dict:
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
        "p": est.get("p"),
        "method": method,
    }


def contrast_rows(
    model, checkpoint, harms: dict[str, dict[str, list]], units: dict[str, str], harm_names: dict[str, str]
) -> list[dict]:
    """For each pathway, the claimed dominant component's harm minus each other component's, paired
    over the same units (metric ``<pathway>_harm_contrast``; positive = the claimed one hurts more)."""
    rows = []
    for pathway, top in MAPPING.items():
        per = harms.get(pathway)
        if not per:
            continue
        for other in (c for c in ("scale", "dead", "grid") if c != top):
            d = paired_diff(per[top], per[other])
            rows.append(
                _row(
                    model,
                    checkpoint,
                    f"+{top} vs +{other}",
                    "forward" if pathway != "gradient" else "both",
                    "total",
                    f"{pathway}_harm_contrast",
                    _paired(d),
                    CONTRAST_METHOD.format(units=units[pathway], a=top, b=other, harm=harm_names[pathway]),
                )
            )
    return rows


def shapley_rows(model, checkpoint, harms: dict[str, dict[str, list]], seed: int) -> list[dict]:
    """Per pathway with every corner measured: each component's Shapley value and the interaction of
    the game v(T) = harm of the arm injecting T, per unit, then their means with bootstrap intervals
    (metric ``<pathway>_shapley``; injection ``shapley:<c>`` or ``shapley:interaction``)."""
    rows = []
    for pathway, per_arm in harms.items():
        if not all(per_arm.get(a) for a in COALITIONS):
            continue
        per = {c: [] for c in (*COMPONENTS, "interaction")}
        for i in range(len(per_arm["none"])):
            v = {COALITIONS[a]: per_arm[a][i] for a in COALITIONS}
            if any(x is None for x in v.values()):
                continue
            for c, phi in shapley_values(v).items():
                per[c].append(phi)
            per["interaction"].append(interaction(v))
        for name, values in per.items():
            est = hierarchical_bootstrap({seed: values}, seed=seed)
            rows.append(_row(model, checkpoint, f"shapley:{name}", "both" if pathway == "gradient" else "forward",
                             "total", f"{pathway}_shapley", est,
                             SHAPLEY_METHOD.format(unit=UNITS[pathway], harm=HARMS[pathway])))
    return rows


def excess_rows(model, checkpoint, harms: dict[str, dict[str, list]], controls, energy_share: dict) -> list[dict]:
    """Per pathway and component: the excess harm over each energy-matched control (paired over units),
    the component's harm per unit of injected energy (its weight energy relative to MXFP4's error
    energy), and the paper's mapping tested on excess harms: excess(+claimed) - excess(+other)."""
    rows = []
    for pathway, per_arm in harms.items():
        site = "both" if pathway == "gradient" else "forward"
        unit, harm = UNITS[pathway], HARMS[pathway]
        excess: dict[str, dict[str, list]] = {}
        for k in controls:
            excess[k] = {}
            for c in COMPONENTS:
                a, b = per_arm.get(f"+{c}"), per_arm.get(f"+{c}~{k}")
                if not a or not b:
                    continue
                excess[k][c] = [None if x is None or y is None else x - y for x, y in zip(a, b)]
                d = paired_diff(a, b)
                rows.append(_row(model, checkpoint, f"+{c} vs +{c}~{k}", site, "total", f"{pathway}_excess_harm",
                                 _paired(d), EXCESS_METHOD.format(unit=unit, c=c, k=k, harm=harm)))
            top = MAPPING[pathway]
            for other in (c for c in COMPONENTS if c != top):
                if top in excess[k] and other in excess[k]:
                    d = paired_diff(excess[k][top], excess[k][other])
                    rows.append(_row(
                        model, checkpoint, f"+{top} vs +{other} (excess over ~{k})", site, "total",
                        f"{pathway}_excess_contrast",
                        _paired(d),
                        f"paired over {unit}: excess harm(+{top}) - excess harm(+{other}), each over its ~{k} "
                        f"control; 95% t interval, two-sided p"))
        base = per_arm.get("none")
        for c in COMPONENTS:
            share = energy_share.get(c)
            if not per_arm.get(f"+{c}") or not share or not base:
                continue
            d = paired_diff(per_arm[f"+{c}"], base)
            est = {"mean": None if d["diff"] is None else d["diff"] / share, "n": d["n"], "p": d["p"],
                   "ci_low": None if d["ci_low"] is None else d["ci_low"] / share,
                   "ci_high": None if d["ci_high"] is None else d["ci_high"] / share}
            method = (f"(harm(+{c}) - harm(none)) / (weight energy of e_{c} / MXFP4 error energy = {share:.3f}), "
                      f"paired over {unit}; 95% t interval")
            rows.append(_row(model, checkpoint, f"+{c}", site, "total", f"{pathway}_harm_per_energy", est, method))
    return rows


def _grad_rows(model_name, ckpt, injection, site, per_batch: list[dict]) -> list[dict]:
    rows = []
    layers = ["total"] + sorted(per_batch[0]["per_layer"], key=_depth)
    for layer in layers:
        for metric in ("cosine", "rel_norm_error"):
            vals = [(b["total"] if layer == "total" else b["per_layer"][layer])[metric] for b in per_batch]
            rows.append(_row(model_name, ckpt, injection, site, layer, f"grad_{metric}", mean_ci(vals), GRAD_METHOD))
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


def gradient_pathway(model_name, ckpt, trainer, model, batches, settings, harms, form="canonical") -> list[dict]:
    """Gradient rows of every arm (and control arm) at every site, and (canonical form) the scale-rule
    row group; fills ``harms["gradient"]`` with the per-batch harm of every arm at site both."""
    rows = []
    reference = [batch_gradient(trainer, b) for b in batches]

    def grads_under(quantizer):
        with Arm(model, quantizer):
            return [compare(batch_gradient(trainer, b), ref) for b, ref in zip(batches, reference)]

    full_mxfp4 = None  # the "all" arm at site both is the floor rule's arm: measured once
    for site in settings.sites:
        for row in (*ROWS[1:], *(control_rows(settings.controls) if site == "both" else ())):
            per_batch = grads_under(row_quantizer(row, site, form=form))
            rows += _grad_rows(model_name, ckpt, row, site, per_batch)
            if site == "both":
                harms["gradient"][row] = [
                    None if b["total"]["cosine"] is None else 1 - b["total"]["cosine"] for b in per_batch
                ]
            if site == "both" and row == "all":
                full_mxfp4 = per_batch
    if "both" in settings.sites:
        harms["gradient"]["none"] = [0.0] * len(batches)  # the reference gradient itself: cosine 1
    for rule in settings.scale_rules if form == "canonical" else ():  # full MXFP4 has no form
        q = row_quantizer("all", "both", rule)
        per_batch = full_mxfp4 if rule == "floor" and full_mxfp4 is not None else grads_under(q)
        rows += [r for r in _grad_rows(model_name, ckpt, f"rule:{rule}", "both", per_batch) if r["layer"] == "total"]
        with Arm(model, q):
            pooled = weight_decomposition(model, q)
        for metric in ("energy_scale", "share_scale"):
            rows.append(
                _row(
                    model_name,
                    ckpt,
                    f"rule:{rule}",
                    "weights",
                    "total",
                    f"weight_{metric}",
                    {"mean": pooled[metric], "ci_low": None, "ci_high": None, "n": 1},
                    "pooled over all quantized weights (float64)",
                )
            )
    return rows


def checkpoints(profile: Profile, model_name: str, results) -> dict[str, Path]:
    """The fixed checkpoints the profile asks for (``pathways.checkpoints``): the warm-started policy
    and (when its bf16 cell ran) the policy after GRPO."""
    spec = profile.model(model_name)
    seed = profile.seeds[0]
    if spec.config:
        raise ValueError(
            f"model {model_name!r} is a random initialisation (config: {spec.config}); the pathway matrix "
            "needs a warm-started tiny model or a hub checkpoint"
        )
    layout = Layout(results, profile.name)
    warm = layout.model(model_name) if spec.arch else Path(spec.hub)
    wanted = profile.pathways.checkpoints
    out = {"warm": warm} if "warm" in wanted else {}
    after = layout.policy(model_name, seed)
    if "grpo" in wanted and (after / "config.json").exists():
        out["grpo"] = after
    return out


def run_pathways(profile_name: str, model_name: str, results="results", out_csv=None, progress=print) -> list[dict]:
    from .models import load

    profile = load_profile(profile_name)
    settings = profile.pathways
    if settings is None:
        raise ValueError(
            f"profile {profile_name!r} has no pathways section; add one (see experiments/profiles/embedded.yaml)"
        )
    spec = profile.model(model_name)
    seed = profile.seeds[0]
    ckpts = checkpoints(profile, model_name, results)
    if spec.arch:
        warm_start_folder(results, profile_name, model_name)
    train, _ = cell_data(profile, results)
    grad_problems = train[: len(train) // 2]
    roll_problems = train[len(train) // 2 :][: settings.prompts]
    g = profile.grpo
    rows: list[dict] = []
    t0 = time.time()
    for ckpt, path in ckpts.items():
        model, tokenizer = load(str(path), dtype=torch.float32)  # float32 compute: the arms differ only by MXFP4
        trainer = _trainer(model, tokenizer, profile, seed)
        batches, skipped = gradient_batches(trainer, grad_problems, profile, settings.batches, seed)
        rows.append(
            _row(
                model_name,
                ckpt,
                "none",
                "-",
                "total",
                "skipped_zero_advantage_batches",
                {"mean": float(skipped), "ci_low": None, "ci_high": None, "n": skipped + len(batches)},
                "count",
            )
        )
        for form in settings.forms:
            first = len(rows)
            rows += form_rows(model_name, ckpt, model, tokenizer, trainer, batches, profile, roll_problems, form,
                              lambda msg: progress(f"[{time.time() - t0:6.1f}s] {msg}"))
            for r in rows[first:]:
                r["form"] = form

        if ckpt == "warm" and settings.additivity_steps and batches:
            ratios = additivity(model, trainer, batches[0], settings.additivity_steps, g.learning_rate)
            for k, ratio in ratios.items():
                rows.append(
                    _row(
                        model_name,
                        ckpt,
                        "interaction",
                        "both",
                        "total",
                        f"interaction_ratio_k{k}",
                        {"mean": ratio, "ci_low": None, "ci_high": None, "n": 1},
                        f"one batch, {k} AdamW update(s) per arm: |D_all - (D_scale + D_dead + D_grid)| / |D_all|",
                    )
                )
            progress(f"[{time.time() - t0:6.1f}s] {model_name}/{ckpt}: additivity k={settings.additivity_steps}")
    for r in rows:
        r.setdefault("form", "canonical")  # rows that no decomposition form shapes (counts, full MXFP4)
    if out_csv is not None:
        write_csv(rows, out_csv)
    return rows


def form_rows(model_name, ckpt, model, tokenizer, trainer, batches, profile: Profile, roll_problems, form: str,
              progress) -> list[dict]:
    """Every arm of one checkpoint with the components of one decomposition form: gradient rows (and
    the scale-rule group, canonical only), rollout and entropy rows, the contrasts, the Shapley rows
    and the excess harm over the matched controls."""
    settings, g, seed = profile.pathways, profile.grpo, profile.seeds[0]
    rows: list[dict] = []
    harms: dict[str, dict[str, list]] = {"gradient": {}}
    model.train()  # as the batches were scored (the rollouts of a previous form left it in eval mode)
    if len(batches) >= 2:
        rows += gradient_pathway(model_name, ckpt, trainer, model, batches, settings, harms, form)
        progress(f"{model_name}/{ckpt} ({form}): gradient and scale-rule rows")
    else:
        progress(f"{model_name}/{ckpt}: fewer than 2 usable gradient batches: no gradient rows")
    scores = {}
    for row in (*ROWS, *control_rows(settings.controls)):
        with Arm(model, row_quantizer(row, "forward", form=form)):
            scores[row] = rollout_scores(model, tokenizer, roll_problems, settings.samples_per_prompt,
                                         g.max_completion_length, g.temperature, seed)
    for row in scores:
        for i, metric in enumerate(("rollout_accuracy", "entropy")):
            rows.append(_row(model_name, ckpt, row, "forward", "total", metric, mean_ci(scores[row][i]),
                             "mean over prompts, 95% t interval"))
            if row != "none":
                d = paired_diff(scores[row][i], scores["none"][i])
                est = _paired(d)
                rows.append(_row(model_name, ckpt, row, "forward", "total", f"{metric}_diff", est, PAIRED_METHOD))
    harms["rollout"] = {row: [-v for v in scores[row][0]] for row in scores}
    harms["entropy"] = {row: scores[row][1] for row in scores}
    singles = {p: {c: per[f"+{c}"] for c in COMPONENTS if f"+{c}" in per} for p, per in harms.items()}
    rows += contrast_rows(model_name, ckpt, singles, UNITS, HARMS)
    rows += shapley_rows(model_name, ckpt, harms, seed)
    full = row_quantizer("all")
    with Arm(model, full):
        weights = weight_decomposition(model, full, form=form)
    total = weights["energy_total"]
    share = {c: weights[f"energy_{c}"] / total for c in COMPONENTS} if total else {}
    rows += excess_rows(model_name, ckpt, harms, settings.controls, share)
    progress(f"{model_name}/{ckpt} ({form}): rollout rows ({len(roll_problems)} prompts x "
             f"{settings.samples_per_prompt})")
    return rows


def write_csv(rows: list[dict], path) -> None:
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS)
    w.writeheader()
    w.writerows(rows)
    write_text_atomic(path, buf.getvalue())

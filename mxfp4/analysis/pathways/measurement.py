"""The pathway matrix's measurement: the arms (each error component injected alone, removed, or replaced by its
energy-matched control; the correction arms), the passes of the model each unit is measured with (gradients,
sampled rollouts, teacher-forced tokens), the additivity test, and what every unit measured (``Measured``).

The method in full: docs/methods.md."""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field

import torch

from ...config.profiles import Profile
from ...config.recipes import Recipe
from ...nn import generation_precision, patch_model, unpatch_model
from ...numerics.decompose import COMPONENTS
from ...numerics.hooks import lifecycle
from ...numerics.injection import ROWS, SITES, row_spec
from ...rl import data as gsm
from ...rl.batches import batch_gradient
from ...rl.grad_accuracy import compare
from ...rl.grpo import weight_decomposition
from ..teacher_forced import teacher_forced, token_pairs
from .spec import (
    SITE_ARMS,
    control_rows,
)


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
        """The arm's rollout policy: its corrections' rollout contexts, and weights alone quantized where the recipe
        generates W4A16 (``rollout_precision``)."""
        stack = contextlib.ExitStack()
        for c in self.corrections:
            stack.enter_context(lifecycle(c.rollout_context, model, self.step))
        stack.enter_context(generation_precision(model, self.quantizer))
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

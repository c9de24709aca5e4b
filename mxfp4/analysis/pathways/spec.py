"""What the pathway matrix measures, by name: the columns of its CSVs, the paper's mapping of components
to pathways, each pathway's harm and unit, the arms as coalitions of the three-player game, and the
wording of each estimate's method. The measurement (``analysis.pathways``) and the reports (tables,
figures, claims, profile contrasts) all read these names from here."""

from __future__ import annotations

from ...corrections.registry import paper_corrections
from ...numerics.decompose import COMPONENTS

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
    "seeds",
    "policies",
    "p",
    "method",
    "form",
    "p_contradicted",
    "sd",
]
UNIT_FIELDS = ["model", "checkpoint", "form", "pathway", "arm", "unit", "group", "seed", "key", "harm"]
# The paper's mapping: which component dominates which pathway, and the harm measure of that pathway
# (larger = worse), per unit (gradient batch or prompt).
MAPPING = {"gradient": "scale", "rollout": "dead", "entropy": "grid"}
CONTRAST_METHOD = (
    "paired over {units}: harm(+{a}) - harm(+{b}), harm = {harm}; 95% t interval, two-sided p (scipy.stats.ttest_rel)"
)
SCALE_RULES = ("floor", "ceil", "even", "rceil")
SITE_ARMS = ("+scale", "+dead", "+grid", "all")  # the arms measured at sites forward and backward
GRAD_METHOD = "mean over batches, 95% t interval"
PAIRED_METHOD = (
    "paired difference from the unquantized arm, mean over prompts, 95% t interval (same prompts and sampling seed)"
)


# The arms as coalitions of the three-player game: +c = {c}, all = every component, -c = the other two.
COALITIONS = {"none": frozenset(), "all": frozenset(COMPONENTS),
              **{f"+{c}": frozenset({c}) for c in COMPONENTS},
              **{f"-{c}": frozenset(COMPONENTS) - {c} for c in COMPONENTS}}
# Each pathway's harm per unit (larger = worse): the low-variance measures, every arm on the same tokens
# (the sampled rollout accuracy and entropy stay as rows of their own).
HARMS = {"gradient": "1 - gradient cosine (site both)",
         "rollout": "- log-likelihood of the correct solution (teacher-forced)",
         "entropy": "token entropy on the unquantized policy's sampled completions (teacher-forced)"}
CLAIM_METHOD = ("intersection-union test at the warm start, paired over {unit}: harm(+{c}) - harm(r) > 0 for every "
                "rival r ({rivals}), one-sided paired t each; p held = the largest; p contradicted = Bonferroni over "
                "the rivals of mean(harm(+{c}) - harm(r)) < {margin:g} (the margin); harm = {harm}; the value is "
                "the weakest contrast ({weakest}) with its 95% t interval")
MECHANISMS = {  # pathway -> (claimed component, claim text)
    "gradient": ("scale", "Scale bias dominates gradient accuracy"),
    "rollout": ("dead", "Deadzone truncation dominates rollout quality"),
    "entropy": ("grid", "Grid noise dominates policy entropy"),
}
RECOVERY_CLAIMS = {  # pathway -> claim text (the correction: RECOVERIES)
    "gradient": "Macro-block scaling restores gradient accuracy",
    "rollout": "Outlier fallback restores rollout quality",
    "entropy": "AQN restores policy entropy",
}
UNITS = {"gradient": "gradient batches", "rollout": "prompts", "entropy": "prompts"}
SHAPLEY_METHOD = ("per {unit}: Shapley value over the 8 arms none/+c/all/-c (harm = {harm}), mean with a 95% "
                  "percentile bootstrap interval (seeds outer, {unit} within; 2000 draws)")
EXCESS_METHOD = ("paired over {unit}: harm(+{c}) - harm(+{c}~{k}), harm = {harm}; the control has the same energy in "
                 "every block and no alignment with x; 95% t interval, two-sided p")


def control_rows(controls) -> list[str]:
    """The control arms of a profile: +c~k for every component c and control kind k."""
    return [f"+{c}~{k}" for k in controls for c in COMPONENTS]

# The teacher-forced measures of each arm (mxfp4.analysis.teacher_forced): the same tokens under every arm.
TEACHER_FORCED = {
    "tf_entropy": "mean token entropy along the completions the unquantized arm sampled (teacher-forced), "
                  "mean over each prompt's samples",
    "tf_kl": "mean token KL(unquantized || arm) along the completions the unquantized arm sampled "
             "(teacher-forced), mean over each prompt's samples",
    "tf_solution_loglik": "log-likelihood of the problem's correct worked solution and its EOS (teacher-forced)",
}

# The paper's recoveries: which correction restores which pathway (a correction arm is the recipe MXFP4 plus
# that correction alone, ``pathways.corrections``).
RECOVERIES = {pathway: cls.name for pathway, cls in paper_corrections().items()}
# What a correction recovers on each pathway, per unit: MXFP4's harm minus the correction arm's. On the entropy
# pathway a correction restores the unquantized policy's entropy, from either side: the harm is the entropy gap.
RECOVERY_HARMS = {**HARMS, "entropy": "|token entropy - the unquantized arm's| on the unquantized policy's sampled "
                                      "completions (teacher-forced)"}
RECOVERY_METHOD = ("paired over {unit}: harm(mxfp4) - harm({k}), harm = {harm} (> 0: the correction recovers); "
                   "95% t interval, two-sided p")
RECOVERY_CLAIM_METHOD = ("intersection-union test at the warm start, paired over {unit}: harm({k}) < harm(r) for every "
                         "rival r ({rivals}): the correction recovers more than plain MXFP4 and more than each other "
                         "correction; one-sided paired t each, p held = the largest; p contradicted = Bonferroni over "
                         "the rivals of mean(harm(r) - harm({k})) < {margin:g} (the margin); harm = {harm}; the value "
                         "is the weakest contrast ({weakest}) with its 95% t interval")


def unit_identity(r: dict) -> tuple:
    """What one unit is, whatever file holds it: model, checkpoint, form, pathway, arm, seed and its index (a prompt
    drawn twice is two units with one key)."""
    return (r["model"], r["checkpoint"], r["form"], r["pathway"], r["arm"], str(r["seed"]), int(r["unit"]))


def first_unit_difference(stored: list[dict], again: list[dict]) -> str | None:
    """The first unit (by identity) that one set of unit rows has and the other lacks, or whose harm or key differs,
    with why; None where they agree unit for unit."""
    have, now = {unit_identity(r): r for r in stored}, {unit_identity(r): r for r in again}
    for k in sorted(have.keys() | now.keys(), key=str):
        a, b = have.get(k), now.get(k)
        same_key = a is not None and b is not None and (a.get("key") or "") == (b.get("key") or "")
        if a is None or b is None or float(a["harm"]) != float(b["harm"]) or not same_key:
            why = ("missing from the run" if b is None else "not in the stored rows" if a is None else
                   f"harm {float(b['harm'])!r} where the stored rows have {float(a['harm'])!r}"
                   if float(a["harm"]) != float(b["harm"]) else
                   f"unit key {b.get('key')!r} where the stored rows have {a.get('key')!r}")
            return f"{'/'.join(map(str, k))} ({why})"
    return None

"""The claims table: each claim of the paper against what a profile measured. Honest either way.

The method in full: docs/methods.md, ``mxfp4.report.claims``."""

from __future__ import annotations

import math
from pathlib import Path

from scipy import stats
from statsmodels.stats.multitest import multipletests

from ..analysis.pathways.spec import MECHANISMS
from ..config.profiles import HEADLINE_MAX_MDE, load_profile
from ..corrections.registry import paper_corrections
from ..io import write_text_atomic
from ..layout import REFERENCE_RECIPE, Layout
from ..stats import (
    ALPHA,
    crossed_cols_needed,
    crossed_differences,
    crossed_mde,
    min_detectable_effect,
    n_needed,
    paired_diff,
    verdict_level,
)
from .aggregate import RL_GAIN_PER_PROBLEM, rl_gain_rows
from .formatting import MISSING, number
from .network_claims import REPLICATES, claim_rows, decide, profile_networks, read_units, stored_units
from .pathway_table import read_rows
from .tables import read_report, read_table

NONINFERIORITY_MARGIN = 0.007  # dense: "BF16 accuracy recovered to within 0.7%"
MOE_REPORTED_GAIN = 0.010  # MoE: "+1.0% above BF16" (tested as superiority, diff > 0)



def is_moe(model: str) -> bool:
    return "moe" in model.lower() or "a3b" in model.lower()


def _two_sided_p(d: dict, shift: float = 0.0) -> float | None:
    """p of H0: diff == shift, two-sided (paired t from the difference's mean, sd and n)."""
    if d.get("sd") is None or d.get("n", 0) < 2 or d.get("diff") is None:
        return None
    if d["sd"] == 0:
        return 1.0 if d["diff"] == shift else 0.0
    t = (d["diff"] - shift) / (d["sd"] / math.sqrt(d["n"]))
    return float(2 * stats.t.sf(abs(t), d["n"] - 1))


def _row(claim, model, test, measure, d, method, direction=+1, shift=0.0, effect_for_n=None) -> dict:
    """A tested row: the two-sided p of diff == shift; ``direction`` the sign the claim predicts for
    diff - shift. The verdict and the interval at its level come after Holm (``build_claims``)."""
    mde = min_detectable_effect(d.get("sd"), d.get("n", 0))
    claimed = effect_for_n if effect_for_n is not None else (
        None if d.get("diff") is None else (d["diff"] - shift) * direction)
    effect = claimed if claimed is not None and claimed > 0 else None  # no n resolves an effect of the wrong sign
    return {"claim": claim, "model": model, "test": test, "measure": measure, "diff": d.get("diff"),
            "ci_low": d.get("ci_low"), "ci_high": d.get("ci_high"), "n": d.get("n", 0), "sd": d.get("sd"),
            "p": _two_sided_p(d, shift), "method": method, "direction": direction, "shift": shift, "mde80": mde,
            "n_needed": n_needed(effect, d.get("sd")), "claimed_effect": claimed}


def _by_seed(cells, model, recipe, metric) -> dict[int, float]:
    return {
        int(c["seed"]): c[metric]
        for c in cells
        if c["model"] == model and c["recipe"] == recipe and c.get(metric) is not None
    }


def _paired_cells(cells, model, a, b, metric, transform=None) -> dict:
    va, vb = _by_seed(cells, model, a, metric), _by_seed(cells, model, b, metric)
    seeds = sorted(set(va) & set(vb))
    xa = [va[s] for s in seeds]
    xb = [vb[s] for s in seeds]
    if transform:
        xa, xb = transform(xa, seeds), transform(xb, seeds)
    return paired_diff(xa, xb)


def direct_rows(pathways: list[dict]) -> list[dict]:
    """Each mechanism claim by its injection rows: harm(+claimed) - harm(+other), paired over units; and
    the energy-controlled form, the same contrast of excess harms over each component's matched control."""
    out = []
    for r in pathways:
        metric = r["metric"]
        if not metric.endswith(("_harm_contrast", "_excess_contrast")) or r["mean"] in ("", None):
            continue
        pathway = metric.removesuffix("_harm_contrast").removesuffix("_excess_contrast")
        controlled = metric.endswith("_excess_contrast")
        _, claim = MECHANISMS[pathway]
        n, k = int(r["n"]), int(r.get("policies") or 1)
        ci_lo, ci_hi, mean = (float(r[k_]) if r[k_] not in ("", None) else None for k_ in ("ci_low", "ci_high", "mean"))
        # the test's replicates: the units (one policy), or the k policies (seeds) when several (a mixed
        # model on k - 1 df): recover the spread of the replicates from the t interval
        reps = k if k >= 2 else n
        sd = None
        if ci_lo is not None and reps >= 2:
            sd = (ci_hi - ci_lo) / 2 / stats.t.ppf(0.975, reps - 1) * math.sqrt(reps)
        d = {"diff": mean, "ci_low": ci_lo, "ci_high": ci_hi, "n": reps, "sd": sd}
        units = "gradient batches" if pathway == "gradient" else "prompts"
        harm = " (harm = token entropy: higher is the harm the paper names)" if pathway == "entropy" else ""
        out.append(
            _row(
                claim,
                f"{r['model']} ({r['checkpoint']})",
                "direct, energy-controlled (pathway matrix)" if controlled else "direct (pathway matrix)",
                f"{'excess ' if controlled else ''}harm {r['injection']} ({pathway}; > 0 as claimed){harm}",
                d,
                f"paired t over {n} {units}, two-sided" if k < 2 else
                f"mixed model over {k} seeds' policies ({n} {units}), t on {k - 1} df, two-sided",
            )
        )
    return out


def indirect_rows(cells: list[dict], model: str) -> list[dict]:
    out = []
    specs = [
        (
            "mxfp4+macro",
            "mxfp4",
            "mean_grad_cosine",
            +1,
            MECHANISMS["gradient"][1],
            "grad cosine: mxfp4+macro minus mxfp4 (macro-block scaling cuts scale bias)",
        ),
        (
            "mxfp4+fallback",
            "mxfp4",
            "mean_rollout_accuracy",
            +1,
            MECHANISMS["rollout"][1],
            "rollout accuracy: mxfp4+fallback minus mxfp4 (outlier fallback restores deadzone entries)",
        ),
        (
            "mxfp4",
            REFERENCE_RECIPE,
            "mean_entropy",
            +1,
            "MXFP4 raises policy entropy (grid noise and the rest together)",
            "policy entropy: mxfp4 minus bf16 (> 0: higher entropy, the harm the paper names)",
        ),
    ]
    for a, b, metric, direction, claim, measure in specs:
        d = _paired_cells(cells, model, a, b, metric)
        if d["n"] == 0:
            continue
        out.append(
            _row(claim, model, "indirect (correction, cells)", measure, d,
                 f"paired t over seeds (n={d['n']}), two-sided", direction)
        )
    target = _by_seed(cells, model, REFERENCE_RECIPE, "mean_entropy")
    for recipe in ("mxfp4+aqn", "mxfp4+aqn-adaptive"):

        def gap(vals, seeds):
            return [abs(v - target[s]) for v, s in zip(vals, seeds)]

        d = _paired_cells(cells, model, recipe, "mxfp4", "mean_entropy", transform=gap)
        if d["n"] == 0:
            continue
        out.append(
            _row("AQN holds the policy entropy nearer the BF16 run's", model, "indirect (correction, cells)",
                 f"abs(entropy - bf16 entropy): {recipe} minus mxfp4 (< 0 as claimed: nearer BF16)", d,
                 f"paired t over seeds (n={d['n']}), two-sided", -1)
        )
    return out


RECOVERY_MEASURES = {  # metric -> what the recovery row compares
    "gsm8k_rl_gain": "RL gain (accuracy after GRPO minus before, strict)",
    "gsm8k_strict_accuracy": "final strict accuracy",
}


ITEM_VALUES = {  # a recovery measure per problem, from items.csv
    "gsm8k_strict_accuracy": lambda r: r["strict"],
    "gsm8k_rl_gain": lambda r: r["strict"] - r["strict_before"],
}


def _paired_problems(items: list[dict], model: str, seed: int, a: str, b: str, metric: str) -> dict:
    """``metric`` of recipe a minus recipe b per held-out problem of one seed (the same lm-eval doc), paired t."""
    value = ITEM_VALUES[metric]
    by: dict[str, dict] = {a: {}, b: {}}
    for r in items:
        if r["model"] == model and r["recipe"] in by and int(r["seed"]) == seed and r.get("strict") is not None \
                and r.get("strict_before") is not None:
            by[r["recipe"]][(r["doc_id"], r["doc_hash"])] = value(r)
    keys = sorted(set(by[a]) & set(by[b]), key=str)
    return paired_diff([by[a][k] for k in keys], [by[b][k] for k in keys])


def crossed_problems(items: list[dict], model: str, a: str, b: str, metric: str) -> dict | None:
    """``metric`` of recipe a minus recipe b per (held-out problem, seed) of every seed both have, on the crossed
    random-effects model (problems x networks, ``stats.crossed_mean``); None with fewer than two seeds or problems.

    Args:
        items: ``items.csv`` rows (one per cell and held-out problem).
        model: the model whose cells are compared.
        a: the recipe whose value comes first in the difference.
        b: the recipe subtracted.
        metric: a key of ``ITEM_VALUES`` (final strict accuracy or RL gain).
    """
    value = ITEM_VALUES[metric]
    by: dict = {}
    for r in items:
        if r["model"] == model and r["recipe"] in (a, b) and r.get("strict") is not None \
                and r.get("strict_before") is not None:
            by.setdefault((r["doc_id"], r["doc_hash"], int(r["seed"])), {})[r["recipe"]] = value(r)
    est = crossed_differences({((k[0], k[1]), k[2]): v[a] - v[b] for k, v in by.items() if a in v and b in v})
    return est if est is not None and est.get("se") else None


def recovery_null(model: str) -> tuple[float, float, str]:
    """(the paper's effect, the null value a recovery difference is tested against, the test's name) of a model:
    superiority by the MoE's reported gain against 0, or non-inferiority within the dense margin."""
    if is_moe(model):
        return MOE_REPORTED_GAIN, 0.0, "superiority"
    return NONINFERIORITY_MARGIN, -NONINFERIORITY_MARGIN, "non-inferiority"


def crossed_recovery_test(crossed: dict, model: str) -> dict:
    """The recovery test of a ``crossed_problems`` estimate: its two-sided p against the model's null value
    (``recovery_null``), the design's minimum detectable effect (``mde80``) and the networks the paper's effect
    needs at its number of problems (``networks_needed``; None where no number suffices)."""
    effect, null, _ = recovery_null(model)
    return {"p": float(2 * stats.t.sf(abs(crossed["mean"] - null) / crossed["se"], crossed["df"])),
            "mde80": crossed_mde(crossed["components"], crossed["rows"], crossed["cols"]),
            "networks_needed": crossed_cols_needed(effect, crossed["components"], crossed["rows"])}


def recovery_row(cells: list[dict], model: str, problems: int | None = None,
                 metric: str = "gsm8k_strict_accuracy", items: list[dict] = (), replicates: str = "networks"
                 ) -> dict | None:
    """The recovery claim of one model on ``metric`` (``RECOVERY_MEASURES``: the RL gain or the final
    accuracy), two-sided so that it can be contradicted: superiority for the MoE model (diff against 0),
    non-inferiority for the dense one (diff against -margin; the paper's accuracy margin, applied to the
    RL gain too). With the per-problem ``items`` of two or more seeds: the (problem, seed) differences on the
    crossed random-effects model (problems x networks, the seed's network the replicate), with the design's
    minimum detectable effect and the networks the paper's margin needs; with one seed, paired over its held-out
    problems; else paired over seeds. ``replicates`` names what the seeds are (``seed_replicates``)."""
    d = _paired_cells(cells, model, "mxfp4+all", REFERENCE_RECIPE, metric)
    if d["n"] == 0:
        return None
    how = f"paired t over seeds (n={d['n']})"
    paper_effect, shift, _ = recovery_null(model)
    design = None
    crossed = crossed_problems(items, model, "mxfp4+all", REFERENCE_RECIPE, metric) if items else None
    if crossed is not None:
        test = crossed_recovery_test(crossed, model)
        p, mde, needed = test["p"], test["mde80"], test["networks_needed"]
        design = {"mde": mde, "networks_needed": needed, "problems": crossed["rows"], "networks": crossed["cols"]}
        how = (f"{crossed['interval']} over {crossed['rows']} held-out problems x {crossed['cols']} {replicates}; "
               f"MDE80 {mde:.3f}; the paper's {paper_effect:.1%} needs "
               + (f"{needed} {replicates} at {crossed['rows']} problems" if needed else
                  f"more problems than {crossed['rows']} (no number of {replicates} suffices)"))
    elif d["n"] == 1 and items:
        seed = next(iter(_by_seed(cells, model, "mxfp4+all", metric)))
        per_problem = _paired_problems(items, model, seed, "mxfp4+all", REFERENCE_RECIPE, metric)
        if per_problem["n"] >= 2:
            d, how = per_problem, f"paired t over {per_problem['n']} held-out problems of one seed"
    per = f" of {problems} evaluated a seed" if problems else ""
    what = RECOVERY_MEASURES[metric]

    def in_problems(margin):
        return f"{margin * problems:.1f} problems{per}" if problems else "problems per seed unknown"

    if is_moe(model):
        row = _row(
            f"Combined corrections exceed BF16 GSM8K accuracy (paper: +{MOE_REPORTED_GAIN:.1%})",
            model,
            "recovery: superiority",
            f"{what}: mxfp4+all minus bf16 (paper's +1.0 point = {in_problems(MOE_REPORTED_GAIN)})",
            d,
            f"{how}, two-sided, H0: diff = 0",
            effect_for_n=MOE_REPORTED_GAIN,
        )
    else:
        row = _row(
            f"Combined corrections recover BF16 GSM8K accuracy (within {NONINFERIORITY_MARGIN:.1%})",
            model,
            "recovery: non-inferiority",
            f"{what}: mxfp4+all minus bf16 (margin from the paper's 'within 0.7%' = "
            f"{in_problems(NONINFERIORITY_MARGIN)})",
            d,
            f"{how}, two-sided, H0: diff = -{NONINFERIORITY_MARGIN:.3f}",
            shift=-NONINFERIORITY_MARGIN,
            effect_for_n=(d["diff"] + NONINFERIORITY_MARGIN) if d["diff"] is not None else None,
        )
    if crossed is not None:
        row.update(diff=crossed["mean"], ci_low=crossed["ci_low"], ci_high=crossed["ci_high"], p=p, mde80=mde,
                   sd=None, se=crossed["se"], df=crossed["df"], n=crossed["cols"],
                   n_needed=design["networks_needed"], design=design)
        if mde > HEADLINE_MAX_MDE:
            row["test"] += (f" (this design detects {mde:.1%} at 80% power, more than {HEADLINE_MAX_MDE:.0%}: a "
                            "design like it belongs in the exploratory rows)")
    return row


def construction_rows(proofs: dict, corrections: list[dict]) -> list[dict]:
    rows = [
        {
            "claim": "The three-way split is exact: MX(x) - x = e_scale + e_dead + e_grid",
            "model": "all formats",
            "test": "numerical check",
            "measure": "max relative identity residual (float64)",
            "diff": proofs["max_identity_residual_rel"],
            "ci_low": None,
            "ci_high": None,
            "n": len(proofs["cases"]),
            "p": None,
            "method": f"max over {len(proofs['cases'])} cases (formats x distributions x rules)",
            "mde80": None,
            "n_needed": None,
            "verdict": "held (numerical check)" if proofs["passed"] else "contradicted",
        }
    ]
    for target, key, label in ((cls.name, *cls.lowers) for cls in paper_corrections().values() if cls.lowers):
        for r in corrections:
            if r["correction"].startswith(target) and "weights" in r["source"]:
                before, after = r[f"{key}_before"], r[f"{key}_after"]
                rows.append(
                    {
                        "claim": f"{target} reduces the {label} it targets",
                        "model": r["source"],
                        "test": "by construction",
                        "measure": f"{label}: after minus before ({r['correction']})",
                        "diff": after - before,
                        "ci_low": None,
                        "ci_high": None,
                        "n": 1,
                        "p": None,
                        "method": "the correction is built to lower it (never worse than MXFP4)",
                        "mde80": None,
                        "n_needed": None,
                        "verdict": "by construction" if after <= before else "contradicted (a bug)",
                    }
                )
    return rows


def undecided(r: dict) -> str | None:
    """A tested row's verdict where it reached none: not measured, no test, or a Holm-adjusted p of at least
    0.05 (not shown); None where the adjusted p decides it."""
    if r["diff"] is None:
        return "not measured"
    if r["p"] is None:
        return "inconclusive (too few units for a test)"
    if r["p_holm"] >= ALPHA:
        return "not shown"
    return None


def _verdict(r: dict) -> str:
    """held / contradicted: the Holm-adjusted two-sided p < 0.05, with the estimate on the claimed /
    the opposite side of its null value; otherwise not shown."""
    return undecided(r) or ("held" if (r["diff"] - r["shift"]) * r["direction"] > 0 else "contradicted")


def interval_at(r: dict, level: float) -> tuple[float | None, float | None]:
    """The t interval of a row's difference at ``level``: from its standard error and df where it carries them
    (a crossed problems x networks row), else from its paired sd over n. A row with neither has no test, so its
    stored interval is the 95% one it was given with."""
    if r["diff"] is None:
        return r["ci_low"], r["ci_high"]
    if r.get("se") is not None and r.get("df"):
        half = stats.t.ppf(0.5 + level / 2, r["df"]) * r["se"]
    elif r.get("sd") is not None and r["n"] >= 2:
        half = stats.t.ppf(0.5 + level / 2, r["n"] - 1) * r["sd"] / math.sqrt(r["n"]) if r["sd"] > 0 else 0.0
    else:
        if level != 0.95:
            raise ValueError(f"row {r['claim']!r} has no standard error to put its interval at {level:.4f}")
        return r["ci_low"], r["ci_high"]
    return r["diff"] - half, r["diff"] + half


PRECONDITION_GAIN = 0.05  # the miniature trains: BF16 GRPO gains at least +5 points of held-out accuracy


def precondition_rows(items: list[dict]) -> list[dict]:
    """Per model: does BF16 GRPO train? Its RL gain paired by problem and seed (problems and seeds crossed,
    ``aggregate.rl_gain_rows``), met when the 95% interval excludes 0 and the estimate reaches
    ``PRECONDITION_GAIN``. A check of the miniature, not a claim of the paper: outside the Holm family."""
    out = []
    gains = [r for r in rl_gain_rows([i for i in items if i["recipe"] == REFERENCE_RECIPE])
             if r["metric"] == RL_GAIN_PER_PROBLEM]  # the overall gain (not the per-type rows and accuracies)
    for r in gains:
        excludes_0 = r["ci_low"] is not None and r["ci_low"] > 0
        met = excludes_0 and r["mean"] >= PRECONDITION_GAIN
        out.append({
            "claim": f"BF16 GRPO improves held-out accuracy by at least +{PRECONDITION_GAIN:.0%} "
                     "(the miniature trains)",
            "model": r["model"], "test": "precondition (not a claim of the paper; outside Holm)",
            "measure": "RL gain of bf16: strict accuracy after GRPO minus before, same problems",
            "diff": r["mean"], "ci_low": r["ci_low"], "ci_high": r["ci_high"], "n": r["n"], "p": r["p"],
            "p_holm": r["p"], "level": 0.95, "method": r["method"], "mde80": None, "n_needed": None,
            "verdict": "met" if met else (f"not met (interval {'excludes' if excludes_0 else 'includes'} 0, "
                                          f"estimate {r['mean']:+.3f})"),
        })
    return out


STANDARD_RECIPE = "mxfp4+rht-sr"  # the field's MXFP4 training recipe: Hadamard rotation + stochastic rounding


def family_label(exploratory: bool) -> str:
    return "exploratory (out of the primary family before the run: underpowered at the budget)" if exploratory \
        else "primary"


def outcome_row(r: dict) -> dict:
    """A claims-table row from a three-outcome claim row (``network_claims.claim_rows``): the verdict, the deciding
    contrast with its interval at the verdict's level, n and the scope (about this model or about the class)."""
    noun = "units" if r.get("replicate") == "units" else "networks"
    p = r.get("p_adjusted") or {}
    outcome = r["verdict"].split(" (")[0]
    return {
        "claim": r["claim"], "model": r["model"], "family": r["family"],
        "test": (f"{r['family']}, {r['scope']}: three outcomes over {r['networks']} {noun} (held / contradicted / no "
                 f"dominance within {r['margin']:g}), decided by {r['decided_by'] or MISSING}"),
        "measure": r["measure"], "diff": r["diff"], "ci_low": r["ci_low"], "ci_high": r["ci_high"],
        "level": r.get("level", 0.95), "n": r["networks"], "p": None, "p_holm": p.get(outcome),
        "p_outcomes": p, "method": r["method"], "mde80": None, "n_needed": None, "verdict": r["verdict"],
        "scope": r["scope"], "premise": r.get("premise"),
    }


def unit_claim_rows(units: list[dict], design, network_of=None) -> list[dict]:
    """The mechanism and recovery claims decided on the run's per-unit files with the replicate the design names
    (``network_claims.claim_rows``), undecided: ``primary_family`` and ``build_claims`` decide them with the rest
    of their family."""
    if design is None or not units:
        return []
    return claim_rows(units, design, network_of=network_of)


def standard_recipe_rows(cells: list[dict], model: str) -> list[dict]:
    """The paper's corrections (mxfp4+all) against the field's standard recipe (``STANDARD_RECIPE``), on
    final accuracy and RL gain, paired by seed, two-sided: a comparison, not a claim of the paper."""
    out = []
    for metric, what in RECOVERY_MEASURES.items():
        d = _paired_cells(cells, model, "mxfp4+all", STANDARD_RECIPE, metric)
        if d["n"]:
            out.append(_row("The paper's corrections against the field's standard recipe", model,
                            "comparison (cells)", f"{what}: mxfp4+all minus {STANDARD_RECIPE} (> 0: the paper's "
                            "corrections do better)", d, f"paired t over seeds (n={d['n']}), two-sided"))
    return out


def decide_family(rows: list[dict], outcome_rows: list[dict] = (), family: str = "primary") -> list[dict]:
    """Holm over one family: ``rows``' p values and the three outcome hypotheses of each of ``outcome_rows``
    (``unit_claim_rows``) together; then each row's verdict with its interval at the verdict's level. Returns the
    family's rows, the outcome rows first, as table rows (``outcome_row``)."""
    for r in outcome_rows:
        r["family"] = family
    ps = [r["p"] for r in rows if r["p"] is not None]
    adjusted = decide(list(outcome_rows), also={family: ps})[family] if outcome_rows else holm(ps)
    settle(rows, adjusted)
    return [outcome_row(r) for r in outcome_rows] + list(rows)


def holm(ps: list[float]) -> list[float]:
    """Holm-adjusted p values of one family (``statsmodels``)."""
    return [float(p) for p in multipletests(ps, alpha=ALPHA, method="holm")[1]] if ps else []


def settle(rows: list[dict], adjusted: list[float], verdict=_verdict) -> None:
    """Each row with a p its adjusted p (``adjusted``, in the rows' order), its interval at the level its verdict
    uses, and its verdict (``verdict`` of the row)."""
    adjusted = iter(adjusted)
    for r in rows:
        r["p_holm"] = float(next(adjusted)) if r["p"] is not None else None
        r["level"] = verdict_level(r["p"], r["p_holm"])
        if r["level"] != 0.95:
            r["ci_low"], r["ci_high"] = interval_at(r, r["level"])
        r["verdict"] = verdict(r)


def headline_scope(replicates: str) -> str:
    """What a headline over seeds is about: one named model where every seed starts from it, else the class."""
    return REPLICATES["units"] if replicates == "seeds of one network" else REPLICATES["networks"]


def build_claims(cells: list[dict], proofs: dict, corrections: list[dict], pathways: list[dict],
                 problems: int | None = None, items: list[dict] = (), design=None,
                 replicates: str = "networks", units: list[dict] = (), network_of=None) -> list[dict]:
    """Every row of the claims table. The primary family (Holm over it alone): each mechanism and recovery claim
    decided three ways on the run's per-unit files (``units``) with the replicate ``design`` names (the profile's
    ``pathways.claims``), and the headline recovery on final accuracy, per model. Every other tested row is
    secondary (the claims the design made exploratory first, then each claim beyond its own control), Holm over
    its own family. ``replicates``: what the cells' seeds are (``seed_replicates``)."""
    outcome = unit_claim_rows(list(units), design, network_of)
    primary = primary_family(cells, pathways, problems, design, items, replicates, outcome)
    later = [r for r in outcome if r["family"] != "primary"]
    for r in later:
        if r["family"] == "exploratory":
            r["claim"] = f"{r['claim']} ({family_label(True)})"
    secondary = direct_rows(pathways)
    for model in sorted({c["model"] for c in cells}):
        headline = recovery_row(cells, model, problems, "gsm8k_strict_accuracy", items, replicates)
        if headline and design is not None and "headline" in design.exploratory:  # out of the family by design
            headline["test"] = f"{family_label(True)}: {headline['test']}"
            secondary.append(headline)
        secondary += indirect_rows(cells, model)
        rec = recovery_row(cells, model, problems, "gsm8k_rl_gain", items, replicates)
        secondary += [rec] if rec else []
        secondary += standard_recipe_rows(cells, model)
    secondary = decide_family(secondary, later, "secondary")
    for r in secondary:
        r["family"] = "secondary"
    return primary + construction_rows(proofs, corrections) + precondition_rows(list(items)) + secondary


def primary_family(cells: list[dict], pathways: list[dict], problems: int | None = None, design=None,
                   items: list[dict] = (), replicates: str = "networks", outcome: list[dict] = ()) -> list[dict]:
    """The primary family alone, decided (Holm over it): per model each mechanism and recovery claim's
    three-outcome row (``outcome``: ``unit_claim_rows``, those of the primary family taken) and the headline
    recovery on final accuracy (``items``: the per-problem evaluations, which pair it over problems in a one-seed
    profile)."""
    rows = []
    if design is None or "headline" not in design.exploratory:
        for model in sorted({c["model"] for c in cells}):
            rec = recovery_row(cells, model, problems, "gsm8k_strict_accuracy", items, replicates)
            if rec:
                rec["scope"] = headline_scope(replicates)
                rows.append(rec)
    rows = decide_family(rows, [r for r in outcome if r["family"] == "primary"], "primary")
    for r in rows:
        r["family"] = "primary"
    return rows


def headline_summary(layouts: list[Layout]) -> str:
    """The headline recovery after RL of each profile of ``layouts`` with RL cells, from its stored cells and
    per-problem items, one line per model: its verdict, effect and interval at the verdict's level, n and scope
    (its own primary family's Holm, with the mechanism claims that the summary's first table shows)."""
    cols, lines = [], {}
    for layout in layouts:
        name = layout.profile
        cells_csv = layout.stored(layout.table("cells"))
        if not Path(cells_csv).is_file():
            continue
        with_units = stored_claim_inputs(layout)
        rows = primary_family(read_table(cells_csv, "cells"), [], outcome=with_units,
                              **decided_with(name, cells_csv))
        heads = [r for r in rows if r.get("test", "").startswith("recovery")]
        if not heads:
            continue
        cols.append(name)
        for r in heads:
            ci = "" if r["ci_low"] is None else f" [{r['ci_low']:+.3g}, {r['ci_high']:+.3g}] ({100 * r['level']:.2f}%)"
            lines.setdefault((r["claim"], r["model"], r["scope"]), {})[name] = (
                f"**{r['verdict']}** {number(r['diff'])}{ci} (n {r['n']}, p_Holm {number(r.get('p_holm'), '{:.2g}')})")
    out = ["| claim | model | scope | " + " | ".join(f"`{c}`" for c in cols) + " |",
           "| --- | --- | --- | " + " | ".join("---" for _ in cols) + " |"]
    for (claim, model, scope), by in lines.items():
        out.append(f"| {claim} | {model} | {scope} | " + " | ".join(by.get(c, "not in this profile") for c in cols)
                   + " |")
    return "\n".join(out) + "\n"


def stored_claim_inputs(layout: Layout) -> list[dict]:
    """The stored per-unit files' three-outcome rows of a profile (none where it stores none), undecided."""
    files = stored_units(layout)
    profile = load_profile(layout.profile)
    design = profile.pathways.claims if profile.pathways is not None else None
    if not files or design is None:
        return []
    units = read_units(files)
    return unit_claim_rows(units, design, profile_networks(profile, units))


def _p_text(r: dict) -> str:
    """A row's p and its Holm-adjusted p; a three-outcome row's adjusted p of each outcome."""
    if r.get("p_outcomes"):
        return "Holm: " + " / ".join(f"{k} {number(v, '{:.3g}')}" for k, v in r["p_outcomes"].items())
    return MISSING if r.get("p") is None else f"{r['p']:.3g} ({r['p_holm']:.3g})"


def primary_table(rows: list[dict]) -> list[str]:
    """The primary family, one line per claim and model: verdict, effect, interval at the verdict's level,
    n, MDE80 and the adjusted p."""
    lines = ["| claim | model | verdict | effect | interval (level) | n | MDE80 | p (Holm) | test |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ci = MISSING if r["ci_low"] is None else f"[{r['ci_low']:+.3g}, {r['ci_high']:+.3g}] ({100 * r['level']:.2f}%)"
        p = _p_text(r)
        lines.append(f"| {r['claim']} | {r['model']} | **{r['verdict']}** | {number(r['diff'])} | {ci} | {r['n']} | "
                     f"{number(r.get('mde80'), '{:.3g}')} | {p} | {r['test']}: {r['measure']} |")
    return lines


def removal_table(corrections: list[dict]) -> list[str]:
    """What each correction removes from each error component on the measured operands (``corrections-table``:
    the standard distributions and the models' weights): the energy of scale bias, deadzone and grid noise before
    and after, as the share removed. A recovery of a pathway is evidence for its mechanism only where the
    correction removes the component the mechanism names."""
    if not corrections:
        return []
    out = ["## What each correction removes", "",
           "Energy of each component before -> after the correction on each operand (its change; the total "
           "error's last), from `mxfp4 corrections-table`: a recovery is evidence for the component its claim names "
           "only where the correction removes that component.", "",
           "| correction | operand | scale bias | deadzone | grid noise | total |",
           "| --- | --- | --- | --- | --- | --- |"]
    for r in corrections:
        cells = []
        for c in ("scale", "dead", "grid", "total"):
            before, after = r.get(f"energy_{c}_before"), r.get(f"energy_{c}_after")
            cells.append(MISSING if before is None or after is None else
                         f"{before:.3g} -> {after:.3g} ({(after / before - 1) if before else 0:+.0%})")
        out.append(f"| {r['correction']} | {r['source']} | " + " | ".join(cells) + " |")
    return out + [""]


def markdown(rows: list[dict], profile: str, corrections: list[dict] = ()) -> str:
    primary = [r for r in rows if r.get("family") == "primary"]
    lines = [
        f"# Claims of arXiv 2605.20402 against the `{profile}` profile",
        "",
        "Generated by `mxfp4 claims`.",
        "",
        "## Primary family",
        "",
        "Fixed in the profile before the run: per model, each mechanism claim decided three ways on the per-unit",
        "files at the warm start (the claimed component's harm against each other component's on the same units;",
        "held: it harms more than every rival; contradicted: a rival harms significantly more; no dominance: within",
        "the profile's margin of a rival; else not shown; premise not met: MXFP4's own harm on the pathway is not",
        "several margins large), with the replicate the design names (networks: about the class; units: about this",
        "model); each recovery claim the same way (the correction's arm against plain MXFP4 and each other",
        "correction's arm); and the headline recovery on final accuracy. Holm over this family's hypotheses (three",
        "outcomes a claim); each interval is at the level its verdict uses. Effect = the contrast that decided the",
        "verdict, or the accuracy difference (headline rows); MDE80 = the smallest true effect a two-sided 0.05 test",
        "of this n detects with 80% power. Each claim beyond its own sign-flip control is a secondary row.",
        "",
        *(primary_table(primary) if primary else ["No primary test was measured in this run."]),
        "",
        *removal_table(list(corrections)),
        "## Secondary rows",
        "",
        "Mechanism claims are tested directly by the pathway matrix (the claimed component injected alone against",
        "each other one, paired over the same batches or prompts) and indirectly by their corrections (cells paired",
        "by seed). p values are two-sided; Holm's correction runs over the secondary rows, a family of their own;",
        "'held' / 'contradicted' = Holm-adjusted p < 0.05 with the estimate on the claimed / the opposite",
        "side, and each interval is at the level that verdict uses (1 - 0.05 p / p_Holm). MDE80 = the smallest true",
        "effect this design detects with 80% power; 'n needed' = units (batches, prompts or seeds) that would",
        "resolve the observed effect at the measured paired spread (for the MoE superiority row: the paper's",
        "+1.0%; '—' where the estimate has the wrong sign, so that no n resolves it).",
        "Rows true by construction say so.",
        "",
        "| claim | model | test | measure | value | interval (level) | n | method | p (Holm) | MDE80 | n needed "
        "| verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in (r for r in rows if r.get("family") != "primary"):
        level = f" ({100 * r.get('level', 0.95):.2f}%)"
        ci = MISSING if r["ci_low"] is None else f"[{r['ci_low']:+.3g}, {r['ci_high']:+.3g}]{level}"
        p = _p_text(r)
        need = MISSING if r.get("n_needed") is None or r["verdict"] == "held" else str(r["n_needed"])
        lines.append(
            f"| {r['claim']} | {r['model']} | {r['test']} | {r['measure']} | {number(r['diff'])} | {ci} | {r['n']} | "
            f"{r['method']} | {p} | {number(r.get('mde80'), '{:.3g}')} | {need} | {r['verdict']} |"
        )
    return "\n".join(lines) + "\n"


def read_pathways(path) -> list[dict]:

    return read_rows(path) if path and Path(path).exists() else []


def eval_problems(profile) -> int | None:
    """GSM8K problems a cell of the (loaded) profile evaluates (per seed): the eval limit, else the embedded
    set's size, else GSM8K test's 1319."""
    return profile.eval.limit or (profile.data.n_eval if profile.data.source == "embedded" else 1319)


def seed_replicates(profile) -> str:
    """What a profile's seeds replicate: ``networks`` where each seed trains its own warm start (seed i from warm
    start i), else ``seeds of one network`` (a hub checkpoint, or fewer warm starts than seeds): the RL outcome's
    replicate, its claim about that network."""
    return "networks" if profile.warm_starts >= len(profile.seeds) else "seeds of one network"


def decided_with(profile: str, cells_csv) -> dict:
    """What a profile's claim tests take beside its tables, as ``build_claims`` and ``primary_family`` name them:
    the problems a cell evaluates, the per-problem evaluations (``items.csv``, written by aggregate beside
    ``cells.csv``), the design the profile fixes (``pathways.claims``) and what its seeds replicate."""
    loaded = load_profile(profile)
    items_csv = Path(cells_csv).with_name("items.csv")
    return {"problems": eval_problems(loaded),
            "items": read_table(items_csv, "items") if items_csv.is_file() else [],
            "design": loaded.pathways.claims if loaded.pathways is not None else None,
            "replicates": seed_replicates(loaded)}


def run_claims(cells_csv, proofs_json, corrections_json, out_md, profile: str, pathways_csv=None,
               unit_files=()) -> list[dict]:
    """The claims table of a profile; the per-problem evaluations (``items.csv``, written by aggregate
    beside ``cells.csv``) give the precondition rows, the per-unit files (``unit_files``) the mechanism and
    recovery claims."""
    rows = build_claims(
        read_table(cells_csv, "cells"),
        read_report(proofs_json, "proofs"),
        read_report(corrections_json, "corrections"),
        read_pathways(pathways_csv),
        **decided_with(profile, cells_csv),
        units=read_units(unit_files) if unit_files else [],
        network_of=profile_networks(load_profile(profile)),
    )
    settings = load_profile(profile).pathways
    if settings is not None and settings.claims is not None and not any(r.get("family") == "primary" for r in rows):
        raise ValueError(f"claims: profile {profile!r} fixes a primary family (pathways.claims), and none of its tests "
                         f"could be measured from {pathways_csv or 'no pathways table'} and {len(unit_files or ())} "
                         "per-unit file(s); accepted: the run's pathways.csv and the per-unit files beside it")
    write_text_atomic(out_md, markdown(rows, profile, read_report(corrections_json, "corrections")))
    return rows

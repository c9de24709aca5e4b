"""Compare a recipe's cells against reference recipes, answering first the question a researcher asks:
does the recipe beat the recipe it modifies (its ``base``), and does it reach BF16?

- **Primary contrasts**, chosen by the recipe: against its base and against ``bf16``, per model, on
  GSM8K strict accuracy per seed (paired t over seeds; Welch where the seeds differ), per problem
  (McNemar's exact test over the (seed, problem) pairs both answered) and on the RL gain where the
  cells record it.
- **Secondary rows**: every compared metric against every reference recipe; the accuracy before RL also per
  problem. A metric with one value for every seed on each side (before RL, from one shared warm start) is
  not tested per seed: its seeds are no replicates, and its per-problem row tests it.

The method in full: docs/methods.md, ``mxfp4.report.compare``."""

from __future__ import annotations

import math
from pathlib import Path

from statsmodels.stats.multitest import multipletests

from ..config.profiles import config_hash, load_profile, setting_hash
from ..config.recipes import Recipe, recipe_base
from ..io import write_text_atomic
from ..layout import REFERENCE_RECIPE, TABLES, Layout
from ..stats import (
    ALPHA,
    HIGHER_IS_BETTER,
    POWER,
    crossed_cols_needed,
    crossed_differences,
    crossed_mde,
    mcnemar_diff,
    mcnemar_min_detectable_effect,
    mcnemar_pairs_needed,
    min_detectable_effect,
    n_needed,
    paired_diff,
    verdict,
    verdict_level,
    welch_diff,
)
from .aggregate import CELL_METRICS, MACHINE_COLUMNS, WEIGHT_KEYS, read_cells, read_items, summarize
from .formatting import MISSING, formatter, p_value
from .tables import read_report, read_table

PRIMARY_SHARE = 0.8  # of ALPHA, for the primary contrasts; the secondary rows get the rest
ADJUSTMENTS = {"holm": "Holm (family-wise error rate)", "fdr_bh": "Benjamini-Hochberg (false discovery rate)"}
PAPER_EFFECTS = (0.007, 0.010)  # the paper's accuracy effects: "within 0.7%" (dense), "+1.0%" (MoE)
PER_PROBLEM = "gsm8k_strict_accuracy (per problem)"
# the accuracies also tested problem by problem, and the items.csv column that holds each
PER_PROBLEM_KEYS = {"gsm8k_strict_accuracy": (PER_PROBLEM, "strict"),
                    "gsm8k_strict_accuracy_before": ("gsm8k_strict_accuracy_before (per problem)", "strict_before")}
# the method of a per-seed row whose seeds are no replicates (one value for every seed on each side)
SAME_EVERY_SEED = ("the same value for every seed on each side (a measurement no seed changes): untested per seed; "
                   "tested per problem")
PRIMARY_METRICS = ["gsm8k_strict_accuracy", PER_PROBLEM, "gsm8k_rl_gain"]
COMPARED = ["gsm8k_strict_accuracy", "gsm8k_flexible_accuracy", "gsm8k_rl_gain", "gsm8k_strict_accuracy_before",
            "gsm8k_strict_accuracy_unquantized", "mean_rollout_accuracy", "mean_entropy", "mean_grad_cosine",
            "mean_grad_rel_norm_error", "step_time_vs_bf16"]  # seconds across two runs (machines, loads) never
STAGES = [  # the accuracies a cell records, in the order a reader follows them
    ("gsm8k_strict_accuracy_before", "before RL"), ("gsm8k_strict_accuracy", "after RL"),
    ("gsm8k_rl_gain", "RL gain"), ("gsm8k_strict_accuracy_unquantized", "after RL, unquantized")]
TIMINGS = {"mean_step_time", "step_time_vs_bf16"}  # shown with a 95% interval, never judged
RECORDED_ONLY_BY_SOME = {"gsm8k_rl_gain", "gsm8k_strict_accuracy_before", "gsm8k_strict_accuracy_unquantized",
                         *TIMINGS}
HIGHER_IS_BETTER = {**HIGHER_IS_BETTER, "gsm8k_rl_gain": True, "step_time_vs_bf16": False}


def with_time_ratio(cells: list[dict]) -> list[dict]:
    """Each cell with ``step_time_vs_bf16``: its mean step time over the bf16 cell's of the same run,
    model and seed (None where that run has no such bf16 cell)."""
    bf16 = {(c["model"], c["seed"]): c.get("mean_step_time") for c in cells if c["recipe"] == REFERENCE_RECIPE}
    out = []
    for c in cells:
        ref, t = bf16.get((c["model"], c["seed"])), c.get("mean_step_time")
        out.append({**c, "step_time_vs_bf16": t / ref if t is not None and ref else None})
    return out


def _mean(values) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def difference(mine: list[dict], theirs: list[dict], metric: str, level: float = 0.95) -> dict:
    """Paired by seed when both sides have the same seeds, else Welch; says which in ``method``."""
    a = {int(r["seed"]): r.get(metric) for r in mine}
    b = {int(r["seed"]): r.get(metric) for r in theirs}
    means = {"mean_new": _mean(a.values()), "mean_ref": _mean(b.values())}
    values = [*a.values(), *b.values()]
    if len(a) >= 2 and None not in values and all(len(set(side.values())) == 1 for side in (a, b)):
        # one value for every seed on each side: a measurement no seed changes (the shared warm start,
        # evaluated greedily), so the seeds are no replicates of it and a t test would read their
        # zero spread as certainty; the per-problem row tests it
        return {"diff": means["mean_new"] - means["mean_ref"], "ci_low": None, "ci_high": None, "n_a": len(a),
                "n_b": len(b), "p": None, "sd": None, "unit": "seeds", **means, "method": SAME_EVERY_SEED}
    if set(a) == set(b) and len(a) >= 2:
        seeds = sorted(a)
        d = paired_diff([a[s] for s in seeds], [b[s] for s in seeds], level)
        return {"diff": d["diff"], "ci_low": d["ci_low"], "ci_high": d["ci_high"], "n_a": d["n"], "n_b": d["n"],
                "p": d["p"], "sd": d["sd"], "unit": "seeds", "method": "paired by seed (t)", **means}
    d = welch_diff(list(a.values()), list(b.values()), level)
    sd = None if d["sd_a"] is None else math.hypot(d["sd_a"], d["sd_b"])  # of a difference of one seed a side
    return {**{k: d[k] for k in ("diff", "ci_low", "ci_high", "n_a", "n_b", "p")}, "sd": sd, "unit": "seeds",
            "method": "Welch (seeds differ)", **means}


def _item_pairs(mine: list[dict], theirs: list[dict], key: str) -> list[tuple[tuple, float, float]]:
    def key_of(r):
        return int(r["seed"]), int(r["doc_id"]), r["doc_hash"]

    theirs_by = {key_of(r): r.get(key) for r in theirs}
    return [(key_of(r), r.get(key), theirs_by[key_of(r)]) for r in mine if key_of(r) in theirs_by]


def item_difference(mine: list[dict], theirs: list[dict], key: str = "strict", level: float = 0.95) -> dict | None:
    """Problem by problem: the (seed, problem) pairs both sides answered (lm-eval's doc hash must match). With two
    or more seeds that differ, the differences on the crossed random-effects model (problems x seeds, each seed's
    network the replicate: ``mxfp4.stats.crossed_mean``); where every seed gave every problem the same value on
    both sides (one warm start's evaluation before RL, repeated per seed), that one measurement is counted once;
    with one seed, McNemar's exact test on the discordant problems (``mxfp4.stats.mcnemar_diff``). None when no
    pair is shared."""
    raw = _item_pairs(mine, theirs, key)
    for side, values in (("new", [(k, a) for k, a, _ in raw]), ("baseline", [(k, b) for k, _, b in raw])):
        empty = [k for k, v in values if v is None]
        if empty and len(empty) < len(values):  # a column measured for some problems only: a partial file
            raise ValueError(f"the {side} items hold no {key} for seed {empty[0][0]}, problem {empty[0][1]} while "
                             f"{len(values) - len(empty)} of {len(values)} problems have one; accepted: a complete "
                             "items.csv (rerun the cells, or restore the stored one)")
    pairs = [(k, a, b) for k, a, b in raw if a is not None and b is not None]
    if not pairs:
        return None
    seeds = sorted({k[0] for k, _, _ in pairs})
    by_problem: dict = {}
    for k, a, b in pairs:
        by_problem.setdefault(k[1:], {})[k[0]] = (a, b)
    repeated = len(seeds) > 1 and all(len(set(v.values())) == 1 for v in by_problem.values())
    if repeated:  # one measurement per problem, copied to every seed: its first seed's copy
        pairs = [(k, a, b) for k, a, b in pairs if k[0] == seeds[0]]
        seeds = seeds[:1]
    means = {"mean_new": _mean(a for _, a, _ in pairs), "mean_ref": _mean(b for _, _, b in pairs)}
    d = crossed_differences({(p, s): a - b for p, v in by_problem.items() for s, (a, b) in v.items()}, level) \
        if len(seeds) > 1 else None
    if d is not None and d.get("components") is not None:
        return {"diff": d["mean"], "ci_low": d["ci_low"], "ci_high": d["ci_high"], "n_a": d["n"], "n_b": d["n"],
                "p": d["p"], "unit": "(seed, problem) pairs, crossed", "problems_per_seed": d["rows"],
                "seeds": d["cols"], "components": d["components"], **means,
                "method": f"{d['interval']}: problems and seeds (each seed's network) both random"}
    d = mcnemar_diff([(a, b) for _, a, b in pairs], level)
    once = " (the same value for every seed: counted once)" if repeated else ""
    return {"diff": d["diff"], "ci_low": d["ci_low"], "ci_high": d["ci_high"], "n_a": d["n"], "n_b": d["n"],
            "p": d["p"], "discordant_rate": d["discordant_rate"], "unit": "problems of one seed",
            "problems_per_seed": d["n"], **means,
            "method": f"McNemar exact over {d['n']} problems{once}: {d['gained']} gained, {d['lost']} lost"}


def _recorded(rows: list[dict], metric: str) -> bool:
    return any(r.get(metric) is not None for r in rows)


def _contrast(model, recipe, base, metric, part, d, recompute) -> dict:
    return {"model": model, "recipe": recipe, "baseline": base, "metric": metric, "part": part, **d,
            "_recompute": recompute}


def compare_rows(new: list[dict], baselines: list[dict], recipe: str, new_items=(), base_items=(),
                 primary_references: list[str] | None = None, adjust: str = "holm") -> list[dict]:
    """Every contrast of ``recipe`` against each reference recipe in ``baselines``, primary ones first
    (against ``primary_references``: by default ``bf16``), adjusted as one family (``adjust_family``)."""
    if adjust not in ADJUSTMENTS:
        raise ValueError(f"adjust={adjust!r}; accepted: {', '.join(ADJUSTMENTS)}")
    primary_refs = [r for r in (primary_references or [REFERENCE_RECIPE]) if r != recipe]
    rows = []
    for model in sorted({r["model"] for r in new}):
        mine = [r for r in new if r["model"] == model and r["recipe"] == recipe]
        my_items = [r for r in new_items if r["model"] == model and r["recipe"] == recipe]
        references = sorted({r["recipe"] for r in baselines if r["model"] == model}, key=lambda b: (
            b not in primary_refs, primary_refs.index(b) if b in primary_refs else 0, b))
        for base in references:
            theirs = [r for r in baselines if r["model"] == model and r["recipe"] == base]
            their_items = [r for r in base_items if r["model"] == model and r["recipe"] == base]
            is_primary = base in primary_refs
            for metric in COMPARED:
                if metric in RECORDED_ONLY_BY_SOME and not (_recorded(mine, metric) and _recorded(theirs, metric)):
                    continue  # a row only where both sides recorded it (a timing only where both ran)
                part = "primary" if is_primary and metric in PRIMARY_METRICS else "secondary"
                rows.append(_contrast(model, recipe, base, metric, part, difference(mine, theirs, metric),
                                      lambda level, m=mine, t=theirs, k=metric: difference(m, t, k, level)))
                if metric in PER_PROBLEM_KEYS:
                    name, key = PER_PROBLEM_KEYS[metric]
                    d = item_difference(my_items, their_items, key)
                    if d is not None:
                        rows.append(_contrast(
                            model, recipe, base, name, part, d,
                            lambda level, m=my_items, t=their_items, k=key: item_difference(m, t, k, level)))
    adjust_family(rows, adjust)
    return sorted(rows, key=lambda r: r["part"] != "primary")


def _verdict(r: dict) -> str:
    """The row's interval, at the level of its adjusted p, read by ``stats.verdict``."""
    if r["metric"] in TIMINGS:
        return "no verdict (a timing: a measurement of the machine, not a claim)"
    if r["method"] == SAME_EVERY_SEED:
        return "untested per seed (the same value for every seed)"
    if r["p_adj"] is not None and r["p_adj"] >= ALPHA:
        return "no significant difference"
    return verdict(r, HIGHER_IS_BETTER.get(r["metric"].removesuffix(" (per problem)")))


def adjust_family(rows: list[dict], adjust: str = "holm") -> None:
    """Adjust the p values of every judged row in place (one family, ``ALPHA`` split between the
    primary and secondary parts), set each row's verdict, its interval at the level that matches the
    verdict, and for primary rows without a significant difference the MDE and the seeds needed."""
    for part, share in (("primary", PRIMARY_SHARE), ("secondary", 1 - PRIMARY_SHARE)):
        judged = [r for r in rows if r["part"] == part and r["metric"] not in TIMINGS and r.get("p") is not None]
        if judged:
            within = multipletests([r["p"] for r in judged], alpha=ALPHA * share, method=adjust)[1]
            for r, q in zip(judged, within):
                r["p_adj"] = min(1.0, float(q) / share)
                r["level"] = verdict_level(r["p"], r["p_adj"])
                r["lone_alpha"] = ALPHA * share / len(judged)
                r["family_size"] = len(judged)
    for r in rows:
        r.setdefault("p_adj", None)
        r.setdefault("level", 0.95)
        r["ci95_low"], r["ci95_high"] = r["ci_low"], r["ci_high"]  # every row is computed at 95% first
        recompute = r.pop("_recompute")
        if r.get("p") is not None and r["level"] != 0.95:
            again = recompute(r["level"])
            r["ci_low"], r["ci_high"] = again["ci_low"], again["ci_high"]
        r["verdict"] = _verdict(r)
        if r["part"] == "primary" and r["verdict"] == "no significant difference":
            r.update(power_note(r))


def power_note(r: dict) -> dict:
    """The minimum detectable effect at the current n and the seeds needed for the paper's effects
    (80% power, at the level a lone true effect must reach in its part of the family)."""
    alpha = r["lone_alpha"]
    if r["unit"] == "seeds":
        n = min(r["n_a"], r["n_b"])
        mde = min_detectable_effect(r["sd"], n, alpha, POWER)
        needed = [n_needed(e, r["sd"], alpha, POWER) for e in PAPER_EFFECTS]
    elif "components" in r:  # the crossed model: networks needed at this many problems
        mde = crossed_mde(r["components"], r["problems_per_seed"], r["seeds"], alpha, POWER)
        needed = [crossed_cols_needed(e, r["components"], r["problems_per_seed"], alpha, POWER)
                  for e in PAPER_EFFECTS]
    else:
        mde = mcnemar_min_detectable_effect(r["n_a"], r["discordant_rate"], alpha, POWER)
        pairs = [mcnemar_pairs_needed(e, r["discordant_rate"], alpha, POWER) for e in PAPER_EFFECTS]
        needed = [None if p is None else math.ceil(p / r["problems_per_seed"]) for p in pairs]
    return {"mde80": mde, **{f"seeds_for_{e * 100:.1f}pt": k for e, k in zip(PAPER_EFFECTS, needed)}}


_fmt = formatter("{:+.4f}")


def _ci(r) -> str:
    """The interval at the level of the row's adjusted verdict."""
    if r["ci_low"] is None:
        return MISSING
    return f"[{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] ({100 * r['level']:.2f}%)"


def _ci95(r) -> str:
    if r.get("ci95_low") is None:
        return MISSING
    return f"[{r['ci95_low']:+.4f}, {r['ci95_high']:+.4f}]"


def _acc(v) -> str:
    return MISSING if v is None else f"{v:.3f}"


def accuracy_rows(cells: list[dict], recipes: list[str]) -> list[dict]:
    """Per model and recipe (``recipes`` in order): each stage's GSM8K strict accuracy (``STAGES``), its
    mean with a 95% t interval over seeds: what the differences below are differences of."""
    summary = {(r["model"], r["recipe"], r["metric"]): r for r in summarize(cells)}  # summary.csv's rows
    return [{"model": model, "recipe": recipe, "seeds": summary[(model, recipe, "gsm8k_strict_accuracy")]["n"],
             **{key: summary[(model, recipe, key)] for key, _ in STAGES}}
            for model in dict.fromkeys(c["model"] for c in cells if c["recipe"] == recipes[0])
            for recipe in recipes if (model, recipe, "gsm8k_strict_accuracy") in summary]


def accuracy_table(rows: list[dict]) -> list[str]:
    def cell(s):
        if s["mean"] is None:
            return MISSING
        return f"{s['mean']:.3f}" + ("" if s["ci_low"] is None else f" [{s['ci_low']:.3f}, {s['ci_high']:.3f}]")

    lines = ["| model | recipe | seeds | " + " | ".join(label for _, label in STAGES) + " |",
             "|" + " --- |" * (3 + len(STAGES))]
    for r in rows:
        lines.append(f"| {r['model']} | {r['recipe']} | {r['seeds']} | "
                     + " | ".join(cell(r[key]) for key, _ in STAGES) + " |")
    return lines



def setting_check(new: list[dict], baselines: list[dict], allow_difference: bool = False) -> str:
    """One sentence saying that the new cells and the baselines were made with the same profile setting
    and code version (``setting_hash``); a ValueError when they were not, unless ``allow_difference``
    (the sentence then says that differences mix both)."""
    mine = {r.get("setting_hash") for r in new}
    theirs = {r.get("setting_hash") for r in baselines}
    if mine == theirs and None not in mine:
        return f"Same profile setting and code version as the baselines (setting hash {', '.join(sorted(mine))})."
    said = (f"the setting differs from the baselines' (new {', '.join(sorted(map(str, mine)))}, baselines "
            f"{', '.join(sorted(map(str, theirs)))}): a profile value, the data or the code version changed")
    if not allow_difference:
        raise ValueError(f"{said}, so every difference would mix that change with the recipe's. Rerun the "
                         "reference cells here (snakemake compare does when they do not reproduce), or pass "
                         "--allow-setting-difference to report anyway")
    return f"WARNING: {said}, so differences mix both (--allow-setting-difference)."


def check_definitions(cells: list[dict], profile: str, source: str) -> None:
    """Stored cells made under the definitions their recipes have now: where a cell's setting is the profile's
    now (``setting_hash``) and its config hash is not, its recipe was redefined since it ran; a ValueError naming
    the cell and both hashes (recorded -> now)."""
    p = load_profile(profile)
    for c in cells:
        if c.get("config_hash") is None or c.get("setting_hash") != setting_hash(p, c["model"]):
            continue  # no hash recorded, or another setting: setting_check says so
        now = config_hash(p, c["model"], Recipe.named(c["recipe"]), int(c["seed"]))
        if c["config_hash"] != now:
            raise ValueError(f"{source}: cell {c['model']}/{c['recipe']}/seed{c['seed']} was made under another "
                             f"definition of recipe {c['recipe']!r} (config hash recorded {c['config_hash']} -> now "
                             f"{now}); rerun the reference cells here (snakemake compare does when they do not "
                             "reproduce), or restore the recipe's definition (MXFP4_RECIPES)")


def check_baselines(new: list[dict], baselines: list[dict], base_items: list[dict] | None, recipe: str,
                    references: list[str], profile: str, source: str) -> None:
    """The references a compare needs, present in full: cells of ``profile`` (not another's), every
    primary reference recipe for every model, on every seed the new cells ran, and their per-problem
    items (``base_items`` None: the user asked for a report without them). A ValueError naming what
    is missing from ``source`` otherwise."""
    if not baselines:
        raise ValueError(f"{source} holds no cells; accepted: the cells.csv of a finished run (mxfp4 aggregate)")
    profiles = {str(b.get("profile")) for b in baselines if b.get("profile") is not None}
    if profiles and profiles != {profile}:
        raise ValueError(f"{source} holds cells of profile(s) {', '.join(sorted(profiles))}, not {profile!r}: "
                         "a recipe is compared against baselines of its own profile")
    for model in sorted({r["model"] for r in new}):
        seeds = {int(r["seed"]) for r in new if r["model"] == model}
        for ref in references:
            have = {int(b["seed"]) for b in baselines if b["model"] == model and b["recipe"] == ref}
            if not have:
                raise ValueError(f"{source} has no cells of {model}/{ref}, a primary reference of {recipe!r}; run "
                                 f"them (snakemake compare runs the references it needs)")
            if not seeds <= have:
                raise ValueError(f"{source} lacks seed(s) {sorted(seeds - have)} of {model}/{ref} that {recipe!r} "
                                 f"ran: a partial baseline cannot pair by seed")
            if base_items is not None and not any(i["model"] == model and i["recipe"] == ref for i in base_items):
                raise ValueError(f"the per-problem items of {model}/{ref} are missing beside {source} "
                                 f"({TABLES['items']}); restore them, or pass --no-items for a report per seed only")


def _answer_bit(label: str, r: dict) -> str:
    """One contrast of the answer line: both values and their difference, with its 95% interval, adjusted
    p and verdict where it is tested (one seed a side gives a per-seed difference without a test)."""
    said = f"{label} {_acc(r['mean_new'])} vs {_acc(r['mean_ref'])}: {_fmt(r['diff'])}"
    if r.get("p") is None:
        return said + " (untested)"
    return f"{said} {_ci95(r)}, adj. p {p_value(r['p_adj'])}, {r['verdict']}"


def answer_line(rows: list[dict], recipe: str) -> str:
    """The report's answer in one line: per model and primary reference, the recipe's GSM8K strict
    accuracy after RL (per problem and per seed), before RL (per problem and per seed), its RL gain and its
    accuracy unquantized, each as the two values, their difference with its 95% interval, the adjusted p and
    the verdict."""
    parts = []
    for model in dict.fromkeys(r["model"] for r in rows if r["part"] == "primary"):
        said = []
        for base in dict.fromkeys(r["baseline"] for r in rows if r["part"] == "primary" and r["model"] == model):
            found = {r["metric"]: r for r in rows if (r["model"], r["baseline"]) == (model, base)}
            shown = [(PER_PROBLEM, "after RL, per problem"), ("gsm8k_strict_accuracy", "after RL, per seed"),
                     ("gsm8k_strict_accuracy_before (per problem)", "before RL, per problem"),
                     *((m, label) for m, label in STAGES if m != "gsm8k_strict_accuracy")]
            bits = [_answer_bit(label, found[m]) for m, label in shown if m in found]
            said.append(f"vs {base}: " + "; ".join(bits))
        parts.append(f"{model}: " + " — ".join(said))
    if not parts:
        return f"**Answer:** no primary contrast (`{recipe}` is itself the reference recipe and has no base)."
    return (f"**Answer** (GSM8K strict accuracy, `{recipe}` vs the reference: both values, the difference and its "
            "95% interval): " + " || ".join(parts) + ".")


def _table(rows: list[dict], primary: bool) -> list[str]:
    head = ("| model | reference | metric | new | reference's | difference | 95% interval | n (new/ref) | method | "
            "p | adj. p | verdict | interval at the verdict's level |")
    extra = " MDE80 | seeds for 0.7 pt | seeds for 1.0 pt |" if primary else ""
    lines = [head + extra, "|" + " --- |" * (13 + (3 if primary else 0))]
    for r in rows:
        line = (f"| {r['model']} | {r['baseline']} | {r['metric']} | {_acc(r.get('mean_new'))} | "
                f"{_acc(r.get('mean_ref'))} | {_fmt(r['diff'])} | {_ci95(r)} | "
                f"{r['n_a']}/{r['n_b']} {r.get('unit', '')} | {r['method']} | {p_value(r.get('p'))} | "
                f"{p_value(r['p_adj'])} | "
                f"{r['verdict']} | {_ci(r)} |")
        if primary:
            line += (f" {_fmt(r.get('mde80')).lstrip('+')} | {r.get('seeds_for_0.7pt') or MISSING} | "
                     f"{r.get('seeds_for_1.0pt') or MISSING} |")
        lines.append(line)
    return lines


def markdown(rows: list[dict], recipe: str, check: str = "", adjust: str = "holm",
             accuracies: list[dict] | None = None) -> str:
    primary = [r for r in rows if r["part"] == "primary"]
    secondary = [r for r in rows if r["part"] == "secondary"]
    sizes = {part: next((r["family_size"] for r in rows if r["part"] == part and r.get("family_size")), 0)
             for part in ("primary", "secondary")}
    lines = [
        f"# `{recipe}` against the reference recipes",
        "",
        answer_line(rows, recipe),
        "",
        *([check, ""] if check else []),
        f"Every verdict below belongs to one family at error rate {ALPHA} ({ADJUSTMENTS[adjust]}, statsmodels), split",
        f"in advance: {PRIMARY_SHARE * ALPHA:.3g} for the {sizes['primary']} primary contrasts, "
        f"{(1 - PRIMARY_SHARE) * ALPHA:.3g} for the {sizes['secondary']} tested secondary",
        "rows. Adjusted p values are on the family's scale (a verdict fires when adj. p < 0.05). Each difference has",
        "its 95% interval and, in the last column, the interval at the level at which its own test reproduces the",
        "adjusted verdict (1 - 0.05 p/adj. p), which excludes 0 exactly when the verdict fires. Differences are",
        "the new recipe minus the reference: over seeds paired by seed (same",
        "initialisation, data order and sampling RNG; Welch where the seeds differ), and per problem over the (seed,",
        "problem) pairs both answered (McNemar's exact test, lm-eval's doc hashes). Timings get no verdict.",
        "",
        "## Accuracy of each recipe",
        "",
        "GSM8K strict accuracy, mean over seeds [95% t interval]. The RL gain is after minus before RL: a recipe",
        "that starts lower can gain more and still end lower, so read the gain beside both ends.",
        "",
        *(accuracy_table(accuracies) if accuracies else ["(not given)"]),
        "",
        "## Primary contrasts",
        "",
        f"Against the recipe `{recipe}` modifies and against `{REFERENCE_RECIPE}`. Where there is no significant",
        "difference: MDE80 = the smallest true difference this n detects with 80% power at the level a lone true",
        f"effect must reach in this part ({ALPHA}·{PRIMARY_SHARE}/m); seeds for 0.7/1.0 pt = the seeds (at this many",
        "problems a seed, from the measured spread or discordance) that would detect the paper's effect sizes.",
        "",
        *(_table(primary, True) if primary else ["(none)"]),
        "",
        "<details><summary>Secondary rows: every compared metric against every reference recipe "
        f"({len(secondary)} rows)</summary>",
        "",
        *(_table(secondary, False) if secondary else ["(none)"]),
        "",
        "</details>",
    ]
    return "\n".join(lines) + "\n"


# What a rerun of a stored cell must reproduce exactly: every result column (timings, the machine and
# the hashes aside).
REPRODUCED = [*(k for k in CELL_METRICS if k not in ("mean_step_time", "wall_time_seconds")),
              *(f"weight_{k}" for k in WEIGHT_KEYS), "extra_bits_per_element", "bf16_fraction"]


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def cell_key(row: dict) -> tuple[str, str, int]:
    """(model, recipe, seed) of a cell's row (or of one of its per-problem items)."""
    return row["model"], row["recipe"], int(row["seed"])


def _find(rows: list[dict], model: str, recipe: str, seed) -> dict | None:
    """The row of cell (model, recipe, seed), or None."""
    return next((r for r in rows if cell_key(r) == (model, recipe, int(seed))), None)


def reproduction(rerun: dict, stored: list[dict]) -> dict:
    """Whether ``rerun`` (a cell row made on this machine) equals the stored row of the same model,
    recipe and seed in every ``REPRODUCED`` value, bit for bit."""
    key = cell_key(rerun)
    row = _find(stored, *key)
    if row is None:  # nothing to reproduce: the references must come from this machine
        row = {}
        differing = ["the whole cell (the stored baselines hold no such cell)"]
    else:
        differing = [k for k in REPRODUCED if not _same(rerun.get(k), row.get(k))]
    return {"cell": dict(zip(("model", "recipe", "seed"), key)), "compared": len(REPRODUCED),
            "differing": {k: [row.get(k), rerun.get(k)] for k in differing}, "reproduces": not differing,
            "machine_here": {k: rerun.get(k) for k in MACHINE_COLUMNS},
            "machine_stored": {k: row.get(k) for k in MACHINE_COLUMNS}}


def check_reproduction(layout: Layout, baselines_csv, cells: list[tuple[str, str, int]]) -> dict:
    """Rerun-here check: this run's ``cells`` (model, recipe, seed) against their stored rows; the
    stored baselines reproduce only if every one of them does."""
    mine, _ = read_cells(layout)
    stored = read_table(baselines_csv, "cells")
    checks = []
    for model, recipe, seed in cells:
        row = _find(mine, model, recipe, seed)
        if row is None:
            raise ValueError(f"cell {model}/{recipe}/seed{seed} has not run in this results folder; run it first")
        checks.append(reproduction(row, stored))
    return {"reproduces": all(c["reproduces"] for c in checks), "cells": checks}


def references_note(check: dict, references: list[str]) -> str:
    """One sentence: which references the comparison used, and why."""
    names = [f"{c['cell']['model']}/{c['cell']['recipe']}/seed{c['cell']['seed']}" for c in check["cells"]]
    if check["reproduces"]:
        return (f"References: the stored baselines, which reproduce on this machine (rerun here, "
                f"{' and '.join(names)} equal their stored rows in all {check['cells'][0]['compared']} values).")
    bad = next(c for c in check["cells"] if not c["reproduces"])
    name = f"{bad['cell']['model']}/{bad['cell']['recipe']}/seed{bad['cell']['seed']}"
    return (f"References: this machine's cells of {', '.join(references)} (same seeds), not the stored baselines, "
            f"which do not reproduce here (cell {name}, rerun here, differs from its stored row in "
            f"{len(bad['differing'])} of {bad['compared']} values, e.g. {', '.join(list(bad['differing'])[:3])}; "
            f"machine here {bad['machine_here']}, stored {bad['machine_stored']}).")


def extending_cells(cells: list[dict], stored: list[dict], recipe: str) -> list[dict]:
    """This run's cells of recipes other than ``recipe`` whose (model, recipe, seed) the stored baselines
    lack: the references of extra seeds (``compare_seeds``), valid beside the stored cells only where this
    machine reproduces those bit for bit."""
    have = {cell_key(b) for b in stored}
    return [c for c in cells if c["recipe"] != recipe and cell_key(c) not in have]


CELL_STARTUP_SECONDS = 10.0  # a cell's process before its clock starts (interpreter, torch and TRL imports)


def curves_stem(figure_stem) -> Path:
    """The stem of a compare's training-curves figure, beside its contrasts figure (whose suffix is dropped)."""
    stem = Path(figure_stem)
    return stem.with_name(f"{stem.stem if stem.suffix in ('.png', '.pdf') else stem.name}_curves")


def with_mechanism(report: str, mechanism_md: Path) -> str:
    """The compare report with the recipe's mechanism (its arm at the warm starts, no RL) first, after the
    answer line: what the recipe does to the gradient, the rollout and the entropy, before what RL made of it."""
    if not mechanism_md.is_file():
        raise ValueError(f"the mechanism report {mechanism_md} does not exist; run it first (snakemake mechanism)")
    table = [line for line in mechanism_md.read_text().splitlines() if line.startswith("|")]
    head, _, rest = report.partition("\n\n")  # the title
    answer, _, rest = rest.partition("\n\n")
    section = ["## Mechanism first: the recipe's arm at the warm starts", "",
               f"From {mechanism_md.name} (the network as the replicate; methods and the energy removed there):", "",
               *table]
    return "\n\n".join([head, answer, "\n".join(section), rest])


def cost_estimate(stored: list[dict], planned: list[tuple[str, str, int]], cores: int,
                  step_ratios: dict[str, float] | None = None) -> str:
    """One line before a compare starts: its cells still to run, and their cost from the stored cells' wall
    times (the same recipe and model, else its base recipe's times its measured step ratio to the base
    (``step_ratios``, from ``rl.step_cost.recipe_cost``), else the model's slowest recipe), each plus its
    process's start-up."""
    step_ratios = step_ratios or {}
    if not planned:
        return "compare: every cell it needs has run; only the report is left"
    walls: dict[tuple[str, str], list[float]] = {}
    for c in stored:
        if c.get("wall_time_seconds") is not None:
            walls.setdefault((c["model"], c["recipe"]), []).append(float(c["wall_time_seconds"]))
    cost, unknown = 0.0, []
    for model, recipe, _ in planned:
        known = walls.get((model, recipe))
        if not known and walls.get((model, recipe_base(recipe) or "")):
            known = [w * step_ratios.get(recipe, 1.0) for w in walls[(model, recipe_base(recipe))]]
        if not known:
            means = [sum(v) / len(v) for (m, _), v in walls.items() if m == model]
            known = [max(means)] if means else None
        if known is None:
            unknown.append(model)
            continue
        cost += sum(known) / len(known) + CELL_STARTUP_SECONDS
    parallel = max(1, min(cores, len(planned)))
    line = (f"compare: {len(planned)} cells to run, about {math.ceil(cost / 60)} CPU-minutes by the stored cells' wall "
            f"times (one core each), about {math.ceil(cost / 60 / parallel)} minutes on {parallel} core(s)")
    if unknown:
        line += f"; no stored cell of {', '.join(sorted(set(unknown)))} to estimate from"
    return line


def primary_references(recipe: str) -> list[str]:
    """The recipes a recipe's primary contrasts are against: its base (if any), then ``bf16``."""
    return [r for r in dict.fromkeys([recipe_base(recipe), REFERENCE_RECIPE]) if r is not None and r != recipe]


def run_compare(layout: Layout, recipe: str, baselines_csv, out_md, figure_stem=None,
                reproduction_json=None, adjust: str = "holm", items: bool = True,
                allow_setting_difference: bool = False, mechanism_md=None) -> list[dict]:
    """The report of ``recipe``'s cells against references: the stored baselines when
    ``reproduction_json`` (from ``check_reproduction``) says they reproduce here, or when no check is
    given; else this run's own cells of the other recipes (same machine, same seeds). ``adjust`` is
    the family's multiplicity adjustment (``ADJUSTMENTS``). Missing, partial or other-profile
    references are an error (``check_baselines``); so is a setting that differs from theirs, unless
    ``allow_setting_difference``; ``items=False`` reports per seed only, without per-problem rows.
    ``mechanism_md``: the recipe's mechanism report (``report.mechanism``), whose table leads the report."""
    if adjust not in ADJUSTMENTS:
        raise ValueError(f"adjust={adjust!r}; accepted: {', '.join(ADJUSTMENTS)}")
    if recipe == REFERENCE_RECIPE:
        raise ValueError(f"recipe {recipe!r} is the reference every contrast is against, so compare has nothing to set "
                         "it against; the A/A check of its cells against the stored baselines is `mxfp4 reproduction "
                         f"--profile {layout.profile} --cell MODEL/{recipe}/seedN`")
    cells, steps = read_cells(layout)
    cells = with_time_ratio(cells)
    new_items = read_items(layout) if items else []
    new = [c for c in cells if c["recipe"] == recipe]
    if not new:
        raise ValueError(f"no finished cells of recipe {recipe!r} in profile {layout.profile!r}; run them first")
    check = None if reproduction_json is None else read_report(reproduction_json, "reproduction")
    if check is not None and not check["reproduces"]:
        baselines = [c for c in cells if c["recipe"] != recipe]
        base_items = [i for i in new_items if i["recipe"] != recipe] if items else None
        source = f"this run's cells ({layout.cells})"
        note = references_note(check, sorted({b["recipe"] for b in baselines}))
    else:
        if not Path(baselines_csv).is_file():
            raise ValueError(f"the baselines {baselines_csv} do not exist; accepted: the cells.csv of a finished run "
                             f"(default {layout.stored(layout.table('cells'))})")
        baselines = with_time_ratio(read_table(baselines_csv, "cells"))
        items_csv = Path(baselines_csv).with_name(TABLES["items"])
        base_items = (read_table(items_csv, "items") if items_csv.is_file() else []) if items else None
        source = str(baselines_csv)
        note = references_note(check, []) if check is not None else (
            "References: the stored baselines, unchecked on this machine (no reproduction check given): "
            "differences may include the machine's.")
        if check is not None:  # this machine reproduces the stored cells: its own cells extend them by seed
            added = extending_cells(cells, baselines, recipe)
            if added:
                baselines = baselines + added
                keys = {cell_key(c) for c in added}
                if base_items is not None:
                    base_items = base_items + [i for i in new_items if cell_key(i) in keys]
                note += (" Seeds the stored baselines lack ran here and extend them: "
                         + ", ".join(f"{m}/{r}/seed{s}" for m, r, s in sorted(keys)) + ".")
    references = primary_references(recipe)
    check_baselines(new, baselines, base_items, recipe, references, layout.profile, source)
    check_definitions([b for b in baselines if b["recipe"] in references], layout.profile, source)
    models = {r["model"] for r in new}
    rows = compare_rows(new, baselines, recipe, new_items, base_items or [], references, adjust)
    check_line = setting_check(new, [b for b in baselines if b["model"] in models and b["recipe"] in references],
                               allow_setting_difference)
    if not items:
        check_line += " Per-problem rows left out (--no-items): verdicts per seed only."
    accuracies = accuracy_rows(new + [b for b in baselines if b["model"] in models], [recipe, *references])
    text = markdown(rows, recipe, f"{note}\n\n{check_line}", adjust, accuracies)
    if figure_stem:
        text += (f"\nCurves (reward, entropy, KL, gradient cosine and the probes' decomposition shares per step, seed "
                 f"bands) of the cells run here: `{curves_stem(figure_stem).name}.png`.\n")
    if mechanism_md is not None:
        text = with_mechanism(text, Path(mechanism_md))
    write_text_atomic(out_md, text)
    if figure_stem:
        from .plots import compare_figure, curves_figure

        compare_figure(rows, recipe, figure_stem)
        curves_figure(steps, cells, curves_stem(figure_stem), "GRPO training curves of the cells run here (line: "
                      "mean over seeds; band: 95% t interval over seeds; references rerun here only where listed)")
    return rows

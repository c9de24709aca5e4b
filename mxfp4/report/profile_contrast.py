"""Two runs of one experiment that differ in one setting, side by side: what the setting changes in the
operands' statistics, in the pathway matrix and in the recovery rows.

The method in full: docs/methods.md, ``mxfp4.report.profile_contrast``."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from statsmodels.stats.multitest import multipletests

from ..analysis.pathways.spec import HARMS
from ..io import write_csv_atomic, write_text_atomic
from ..layout import REFERENCE_RECIPE, Layout
from ..stats import ALPHA, crossed_mean, mean_ci, nested_paired
from .formatting import MISSING
from .pathway_table import COLUMNS, estimate, main_site

REGIME_COLUMNS = ("excess_kurtosis", "max_over_median", "outlier_block_fraction", "deadzone_fraction",
                  "shapley_share_scale", "shapley_share_dead", "shapley_share_grid")
PATHWAY_ARMS = ("+scale", "+dead", "+grid", "all", "+scale~gaussian", "+dead~gaussian", "+grid~gaussian")
FIELDS = ("section", "model", "checkpoint", "pathway", "arm", "measure", "a", "b", "diff", "ci_low", "ci_high", "n",
          "p", "p_holm", "method")


def _read(path: Path, profile: str) -> list[dict]:
    if not path.is_file():
        raise ValueError(f"profile contrast: {path} does not exist; run that profile first "
                         f"(snakemake --cores all figures --config profile={profile})")
    with path.open() as f:
        return list(csv.DictReader(f))


def regime_rows(a: list[dict], b: list[dict]) -> list[dict]:
    """Per model and operand, the median over GEMMs of each regime statistic in both runs (descriptive)."""
    rows = []
    for model in sorted({r["model"] for r in a}):
        for operand in dict.fromkeys(r["operand"] for r in a if r["model"] == model):
            for col in REGIME_COLUMNS:
                va = [float(r[col]) for r in a if r["model"] == model and r["operand"] == operand and r.get(col)]
                vb = [float(r[col]) for r in b if r["model"] == model and r["operand"] == operand and r.get(col)]
                if va and vb:
                    rows.append({"section": "regime", "model": model, "arm": operand, "measure": col,
                                 "a": statistics.median(va), "b": statistics.median(vb), "n": min(len(va), len(vb)),
                                 "method": "median over the model's GEMMs (regime.csv), no test"})
    return rows


def _units(rows: list[dict]) -> dict[tuple, dict[int, dict]]:
    out: dict[tuple, dict[int, dict]] = {}
    for r in rows:
        if r["form"] == "canonical":
            out.setdefault((r["model"], r["checkpoint"], r["pathway"], r["arm"]), {})[int(r["unit"])] = r
    return out


def _harm(unit: dict) -> float | None:
    """A units-file row's harm (empty where the arm had no value, e.g. an undefined cosine)."""
    return None if unit["harm"] in ("", "None") else float(unit["harm"])


def paired_pathway_rows(a: list[dict], b: list[dict], checkpoint: str = "warm") -> list[dict]:
    """Per model, pathway and arm at ``checkpoint``: harm in run b minus harm in run a, paired unit by
    unit (``stats.nested_paired``, the unit's outer group as in the pathway matrix). Raises when a unit
    present in both runs measured different data (its digests differ)."""
    ua, ub = _units(a), _units(b)
    rows = []
    for key in sorted(k for k in ua if k[1] == checkpoint and k in ub and k[3] in ("none", *PATHWAY_ARMS)):
        model, ckpt, pathway, arm = key
        common = sorted(set(ua[key]) & set(ub[key]))
        differ = [i for i in common if ua[key][i]["key"] != ub[key][i]["key"]]
        if differ:
            raise ValueError(f"profile contrast: {model}/{ckpt} {pathway} unit(s) {differ[:5]} measured different "
                             "data in the two runs (their digests differ); pairing is only valid on the same "
                             "batches and prompts (the same seeds and a function-preserving change)")
        ha, hb = [_harm(ua[key][i]) for i in common], [_harm(ub[key][i]) for i in common]
        d = nested_paired(hb, ha, [ua[key][i]["group"] for i in common])
        rows.append({"section": "pathways", "model": model, "checkpoint": ckpt, "pathway": pathway, "arm": arm,
                     "measure": HARMS[pathway], "a": mean_ci(ha)["mean"], "b": mean_ci(hb)["mean"], "diff": d["diff"],
                     "ci_low": d["ci_low"], "ci_high": d["ci_high"], "n": d["n"],
                     "p": None if arm == "none" else d["p"],  # the unquantized arm is a check, not a test
                     "method": f"harm(b) - harm(a), paired over the same units (same data digests), "
                               f"95% interval [{d['interval']}]"})
    return rows


def side_by_side_rows(a: list[dict], b: list[dict], checkpoint: str = "grpo") -> list[dict]:
    """The pathway table's headline measures at ``checkpoint``, each run with its own interval (no test:
    the runs' policies differ there)."""
    def index(rows):
        return {(r["model"], r["injection"], r["metric"]): r for r in rows
                if r["checkpoint"] == checkpoint and r.get("form", "canonical") == "canonical"
                and r["layer"] == "total" and r["site"] == main_site(r["metric"])}

    ia, ib = index(a), index(b)
    rows = []
    for metric, header, flip in COLUMNS:
        for (model, arm, m) in sorted(k for k in ia if k[2] == metric and k[1] in PATHWAY_ARMS and k in ib):
            (ma, la, ha), (mb, lb, hb) = estimate(ia[(model, arm, m)], flip), estimate(ib[(model, arm, m)], flip)
            rows.append({"section": "pathways", "model": model, "checkpoint": checkpoint, "arm": arm, "measure": header,
                         "a": ma, "b": mb, "n": ia[(model, arm, m)]["n"],
                         "method": f"each run's own estimate; a [{_fmt(la)}, {_fmt(ha)}], b [{_fmt(lb)}, {_fmt(hb)}]; "
                                   "no test (different policies)"})
    return rows


def recovery_rows(a: list[dict], b: list[dict]) -> list[dict]:
    """Per model, recipe and recovery measure (RL gain: strict accuracy after minus before RL; final strict
    accuracy), from lm-eval's per-problem scores (items.csv): the recipe's gap to BF16 on each (problem,
    seed) in each run, and its change from run a to run b on the same (problem, seed), each the mean of
    a complete problems x seeds design with both as crossed random factors (``stats.crossed_mean``).
    The runs must have evaluated the same problems under the same seeds (their lm-eval doc hashes)."""
    measures = {"gsm8k_rl_gain": lambda r: float(r["strict"]) - float(r["strict_before"]),
                "gsm8k_strict_accuracy": lambda r: float(r["strict"])}

    def scores(items, model, recipe, measure):  # (seed, lm-eval doc id, doc hash) -> score
        return {(int(r["seed"]), int(r["doc_id"]), r["doc_hash"]): measures[measure](r) for r in items
                if r["model"] == model and r["recipe"] == recipe}

    rows = []
    for model in sorted({r["model"] for r in a} & {r["model"] for r in b}):
        recipes = sorted(({r["recipe"] for r in a if r["model"] == model}
                          & {r["recipe"] for r in b if r["model"] == model}) - {REFERENCE_RECIPE})
        for recipe in recipes:
            for measure in measures:
                gap = {}
                for name, items in (("a", a), ("b", b)):
                    mine, ref = scores(items, model, recipe, measure), scores(items, model, REFERENCE_RECIPE, measure)
                    if set(mine) != set(ref):
                        raise ValueError(f"profile contrast: run {name}, {model}: {recipe} and {REFERENCE_RECIPE} "
                                         "evaluated different (seed, problem) pairs; accepted: the same problems")
                    gap[name] = {k: mine[k] - ref[k] for k in mine}
                if set(gap["a"]) != set(gap["b"]):
                    raise ValueError(f"profile contrast: {model}/{recipe}: the two runs evaluated different (seed, "
                                     "problem) pairs (lm-eval doc hashes); accepted: the same seeds and problems")
                keys = sorted(gap["a"])
                seeds, docs = [k[0] for k in keys], [k[1] for k in keys]  # a repeated problem counts twice
                ea, eb = (crossed_mean([gap[n][k] for k in keys], docs, seeds) for n in ("a", "b"))
                d = crossed_mean([gap["b"][k] - gap["a"][k] for k in keys], docs, seeds)
                rows.append({"section": "recovery", "model": model, "arm": f"{recipe} - {REFERENCE_RECIPE}",
                             "measure": measure, "a": ea["mean"], "b": eb["mean"], "diff": d["mean"],
                             "ci_low": d["ci_low"], "ci_high": d["ci_high"], "n": d["n"], "p": d["p"],
                             "method": f"({recipe} - bf16) per (problem, seed) in each run, b - a on the same pairs; "
                                       f"95% interval [{d['interval']}]; a: [{_fmt(ea['ci_low'])}, "
                                       f"{_fmt(ea['ci_high'])}], b: [{_fmt(eb['ci_low'])}, {_fmt(eb['ci_high'])}]"})
    return rows


def adjust(rows: list[dict]) -> None:
    """Holm over every row with a p value (one family); the others get none."""
    tested = [r for r in rows if r.get("p") is not None]
    if tested:
        _, p_adj, _, _ = multipletests([r["p"] for r in tested], alpha=ALPHA, method="holm")
        for r, q in zip(tested, p_adj):
            r["p_holm"] = float(q)


def contrast(la: Layout, lb: Layout) -> list[dict]:
    """Every section's rows of run ``lb`` against run ``la``, Holm-adjusted as one family."""
    profile_a, profile_b = la.profile, lb.profile
    cells_a, cells_b = _read(la.table("cells"), profile_a), _read(lb.table("cells"), profile_b)
    models = sorted({r["model"] for r in cells_a} & {r["model"] for r in cells_b})
    units_a = [u for m in models for u in _read(la.pathway_units(m, "warm"), profile_a)]
    units_b = [u for m in models for u in _read(lb.pathway_units(m, "warm"), profile_b)]
    rows = regime_rows(_read(la.regime, profile_a), _read(lb.regime, profile_b))
    rows += paired_pathway_rows(units_a, units_b, "warm")
    rows += side_by_side_rows(_read(la.pathways(), profile_a), _read(lb.pathways(), profile_b), "grpo")
    rows += recovery_rows(_read(la.table("items"), profile_a), _read(lb.table("items"), profile_b))
    adjust(rows)
    return rows


def _fmt(v, spec="{:+.3f}") -> str:
    return MISSING if v is None or v == "" else spec.format(float(v))


def markdown(rows: list[dict], profile_a: str, profile_b: str) -> str:
    tested = [r for r in rows if r.get("p") is not None]
    lines = [f"# {profile_b} (b) against {profile_a} (a)", "",
             f"One family of {len(tested)} tests, Holm-adjusted (statsmodels); a row 'differs' when its adjusted p "
             f"< {ALPHA}. Exploratory: it says where the setting changes a measurement, not which claim holds.", ""]

    def verdict(r):
        if r.get("p_holm") is None:
            return ""
        return "differs" if r["p_holm"] < ALPHA else "no detectable change"

    lines += ["## Operand statistics (median over GEMMs)", "", "| model | operand | statistic | a | b |",
              "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['model']} | {r['arm']} | {r['measure']} | {_fmt(r['a'], '{:.4g}')} | {_fmt(r['b'], '{:.4g}')} |"
              for r in rows if r["section"] == "regime"]
    lines += ["", "## Pathway matrix at the warm start, paired unit by unit (the same function and data)", "",
              "| model | pathway | arm | harm a | harm b | b - a [95% CI] | n | p (Holm) | |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['model']} | {r['pathway']} ({r['measure']}) | {r['arm']} | {_fmt(r['a'])} | {_fmt(r['b'])} | "
              f"{_fmt(r['diff'])} [{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}] | {r['n']} | "
              f"{_fmt(r.get('p_holm'), '{:.3g}')} | {verdict(r)} |"
              for r in rows if r["section"] == "pathways" and r["checkpoint"] == "warm"]
    lines += ["", "## Pathway matrix after GRPO, each run's own policies (no test)", "",
              "| model | measure | arm | a | b | n | intervals |", "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['model']} | {r['measure']} | {r['arm']} | {_fmt(r['a'])} | {_fmt(r['b'])} | {r['n']} | "
              f"{r['method'].split(';')[1].strip()} |"
              for r in rows if r["section"] == "pathways" and r["checkpoint"] == "grpo"]
    lines += ["", "## Recovery: each recipe minus BF16 per problem and seed, and its change", "",
              "| model | recipe | measure | a | b | b - a [95% CI] | problems x seeds | p (Holm) | |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['model']} | {r['arm']} | {r['measure']} | {_fmt(r['a'])} | {_fmt(r['b'])} | {_fmt(r['diff'])} "
              f"[{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}] | {r['n']} | {_fmt(r.get('p_holm'), '{:.3g}')} | "
              f"{verdict(r)} |" for r in rows if r["section"] == "recovery"]
    return "\n".join(lines) + "\n"


def run_profile_contrast(la: Layout, lb: Layout, out_md=None) -> list[dict]:
    """The contrast as a markdown report at ``out_md`` (default ``lb.contrast(la.profile)``) and a CSV
    (``FIELDS``) beside it."""
    rows = contrast(la, lb)
    out_md = Path(out_md) if out_md is not None else lb.contrast(la.profile)
    write_csv_atomic(out_md.with_suffix(".csv"), rows, FIELDS)
    write_text_atomic(out_md, markdown(rows, la.profile, lb.profile))
    return rows

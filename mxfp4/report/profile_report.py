"""REPORT.md of one profile's run: what GRPO did to held-out accuracy, the pathway matrix's headline,
the claims' verdicts and where every other table lives. Every number carries its method and n, read
from the files the run wrote; nothing here is measured again."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..config import model_line
from ..config.profiles import Profile, load_profile
from ..config.recipes import recipe_base
from ..io import write_text_atomic
from ..layout import REFERENCE_RECIPE, Layout
from ..problems import DEFAULT_FLAWS
from .aggregate import PROBLEM_TYPES, RL_GAIN_PER_PROBLEM, typed
from .compare import item_difference
from .formatting import MISSING
from .pathway_table import checkpoint_label, read_rows, recovery_markdown
from .pathway_table import markdown as pathway_markdown
from .tables import read_table, read_text_table

ACCURACY = (  # (summary.csv metric, column header)
    ("gsm8k_strict_accuracy_before", "before RL"),
    ("gsm8k_strict_accuracy", "after RL"),
    ("gsm8k_strict_accuracy_unquantized", "after RL, unquantized"),
)
HEADLINE_ARMS = ("+scale", "+dead", "+grid", "all")


def _number(value: str, signed: bool = False) -> str:
    if value in ("", None):
        return MISSING
    return f"{float(value):+.3f}" if signed else f"{float(value):.3f}"


def _interval(row: dict | None) -> str:
    if row is None:
        return MISSING
    return f"{_number(row['mean'], True)} [{_number(row['ci_low'], True)}, {_number(row['ci_high'], True)}]"


def accuracy_table(summary_csv: Path | str, flaws=DEFAULT_FLAWS, warm_starts: int = 1) -> str:
    """Per model and recipe: strict accuracy before RL, after, after unquantized (means over seeds) and
    the RL gain paired by problem and seed with its 95% interval, overall and, where the problems have
    types, on the planted-flaw problems (``flaws``) and on the rest; the methods, n and the warm starts
    the seeds start from below the table."""
    rows = read_text_table(summary_csv, "summary")
    by = {(r["model"], r["recipe"], r["metric"]): r for r in rows}
    pairs = list(dict.fromkeys((r["model"], r["recipe"]) for r in rows))
    kinds = [k for k in PROBLEM_TYPES if any(m == typed(RL_GAIN_PER_PROBLEM, k) for _, _, m in by)]
    gains = [RL_GAIN_PER_PROBLEM] + [typed(RL_GAIN_PER_PROBLEM, k) for k in kinds]
    heads = ["RL gain [95% CI]"] + [f"RL gain, {k} problems" for k in kinds]
    out = ["| model | recipe | " + " | ".join(h for _, h in ACCURACY) + " | " + " | ".join(heads) + " |",
           "| --- | --- | " + " | ".join("---" for _ in [*ACCURACY, *gains]) + " |"]
    methods = {}
    for model, recipe in pairs:
        cells = [_number(by.get((model, recipe, m), {}).get("mean")) for m, _ in ACCURACY]
        silent = by.get((model, recipe, "gsm8k_rl_gain"), {}).get("method") or ""
        for metric in gains:
            gain = by.get((model, recipe, metric))
            cells.append(_interval(gain) + (" (cells without a learning signal left out)"
                                            if "no learning signal" in silent else ""))
            if gain is not None and metric == RL_GAIN_PER_PROBLEM:
                methods.setdefault(gain["method"].split(",")[0], f"{gain['method'].split(',')[0]}, n = {gain['n']}")
        out.append(f"| {model} | {recipe} | " + " | ".join(cells) + " |")
    seeds = {by[k]["n"] for k in by if k[2] == "gsm8k_strict_accuracy"}
    note = (f"Accuracies: lm-eval's strict match on the held-out problems, mean over {', '.join(sorted(seeds))} "
            "seed(s)" + (f", the i-th from warm start i of {warm_starts} (each its own pretraining seed)"
                         if warm_starts > 1 else "")
            + ". RL gain: after minus before on the same problems, paired by problem and seed, "
            + "; ".join(methods.values()) + " (problem x seed pairs; each row's df in summary.csv).")
    if kinds:
        note += (f" Flaw problems: those with a step of a planted flaw ({' or '.join(flaws)}), which the warm "
                 "start's demonstrations do as an addition (the planted errors RL can correct)"
                 + ("; flaw:<operation>: those with a step of that flaw (a problem with both counts in each)"
                    if len(flaws) > 1 else "")
                 + "; rest: the others (each type's n in summary.csv).")
    return "\n".join(out) + "\n\n" + note + "\n"


CORRECTED_BASE = "mxfp4"
STAGES = (("strict_before", "before RL"), ("strict", "after RL"))


def _versus(d: dict | None) -> str:
    if d is None:
        return MISSING
    how = "crossed" if "components" in d else d["method"].split(": ", 1)[1]
    return f"{d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}], p {d['p']:.2g} ({how})"


def corrections_table(items_csv: Path | str) -> str:
    """Per model, each recipe that adds corrections to MXFP4 against plain MXFP4 and against BF16, problem by
    problem (the same lm-eval docs and seeds), before RL and after: which correction restores accuracy, and
    how far from BF16 it stays. Empty when the run has no such recipe."""
    items = read_table(items_csv, "items")
    recipes = list(dict.fromkeys(r["recipe"] for r in items))
    corrected = [r for r in recipes if r != CORRECTED_BASE and recipe_base(r) == CORRECTED_BASE]
    references = [r for r in (CORRECTED_BASE, REFERENCE_RECIPE) if r in recipes]
    if not corrected or not references:
        return ""
    out = ["| model | recipe | stage | accuracy | " + " | ".join(f"minus {r} [95% CI], p" for r in references) + " |",
           "| --- | --- | --- | --- | " + " | ".join("---" for _ in references) + " |"]
    n = set()
    for model in dict.fromkeys(r["model"] for r in items):
        of = {rec: [r for r in items if (r["model"], r["recipe"]) == (model, rec)] for rec in recipes}
        for recipe in corrected:
            for key, stage in STAGES:
                rows = [r for r in of[recipe] if r.get(key) is not None]
                if not rows:
                    continue
                vs = [item_difference(rows, of[ref], key) for ref in references]
                n |= {d["n_a"] for d in vs if d is not None}
                out.append(f"| {model} | {recipe} | {stage} | {sum(r[key] for r in rows) / len(rows):.3f} | "
                           + " | ".join(_versus(d) for d in vs) + " |")
    return ("Strict accuracy on the held-out problems; each difference paired over the (seed, problem) pairs both "
            f"recipes answered (n = {', '.join(str(k) for k in sorted(n))}). Where the seeds differ (crossed): the "
            "two-way crossed random-effects model, problems and seeds (each seed's network) both random, "
            "Satterthwaite df; where every seed gave each problem the same value (one warm start's evaluation "
            "before RL), that value counted once, McNemar's exact test and its Clopper-Pearson interval (gained: "
            "problems the correction solves that the reference does not; lost: the reverse). Unadjusted: these "
            "rows are descriptive, not in the claims' families.\n\n"
            + "\n".join(out) + "\n")


def pathway_headline(pathways_csv: Path | str) -> str:
    """The pathway matrix at the warm start, canonical form (the gain form where the run measured only that
    one): each component injected alone and full MXFP4, on the three pathways (rows as ``pathways.md`` has
    them, with n)."""
    rows = read_rows(pathways_csv)
    canonical = any(r["checkpoint"] == "warm" and r["injection"] in HEADLINE_ARMS for r in rows)
    warm = checkpoint_label("warm", "canonical" if canonical else "gain")
    rows = [r for r in rows if r["checkpoint"] == warm]
    keep = [r for r in rows if r["injection"] in HEADLINE_ARMS or r["metric"] == "skipped_zero_advantage_batches"
            or r["metric"].startswith("interaction_ratio")]
    return pathway_markdown(keep)


def regime_section(regime_md: Path | str) -> str:
    """regime.md's lead and its table of the operands (median [min, max] over each model's GEMMs)."""
    text = Path(regime_md).read_text()
    lead = text.split("\n\n", 1)[0]
    tables = _tables(text)
    return lead + "\n\n" + ("\n".join(tables[0]) if tables else "") + "\n"


def model_notes(profile: Profile) -> list[str]:
    """What the model line of each packaged checkpoint of the profile says of its weights' origin (the
    ``_source`` of ``experiments/models/<hub>.json``): the caveat every weight statistic carries."""
    notes = []
    for name, spec in profile.models.items():
        source = (model_line(spec.hub) or {}).get("_source") if spec.hub else None
        if source:
            notes.append(f"{name}: {source}.")
    return notes


VERDICT = re.compile(r"\| (held|contradicted|not shown|met|not met|by construction|held \(numerical check\)) \|$")


def _tables(text: str) -> list[list[str]]:
    """The markdown tables of ``text``, each as its lines (header, rule, rows)."""
    tables, current = [], []
    for ln in text.splitlines():
        if ln.startswith("| "):
            current.append(ln)
        elif current:
            tables.append(current)
            current = []
    return tables + ([current] if current else [])


def claims_summary(claims_md: Path | str) -> str:
    """The claims table's primary family as it stands (where the table has one), then the verdict counts
    of the other rows and every one of them that resolved (held or contradicted)."""
    text = Path(claims_md).read_text()
    primary, sep, rest = text.partition("## Secondary rows")
    out = ""
    if sep:
        table = _tables(primary)
        out = ("Primary family (fixed in the profile before the run; Holm over it alone):\n\n"
               + ("\n".join(table[0]) if table else "No primary test was measured in this run.") + "\n\n"
               "Secondary rows: ")
    lines = [ln for table in _tables(rest if sep else text) for ln in table if not ln.startswith("| ---")]
    header, body = lines[0], lines[1:]
    counts: dict[str, int] = {}
    resolved = []
    for ln in body:
        m = VERDICT.search(ln)
        verdict = m.group(1) if m else "other"
        counts[verdict] = counts.get(verdict, 0) + 1
        if verdict in ("held", "contradicted"):
            resolved.append(ln)
    count_line = ", ".join(f"{v}: {n}" for v, n in sorted(counts.items()))
    out += f"{len(body)} rows ({count_line}).\n"
    if resolved:
        rule = "| " + " | ".join("---" for _ in header.split(" | ")) + " |"
        out += "\nRows that resolved:\n\n" + "\n".join([header, rule, *resolved]) + "\n"
    return out


def network_section(network_md: Path | str) -> str:
    """The network-level claims table's primary family and its replication line (``network_claims.markdown``)."""
    text = Path(network_md).read_text()
    start = text.find("## Primary family")
    end = text.find("## Secondary family")
    body = text[start:end if end > 0 else text.find("Methods:")] if start >= 0 else ""
    z = next((line for line in text.splitlines() if line.startswith("Between-half replication")), "")
    return body.replace("## Primary family", "").strip() + "\n\n" + z + "\n"


def build(profile: str, summary_csv, pathways_csv=None, claims_md=None, links: dict[str, str] | None = None,
          regime_md=None, items_csv=None, network_md=None) -> str:
    """The report's markdown. ``links``: label -> relative path of the run's other tables."""
    parts = [f"# Results: the `{profile}` profile\n",
             f"Generated by `mxfp4 report --profile {profile}` from the run's aggregate tables; the profile "
             f"(`experiments/profiles/{profile}.yaml`) states the design, its seeds and its n.\n"]
    spec = load_profile(profile)
    notes = model_notes(spec)
    if notes:
        parts += ["Models: " + " ".join(notes) + "\n"]
    flaws = DEFAULT_FLAWS if spec.pretrain is None else spec.pretrain.flaws
    parts += ["## GRPO on held-out problems\n", accuracy_table(summary_csv, flaws, spec.warm_starts)]
    corrections = corrections_table(items_csv) if items_csv is not None and Path(items_csv).is_file() else ""
    if corrections:
        parts += ["## Each correction against MXFP4 and BF16\n", corrections]
    if pathways_csv is not None and Path(pathways_csv).is_file():
        parts += ["## The pathway matrix at the warm start\n",
                  "Effects of each MXFP4 component injected alone (and of full MXFP4) against the unquantized arm: "
                  "1 - gradient cosine, relative norm error and norm ratio on GRPO batches; sampled rollout "
                  "accuracy and token entropy, and teacher-forced (TF: the same tokens under every arm) "
                  "log-likelihood of the correct solution, token entropy and KL to the unquantized arm on its "
                  "sampled completions, paired per prompt; 95% intervals, the policy as the outer unit.\n",
                  pathway_headline(pathways_csv), recovery_markdown(read_rows(pathways_csv))]
    if claims_md is not None and Path(claims_md).is_file():
        parts += ["## Claims\n", claims_summary(claims_md)]
    if network_md is not None and Path(network_md).is_file():
        parts += ["## Claims with the network as the replicate\n",
                  "The claim-level tests again, every unit averaged within its network (warm start) and each test "
                  "over networks: what the verdicts say about the model class, not about the networks trained "
                  "(`mxfp4 network-claims`, from the stored per-unit files).\n",
                  network_section(network_md)]
    if regime_md is not None and Path(regime_md).is_file():
        parts += ["## The operands' regime\n", regime_section(regime_md)]
    if links:
        parts += ["## Every table\n", "\n".join(f"- {label}: `{path}`" for label, path in links.items()) + "\n"]
    return "\n".join(parts)


def run(layout: Layout, out: Path | str | None = None, stored: bool = False) -> Path:
    """Write REPORT.md of a run (``layout.report``), or with ``stored`` of its stored baselines (where
    ``layout.stored`` keeps each file), linking the other tables relative to it."""
    where = layout.stored if stored else Path
    files = {"summary": layout.table("summary"), "pathways": layout.pathways(), "claims": layout.claims,
             "items": layout.table("items")}
    files = {k: where(v) for k, v in files.items()}
    if not files["summary"].is_file():
        raise ValueError(f"{files['summary']} is missing: run the profile's aggregate step first "
                         f"(snakemake --cores all aggregate --config profile={layout.profile})")
    tables = {"claims": layout.claims, "pathway matrix": layout.pathways().with_suffix(".md"),
              "regime statistics": layout.regime.with_suffix(".md"), "cells": layout.table("cells")}
    tables = {label: where(path) for label, path in tables.items()}
    network = where(layout.network_claims)
    if network.is_file():
        tables["claims with the network as the replicate"] = network
    tables["figures"] = where(layout.figure("any")).parent
    contrasts = where(layout.contrast("any")).parent
    tables |= {f"contrast with {f.stem}": f for f in sorted(contrasts.glob("*.md"))}
    compares = where(layout.compare("any")).parent
    tables |= {f"compare of {f.stem} against the baselines": f for f in sorted(compares.glob("*.md"))}
    home = where(layout.report)  # links are relative to where the report belongs, wherever ``out`` puts it
    target = Path(out) if out is not None else home
    links = {label: os.path.relpath(path, home.parent) + ("/" if label == "figures" else "")
             for label, path in tables.items()}
    write_text_atomic(target, build(layout.profile, files["summary"], files["pathways"], files["claims"], links,
                                    tables["regime statistics"], files["items"], network))
    return target

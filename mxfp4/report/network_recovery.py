"""The headline recovery with the network as the replicate: do the combined corrections recover BF16's accuracy?

Per network (a warm start, trained with GRPO from the same seed under every recipe): each held-out problem's strict
accuracy after GRPO under mxfp4+all minus under BF16, over problems x networks on the crossed random-effects model
(``stats.crossed_mean``: problems and networks both random, Satterthwaite df), tested against the paper's claim,
two-sided so that it can be contradicted: non-inferiority within 0.7 points for a dense model, superiority for an
MoE one (``claims.recovery_row``'s test). The design fixed before the run (the profile's network-recovery block) says
whether the row is primary; every row shows its minimum detectable effect and the networks the paper's margin needs.
The same test on each half of the networks fixed before the run, with the between-half z, says whether the verdict
replicates. The RL gain (after minus before GRPO) is a secondary row; a network whose cells had no learning signal
(every advantage zero) is left out of it and named, never counted as a gain of 0. A profile that holds out arithmetic
(``data.holdout``) gets every row again on the problems that need a never-trained fact, as secondary rows."""

from __future__ import annotations

from pathlib import Path

from statsmodels.stats.multitest import multipletests

from ..config.profiles import HEADLINE_MAX_MDE, HeadlineDesign
from ..io import write_text_atomic
from ..layout import REFERENCE_RECIPE
from ..stats import ALPHA, between_half_z, crossed_cols_needed, crossed_mde, fixed_halves
from .aggregate import no_learning_signal, read_csv, write_csv
from .claims import RECOVERY_MEASURES, crossed_problems, crossed_recovery_test, recovery_null
from .formatting import MISSING, formatter, p_value

CORRECTED, PLAIN = "mxfp4+all", "mxfp4"
FINAL, GAIN = "gsm8k_strict_accuracy", "gsm8k_rl_gain"
METHOD = ("per held-out problem and network, the measure under {a} minus under {b}; the mean over problems x "
          "networks on the crossed random-effects model (problems and networks random, Satterthwaite df); two-sided "
          "at {alpha} against {null} (Holm over the rows of a family); each half of the networks fixed before the "
          "run (sorted, taken alternately) tested alone at {alpha}")


def _estimate(items: list[dict], model: str, a: str, b: str, metric: str, networks: list[int]) -> dict | None:
    keep = set(networks)
    return crossed_problems([r for r in items if int(r["seed"]) in keep], model, a, b, metric)


def design_from(items: list[dict], model: str, stand_in: str, pilot: str) -> dict:
    """The headline's design from a pilot of the same design (the profile's network-recovery block): the variance
    components of ``stand_in`` minus BF16 on final accuracy over the pilot's problems and networks, the minimum
    detectable effect at that size, the networks the paper's margin needs, and the family it puts the headline in.

    Args:
        items: the pilot's ``items.csv`` rows.
        model: the model of the design.
        stand_in: the recipe whose difference to BF16 stands in for mxfp4+all's (the same networks and problems).
        pilot: the pilot profile's name, recorded in the design.
    """
    networks = sorted({int(r["seed"]) for r in items if r["model"] == model})
    est = _estimate(items, model, stand_in, REFERENCE_RECIPE, FINAL, networks)
    if est is None or "components" not in est:
        raise ValueError(f"{pilot}: {model} has no {stand_in} and {REFERENCE_RECIPE} cells on two or more networks "
                         "and problems; the design needs their per-problem rows (items.csv)")
    effect = recovery_null(model)[0]
    mde = crossed_mde(est["components"], est["rows"], est["cols"])
    design = HeadlineDesign(pilot=pilot, stand_in=stand_in, problems=est["rows"], networks=est["cols"],
                            components=est["components"], mde=mde,
                            networks_needed=crossed_cols_needed(effect, est["components"], est["rows"]),
                            primary=mde <= HEADLINE_MAX_MDE)
    return design.model_dump()


def silent_networks(cells: list[dict], model: str, recipes: tuple[str, ...]) -> list[int]:
    """The networks where a cell of ``recipes`` had no learning signal: their RL gain measures no RL."""
    return sorted({int(c["seed"]) for c in cells
                   if c["model"] == model and c["recipe"] in recipes and no_learning_signal(c)})


def contrast_row(items: list[dict], model: str, a: str, metric: str, networks: list[int], part: str) -> dict:
    """``metric`` under ``a`` minus under BF16 on ``networks``: the crossed estimate, its two-sided p against the
    paper's null value, the design's minimum detectable effect and the networks the paper's effect needs."""
    _, null, test = recovery_null(model)
    row = {"model": model, "contrast": f"{a} - {REFERENCE_RECIPE}", "measure": RECOVERY_MEASURES[metric],
           "metric": metric, "part": part, "networks": len(networks), "problems": None, "diff": None, "ci_low": None,
           "ci_high": None, "se": None, "df": None, "p": None, "null": null, "test": test, "mde80": None,
           "networks_needed": None}
    est = _estimate(items, model, a, REFERENCE_RECIPE, metric, networks)
    if est is None or est.get("se") is None:
        return row
    row.update(problems=est["rows"], networks=est["cols"], diff=est["mean"], ci_low=float(est["ci_low"]),
               ci_high=float(est["ci_high"]), se=est["se"], df=est["df"], **crossed_recovery_test(est, model))
    return row


def verdict(row: dict, p: float | None, alpha: float = ALPHA) -> str:
    """held / contradicted where the two-sided test rejects the null value, on the claimed / the other side of it
    (for non-inferiority: contradicted = worse than BF16 by more than the margin); else not shown."""
    if p is None:
        return "inconclusive (fewer than two networks or problems)"
    if p >= alpha:
        return "not shown"
    return "held" if row["diff"] > row["null"] else "contradicted"


SPLITS = {"wording": "new wording (held-out questions of trained arithmetic)",
          "arithmetic": "new arithmetic (each problem needs a never-trained fact)"}


def analyse(cells: list[dict], items: list[dict], model: str, design: HeadlineDesign | None,
            arithmetic_items: list[dict] | None = None) -> dict:
    """The premise rows (each recipe against BF16), the headline on final accuracy and the RL gain row on all
    networks (Holm within each family) and on each fixed half, with the between-half z: on the held-out questions
    and, given ``arithmetic_items`` (a profile that holds out arithmetic), on the never-trained arithmetic too,
    whose rows are secondary (the design fixes the headline on the held-out questions)."""
    have = {(int(c["seed"]), c["recipe"]) for c in cells if c["model"] == model}
    nets = sorted({s for s, r in have if r == REFERENCE_RECIPE and (s, CORRECTED) in have})
    if len(nets) < 2:
        raise ValueError(f"{model}: {len(nets)} network(s) with both {REFERENCE_RECIPE} and {CORRECTED} cells; the "
                         "test needs at least two")
    silent = silent_networks(cells, model, (REFERENCE_RECIPE, CORRECTED))
    halves = fixed_halves(nets)
    parts = [("all networks", nets)] + [(f"half {i + 1}", h) for i, h in enumerate(halves)]
    data = {"wording": items, **({"arithmetic": arithmetic_items} if arithmetic_items is not None else {})}
    rows, premise = [], []
    recipes = [r for r in (PLAIN, "mxfp4+aqn") if any(rr == r for _, rr in have)]
    for split, split_items in data.items():
        for metric in (FINAL, GAIN):
            usable = [n for n in nets if metric == FINAL or n not in silent]
            for part, group in parts:
                row = contrast_row(split_items, model, CORRECTED, metric, [n for n in group if n in usable], part)
                rows.append({**row, "split": split})
        premise += [{**contrast_row(split_items, model, r, metric, nets, "all networks"), "split": split}
                    for r in recipes for metric in (FINAL, GAIN)]
    primary = design is not None and design.primary
    for r in rows:
        headline = r["split"] == "wording" and r["metric"] == FINAL
        r["family"] = ("primary" if primary and headline else "secondary") \
            if r["part"] == "all networks" else "replication"
    for family in ("primary", "secondary"):
        members = [r for r in rows if r["family"] == family and r["p"] is not None]
        if members:
            adjusted = multipletests([r["p"] for r in members], alpha=ALPHA, method="holm")[1]
            for r, p in zip(members, adjusted, strict=True):
                r["p_holm"] = float(p)
    for r in rows:
        r["verdict"] = verdict(r, r.get("p_holm", r["p"]))
    z = {}
    for split in data:
        for metric in (FINAL, GAIN):
            h1, h2 = (r for r in rows if r["split"] == split and r["metric"] == metric and r["part"] != "all networks")
            z[(split, metric)] = between_half_z(h1, h2)
    return {"model": model, "networks": nets, "halves": halves, "silent": silent, "rows": rows, "premise": premise,
            "between_half_z": z, "design": design, "splits": list(data),
            "per_network": per_network(cells, model, nets)}


def per_network(cells: list[dict], model: str, nets: list[int]) -> list[dict]:
    """Each network's cells: final accuracy, accuracy before GRPO and learning-signal steps per recipe."""
    by = {(int(c["seed"]), c["recipe"]): c for c in cells if c["model"] == model}
    recipes = sorted({r for _, r in by}, key=lambda r: (r != REFERENCE_RECIPE, r))
    return [{"network": n, "recipes": {r: by[(n, r)] for r in recipes if (n, r) in by}} for n in nets]


_f = formatter("{:+.3f}")



def _needed(r: dict) -> str:
    if r["mde80"] is None:
        return MISSING
    return str(r["networks_needed"]) if r["networks_needed"] else f"none at {r['problems']} problems"


def markdown(result: dict, profile: str) -> str:
    model, design = result["model"], result["design"]
    effect, null, test = recovery_null(model)
    k = len(result["networks"])
    lines = [f"# The headline recovery over networks: {profile}, {model}", "",
             METHOD.format(a=CORRECTED, b=REFERENCE_RECIPE, alpha=ALPHA, null=f"{null:+.3f} ({test})") + ".", ""]
    lines += ["## The design, fixed before the run", ""]
    if design is None:
        lines += ["None in the profile: every row is secondary.", ""]
    else:
        needed = design.networks_needed or f"no number of networks at {design.problems} problems"
        lines += [f"From {design.pilot}'s stored {design.stand_in} - {REFERENCE_RECIPE} contrast on "
                  f"{design.networks} networks x {design.problems} problems: variance components problems "
                  f"{design.components['rows']:.3g}, networks {design.components['cols']:.3g}, residual "
                  f"{design.components['residual']:.3g}; minimum detectable effect {design.mde:.3f} at 80% power "
                  f"({'at most' if design.primary else 'more than'} {HEADLINE_MAX_MDE:.2f}: the headline is "
                  f"{'primary' if design.primary else 'a secondary row'}); the paper's {effect:.3f} needs {needed}.",
                  ""]
    several = len(result["splits"]) > 1
    lines += ["## Premise: each recipe against BF16 on all networks (estimates, no test)", ""]
    if not result["premise"]:
        lines.append(f"No MXFP4 recipe but {CORRECTED} in this profile.")
    else:
        lines += ["| contrast | " + ("held-out side | " if several else "") + "measure | networks | problems | diff | "
                  "95% CI |", "| --- |" + (" --- |" if several else "") + " --- | --- | --- | --- | --- |"]
    for r in result["premise"]:
        lines.append(f"| {r['contrast']} | " + (f"{r['split']} | " if several else "")
                     + f"{r['measure']} | {r['networks']} | {r['problems'] or MISSING} | "
                     f"{_f(r['diff'])} | [{_f(r['ci_low'])}, {_f(r['ci_high'])}] |")
    for split in result["splits"]:
        rows = [r for r in result["rows"] if r["split"] == split]
        lines += ["", f"## {CORRECTED} against {REFERENCE_RECIPE} ({test}, null {null:+.3f})"
                  + (f": {SPLITS[split]}" if several else ""), "",
                  "| measure | part | family | networks | problems | diff | 95% CI | p | p Holm | verdict | MDE80 | "
                  f"networks for the paper's {effect:.3f} |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            lines.append(f"| {r['measure']} | {r['part']} | {r['family']} | {r['networks']} | "
                         f"{r['problems'] or MISSING} | {_f(r['diff'])} | [{_f(r['ci_low'])}, {_f(r['ci_high'])}] | "
                         f"{p_value(r['p'])} | {p_value(r.get('p_holm'))} | {r['verdict']} | "
                         f"{_f(r['mde80'], '{:.3f}')} | "
                         f"{_needed(r)} |")
        lines.append("")
        for metric in (FINAL, GAIN):
            z = result["between_half_z"][(split, metric)]
            halves = [r["verdict"] for r in rows if r["metric"] == metric and r["part"] != "all networks"]
            lines.append(f"Between-half z, {RECOVERY_MEASURES[metric]}: {_f(z, '{:+.2f}')} "
                         f"(z^2 {_f(None if z is None else z * z, '{:.2f}')}; 1 expected where the contrast "
                         "replicates)" + (". **The halves disagree on the verdict.**" if len(set(halves)) > 1 else "."))
    silent = result["silent"]
    lines.append("Networks with no learning signal in a compared cell (left out of the RL gain rows): "
                 + (", ".join(map(str, silent)) if silent else "none") + f" (of {k}).")
    recipes = list(result["per_network"][0]["recipes"])
    what = "final strict accuracy (before GRPO; learning-signal steps)" + (
        "; on new arithmetic, final (before)" if several else "")
    lines += ["", f"## Per network (seed): {what}", "",
              "| network | " + " | ".join(recipes) + " |", "| --- |" + " --- |" * len(recipes)]

    def cell(c) -> str:
        if c is None:
            return MISSING
        signal = "no learning signal" if no_learning_signal(c) else f"{c['learning_signal_steps']}"
        out = f"{c[FINAL]:.2f} ({c['gsm8k_strict_accuracy_before']:.2f}; {signal})"
        if several:
            out += (f"; {c['gsm8k_strict_accuracy_arithmetic']:.2f} "
                    f"({c['gsm8k_strict_accuracy_before_arithmetic']:.2f})")
        return out

    for n in result["per_network"]:
        lines.append(f"| {n['network']} | " + " | ".join(cell(n["recipes"].get(r)) for r in recipes) + " |")
    return "\n".join(lines) + "\n"


CSV_KEYS = ("model", "split", "contrast", "metric", "part", "family", "networks", "problems", "diff", "ci_low",
            "ci_high", "se", "df", "null", "p", "p_holm", "verdict", "mde80", "networks_needed")


def run(cells_csv: Path | str, items_csv: Path | str, profile: str, design: HeadlineDesign | None,
        out_md: Path | str, out_csv: Path | str | None = None, arithmetic_csv: Path | str | None = None) -> list[dict]:
    """Every model's headline rows from a run's ``cells.csv`` and ``items.csv``, written as markdown (and the
    rows as CSV).

    Args:
        cells_csv: the run's aggregated cells.
        items_csv: the run's per-problem rows (the crossed model's data).
        profile: the profile's name, for the title.
        design: the profile's headline design (None: every row secondary).
        out_md: the markdown report.
        out_csv: the rows as CSV (None: not written).
        arithmetic_csv: the run's per-problem rows on the never-trained arithmetic (``items_arithmetic.csv``;
            None: a profile that holds out questions only).
    """
    cells, items = read_csv(Path(cells_csv)), read_csv(Path(items_csv))
    models = sorted({c["model"] for c in cells})
    if not models:
        raise ValueError(f"{cells_csv}: no cells")
    arithmetic = None if arithmetic_csv is None else read_csv(Path(arithmetic_csv))
    results = [analyse(cells, items, m, design, arithmetic) for m in models]
    write_text_atomic(out_md, "\n".join(markdown(r, profile) for r in results))
    rows = [{k: r.get(k) for k in CSV_KEYS} for res in results for r in res["rows"]]
    if out_csv is not None:
        write_csv(rows, Path(out_csv))
    return rows

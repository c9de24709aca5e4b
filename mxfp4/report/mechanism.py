"""A new recipe's mechanism, before any RL cell: its arm in the pathway matrix at the stored warm starts against
plain MXFP4, BF16 and each stored correction, the network as the replicate; and the energy it removes from each
error component of the warm start's weights.

Per model and pathway (gradient: 1 - cosine to the unquantized gradient per batch; rollout: minus the
teacher-forced log-likelihood of the correct solution per prompt; entropy: the gap to the unquantized arm's
teacher-forced entropy per prompt), each arm's harm is averaged within each network (``stats.network_means``:
units are nested in the network they were measured on) and the recipe is set against each rival by
``stats.three_outcome_test`` at the margin the profile fixes for the pathway (``pathways.claims.margins``):
lower harm (recovers / beats it), higher harm (worse), or within the margin (no dominance). With fewer than two
networks the verdicts are inconclusive, and the units' paired mean within the one network is shown beside,
labelled as what it is: a statement about that network, not the model class.
"""

from __future__ import annotations

from pathlib import Path

from ..analysis.pathways.spec import RECOVERY_HARMS, UNITS
from ..config.profiles import load_profile
from ..io import write_json_atomic, write_text_atomic
from ..stats import ALPHA, nested_paired, network_contrast, three_outcome_test, three_outcome_verdict
from .formatting import MISSING, number
from .network_claims import by_network, profile_networks, read_units, unit_harms

PATHWAYS = {"gradient": "gradient", "rollout": "rollout", "entropy": "entropy_gap"}  # pathway -> its harm key
ARM_LABELS = {"none": "bf16", "all": "mxfp4"}


def arm_label(arm: str) -> str:
    """An arm's name as a reader knows it: mxfp4 for the full error, bf16 for none, else the recipe."""
    return ARM_LABELS.get(arm, arm)


def _within(per_unit: dict[str, tuple[list, list]], own: str, rival: str) -> dict | None:
    """The unit-level paired mean harm(rival) - harm(own) within the measured networks (units nested in the seeds
    they were measured on), from ``unit_harms``' arms of one pathway."""
    if own not in per_unit or rival not in per_unit:
        return None
    return nested_paired(per_unit[rival][0], per_unit[own][0], per_unit[own][1])


def mechanism_rows(units: list[dict], recipe: str, profile) -> list[dict]:
    """Per model, pathway and rival arm (MXFP4, BF16, each stored correction): the recipe's harm against the
    rival's on network means, its three-outcome verdict and the rank of the recipe among the arms."""
    design = profile.pathways.claims if profile.pathways else None
    if design is None:
        raise ValueError(f"profile {profile.name!r} fixes no margins (pathways.claims); the mechanism verdicts need "
                         "the smallest harm of interest per pathway")
    form, replicate = design.form, design.replicate
    network_of = profile_networks(profile, units)  # checks the units' seeds are the profile's either way
    out = []
    expected = {"all", "none", recipe, *profile.pathways.corrections}
    for model in sorted({r["model"] for r in units}):
        for pathway in PATHWAYS:
            have = {r["arm"] for r in units if r["model"] == model and r["pathway"] == pathway}
            missing = sorted(expected - have)
            if have and missing:
                raise ValueError(f"{model}: the {pathway} units hold no arm {', '.join(map(arm_label, missing))}; "
                                 f"accepted: the per-unit files of mxfp4 mechanism --recipe {recipe} (each arm of "
                                 "the run: mxfp4, bf16, the recipe and the profile's corrections)")
        per_unit = unit_harms(units, model, "warm", form)
        # a claim about one named model: its units are the replicates (each its own "network"); else the networks
        h = by_network(unit_harms(units, model, "warm", form, "units"), None) if replicate == "units" else \
            by_network(per_unit, network_of)
        tests = []
        for pathway, key in PATHWAYS.items():
            arms = h.get(key, {})
            if recipe not in arms:
                continue
            mean = {a: sum(v.values()) / len(v) for a, v in arms.items() if v}
            ranked = sorted(mean, key=mean.get)
            for rival in [a for a in ("all", "none") if a in arms] + sorted(a for a in arms
                                                                          if a not in ("all", "none", recipe)):
                tests.append((pathway, key, rival, mean, ranked, arms))
        family = len(tests)  # every row of the model: one Bonferroni family, each verdict and interval at its level
        level = 1 - 2 * ALPHA / family if family else 0.95
        for pathway, key, rival, mean, ranked, arms in tests:
            own = {n: -v for n, v in arms[recipe].items()}
            test = three_outcome_test(own, {rival: {n: -v for n, v in arms[rival].items()}}, design.margins[pathway])
            adjusted = {outcome: None if p is None else min(1.0, p * family) for outcome, p in
                        (("held", test["p_held"]), ("contradicted", test["p_contradicted"]),
                         ("no dominance", test["p_equivalent"]))}
            verdict, _ = three_outcome_verdict(test, adjusted if adjusted["held"] is not None else None)
            c = network_contrast(own, {n: -v for n, v in arms[rival].items()}, design.margins[pathway], level)
            out.append({"model": model, "pathway": pathway, "recipe": recipe, "rival": arm_label(rival),
                        "harm_recipe": mean[recipe], "harm_rival": mean[rival], "diff": c["diff"],
                        "ci_low": c["ci_low"], "ci_high": c["ci_high"], "level": level, "family": family,
                        "networks": c["networks"], "replicate": replicate, "verdict": _verdict_words(verdict, rival),
                        "margin": design.margins[pathway], "rank": ranked.index(recipe) + 1, "arms": len(ranked),
                        "within": _within(per_unit.get(key, {}), recipe, rival)})
    return out


def _verdict_words(verdict: str, rival: str) -> str:
    """A three-outcome verdict on "the recipe harms less than the rival", in the rival's words."""
    name = arm_label(rival)
    if verdict.startswith("held"):
        return f"lower harm than {name}" + (" (inside the margin)" if "margin" in verdict else "")
    if verdict == "contradicted":
        return f"higher harm than {name}"
    if verdict == "no dominance":
        return f"within the margin of {name}"
    return verdict



def markdown(rows: list[dict], recipe: str, profile_name: str, energy: list[dict]) -> str:
    units = bool(rows) and rows[0].get("replicate") == "units"
    about = ("About this model: its units (gradient batches, prompts) are the replicates, the column `networks` "
             "counts them. Each row: the recipe's harm against one rival arm on the pathway, the rival's harm minus "
             "the recipe's paired over the units " if units else
             "Each row: the recipe's harm against one rival arm on the pathway, averaged within each network (a warm "
             "start; units nested in it), the rival's harm minus the recipe's over the networks ")
    out = [f"# Mechanism of `{recipe}` at the stored warm starts (`{profile_name}`)", "",
           about + "(> 0: the recipe "
           "harms less) with its t interval, and the three-outcome verdict at the pathway's margin. The family is "
           "every row of the model (Bonferroni): each verdict is its one-sided test at 0.05 over the rows, and the "
           "interval printed is the two-sided one at that level (1 - 2 x 0.05 / rows), so a verdict of lower or "
           "higher harm is exactly an interval that excludes 0 on that side. "
           "`within one network` is the units' paired mean inside the measured network(s): a statement about "
           "them, not about the model class.", "",
           "| model | pathway | vs | harm (recipe / rival) | rival minus recipe [CI at the family's level] | networks "
           "| verdict "
           "| rank among arms | within the network(s): paired over units |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        w = r["within"]
        within = MISSING if w is None or w["diff"] is None else (
            f"{number(w['diff'])} [{number(w['ci_low'])}, {number(w['ci_high'])}] (n = {w['n']} {UNITS[r['pathway']]})")
        out.append(f"| {r['model']} | {r['pathway']} | {r['rival']} | {number(r['harm_recipe'], '{:.4g}')} / "
                   f"{number(r['harm_rival'], '{:.4g}')} | {number(r['diff'])} "
                   f"[{number(r['ci_low'])}, {number(r['ci_high'])}] | "
                   f"{r['networks']} | {r['verdict']} (margin {r['margin']:g}) | {r['rank']} of {r['arms']} | "
                   f"{within} |")
    levels = {r["model"]: (r["family"], r["level"]) for r in rows}
    if not energy:
        out += ["", "Error energies: not measured (mxfp4 mechanism --no-energy)."]
    out += ["", "Families: " + "; ".join(f"{m}: {k} rows, intervals at {100 * lv:.2f}%" for m, (k, lv) in
                                         levels.items()) + ".",
            "", "Harms: " + "; ".join(f"{p}: {RECOVERY_HARMS[p]}" for p in PATHWAYS) + ".", ""]
    if energy:
        form = next((e.get("form", "canonical") for e in energy if e.get("operand") != "product"), "canonical")
        out += ["## What it removes from each error component", "",
                "Error energy under plain MXFP4 -> under the recipe, pooled over the operands (float64), each "
                "decomposed in the basis the recipe quantizes it in and told to its hooks as what it is (a rotation's "
                f"energies are its own; a GEMM transform's are mapped back to the operand's own basis), in the {form} "
                "form: the first warm start's weights, and the activations of every decoder Linear recorded on its "
                "teacher-forced solutions.", "",
                "| model | operand | scale bias | deadzone | grid noise | total |",
                "| --- | --- | --- | --- | --- | --- |"]
        for e in (e for e in energy if e.get("recipe", recipe) == recipe):
            cells = []
            for c in ("scale", "dead", "grid", "total"):
                if f"energy_{c}_before" not in e:  # the GEMM product: its total alone
                    cells.append(MISSING)
                    continue
                before, after = e[f"energy_{c}_before"], e[f"energy_{c}_after"]
                cells.append(f"{before:.4g} -> {after:.4g} ({(after / before - 1) if before else 0:+.0%})")
            if "signal" in e:
                share = [e[f"energy_total_{k}"] / e["signal"] for k in ("before", "after")]
                cells[-1] += f"; {share[0]:.2%} -> {share[1]:.2%} of the exact product's energy"
            label = {"product": "GEMM product X W^T"}.get(e.get("operand"), e.get("operand", "weights"))
            out.append(f"| {e['model']} | {label} | " + " | ".join(cells) + " |")
        if any(e.get("operand") == "product" for e in energy):
            out += ["", "The GEMM product row: ||Q(X) Q(W)^T - X W^T||^2 over every decoder Linear with its recorded "
                        "activations, float64, the recipe's operands as its step quantizes them: what a change of "
                        "basis is judged by (an operand's own energies weigh its channels as the operand does)."]
        out.append("")
    return "\n".join(out)


def run(unit_files, recipe: str, profile_name: str, out_md, energy: list[dict] | None = None) -> list[dict]:
    """The mechanism report of ``recipe`` from its run's per-unit files (``mxfp4 mechanism``), written to
    ``out_md`` (and its rows beside it as JSON); the rows."""
    profile = load_profile(profile_name)
    rows = mechanism_rows(read_units(unit_files), recipe, profile)
    if not rows:
        raise ValueError(f"no arm of recipe {recipe!r} in {', '.join(map(str, unit_files))}; accepted: the per-unit "
                         "files of mxfp4 mechanism --recipe " + recipe)
    write_text_atomic(out_md, markdown(rows, recipe, profile_name, energy or []))
    write_json_atomic(Path(out_md).with_suffix(".json"), {"recipe": recipe, "profile": profile_name, "rows": rows,
                                                          "energy": energy or []})
    return rows

"""The primary claims decided with the network as the replicate, from the per-unit files alone.

Every unit (gradient batch, prompt) of the pathway matrix is nested in the network (warm start) it was measured
on: the harms of each arm are averaged per network, and each claim is decided on those network means
(``stats.three_outcome_test``, t over networks on k - 1 df) three ways, each naming the rival that decided it:
held (the claimed arm harms more than every rival), contradicted (a rival harms significantly more), no dominance
(within the margin of a rival), else not shown. Holm runs over every outcome hypothesis of the family. A
mechanism claim's rivals are the other components; whether the claimed component harms beyond its own
energy-matched control is a row of its own (the energy question). Each verdict is also decided on two halves of
the networks fixed before the run (``stats.fixed_halves``), with each contrast's between-half z.

``mxfp4 network-claims --profile P UNITS.csv ...`` recomputes every row from the stored per-unit files.
"""

from __future__ import annotations

import numpy as np
from statsmodels.stats.multitest import multipletests

from ..analysis.pathways.spec import COMPONENTS, HARMS, MAPPING, RECOVERIES, RECOVERY_HARMS, UNITS
from ..config.profiles import load_profile
from ..io import write_text_atomic
from ..layout import Layout
from ..stats import (
    ALPHA,
    OUTCOMES,
    between_half_z,
    fixed_halves,
    network_means,
    three_outcome_test,
    three_outcome_verdict,
)
from .claims import MECHANISMS, RECOVERY_CLAIMS
from .formatting import MISSING, number
from .tables import read_text_table

CORRECTION_ARMS = {"macro_block": "mxfp4+macro", "outlier_fallback": "mxfp4+fallback", "aqn": "mxfp4+aqn"}
METHOD = ("per network, the mean over its {unit} of each arm's harm ({harm}); own - rival over the {k} networks, "
          "t on {df} df; held: every rival beaten (intersection-union, the largest one-sided p); contradicted: a "
          "rival harms more (smallest one-sided p x {r} rival(s)); no dominance: within +-{margin:g} of a rival "
          "(TOST, x {r}); Holm over the family's outcome hypotheses")


def read_units(paths) -> list[dict]:
    """The per-unit files (``pathways.spec.UNIT_FIELDS``), rows with ``harm`` a float or None; a missing column
    is a ValueError naming the file."""
    rows = []
    for path in paths:
        for r in read_text_table(path, "units"):
            r["harm"] = None if r["harm"] in ("", None) else float(r["harm"])
            rows.append(r)
    return rows


def unit_harms(units: list[dict], model: str, checkpoint: str, form: str) -> dict[str, dict[str, tuple[list, list]]]:
    """{pathway: {arm: (each unit's harm, its origin)}} of one model, checkpoint and form, units in their order;
    a unit's origin is the seed whose policy it was measured on (its ``seed`` column; its ``group`` where the file
    has none). The entropy pathway's recovery harm (the gap to the unquantized arm's entropy, unit by unit) comes
    under ``entropy_gap``."""
    def origin(r):
        return r["group"] if r.get("seed") in (None, "") else r["seed"]

    per: dict = {}
    for r in units:
        if r["model"] == model and r["checkpoint"] == checkpoint and r["form"] == form:
            per.setdefault(r["pathway"], {}).setdefault(r["arm"], []).append(r)
    out: dict = {}
    for pathway, arms in per.items():
        for rows in arms.values():
            rows.sort(key=lambda r: int(r["unit"]))
        out[pathway] = {arm: ([r["harm"] for r in rows], [origin(r) for r in rows]) for arm, rows in arms.items()}
        if pathway == "entropy" and "none" in arms:
            base = {int(r["unit"]): r["harm"] for r in arms["none"]}
            out["entropy_gap"] = {
                arm: ([None if r["harm"] is None or base.get(int(r["unit"])) is None
                       else abs(r["harm"] - base[int(r["unit"])]) for r in rows], [origin(r) for r in rows])
                for arm, rows in arms.items()}
    return out


def harms_by_network(units: list[dict], model: str, checkpoint: str, form: str,
                     network_of=None) -> dict[str, dict[str, dict]]:
    """{pathway: {arm: {network: mean harm over its units}}} of one model, checkpoint and form (``unit_harms``), a
    unit's network ``network_of(its origin)``, e.g. the seed's warm start (seeds that share one pool their units in
    it; None: the origin itself)."""
    return by_network(unit_harms(units, model, checkpoint, form), network_of)


def by_network(per_unit: dict[str, dict[str, tuple[list, list]]], network_of=None) -> dict[str, dict[str, dict]]:
    """``unit_harms``' harms as {pathway: {arm: {network: mean harm over its units}}}, a unit's network
    ``network_of(its origin)`` (None: the origin itself)."""
    network_of = network_of or (lambda origin: origin)  # None: the origin is its own network
    return {pathway: {arm: network_means(harms, [network_of(o) for o in origins])
                      for arm, (harms, origins) in arms.items()}
            for pathway, arms in per_unit.items()}


def _negated(by_net: dict) -> dict:
    return {g: -v for g, v in by_net.items()}


def _decided(claim, model, pathway, family, own, rivals, margin, what, method, halves) -> dict:
    """One row: the three-outcome test on all networks, then on each fixed half, with each contrast's z."""
    test = three_outcome_test(own, rivals, margin)
    nets = sorted(own, key=lambda g: (len(str(g)), str(g)))
    first, second = halves(nets)
    parts = [three_outcome_test({g: own[g] for g in h}, rivals, margin) for h in (first, second)]
    zs = {r: between_half_z(parts[0]["contrasts"][r], parts[1]["contrasts"][r]) for r in rivals}
    decider = test["held_by"] or next(iter(rivals))
    c = test["contrasts"][decider]
    return {"claim": claim, "model": model, "pathway": pathway, "family": family, "measure": what,
            "networks": test["networks"], "diff": c["diff"], "ci_low": c["ci_low"], "ci_high": c["ci_high"],
            "test": test, "halves": parts, "half_networks": [first, second], "z": zs, "method": method,
            "margin": margin}


def claim_rows(units: list[dict], design, checkpoint: str = "warm", halves=fixed_halves,
               network_of=None) -> list[dict]:
    """The mechanism and recovery claims of every model (primary; the energy rows secondary), each decided on
    network means. ``design``: the profile's ``pathways.claims`` (form, control, margins); ``network_of``: a
    unit's network from its group (the seed), ``profile_networks`` for a profile."""
    rows = []
    for model in sorted({r["model"] for r in units}):
        h = harms_by_network(units, model, checkpoint, design.form, network_of)
        for pathway, (_, claim) in MECHANISMS.items():
            arms, top = h.get(pathway, {}), MAPPING[pathway]
            rivals = [f"+{c}" for c in COMPONENTS if c != top]
            control = f"+{top}~{design.control}"
            if f"+{top}" not in arms or any(r not in arms for r in rivals):
                continue
            margin = design.margins[pathway]
            k = len(arms[f"+{top}"])
            method = METHOD.format(unit=UNITS[pathway], harm=HARMS[pathway], k=k, df=k - 1, r=len(rivals),
                                   margin=margin)
            rows.append(_decided(claim, model, pathway, "primary", arms[f"+{top}"], {r: arms[r] for r in rivals},
                                 margin, f"harm(+{top}) minus each other component's", method, halves))
            if control in arms:
                energy = METHOD.format(unit=UNITS[pathway], harm=HARMS[pathway], k=k, df=k - 1, r=1, margin=margin)
                rows.append(_decided(f"{claim}: beyond its own {design.control} control (the energy question)",
                                     model, pathway, "secondary", arms[f"+{top}"], {control: arms[control]}, margin,
                                     f"harm(+{top}) minus harm({control})", energy, halves))
        for pathway, claim in RECOVERY_CLAIMS.items():
            arms = h.get("entropy_gap" if pathway == "entropy" else pathway, {})
            claimed = CORRECTION_ARMS[RECOVERIES[pathway]]
            rivals = ["all"] + [a for a in CORRECTION_ARMS.values() if a != claimed and a in arms]
            if claimed not in arms or "all" not in arms:
                continue
            margin = design.margins[pathway]
            k = len(arms[claimed])
            method = METHOD.format(unit=UNITS[pathway], harm=RECOVERY_HARMS[pathway], k=k, df=k - 1,
                                   r=len(rivals), margin=margin)
            rows.append(_decided(claim, model, pathway, "primary", _negated(arms[claimed]),
                                 {r: _negated(arms[r]) for r in rivals}, margin,
                                 f"each rival's harm minus {claimed}'s (all: plain MXFP4)", method, halves))
    decide(rows)
    return rows


def decide(rows: list[dict], alpha: float = ALPHA) -> None:
    """Holm over every outcome hypothesis (held, contradicted, no dominance) of each family's rows; each row's
    verdict on all networks and on each half (a half's verdict at the unadjusted level: a replication check, not
    a test of the family), flagged where the halves disagree with each other or with the whole."""
    for family in ("primary", "secondary"):
        members = [r for r in rows if r["family"] == family and r["test"]["p_held"] is not None]
        ps = [r["test"][k] for r in members for k in ("p_held", "p_contradicted", "p_equivalent")]
        adjusted = iter(multipletests(ps, alpha=alpha, method="holm")[1]) if ps else iter(())
        for r in members:
            r["p_adjusted"] = dict(zip(OUTCOMES, (float(next(adjusted)) for _ in OUTCOMES)))
    for r in rows:
        r["verdict"], r["decided_by"] = three_outcome_verdict(r["test"], r.get("p_adjusted"), alpha)
        if r["decided_by"] is not None:  # the contrast shown is the one that decided the verdict
            c = r["test"]["contrasts"][r["decided_by"]]
            r["diff"], r["ci_low"], r["ci_high"] = c["diff"], c["ci_low"], c["ci_high"]
        r["half_verdicts"] = [three_outcome_verdict(t, None, alpha)[0] for t in r["halves"]]
        base = [v.split(" (")[0] for v in (r["verdict"], *r["half_verdicts"]) if not v.startswith("inconclusive")]
        r["replicates"] = None if len(base) < 3 else len(set(base)) == 1


def mean_z2(rows: list[dict]) -> tuple[float | None, int]:
    """The mean of every contrast's squared between-half z over ``rows`` (1 expected where the contrasts
    replicate) and how many contrasts it averages."""
    zs = [z for r in rows for z in r["z"].values() if z is not None]
    return (float(np.mean(np.square(zs))) if zs else None), len(zs)



def markdown(rows: list[dict], profile: str, needed: dict[str, int] | None = None) -> str:
    """The network-level claims table: each claim's verdict with the rival that decided it, the deciding
    contrast with its 95% interval over networks, the adjusted p of each outcome, each half's verdict and the
    contrasts' between-half z; then the mean z^2. ``needed``: per '<model>: <claim>' the networks the design's
    power calculation asks for (``pathways.claims.network_power``), shown beside the networks measured."""
    out = [f"# Claims with the network as the replicate: {profile}", "",
           "Units (gradient batches, prompts) are averaged within the network (warm start) they were measured on; "
           "every test is over networks. Verdicts: **held** (the claimed arm harms more than every rival), "
           "**contradicted** (a rival harms significantly more), **no dominance** (within the margin of a rival), "
           "else not shown; each names the rival whose contrast decided it. Halves: the networks split before the "
           "run (sorted, alternately); a verdict that differs between them is flagged.", ""]
    for family in ("primary", "secondary"):
        members = [r for r in rows if r["family"] == family]
        if not members:
            continue
        out += [f"## {family.capitalize()} family", "",
                "| claim | model | networks (needed) | verdict | decided by | contrast (95% CI) "
                "| p held / contra. / no dom. (Holm) | half A | half B | z per rival | replicates |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in members:
            p = r.get("p_adjusted") or {}
            ps = " / ".join(number(p.get(k), "{:.2g}") for k in OUTCOMES)
            zs = ", ".join(f"{k}: {number(v, '{:+.2f}')}" for k, v in r["z"].items())
            flag = {None: "n/a (a half of fewer than 2 networks)", True: "yes", False: "**no: halves differ**"}
            need = (needed or {}).get(f"{r['model']}: {r['claim']}")
            out.append(f"| {r['claim']} | {r['model']} | {r['networks']} ({need or MISSING}) | {r['verdict']} "
                       f"| {r['decided_by'] or MISSING} | {number(r['diff'])} "
                       f"[{number(r['ci_low'])}, {number(r['ci_high'])}] | {ps} "
                       f"| {r['half_verdicts'][0]} | {r['half_verdicts'][1]} | {zs} | {flag[r['replicates']]} |")
        out.append("")
    z2, n = mean_z2([r for r in rows if r["family"] == "primary"])
    out += [f"Between-half replication of the primary contrasts: mean z² = {number(z2, '{:.2f}')} over {n} contrasts "
            "(1 expected where they replicate).", ""]
    if needed:
        out += ["Networks (needed): measured, and in brackets what the design's power calculation asks for (80% power "
                "on every outcome from the pilot's between-network sd at its upper 80% limit; "
                "`pathways.claims.network_power`); where more are needed than measured, \"not shown\" is the "
                "expected verdict even where the claim is true.", ""]
    out += ["Methods:", ""]
    out += sorted({f"- {r['method']}" for r in rows})
    return "\n".join(out) + "\n"


def profile_networks(profile):
    """A unit's network in ``profile``: the warm start its seed was measured from."""
    return lambda seed: profile.warm_start_of(int(seed))


def run(unit_files, profile_name: str, out_md) -> list[dict]:
    """Read the per-unit files, decide every claim as the profile's ``pathways.claims`` fixes it, write the
    table; the rows."""
    profile = load_profile(profile_name)
    design = profile.pathways.claims if profile.pathways else None
    if design is None:
        raise ValueError(f"profile {profile_name!r} fixes no claim-level tests (pathways.claims)")
    rows = claim_rows(read_units(unit_files), design, network_of=profile_networks(profile))
    if not rows:
        raise ValueError(f"no claim could be tested from {', '.join(map(str, unit_files))}: the files hold no "
                         f"warm-start units in the {design.form} form with the claimed and rival arms")
    power = design.network_power
    write_text_atomic(out_md, markdown(rows, profile_name,
                                       {k: c.networks for k, c in power.claims.items()} if power else None))
    return rows


def stored_units(layout: Layout) -> list:
    """The per-unit files a profile's stored baselines keep (``Layout.stored`` of each model's warm-start file)."""
    profile = load_profile(layout.profile)
    return [p for p in (layout.stored(layout.pathway_units(m, "warm")) for m in profile.models) if p.is_file()]


def network_summary(layouts: list[Layout]) -> str:
    """The primary claims of each profile of ``layouts`` decided with the network as the replicate, recomputed from
    its stored per-unit files, side by side (a profile that stores none says so)."""
    cols, lines, missing = [], {}, []
    for layout in layouts:
        name = layout.profile
        files = stored_units(layout)
        design = load_profile(name).pathways
        if not files or design is None or design.claims is None:
            missing.append(name)
            continue
        cols.append(name)
        for r in claim_rows(read_units(files), design.claims, network_of=profile_networks(load_profile(name))):
            if r["family"] == "primary":
                rival = f", by {r['decided_by']}" if r["decided_by"] else ""
                lines.setdefault((r["claim"], r["model"]), {})[name] = (
                    f"**{r['verdict']}**{rival} {number(r['diff'])} [{number(r['ci_low'])}, {number(r['ci_high'])}] "
                    f"({r['networks']} networks; halves: {' / '.join(r['half_verdicts'])})")
    out = []
    if cols:
        out += ["| claim | model | " + " | ".join(f"`{c}`" for c in cols) + " |",
                "| --- | --- | " + " | ".join("---" for _ in cols) + " |"]
        out += [f"| {claim} | {model} | " + " | ".join(by.get(c, "not in this profile") for c in cols) + " |"
                for (claim, model), by in lines.items()]
    if missing:
        out += ["", "No per-unit file stored (rerun the profile's pathways and store its baselines): "
                + ", ".join(f"`{m}`" for m in missing) + "."]
    return "\n".join(out) + "\n"

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

import math

import numpy as np
from scipy import stats
from statsmodels.stats.multitest import multipletests

from ..analysis.pathways.spec import (
    COMPONENTS,
    HARMS,
    MAPPING,
    MECHANISMS,
    RECOVERIES,
    RECOVERY_CLAIMS,
    RECOVERY_HARMS,
    UNITS,
)
from ..config.profiles import load_profile
from ..corrections.registry import paper_corrections
from ..io import write_text_atomic
from ..layout import Layout
from ..stats import (
    ALPHA,
    OUTCOMES,
    between_half_z,
    fixed_halves,
    half_splits,
    network_means,
    split_z,
    three_outcome_test,
    three_outcome_verdict,
)
from .formatting import MISSING, number
from .tables import read_unit_files

# What a verdict is about: the model class (independently pretrained networks are the replicates, the units
# measured in one are nested in it) or one named pretrained model (its own units are the replicates).
REPLICATES = {"networks": "about the class", "units": "about this model"}
CORRECTION_ARMS = {cls.name: cls.arm for cls in paper_corrections().values()}
METHOD = ("{per}; own - rival over the {k} {replicates}, "
          "t on {df} df; held: every rival beaten (intersection-union, the largest one-sided p); contradicted: a "
          "rival harms more (smallest one-sided p x {r} rival(s)); no dominance: within +-{margin:g} of a rival "
          "(TOST, x {r}); Holm over the family's outcome hypotheses")


def read_units(paths, models: list[str] | None = None) -> list[dict]:
    """The per-unit files (``pathways.spec.UNIT_FIELDS``), validated as one run's (``tables.read_unit_files``:
    every harm finite and in range, no unit twice, every arm on the same units), ``harm`` a float."""
    return read_unit_files(paths, models)


def unit_harms(units: list[dict], model: str, checkpoint: str, form: str, replicate: str = "networks"
               ) -> dict[str, dict[str, tuple[list, list]]]:
    """{pathway: {arm: (each unit's harm, its origin)}} of one model, checkpoint and form, units in their order;
    a unit's origin is the seed whose policy it was measured on (its ``seed`` column; its ``group`` where the file
    has none), or with ``replicate`` "units" the unit itself (``seed/u<index>``: a claim about one named model,
    whose units are its replicates). The entropy pathway's recovery harm (the gap to the unquantized arm's entropy,
    unit by unit) comes under ``entropy_gap``."""
    if replicate not in REPLICATES:
        raise ValueError(f"replicate {replicate!r}; accepted: {', '.join(REPLICATES)}")

    def origin(r):
        seed = r["group"] if r.get("seed") in (None, "") else r["seed"]
        return f"{seed}/u{int(r['unit']):05d}" if replicate == "units" else seed

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


def by_network(per_unit: dict[str, dict[str, tuple[list, list]]], network_of=None) -> dict[str, dict[str, dict]]:
    """``unit_harms``' harms as {pathway: {arm: {network: mean harm over its units}}}, a unit's network
    ``network_of(its origin)`` (None: the origin itself)."""
    network_of = network_of or (lambda origin: origin)  # None: the origin is its own network
    return {pathway: {arm: network_means(harms, [network_of(o) for o in origins])
                      for arm, (harms, origins) in arms.items()}
            for pathway, arms in per_unit.items()}


def mxfp4_harm(per_unit: dict[str, dict[str, tuple[list, list]]], pathway: str) -> tuple[list, list]:
    """MXFP4's whole harm on ``pathway`` per unit (``unit_harms``): plain MXFP4's (arm ``all``) minus the unquantized
    arm's, on the entropy pathway the gap |entropy(all) - entropy(none)|; with each unit's origin. Empty where
    either arm is missing."""
    arms = per_unit.get(pathway, {})
    if "all" not in arms or "none" not in arms:
        return [], []
    (quantized, origins), (plain, _) = arms["all"], arms["none"]
    gaps = [None if a is None or b is None else (abs(a - b) if pathway == "entropy" else a - b)
            for a, b in zip(quantized, plain, strict=True)]
    return gaps, origins


def scaled_margins(units: list[dict], fraction: float, form: str = "gain", checkpoint: str = "warm"
                   ) -> dict[str, float]:
    """Each pathway's margin as ``fraction`` of MXFP4's whole harm there (``mxfp4_harm``, the mean over every unit
    of the files' one model): the smallest difference of interest scaled to the model's own harm, fixed from a
    pilot before the confirmatory units are measured (``ClaimDesign.margin_rule``), to 3 significant digits."""
    if not 0 < fraction < 1:
        raise ValueError(f"margin fraction {fraction!r}; accepted: a number in (0, 1)")
    models = sorted({r["model"] for r in units})
    if len(models) != 1:
        raise ValueError(f"scaled margins are one model's; the files hold {models or 'none'}")
    per_unit = unit_harms(units, models[0], checkpoint, form)
    out = {}
    for pathway in MAPPING:
        gaps = [g for g in mxfp4_harm(per_unit, pathway)[0] if g is not None]
        if not gaps:
            raise ValueError(f"the pilot's units hold no {pathway} harm of both plain MXFP4 (all) and the unquantized "
                             "arm (none): no margin can be scaled to it")
        span = float(np.mean(gaps))
        if not span > 0:
            raise ValueError(f"MXFP4's mean harm on {pathway} in the pilot is {span:g}: a margin must be positive")
        out[pathway] = float(f"{fraction * span:.3g}")
    return out


def premise_row(per_unit: dict, model: str, pathway: str, design, network_of=None) -> dict:
    """The premise of every claim on ``pathway``: MXFP4's whole harm there (``mxfp4_harm``, averaged per replicate)
    is at least ``design.premise_margins`` margins, judged on its one-sided 95% lower bound over the replicates."""
    gaps, origins = mxfp4_harm(per_unit, pathway)
    network_of = network_of or (lambda o: o)
    values = list(network_means(gaps, [network_of(o) for o in origins]).values())
    need = design.premise_margins * design.margins[pathway]
    k = len(values)
    mean = float(np.mean(values)) if values else None
    low = None
    if k >= 2:
        sd = float(np.std(values, ddof=1))
        low = mean - float(stats.t.ppf(0.95, k - 1)) * sd / math.sqrt(k)
    met = None if low is None else low >= need  # None: not measurable here (too few replicates, or no MXFP4 arm)
    return {"model": model, "pathway": pathway, "harm": mean, "lower": low, "needed": need, "replicates": k,
            "met": met, "margin": design.margins[pathway], "premise_margins": design.premise_margins}


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
    replicate = design.replicate
    network_of = None if replicate == "units" else network_of  # a unit is its own replicate

    def method_of(pathway: str, harm: str, k: int, rivals: int, margin: float) -> str:
        per = (f"per {UNITS[pathway][:-1]}, each arm's harm ({harm})" if replicate == "units" else
               f"per network, the mean over its {UNITS[pathway]} of each arm's harm ({harm})")
        return METHOD.format(per=per, k=k, replicates=UNITS[pathway] if replicate == "units" else "networks",
                             df=k - 1, r=rivals, margin=margin)

    def family_of(key: str) -> str:
        """Primary, or exploratory where the design took the claim out of the primary family before the run."""
        return "exploratory" if key in design.exploratory else "primary"

    rows = []
    for model in sorted({r["model"] for r in units}):
        per_unit = unit_harms(units, model, checkpoint, design.form, replicate)
        h = by_network(per_unit, network_of)
        premises = {p: premise_row(per_unit, model, p, design, network_of) for p in MAPPING}
        for pathway, (_, claim) in MECHANISMS.items():
            arms, top = h.get(pathway, {}), MAPPING[pathway]
            rivals = [f"+{c}" for c in COMPONENTS if c != top]
            control = f"+{top}~{design.control}"
            if f"+{top}" not in arms or any(r not in arms for r in rivals):
                continue
            margin = design.margins[pathway]
            k = len(arms[f"+{top}"])
            method = method_of(pathway, HARMS[pathway], k, len(rivals), margin)
            rows.append(_decided(claim, model, pathway, family_of(f"{pathway}_claim"), arms[f"+{top}"],
                                 {r: arms[r] for r in rivals},
                                 margin, f"harm(+{top}) minus each other component's", method, halves))
            if control in arms:
                energy = method_of(pathway, HARMS[pathway], k, 1, margin)
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
            method = method_of(pathway, RECOVERY_HARMS[pathway], k, len(rivals), margin)
            rows.append(_decided(claim, model, pathway, family_of(f"{pathway}_recovery_claim"), _negated(arms[claimed]),
                                 {r: _negated(arms[r]) for r in rivals}, margin,
                                 f"each rival's harm minus {claimed}'s (all: plain MXFP4)", method, halves))
        for r in rows:
            if r["model"] == model:
                r["premise"] = premises[r["pathway"]]
    for r in rows:
        r["scope"] = REPLICATES[replicate]
        r["replicate"] = replicate
        r["analysis"] = design.analysis
    decide(rows)
    split_half_check(rows)
    return rows


FAMILIES = ("primary", "exploratory", "secondary")


def decide(rows: list[dict], alpha: float = ALPHA, also: dict[str, list[float]] | None = None) -> dict[str, list]:
    """Holm over every outcome hypothesis (held, contradicted, no dominance) of each family's rows, with ``also``'s
    p values of the same family (other tests of it, e.g. the headline); each row's verdict on all replicates and
    on each half (a half's verdict at the unadjusted level: a replication check, not a test of the family).
    Returns ``also``'s adjusted p values."""
    also = also or {}
    out: dict[str, list] = {}
    for family in FAMILIES:
        members = [r for r in rows if r["family"] == family and r["test"]["p_held"] is not None]
        extra = list(also.get(family, ()))
        ps = [r["test"][k] for r in members for k in ("p_held", "p_contradicted", "p_equivalent")] + extra
        adjusted = iter(multipletests(ps, alpha=alpha, method="holm")[1]) if ps else iter(())
        for r in members:
            r["p_adjusted"] = dict(zip(OUTCOMES, (float(next(adjusted)) for _ in OUTCOMES)))
        out[family] = [float(p) for p in adjusted]
    for r in rows:
        r["verdict"], r["decided_by"] = three_outcome_verdict(r["test"], r.get("p_adjusted"), alpha)
        if r["decided_by"] is not None:  # the contrast shown is the one that decided the verdict
            c = r["test"]["contrasts"][r["decided_by"]]
            r["diff"], r["ci_low"], r["ci_high"] = c["diff"], c["ci_low"], c["ci_high"]
        r["outcome"] = r["verdict"]  # what the test says; the verdict unless the premise fails
        premise = r.get("premise")
        if premise is not None and premise["met"] is False:  # no verdict on a pathway MXFP4 barely harms
            r["verdict"] = "premise not met"
        r["half_verdicts"] = [three_outcome_verdict(t, None, alpha)[0] for t in r["halves"]]
        r["level"] = verdict_interval(r, alpha)
    return out


def verdict_interval(r: dict, alpha: float = ALPHA) -> float:
    """Put the deciding contrast's interval at the level its verdict uses, and return that level: each outcome is
    a one-sided test (TOST for no dominance) at alpha times the contrast's own p over the outcome's adjusted p
    (Holm and the Bonferroni over rivals), so the two-sided interval at one minus twice that excludes 0 (held,
    contradicted) or lies inside the margin (no dominance) exactly when the test says so (a premise that is not
    met withholds the verdict, not the interval); where no outcome was reached, the stricter of the held and
    contradicted sides' levels, at which the interval covers 0."""
    outcome = r["outcome"].split(" (")[0]
    c = r["test"]["contrasts"].get(r["decided_by"]) if r["decided_by"] else None
    adjusted = r.get("p_adjusted") or {}
    if c is None or c.get("se") is None or not adjusted:
        return 0.95
    own = {"held": c["p_greater"], "contradicted": c["p_less"], "no dominance": c["p_equivalent"]}

    def level_of(side: str) -> float:
        return 1 - 2 * alpha * own[side] / adjusted[side] if adjusted.get(side) else 1 - 2 * alpha

    # not shown (or premise not met): the stricter of the two sides' levels, where neither side excludes 0
    level = level_of(outcome) if outcome in OUTCOMES else max(level_of("held"), level_of("contradicted"))
    if c["se"] > 0:
        q = stats.t.ppf(0.5 + level / 2, c["networks"] - 1)
        r["ci_low"], r["ci_high"] = c["diff"] - q * c["se"], c["diff"] + q * c["se"]
    return level


SPLITS = 2000  # random splits of a row's replicates when there are more than this many (else every split)


def _differences(r: dict) -> tuple[list, np.ndarray]:
    """A row's replicates (sorted) and each rival contrast's per-replicate difference (rows: rivals)."""
    per = [c["per_network"] for c in r["test"]["contrasts"].values()]
    ids = sorted(set.intersection(*(set(p) for p in per)), key=lambda g: (len(g), g))
    return ids, np.array([[p[g] for g in ids] for p in per])


def split_half_check(rows: list[dict], draws: int = SPLITS, alpha: float = ALPHA) -> None:
    """Each row's split-half replication judged against its own distribution: the largest squared between-half z
    over its rival contrasts at the fixed halves, against the same statistic over every split of the same
    replicates into halves of the fixed sizes (or ``draws`` random ones). Under one truth for both halves the
    fixed split is one draw of that distribution, so "halves differ" (the fixed split beyond its 1 - alpha
    quantile) fires with probability at most alpha. Sets ``split`` (observed, the quantile, p, splits) and
    ``replicates`` (None where a half has fewer than two replicates)."""
    for r in rows:
        ids, d = _differences(r)
        first = {str(g) for g in r["half_networks"][0]}
        r["split"], r["replicates"] = None, None
        if min(len(first), len(ids) - len(first)) < 2:
            continue
        splits = half_splits(len(ids), len(first), draws)
        fixed = np.array([[g in first for g in ids]])
        with np.errstate(all="ignore"):
            stat = np.nanmax(np.square(split_z(d, splits)), axis=1)
            observed = float(np.nanmax(np.square(split_z(d, fixed))))
        stat = stat[np.isfinite(stat)]
        if not np.isfinite(observed) or not len(stat):
            continue
        q = float(np.quantile(stat, 1 - alpha))
        p = float(np.mean(stat >= observed - 1e-12))
        r["split"] = {"observed": observed, "quantile": q, "p": p, "splits": len(splits),
                      "exact": len(splits) == math.comb(len(ids), len(first))}
        r["replicates"] = p >= alpha


def mean_z2_reference(rows: list[dict], draws: int = SPLITS, seed: int = 0) -> dict | None:
    """The mean squared between-half z over every contrast of ``rows`` under one truth: the same mean over
    ``draws`` joint splits (rows on the same replicates split together, each set of replicates on its own), as
    {mean, low, high} (its expectation and 95% range); None where no row can be split."""
    groups: dict = {}
    for r in rows:
        ids, d = _differences(r)
        first = len(r["half_networks"][0])
        if min(first, len(ids) - first) >= 2:
            groups.setdefault((tuple(ids), first), []).append(d)
    if not groups:
        return None
    rng = np.random.default_rng(seed)
    total = np.zeros(draws)
    count = np.zeros(draws)
    for (ids, first), ds in groups.items():
        splits = half_splits(len(ids), first, draws, seed)
        pick = splits[rng.integers(0, len(splits), draws)]
        with np.errstate(all="ignore"):
            z2 = np.square(split_z(np.vstack(ds), pick))
        total += np.nansum(z2, axis=1)
        count += np.sum(np.isfinite(z2), axis=1)
    means = total / np.maximum(count, 1)
    return {"mean": float(means.mean()), "low": float(np.quantile(means, 0.025)),
            "high": float(np.quantile(means, 0.975)), "draws": draws}


def mean_z2(rows: list[dict]) -> tuple[float | None, int]:
    """The mean of every contrast's squared between-half z over ``rows`` and how many contrasts it averages (its
    reference under one truth: ``mean_z2_reference``)."""
    zs = [z for r in rows for z in r["z"].values() if z is not None]
    return (float(np.mean(np.square(zs))) if zs else None), len(zs)


def replicate_noun(rows: list[dict]) -> str:
    """What the rows' n counts: networks, or units (batches and prompts) of one model."""
    return "units" if rows and rows[0].get("replicate") == "units" else "networks"


def premise_text(premise: dict) -> str:
    """A premise row in words: MXFP4's harm, its lower bound and the margins it needed."""
    if premise["met"] is None:
        return (f"not measured (MXFP4's harm over {premise['replicates']} replicates: plain MXFP4 and the "
                "unquantized arm are both needed, on at least two)")
    state = "met" if premise["met"] else "**not met**"
    return (f"{state}: MXFP4's harm {number(premise['harm'])} (95% lower bound {number(premise['lower'])}, "
            f"{premise['replicates']} replicates) against "
            f"{premise['premise_margins']:g} margins = {number(premise['needed'])}")


def interval_text(r: dict) -> str:
    """The deciding contrast with its interval at the level the verdict uses (``verdict_interval``)."""
    return (f"{number(r['diff'])} [{number(r['ci_low'])}, {number(r['ci_high'])}] "
            f"({100 * r.get('level', 0.95):.2f}%)")


def split_text(r: dict) -> str:
    """The row's split-half check in words (``split_half_check``)."""
    s = r.get("split")
    if s is None:
        return "n/a (a half of fewer than 2 replicates)"
    how = f"max z² {s['observed']:.2f}, 95% of {s['splits']} {'splits' if s['exact'] else 'random splits'} ≤ " \
          f"{s['quantile']:.2f}"
    return f"yes ({how})" if r["replicates"] else f"**no: halves differ** ({how}, p {s['p']:.2g})"


# The most replicates a design on this machine can have: 32 networks (each a pretraining of minutes) or, for the
# named model, 100 units of a pathway (a gradient batch costs about 170 s of one core over the arms).
PRACTICAL = {"networks": 32, "units": 100}


def needed_text(r: dict, needed: dict | None) -> str:
    """The n a row has and the n its power calculation asks for, saying where that is beyond the design."""
    noun = "units" if r.get("replicate") == "units" else "networks"
    need = (needed or {}).get(f"{r['model']}: {r['claim']}")
    if need is None:
        return f"{r['networks']} {noun} (no power calculation)"
    if need <= r["networks"]:
        return f"{r['networks']} {noun} (needs {need})"
    if r["verdict"].split(" (")[0] in OUTCOMES:  # decided with fewer than its calculation asked for
        return f"{r['networks']} {noun} (its calculation asked for {need})"
    if need > PRACTICAL.get(noun, 0):
        return f"{r['networks']} {noun}; undecidable at this scale, needs about {need} {noun}"
    return f"{r['networks']} {noun}; needs about {need}"


def markdown(rows: list[dict], profile: str, needed: dict[str, int] | None = None) -> str:
    """The claims table with the replicate the design names: each claim's scope (about the class or about this
    model), its premise, its verdict with the rival that decided it, the deciding contrast with its 95% interval
    over the replicates, the adjusted p of each outcome, each half's verdict and the split-half check against its
    own distribution; then the mean z^2 with its reference. ``needed``: per '<model>: <claim>' the replicates the
    design's power calculation asks for, shown beside the replicates measured."""
    noun = replicate_noun(rows)
    analysis = rows[0].get("analysis", "confirmatory") if rows else "confirmatory"
    unit_words = ("each unit (gradient batch, prompt) of the one named model is a replicate: a verdict is "
                  "about this model" if noun == "units" else
                  "units (gradient batches, prompts) are averaged within the network (warm start) they were "
                  "measured on and every test is over networks: a verdict is about the class")
    out = [f"# Claims with the {noun[:-1]} as the replicate: {profile}", "",
           f"Scope: {unit_words}. Design: {analysis}"
           + (" (committed before the units were measured)." if analysis == "confirmatory" else
              " (the premise and the split-half reference applied to units already seen).")
           + " Verdicts: **held** (the claimed arm harms more than every rival), **contradicted** (a rival harms "
           "significantly more), **no dominance** (within the margin of a rival), else not shown; each names the "
           "rival whose contrast decided it. **premise not met**: MXFP4's own harm on the pathway is not "
           "several margins large, so no verdict there says anything about the mechanism. Halves: the replicates "
           "split before the run (sorted, alternately); \"halves differ\" fires only where the fixed split is "
           "beyond 95% of every split of the same replicates (at most 5% of rows where both halves share one "
           "truth).", ""]
    premises = {(r["model"], r["pathway"]): r["premise"] for r in rows if r.get("premise")}
    if premises:
        out += ["## Premise per pathway", "", "| model | pathway | margin | premise |", "|---|---|---|---|"]
        out += [f"| {m} | {p} | {v['margin']:g} | {premise_text(v)} |" for (m, p), v in premises.items()]
        out.append("")
    for family in FAMILIES:
        members = [r for r in rows if r["family"] == family]
        if not members:
            continue
        out += [f"## {family.capitalize()} family", "",
                f"| claim | model | scope | {noun} (needed) | verdict | decided by | contrast [interval] (level) "
                "| p held / contra. / no dom. (Holm) | half A | half B | z per rival | replicates |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in members:
            p = r.get("p_adjusted") or {}
            ps = " / ".join(number(p.get(k), "{:.2g}") for k in OUTCOMES)
            zs = ", ".join(f"{k}: {number(v, '{:+.2f}')}" for k, v in r["z"].items())
            out.append(f"| {r['claim']} | {r['model']} | {r.get('scope', REPLICATES['networks'])} "
                       f"| {needed_text(r, needed)} | {r['verdict']} "
                       f"| {r['decided_by'] or MISSING} | {interval_text(r)} | {ps} "
                       f"| {r['half_verdicts'][0]} | {r['half_verdicts'][1]} | {zs} | {split_text(r)} |")
        out.append("")
    primary = [r for r in rows if r["family"] == "primary"]
    z2, n = mean_z2(primary)
    ref = mean_z2_reference(primary)
    expected = ("no split possible" if ref is None else
                f"under one truth {ref['mean']:.2f}, 95% range [{ref['low']:.2f}, {ref['high']:.2f}] (the same "
                f"mean over {ref['draws']} joint splits of the same {noun} into halves of the fixed sizes)")
    out += [f"Between-half replication of the primary contrasts: mean z² = {number(z2, '{:.2f}')} over {n} "
            f"contrasts; {expected}.", ""]
    if needed:
        out += [f"{noun.capitalize()} (needed): measured, and what the design's power calculation asks for "
                "(`pathways.claims.network_power`); where more are needed than measured, \"not shown\" is the "
                "expected verdict even where the claim is true.", ""]
    out += ["Methods:", ""]
    out += sorted({f"- {r['method']}" for r in rows})
    return "\n".join(out) + "\n"


def profile_networks(profile, units: list[dict] | None = None):
    """A unit's network in ``profile``: the warm start its seed was measured from. Given the ``units``, each is first
    checked to come from one of the profile's measured seeds: another profile's units would map onto its networks
    silently (8 networks read as one)."""
    if units is not None:
        seeds = {int(r["seed"]) for r in units if r.get("seed") not in (None, "")}
        foreign = sorted(seeds - set(profile.pathway_seeds))
        if foreign:
            raise ValueError(f"units measured at seed(s) {foreign}, which profile {profile.name!r} does not measure "
                             f"(its pathway seeds: {profile.pathway_seeds}); accepted: the per-unit files of this "
                             "profile's run (--profile names the profile they were measured under)")
        for model in sorted({r["model"] for r in units}):
            missing = sorted(set(profile.pathway_seeds) - {int(r["seed"]) for r in units
                                                           if r["model"] == model and r.get("seed") not in (None, "")})
            if missing and len(missing) < len(profile.pathway_seeds):
                raise ValueError(f"the units of {model} lack seed(s) {missing} of profile {profile.name!r}'s pathway "
                                 f"seeds {profile.pathway_seeds}: its claims would be tested on fewer networks than "
                                 "the design fixes; accepted: every seed's per-unit files")
    return lambda seed: profile.warm_start_of(int(seed))


def needed_by_claim(design) -> dict[str, int] | None:
    """Per '<model>: <claim>' the replicates the design's power calculation asks for (None: none written)."""
    power = design.network_power
    return {k: c.networks for k, c in power.claims.items()} if power else None


def run(unit_files, profile_name: str, out_md) -> list[dict]:
    """Read the per-unit files, decide every claim as the profile's ``pathways.claims`` fixes it, write the
    table; the rows."""
    profile = load_profile(profile_name)
    design = profile.pathways.claims if profile.pathways else None
    if design is None:
        raise ValueError(f"profile {profile_name!r} fixes no claim-level tests (pathways.claims)")
    units = read_units(unit_files)
    rows = claim_rows(units, design, network_of=profile_networks(profile, units))
    if not rows:
        raise ValueError(f"no claim could be tested from {', '.join(map(str, unit_files))}: the files hold no "
                         f"warm-start units in the {design.form} form with the claimed and rival arms")
    if design.replicate == "units":
        few = sorted({f"{r['pathway']} ({r['networks']} units)" for r in rows
                      if min(len(h) for h in r["half_networks"]) < 2})
        if few:
            raise ValueError(f"{', '.join(map(str, unit_files))}: too few units for two halves of at least two on "
                             f"{', '.join(few)}; accepted: at least 4 units a pathway")
    write_text_atomic(out_md, markdown(rows, profile_name, needed_by_claim(design)))
    return rows


def stored_units(layout: Layout) -> list:
    """The per-unit files a profile's stored baselines keep (``Layout.stored`` of each model's warm-start file)."""
    profile = load_profile(layout.profile)
    return [p for p in (layout.stored(layout.pathway_units(m, "warm")) for m in profile.models) if p.is_file()]


def summary_cell(r: dict, needed: dict | None) -> str:
    """One profile's verdict on one claim in the summary: the verdict with its deciding rival and contrast, the n it
    has against the n it needs, the premise where not met, and the halves' check."""
    if r["premise"]["met"] is False:
        return f"**premise not met** ({needed_text(r, needed)}; {premise_text(r['premise'])})"
    rival = f", by {r['decided_by']}" if r["decided_by"] else ""
    check = {None: "halves: n/a", True: "halves agree", False: "**halves differ**"}[r["replicates"]]
    return f"**{r['verdict']}**{rival} {interval_text(r)} ({needed_text(r, needed)}; {check})"


def network_summary(layouts: list[Layout]) -> str:
    """The primary claims of each profile of ``layouts`` decided with the replicate its design names (networks:
    about the class; units: about one named model), recomputed from its stored per-unit files, side by side, each
    row saying its scope (a profile that stores none says so)."""
    cols, lines, missing, analysis = [], {}, [], {}
    for layout in layouts:
        name = layout.profile
        files = stored_units(layout)
        design = load_profile(name).pathways
        if not files or design is None or design.claims is None:
            missing.append(name)
            continue
        cols.append(name)
        analysis[name] = design.claims.analysis
        needed = needed_by_claim(design.claims)
        units = read_units(files)
        for r in claim_rows(units, design.claims, network_of=profile_networks(load_profile(name), units)):
            if r["family"] == "primary":
                lines.setdefault((r["claim"], r["model"], r["scope"]), {})[name] = summary_cell(r, needed)
    out = []
    if cols:
        out += ["| claim | model | scope | " + " | ".join(f"`{c}` ({analysis[c]})" for c in cols) + " |",
                "| --- | --- | --- | " + " | ".join("---" for _ in cols) + " |"]
        out += [f"| {claim} | {model} | {scope} | " + " | ".join(by.get(c, "not in this profile") for c in cols)
                + " |" for (claim, model, scope), by in sorted(lines.items(), key=lambda kv: (kv[0][2], kv[0][1]))]
    if missing:
        out += ["", "No per-unit file stored (rerun the profile's pathways and store its baselines): "
                + ", ".join(f"`{m}`" for m in missing) + "."]
    return "\n".join(out) + "\n"

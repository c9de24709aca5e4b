"""The sample size of a confirmatory profile's claim-level tests, computed from a pilot run before the
confirmatory one runs, and written into its profile (``pathways.claims.power``).

Each mechanism claim is one hypothesis of the primary family, decided on one of two one-sided sides
(``mxfp4.report.claims.mechanism_rows``); the calculation sizes the side the pilot points to:

- the pilot's weakest contrast d > 0 (the claimed component beat every rival there): the held side, an
  intersection-union test of ``rivals`` one-sided paired t tests, each needing power ``power ** (1 /
  rivals)`` at effect max(d, margin) (the pilot's effect, or the smallest effect of interest where that is
  larger);
- d <= 0: the contradicted side, one one-sided test of mean < margin at effect margin - d, at level
  alpha / rivals (its Bonferroni over the rivals).

A recovery claim (``mxfp4.report.claims.recovery_claim_rows``) is sized the same way, its rivals plain MXFP4
and the other correction arms. Both at level ``alpha / family / 2``: Holm's strictest step over the primary
family, and the Bonferroni split of each claim's two sides. The spread is the pilot's sd of the weakest
contrast's per-unit differences. The units are the largest over the pilot's models; a gradient claim counts
gradient batches, the rollout and entropy claims prompts (``stats.units_for_power``, checked by simulation in
the tests)."""

from __future__ import annotations

from ..analysis.pathways.spec import MAPPING
from ..stats import units_for_power, upper_sd
from .network_claims import claim_rows
from .pathway_table import warm_claim_rows

RIVALS = 3  # a mechanism claim's: the two other components and the claimed component's own control


def claim_units(diff: float, sd: float, margin: float, alpha: float, family: int, power: float,
                rivals: int = RIVALS) -> dict:
    """The effect the claim is sized for and the units it needs (see the module docstring)."""
    level = alpha / family / 2
    if diff > 0:
        effect = max(diff, margin)
        units = units_for_power(effect, sd, level, power, comparisons=rivals)
    else:
        effect = margin - diff
        units = units_for_power(effect, sd, level / rivals, power)
    return {"effect": effect, "sd": sd, "units": units}


def _sizes(pilot_rows: list[dict], form: str, suffix: str, margins: dict[str, float], alpha: float, family: int,
           power: float, rivals: int) -> dict[str, dict]:
    """Per pathway, the largest units any model's ``<pathway><suffix>`` row of the pilot asks for."""
    sizes: dict[str, dict] = {}
    for pathway, r in warm_claim_rows(pilot_rows, form, suffix):
        if r.get("sd") in ("", None):
            continue
        need = claim_units(float(r["mean"]), float(r["sd"]), margins[pathway], alpha, family, power, rivals)
        if pathway not in sizes or need["units"] > sizes[pathway]["units"]:
            sizes[pathway] = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in need.items()}
    return sizes


def design(pilot_rows: list[dict], margins: dict[str, float], form: str, pilot: str, alpha: float = 0.05,
           family: int = 8, power: float = 0.8, corrections: int = 0) -> dict:
    """The ``pathways.claims.power`` block of a confirmatory profile from the pilot's pathway rows
    (``pathways.csv``, read by ``pathway_table.read_rows``): per pathway the largest units any model's
    claim needs, with that claim's effect and spread; with ``corrections`` (the confirmatory profile's
    correction arms), the same for each recovery claim, whose rivals are plain MXFP4 and the other arms."""
    claims = _sizes(pilot_rows, form, "_claim", margins, alpha, family, power, RIVALS)
    missing = [p for p in MAPPING if p not in claims]
    if missing:
        raise ValueError(f"the pilot {pilot!r} has no claim rows of {missing} in form {form!r} at the warm start; "
                         "accepted: a pilot run whose profile sets pathways.claims (rerun its pathways)")
    recoveries = _sizes(pilot_rows, form, "_recovery_claim", margins, alpha, family, power, corrections) \
        if corrections else {}
    missing = [p for p in MAPPING if corrections and p not in recoveries]
    if missing:
        raise ValueError(f"the pilot {pilot!r} has no recovery claim rows of {missing} at the warm start; accepted: "
                         "a pilot whose pathways.corrections hold each recovery's correction (rerun its pathways)")
    return {"pilot": pilot, "alpha": alpha, "family": family, "power": power, "claims": claims,
            "recoveries": recoveries}


def units_in(profile) -> dict[str, int]:
    """The units a profile measures at the warm start per pathway: gradient batches and prompts, over
    every measured seed (``Profile.pathway_seeds``)."""
    s = profile.pathways
    seeds = len(profile.pathway_seeds)
    return {"gradient": s.batches * seeds, "rollout": s.prompts * seeds, "entropy": s.prompts * seeds}


MIN_NETWORKS = 8  # a confirmatory design's floor, whatever a pilot's spread suggests


def network_claim_size(contrasts: dict, margin: float, alpha: float, power: float) -> dict:
    """The networks one claim needs, from a pilot's network-level contrasts (``stats.network_contrast`` per rival:
    own - rival over the pilot's networks), the between-network sd taken at its upper 80% confidence limit, every
    side of the three-outcome test powered at ``alpha`` (the claim's share of the family):

    - held: each of the R one-sided tests at power ``power ** (1 / R)``, effect max(pilot lead, margin);
    - contradicted: a rival that harms more by the margin, found by its one-sided test at ``alpha / R``;
    - no dominance: a true difference of 0 shown within the margin by TOST (each side at ``alpha / R``).
    The largest of the three, and at least ``MIN_NETWORKS``."""
    rivals = len(contrasts)
    sides = {}
    for name, c in contrasts.items():
        if c["sd"] is None or c["networks"] < 2:
            raise ValueError(f"the pilot's contrast against {name} has fewer than two networks: no between-network sd")
        sd = upper_sd(max(c["sd"], 1e-12), c["networks"])
        lead = max(c["diff"], margin)
        need = {}
        if margin > 0:  # a margin of 0 leaves no difference of interest to find on these sides
            need["contradicted"] = units_for_power(margin, sd, alpha / rivals, power)
            need["no dominance"] = units_for_power(margin, sd, alpha / rivals / 2, power ** 0.5)
        if lead > 0:
            need["held"] = units_for_power(lead, sd, alpha, power, comparisons=rivals)
        for side, n in need.items():
            if n > sides.get(side, (0, None))[0]:
                sides[side] = (n, name)
    networks = max([MIN_NETWORKS, *(n for n, _ in sides.values())])
    return {"networks": networks, "sides": {k: {"networks": n, "rival": r} for k, (n, r) in sides.items()}}


def network_design(units: list[dict], design, alpha: float = 0.05, family: int = 12, power: float = 0.8,
                   network_of=None) -> dict:
    """Per model and claim, the networks the confirmatory design needs (``network_claim_size``) from a pilot of the
    same design (its per-unit files, at least three networks), each claim tested at ``alpha / family / 3`` (Holm's
    strictest step over the family's claims, Bonferroni over each claim's three outcomes); the largest over them.
    ``network_of``: a unit's network from its group (``network_claims.profile_networks`` of the pilot)."""
    rows = [r for r in claim_rows(units, design, network_of=network_of) if r["family"] == "primary"]
    if not rows:
        raise ValueError("the pilot's per-unit files hold no claim-level test (warm start, the design's form)")
    few = sorted({r["networks"] for r in rows if r["networks"] < 3})
    if few:
        raise ValueError(f"a pilot of the design needs at least three networks per model; it has {few}")
    level = alpha / family / 3
    sizes = {f"{r['model']}: {r['claim']}": network_claim_size(r["test"]["contrasts"], r["margin"], level, power)
             for r in rows}
    return {"alpha": alpha, "family": family, "power": power, "level": level,
            "networks": max(s["networks"] for s in sizes.values()), "claims": sizes}


def own_effect_size(contrasts: dict, alpha: float, power: float) -> dict:
    """The replicates one claim needs at the pilot's own effect (a named model's design: its effect sizes are what
    the claim is about), the side the pilot points to, the sd at its upper 80% limit: held where the claimed arm led
    every rival there (each of the R one-sided tests at power ``power ** (1 / R)``, effect its lead over that rival);
    else contradicted by the rival that harmed most (one one-sided test at ``alpha / R``, effect that deficit)."""
    rivals = len(contrasts)
    if any(c["sd"] is None or c["networks"] < 2 for c in contrasts.values()):
        raise ValueError("the pilot's contrasts need at least two replicates each for a spread")
    if all(c["diff"] > 0 for c in contrasts.values()):
        n, rival = max((units_for_power(c["diff"], upper_sd(max(c["sd"], 1e-12), c["networks"]), alpha, power,
                                        comparisons=rivals), name) for name, c in contrasts.items())
        side = "held"
    else:
        rival = min(contrasts, key=lambda name: contrasts[name]["diff"])
        c = contrasts[rival]
        n = units_for_power(-c["diff"], upper_sd(max(c["sd"], 1e-12), c["networks"]), alpha / rivals, power)
        side = "contradicted"
    return {"networks": max(n, 2), "sides": {side: {"networks": max(n, 2), "rival": rival}}}


def unit_design(units: list[dict], design, alpha: float = 0.05, family: int = 6, power: float = 0.8) -> dict:
    """Per claim, the units a design about one named model needs (``own_effect_size``), from a pilot of the same
    design on the same model (its per-unit files, the unit as the replicate), each claim at ``alpha / family / 3``."""
    rows = [r for r in claim_rows(units, design) if r["family"] == "primary"]
    if not rows:
        raise ValueError("the pilot's per-unit files hold no claim-level test (warm start, the design's form)")
    level = alpha / family / 3
    sizes = {f"{r['model']}: {r['claim']}": own_effect_size(r["test"]["contrasts"], level, power) for r in rows}
    return {"pilot": None, "alpha": alpha, "family": family, "power": power, "level": level,
            "networks": max(s["networks"] for s in sizes.values()), "claims": sizes}

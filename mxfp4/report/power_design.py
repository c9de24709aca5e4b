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

from ..analysis.pathway_spec import MAPPING
from ..stats import units_for_power
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
    every seed."""
    s = profile.pathways
    seeds = len(profile.seeds)
    return {"gradient": s.batches * seeds, "rollout": s.prompts * seeds, "entropy": s.prompts * seeds}

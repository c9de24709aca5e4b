"""The outlier dose-response: where each of the paper's claims holds, as the warm start's activations go from
near-Gaussian to outlier-dominated. Every dose measures the same policy (the transform keeps the function),
the same batches and prompts; the doses differ only in where the magnitudes sit in the GEMM operands.

Per dose, model and claim: the claim-level test of the pathway matrix (``report.claims``: dominance over each
rival and the sign-flip control; the recovery claims' dominance over plain MXFP4 and the other corrections),
all of them one family under Holm; and per component its excess harm over its control, the figure."""

from __future__ import annotations

from pathlib import Path

from ..analysis.pathways.spec import HARMS, MAPPING, MECHANISMS, RECOVERIES, RECOVERY_CLAIMS, RECOVERY_HARMS
from ..config.profiles import DoseResponseSettings, Profile, dose
from ..io import write_text_atomic
from ..layout import Layout
from ..numerics.decompose import COMPONENTS
from ..stats import min_detectable_effect
from .aggregate import write_csv
from .claims import family_label, holm, settle, undecided
from .formatting import MISSING
from .pathway_table import CLAIM_PATHWAYS, checkpoint_label, estimate, read_rows, warm_claim_rows
from .plots import COLORS, error_bars, plt, save

OUTLIER_METRIC = "activation_outlier_block_fraction"


def read_doses(layout: Layout, profile: Profile, doses: list[str]) -> dict[str, list[dict]]:
    """Every model's pathway rows per dose (``doses``, in the profile's order)."""
    out = {}
    for d in doses:
        out[d] = [r for m in profile.models for r in read_rows(layout.dose_pathways(m, d))]
    return out


# The dose-response reads the pathway matrix's claim-level rows per dose (no per-unit file per dose): each claim
# one hypothesis decided on two one-sided sides, held (the claimed arm beats every rival) or below the margin (a
# rival comes within the claim's margin), Bonferroni over the two.
def _claim_level_row(r: dict, claim: str, test: str, measure: str) -> dict:
    """A primary row from a pathway matrix's claim-level row (``<pathway>_claim`` or ``_recovery_claim``):
    one hypothesis decided both ways, its p Bonferroni over the two one-sided tests (held: the claimed arm
    beats every rival; contradicted: a rival comes within the margin), ``direction`` the side with the
    smaller p."""
    held, contra = (None if r.get(k) in ("", None) else float(r[k]) for k in ("p", "p_contradicted"))
    lo, hi = (None if r[k] in ("", None) else float(r[k]) for k in ("ci_low", "ci_high"))
    sd = None if r.get("sd") in ("", None) else float(r["sd"])
    p = None if held is None or contra is None else min(1.0, 2 * min(held, contra))
    return {
        "claim": claim, "model": r["model"], "test": test, "measure": measure,
        "diff": float(r["mean"]), "ci_low": lo, "ci_high": hi, "n": int(r["n"]), "sd": sd, "p": p,
        "p_held": held, "p_contradicted": contra, "method": r["method"], "shift": 0.0,
        "direction": +1 if held is None or contra is None or held <= contra else -1,
        "mde80": min_detectable_effect(sd, int(r["n"])), "n_needed": None, "claimed_effect": None,
    }


def _warm_claim_rows(pathways: list[dict], design, suffix: str, exploratory: bool = False):
    """``warm_claim_rows`` in ``design``'s form, of the primary family or (``exploratory``) of the tests the
    design took out of it."""
    for pathway, r in warm_claim_rows(pathways, design.form, suffix):
        if (r["metric"] in design.exploratory) == exploratory:
            yield pathway, r


def mechanism_rows(pathways: list[dict], design=None, exploratory: bool = False) -> list[dict]:
    """The claim-level test of each mechanism claim per model (the pathway matrix's ``<pathway>_claim``
    rows at the warm start, in the decomposition form of ``design``, the profile's ``pathways.claims``;
    none: no rows), of the primary family or of those the design made ``exploratory``."""
    if design is None:
        return []
    return [_claim_level_row(
        r, MECHANISMS[pathway][1],
        f"{family_label(exploratory)}: dominance over each rival and its {design.control} control ({design.form} form, "
        f"warm start; contradicted below margin {design.margins[pathway]:g})",
        f"harm(+{MAPPING[pathway]}) minus its closest rival's, per unit ({HARMS[pathway]})")
        for pathway, r in _warm_claim_rows(pathways, design, "_claim", exploratory)]


def recovery_claim_rows(pathways: list[dict], design=None, exploratory: bool = False) -> list[dict]:
    """The claim-level test of each recovery claim per model (the pathway matrix's ``<pathway>_recovery_claim``
    rows at the warm start: the correction arm's harm below plain MXFP4's and each other correction arm's), of
    the primary family or of those the design made ``exploratory``."""
    if design is None:
        return []
    return [_claim_level_row(
        r, RECOVERY_CLAIMS[pathway],
        f"{family_label(exploratory)}: {RECOVERIES[pathway]} recovers more than plain MXFP4 and each other correction "
        f"arm (warm start; contradicted below margin {design.margins[pathway]:g})",
        f"closest rival's harm minus the {RECOVERIES[pathway]} arm's, per unit ({RECOVERY_HARMS[pathway]})")
        for pathway, r in _warm_claim_rows(pathways, design, "_recovery_claim", exploratory)]


def _margin_verdict(r: dict) -> str:
    """held (the claimed arm beats every rival) or a rival within the margin, on the side whose one-sided test
    rejected at the Holm-adjusted p < 0.05; otherwise not shown."""
    return undecided(r) or ("held" if r["direction"] > 0 else "contradicted (a rival within the margin)")


def claim_rows(by_dose: dict[str, list[dict]], design) -> list[dict]:
    """The claim-level test of each mechanism and recovery claim per model at each dose, decided as one family
    (Holm over doses x models x claims): the dose-response asks where each claim holds, so every dose is a
    hypothesis of its own."""
    rows = []
    for d, pathways in by_dose.items():
        channels, factor = dose(d)
        for r in mechanism_rows(pathways, design) + recovery_claim_rows(pathways, design):
            rows.append({**r, "dose": d, "channels": channels, "factor": factor})
    settle(rows, holm([r["p"] for r in rows if r["p"] is not None]), _margin_verdict)
    return rows


def outlier_fractions(by_dose: dict[str, list[dict]]) -> dict[tuple[str, str], dict]:
    """(model, dose) -> the row of the activations' outlier-block fraction the dose run measured."""
    return {(r["model"], d): r for d, rows in by_dose.items() for r in rows if r["metric"] == OUTLIER_METRIC}


def _verdict_cell(r: dict) -> str:
    short = r["verdict"].replace(" (a rival within the margin)", "")
    return f"{short}: {r['diff']:+.3g} [{r['ci_low']:+.3g}, {r['ci_high']:+.3g}], p_Holm {r['p_holm']:.2g}"


def markdown(by_dose: dict[str, list[dict]], decided: list[dict], source: str) -> str:
    """Per model: the doses (with the outlier-block fraction each gives) and, per claim, its verdict at each."""
    doses = list(by_dose)
    fractions = outlier_fractions(by_dose)
    out = ["Outlier doses: c<channels>x<factor> = that many hidden channels of every layer that many times larger, "
           "the function unchanged (mxfp4/rl/outlier_channels.py); the same policy, batches and prompts at every "
           f"dose. Published figures the doses are set against: {source}\n",
           "Activations' outlier-block fraction (median [min, max] over the GEMMs, one gradient batch):\n",
           "| model | " + " | ".join(doses) + " |", "| --- | " + " | ".join("---" for _ in doses) + " |"]
    models = list(dict.fromkeys(m for m, _ in fractions)) or list(dict.fromkeys(r["model"] for r in decided))
    for m in models:
        cells = []
        for d in doses:
            r = fractions.get((m, d))
            cells.append(MISSING if r is None else f"{float(r['mean']):.3f} [{float(r['ci_low']):.3f}, "
                                               f"{float(r['ci_high']):.3f}]")
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    out += ["", "Each claim per dose: verdict, effect [interval at the verdict's level], Holm-adjusted p over "
            f"the {sum(r['p'] is not None for r in decided)} tests of this table (doses x models x claims). "
            "Effect: the claim-level test's weakest contrast per unit (the claims table's measure); held: the "
            "claimed arm beats every rival; contradicted: a rival comes within the claim's margin (the interval "
            "lies below the margin, not necessarily below 0); "
            f"n per test: {', '.join(sorted({str(r['n']) for r in decided}))} units.\n",
            "| claim | model | " + " | ".join(doses) + " |", "| --- | --- | " + " | ".join("---" for _ in doses) + " |"]
    keyed = {(r["claim"], r["model"], r["dose"]): r for r in decided}
    for claim, model in dict.fromkeys((r["claim"], r["model"]) for r in decided):
        cells = [_verdict_cell(keyed[(claim, model, d)]) if (claim, model, d) in keyed else MISSING for d in doses]
        out.append(f"| {claim} | {model} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def excess_series(by_dose: dict[str, list[dict]], form: str, control: str) -> list[dict]:
    """Per model, pathway, component and dose: the component's excess harm over its ``control`` (mean and
    95% interval, paired over units), at the warm start in ``form``: the figure's points."""
    label = checkpoint_label("warm", form)
    out = []
    for d, rows in by_dose.items():
        for r in rows:
            pathway = r["metric"].removesuffix("_excess_harm")
            if pathway not in CLAIM_PATHWAYS or r["checkpoint"] != label or r["mean"] in ("", None):
                continue
            c = next((c for c in COMPONENTS if r["injection"] == f"+{c} vs +{c}~{control}"), None)
            if c is not None:
                mean, lo, hi = estimate(r)
                out.append({"model": r["model"], "pathway": pathway, "component": c, "dose": d, "control": control,
                            "mean": mean, "ci_low": lo, "ci_high": hi, "n": r["n"]})
    return out


def draw(series_csv, out_stem) -> list[Path]:
    """The dose-response figure from its points (``run``'s series CSV: the doses in the order the profile lists them,
    and the control each component is taken against)."""
    from .aggregate import read_csv

    series = read_csv(series_csv)
    controls = {s["control"] for s in series}
    if len(controls) != 1:
        raise ValueError(f"{series_csv}: components taken against {len(controls)} controls "
                         f"({', '.join(map(str, sorted(controls, key=str)))}); accepted: the one control "
                         "dose_response's run writes")
    return figure(series, list(dict.fromkeys(s["dose"] for s in series)), controls.pop(), out_stem)


def figure(series: list[dict], doses: list[str], control: str, out_stem: Path | str) -> list[Path]:
    """One panel per model and pathway: each component's excess harm over its control against the dose."""
    models = list(dict.fromkeys(s["model"] for s in series))
    fig, axes = plt.subplots(len(models), len(CLAIM_PATHWAYS), figsize=(4 * len(CLAIM_PATHWAYS), 3 * len(models)),
                             squeeze=False)
    for i, model in enumerate(models):
        for j, pathway in enumerate(CLAIM_PATHWAYS):
            ax = axes[i][j]
            for k, c in enumerate(COMPONENTS):
                pts = [(x, s) for x, d in enumerate(doses) for s in series
                       if (s["model"], s["pathway"], s["component"], s["dose"]) == (model, pathway, c, d)]
                if not pts:
                    continue
                ax.errorbar([x + (k - 1) * 0.08 for x, _ in pts], [s["mean"] for _, s in pts],
                            yerr=error_bars([s for _, s in pts]), marker="o", capsize=3, color=COLORS[c],
                            label=f"+{c}")
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_xticks(range(len(doses)), doses, rotation=30)
            ax.set_title(f"{model}: {pathway}", fontsize=9)
            if j == 0:
                ax.set_ylabel(f"excess harm over ~{control}")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Outlier dose-response: each component's harm beyond its energy-matched control (95% t intervals)",
                 fontsize=10)
    fig.tight_layout()
    return save(fig, out_stem)


def run(profile: Profile, settings: DoseResponseSettings, layout: Layout, out_csv=None, series_csv=None) -> list[dict]:
    """The dose-response table (CSV and markdown beside it) and the figure's points (``series_csv``, default
    ``layout.dose_response_series``) of a profile's dose runs at the doses ``settings`` (its dose-response block)
    names; the figure is drawn from the points (``draw``, the registered figure ``dose-response``)."""
    design = profile.pathways.claims if profile.pathways else None
    if design is None:
        raise ValueError(f"profile {profile.name!r} needs pathways.claims (the claim-level tests the dose-response "
                         "repeats at each dose); see experiments/profiles/dose-response.yaml")
    by_dose = read_doses(layout, profile, settings.doses)
    decided = claim_rows(by_dose, design)
    out_csv = Path(out_csv or layout.dose_response)
    write_csv(decided, out_csv)
    write_text_atomic(out_csv.with_suffix(".md"), markdown(by_dose, decided, settings.source))
    series = excess_series(by_dose, design.form, design.control)
    missing = [d for d in by_dose if d not in {s["dose"] for s in series}]
    if missing:
        raise ValueError(f"doses {', '.join(missing)}: no component's excess harm over ~{design.control} at the warm "
                         f"start ({design.form} form) in their pathway rows; accepted: dose runs of this profile")
    write_csv(series, Path(series_csv or layout.dose_response_series))
    return decided

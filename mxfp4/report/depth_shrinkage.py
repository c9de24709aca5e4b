"""The rival to the depth law (shrinkage bias, arXiv 2606.20381): E2M1 rounding shrinks magnitudes, and the
shrink compounds across layers. From the depth study's per-layer gradient measures (``analysis.depth``), each
layer's gradient norm ratio r splits exactly into a shrink and a misalignment: the regression coefficient of
the quantized gradient on the exact one, beta = <g_q, g> / |g|^2 = r cos, and 1 / cos, so log r = log beta -
log cos at every layer and, slopes being linear, the per-layer slope of log r is the slope of log beta plus
the slope of -log cos. The test, fixed before the run: at the backward site, per model, is the scale
component's shrink slope beyond its sign-flip control's more or less negative than the rounding components'
(deadzone and grid noise, each beyond its own control, summed)? Paired by gradient batch, two-sided, Holm over
the models; a tie is a tie."""

from __future__ import annotations

import math
from pathlib import Path

from ..io import write_csv_atomic, write_text_atomic
from ..stats import mean_ci, paired_diff
from .depth_table import batch_slopes as norm_ratio_slopes
from .depth_table import estimate_text, holm_verdicts, log_slope, read_units, shallow_to_deep
from .formatting import MISSING

SITE, CONTROL = "backward", "signflip"
ROUNDING = ("+dead", "+grid")
MEASURES = {"log_norm_ratio_slope": "slope of log(norm ratio)",
            "log_shrink_slope": "slope of log(shrink): beta = norm ratio x cosine",
            "neg_log_cosine_slope": "slope of -log(cosine)"}
EXCESS, CONTRAST = "log_shrink_slope_excess_over_~signflip", "scale_minus_rounding_excess_shrink"
ROW_FIELDS = ["model", "layers", "form", "site", "arm", "measure", "mean", "ci_low", "ci_high", "n", "p", "p_holm",
              "verdict", "method"]
HYPOTHESIS = ("the per-layer shrink of the gradient at the backward site (the slope of log beta, beta = norm ratio x "
              "cosine, per decoder layer from the output) is carried by scale bias, not by E2M1 rounding: the scale "
              "component's shrink slope beyond its sign-flip control's differs from the deadzone's and grid noise's "
              "summed (each beyond its own control); per model, paired by gradient batch, two-sided, Holm over the "
              "models. Verdicts: 'scale bias' (the contrast below 0), 'E2M1 rounding' (above 0), 'not shown'")


def shrink(norm_ratio: float | None, cosine: float | None) -> float | None:
    """The regression coefficient of the quantized gradient on the exact one: <g_q, g> / |g|^2."""
    return None if norm_ratio is None or cosine is None else norm_ratio * cosine


def batch_slopes(rows: list[dict]) -> dict[str, dict[int, float | None]]:
    """Per measure of ``MEASURES``, each batch's least-squares slope over the layers of ``rows`` (one model, form,
    site and arm); a batch with a shrink or cosine that is not positive has none (its log is undefined)."""
    out: dict[str, dict[int, float | None]] = {m: {} for m in MEASURES}
    out["log_norm_ratio_slope"] = norm_ratio_slopes(rows)  # the depth law's own slopes
    for b in sorted({u["batch"] for u in rows}):
        mine = [u for u in rows if u["batch"] == b]
        out["log_shrink_slope"][b] = log_slope({u["distance"]: shrink(u["norm_ratio"], u["cosine"]) for u in mine})
        inverse = {u["distance"]: None if not u["cosine"] or u["cosine"] <= 0 else 1 / u["cosine"] for u in mine}
        out["neg_log_cosine_slope"][b] = log_slope(inverse)
    return out


def _row(key: dict, measure: str, est: dict, method: str) -> dict:
    return {**key, "measure": measure, "mean": est.get("mean", est.get("diff")), "ci_low": est["ci_low"],
            "ci_high": est["ci_high"], "n": est["n"], "p": est.get("p"), "p_holm": None, "verdict": None,
            "method": method}


def summary_rows(units: list[dict]) -> list[dict]:
    """Per model, form, site and arm: the three slopes (mean and 95% t over batches); per component its shrink
    slope beyond its sign-flip control's (paired by batch); at ``SITE`` per model and form the primary contrast
    (scale's excess minus the rounding components' summed excess), Holm over the models."""
    groups: dict[tuple, list[dict]] = {}
    for u in units:
        groups.setdefault((u["model"], u["layers"], u["form"], u["site"], u["arm"]), []).append(u)
    slopes = {k: batch_slopes(v) for k, v in groups.items()}
    out = []
    for (model, layers, form, site, arm), per in slopes.items():
        key = {"model": model, "layers": layers, "form": form, "site": site, "arm": arm}
        for measure, label in MEASURES.items():
            est = mean_ci([s for s in per[measure].values() if s is not None])
            out.append(_row(key, measure, est, f"{label} per decoder layer from the output, one least-squares slope "
                                               f"a batch; mean over {est['n']} batches, 95% t"))
    for model, layers in shallow_to_deep(units):
        for form in dict.fromkeys(u["form"] for u in units):
            for site in dict.fromkeys(u["site"] for u in units):
                excess = {}
                for arm in ("+scale", *ROUNDING):
                    own = slopes.get((model, layers, form, site, arm), {}).get("log_shrink_slope", {})
                    ctl = slopes.get((model, layers, form, site, f"{arm}~{CONTROL}"), {}).get("log_shrink_slope", {})
                    if not own or not ctl:
                        continue
                    excess[arm] = {b: None if own[b] is None or ctl.get(b) is None else own[b] - ctl[b] for b in own}
                    d = paired_diff([own[b] for b in own], [ctl.get(b) for b in own])
                    out.append(_row({"model": model, "layers": layers, "form": form, "site": site, "arm": arm}, EXCESS,
                                    d, f"per batch: shrink slope({arm}) - shrink slope({arm}~{CONTROL}); mean over "
                                       f"{d['n']} batches, paired t"))
                if site != SITE or set(excess) != {"+scale", *ROUNDING}:
                    continue
                batches = sorted(excess["+scale"])
                rounding = [_sum(excess[a].get(b) for a in ROUNDING) for b in batches]
                d = paired_diff([excess["+scale"][b] for b in batches], rounding)
                out.append(_row({"model": model, "layers": layers, "form": form, "site": site,
                                 "arm": "+scale vs +dead & +grid"}, CONTRAST, d,
                                f"per batch: scale's excess shrink slope - (deadzone's + grid noise's); mean over "
                                f"{d['n']} batches, paired t, two-sided p, Holm over the models"))
    holm_verdicts([r for r in out if r["measure"] == CONTRAST], below="scale bias", above="E2M1 rounding")
    return out


def _sum(values) -> float | None:
    values = list(values)
    return None if any(v is None for v in values) else math.fsum(values)


def markdown(rows: list[dict]) -> str:
    """The primary family, then per site and model each arm's three slopes and each component's excess shrink."""
    keyed = {(r["model"], r["form"], r["site"], r["arm"], r["measure"]): r for r in rows}
    models = shallow_to_deep(rows)
    out = [f"**Hypothesis (fixed before the run):** {HYPOTHESIS}.\n",
           "The units are gradient batches drawn on one warm start per model: the verdicts are about these "
           "networks.\n",
           "| model | layers | form | n | +scale excess shrink | +dead & +grid excess shrink | contrast | p | "
           "p (Holm) | verdict |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in (r for r in rows if r["measure"] == CONTRAST):
        scale = keyed.get((r["model"], r["form"], r["site"], "+scale", EXCESS))
        parts = [keyed.get((r["model"], r["form"], r["site"], a, EXCESS)) for a in ROUNDING]
        rounding = "; ".join(f"{a} {estimate_text(p)}" for a, p in zip(ROUNDING, parts))
        p = MISSING if r["p"] is None else f"{r['p']:.2g}"
        q = MISSING if r["p_holm"] is None else f"{r['p_holm']:.2g}"
        out.append(f"| {r['model']} | {r['layers']} | {r['form']} | {r['n']} | {estimate_text(scale)} | {rounding} | "
                   f"{estimate_text(r)} | {p} | {q} | {r['verdict']} |")
    arms = list(dict.fromkeys(r["arm"] for r in rows if r["measure"] in MEASURES))
    out += ["", "Each arm's slope of log(norm ratio) per decoder layer = the slope of log(shrink) + the slope of "
            "-log(cosine), exactly (mean and 95% t interval over batches; the two parts are each batch's own).", "",
            "| site | form | model | layers | arm | log(norm ratio) | log(shrink) | -log(cosine) | excess shrink over "
            "~signflip |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for site in dict.fromkeys(r["site"] for r in rows):
        for form in dict.fromkeys(r["form"] for r in rows):
            for model, layers in models:
                for arm in arms:
                    cells = [estimate_text(keyed.get((model, form, site, arm, m))) for m in MEASURES]
                    if cells == [MISSING] * 3:
                        continue
                    extra = estimate_text(keyed.get((model, form, site, arm, EXCESS)))
                    out.append(f"| {site} | {form} | {model} | {layers} | {arm} | " + " | ".join(cells) +
                               f" | {extra} |")
    return "\n".join(out) + "\n"


def run(unit_csvs, out_csv) -> list[dict]:
    """The shrinkage table (CSV, and markdown beside it) from every model's depth unit CSV."""
    rows = summary_rows(read_units(unit_csvs))
    out_csv = Path(out_csv)
    write_csv_atomic(out_csv, rows, ROW_FIELDS)
    write_text_atomic(out_csv.with_suffix(".md"), markdown(rows))
    return rows

"""The depth law's slopes, table and figure, from every model's per-layer gradient measures (``analysis.depth``):
per batch the least-squares slope of log(norm ratio) against the layer's distance from the output, the slope's
mean and t interval over batches."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
from statsmodels.stats.multitest import multipletests

from ..io import write_csv_atomic, write_text_atomic
from ..stats import ALPHA, mean_ci
from .formatting import MISSING
from .plots import error_bars, plt, save

SLOPE = "log_norm_ratio_slope"
ROW_FIELDS = ["model", "layers", "form", "arm", "site", "measure", "distance", "mean", "ci_low", "ci_high", "n",
              "method"]


def log_slope(ratio_by_distance: dict[int, float]) -> float | None:
    """Least-squares slope of log(norm ratio) against the distance from the output: log of the per-layer gain
    a product of gains would give. None with fewer than two layers or a ratio that is not positive."""
    pts = [(d, r) for d, r in sorted(ratio_by_distance.items()) if r is not None]
    if len(pts) < 2 or any(r <= 0 for _, r in pts):
        return None
    d = np.array([p[0] for p in pts], dtype=float)
    y = np.log([p[1] for p in pts])
    return float(np.polyfit(d, y, 1)[0])


def summary_rows(units: list[dict]) -> list[dict]:
    """Per model, form, arm and site: per distance the mean norm ratio and cosine over batches (95% t), and
    the slope of log(norm ratio) per layer, one slope a batch, its mean and 95% t interval over batches."""
    groups: dict[tuple, list[dict]] = {}
    for u in units:
        groups.setdefault((u["model"], u["layers"], u["form"], u["arm"], u["site"]), []).append(u)
    out = []
    for (model, layers, form, arm, site), rows in groups.items():
        key = {"model": model, "layers": layers, "form": form, "arm": arm, "site": site}
        for distance in sorted({u["distance"] for u in rows}):
            at = [u for u in rows if u["distance"] == distance]
            for measure in ("norm_ratio", "cosine"):
                est = mean_ci([u[measure] for u in at])
                out.append({**key, "measure": measure, "distance": distance, **_estimate(est),
                            "method": f"mean over {est['n']} gradient batches, 95% t"})
        slopes = batch_slopes(rows)
        est = mean_ci([s for s in slopes.values() if s is not None])
        out.append({**key, "measure": SLOPE, "distance": None, **_estimate(est),
                    "method": f"least-squares slope of log(norm ratio) against layers from the output, one a batch; "
                              f"mean over {est['n']} batches, 95% t (per-layer gain = exp(slope))"})
        if "~" in arm:  # the component's slope beyond its control's (this arm), paired by batch
            own = batch_slopes(groups.get((model, layers, form, arm.split("~")[0], site), []))
            diffs = [own[b] - slopes[b] for b in slopes if own.get(b) is not None and slopes[b] is not None]
            est = mean_ci(diffs)
            out.append({**key, "arm": arm.split("~")[0], "measure": f"log_norm_ratio_slope_excess_over_~"
                        f"{arm.split('~')[1]}", "distance": None, **_estimate(est),
                        "method": f"per batch: slope(component) - slope(its control); mean over {est['n']} batches, "
                                  "95% t"})
    return out


def holm_verdicts(primary: list[dict], below: str, above: str) -> None:
    """Holm over the primary contrasts that have a p (statsmodels); each row's verdict names the side its mean
    falls on (``below`` 0 or ``above``) where its adjusted p is under ``ALPHA``, else "not shown"."""
    tested = [r for r in primary if r["p"] is not None]
    if tested:
        for r, q in zip(tested, multipletests([r["p"] for r in tested], alpha=ALPHA, method="holm")[1]):
            r["p_holm"] = float(q)
    for r in primary:
        if r["p_holm"] is None or r["p_holm"] >= ALPHA:
            r["verdict"] = "not shown"
        else:
            r["verdict"] = below if r["mean"] < 0 else above


def batch_slopes(rows: list[dict]) -> dict[int, float | None]:
    """Each batch's ``log_slope`` over the layers of ``rows`` (one model, form, arm and site)."""
    return {b: log_slope({u["distance"]: u["norm_ratio"] for u in rows if u["batch"] == b})
            for b in sorted({u["batch"] for u in rows})}


def _estimate(est: dict) -> dict:
    return {"mean": est["mean"], "ci_low": est["ci_low"], "ci_high": est["ci_high"], "n": est["n"]}


def read_units(paths) -> list[dict]:
    """Every model's unit rows, numbers typed."""
    out = []
    for path in paths:
        for r in csv.DictReader(Path(path).open()):
            out.append({**r, "layers": int(r["layers"]), "batch": int(r["batch"]), "layer": int(r["layer"]),
                        "distance": int(r["distance"]),
                        **{k: None if r[k] == "" else float(r[k]) for k in ("norm_ratio", "cosine")}})
    return out


def shallow_to_deep(rows: list[dict]) -> list[tuple[str, int]]:
    """(model, layers) grouped by architecture (the name without its -l<layers> suffix), shallow to deep."""
    return sorted({(r["model"], r["layers"]) for r in rows}, key=lambda m: (re.sub(r"-l\d+$", "", m[0]), m[1]))


def estimate_text(r: dict | None) -> str:
    """A table row's mean and interval as the depth tables print them ("—" where there is none)."""
    if r is None or r["mean"] is None:
        return MISSING
    ci = "" if r["ci_low"] is None else f" [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}]"
    return f"{r['mean']:+.4f}{ci}"


def markdown(rows: list[dict]) -> str:
    """Per site and model (shallow to deep): each arm's slope of log(norm ratio) per layer and each component's
    slope beyond its control's, with the t interval over batches and its n."""
    slopes = [r for r in rows if r["distance"] is None]
    arms = list(dict.fromkeys(r["arm"] for r in slopes if r["measure"] == SLOPE))
    excess = list(dict.fromkeys(r["measure"] for r in slopes if r["measure"] != SLOPE))
    columns = [(a, SLOPE) for a in arms] + [(a, m) for m in excess for a in ("+scale", "+dead", "+grid")]
    heads = [a if m == SLOPE else f"{a} beyond {m.rsplit('_', 1)[-1]}" for a, m in columns]
    out = ["| site | form | model | layers | n | " + " | ".join(heads) + " |",
           "| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in heads) + " |"]
    keyed = {(r["site"], r["form"], r["model"], r["arm"], r["measure"]): r for r in slopes}
    models = shallow_to_deep(slopes)
    for site in dict.fromkeys(r["site"] for r in slopes):
        for form in dict.fromkeys(r["form"] for r in slopes):
            for model, layers in models:
                n = next((r["n"] for k, r in keyed.items() if k[:3] == (site, form, model)), MISSING)
                cells = [estimate_text(keyed.get((site, form, model, a, m))) for a, m in columns]
                out.append(f"| {site} | {form} | {model} | {layers} | {n} | " + " | ".join(cells) + " |")
    return ("Slope of log(gradient norm ratio to the unquantized gradient) per decoder layer counted from the output "
            "(a product of per-layer gains g gives log g; 0: no compounding), one least-squares slope per gradient "
            "batch, mean and 95% t interval over batches (n). 'beyond ~k': the component's slope minus its "
            "control's, paired by batch.\n\n" + "\n".join(out) + "\n")


def figure(rows: list[dict], out_stem, arm: str = "+scale", control: str = "+scale~signflip", column: str = "site",
           quantity: str = "gradient") -> list[Path]:
    """Norm ratio (top) and cosine (bottom) of ``quantity`` against the layer's distance from the output, one
    panel per value of ``column`` (the site, or the optimizer): ``arm`` (solid) and its ``control`` (dashed) for
    every model, 95% t intervals over the units."""
    per_layer = [r for r in rows if r["distance"] is not None]
    panels = list(dict.fromkeys(r[column] for r in per_layer))
    models = shallow_to_deep(per_layer)
    fig, axes = plt.subplots(2, len(panels), figsize=(5 * len(panels), 7), squeeze=False)
    cmap = plt.get_cmap("tab10")
    for j, panel in enumerate(panels):
        for i, measure in enumerate(("norm_ratio", "cosine")):
            ax = axes[i][j]
            for k, (model, _) in enumerate(models):
                for a, style in ((arm, "-"), (control, "--")):
                    pts = sorted((r for r in per_layer if (r["model"], r[column], r["arm"], r["measure"]) ==
                                  (model, panel, a, measure) and r["mean"] is not None), key=lambda r: r["distance"])
                    if not pts:
                        continue
                    ax.errorbar([p["distance"] for p in pts], [p["mean"] for p in pts], yerr=error_bars(pts), ls=style,
                                marker="o", ms=3, capsize=2, color=cmap(k), label=f"{model} {a}")
            ax.set_xlabel("decoder layers from the output")
            ax.set_ylabel(f"{quantity} norm ratio" if measure == "norm_ratio" else f"{quantity} cosine")
            ax.set_title(f"{column} {panel}", fontsize=9)
            if measure == "norm_ratio":
                ax.set_yscale("log")
    axes[0][0].legend(fontsize=6)
    fig.suptitle(f"Depth: {arm} (solid) against {control} (dashed) per layer", fontsize=10)
    fig.tight_layout()
    return save(fig, out_stem)


def run(unit_csvs, out_csv) -> list[dict]:
    """The depth table (CSV and markdown beside it) from every model's unit CSV; its figure is drawn from the CSV
    (``draw``, the registered figure ``depth``)."""
    rows = summary_rows(read_units(unit_csvs))
    out_csv = Path(out_csv)
    write_csv_atomic(out_csv, rows, ROW_FIELDS)
    write_text_atomic(out_csv.with_suffix(".md"), markdown(rows))
    return rows


def draw(depth_csv, out_stem) -> list[Path]:
    """The depth figure from the depth table (``run``'s CSV): every site's norm ratio and cosine per layer."""
    from .aggregate import read_csv

    return figure(read_csv(depth_csv), out_stem)

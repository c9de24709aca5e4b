"""The depth study's short runs (``analysis.depth.run_depth_optimizers``): does the scale term's per-layer
gain reach the weights? Per run, the least-squares slope of log(displacement norm ratio to the unquantized
run) against the layer's distance from the output; the scale component's slope beyond its sign-flip control's
under each optimizer; and the test fixed in the profile before the run: that excess is lower under SGD than
under AdamW (paired by run, Holm over the models), as it is when Adam divides a per-layer gain out."""

from __future__ import annotations

import csv
from pathlib import Path

from ..io import write_csv_atomic, write_text_atomic
from ..stats import mean_ci, paired_diff
from .depth_table import estimate_text, figure, holm_verdicts, log_slope, shallow_to_deep
from .formatting import MISSING

ARM, CONTROL = "+scale", "+scale~signflip"
SLOPE, EXCESS, CONTRAST = "log_norm_ratio_slope", "slope_excess_over_control", "sgd_minus_adamw_excess"
ROW_FIELDS = ["model", "layers", "optimizer", "arm", "measure", "distance", "mean", "ci_low", "ci_high", "n", "p",
              "p_holm", "verdict", "method"]
HYPOTHESIS = ("Adam divides the scale term's per-layer gain out of the update: the scale component's slope of "
              "log(displacement norm ratio) per layer, beyond its sign-flip control's, is lower under SGD than "
              "under AdamW (paired by run; Holm over the models)")


def read_units(paths) -> list[dict]:
    """Every model's short-run rows, numbers typed."""
    out = []
    for path in paths:
        for r in csv.DictReader(Path(path).open()):
            out.append({**r, "layers": int(r["layers"]), "run": int(r["run"]), "layer": int(r["layer"]),
                        "distance": int(r["distance"]), "lr": float(r["lr"]),
                        **{k: None if r[k] == "" else float(r[k]) for k in ("norm_ratio", "cosine")}})
    return out


def run_slopes(units: list[dict]) -> dict[tuple, float | None]:
    """(model, optimizer, arm, run) -> the run's slope of log(displacement norm ratio) over its layers."""
    groups: dict[tuple, dict[int, float]] = {}
    for u in units:
        groups.setdefault((u["model"], u["optimizer"], u["arm"], u["run"]), {})[u["distance"]] = u["norm_ratio"]
    return {k: log_slope(v) for k, v in groups.items()}


def _row(key: dict, measure: str, distance, est: dict, method: str) -> dict:
    """A table row from ``mean_ci``'s estimate (its mean) or ``paired_diff``'s (its diff and p)."""
    return {**key, "measure": measure, "distance": distance, "mean": est.get("mean", est.get("diff")),
            "ci_low": est["ci_low"], "ci_high": est["ci_high"], "n": est["n"], "p": est.get("p"), "p_holm": None,
            "verdict": None, "method": method}


def _by_run(slopes: dict, model: str, optimizer: str, arm: str) -> dict[int, float | None]:
    return {k[3]: v for k, v in slopes.items() if k[:3] == (model, optimizer, arm)}


def summary_rows(units: list[dict]) -> list[dict]:
    """Per model, optimizer and arm: the mean norm ratio and cosine per distance and the mean slope (95% t over
    runs); per model and optimizer the scale component's slope beyond its control's; per model the primary
    contrast (SGD's excess minus AdamW's, paired by run), its Holm-adjusted p over the models and verdict."""
    out = []
    slopes = run_slopes(units)
    models = shallow_to_deep(units)
    optimizers = list(dict.fromkeys(u["optimizer"] for u in units))
    arms = list(dict.fromkeys(u["arm"] for u in units))
    for model, layers in models:
        excess = {}
        for optimizer in optimizers:
            key = {"model": model, "layers": layers, "optimizer": optimizer}
            for arm in arms:
                mine = [u for u in units if (u["model"], u["optimizer"], u["arm"]) == (model, optimizer, arm)]
                for distance in sorted({u["distance"] for u in mine}):
                    at = [u for u in mine if u["distance"] == distance]
                    for measure in ("norm_ratio", "cosine"):
                        est = mean_ci([u[measure] for u in at])
                        out.append(_row({**key, "arm": arm}, measure, distance, est,
                                        f"displacement against the unquantized run's; mean over {est['n']} runs, "
                                        "95% t"))
                est = mean_ci([s for s in _by_run(slopes, model, optimizer, arm).values() if s is not None])
                out.append(_row({**key, "arm": arm}, SLOPE, None, est,
                                f"least-squares slope of log(displacement norm ratio) against layers from the output, "
                                f"one a run; mean over {est['n']} runs, 95% t"))
            own, control = _by_run(slopes, model, optimizer, ARM), _by_run(slopes, model, optimizer, CONTROL)
            runs = sorted(own)
            excess[optimizer] = {r: None if own[r] is None or control.get(r) is None else own[r] - control[r]
                                 for r in runs}
            d = paired_diff([own[r] for r in runs], [control.get(r) for r in runs])
            out.append(_row({**key, "arm": ARM}, EXCESS, None, d,
                            f"per run: slope({ARM}) - slope({CONTROL}); mean over {d['n']} runs, paired t"))
        if {"sgd", "adamw"} <= set(excess):
            runs = sorted(excess["sgd"])
            d = paired_diff([excess["sgd"][r] for r in runs], [excess["adamw"].get(r) for r in runs])
            out.append(_row({"model": model, "layers": layers, "optimizer": "sgd-adamw", "arm": ARM}, CONTRAST, None,
                            d, f"per run: SGD's excess slope - AdamW's (same batches); mean over {d['n']} runs, "
                               "paired t, two-sided p, Holm over the models"))
    holm_verdicts([r for r in out if r["measure"] == CONTRAST], below="held", above="contradicted")
    return out


def markdown(rows: list[dict]) -> str:
    """The primary family (one contrast a model), then each optimizer's slopes and excess per model."""
    keyed = {(r["model"], r["optimizer"], r["arm"], r["measure"]): r for r in rows if r["distance"] is None}
    models = shallow_to_deep([r for r in rows if r["distance"] is None])
    optimizers = [o for o in dict.fromkeys(r["optimizer"] for r in rows) if o != "sgd-adamw"]
    out = [f"**Hypothesis (fixed before the run):** {HYPOTHESIS}.\n",
           "| model | layers | n runs | SGD excess - AdamW excess | p | p (Holm) | verdict |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for model, layers in models:
        r = keyed.get((model, "sgd-adamw", ARM, CONTRAST))
        if r is None:
            continue
        p = MISSING if r["p"] is None else f"{r['p']:.2g}"
        q = MISSING if r["p_holm"] is None else f"{r['p_holm']:.2g}"
        out.append(f"| {model} | {layers} | {r['n']} | {estimate_text(r)} | {p} | {q} | {r['verdict']} |")
    out += ["", "Per optimizer: each arm's slope of log(displacement norm ratio to the unquantized run) per decoder "
            "layer from the output (mean and 95% t interval over runs), and the scale component's slope beyond its "
            "control's (paired by run).", "",
            "| optimizer | model | layers | n | " + f"{ARM} | {CONTROL} | {ARM} beyond control |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for optimizer in optimizers:
        for model, layers in models:
            own = keyed.get((model, optimizer, ARM, SLOPE))
            if own is None:
                continue
            out.append(f"| {optimizer} | {model} | {layers} | {own['n']} | {estimate_text(own)} | "
                       f"{estimate_text(keyed.get((model, optimizer, CONTROL, SLOPE)))} | "
                       f"{estimate_text(keyed.get((model, optimizer, ARM, EXCESS)))} |")
    return "\n".join(out) + "\n"


def run(unit_csvs, out_csv) -> list[dict]:
    """The short runs' table (CSV and markdown beside it) from every model's unit CSV; its figure is drawn from the
    CSV (``draw``, the registered figure ``depth-optimizers``)."""
    units = read_units(unit_csvs)
    rows = summary_rows(units)
    out_csv = Path(out_csv)
    write_csv_atomic(out_csv, rows, ROW_FIELDS)
    rates = sorted({(u["optimizer"], u["lr"]) for u in units})
    note = ("\nRates: adamw at GRPO's rate; sgd per run at the rate whose first unquantized step moves the weights as "
            f"far as AdamW's (from {min(lr for o, lr in rates if o == 'sgd'):.3g} to "
            f"{max(lr for o, lr in rates if o == 'sgd'):.3g}).\n") if any(o == "sgd" for o, _ in rates) else ""
    write_text_atomic(out_csv.with_suffix(".md"), markdown(rows) + note)
    return rows


def draw(optimizers_csv, out_stem) -> list[Path]:
    """The short runs' figure from their table (``run``'s CSV): each optimizer's displacement per layer."""
    from .aggregate import read_csv

    return figure(read_csv(optimizers_csv), out_stem, column="optimizer", quantity="displacement")

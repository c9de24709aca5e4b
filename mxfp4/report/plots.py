"""Figures (matplotlib, PNG and PDF), each readable on its own: title, units, legend."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..layout import REFERENCE_RECIPE  # noqa: E402
from ..numerics.decompose import PAIRS  # noqa: E402
from ..stats import mean_ci  # noqa: E402
from .aggregate import PROBLEM_TYPES, RL_GAIN_PER_PROBLEM, read_csv, typed  # noqa: E402
from .formatting import MISSING
from .pathway_table import estimate, main_site, read_rows  # noqa: E402
from .tables import read_report, read_table  # noqa: E402

COLORS = {"scale": "#d62728", "dead": "#1f77b4", "grid": "#2ca02c", "cross": "#7f7f7f"}


def save(fig, out_stem: Path | str) -> list[Path]:
    """Write ``out_stem``.png and .pdf; returns both paths."""
    out_stem = Path(out_stem)
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [out_stem.with_suffix(".png"), out_stem.with_suffix(".pdf")]
    for p in paths:
        fig.savefig(p, dpi=150, bbox_inches="tight")
    plt.close(fig)
    return paths


def decomposition_shares(proofs_json: Path | str, out_stem: Path | str) -> list[Path]:
    """Energy shares of the three components per distribution and format (default scale rule, float32):
    left the canonical split with its cross term, right the order-free Shapley split."""
    report = read_report(proofs_json, "proofs")
    cases = [c for c in report["cases"] if c["dtype"] == "float32" and c["scale_rule"] in ("floor", "nearest")
             and c.get("form", "canonical") == "canonical"]
    formats = list(dict.fromkeys(c["format"] for c in cases))
    dists = list(dict.fromkeys(c["distribution"] for c in cases))
    fig, axes = plt.subplots(len(formats), 2, figsize=(13, 2.6 * len(formats)), squeeze=False, sharex=True,
                             layout="constrained")
    for row, fmt in enumerate(formats):
        by_dist = {c["distribution"]: c for c in cases if c["format"] == fmt}
        for col, (prefix, title) in enumerate((("share_", "canonical path (D, G, S)"), ("shapley_share_", "Shapley"))):
            ax = axes[row][col]
            bottom_pos = [0.0] * len(dists)
            bottom_neg = [0.0] * len(dists)
            parts = ["scale", "dead", "grid"] + (["cross"] if prefix == "share_" else [])
            for part in parts:
                key = "cross_share" if part == "cross" else prefix + part
                vals = [by_dist[d][key] for d in dists]
                bottoms = [bn if v < 0 else bp for v, bp, bn in zip(vals, bottom_pos, bottom_neg)]
                ax.bar(range(len(dists)), vals, bottom=bottoms, color=COLORS[part], label=part)
                for i, v in enumerate(vals):
                    if v < 0:
                        bottom_neg[i] += v
                    else:
                        bottom_pos[i] += v
            ax.axhline(1.0, color="k", lw=0.6, ls=":")
            ax.set_title(f"{fmt}: {title}", fontsize=9)
            ax.set_ylabel("share of error energy")
            ax.set_xticks(range(len(dists)), dists, rotation=30, ha="right", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, fontsize=9)
    fig.suptitle("Decomposition of block-quantization error energy (cross term = total minus the three energies)")
    return save(fig, out_stem)


RECIPE_COLORS = {REFERENCE_RECIPE: "#000000", "mxfp4": "#d62728", "mxfp4+macro": "#ff7f0e", "mxfp4+fallback": "#1f77b4",
                 "mxfp4+aqn": "#9467bd", "mxfp4+all": "#2ca02c"}


def _color(recipe: str, i: int) -> str:
    return RECIPE_COLORS.get(recipe, f"C{i % 10}")


def correction_effects(corrections_json: Path | str, out_stem: Path | str) -> list[Path]:
    """Relative change of each component's energy (and the deadzone fraction) per correction and source."""
    rows = read_report(corrections_json, "corrections")
    sources = list(dict.fromkeys(r["source"] for r in rows))
    corrs = list(dict.fromkeys(r["correction"] for r in rows))
    keys = [("energy_scale", "scale-bias energy"), ("deadzone_fraction", "deadzone fraction"),
            ("energy_grid", "grid-noise energy"), ("energy_total", "total error energy")]
    fig, axes = plt.subplots(
        1,
        len(keys),
        figsize=(4.2 * len(keys), 0.45 * len(sources) * len(corrs) / 2 + 2.5),
        sharey=True,
        layout="constrained",
    )
    height = 0.8 / len(corrs)
    for ax, (key, label) in zip(axes, keys):
        for j, corr in enumerate(corrs):
            vals = []
            for s in sources:
                r = next(r for r in rows if r["source"] == s and r["correction"] == corr)
                before = r[f"{key}_before"]
                vals.append(100 * (r[f"{key}_after"] - before) / before if before else 0.0)
            ax.barh([i + j * height for i in range(len(sources))], vals, height=height, label=corr, color=f"C{j}")
        ax.axvline(0, color="k", lw=0.6)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("change vs plain MXFP4 (%)")
    axes[0].set_yticks([i + 0.4 - height / 2 for i in range(len(sources))], sources, fontsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(corrs), fontsize=8)
    fig.suptitle("Each correction's effect on the components of MXFP4 error (negative = smaller)")
    return save(fig, out_stem)


def training_curves(steps_csv: Path | str, out_stem: Path | str) -> list[Path]:
    """Reward, entropy, KL, gradient cosine and the probes' decomposition shares per step, per recipe: mean over
    seeds with a 95% t interval (a panel whose measure no cell logged is left out)."""
    rows = read_table(steps_csv, "steps")
    cells_csv = Path(steps_csv).with_name("cells.csv")  # aggregate writes both: held-out accuracy before and after
    cells = read_table(cells_csv, "cells") if cells_csv.is_file() else []
    return curves_figure(rows, cells, out_stem)


def curves_figure(rows: list[dict], cells: list[dict], out_stem: Path | str, title: str = "") -> list[Path]:
    """``training_curves`` of step rows and cell rows as ``aggregate.read_cells`` gives them."""
    models = sorted({r["model"] for r in rows})
    recipes = list(dict.fromkeys(r["recipe"] for r in rows))
    metrics = [
        ("heldout", "held-out accuracy (lm-eval, greedy): before and after RL"),
        ("reward", "reward (rollout accuracy), 5-step running mean"),
        ("entropy", "policy entropy (nats/token), 5-step running mean"),
        ("kl", "KL to the reference policy, 5-step running mean"),
        ("grad_cosine", "gradient cosine vs BF16 shadow"),
        ("weight_share_scale", "scale-bias share of the weights' MXFP4 error (probes)"),
        ("act_share_dead", "deadzone share of the activations' MXFP4 error (probes)"),
        ("grad_share_scale", "scale-bias share of the gradients' MXFP4 error (probes)"),
    ]
    metrics = [(k, label) for k, label in metrics if k == "heldout" or any(r.get(k) is not None for r in rows)]
    fig, axes = plt.subplots(
        len(metrics), len(models), figsize=(6 * len(models), 3 * len(metrics)), squeeze=False, layout="constrained"
    )
    for col, model in enumerate(models):
        for row, (key, label) in enumerate(metrics):
            ax = axes[row][col]
            for i, recipe in enumerate(recipes):
                if key == "heldout":
                    _heldout(ax, [c for c in cells if c["model"] == model and c["recipe"] == recipe],
                             max((r["step"] for r in rows if r["model"] == model), default=1), _color(recipe, i),
                             recipe, 0.15 * (i - (len(recipes) - 1) / 2))
                    continue
                pts = _per_step(rows, model, recipe, key, SMOOTHED.get(key, 1))
                if not pts:
                    continue
                xs = sorted(pts)
                ci = [mean_ci(pts[x]) for x in xs]
                ax.plot(xs, [c["mean"] for c in ci], color=_color(recipe, i), label=recipe,
                        marker="o" if key not in SMOOTHED else None, ms=3)
                band = [(x, c) for x, c in zip(xs, ci) if c["ci_low"] is not None]
                if band:
                    ax.fill_between([x for x, _ in band], [c["ci_low"] for _, c in band],
                                    [c["ci_high"] for _, c in band], color=_color(recipe, i), alpha=0.15)
            ax.set_title(f"{model}: {label}", fontsize=9)
            ax.set_xlabel("GRPO step")
        axes[0][col].legend(fontsize=7)
    fig.suptitle(title or "GRPO training curves per recipe (line: mean over seeds; band: 95% t interval over seeds)")
    return save(fig, out_stem)


ACCURACY_STAGES = [  # (cells.csv column, label, style: how the recipe's colour fills the bar)
    ("gsm8k_strict_accuracy_before", "before RL (quantized)", "faded"),
    ("gsm8k_strict_accuracy", "after RL (quantized)", "solid"),
    ("gsm8k_strict_accuracy_unquantized", "after RL, unquantized", "hatched"),
]


SMOOTHED = {"reward": 5, "entropy": 5, "kl": 5}  # noisy per-step values (4 prompts a step): a trailing running mean


def _per_step(rows, model, recipe, key, window: int = 1) -> dict[int, list[float]]:
    """{step: [value of each seed]} of one model and recipe; with ``window`` > 1 each seed's series is
    first replaced by its trailing running mean over that many steps."""
    import pandas as pd

    series: dict = {}
    for r in rows:
        if r["model"] == model and r["recipe"] == recipe and r.get(key) is not None:
            series.setdefault(r["seed"], {})[r["step"]] = r[key]
    pts: dict[int, list[float]] = {}
    for by_step in series.values():
        s = pd.Series(by_step).sort_index().rolling(window, min_periods=1).mean()
        for step, v in s.items():
            pts.setdefault(int(step), []).append(float(v))
    return pts


def _heldout(ax, cells, last_step, color, label, shift):
    """Held-out strict accuracy before RL (step 0) and after (the last step): mean and 95% t interval
    over seeds, joined by a line."""
    pts = [(x, mean_ci([c.get(key) for c in cells]))
           for x, key in ((0, "gsm8k_strict_accuracy_before"), (last_step, "gsm8k_strict_accuracy"))]
    pts = [(x + shift, s) for x, s in pts if s["mean"] is not None]
    if not pts:
        return
    ax.errorbar([x for x, _ in pts], [s["mean"] for _, s in pts], fmt="o-", color=color, label=label, capsize=3,
                yerr=error_bars([s for _, s in pts]))


def _yerr(s: dict) -> list[list[float]]:
    """Matplotlib's [[below], [above]] error bar of a ``mean_ci`` summary (zero without an interval)."""
    if s["ci_low"] is None:
        return [[0.0], [0.0]]
    return [[s["mean"] - s["ci_low"]], [s["ci_high"] - s["mean"]]]


def error_bars(summaries: list[dict]) -> list[list[float]]:
    """Matplotlib's [[below...], [above...]] error bars of a line of summaries (each with mean, ci_low, ci_high;
    zero where one has no interval)."""
    bars = [_yerr(s) for s in summaries]
    return [[b[0][0] for b in bars], [b[1][0] for b in bars]]


def _bar(ax, x, values, color, width, style="solid", label=None):
    s = mean_ci(values)
    if s["mean"] is None:
        return None
    err = _yerr(s) if s["ci_low"] is not None else None
    fill = {"solid": {"color": color}, "faded": {"color": color, "alpha": 0.35},
            "hatched": {"facecolor": "white", "edgecolor": color, "hatch": "///"}}[style]
    ax.bar(x, s["mean"], width, yerr=err, capsize=3, label=label, **fill)
    return s


def accuracy_bars(cells_csv: Path | str, out_stem: Path | str) -> list[Path]:
    """Per recipe, GSM8K strict accuracy before RL, after RL and after RL unquantized (top), and the RL
    gain, after minus before (middle), with 95% t intervals over seeds; BF16's as reference lines. Where
    ``summary.csv`` beside the cells has per-problem-type rows (the embedded problems: the planted flaws and
    the rest), the RL gain per type and recipe at the bottom, with its interval over problems and seeds."""
    rows = read_table(cells_csv, "cells")
    models = sorted({r["model"] for r in rows})
    recipes = list(dict.fromkeys(r["recipe"] for r in rows))
    typed_gains = _typed_gains(Path(cells_csv).with_name("summary.csv"))
    panels = 3 if typed_gains else 2
    fig, axes = plt.subplots(panels, len(models), figsize=(6.5 * len(models), 3.5 * panels), squeeze=False,
                             layout="constrained")
    width = 0.27
    for col, model in enumerate(models):
        if typed_gains:
            _typed_gain_bars(axes[2][col], model, recipes, typed_gains)
        top, bottom = axes[0][col], axes[1][col]
        for i, recipe in enumerate(recipes):
            cells = [r for r in rows if r["model"] == model and r["recipe"] == recipe]
            for j, (key, label, style) in enumerate(ACCURACY_STAGES):
                _bar(top, i + (j - 1) * width, [r.get(key) for r in cells], _color(recipe, i), width, style,
                     label if i == 0 else None)
            gain = _bar(bottom, i, [r.get("gsm8k_rl_gain") for r in cells], _color(recipe, i), 0.6)
            if recipe == REFERENCE_RECIPE and gain is not None:
                bottom.axhline(gain["mean"], color="k", ls="--", lw=0.8, label="bf16 mean gain")
        bottom.axhline(0, color="k", lw=0.5)
        for ax in (top, bottom):
            ax.set_xticks(range(len(recipes)), recipes, rotation=25, ha="right", fontsize=8)
            ax.set_xlim(-0.6, len(recipes) - 0.4)
        top.set_ylabel("GSM8K strict-match accuracy")
        top.set_title(f"{model}: accuracy before and after GRPO (lm-eval; 95% t CI over seeds)", fontsize=9)
        bottom.set_ylabel("RL gain (after minus before, points of accuracy)")
        bottom.set_title(f"{model}: RL gain, paired by seed (95% t CI over seeds)", fontsize=9)
        top.legend(fontsize=7)
        bottom.legend(fontsize=7)
    fig.suptitle(
        "GSM8K strict accuracy (lm-eval gsm8k task), the same held-out problems at every stage:\nthe warm start and "
        "the trained policy through the recipe's quantized forward, and the trained weights unquantized"
    )
    return save(fig, out_stem)


def _typed_gains(summary_csv: Path) -> dict[tuple[str, str, str], dict]:
    """(model, recipe, problem type) -> the summary's RL gain row of that type (empty without typed rows)."""
    if not summary_csv.is_file():
        return {}
    names = {typed(RL_GAIN_PER_PROBLEM, k): k for k in PROBLEM_TYPES}
    return {(r["model"], r["recipe"], names[r["metric"]]): r for r in read_table(summary_csv, "summary")
            if r["metric"] in names}


def _typed_gain_bars(ax, model: str, recipes: list[str], gains: dict) -> None:
    kinds = list(dict.fromkeys(k for m, _, k in gains if m == model))
    width = 0.8 / max(1, len(kinds))
    for j, kind in enumerate(kinds):
        pts = [(i + (j - (len(kinds) - 1) / 2) * width, gains[(model, recipe, kind)])
               for i, recipe in enumerate(recipes) if (model, recipe, kind) in gains]
        if pts:
            ax.bar([x for x, _ in pts], [r["mean"] for _, r in pts], width, yerr=error_bars([r for _, r in pts]),
                   capsize=2, color=f"C{j}", label=f"{kind} problems (n = {pts[0][1]['n']} problem-seed pairs)")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xticks(range(len(recipes)), recipes, rotation=25, ha="right", fontsize=8)
    ax.set_xlim(-0.6, len(recipes) - 0.4)
    ax.set_ylabel("RL gain (points of accuracy)")
    ax.set_title(f"{model}: RL gain per problem type, paired by problem and seed\n(95% interval; problems and "
                 "seeds crossed random factors)", fontsize=8)
    ax.legend(fontsize=7)


def _bar_groups(ax, rows, label_of, group_of, title):
    groups = list(dict.fromkeys(group_of(r) for r in rows))
    labels = list(dict.fromkeys(label_of(r) for r in rows))
    width = 0.8 / len(labels)
    for j, label in enumerate(labels):
        pts = [
            (i + j * width, r["fraction"])
            for i, g in enumerate(groups)
            for r in rows
            if group_of(r) == g and label_of(r) == label
        ]
        if pts:
            ax.bar(*zip(*pts), width=width, label=label, color=f"C{j % 10}", hatch="//" if j >= 10 else None)
    ax.axhline(1.0, color="k", linestyle="--", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], groups, fontsize=7, rotation=20, ha="right")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, ncol=2)


def kernel_throughput(bench_json: Path | str, out_stem: Path | str) -> list[Path]:
    """Each path as a fraction of a ceiling measured in the same run: the copy bandwidth of the same
    bytes (memory-bound paths) and cuBLAS BF16 on the same shape (GEMMs)."""
    report = json.loads(Path(bench_json).read_text())
    rows = report["rows"]
    if any("fraction" not in r for r in rows):
        raise ValueError(f"{bench_json}: rows without 'fraction' (written by an older bench_kernels.py); rerun it")
    memory = [r for r in rows if r.get("kind", "memory") == "memory"]
    gemm = [r for r in rows if r.get("kind") == "gemm" and r["path"] != "cuBLAS bf16"]
    panels = [p for p in (memory, gemm) if p]
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 4.2 * len(panels)), layout="constrained", squeeze=False)
    shape = lambda r: "x".join(map(str, r["shape"]))  # noqa: E731
    if memory:
        ax = axes[0, 0]
        _bar_groups(
            ax,
            memory,
            lambda r: f"{r['path']} (axis {r.get('axis', -1)})",
            lambda r: f"{shape(r)} bf16",
            "memory-bound paths / copy bandwidth of the same bytes (dashed: the ceiling)",
        )
        ax.set_ylabel("fraction of copy bandwidth")
    if gemm:
        ax = axes[-1, 0]
        _bar_groups(
            ax,
            gemm,
            lambda r: r["path"],
            lambda r: f"{r.get('model_shape', '')} {shape(r)}",
            "GEMMs y = x W^T (MxNxK) / cuBLAS bf16 on the same shape (dashed: parity)",
        )
        ax.set_ylabel("fraction of cuBLAS bf16 TFLOP/s")
    fig.suptitle(f"MXFP4 kernels on {report['device']} ({report.get('method', '')[:90]}...)", fontsize=9)
    return save(fig, out_stem)


VERDICT_COLORS = {"better": "#2ca02c", "worse": "#d62728", "higher": "#9467bd", "lower": "#9467bd"}


def compare_figure(rows: list[dict], recipe: str, out_stem: Path | str) -> list[Path]:
    """The primary contrasts of a compare report, readable without the table: per model (rows) and
    measure (columns), one bar per reference: the recipe minus that reference (its own row, labelled
    "minus <reference>"), with the adjusted interval of that contrast, tested against 0 (no difference from
    the row's reference). Colour is the verdict; each label gives the adjusted p."""
    primary = [r for r in rows if r["part"] == "primary" and r["diff"] is not None]
    models = list(dict.fromkeys(r["model"] for r in primary)) or ["(no primary contrast)"]
    measures = list(dict.fromkeys(r["metric"] for r in primary)) or ["gsm8k_strict_accuracy"]
    fig, axes = plt.subplots(len(models), len(measures), figsize=(5.2 * len(measures), 2.2 + 1.1 * len(models)),
                             squeeze=False, layout="constrained")
    for i, model in enumerate(models):
        for j, measure in enumerate(measures):
            ax = axes[i][j]
            sel = [r for r in primary if r["model"] == model and r["metric"] == measure]
            ax.set_title(f"{model}: {measure}", fontsize=9)
            if not sel:
                ax.set_axis_off()
                continue
            ax.axvline(0, color="gray", lw=0.8)
            for k, r in enumerate(reversed(sel)):
                err = None if r["ci_low"] is None else [[r["diff"] - r["ci_low"]], [r["ci_high"] - r["diff"]]]
                color = VERDICT_COLORS.get(r["verdict"], "k")
                ax.errorbar(r["diff"], k, xerr=err, fmt="o", color=color, capsize=3)
                p = MISSING if r.get("p_adj") is None else f"{r['p_adj']:.2g}"
                ax.annotate(f"{r['verdict']}, adj. p {p} (n = {r['n_a']} {r['unit']})", (r["diff"], k),
                            xytext=(0, 7), textcoords="offset points", ha="center", fontsize=7, color=color)
            ax.set_yticks(range(len(sel)), [f"{recipe}\nminus {r['baseline']}" for r in reversed(sel)], fontsize=8)
            ax.set_ylim(-0.6, len(sel) - 0.1)
            ax.set_xlabel("difference from the row's reference (0: none)", fontsize=8)
    fig.suptitle(f"{recipe}: primary contrasts (intervals at the level of their family-adjusted verdicts)")
    return save(fig, out_stem)


PATHWAY_PANELS = (  # (metric, x label, transform of a grad cosine into harm)
    ("grad_cosine", "1 - gradient cosine vs unquantized (batches)", True),
    ("rollout_accuracy_diff", "rollout accuracy minus unquantized (paired, prompts)", False),
    ("entropy_diff", "token entropy minus unquantized (paired, prompts)", False),
)


def pathway_matrix(pathways_csv: Path | str, out_stem: Path | str) -> list[Path]:
    """The pathway matrix: rows the injection arms, columns the three pathways (effects against the
    unquantized arm with 95% intervals; one marker per model and checkpoint), and the gradient
    cosine by layer depth per injected component."""
    rows = read_rows(pathways_csv)
    arms = ["+scale", "+dead", "+grid", "all", "-scale", "-dead", "-grid"]
    series = list(dict.fromkeys((r["model"], r["checkpoint"]) for r in rows))
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.2), layout="constrained")
    arm_color = {"+scale": COLORS["scale"], "+dead": COLORS["dead"], "+grid": COLORS["grid"], "all": "k"}
    for ax, (metric, label, harm) in zip(axes, PATHWAY_PANELS):
        for k, (model, ckpt) in enumerate(series):
            off = (k - (len(series) - 1) / 2) * 0.8 / max(len(series), 1)
            for i, arm in enumerate(arms):
                sel = [
                    r
                    for r in rows
                    if r["model"] == model
                    and r["checkpoint"] == ckpt
                    and r["injection"] == arm
                    and r["metric"] == metric
                    and r["layer"] == "total"
                    and r["site"] == main_site(metric)
                    and r["mean"]
                ]
                if not sel:
                    continue
                m, lo, hi = estimate(sel[0], flip=harm)
                err = None if lo is None else [[m - lo], [hi - m]]
                ax.errorbar(
                    m,
                    i + off,
                    xerr=err,
                    fmt="osD^v<>"[k % 7],
                    color=arm_color.get(arm, "#9467bd"),
                    capsize=2,
                    ms=4,
                    label=f"{model} / {ckpt}" if i == 0 else None,
                )
        ax.set_yticks(range(len(arms)), arms)
        ax.invert_yaxis()
        ax.axvline(0, color="gray", lw=0.6)
        ax.set_xlabel(label, fontsize=8)
    axes[0].set_title("gradient accuracy (claimed: scale)", fontsize=9)
    axes[1].set_title("rollout quality (claimed: deadzone)", fontsize=9)
    axes[2].set_title("policy entropy (claimed: grid)", fontsize=9)
    handles = [
        plt.Line2D([], [], ls="", marker="osD^v<>"[k % 7], color="gray", label=f"{m} / {c}")
        for k, (m, c) in enumerate(series)
    ]
    axes[0].legend(handles=handles, fontsize=7, loc="lower right")
    ax = axes[3]
    for k, (model, ckpt) in enumerate(series):
        for arm in ("+scale", "+dead", "+grid", "all"):
            sel = [
                r
                for r in rows
                if r["model"] == model
                and r["checkpoint"] == ckpt
                and r["injection"] == arm
                and r["metric"] == "grad_cosine"
                and r["layer"].startswith("layer")
                and r["site"] == "both"
                and r["mean"]
            ]
            sel.sort(key=lambda r: int(r["layer"][5:]))
            if sel:
                ax.plot(
                    [int(r["layer"][5:]) for r in sel],
                    [float(r["mean"]) for r in sel],
                    marker="osD^v<>"[k % 7],
                    color=arm_color[arm],
                    ls=("-", ":", "--", "-.")[k % 4],
                    lw=1,
                    ms=3,
                    label=f"{arm} ({model}/{ckpt})",
                )
    ax.set_xlabel("layer (input side = 0)")
    ax.set_ylabel("gradient cosine (mean over batches)")
    ax.set_title("gradient cosine by depth, per injected component", fontsize=9)
    ax.legend(fontsize=5, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("Pathway matrix: each MXFP4 error component injected alone (+c), MXFP4 (all), MXFP4 without it (-c)")
    return save(fig, out_stem)


ATTRIBUTION_PATHWAYS = (("gradient", "gradient accuracy (claimed: scale)"),
                        ("rollout", "rollout quality (claimed: deadzone)"),
                        ("entropy", "policy entropy (claimed: grid)"))


def pathway_attribution(pathways_csv: Path | str, out_stem: Path | str) -> list[Path]:
    """Top: each component's excess harm over its energy-matched controls (paired, 95% t intervals), the
    sign-flip control first (the primary one); bottom: the Shapley values of the eight-arm game and its
    interaction (bootstrap intervals). One marker per model, checkpoint and form; harm = ``HARMS``."""
    rows = [r for r in read_rows(pathways_csv) if r["mean"] not in ("", None)]
    series = list(dict.fromkeys((r["model"], r["checkpoint"]) for r in rows))
    fig, axes = plt.subplots(2, 3, figsize=(16, 7), layout="constrained")
    components = ("scale", "dead", "grid")
    for j, (pathway, title) in enumerate(ATTRIBUTION_PATHWAYS):
        top, bottom = axes[0][j], axes[1][j]
        for k, (model, ckpt) in enumerate(series):
            mine = [r for r in rows if (r["model"], r["checkpoint"]) == (model, ckpt)]
            marker = "osD^v<>"[k % 7]
            off = (k - (len(series) - 1) / 2) * 0.7 / max(len(series), 1)
            for i, c in enumerate(components):
                for dy, kind in ((-0.2, "signflip"), (0.0, "gaussian"), (0.2, "permuted")):
                    hit = [r for r in mine if r["metric"] == f"{pathway}_excess_harm"
                           and r["injection"] == f"+{c} vs +{c}~{kind}"]
                    if hit:
                        _errorbar(top, hit[0], i + off + dy, COLORS[c], marker, fill=kind == "signflip")
            for i, name in enumerate((*components, "interaction")):
                hit = [r for r in mine if r["metric"] == f"{pathway}_shapley" and r["injection"] == f"shapley:{name}"]
                if hit:
                    _errorbar(bottom, hit[0], i + off, COLORS.get(name, COLORS["cross"]), marker, fill=True)
        top.set_yticks(range(3), [f"+{c}" for c in components])
        bottom.set_yticks(range(4), [*components, "interaction"])
        for ax in (top, bottom):
            ax.invert_yaxis()
            ax.axvline(0, color="gray", lw=0.6)
        top.set_title(f"{title}: excess harm over the matched control", fontsize=9)
        top.set_xlabel("harm(+c) - harm(+c~control): filled = sign-flip (primary), open = Gaussian, then permuted",
                       fontsize=8)
        bottom.set_title(f"{title}: Shapley value of each component", fontsize=9)
        bottom.set_xlabel("share of harm(all) - harm(none), bootstrap 95% interval", fontsize=8)
    handles = [plt.Line2D([], [], ls="", marker="osD^v<>"[k % 7], color="gray", label=f"{m} / {c}")
               for k, (m, c) in enumerate(series)]
    axes[0][0].legend(handles=handles, fontsize=7, loc="lower right")
    fig.suptitle("Which component, not how much error: excess harm over energy-matched controls, and Shapley values")
    return save(fig, out_stem)


def _errorbar(ax, r: dict, y: float, color: str, marker: str, fill: bool) -> None:

    m, lo, hi = estimate(r)
    err = None if lo is None else [[m - lo], [hi - m]]
    ax.errorbar(m, y, xerr=err, fmt=marker, color=color, mfc=color if fill else "white", capsize=2, ms=4)


def component_cosines(weight_components_csv: Path | str, out_stem: Path | str) -> list[Path]:
    """The analogue of the paper's Figure 1: per decomposition form (columns) and model (colours), the
    distribution over weight tensors of the pairwise cosine similarity of the three components."""
    import csv

    rows = list(csv.DictReader(Path(weight_components_csv).open()))
    forms = list(dict.fromkeys(r["form"] for r in rows))
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(forms), figsize=(6.5 * len(forms), 3.6), squeeze=False, sharey=True,
                             layout="constrained")
    for ax, form in zip(axes[0], forms):
        for k, model in enumerate(models):
            sel = [r for r in rows if r["form"] == form and r["model"] == model]
            data = [[float(r[f"cosine_{a}_{b}"]) for r in sel] for a, b in PAIRS]
            pos = [i + (k - (len(models) - 1) / 2) * 0.3 for i in range(len(PAIRS))]
            parts = ax.violinplot(data, positions=pos, widths=0.25, showmedians=True)
            for body in parts["bodies"]:
                body.set_color(("#1f77b4", "#ff7f0e", "#2ca02c")[k % 3])
            ax.plot([], [], color=("#1f77b4", "#ff7f0e", "#2ca02c")[k % 3], label=f"{model} ({len(sel)} tensors)")
        ax.set_xticks(range(len(PAIRS)), [f"cos(e_{a}, e_{b})" for a, b in PAIRS])
        ax.axhline(0, color="gray", lw=0.6)
        ax.set_title(f"{form} form", fontsize=10)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("cosine similarity over a weight tensor")
    fig.suptitle("Pairwise cosine of the error components over every quantized weight tensor (MXFP4)")
    return save(fig, out_stem)


REGIME_PANELS = [  # (regime.csv column, axis label, log scale)
    ("excess_kurtosis", "excess kurtosis (0: Gaussian)", True),
    ("max_over_median", "max / median |x|", True),
    ("outlier_block_fraction", "blocks with one outlier (max >= 2x second)", False),
    ("deadzone_fraction", "deadzone fraction (flushed to 0)", False),
    ("shapley_share_scale", "Shapley share of scale bias", False),
]
OPERAND_STYLE = {"weight": ("#7f7f7f", "s"), "activation": ("#1f77b4", "o"), "grad": ("#d62728", "^")}


def regime_statistics(regime_csv: Path | str, out_stem: Path | str) -> list[Path]:
    """Per model (columns) and statistic (rows): every GEMM operand's value by layer depth, weights,
    activations and gradients; the published figures for real LLMs are in regime.md beside the CSV."""
    rows = [r for r in read_csv(regime_csv) if r.get("elements")]
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(len(REGIME_PANELS), len(models), figsize=(5.5 * len(models), 2.6 * len(REGIME_PANELS)),
                             squeeze=False, layout="constrained", sharex="col")
    for col, model in enumerate(models):
        for row, (key, label, log) in enumerate(REGIME_PANELS):
            ax = axes[row][col]
            for operand, (color, marker) in OPERAND_STYLE.items():
                sel = [r for r in rows if r["model"] == model and r["operand"] == operand and r.get(key) is not None]
                if not sel:
                    continue
                xs = [(r["depth"] if r["depth"] is not None else -1) + 0.15 * list(OPERAND_STYLE).index(operand)
                      for r in sel]
                ys = [abs(r[key]) if log else r[key] for r in sel]
                ax.scatter(xs, ys, color=color, marker=marker, s=14, alpha=0.7, label=operand)
            if log:
                ax.set_yscale("log")
            ax.set_ylabel(label + (" (abs, log)" if key == "excess_kurtosis" else ""), fontsize=8)
            if row == 0:
                ax.set_title(model, fontsize=9)
                ax.legend(fontsize=7)
        depths = sorted({r["depth"] for r in rows if r["model"] == model and r["depth"] is not None})
        axes[-1][col].set_xticks(depths)
        axes[-1][col].set_xlabel("decoder layer (one point per GEMM of the layer)")
    fig.suptitle("Regime statistics of the GEMM operands MXFP4 quantizes (one GRPO batch, full precision); "
                 "published figures for real LLMs: regime.md")
    return save(fig, out_stem)

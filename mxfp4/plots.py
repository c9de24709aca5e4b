"""Figures (matplotlib, PNG and PDF), each readable on its own: title, units, legend."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

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
    report = json.loads(Path(proofs_json).read_text())
    cases = [c for c in report["cases"] if c["dtype"] == "float32" and c["scale_rule"] in ("floor", "nearest")]
    formats = list(dict.fromkeys(c["format"] for c in cases))
    dists = list(dict.fromkeys(c["distribution"] for c in cases))
    fig, axes = plt.subplots(len(formats), 2, figsize=(13, 2.6 * len(formats)), squeeze=False, sharex=True)
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
    axes[0][0].legend(fontsize=8, ncol=4)
    fig.suptitle("Decomposition of block-quantization error energy (cross term = total minus the three energies)")
    return save(fig, out_stem)

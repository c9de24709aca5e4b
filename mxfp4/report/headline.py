"""The headline about one named model: does a W4A4 recipe's GRPO end within BF16's own seed-to-seed band?

The replicates are the model's GRPO seeds (the same pretrained weights, a seed's prompts and samples) and its
held-out problems, crossed: every problem is scored under every seed of every recipe. Two tests, fixed before the
run (the profile's comment):

- **The band**, in the manner of MLPerf's reference convergence points: the BF16 seeds' final strict accuracies.
  A recipe is inside it where its seed mean is at least the lowest BF16 seed's (better than BF16 is inside).
- **The crossed test**: per (problem, seed), the recipe's final strict accuracy minus BF16's, on the crossed
  random-effects model (``stats.crossed_mean``: problems and seeds both random, Satterthwaite df), against the margin
  of BF16's own seed-to-seed standard deviation: "within the band" where the two-sided 95% interval lies above
  -margin, "outside the band" where it lies below, else "undecided" (the same bar on both sides). The same test on
  each of the two halves of the seeds fixed before the run (``stats.fixed_halves``), with the between-half z judged
  against its own expected spread (|z| above 1.96: the halves differ).

A seed with no learning-signal step keeps its final accuracy: no RL happened there, and that is the recipe's harm.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..io import write_text_atomic
from ..layout import REFERENCE_RECIPE
from ..stats import between_half_z, crossed_differences, fixed_halves
from .aggregate import read_csv, write_csv
from .formatting import formatter

FINAL = "gsm8k_strict_accuracy"
Z_BOUND = 1.959963984540054  # the two-sided 95% bound a between-half z has under replication
STEP_CURVES = {"reward": "reward", "rollout accuracy": "rollout_accuracy", "entropy": "entropy",
               "KL to the reference": "kl"}  # steps.csv's columns


def band(cells: list[dict], model: str) -> dict:
    """The BF16 seeds' final strict accuracies: each, their mean, standard deviation and lowest."""
    acc = {int(c["seed"]): float(c[FINAL]) for c in cells if c["model"] == model and c["recipe"] == REFERENCE_RECIPE}
    if len(acc) < 2:
        raise ValueError(f"{model}: {len(acc)} {REFERENCE_RECIPE} seed(s); the band needs at least two")
    values = np.array(list(acc.values()))
    return {"seeds": acc, "mean": float(values.mean()), "sd": float(values.std(ddof=1)), "low": float(values.min()),
            "high": float(values.max())}


def crossed_row(items: list[dict], model: str, recipe: str, seeds: list[int], margin: float, part: str) -> dict:
    """``recipe`` minus BF16 in final strict accuracy over (problem, seed) of ``seeds``, and its verdict against
    -margin."""
    keep = set(seeds)
    by: dict = {}
    for r in items:
        if r["model"] == model and r["recipe"] in (recipe, REFERENCE_RECIPE) and int(r["seed"]) in keep \
                and r.get("strict") is not None:
            by.setdefault(((r["doc_id"], r["doc_hash"]), int(r["seed"])), {})[r["recipe"]] = float(r["strict"])
    est = crossed_differences({k: v[recipe] - v[REFERENCE_RECIPE] for k, v in by.items() if len(v) == 2})
    row = {"model": model, "contrast": f"{recipe} - {REFERENCE_RECIPE}", "part": part, "seeds": len(seeds),
           "problems": None, "diff": None, "ci_low": None, "ci_high": None, "se": None, "df": None,
           "margin": margin, "verdict": "undecided (fewer than two seeds or problems)", "method": None}
    if est is None or est.get("ci_low") is None:
        return row
    row.update(problems=est["rows"], diff=est["mean"], ci_low=float(est["ci_low"]), ci_high=float(est["ci_high"]),
               se=est.get("se", 0.0), df=est["df"], method=est["interval"])  # no se: every difference the same
    if row["ci_low"] > -margin:
        row["verdict"] = f"within the band ({row['contrast']}: 95% interval above -{margin:.3f})"
    elif row["ci_high"] < -margin:
        row["verdict"] = f"outside the band ({row['contrast']}: 95% interval below -{margin:.3f})"
    else:
        row["verdict"] = f"undecided ({row['contrast']}: 95% interval spans -{margin:.3f})"
    return row


def analyse(cells: list[dict], items: list[dict], model: str, recipe: str, premise: str = "mxfp4") -> dict:
    """The band, each recipe's seeds against it, and the crossed rows of ``recipe`` (all seeds and each fixed half)
    and of ``premise`` (all seeds)."""
    b = band(cells, model)
    seeds = sorted(b["seeds"])
    per_seed = {}
    for name in (REFERENCE_RECIPE, premise, recipe):
        got = {int(c["seed"]): c for c in cells if c["model"] == model and c["recipe"] == name}
        if sorted(got) != seeds:
            raise ValueError(f"{model}: {name} has seeds {sorted(got)}, the band's {REFERENCE_RECIPE} seeds are "
                             f"{seeds}; accepted: every recipe at every seed (a seed without learning signal is kept)")
        per_seed[name] = got
    inside = {}
    for name in (premise, recipe):
        mean = float(np.mean([float(c[FINAL]) for c in per_seed[name].values()]))
        inside[name] = {"mean": mean, "inside": mean >= b["low"]}
    halves = fixed_halves(seeds)
    rows = [crossed_row(items, model, recipe, seeds, b["sd"], "all seeds"),
            *(crossed_row(items, model, recipe, h, b["sd"], f"half {i + 1}") for i, h in enumerate(halves)),
            crossed_row(items, model, premise, seeds, b["sd"], "premise, all seeds")]
    z = between_half_z(rows[1], rows[2])
    return {"model": model, "recipe": recipe, "premise": premise, "band": b, "inside": inside, "rows": rows,
            "halves": halves, "between_half_z": z, "per_seed": per_seed}


def markdown(result: dict, profile: str) -> str:
    f = formatter("{:+.3f}")
    b, recipe = result["band"], result["recipe"]
    lines = [f"# The headline on {result['model']} (`{profile}`): {recipe} against BF16's seed-to-seed band", "",
             "About this model: its GRPO seeds and held-out problems are the replicates (crossed). The test was fixed "
             "before the run (mxfp4/report/headline.py).", "",
             "## The band (MLPerf-style: the BF16 seeds' final strict accuracies)", "",
             f"BF16 over {len(b['seeds'])} seeds: " + ", ".join(f"seed {s} {v:.3f}" for s, v in b["seeds"].items())
             + f"; mean {b['mean']:.3f}, sd {b['sd']:.3f}, lowest {b['low']:.3f}.", "",
             "| recipe | final strict accuracy per seed | seed mean | inside the band (mean >= BF16's lowest seed) "
             "| learning-signal steps per seed |", "|---|---|---|---|---|"]
    for name, seeds in result["per_seed"].items():
        acc = ", ".join(f"{float(c[FINAL]):.3f}" for _, c in sorted(seeds.items()))
        signal = ", ".join(str(c.get("learning_signal_steps")) for _, c in sorted(seeds.items()))
        mean = float(np.mean([float(c[FINAL]) for c in seeds.values()]))
        verdict = "the band itself" if name == REFERENCE_RECIPE else \
            ("inside" if result["inside"][name]["inside"] else "outside")
        lines.append(f"| {name} | {acc} | {mean:.3f} | {verdict} | {signal} |")
    lines += ["", "A seed whose steps had no learning signal (every advantage zero) keeps its final accuracy: no RL "
              "happened there, and that is the harm.", "",
              f"## The crossed test (margin: BF16's seed sd, {b['sd']:.3f})", "",
              "Per (held-out problem, seed): final strict accuracy minus BF16's; two-way crossed random effects "
              "(problems x seeds), Satterthwaite df, 95% interval. Within: the interval above -margin; outside: "
              "below; else undecided.", "",
              "| contrast | part | seeds | problems | diff | 95% interval | df | verdict |",
              "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        interval = f"[{f(r['ci_low'])}, {f(r['ci_high'])}]" if r["ci_low"] is not None else "-"
        df = f"{r['df']:.1f}" if r["df"] is not None else "-"
        lines.append(f"| {r['contrast']} | {r['part']} | {r['seeds']} | {r['problems'] or '-'} | {f(r['diff'])} | "
                     f"{interval} | {df} | {r['verdict']} |")
    z = result["between_half_z"]
    h1, h2 = result["halves"]
    lines += ["", f"Halves fixed before the run: seeds {h1} and {h2}. Between-half z of {recipe} - BF16: "
              + (f"{z:+.2f} ({'the halves differ' if abs(z) > Z_BOUND else 'within'} its expected spread, "
                 f"|z| <= {Z_BOUND:.2f} under replication)" if z is not None and math.isfinite(z) else "none")
              + ".", ""]
    return "\n".join(lines)


def curves_figure(steps: list[dict], model: str, recipes: list[str], out_png: Path | str) -> None:
    """Every seed's curve of each step measure (``STEP_CURVES``) and the running count of learning-signal steps, one
    panel a measure, one colour a recipe."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [*STEP_CURVES.items(), ("learning-signal steps (cumulative)", "frac_reward_zero_std")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2))
    colours = dict(zip(recipes, ["black", "tab:red", "tab:blue", "tab:green"], strict=False))
    for ax, (title, key) in zip(axes, panels, strict=True):
        for recipe in recipes:
            seeds = sorted({int(s["seed"]) for s in steps if s["recipe"] == recipe and s["model"] == model})
            for seed in seeds:
                rows = sorted((s for s in steps if s["recipe"] == recipe and s["model"] == model
                               and int(s["seed"]) == seed), key=lambda s: int(s["step"]))
                x = [int(s["step"]) for s in rows]
                if key == "frac_reward_zero_std":  # a step with some group's rewards differing (aggregate's rule)
                    y = np.cumsum([1 if s.get(key) is not None and s[key] < 1 else 0 for s in rows])
                else:
                    y = [np.nan if s.get(key) is None else s[key] for s in rows]
                ax.plot(x, y, color=colours.get(recipe), alpha=0.6, lw=1, label=recipe if seed == seeds[0] else None)
        logged = any(s.get(key) is not None for s in steps)
        ax.set_title(title if logged else f"{title} (not logged: no KL term, beta 0)", fontsize=9)
        ax.set_xlabel("GRPO step")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)


def run(aggregate: Path | str, model: str, recipe: str, profile: str, out_md: Path | str, out_png: Path | str,
        premise: str = "mxfp4") -> dict:
    """The headline from a run's aggregate tables (``cells.csv``, ``items.csv``, ``steps.csv``), written to
    ``out_md`` (its rows beside it as CSV) and the curves to ``out_png``."""
    aggregate = Path(aggregate)
    cells, items = read_csv(aggregate / "cells.csv"), read_csv(aggregate / "items.csv")
    result = analyse(cells, items, model, recipe, premise)
    write_text_atomic(out_md, markdown(result, profile))
    write_csv(result["rows"], Path(out_md).with_suffix(".csv"))
    curves_figure(read_csv(aggregate / "steps.csv"), model, [REFERENCE_RECIPE, premise, recipe], out_png)
    return result

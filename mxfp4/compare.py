"""Compare a recipe's cells against stored baselines: per metric, the difference of means over seeds
with a 95% Welch interval, and a verdict (better / worse / no significant difference)."""

from __future__ import annotations

from pathlib import Path

from .aggregate import HIGHER_IS_BETTER, read_cells, verdict, welch_diff

COMPARED = ["gsm8k_strict_accuracy", "gsm8k_flexible_accuracy", "mean_rollout_accuracy", "mean_entropy",
            "mean_grad_cosine", "mean_grad_rel_norm_error", "mean_step_time"]


def compare_rows(new: list[dict], baselines: list[dict], recipe: str) -> list[dict]:
    out = []
    models = sorted({r["model"] for r in new})
    for model in models:
        mine = [r for r in new if r["model"] == model and r["recipe"] == recipe]
        for base in sorted({r["recipe"] for r in baselines if r["model"] == model}):
            theirs = [r for r in baselines if r["model"] == model and r["recipe"] == base]
            for metric in COMPARED:
                d = welch_diff([r.get(metric) for r in mine], [r.get(metric) for r in theirs])
                out.append({"model": model, "recipe": recipe, "baseline": base, "metric": metric, **d,
                            "verdict": verdict(d, HIGHER_IS_BETTER.get(metric))})
    return out


def _fmt(v):
    return "—" if v is None else f"{v:+.4f}"


def markdown(rows: list[dict], recipe: str) -> str:
    lines = [f"# `{recipe}` against the stored baselines", "",
             "Difference = mean over seeds of the new recipe minus the baseline's; 95% Welch interval.", "",
             "| model | baseline | metric | difference | 95% CI | seeds (new/base) | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ci = "—" if r["ci_low"] is None else f"[{r['ci_low']:+.4f}, {r['ci_high']:+.4f}]"
        lines.append(f"| {r['model']} | {r['baseline']} | {r['metric']} | {_fmt(r['diff'])} | {ci} | {r['n_a']}/{r['n_b']} | {r['verdict']} |")
    return "\n".join(lines) + "\n"


def run_compare(results, profile: str, recipe: str, baselines_csv, out_md, figure_stem=None) -> list[dict]:
    from .aggregate import read_csv

    cells, _ = read_cells(results, profile)
    new = [c for c in cells if c["recipe"] == recipe]
    if not new:
        raise ValueError(f"no finished cells of recipe {recipe!r} in profile {profile!r}; run them first")
    rows = compare_rows(new, read_csv(baselines_csv), recipe)
    Path(out_md).parent.mkdir(parents=True, exist_ok=True)
    Path(out_md).write_text(markdown(rows, recipe))
    if figure_stem:
        from .plots import compare_figure

        compare_figure(rows, recipe, figure_stem)
    return rows

"""The field's MXFP4 recipes ranked on one set of networks: each recipe an arm of the pathway matrix at a network
design's warm starts (``mxfp4 mechanism --recipe ...``), beside plain MXFP4 and BF16 on the same batches and
prompts, the network as the replicate.

The primary measure is the share of MXFP4's harm a recipe removes. Per network and pathway (gradient: 1 - cosine to
the unquantized gradient; rollout: minus the teacher-forced log-likelihood of the correct solution; entropy: the gap
to the unquantized arm's token entropy), from the network's mean harms: ``harm(mxfp4) - harm(recipe)`` over the
pathway's span, the mean over networks of ``harm(mxfp4) - harm(bf16)`` (1: as BF16, 0: as MXFP4, below 0: worse than
MXFP4; one scale a pathway, shared by every arm), averaged over the three pathways within the network. The board
ranks recipes by its mean over networks (95% t interval, df = networks - 1). Two recipes are told apart where the
paired t over networks of their primary measures rejects equality, Holm over every pair of the model's board at
0.05.

Beside it, per pathway, each arm's mean harm over networks; the storage each recipe adds (``Recipe.cost``: extra
bits per element); its step time over BF16's from one benchmark run (``kernels/bench/bench_step.py``), and the
GSM8K accuracy of its RL cells where a stored profile has them (another set of networks: said in the column).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from ..analysis.pathways.spec import RECOVERY_HARMS, UNIT_FIELDS, first_unit_difference
from ..config.profiles import load_profile
from ..config.recipes import Recipe
from ..io import write_csv_atomic, write_json_atomic, write_text_atomic
from ..layout import Layout
from ..numerics.hooks import lifecycle
from ..stats import mean_ci, no_spread
from .formatting import MISSING, formatter
from .mechanism import ARM_LABELS, PATHWAYS, arm_label
from .network_claims import by_network, profile_networks, unit_harms
from .tables import read_table, read_unit_files

ALPHA = 0.05
METHOD = ("harm removed = (harm(mxfp4) - harm(recipe)) per network and pathway (the network's mean harms) over the "
          "pathway's mean span harm(mxfp4) - harm(bf16), averaged over the pathways (gradient, rollout, entropy gap) "
          "within the network; "
          "mean over networks with a 95% t interval; recipes told apart by the paired t over networks, Holm over "
          "every pair of the model's board at 0.05")


def removed_share(harms: dict[str, dict[str, dict]], arm: str, model: str) -> dict:
    """{network: the arm's share of MXFP4's harm removed, averaged over the pathways} from ``by_network``'s harms of
    one model: per pathway the network's (harm(mxfp4) - harm(arm)) over the pathway's span, the mean over networks
    of harm(mxfp4) - harm(bf16) (one scale a pathway, the same for every arm: linear in the harms, so the paired
    tests over networks keep their meaning). A pathway on which MXFP4 harms no more than BF16 has no harm to share
    out: an error."""
    out: dict = {}
    for pathway, key in PATHWAYS.items():
        arms = harms.get(key, {})
        missing = [a for a in (arm, "all", "none") if a not in arms]
        if missing:
            raise ValueError(f"{model}: the {pathway} pathway has no {', '.join(map(arm_label, missing))} arm; "
                             "accepted: per-unit files of mxfp4 mechanism, which measures mxfp4 and bf16 beside every "
                             "recipe")
        nets = [n for n in arms["all"] if n in arms["none"] and n in arms[arm]]
        span = float(np.mean([arms["all"][n] - arms["none"][n] for n in nets])) if nets else 0.0
        if not span > 0:
            raise ValueError(f"{model}: MXFP4's mean harm on the {pathway} pathway is not above BF16's ({span:+.4g} "
                             f"over {len(nets)} networks): no harm for a recipe to remove")
        for n in nets:
            out.setdefault(n, []).append((arms["all"][n] - arms[arm][n]) / span)
    return {net: float(np.mean(v)) for net, v in out.items() if len(v) == len(PATHWAYS)}


def _paired_p(a: dict, b: dict) -> float | None:
    """Two-sided p of the paired t over the networks both have (None with fewer than two, 1 without spread)."""
    nets = [n for n in a if n in b]
    d = np.array([a[n] - b[n] for n in nets])
    if len(d) < 2:
        return None
    if no_spread(d):  # equal differences in every network (to rounding): no t; equal or apart for certain
        return 1.0 if abs(float(d.mean())) <= 1e-12 * max(1.0, float(np.abs(d).max())) else 0.0
    return float(sps.ttest_1samp(d, 0.0).pvalue)


def board(units: list[dict], profile, recipes: list[str], costs: dict | None = None, steps: dict | None = None,
          accuracy: dict | None = None) -> dict[str, list[dict]]:
    """Per model, the board's rows ranked by harm removed (mxfp4 and bf16 included as anchors): each row's primary
    measure with its interval, the ranks it is told apart from, its mean harm per pathway, its costs."""
    design = profile.pathways.claims if profile.pathways else None
    if design is None:
        raise ValueError(f"profile {profile.name!r} fixes no claim design (pathways.claims): the board reads its form")
    network_of = profile_networks(profile, units)
    out = {}
    for model in sorted({r["model"] for r in units}):
        harms = by_network(unit_harms(units, model, "warm", design.form), network_of)
        arms = [a for a in [*recipes, "all", "none"] if a in harms.get("gradient", {})]
        absent = [r for r in recipes if r not in arms]
        if absent:
            raise ValueError(f"{model}: no arm of {', '.join(absent)} in the per-unit files; accepted: files of mxfp4 "
                             "mechanism --recipe with these recipes")
        shares = {a: removed_share(harms, a, model) for a in arms}
        rows = []
        for a in arms:
            share = mean_ci(list(shares[a].values()))
            row = {"model": model, "recipe": arm_label(a), "arm": a,
                   **{k: share[k] for k in ("mean", "ci_low", "ci_high")}, "networks": share["n"]}
            for pathway, key in PATHWAYS.items():
                row[f"{pathway}_harm"] = float(np.mean(list(harms[key][a].values())))
            row["extra_bits_per_element"] = (costs or {}).get(arm_label(a))
            row["step_ratio"] = (steps or {}).get(arm_label(a))
            row["accuracy"] = (accuracy or {}).get((model, arm_label(a)))
            rows.append(row)
        rows.sort(key=lambda r: -r["mean"])
        for rank, r in enumerate(rows, 1):
            r["rank"] = rank
        pairs = [(i, j) for i in range(len(rows)) for j in range(i + 1, len(rows))]
        ps = [_paired_p(shares[rows[i]["arm"]], shares[rows[j]["arm"]]) for i, j in pairs]
        tested = [(pair, p) for pair, p in zip(pairs, ps) if p is not None]
        reject = multipletests([p for _, p in tested], alpha=ALPHA, method="holm")[0] if tested else []
        for r in rows:
            r["apart_from"] = []
        for ((i, j), _), apart in zip(tested, reject):
            if apart:
                rows[i]["apart_from"].append(rows[j]["rank"])
                rows[j]["apart_from"].append(rows[i]["rank"])
        out[model] = rows
    return out


def recipe_costs(recipes: list[str]) -> dict[str, float]:
    """Extra storage bits per element of each recipe: its corrections' nominal ``cost`` (before any data; outlier
    fallback's one element a block), mxfp4 and bf16 at 0."""
    out = {"mxfp4": 0.0, "bf16": 0.0}
    for name in recipes:
        corrections = Recipe.named(name).build_corrections()
        out[name] = float(sum(lifecycle(c.cost)["extra_bits_per_element"] for c in corrections))
    return out


def step_ratios(benches: dict[str, dict]) -> dict[str, float]:
    """Each recipe's step time over BF16's in one benchmark run (``bench_step.py``'s JSON, by its file name): the
    first run that times the recipe gives its ratio, never two runs' times mixed."""
    out: dict[str, float] = {}
    for name, bench in benches.items():
        timed = {k: v["step_time_s"] for k, v in bench.get("recipes", {}).items() if "step_time_s" in v}
        if "bf16" not in timed:
            raise ValueError(f"{name} times no bf16 step; accepted: bench_step.py --recipes bf16 ...")
        out.update({k: v / timed["bf16"] for k, v in timed.items() if k not in out})
    return out


def stored_accuracy(layouts: list[Layout]) -> dict[tuple[str, str], str]:
    """{(model, recipe): 'after (before; unquantized) [profile, n seeds]'} from the stored summaries of the
    profiles of ``layouts`` (the first that has the recipe)."""
    out: dict = {}
    for layout in layouts:
        name = layout.profile
        path = layout.stored(layout.table("summary"))
        if not Path(path).is_file():
            continue
        rows = read_table(path, "summary")
        by = {(r["model"], r["recipe"], r["metric"]): r for r in rows}
        for (model, recipe, metric), r in by.items():
            if metric != "gsm8k_strict_accuracy" or (model, recipe) in out:
                continue
            before, unq = (by.get((model, recipe, f"gsm8k_strict_accuracy_{k}")) for k in ("before", "unquantized"))
            out[(model, recipe)] = (f"{r['mean']:.3f} ({_g(before and before['mean'], '{:.3f}')}; "
                                    f"{_g(unq and unq['mean'], '{:.3f}')}) [{name}, n {r['n']}]")
    return out


def merged(stored: list[dict], new: list[dict], recipe: str) -> list[dict]:
    """The stored board's units with ``recipe``'s arm from a run of ``mxfp4 mechanism --recipe`` on the same
    networks, once that run's mxfp4 and bf16 arms are shown to equal the stored ones unit for unit, each unit by its
    full identity (model, checkpoint, form, pathway, arm, seed, unit index; a prompt drawn twice is two units): else
    its arm is not comparable with the board's, and this names the first unit that differs."""
    have = [r for r in stored if r["arm"] in ARM_LABELS]
    differs = first_unit_difference(have, [r for r in new if r["arm"] in ARM_LABELS])
    if differs:
        raise ValueError(f"{recipe}: the run's mxfp4 and bf16 arms do not reproduce the stored board's: the first "
                         f"unit that differs is {differs}; its arm is not comparable. Accepted: a run on the board's "
                         "stored warm starts with the same numerics, or the board rerun here")
    if not have:
        raise ValueError(f"{recipe}: the stored board has no mxfp4 or bf16 arm to check the run against")
    if not any(r["arm"] == recipe for r in new):
        raise ValueError(f"no arm of {recipe} in the run's per-unit files; accepted: mxfp4 mechanism --recipe {recipe}")
    return [r for r in stored if r["arm"] != recipe] + [r for r in new if r["arm"] == recipe]


def placed_on_board(stored: list[dict], new: list[dict], recipe: str) -> list[dict]:
    """The stored board's units with ``recipe``'s arm (``merged``: its anchors checked first), in the order a run of
    the whole board with ``recipe`` last on its list writes them: per model, checkpoint, form and pathway as stored,
    the recipe's units after the stored arms'. What storing a placed recipe writes."""
    rows = merged(stored, new, recipe)
    groups: dict = {}
    for r in rows:
        if r["arm"] != recipe:
            groups.setdefault((r["model"], r["checkpoint"], r["form"], r["pathway"]), []).append(r)
    for r in sorted((r for r in rows if r["arm"] == recipe), key=lambda r: int(r["unit"])):
        key = (r["model"], r["checkpoint"], r["form"], r["pathway"])
        if key not in groups:
            raise ValueError(f"{recipe}: its units of {'/'.join(key)} have no stored board to join")
        groups[key].append(r)
    return [r for rows_of in groups.values() for r in rows_of]


def store_placed_units(stored_file, run_files, recipe: str) -> None:
    """Rewrite the stored board's per-unit file with ``recipe``'s arm from its run's files (``placed_on_board``)."""
    rows = placed_on_board(read_unit_files([stored_file]), read_unit_files(run_files), recipe)
    write_csv_atomic(stored_file, rows, UNIT_FIELDS)


_g = formatter("{:+.3f}")


def markdown(boards: dict[str, list[dict]], profile_name: str, highlight: str | None = None,
             figure_link: str | None = None) -> str:
    out = [f"# Leaderboard: the field's MXFP4 recipes on `{profile_name}`'s networks", ""]
    if figure_link:
        out += [f"![the share of MXFP4's harm each recipe removes, 95% t over networks]({figure_link})", ""]
    if highlight:
        for model, rows in boards.items():
            r = next((r for r in rows if r["recipe"] == highlight), None)
            if r is not None:
                apart = ", ".join(map(str, sorted(r["apart_from"]))) or "none"
                out.append(f"- **{highlight}** on {model}: rank {r['rank']} of {len(rows)}, harm removed "
                           f"{_g(r['mean'])} [{_g(r['ci_low'])}, {_g(r['ci_high'])}] over {r['networks']} networks; "
                           f"told apart from ranks {apart}.")
        out.append("")
    out += [f"Method: {METHOD}. Harms per pathway (mean over networks): "
            + "; ".join(f"{p}: {RECOVERY_HARMS[p]}" for p in PATHWAYS) + ". Step time: one benchmark run's step over "
            "its BF16 step (CPU). GSM8K: the stored RL cells of the recipe where a profile has them, on that "
            "profile's networks (after RL; before; unquantized after RL), not on this board's.", ""]
    for model, rows in boards.items():
        out += [f"## {model}", "",
                "| rank | recipe | harm removed [95% CI] | told apart from ranks | gradient 1 - cos | rollout -loglik "
                "| entropy gap | extra bits / element | step time / bf16 | GSM8K after RL (before; unquantized) |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            name = f"**{r['recipe']}**" if r["recipe"] == highlight else r["recipe"]
            apart = ", ".join(map(str, sorted(r["apart_from"]))) or MISSING
            out.append(f"| {r['rank']} | {name} | {_g(r['mean'])} [{_g(r['ci_low'])}, {_g(r['ci_high'])}] "
                       f"| {apart} | {_g(r['gradient_harm'], '{:.4f}')} | {_g(r['rollout_harm'], '{:.3f}')} "
                       f"| {_g(r['entropy_harm'], '{:.4f}')} | {_g(r['extra_bits_per_element'], '{:.3g}')} "
                       f"| {_g(r['step_ratio'], '{:.2f}x')} | {r['accuracy'] or 'no RL cell stored'} |")
        spans = {r["recipe"]: r for r in rows}
        span = ", ".join(f"{p} {spans['mxfp4'][f'{p}_harm'] - spans['bf16'][f'{p}_harm']:+.4g}" for p in PATHWAYS)
        out += ["", f"n: {rows[0]['networks']} networks (units averaged within each). MXFP4's harm above BF16's, the "
                f"span each pathway's share is taken of: {span} (a small span makes every share on it noisy).", ""]
    return "\n".join(out)


def figure(boards: dict[str, list[dict]], out_png, highlight: str | None = None) -> None:
    """Per model, each recipe's harm removed with its 95% interval over networks, in rank order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(boards)
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 0.38 * max(map(len, boards.values())) + 1.5),
                             squeeze=False)
    for ax, model in zip(axes[0], models):
        rows = boards[model][::-1]
        y = np.arange(len(rows))
        means = np.array([r["mean"] for r in rows])
        low = np.array([r["ci_low"] if r["ci_low"] is not None else r["mean"] for r in rows])
        high = np.array([r["ci_high"] if r["ci_high"] is not None else r["mean"] for r in rows])
        colors = ["C3" if r["recipe"] == highlight else "C0" for r in rows]
        ax.errorbar(means, y, xerr=[means - low, high - means], fmt="none", ecolor="0.5", capsize=2)
        ax.scatter(means, y, c=colors, zorder=3)
        ax.axvline(0, color="0.7", lw=0.8)
        ax.axvline(1, color="0.7", lw=0.8, ls="--")
        ax.set_yticks(y, [f"{r['rank']}. {r['recipe']}" for r in rows])
        ax.set_xlabel("share of MXFP4's harm removed (0: mxfp4, 1: bf16)")
        ax.set_title(f"{model} ({rows[0]['networks']} networks, 95% t)")
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    fig.savefig(Path(out_png).with_suffix(".pdf"))
    plt.close(fig)


def draw(board_json, out_stem) -> list[Path]:
    """The board's figure from its rows (``run``'s JSON beside the page): the registered figure ``leaderboard``."""
    import json

    out_png = Path(out_stem).with_suffix(".png")
    out_png.parent.mkdir(parents=True, exist_ok=True)
    figure(json.loads(Path(board_json).read_text())["boards"], out_png)
    return [out_png, out_png.with_suffix(".pdf")]


def run(units: list[dict], profile_name: str, out_md, recipes: list[str], benches: dict[str, dict] | None = None,
        accuracy_from: list[Layout] = (), highlight: str | None = None, out_png=None, draw_figure: bool = True) -> dict:
    """The leaderboard of ``recipes`` (and a user's ``highlight``) from the per-unit rows, with the step times of
    ``benches`` (``step_ratios``) and the stored accuracies of the runs ``accuracy_from`` (``stored_accuracy``),
    written to ``out_md`` (its rows as JSON beside it) and, with ``out_png``, linked from it and drawn (unless
    ``draw_figure`` is False: the figure registry draws it from the JSON); the boards."""
    profile = load_profile(profile_name)
    names = list(dict.fromkeys([*recipes, *([highlight] if highlight else [])]))
    boards = board(units, profile, names, recipe_costs(names), step_ratios(benches) if benches else None,
                   stored_accuracy(list(accuracy_from)))
    link = None if out_png is None else Path(os.path.relpath(Path(out_png), Path(out_md).parent)).as_posix()
    write_text_atomic(out_md, markdown(boards, profile_name, highlight, link))
    write_json_atomic(Path(out_md).with_suffix(".json"), {"profile": profile_name, "method": METHOD,
                                                          "boards": boards})
    if out_png is not None and draw_figure:
        figure(boards, out_png, highlight)
    return boards

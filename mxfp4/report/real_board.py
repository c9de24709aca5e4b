"""The real-model board: every recipe ranked on one named pretrained model before RL, its held-out problems the
replicate (the claim is about this model).

Ranked by GSM8K strict accuracy before RL (lm-eval, every held-out problem the profile evaluates, each recipe
generating as its rollouts would). Each recipe against BF16: the paired difference over problems with its 95% t
interval. Two recipes are told apart where the paired t over problems of their per-problem scores rejects equality,
Holm over every pair of the board at 0.05 (two recipes with the same evaluation are equal). Beside it: the share of
completions that are error completions (``analysis.error_tokens``: repetitive, garbled), the teacher-forced harm per
pathway (``mxfp4 mechanism`` on the same model: mean over its units, n stated), the storage each recipe adds, and one
training pass's time over BF16's from one process (``analysis.real_board``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from ..config.recipes import Recipe
from ..io import write_json_atomic, write_text_atomic
from ..layout import REFERENCE_RECIPE
from ..stats import mean_ci
from .formatting import MISSING, formatter
from .leaderboard import recipe_costs
from .mechanism import PATHWAYS
from .network_claims import unit_harms
from .tables import TableError, read_board_items

ALPHA = 0.05
BF16_BITS, MXFP4_BITS = 16.0, 4.25  # a BF16 element; an MXFP4 element with its share of the E8M0 block scale
ARMS = {"none": REFERENCE_RECIPE, "all": "mxfp4"}  # the per-unit files' names of the two reference arms
METHOD = ("ranked by GSM8K strict accuracy before RL over the held-out problems (the replicate: this model's "
          "problems); each recipe against BF16 paired per problem, 95% t interval; recipes told apart by the paired t "
          "over problems, Holm over every pair of the board at 0.05")
_g = formatter("{:+.3f}")


def _paired_p(a: np.ndarray, b: np.ndarray) -> float:
    d = a - b
    if not d.any():
        return 1.0
    if np.all(d == d[0]):
        return 0.0
    return float(sps.ttest_1samp(d, 0.0).pvalue)


def training_precision(name: str) -> str:
    """How a recipe trains and generates, in the field's shorthand (W4A4, W4A16, BF16; a BF16 backward; W4A16
    rollouts)."""
    r = Recipe.named(name)
    if not r.quantize:
        return "BF16"
    if not r.activations:
        return "W4A16"
    out = "W4A4" if r.gemms["input_grad"] or r.gemms["weight_grad"] else "W4A4 forward, BF16 backward"
    return out + ", W4A16 rollouts" if r.rollouts_weights_only else out


def board(items: list[dict], record: dict, units: list[dict] | None = None) -> list[dict]:
    """The board's rows in rank order from the validated items (``tables.read_board_items``), ``record`` (the
    measure's ``recipes.json``) and, where given, the per-unit harms of ``mxfp4 mechanism`` on the same model."""
    model = items[0]["model"]
    scores: dict[str, dict] = {}
    for r in items:
        scores.setdefault(r["recipe"], {})[(int(r["doc_id"]), r["doc_hash"])] = r
    docs = sorted(scores[REFERENCE_RECIPE])
    strict = {k: np.array([float(v[d]["strict"]) for d in docs]) for k, v in scores.items()}
    flexible = {k: float(np.mean([float(v[d]["flexible"]) for d in docs])) for k, v in scores.items()}
    missing = [k for k in strict if k not in record["recipes"]]
    if missing:
        raise TableError(f"recipes.json has no record of {', '.join(missing)}; accepted: the record written with "
                         "the items by mxfp4 real-board")
    costs = recipe_costs([k for k in strict if k not in (REFERENCE_RECIPE, "mxfp4")])
    harms = pathway_harms(units, model) if units else {}
    rows = []
    for name, s in strict.items():
        rec = record["recipes"][name]
        diff = mean_ci(list(s - strict[REFERENCE_RECIPE]))
        errors = [scores[name][d] for d in docs]
        kept = rec.get("bf16_element_fraction") or 0.0
        rows.append({"recipe": name, "accuracy": float(s.mean()), "flexible": flexible[name], "problems": len(docs),
                     "diff": diff["mean"],
                     "ci_low": diff["ci_low"], "ci_high": diff["ci_high"],
                     "error_rate": float(np.mean([r["error"] for r in errors])),
                     "repetitive_rate": float(np.mean([r["repetitive"] for r in errors])),
                     "garbled_rate": float(np.mean([r["garbled"] for r in errors])),
                     "extra_bits_per_element": costs[name] + kept * (BF16_BITS - MXFP4_BITS),
                     "bf16_element_fraction": kept, "pass_ratio": rec["training_pass_ratio"],
                     "same_as": rec.get("same_as"), "precision": training_precision(name),
                     **{f"{p}_harm": harms.get(name, {}).get(p) for p in PATHWAYS},
                     "units": harms.get(name, {}).get("n")})
    rows.sort(key=lambda r: (-r["accuracy"], r["recipe"]))
    for r in rows:  # equal accuracy, equal rank: a tie is a tie
        r["rank"], r["apart_from"] = 1 + sum(o["accuracy"] > r["accuracy"] for o in rows), []
    pairs = [(a, b) for i, a in enumerate(rows) for b in rows[i + 1:]]
    if pairs:
        p = [_paired_p(strict[a["recipe"]], strict[b["recipe"]]) for a, b in pairs]
        reject = multipletests(p, alpha=ALPHA, method="holm")[0]
        for (a, b), apart in zip(pairs, reject, strict=True):
            if apart:
                a["apart_from"].append(b["rank"])
                b["apart_from"].append(a["rank"])
    return rows


def pathway_harms(units: list[dict], model: str) -> dict[str, dict]:
    """{recipe: {pathway: mean harm over the model's units, "n": units a pathway}} from the per-unit rows (the
    reference arms under their recipe names)."""
    form = units[0]["form"]
    per = unit_harms(units, model, "warm", form, replicate="units")
    out: dict[str, dict] = {}
    for pathway, key in PATHWAYS.items():
        for arm, (values, _) in per.get(key, {}).items():
            got = out.setdefault(ARMS.get(arm, arm), {})
            got[pathway] = float(np.mean(values))
            got["n"] = {**got.get("n", {}), pathway: len(values)}
    return out


def markdown(rows: list[dict], model: str, profile: str, record: dict, highlight: str | None = None) -> str:
    f = _g
    out = [f"# Real-model board: every recipe on {model} before RL (`{profile}`)", "",
           f"About this model: its {rows[0]['problems']} held-out problems are the replicate. Method: {METHOD}. Error "
           f"completions: {record['error_rule']}. Extra bits: the corrections' nominal storage plus the BF16 edge "
           f"layers' share of the weight elements x ({BF16_BITS:g} - {MXFP4_BITS:g}). Training pass: "
           f"{record['training_pass']}. A recipe whose generation is bit-identical to an evaluated one's on the check "
           f"batch ({record['check']}) shares its evaluation (named in 'same as').", ""]
    if highlight:
        r = next(r for r in rows if r["recipe"] == highlight)
        out += [f"- **{highlight}**: rank {r['rank']} of {len(rows)}, accuracy {r['accuracy']:.3f}, against BF16 "
                f"{f(r['diff'])} [{f(r['ci_low'])}, {f(r['ci_high'])}]; told apart from ranks "
                f"{', '.join(map(str, sorted(set(r['apart_from'])))) or 'none'}.", ""]
    n_units = next((r["units"] for r in rows if r["units"]), None)
    out += ["| rank | recipe | precision | strict accuracy before RL (flexible) | - BF16 [95% CI] | told apart from "
            "ranks "
            "| error completions (repetitive; garbled) | gradient 1 - cos | rollout -loglik | entropy gap "
            "| extra bits / element | training pass / bf16 | same as |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        name = f"**{r['recipe']}**" if r["recipe"] == highlight else r["recipe"]
        apart = ", ".join(map(str, sorted(set(r["apart_from"])))) or MISSING
        out.append(f"| {r['rank']} | {name} | {r['precision']} | {r['accuracy']:.3f} ({r['flexible']:.3f}) "
                   f"| {f(r['diff'])} "
                   f"[{f(r['ci_low'])}, {f(r['ci_high'])}] | {apart} | {r['error_rate']:.3f} "
                   f"({r['repetitive_rate']:.3f}; {r['garbled_rate']:.3f}) | {f(r['gradient_harm'], '{:.4f}')} "
                   f"| {f(r['rollout_harm'], '{:.2f}')} "
                   f"| {f(r['entropy_harm'], '{:.4f}')} | {r['extra_bits_per_element']:.3g} | {r['pass_ratio']:.2f}x "
                   f"| {r['same_as'] or MISSING} |")
    out += ["", "Pathway harms: " + (", ".join(f"{p} over {k} units" for p, k in n_units.items())
                                     + " of this model (mean; `mxfp4 mechanism`)" if n_units else "not measured")
            + ".", ""]
    return "\n".join(out)


def read_board(board_dir: Path | str) -> tuple[list[dict], dict]:
    """(validated items, record) of a ``mxfp4 real-board`` folder."""
    board_dir = Path(board_dir)
    record_path = board_dir / "recipes.json"
    if not record_path.is_file():
        raise TableError(f"{record_path}: no board record; accepted: a folder mxfp4 real-board wrote")
    record = json.loads(record_path.read_text())
    return read_board_items(board_dir / "items.csv", record.get("model")), record


REPRODUCED = ("doc_hash", "strict", "flexible", "repetitive", "garbled")


def placed(stored: tuple[list[dict], dict], new: tuple[list[dict], dict], recipe: str) -> tuple[list[dict], dict]:
    """The stored board with ``recipe``'s rows from a new measurement, once the new run's bf16 reproduces the stored
    bf16 problem by problem (the first problem that differs is named) and ``recipe`` is not a stored recipe's name
    (a user's recipe never shadows one)."""
    (items, record), (new_items, new_record) = stored, new
    if recipe in record["recipes"]:
        raise ValueError(f"recipe {recipe!r} is already on the stored board; a placed recipe needs a name of its own "
                         "(rename it in your recipe file)")
    if recipe not in new_record["recipes"]:
        raise ValueError(f"the new board folder measured no {recipe!r}; accepted: mxfp4 real-board --recipe {recipe}")
    if new_record["model"] != record["model"]:
        raise ValueError(f"the new board is of {new_record['model']!r}, the stored one of {record['model']!r}")
    old = {int(r["doc_id"]): r for r in items if r["recipe"] == REFERENCE_RECIPE}
    again = {int(r["doc_id"]): r for r in new_items if r["recipe"] == REFERENCE_RECIPE}
    for doc in sorted(old.keys() | again.keys()):
        a, b = old.get(doc), again.get(doc)
        if a is None or b is None or any(a[k] != b[k] for k in REPRODUCED):
            raise ValueError(f"the new run's bf16 does not reproduce the stored board's at problem {doc} "
                             f"({'missing' if a is None or b is None else 'scores differ'}); the two are not one "
                             "measurement: rerun the board here, or place the recipe where the board was made")
    ratio = new_record["recipes"][recipe]["training_pass_seconds"] / new_record["recipes"][REFERENCE_RECIPE][
        "training_pass_seconds"]
    merged = {**record, "recipes": {**record["recipes"], recipe: {**new_record["recipes"][recipe],
                                                                    "training_pass_ratio": ratio}}}
    return items + [r for r in new_items if r["recipe"] == recipe], merged


def run(board_dir: Path | str, profile: str, out_md: Path | str, units: list[dict] | None = None,
        highlight: str | None = None, highlight_dir: Path | str | None = None) -> list[dict]:
    """The board from a ``mxfp4 real-board`` folder (and per-unit rows), with ``highlight``'s rows from its own folder
    where given (``placed``), written to ``out_md`` with its rows as JSON beside it."""
    items, record = read_board(board_dir)
    if highlight_dir is not None:
        items, record = placed((items, record), read_board(highlight_dir), highlight)
    rows = board(items, record, units)
    write_text_atomic(out_md, markdown(rows, record["model"], profile, record, highlight))
    write_json_atomic(Path(out_md).with_suffix(".json"), {"profile": profile, "model": record["model"],
                                                          "method": METHOD, "board": rows})
    return rows


PAGE_MARK = "<!-- the real-model board -->"


def attach(page: Path | str, board_md: Path | str) -> None:
    """Put the real-model board ``board_md`` on the leaderboard page ``page`` below the network board, replacing the
    one there: one page, two boards, each saying what its ranking is about."""
    page, board_md = Path(page), Path(board_md)
    text = page.read_text() if page.is_file() else ""
    head = text.split(PAGE_MARK)[0].rstrip()
    write_text_atomic(page, (head + "\n\n" if head else "") + PAGE_MARK + "\n\n" + board_md.read_text())

"""The entropy claim during RL, with the network as the replicate: does AQN narrow MXFP4's entropy gap to BF16?

Per network (a warm start, trained from the same seed under every recipe, so each step sees the same prompts):
each recipe's gap to the network's BF16 run at every step (TRL's logged token entropy of the step's completions),
averaged over the steps (G). The claim compares |G| of MXFP4 with |G| of MXFP4 + AQN over the networks with the
three symmetric outcomes of the network design (``stats.three_outcome_test``: held where MXFP4's gap is the larger,
contradicted where AQN's is, no dominance where they are within the margin), each again on the two halves fixed
before the run (``stats.fixed_halves``). The premise rows say whether either recipe moves the entropy at all (the
signed G over networks). A network whose runs logged different step counts is refused, not cut."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..io import write_text_atomic
from ..stats import (
    ALPHA,
    POWER,
    between_half_z,
    fixed_halves,
    mean_ci,
    three_outcome_test,
    three_outcome_verdict,
    units_for_power,
)
from .aggregate import read_csv, write_csv
from .formatting import MISSING, formatter, p_value

REFERENCE, PLAIN, CORRECTED = "bf16", "mxfp4", "mxfp4+aqn"
MARGIN = 0.0025  # nats: the networks' entropy margin at the warm start (a tenth of MXFP4's harm there)
CLAIM = "AQN narrows MXFP4's entropy gap to BF16 during RL"
METHOD = ("per network, each recipe's gap to the network's BF16 run in TRL's logged token entropy, averaged over "
          "steps {first}-{last} (G); |G| of MXFP4 minus |G| of MXFP4 + AQN, a t over the {k} networks (df {df}); "
          "held / contradicted one-sided at {alpha}, no dominance by TOST at +-{margin} nats")


def trajectories(rows: list[dict], model: str) -> dict[str, dict[int, dict[int, float]]]:
    """{recipe: {network (seed): {step: entropy}}} of one model from ``steps.csv`` rows; a missing or non-finite
    entropy is an error (a cell that logged none cannot enter the test silently)."""
    out: dict = {}
    for r in rows:
        if r["model"] != model:
            continue
        h = r.get("entropy")
        if h in (None, "") or not math.isfinite(float(h)):
            raise ValueError(f"{model} {r['recipe']} seed {r['seed']} step {r['step']}: no finite entropy logged")
        out.setdefault(r["recipe"], {}).setdefault(int(r["seed"]), {})[int(r["step"])] = float(h)
    return out


def network_gaps(traj: dict, recipe: str) -> dict[int, list[float]]:
    """{network: the per-step gaps of ``recipe`` to BF16}; the two runs must have logged the same steps."""
    missing = [r for r in (REFERENCE, recipe) if r not in traj]
    if missing:
        raise ValueError(f"steps.csv has no {', '.join(missing)} run; the claim needs {REFERENCE}, {PLAIN} and "
                         f"{CORRECTED}")
    out = {}
    for net, ref in sorted(traj[REFERENCE].items()):
        run = traj[recipe].get(net)
        if run is None:
            raise ValueError(f"network (seed) {net}: a {REFERENCE} run and no {recipe} run")
        if sorted(run) != sorted(ref):
            raise ValueError(f"network (seed) {net}: {recipe} logged steps {min(run)}-{max(run)} ({len(run)}), "
                             f"{REFERENCE} {min(ref)}-{max(ref)} ({len(ref)}); rerun the shorter cell")
        out[net] = [run[t] - ref[t] for t in sorted(ref)]
    return out


def claim_row(plain: dict[int, float], corrected: dict[int, float], networks: list, part: str) -> dict:
    """The three-outcome test on ``networks``: own = |G| of MXFP4 (the gap AQN should narrow), rival = |G| of
    MXFP4 + AQN; held where own - rival > 0."""
    own = {n: abs(plain[n]) for n in networks}
    rival = {n: abs(corrected[n]) for n in networks}
    test = three_outcome_test(own, {CORRECTED: rival}, MARGIN)
    verdict, decided_by = three_outcome_verdict(test)
    c = test["contrasts"][CORRECTED]
    return {"claim": CLAIM, "part": part, "networks": c["networks"], "diff": c["diff"], "ci_low": c["ci_low"],
            "ci_high": c["ci_high"], "sd": c["sd"], "p_held": test["p_held"], "p_contradicted": test["p_contradicted"],
            "p_no_dominance": test["p_equivalent"], "verdict": verdict, "decided_by": decided_by,
            "contrast": f"|G {PLAIN}| - |G {CORRECTED}|", "per_network": c["per_network"], "_contrast": c}


def analyse(rows: list[dict], model: str) -> dict:
    """The premise rows (signed G of each recipe over networks), the claim on all networks and on each half,
    the between-half z and the networks the observed spread would need."""
    traj = trajectories(rows, model)
    gaps = {r: network_gaps(traj, r) for r in (PLAIN, CORRECTED)}
    nets = sorted(set(gaps[PLAIN]) & set(gaps[CORRECTED]))
    if len(nets) < 2:
        raise ValueError(f"{model}: {len(nets)} network(s) with all three runs; the test needs at least two")
    steps = sorted(traj[REFERENCE][nets[0]])
    g = {r: {n: float(np.mean(gaps[r][n])) for n in nets} for r in gaps}
    premise = [{"recipe": r, **mean_ci(list(g[r].values())), "per_network": g[r]} for r in (PLAIN, CORRECTED)]
    halves = fixed_halves(nets)
    rows_out = [claim_row(g[PLAIN], g[CORRECTED], nets, "all networks")]
    rows_out += [claim_row(g[PLAIN], g[CORRECTED], h, f"half {i + 1}") for i, h in enumerate(halves)]
    z = between_half_z(rows_out[1]["_contrast"], rows_out[2]["_contrast"])
    whole = rows_out[0]
    needed = None
    if whole["sd"] and whole["sd"] > 0:
        try:
            needed = units_for_power(max(abs(whole["diff"]), MARGIN), whole["sd"], ALPHA, POWER)
        except ValueError:  # beyond any design the calculation searches
            needed = "more than 100000"
    flagged = len({r["verdict"] for r in rows_out[1:]}) > 1
    return {"model": model, "steps": (steps[0], steps[-1]), "networks": nets, "halves": halves, "premise": premise,
            "rows": rows_out, "between_half_z": z, "halves_differ": flagged, "networks_needed": needed,
            "trajectory": {r: {n: gaps[r][n] for n in nets} for r in gaps}}


_f = formatter("{:+.4f}")



def markdown(result: dict, profile: str) -> str:
    k = len(result["networks"])
    first, last = result["steps"]
    lines = [f"# The entropy claim during RL: {profile}, {result['model']}", "",
             METHOD.format(first=first, last=last, k=k, df=k - 1, alpha=ALPHA, margin=MARGIN) + ".", "",
             "## Premise: the entropy gap to BF16 over the run (signed G, mean over networks, 95% t interval)", "",
             "| recipe | networks | mean G (nats) | 95% CI |", "| --- | --- | --- | --- |"]
    for p in result["premise"]:
        lines.append(f"| {p['recipe']} | {p['n']} | {_f(p['mean'])} | [{_f(p['ci_low'])}, {_f(p['ci_high'])}] |")
    lines += ["", f"## {CLAIM}", "",
              "| networks | part | |G mxfp4| - |G mxfp4+aqn| | 95% CI | p held | p contradicted | p no dominance | "
              "verdict | decided by |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        lines.append(f"| {r['networks']} | {r['part']} | {_f(r['diff'])} | [{_f(r['ci_low'])}, {_f(r['ci_high'])}] | "
                     f"{p_value(r['p_held'])} | {p_value(r['p_contradicted'])} | {p_value(r['p_no_dominance'])} | "
                     f"{r['verdict']} | "
                     f"{r['decided_by'] or MISSING} |")
    z = result["between_half_z"]
    z2 = _f(None if z is None else z * z, "{:.2f}")
    lines += ["", f"Between-half z of the contrast: {_f(z, '{:+.2f}')} (z^2 {z2}; 1 expected where the contrast "
              "replicates)."
              + (" **The halves disagree on the verdict.**" if result["halves_differ"] else ""),
              f"Networks the observed spread would need for 80% power at the larger of the observed difference and the "
              f"margin: {result['networks_needed'] if result['networks_needed'] is not None else MISSING} "
              f"(this run: {k}).",
              "", "## Per network (seed): G of each recipe (nats)", "",
              "| network | G mxfp4 | G mxfp4+aqn | |G mxfp4| - |G mxfp4+aqn| |", "| --- | --- | --- | --- |"]
    plain, corrected = (p["per_network"] for p in result["premise"])
    for n in result["networks"]:
        lines.append(f"| {n} | {_f(plain[n])} | {_f(corrected[n])} | {_f(abs(plain[n]) - abs(corrected[n]))} |")
    return "\n".join(lines) + "\n"


def csv_rows(result: dict) -> list[dict]:
    """Every network's per-step gaps, tidy (one row per network, recipe and step)."""
    first = result["steps"][0]
    return [{"model": result["model"], "recipe": r, "network": n, "step": first + i, "gap": v}
            for r, by_net in result["trajectory"].items() for n, gaps in by_net.items() for i, v in enumerate(gaps)]


def run(steps_csv: Path | str, profile: str, out_md: Path | str, out_csv: Path | str | None = None) -> list[dict]:
    """Every model's test from a run's ``steps.csv``, written as markdown (and the per-step gaps as CSV)."""
    rows = read_csv(Path(steps_csv))
    models = sorted({r["model"] for r in rows})
    if not models:
        raise ValueError(f"{steps_csv}: no steps")
    results = [analyse(rows, m) for m in models]
    write_text_atomic(out_md, "\n".join(markdown(r, profile) for r in results))
    if out_csv is not None:
        write_csv([row for r in results for row in csv_rows(r)], Path(out_csv))
    return [{k: v for k, v in row.items() if not k.startswith("_")} for r in results for row in r["rows"]]

"""The pathway matrix as markdown tables: per model and checkpoint, each arm's effect on the three
pathways against the unquantized arm, with 95% intervals and n; then, per pathway, each component's
excess harm over its energy-matched controls and the Shapley values of the eight-arm game."""

from __future__ import annotations

from ..analysis.pathways.spec import MAPPING
from ..io import write_text_atomic
from .formatting import MISSING
from .tables import read_text_table

COLUMNS = (  # (metric, header, turn a cosine into 1 - cosine)
    ("grad_cosine", "1 - grad cosine", True),
    ("grad_rel_norm_error", "grad rel. norm error", False),
    ("grad_norm_ratio", "grad norm ratio", False),
    ("rollout_accuracy_diff", "rollout accuracy diff", False),
    ("entropy_diff", "token entropy diff", False),
    ("tf_solution_loglik_diff", "solution log-lik. diff (TF)", False),
    ("tf_entropy_diff", "token entropy diff (TF)", False),
    ("tf_kl", "token KL to unquantized (TF)", False),
    ("weight_energy_scale", "weight scale-bias energy", False),
)


def checkpoint_label(checkpoint: str, form: str = "canonical") -> str:
    """The checkpoint as tables name it: a gain-form row's carries its form (``warm (gain)``)."""
    return checkpoint if form != "gain" else f"{checkpoint} ({form})"


CLAIM_PATHWAYS = tuple(MAPPING)  # gradient, rollout, entropy


def warm_claim_rows(rows: list[dict], form: str, suffix: str):
    """(pathway, row) of each claim-level row ``<pathway><suffix>`` (``_claim``, ``_recovery_claim``) at the
    warm start in decomposition ``form``, with an estimate: what the claims table and the power design read."""
    label = checkpoint_label("warm", form)
    for r in rows:
        pathway = r["metric"].removesuffix(suffix)
        if pathway in CLAIM_PATHWAYS and r["metric"] == pathway + suffix and r["checkpoint"] == label \
                and r["mean"] not in ("", None):
            yield pathway, r


def read_rows(path) -> list[dict]:
    """pathways.csv as dicts, each checkpoint named by ``checkpoint_label``, so every table, figure and
    claim keeps the two forms apart."""
    rows = read_text_table(path, "pathways")
    for r in rows:
        r["checkpoint"] = checkpoint_label(r["checkpoint"], r.get("form") or "canonical")
    return rows


def main_site(metric: str) -> str:
    """The site a metric's headline row is read at: gradients with MXFP4 in the forward and backward GEMMs
    (``both``), rollouts and entropy in the forward pass, weight statistics on the weights."""
    return "both" if metric.startswith("grad_") else "weights" if metric.startswith("weight_") else "forward"


def estimate(r: dict, flip: bool = False) -> tuple[float, float | None, float | None]:
    """(mean, ci_low, ci_high) of a pathways.csv row; ``flip`` turns a cosine into 1 - cosine (the
    interval's ends swap)."""
    m = float(r["mean"])
    lo, hi = (float(r[k]) if r[k] not in ("", None) else None for k in ("ci_low", "ci_high"))
    if flip:
        m, lo, hi = 1 - m, (None if hi is None else 1 - hi), (None if lo is None else 1 - lo)
    return m, lo, hi


def _cell(r: dict | None, flip: bool) -> str:
    if r is None or r["mean"] in ("", None):
        return MISSING
    m, lo, hi = estimate(r, flip)
    ci = "" if lo is None else f" [{lo:+.3f}, {hi:+.3f}]"
    return f"{m:+.3f}{ci}"


def markdown(rows: list[dict]) -> str:
    out = ["| model | checkpoint | arm | " + " | ".join(h for _, h, _ in COLUMNS) + " |",
           "| --- | --- | --- | " + " | ".join("---" for _ in COLUMNS) + " |"]
    keys = list(dict.fromkeys((r["model"], r["checkpoint"]) for r in rows))
    for model, ckpt in keys:
        mine = [r for r in rows if r["model"] == model and r["checkpoint"] == ckpt and r["layer"] == "total"]
        arms = [a for a in dict.fromkeys(r["injection"] for r in mine)
                if (a[0] in "+-" and " vs " not in a) or a == "all" or a.startswith("rule:")]
        for arm in arms:
            cells = []
            for metric, _, flip in COLUMNS:
                hit = [
                    r
                    for r in mine
                    if r["injection"] == arm and r["metric"] == metric and r["site"] == main_site(metric)
                ]
                cells.append(_cell(hit[0] if hit else None, flip))
            out.append(f"| {model} | {ckpt} | {arm} | " + " | ".join(cells) + " |")
        n = {m: next((r["n"] for r in mine if r["metric"] == m), MISSING)
             for m in ("grad_cosine", "entropy_diff", "tf_entropy_diff")}
        skipped = next((r for r in mine if r["metric"] == "skipped_zero_advantage_batches"), None)
        ratios = [
            f"k={r['metric'].rsplit('k', 1)[1]}: {float(r['mean']):.2f}"
            for r in mine
            if r["metric"].startswith("interaction_ratio") and r["mean"] not in ("", None)
        ]
        skipped_note = "" if skipped is None else f" ({int(float(skipped['mean']))} skipped: all-zero advantages)"
        notes = dict.fromkeys((m for m, _, _ in COLUMNS), "")
        notes["grad_cosine"] = f"{n['grad_cosine']} batches{skipped_note}"
        notes["rollout_accuracy_diff"] = (f"{n['entropy_diff']} prompts, paired" if n["entropy_diff"] != MISSING else
                                          f"{n['tf_entropy_diff']} prompts, paired (TF only: no arm but the "
                                          "unquantized one sampled)")
        notes["entropy_diff"] = ("interaction ratio " + ", ".join(ratios)) if ratios else ""
        notes["tf_entropy_diff"] = "TF: teacher-forced, the same tokens under every arm"
        out.append(f"| {model} | {ckpt} | n | " + " | ".join(notes.values()) + " |")
    return "\n".join(out) + "\n"


ATTRIBUTION = (  # (metric suffix, injection, header)
    *(("excess_harm", f"+{c} vs +{c}~{k}", f"excess +{c} (~{k[:5]}.)") for c in ("scale", "dead", "grid")
      for k in ("signflip", "gaussian", "permuted")),
    *(("shapley", f"shapley:{c}", f"Shapley {c}") for c in ("scale", "dead", "grid", "interaction")),
)


def attribution_markdown(rows: list[dict]) -> str:
    """Per model, checkpoint and pathway: excess harm of each component over each matched control
    (paired t, 95%) and the Shapley values with the interaction (bootstrap 95%)."""
    present = [r for r in rows if r["metric"].endswith(("_excess_harm", "_shapley"))]
    if not present:
        return ""
    out = ["| model | checkpoint | pathway | " + " | ".join(h for *_, h in ATTRIBUTION) + " |",
           "| --- | --- | --- | " + " | ".join("---" for _ in ATTRIBUTION) + " |"]
    for model, ckpt in dict.fromkeys((r["model"], r["checkpoint"]) for r in present):
        for pathway in ("gradient", "rollout", "entropy"):
            cells = []
            for suffix, injection, _ in ATTRIBUTION:
                hit = [r for r in present if (r["model"], r["checkpoint"], r["metric"], r["injection"])
                       == (model, ckpt, f"{pathway}_{suffix}", injection)]
                cells.append(_cell(hit[0] if hit else None, False))
            if any(c != MISSING for c in cells):
                out.append(f"| {model} | {ckpt} | {pathway} | " + " | ".join(cells) + " |")
    return ("\n## Attribution: excess harm over energy-matched controls, and Shapley values\n\nHarm = 1 - gradient "
            "cosine; - teacher-forced log-likelihood of the correct solution; teacher-forced token entropy. Excess = "
            "harm(+c) - harm(+c~control), paired over the same units (a column stays empty where the profile has no "
            "such control); Shapley over the arms none, +c, all, -c (per unit, bootstrap interval).\n\n"
            + "\n".join(out) + "\n")


def sites_markdown(rows: list[dict]) -> str:
    """Per model and checkpoint with more than one gradient site: 1 - gradient cosine of each arm at each
    site (forward only, backward only, both), total and per layer by depth (input side first)."""
    grad = [r for r in rows if r["metric"] == "grad_cosine" and r["mean"] not in ("", None)]
    out = []
    for model, ckpt in dict.fromkeys((r["model"], r["checkpoint"]) for r in grad):
        mine = [r for r in grad if (r["model"], r["checkpoint"]) == (model, ckpt)]
        sites = list(dict.fromkeys(r["site"] for r in mine))
        if len(sites) < 2:
            continue
        layers = sorted({r["layer"] for r in mine if r["layer"].startswith("layer")}, key=lambda x: int(x[5:]))
        out += [f"\n### {model} ({ckpt})\n", "| arm | site | total | " + " | ".join(layers) + " |",
                "| --- | --- | --- | " + " | ".join("---" for _ in layers) + " |"]
        for arm in dict.fromkeys(r["injection"] for r in mine if r["site"] != "both"):
            for site in sites:
                hit = {r["layer"]: r for r in mine if r["injection"] == arm and r["site"] == site}
                if hit:
                    out.append(f"| {arm} | {site} | " + " | ".join(_cell(hit.get(x), True) for x in ["total", *layers])
                               + " |")
    if not out:
        return ""
    return ("\n## Gradient accuracy by site and depth\n\n1 - gradient cosine against the unquantized gradient, "
            "with MXFP4's component injected in the forward GEMMs only, the backward GEMMs only, or both; per layer "
            "from the input side (95% intervals over the gradient batches).\n" + "\n".join(out) + "\n")


def recovery_markdown(rows: list[dict]) -> str:
    """Per model, checkpoint and correction arm: what MXFP4 plus that correction recovers on each pathway
    (MXFP4's harm minus the arm's, paired t, 95%). Correction arms have no decomposition form: each
    checkpoint once."""
    present = [r for r in rows if r["metric"].endswith("_recovery") and r["mean"] not in ("", None)]
    if not present:
        return ""
    out = ["| model | checkpoint | correction arm | " + " | ".join(CLAIM_PATHWAYS) + " |",
           "| --- | --- | --- | " + " | ".join("---" for _ in CLAIM_PATHWAYS) + " |"]
    shown: dict[tuple, str] = {}
    for r in present:
        shown.setdefault((r["model"], r["checkpoint"].split(" (")[0]), r["checkpoint"])
    for (model, _), ckpt in shown.items():
        mine = {(r["injection"], r["metric"]): r for r in present if (r["model"], r["checkpoint"]) == (model, ckpt)}
        for arm in dict.fromkeys(a for a, _ in mine):
            cells = [_cell(mine.get((arm, f"{p}_recovery")), False) for p in CLAIM_PATHWAYS]
            out.append(f"| {model} | {ckpt.split(' (')[0]} | {arm} | " + " | ".join(cells) + " |")
        n = {p: next((r["n"] for (_, m), r in mine.items() if m == f"{p}_recovery"), MISSING) for p in CLAIM_PATHWAYS}
        out.append(f"| {model} | n | | {n['gradient']} batches | {n['rollout']} prompts | {n['entropy']} prompts |")
    return ("\n## Recovery: MXFP4 plus one correction against plain MXFP4\n\nRecovery = harm(MXFP4) - harm(MXFP4 + "
            "the correction) per unit, paired over the same units (> 0: the correction recovers); harm = 1 - gradient "
            "cosine; - teacher-forced log-likelihood of the correct solution; the teacher-forced token entropy's gap "
            "to the unquantized arm's. 95% t intervals.\n\n" + "\n".join(out) + "\n")


def run(pathways_csv, out_md) -> str:
    rows = read_rows(pathways_csv)
    text = markdown(rows) + recovery_markdown(rows) + attribution_markdown(rows) + sites_markdown(rows)
    write_text_atomic(out_md, text)
    return text

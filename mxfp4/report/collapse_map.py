"""The collapse map's page: which decoder layers and which operand role carry W4A4 MXFP4's damage to a named model
before RL (``analysis.collapse_map``'s rows)."""

from __future__ import annotations

from pathlib import Path

from ..io import write_text_atomic
from .formatting import MISSING


def _num(v, fmt: str) -> str:
    return MISSING if v is None else fmt.format(v)


def markdown(rows: list[dict], profile: str) -> str:
    model = rows[0]["model"]
    refs = {r["config"]: r for r in rows if r["kind"] == "reference"}
    layers = sorted((r for r in rows if r["kind"] == "layer"), key=lambda r: -(r["nll_gap_removed"] or 0))
    out = [f"# Where W4A4 MXFP4 breaks {model} before RL (`{profile}`)", "",
           "About this model. Measures: the teacher-forced negative log-likelihood per token of the correct worked "
           f"solutions of {rows[0]['prompts']} real GSM8K test problems (the same for every configuration: paired), "
           "and the share of MXFP4's excess over BF16 each configuration removes; for the roles and the layers that "
           "remove most, GSM8K strict accuracy before RL over the held-out problems (lm-eval; BF16's and MXFP4's are "
           "the real board's, on the same problems) and the cosine of the solutions' loss gradient to BF16's. One "
           "measurement each (no interval: a map of where to look, not a test).", "",
           f"BF16: NLL {refs['bf16']['solution_nll']:.4f}; MXFP4: NLL {refs['mxfp4']['solution_nll']:.4f}, gradient "
           f"cosine {_num(refs['mxfp4']['grad_cosine'], '{:.4f}')}.", "",
           "## Each operand role alone quantized", "",
           "| role quantized | solution NLL | share of MXFP4's excess | strict accuracy (problems) | gradient cosine |",
           "| --- | --- | --- | --- | --- |"]
    for r in (r for r in rows if r["kind"] == "role"):
        carried = None if r["nll_gap_removed"] is None else 1 - r["nll_gap_removed"]
        out.append(f"| {r['config']} | {r['solution_nll']:.4f} | {_num(carried, '{:.3f}')} "
                   f"| {_num(r['strict_accuracy'], '{:.3f}')} ({r['problems'] or MISSING}) "
                   f"| {_num(r['grad_cosine'], '{:.4f}')} |")
    out += ["", "## One decoder layer in BF16, the rest MXFP4 (most removed first)", "",
            "| layer | solution NLL | share of MXFP4's excess removed | strict accuracy (problems) | gradient cosine |",
            "| --- | --- | --- | --- | --- |"]
    for r in layers:
        out.append(f"| {r['layer']} | {r['solution_nll']:.4f} | {_num(r['nll_gap_removed'], '{:+.3f}')} "
                   f"| {_num(r['strict_accuracy'], '{:.3f}')} ({r['problems'] or MISSING}) "
                   f"| {_num(r['grad_cosine'], '{:.4f}')} |")
    total = sum(r["nll_gap_removed"] or 0 for r in layers)
    out += ["", f"The layers' shares sum to {total:+.3f} (1 would mean the damage adds up layer by layer).", ""]
    return "\n".join(out)


def write(rows: list[dict], profile: str, out_md: Path | str) -> None:
    write_text_atomic(out_md, markdown(rows, profile))

"""Numerical check of the decomposition identity over the standard distributions and formats.

``mxfp4 prove`` runs it and writes a JSON report: one case per (distribution, format, scale rule,
dtype, form), each with the largest identity residual (absolute, and relative to the element's
magnitude), the Shapley efficiency residual, the energy shares and the pairwise cosines of the
components. It fails (exit 1) when any residual exceeds float64 round-off. The gain form is checked on
every distribution and format at the default rule in float32, and on 16-bit inputs.
"""

from __future__ import annotations

import torch

from ..numerics.decompose import FORMS, PAIRS, decompose
from ..numerics.formats import FORMATS, SCALE_RULES_E8M0
from .distributions import DISTRIBUTIONS, sample

# Residual per element relative to max(|x|, |MX(x)|): a few float64 operations deep.
IDENTITY_TOL_REL = 64 * torch.finfo(torch.float64).eps
# Shapley efficiency: the sum of eight energies, relative to the total.
SHAPLEY_TOL_REL = 1e-12

REPORTED = (
    "identity_residual",
    "identity_residual_rel",
    "shapley_residual",
    "energy_total",
    "share_scale",
    "share_dead",
    "share_grid",
    "cross_share",
    "shapley_share_scale",
    "shapley_share_dead",
    "shapley_share_grid",
    "deadzone_fraction",
    "saturation_fraction",
    *(f"cosine_{a}_{b}" for a, b in PAIRS),
)


def cases(rows: int, cols: int):
    """(distribution, format, rule, dtype, form): every distribution x format at the default rule in
    float32 in both forms, the other E8M0 rules on MXFP4 (canonical), and bfloat16/float16 on the
    ordinary distributions in both forms."""
    for form in FORMS:
        for dist in DISTRIBUTIONS:
            for fmt in FORMATS:
                yield dist, fmt, None, torch.float32, form
    for dist in DISTRIBUTIONS:
        for rule in SCALE_RULES_E8M0[1:]:
            yield dist, "mxfp4", rule, torch.float32, "canonical"
    for form in FORMS:
        for dist in ("gaussian", "laplace", "student_t3", "llm_rows", "exact_ties"):
            for dtype in (torch.bfloat16, torch.float16):
                yield dist, "mxfp4", None, dtype, form


def run_proofs(rows: int = 128, cols: int = 1024, seed: int = 0, progress=None) -> dict:
    results = []
    all_cases = list(cases(rows, cols))
    for i, (dist, fmt, rule, dtype, form) in enumerate(all_cases):
        x = sample(dist, rows, cols, seed=seed, dtype=dtype)
        stats = decompose(x, fmt, axis=-1, scale_rule=rule, form=form).stats
        entry = {
            "distribution": dist,
            "format": fmt,
            "scale_rule": stats["scale_rule"],
            "dtype": str(dtype).removeprefix("torch."),
            "form": form,
        }
        entry.update({k: stats[k] for k in REPORTED})
        shapley_rel = (
            stats["shapley_residual"] / stats["energy_total"]
            if stats["energy_total"] > 0
            else stats["shapley_residual"]
        )
        entry["passed"] = bool(stats["identity_residual_rel"] <= IDENTITY_TOL_REL and shapley_rel <= SHAPLEY_TOL_REL)
        results.append(entry)
        if progress:
            progress(i + 1, len(all_cases), entry)
    return {
        "shape": [rows, cols],
        "seed": seed,
        "identity_tolerance_rel": IDENTITY_TOL_REL,
        "shapley_tolerance_rel": SHAPLEY_TOL_REL,
        "max_identity_residual": max(r["identity_residual"] for r in results),
        "max_identity_residual_rel": max(r["identity_residual_rel"] for r in results),
        "passed": all(r["passed"] for r in results),
        "cases": results,
    }

"""The depth study's two measurements of one model at its warm start (``mxfp4.analysis.depth``): the per-layer
gradient measures of each component, its control and full MXFP4 (``depth``), and the short SGD and AdamW runs'
per-layer displacement (``depth-optimizers``). The tables, tests and figures over every model are the rules of
workflow/rules/depth.smk."""

from __future__ import annotations

import sys

from . import Study, register_study


def _measured(measure, run, model: str, out) -> list[str]:
    units = measure(run, model, out_units=out, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    return [f"wrote {out} ({len(units)} rows)"]


def gradients(run, model: str, out, args) -> list[str]:
    """The per-layer gradient rows of ``model`` into ``out`` (called as ``Study.run`` says)."""
    from ..analysis.depth import run_depth

    return _measured(run_depth, run, model, out)


def optimizers(run, model: str, out, args) -> list[str]:
    """The short runs' per-layer displacement rows of ``model`` into ``out`` (the profile's ``depth_optimizers``)."""
    from ..analysis.depth import run_depth_optimizers

    return _measured(run_depth_optimizers, run, model, out)


DEPTH = register_study(Study(
    name="depth", run=f"{__name__}:gradients", method="`mxfp4.analysis.depth`", collect=False,
    help="the depth study: per-layer gradient norm ratio and cosine of each component, its control and full MXFP4 "
         "against the unquantized gradient",
    models=lambda profile: profile.tiny_models(),
    path=lambda layout, model: layout.root / "depth" / f"{model}_units.csv"))

DEPTH_OPTIMIZERS = register_study(Study(
    name="depth-optimizers", run=f"{__name__}:optimizers", method="`mxfp4.analysis.depth`", collect=False,
    help="the depth study's short runs: per-layer displacement of SGD and AdamW with the scale component, its "
         "control and no injection",
    models=lambda profile: profile.tiny_models(),
    path=lambda layout, model: layout.root / "depth" / "optimizers" / f"{model}_units.csv",
    settings=lambda profile: profile.depth_optimizers.model_dump_json() if profile.depth_optimizers else ""))

"""The depth study (``mxfp4.analysis.depth``, profile ``depth``): per model at its warm start, the per-layer gradient
measures of each component, its control and full MXFP4 (``depth-gradients``) and the short SGD and AdamW runs'
per-layer displacement (``depth-runs``); over the models, the depth law with its shrinkage split (``depth``) and the
short runs' test (``depth-optimizers``), each with its figure."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

from ..config.profiles import DepthOptimizerSettings
from . import Study, register_study


def _measured(measure, run, model: str, out) -> list[str]:
    units = measure(run, model, out_units=out, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    return [f"wrote {out} ({len(units)} rows)"]


def gradients(run, model: str, out, args) -> list[str]:
    """The per-layer gradient rows of ``model`` into ``out`` (called as ``Study.run`` says)."""
    from ..analysis.depth import run_depth

    return _measured(run_depth, run, model, out)


def optimizers(run, model: str, out, args) -> list[str]:
    """The short runs' per-layer displacement rows of ``model`` into ``out`` (the profile's depth-optimizers block)."""
    from ..analysis.depth import run_depth_optimizers

    return _measured(functools.partial(run_depth_optimizers, settings=_runs_settings(run)), run, model, out)


def gradient_units(layout, profile) -> list[Path]:
    """Every tiny model's per-layer gradient rows (``depth-gradients``): what the depth law is computed from."""
    return [DEPTH_GRADIENTS.output(layout, m) for m in profile.tiny_models()]


def run_units(layout, profile) -> list[Path]:
    """Every tiny model's short-run rows (``depth-runs``), where the profile has a depth-optimizers block."""
    return ([DEPTH_RUNS.output(layout, m) for m in profile.tiny_models()] if DEPTH_OPTIMIZERS.settings_of(profile)
            else [])


def _runs_settings(run):
    settings = DEPTH_OPTIMIZERS.settings_of(run.profile)
    if settings is None:
        raise ValueError(f"profile {run.name!r} has no depth-optimizers block; accepted: studies: {{depth-optimizers: "
                         "{...}} (see experiments/profiles/depth.yaml)")
    return settings


def needs(profile, settings) -> None:
    """The short runs draw their GRPO batches as the pathway matrix does, on tiny stand-ins."""
    if profile.pathways is None or not profile.tiny_models():
        raise ValueError("the short runs draw their GRPO batches as the pathway matrix does, on tiny stand-ins; "
                         "accepted: a pathways section and tiny models (see experiments/profiles/depth.yaml)")


def shrinkage(out) -> Path:
    """Where the depth law's shrinkage split goes beside its table."""
    return Path(out).with_name("depth_shrinkage.csv")


def law(run, model, out, args) -> list[str]:
    """The depth law's table into ``out`` (``.md`` beside it) and its shrinkage split, from every model's rows.

    Args:
        run: the profile's ``Run``.
        model: None (a profile study).
        out: the table written.
        args: the command's options (none of its own).
    """
    from ..report.depth_shrinkage import run as shrinkage_table
    from ..report.depth_table import run as depth_table

    units = [str(p) for p in gradient_units(run.layout, run.profile)]
    rows = depth_table(units, out)
    shrinkage_table(units, shrinkage(out))
    return [f"wrote {out} ({len(rows)} rows), {out.with_suffix('.md').name} and {shrinkage(out).name}"]


def optimizer_test(run, model, out, args) -> list[str]:
    """The short runs' table and test into ``out`` (``.md`` beside it), from every model's rows.

    Args:
        run: the profile's ``Run`` (its depth-optimizers block).
        model: None (a profile study).
        out: the table written.
        args: the command's options (none of its own).
    """
    from ..report.depth_optimizers import run as optimizer_table

    _runs_settings(run)
    rows = optimizer_table([str(p) for p in run_units(run.layout, run.profile)], out)
    return [f"wrote {out} ({len(rows)} rows) and {out.with_suffix('.md').name}"]


DEPTH_GRADIENTS = register_study(Study(
    name="depth-gradients", run=f"{__name__}:gradients", method="`mxfp4.analysis.depth`", collect=False,
    help="the depth study: per-layer gradient norm ratio and cosine of each component, its control and full MXFP4 "
         "against the unquantized gradient",
    models=lambda profile: profile.tiny_models(),
    path=lambda layout, model: layout.root / "depth" / f"{model}_units.csv"))

DEPTH_RUNS = register_study(Study(
    name="depth-runs", run=f"{__name__}:optimizers", method="`mxfp4.analysis.depth`", collect=False,
    help="the depth study's short runs: per-layer displacement of SGD and AdamW with the scale component, its "
         "control and no injection",
    models=lambda profile: profile.tiny_models(),
    path=lambda layout, model: layout.root / "depth" / "optimizers" / f"{model}_units.csv",
    settings=lambda profile: DEPTH_OPTIMIZERS.made_from(profile)))

DEPTH = register_study(Study(
    name="depth", run=f"{__name__}:law", scope="profile", loads_models=False, method="`mxfp4.analysis.depth`",
    help="the depth law: the slope of log(gradient norm ratio) per layer of every model, shallow to deep, and its "
         "split into shrink and misalignment with the shrinkage-bias test",
    path=lambda layout, model: layout.depth,
    beside=lambda out: [Path(out).with_suffix(".md"), shrinkage(out), shrinkage(out).with_suffix(".md")],
    inputs=gradient_units, stores=gradient_units,
    caption="depth", category="Depth"))

DEPTH_OPTIMIZERS = register_study(Study(
    name="depth-optimizers", run=f"{__name__}:optimizer_test", scope="profile", loads_models=False,
    method="`mxfp4.analysis.depth`",
    help="whether the gain reaches the weights: the slope of log(displacement norm ratio) per layer under SGD and "
         "AdamW, and the test fixed in the profile",
    path=lambda layout, model: layout.depth_optimizers,
    beside=lambda out: [Path(out).with_suffix(".md")],
    inputs=run_units,
    stores=lambda layout, profile: [], caption="depth_optimizers", category="Depth",
    settings_model=DepthOptimizerSettings, defaults=False, check=needs))

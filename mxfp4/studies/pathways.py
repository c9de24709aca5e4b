"""The pathway matrix (``mxfp4.analysis.pathways``): per model and checkpoint, each error component injected alone (or
removed) beside its energy-matched control, on gradients, rollouts and entropy, with every unit's harm beside the
rows (``pathways``); every model's and checkpoint's rows in one table (``pathways-table``)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..layout import METRICS, REFERENCE_RECIPE
from . import Study, register_study


def options(parser, types) -> None:
    parser.add_argument("--checkpoint", default=None, choices=["warm", "grpo"],
                        help="one checkpoint only (default: every one the profile's pathways.checkpoints names, "
                             "without unit rows)")


def units_of(out) -> Path:
    """Where every unit's harm goes beside a checkpoint's rows (``warm.csv`` → ``warm_units.csv``)."""
    out = Path(out)
    return out.with_name(f"{out.stem}_units.csv")


def write_rows(run, model: str, out, checkpoint: str | None = None, dose: str | None = None) -> list[str]:
    """One model's pathway rows into ``out`` (at ``checkpoint``, every one without; the warm start given ``dose``
    first) and, at one checkpoint, every unit's harm beside them; the lines the command prints."""
    from ..analysis.pathways.matrix import run_pathways

    units = units_of(out) if checkpoint else None
    rows = run_pathways(run, model, out_csv=out, progress=lambda msg: print(msg, file=sys.stderr, flush=True),
                        checkpoint=checkpoint, out_units=units, dose=dose)
    return [f"wrote {out} ({len(rows)} rows)" + (f" and {units}" if units else "")]


def measure(run, model: str, out, args) -> list[str]:
    """One model's pathway rows into ``out`` and, at one checkpoint, every unit's harm beside them.

    Args:
        run: the profile's ``Run``.
        model: a model line of the profile.
        out: the rows written.
        args: the command's options (``--checkpoint``).
    """
    return write_rows(run, model, out, args.checkpoint)


def checkpoints(profile) -> list[str]:
    return list(profile.pathways.checkpoints) if profile.pathways else []


def measured_policies(layout, profile, model: str, checkpoint: str) -> list[Path]:
    """The warm start is measured as soon as it exists; the policies after GRPO need every measured seed's bf16
    cell."""
    if checkpoint != "grpo":
        return []
    return [layout.cell(model, REFERENCE_RECIPE, s) / METRICS for s in profile.pathway_seeds]


PATHWAYS = register_study(Study(
    name="pathways", run=f"{__name__}:measure", options=options, axes=("checkpoint",),
    axis_values=lambda profile, config: {"checkpoint": checkpoints(profile)},
    path=lambda layout, model, checkpoint: layout.pathways(model, checkpoint),
    beside=lambda out: [units_of(out)],
    job_inputs=measured_policies, collect=False,
    priority=10,  # the longest jobs of the DAG: started as soon as their inputs exist, the cells fill the other core
    method="`mxfp4.analysis.pathways`",
    help="the pathway matrix: each error component injected alone, on gradients, rollouts, entropy"))


def every_checkpoint(layout, profile) -> list[Path]:
    """Every model's rows at every checkpoint the profile measures: what the table joins."""
    return [PATHWAYS.output(layout, m, checkpoint=c) for m in profile.models for c in checkpoints(profile)]


def table(run, model, out, args) -> list[str]:
    """The matrix as a markdown table ``out``, from every model's and checkpoint's rows in one tidy CSV beside it.

    Args:
        run: the profile's ``Run``.
        model: None (a profile study).
        out: the markdown written.
        args: the command's options (none of its own).
    """
    from ..io import write_text_atomic
    from ..report.pathway_table import run as markdown

    parts = [p.read_text().splitlines() for p in every_checkpoint(run.layout, run.profile)]
    if not parts:
        raise ValueError(f"profile {run.profile.name!r} measures no pathways (no pathways.checkpoints); accepted: "
                         "a profile with a pathways section")
    rows = out.with_suffix(".csv")
    write_text_atomic(rows, "\n".join(parts[0][:1] + [line for p in parts for line in p[1:]]) + "\n")
    markdown(rows, out)
    return [f"wrote {out} and {rows.name}"]


register_study(Study(
    name="pathways-table", run=f"{__name__}:table", scope="profile", loads_models=False,
    path=lambda layout, model: layout.pathways().with_suffix(".md"), beside=lambda out: [Path(out).with_suffix(".csv")],
    inputs=every_checkpoint, caption="pathways_table", category="Pathway matrix", method="`mxfp4.analysis.pathways`",
    help="every model's and checkpoint's pathway rows in one table, and the matrix in markdown"))

"""The entropy claim during RL with the network as the replicate (``mxfp4.report.entropy_trajectory``): each
recipe's entropy gap to BF16 per network from a run's ``steps.csv``, AQN against MXFP4 in three symmetric outcomes,
on all networks and on each fixed half (a profile of several warm starts with bf16, mxfp4 and mxfp4+aqn cells:
networks-rl)."""

from __future__ import annotations

from pathlib import Path

from . import Study, register_study


def options(parser, types) -> None:
    parser.add_argument("--steps", default=None,
                        help="the run's steps.csv (default: the profile's aggregate/steps.csv)")


def run(run, model, out, args) -> list[str]:
    """The test of every model of ``args.steps`` into ``out`` (markdown) and the per-step gaps beside it (``.csv``).

    Args:
        run: the profile's ``Run``.
        model: None (a profile study).
        out: the markdown report written.
        args: the command's options (``--steps``).
    """
    from ..report.entropy_trajectory import run as decide

    rows = decide(args.steps or run.layout.table("steps"), run.name, out, out.with_suffix(".csv"))
    lines = [f"{r['part']}: {r['verdict']}" + (f" ({r['decided_by']})" if r["decided_by"] else "") for r in rows]
    return [*lines, f"wrote {out} and {out.with_suffix('.csv')}"]


ENTROPY_TRAJECTORY = register_study(Study(
    name="entropy-trajectory", run=f"{__name__}:run", scope="profile", options=options, loads_models=False,
    help="AQN against MXFP4's entropy gap to BF16 during RL, over networks",
    method="The entropy claim during RL (profile `networks-rl`, ``report.entropy_trajectory``)",
    path=lambda layout, model: layout.root / "entropy_trajectory.md",
    beside=lambda out: [Path(out).with_suffix(".csv")],
    inputs=lambda layout, profile: [layout.table("steps")],
    stores=lambda layout, profile: [layout.table("cells"), layout.table("steps")],
    caption="entropy_trajectory", category="Claims"))

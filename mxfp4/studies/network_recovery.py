"""The headline recovery with the network as the replicate (``mxfp4.report.network_recovery``): mxfp4+all against
BF16 per held-out problem and network on the crossed model, in the family the profile's design fixed (its block,
``studies: {network-recovery: {...}}``, written by ``--design`` from a pilot), on all networks and on each fixed half
(networks-rl)."""

from __future__ import annotations

from pathlib import Path

from ..config.profiles import HeadlineDesign
from . import Study, register_study


def options(parser, types) -> None:
    parser.add_argument("--cells", default=None,
                        help="the run's cells.csv (default: the profile's aggregate/cells.csv)")
    parser.add_argument("--items", default=None,
                        help="the run's items.csv (default: the profile's aggregate/items.csv)")
    parser.add_argument("--items-arithmetic", default=None,
                        help="the run's items_arithmetic.csv (default: the profile's, where it holds out arithmetic)")
    parser.add_argument("--design", action="store_true",
                        help="print the headline design (the profile's network-recovery block) from a pilot's items "
                             "instead")
    parser.add_argument("--stand-in", default="mxfp4",
                        help="with --design: the pilot's recipe against bf16 (default mxfp4)")


def _arithmetic(layout, profile) -> list[Path]:
    return [layout.table("items_arithmetic")] if profile.data.arithmetic_held_out else []


def run(run, model, out, args) -> list[str]:
    """The recovery test into ``out`` (markdown) and its rows beside it (``.csv``); with ``--design``, the headline
    design from a pilot's items, printed.

    Args:
        run: the profile's ``Run``.
        model: None (a profile study).
        out: the markdown report written.
        args: the command's options (``--cells``, ``--items``, ``--items-arithmetic``, ``--design``, ``--stand-in``).
    """
    import yaml

    from ..report.aggregate import read_csv
    from ..report.network_recovery import design_from
    from ..report.network_recovery import run as decide

    items = args.items or run.layout.table("items")
    if args.design:
        rows = read_csv(items)
        return [yaml.safe_dump({"studies": {NETWORK_RECOVERY.name: design_from(rows, m, args.stand_in, run.name)}},
                               sort_keys=False).rstrip() for m in sorted({r["model"] for r in rows})]
    arithmetic = args.items_arithmetic or next(iter(_arithmetic(run.layout, run.profile)), None)
    design = NETWORK_RECOVERY.settings_of(run.profile)
    rows = decide(args.cells or run.layout.table("cells"), items, run.name, design, out,
                  out.with_suffix(".csv"), arithmetic)
    return [*(f"{r['model']} {r['split']} {r['metric']} {r['part']}: {r['verdict']}" for r in rows),
            f"wrote {out} and {out.with_suffix('.csv')}"]


def needs(profile, design) -> None:
    """The headline compares mxfp4+all with BF16 (and, where the profile is its own pilot, the stand-in too)."""
    wanted = {"bf16", "mxfp4+all"} | ({design.stand_in} if design.pilot == profile.name else set())
    if not wanted <= set(profile.recipes):
        raise ValueError(f"the headline compares mxfp4+all with bf16 (sized here on {design.stand_in} where the "
                         f"profile is its own pilot); accepted: recipes that include {', '.join(sorted(wanted))}, got "
                         f"{profile.recipes}")


def _tables(layout, profile) -> list[Path]:
    return [layout.table("cells"), layout.table("items"), *_arithmetic(layout, profile)]


NETWORK_RECOVERY = register_study(Study(
    name="network-recovery", run=f"{__name__}:run", scope="profile", options=options, loads_models=False,
    help="mxfp4+all against BF16's held-out accuracy over networks x problems (the headline)",
    method="The headline recovery over networks (profile `networks-rl`, ``report.network_recovery``)",
    path=lambda layout, model: layout.root / "recovery_networks.md",
    beside=lambda out: [Path(out).with_suffix(".csv")],
    inputs=_tables, stores=_tables, caption="network_recovery", category="Claims",
    settings_model=HeadlineDesign, defaults=False, check=needs))

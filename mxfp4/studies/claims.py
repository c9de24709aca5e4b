"""The paper's claims against what a profile measured (``mxfp4.report.claims``): the premise and sanity rows from the
cells, the decomposition proofs and the correction table, the mechanism and recovery claims from the pathway matrix
(with the per-unit files, three outcomes each), with seeds and intervals."""

from __future__ import annotations

from pathlib import Path

from . import Study, register_study
from .network_claims import unit_files


def options(parser, types) -> None:
    parser.add_argument("--cells", default=None, help="default results/<profile>/aggregate/cells.csv")
    parser.add_argument("--proofs", default=None, help="default results/<profile>/proofs/proofs.json")
    parser.add_argument("--corrections", default=None, help="default results/<profile>/corrections.json")
    parser.add_argument("--pathways", default=None, help="default results/<profile>/pathways/pathways.csv")
    parser.add_argument("--units", nargs="*", default=None,
                        help="the pathway matrix's per-unit files at the warm start (<model>_warm_units.csv): the "
                             "mechanism and recovery claims, three outcomes each (default: every model's, where the "
                             "profile fixes claims at the warm start; --units alone: none)")


def inputs(layout, profile) -> list[Path]:
    """The run's files the claims read: the cells (the precondition rows beside them), the proofs, the correction
    table, the pathway matrix and, where the profile fixes claims at the warm start, every model's per-unit file."""
    return [layout.table("cells"), layout.table("items"), layout.proofs, layout.corrections, layout.pathways(),
            *unit_files(layout, profile)]


def run(run, model, out, args) -> list[str]:
    """Every claim's row into ``out`` (markdown).

    Args:
        run: the profile's ``Run``.
        model: None (a profile study).
        out: the claims table written.
        args: the command's options (``--cells``, ``--proofs``, ``--corrections``, ``--pathways``, ``--units``).
    """
    from ..report.claims import run_claims

    layout = run.layout
    given = {"cells": args.cells or layout.table("cells"), "proofs": args.proofs or layout.proofs,
             "corrections": args.corrections or layout.corrections}
    for name, path in given.items():
        if not Path(path).is_file():
            raise ValueError(f"claims needs --{name} {path}, which does not exist (snakemake --cores all claims makes "
                             "it)")
    pathways = args.pathways or layout.pathways()
    if args.pathways and not Path(pathways).is_file():
        raise ValueError(f"claims: --pathways {pathways} does not exist (snakemake --cores all pathways makes it)")
    units = unit_files(layout, run.profile) if args.units is None else args.units
    rows = run_claims(given["cells"], given["proofs"], given["corrections"], out, run.name, pathways_csv=pathways,
                      unit_files=units)
    return [f"{r['verdict']:<40} {r['model']:<28} {r['claim']}" for r in rows]


CLAIMS = register_study(Study(
    name="claims", run=f"{__name__}:run", scope="profile", options=options, loads_models=False,
    help="the paper's claims against a profile's measurements (markdown)",
    method="`mxfp4.report.claims`", path=lambda layout, model: layout.claims,
    inputs=inputs, caption="claims", category="Claims"))

"""The claim-level tests with the network (warm start) as the replicate (``mxfp4.report.network_claims``),
recomputed from every model's per-unit file of the pathway matrix: three outcomes with the deciding rival, each half
of the networks apart (a profile whose ``pathways.claims`` fixes the tests at the warm start)."""

from __future__ import annotations

from pathlib import Path

from . import Study, register_study


def options(parser, types) -> None:
    parser.add_argument("units", nargs="*",
                        help="per-unit files of the pathway matrix (<checkpoint>_units.csv; default: every model's "
                             "warm-start file of the run)")


def unit_files(layout, profile) -> list[Path]:
    """Every model's warm-start per-unit file, where the profile fixes claims at the warm start (else none)."""
    settings = profile.pathways
    if settings is None or not settings.claims or "warm" not in settings.checkpoints:
        return []
    return [layout.pathway_units(m, "warm") for m in profile.models]


def run(run, model, out, args) -> list[str]:
    """Every claim-level test into ``out`` (markdown).

    Args:
        run: the profile's ``Run``.
        model: None (a profile study).
        out: the markdown table written.
        args: the command's options (the per-unit files).
    """
    from ..report.network_claims import run as decide

    rows = decide(args.units or unit_files(run.layout, run.profile), run.name, out)
    return [*(f"{r['family']:9s} {r['model']:12s} {r['claim']}: {r['verdict']} (decided by {r['decided_by']}; "
              f"halves: {' / '.join(r['half_verdicts'])})" for r in rows), f"wrote {out}"]


NETWORK_CLAIMS = register_study(Study(
    name="network-claims", run=f"{__name__}:run", scope="profile", options=options, loads_models=False,
    help="every claim-level test recomputed from the per-unit files with the network (warm start) as the "
         "replicate: three outcomes, the deciding rival, both halves",
    method="`mxfp4.report.network_claims`",
    path=lambda layout, model: layout.network_claims,
    inputs=unit_files, caption="claims", category="Claims"))

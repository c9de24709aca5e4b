"""The outlier dose-response (``mxfp4.report.dose_response``): the claim-level tests of the pathway matrix at every
outlier dose of the profile's ``dose_response`` section as one Holm family, and each component's excess harm over its
control against the dose (the points of the figure ``dose-response``). Each model's rows at each dose are the
pathway matrix's (``mxfp4 pathways --dose``, rule ``dose_pathways``)."""

from __future__ import annotations

from pathlib import Path

from ..layout import series_of
from . import Study, register_study


def dose_rows(layout, profile) -> list[Path]:
    """Every model's warm-start pathway rows at every dose (none where the profile has no dose_response section)."""
    doses = profile.dose_response.doses if profile.dose_response else []
    return [layout.dose_pathways(m, d) for m in profile.models for d in doses]


def run(run, model, out, args) -> list[str]:
    """The table into ``out`` (CSV), its page beside it (``.md``) and the figure's points (``series_of(out)``).

    Args:
        run: the profile's ``Run`` (its ``dose_response`` section and ``pathways.claims``).
        model: None (a profile study).
        out: the table written.
        args: the command's options (none of its own).
    """
    from ..report.dose_response import run as decide

    rows = decide(run.profile, run.layout, out, series_of(out))
    return [*(f"{r['dose']} {r['model']} {r['claim']}: {r['verdict']}" for r in rows),
            f"wrote {out}, {out.with_suffix('.md').name} and {series_of(out).name}"]


DOSE_RESPONSE = register_study(Study(
    name="dose-response", run=f"{__name__}:run", scope="profile", loads_models=False,
    help="the claim-level tests at every outlier dose (one Holm family) and each component's excess harm against "
         "the dose",
    method="The dose-response (``report.dose_response``)",
    path=lambda layout, model: layout.dose_response,
    beside=lambda out: [Path(out).with_suffix(".md"), series_of(out)],
    inputs=dose_rows, stores=lambda layout, profile: [], caption="dose_response", category="Dose-response",
    settings=lambda profile: profile.dose_response.model_dump_json() if profile.dose_response else ""))

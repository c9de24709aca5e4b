"""The outlier dose-response (``mxfp4.report.dose_response``): the claim-level tests of the pathway matrix at every
outlier dose of the profile's block (``studies: {dose-response: {doses, source}}``) as one Holm family, and each
component's excess harm over its control against the dose (the points of the figure ``dose-response``). Each model's
rows at each dose are the pathway matrix's at the warm start given that dose first (``dose-pathways``)."""

from __future__ import annotations

from pathlib import Path

from ..config.profiles import DoseResponseSettings
from ..layout import series_of
from . import Study, register_study
from .pathways import units_of, write_rows


def doses(profile) -> list[str]:
    """The profile's doses, in its order (none where it has no dose-response block)."""
    settings = DOSE_RESPONSE.settings_of(profile)
    return list(settings.doses) if settings else []


def needs(profile, settings) -> None:
    """A dose-response measures the warm start's pathway matrix of tiny stand-ins without outliers of their own."""
    if profile.pathways is None or "warm" not in profile.pathways.checkpoints:
        raise ValueError("the dose-response measures the warm start's pathway matrix at each dose; accepted: a "
                         "pathways section whose checkpoints include warm")
    tiny = all(m.arch for m in profile.models.values())
    if profile.pretrain is None or profile.pretrain.outlier_channels or not tiny:
        raise ValueError("the dose-response adds outlier channels to tiny stand-ins' warm starts; accepted: tiny "
                         "models only and a pretrain section with outlier_channels: 0 (doses do not stack)")


def dose_options(parser, types) -> None:
    parser.add_argument("--dose", required=True, help="an outlier dose (c<channels>x<factor>, e.g. c2x32) given to the "
                                                      "warm start first")


def measure(run, model: str, out, args) -> list[str]:
    """One model's warm-start pathway rows at ``args.dose`` into ``out``, every unit's harm beside them: the same
    policy (the transform keeps the function), batches and prompts as at every other dose.

    Args:
        run: the profile's ``Run``.
        model: a model line of the profile.
        out: the rows written.
        args: the command's options (``--dose``).
    """
    return write_rows(run, model, out, "warm", args.dose)


DOSE_PATHWAYS = register_study(Study(
    name="dose-pathways", run=f"{__name__}:measure", options=dose_options, axes=("dose",),
    axis_values=lambda profile, config: {"dose": doses(profile)},
    path=lambda layout, model, dose: layout.dose_pathways(model, dose), beside=lambda out: [units_of(out)],
    settings=lambda profile: DOSE_RESPONSE.made_from(profile), collect=False,
    method="The dose-response (``report.dose_response``)",
    help="the warm start's pathway matrix at one outlier dose, every unit's harm beside the rows"))


def dose_rows(layout, profile) -> list[Path]:
    """Every model's warm-start pathway rows at every dose (none where the profile has no dose-response block)."""
    return [DOSE_PATHWAYS.output(layout, m, dose=d) for m in profile.models for d in doses(profile)]


def run(run, model, out, args) -> list[str]:
    """The table into ``out`` (CSV), its page beside it (``.md``) and the figure's points (``series_of(out)``).

    Args:
        run: the profile's ``Run`` (its dose-response block and ``pathways.claims``).
        model: None (a profile study).
        out: the table written.
        args: the command's options (none of its own).
    """
    from ..report.dose_response import run as decide

    settings = DOSE_RESPONSE.settings_of(run.profile)
    if settings is None:
        raise ValueError(f"profile {run.name!r} has no dose-response block; accepted: studies: {{dose-response: "
                         "{doses, source}} (see experiments/profiles/dose-response.yaml)")
    rows = decide(run.profile, settings, run.layout, out, series_of(out))
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
    settings_model=DoseResponseSettings, defaults=False, check=needs))

"""A recipe's mechanism (``mxfp4.analysis.mechanism``): per model at its warm starts, the recipe's arm in the pathway
matrix beside MXFP4, BF16 and the profile's correction arms, unit by unit, with the error energy it removes
(``mechanism``, no RL); over the models, per pathway its harm against each rival, the network as the replicate
(``mechanism-report``)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from . import Study, compare_pilot, recipe_axis, register_study


def options(parser, types) -> None:
    parser.add_argument("--recipe", required=True, nargs="+",
                        help="the recipe whose mechanism is measured (several: each an arm, one per-unit file, --out)")
    parser.add_argument("--against", nargs="+", default=None,
                        help="a stored board's per-unit files: the mxfp4 and bf16 arms must reproduce them, checked "
                             "before any recipe's arm is measured")
    parser.add_argument("--no-energy", action="store_true",
                        help="measure no error energies (the .energy.json beside the units holds none)")


def energy_of(units) -> Path:
    """Where a run's error energies go beside its per-unit file."""
    return Path(units).with_suffix(".energy.json")


def cost_of(units) -> Path:
    """Where a run's measured cost (seconds, arms, networks) goes beside its per-unit file: the estimate of a
    recipe placed on a board reads it."""
    return Path(units).with_suffix(".run.json")


def measure_arms(run, model: str, recipes: list[str], out, against=None, energy: bool = True) -> list[str]:
    """The per-unit harms of ``recipes``' arms with MXFP4, BF16 and the profile's correction arms on ``model`` into
    ``out``, their error energies (none where ``energy`` is False) and the run's cost beside it; with ``against`` (a
    stored board's per-unit files), MXFP4's and BF16's arms must reproduce the board's before any recipe's arm is
    measured."""
    from ..analysis.mechanism import mechanism_arms, run_mechanism
    from ..config.recipes import refuse_redefined
    from ..io import write_json_atomic

    refuse_redefined(["mxfp4", *mechanism_arms(run.profile, recipes)], "mechanism")
    t0 = time.perf_counter()
    if against:
        from ..report.network_claims import read_units

        against = read_units(against)
    _, energies = run_mechanism(run, model, recipes, out,
                                progress=lambda line: print(line, file=sys.stderr, flush=True), energy=energy,
                                against=against)
    write_json_atomic(energy_of(out), energies)
    write_json_atomic(cost_of(out), {
        "seconds": time.perf_counter() - t0, "arms": 2 + len(mechanism_arms(run.profile, recipes)),
        "networks": len({run.profile.warm_start_of(s) for s in run.profile.seeds})})
    return [f"wrote {out} and {energy_of(out).name}"]


def measure(run, model: str, out, args) -> list[str]:
    """The per-unit harms of ``args.recipe``'s arms (with MXFP4, BF16 and the correction arms) into ``out``, their
    error energies and the run's cost beside it.

    Args:
        run: the profile's ``Run``.
        model: a model line of the profile.
        out: the per-unit file written.
        args: the command's options (``--recipe``, ``--against``, ``--no-energy``).
    """
    return measure_arms(run, model, args.recipe, out, args.against, energy=not args.no_energy)


def compared(profile, config) -> dict:
    """The run's compare recipe, on every tiny model (a pilot's: the first model's, where it is tiny)."""
    models = list(profile.models)[:1] if compare_pilot(config) else list(profile.models)
    return {**recipe_axis(profile, config), "model": [m for m in models if m in profile.tiny_models()]}


def definitions(recipes) -> str:
    """The recipes' definitions (``definition_digest``): a study's job records them, so redefining one reruns it."""
    from ..config.recipes import definition_digest

    return " ".join(definition_digest(r) for r in recipes)


MECHANISM = register_study(Study(
    name="mechanism", run=f"{__name__}:measure", options=options, axes=("recipe",),
    axis_values=compared, models=lambda profile: profile.tiny_models(),
    path=lambda layout, model, recipe: layout.mechanism_units(recipe, model),
    beside=lambda out: [energy_of(out), cost_of(out)], collect=False,
    job_settings=lambda profile, model, recipe: definitions([recipe]),
    priority=100,  # minutes, and the first answer a compare gives: before any cell
    method="`mxfp4.report.mechanism`",
    help="a recipe's arm in the pathway matrix at the warm starts, beside MXFP4, BF16 and the profile's correction "
         "arms, unit by unit (minutes: no RL)"))


def report_options(parser, types) -> None:
    parser.add_argument("--recipe", required=True, help="the recipe of the per-unit files")
    parser.add_argument("units", nargs="*", help="per-unit files of mxfp4 mechanism (their .energy.json read beside; "
                                                 "default: every tiny model's of the recipe in this run)")


def every_model(layout, profile, recipe) -> list[Path]:
    """Every tiny model's per-unit file of ``recipe``: the networks the report takes as its replicates."""
    return [MECHANISM.output(layout, m, recipe=recipe) for m in profile.tiny_models()]


def report(run, model, out, args) -> list[str]:
    """The mechanism report of ``args.recipe`` into ``out`` (its rows as ``.json`` beside it).

    Args:
        run: the profile's ``Run``.
        model: None (a profile study).
        out: the markdown report written.
        args: the command's options (``--recipe`` and the per-unit files).
    """
    from ..report.mechanism import run as decide
    from ..stats import first_non_finite

    units = args.units or [str(p) for p in every_model(run.layout, run.profile, args.recipe)]
    energy = []
    for path in map(energy_of, units):
        if not path.is_file():
            raise ValueError(f"{path}: missing; accepted: the .energy.json mxfp4 mechanism writes beside its units "
                             "(run it again)")
        rows = json.loads(path.read_text())
        bad = first_non_finite(rows)
        if bad is not None:
            raise ValueError(f"{path}: {bad[0]} is {bad[1]}, not a finite number; accepted: the energies mxfp4 "
                             "mechanism writes")
        energy += rows
    rows = decide(units, args.recipe, run.profile.name, out, energy)
    return [*(f"{r['model']:12s} {r['pathway']:9s} vs {r['rival']:16s} {r['verdict']} ({r['networks']} networks; "
              f"rank {r['rank']} of {r['arms']})" for r in rows), f"wrote {out}"]


MECHANISM_REPORT = register_study(Study(
    name="mechanism-report", run=f"{__name__}:report", scope="profile", options=report_options, loads_models=False,
    axes=("recipe",), axis_values=compared, over="mechanism",
    path=lambda layout, model, recipe: layout.mechanism(recipe),
    beside=lambda out: [Path(out).with_suffix(".json")],
    priority=100, method="`mxfp4.report.mechanism`",
    help="a recipe's mechanism decided from its per-unit files, the network as the replicate: against MXFP4, BF16 "
         "and each correction, per pathway"))

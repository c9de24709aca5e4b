"""A study written outside the package, as a user would (a module named in $MXFP4_PLUGINS): what it registers gets
its command, its rule and its path with nothing else added (tests/test_studies.py)."""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field

from mxfp4.studies import Study, register_study


class ToySettings(BaseModel):
    """The toy study's block of a profile (``studies: {toy-seeds: {scale: 3}}``)."""

    model_config = ConfigDict(extra="forbid")
    scale: int = Field(1, ge=1, description="what the seeds are multiplied by")


def options(parser, types) -> None:
    parser.add_argument("--scale", type=types.positive_int, default=None,
                        help="what the seeds are multiplied by (default: the profile's studies.toy-seeds.scale)")


def run(run, model: str, out, args) -> list[str]:
    scale = args.scale or TOY_SEEDS.settings_of(run.profile).scale
    seeds = [s * scale for s in run.profile.seeds]
    out.write_text(json.dumps({"model": model, "profile": run.profile.name, "seeds": seeds}))
    return [f"wrote {out}"]


TOY_SEEDS = register_study(Study(name="toy-seeds", help="the profile's seeds, scaled (a toy study)",
                                 run=f"{__name__}:run", options=options, suffix=".json", loads_models=False,
                                 method="A toy study", settings_model=ToySettings))


def summarise(run, model, out, args) -> list[str]:
    """A profile study: every model's seeds file of the run, summed into one page and a CSV beside it."""
    total = sum(sum(json.loads(run.layout.root.joinpath("toy_seeds", f"{m}.json").read_text())["seeds"])
                for m in run.profile.models)
    out.write_text(f"seeds summed over {len(run.profile.models)} models: {total}\n")
    out.with_suffix(".csv").write_text(f"total\n{total}\n")
    return [f"wrote {out}"]


register_study(Study(name="toy-summary", help="every model's toy seeds summed (a toy profile study)",
                     run=f"{__name__}:summarise", scope="profile", loads_models=False, method="A toy study",
                     path=lambda layout, model: layout.root / "toy_summary.md",
                     beside=lambda out: [out.with_suffix(".csv")],
                     inputs=lambda layout, profile: [layout.root / "toy_seeds" / f"{m}.json" for m in profile.models],
                     stores=lambda layout, profile: []))


def power_options(parser, types) -> None:
    parser.add_argument("--power", required=True, help="the power the seeds are raised to (an axis of the study)")


def powers(run, model: str, out, args) -> list[str]:
    """A model study with an axis: the profile's seeds raised to ``--power``, one file a model and power."""
    out.write_text(json.dumps([s ** int(args.power) for s in run.profile.seeds]))
    return [f"wrote {out}"]


TOY_POWERS = register_study(Study(
    name="toy-powers", help="the profile's seeds raised to a power (a toy study with an axis)",
    run=f"{__name__}:powers",
    options=power_options, loads_models=False, method="A toy study", axes=("power",),
    axis_values=lambda profile, config: {"power": ["1", "2"]},
    path=lambda layout, model, power: layout.root / "toy_powers" / model / f"{power}.json"))


def table_options(parser, types) -> None:
    power_options(parser, types)
    parser.add_argument("files", nargs="+", help="every model's toy-powers file at the power")


def power_table(run, model, out, args) -> list[str]:
    """A profile study over the model study at each of its axis' values: the files it is given, summed."""
    out.write_text(f"power {args.power}: {sum(sum(json.loads(open(f).read())) for f in args.files)}\n")
    return [f"wrote {out}"]


register_study(Study(
    name="toy-powers-table", help="every model's toy powers summed, per power (a toy profile study over a model "
    "study)", run=f"{__name__}:power_table", scope="profile", options=table_options, loads_models=False,
    method="A toy study", axes=("power",), axis_values=TOY_POWERS.axis_values, over="toy-powers",
    path=lambda layout, model, power: layout.root / "toy_powers" / f"table_{power}.md"))

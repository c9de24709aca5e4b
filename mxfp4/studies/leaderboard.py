"""The leaderboard (``mxfp4.report.leaderboard``): the field's MXFP4 recipes ranked at a network design's warm starts
by the share of MXFP4's harm each removes, the network as the replicate. Per model, every board arm's per-unit harms
(``leaderboard-units``); the board from this run's files (``leaderboard``); a user's recipe placed on the stored board
from its own mechanism run and step times (``leaderboard-place``). The rules that store a board and a placed recipe
with the baselines are ``workflow/rules/leaderboard.smk``'s."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from . import Study, recipe_axis, register_study
from .mechanism import cost_of, definitions, energy_of, every_model, measure_arms


class LeaderboardSettings(BaseModel):
    """The leaderboard's block of a profile (``studies: {leaderboard: {...}}``)."""

    model_config = ConfigDict(extra="forbid")
    accuracy_from: list[str] = Field(["embedded-large", "real-small"],
                                     description="profiles whose stored RL cells give a recipe's GSM8K accuracy "
                                                 "(another set of networks)")


def measure(run, model: str, out, args) -> list[str]:
    """Every board arm's per-unit harms on ``model`` into ``out`` (the profile's ``leaderboard`` beside MXFP4, BF16
    and its correction arms); error energies on a tiny model only (a named model's hundred million weights decomposed
    per recipe would outlast its units).

    Args:
        run: the profile's ``Run``.
        model: a model line of the profile.
        out: the per-unit file written (energies and the run's cost beside it).
        args: the command's options (none of its own).
    """
    recipes = list(run.profile.leaderboard)
    if not recipes:
        raise ValueError(f"profile {run.profile.name!r} ranks no recipes (leaderboard: [...]); accepted: e.g. networks")
    return measure_arms(run, model, recipes, out, energy=model in run.profile.tiny_models())


LEADERBOARD_UNITS = register_study(Study(
    name="leaderboard-units", run=f"{__name__}:measure",
    path=lambda layout, model: layout.leaderboard_units(model), beside=lambda out: [energy_of(out), cost_of(out)],
    job_settings=lambda profile, model: definitions(profile.leaderboard), method="`mxfp4.report.leaderboard`",
    help="every leaderboard arm's per-unit harms on one model at its warm starts, beside MXFP4, BF16 and the "
         "correction arms (no RL)"))


def board_units(layout, profile) -> list[Path]:
    """Every tiny model's per-unit file of the board's arms: the networks the board takes as its replicates."""
    return [LEADERBOARD_UNITS.output(layout, m) for m in profile.tiny_models()]


def _bench_option(parser) -> None:
    parser.add_argument("--bench", nargs="+", default=None,
                        help="bench_step.py JSON files (each recipe's step over the bf16 step of the same file)")


def options(parser, types) -> None:
    parser.add_argument("units", nargs="*", help="per-unit files of mxfp4 leaderboard-units (default: every tiny "
                                                 "model's of this run)")
    _bench_option(parser)


def _ranked(run, units: list[dict], out, benches: list, recipe: str | None, figure, draw: bool) -> list[str]:
    from ..report.leaderboard import run as rank

    settings = LEADERBOARD.settings_of(run.profile)
    boards = rank(units, run.profile.name, out, run.profile.leaderboard,
                  {str(b): json.loads(Path(b).read_text()) for b in benches},
                  [run.layout.sibling(p) for p in settings.accuracy_from], recipe, figure, draw_figure=draw)
    return [*(f"{model:12s} {r['rank']:2d}. {r['recipe']:20s} harm removed {r['mean']:+.3f}"
              for model, rows in boards.items() for r in rows), f"wrote {out}"]


def board(run, model, out, args) -> list[str]:
    """The board of the profile's recipes from this run's per-unit files and step times into ``out`` (its rows as
    ``.json`` beside it, from which the registered figure ``leaderboard`` is drawn; the page links it).

    Args:
        run: the profile's ``Run``.
        model: None (a profile study).
        out: the page written.
        args: the command's options (the per-unit files, ``--bench``).
    """
    from ..config.recipes import refuse_redefined
    from ..report.network_claims import read_units

    profile, layout = run.profile, run.layout
    if not profile.leaderboard:
        raise ValueError(f"profile {profile.name!r} ranks no recipes (leaderboard: [...]); accepted: e.g. networks")
    refuse_redefined(["mxfp4", *profile.leaderboard], "leaderboard")
    units = read_units(args.units or board_units(layout, profile))
    return _ranked(run, units, out, args.bench or [layout.leaderboard_bench], None, layout.figure("leaderboard"),
                   draw=False)


def _figure(layout, stem: str) -> list[Path]:
    return [layout.figure(stem), layout.figure(stem, ".pdf")]


LEADERBOARD = register_study(Study(
    name="leaderboard", run=f"{__name__}:board", scope="profile", options=options, loads_models=False,
    path=lambda layout, model: layout.leaderboard(), beside=lambda out: [Path(out).with_suffix(".json")],
    inputs=lambda layout, profile: [*board_units(layout, profile), layout.leaderboard_bench],
    settings_model=LeaderboardSettings, settings=lambda profile: json.dumps(profile.leaderboard),
    method="`mxfp4.report.leaderboard`",
    help="the profile's MXFP4 recipes ranked at its warm starts by the share of MXFP4's harm each removes, the network "
         "as the replicate"))


def placed_bench(layout, recipe: str) -> Path:
    """A placed recipe's step times beside BF16's and MXFP4's, from its own benchmark run."""
    return layout.root / "leaderboard" / f"step_times_{recipe}.json"


def place_options(parser, types) -> None:
    parser.add_argument("--recipe", required=True, help="the recipe placed on the stored board")
    parser.add_argument("units", nargs="*", help="per-unit files of mxfp4 mechanism --recipe <recipe> on the same "
                                                 "warm starts (default: every tiny model's of this run)")
    parser.add_argument("--board", nargs="+", default=None,
                        help="the board's per-unit files (default: the stored board's of the profile)")
    _bench_option(parser)


def stored_board(layout, profile) -> list[Path]:
    """The stored board's per-unit files and its step times: what a recipe is placed among."""
    return [layout.stored(p) for p in board_units(layout, profile)] + [layout.stored(layout.leaderboard_bench)]


def place(run, model, out, args) -> list[str]:
    """``args.recipe`` placed on the stored board: its arm merged into the board's per-unit files, ranked into
    ``out`` (its rows as ``.json`` beside it) and its figure, which ranks it apart from which.

    Args:
        run: the profile's ``Run``.
        model: None (a profile study).
        out: the page written.
        args: the command's options (``--recipe``, its per-unit files, ``--board``, ``--bench``).
    """
    from ..config.recipes import refuse_redefined
    from ..report.leaderboard import merged
    from ..report.network_claims import read_units

    profile, layout, recipe = run.profile, run.layout, args.recipe
    refuse_redefined(["mxfp4", *profile.leaderboard, recipe], "leaderboard")
    if recipe in (*profile.leaderboard, "mxfp4", "bf16"):
        raise ValueError(f"--recipe {recipe} is on the stored board; a recipe placed with its own units needs a name "
                         "of its own (rename it in your recipe file)")
    *stored_units, stored_bench = stored_board(layout, profile)
    units = merged(read_units(args.board or stored_units),
                   read_units(args.units or every_model(layout, profile, recipe)), recipe)
    benches = args.bench or [stored_bench, placed_bench(layout, recipe)]
    return _ranked(run, units, out, benches, recipe, layout.figure(f"leaderboard_{recipe}"), draw=True)


register_study(Study(
    name="leaderboard-place", run=f"{__name__}:place", scope="profile", options=place_options, loads_models=False,
    axes=("recipe",), axis_values=recipe_axis,
    over="mechanism", path=lambda layout, model, recipe: layout.leaderboard(recipe),
    beside=lambda out: [Path(out).with_suffix(".json")],
    figures=lambda layout, model, recipe: _figure(layout, f"leaderboard_{recipe}"),
    inputs=stored_board, job_inputs=lambda layout, profile, model, recipe: [placed_bench(layout, recipe)],
    settings=lambda profile: json.dumps(profile.leaderboard) + LEADERBOARD.made_from(profile),
    method="`mxfp4.report.leaderboard`",
    help="a user's recipe placed on the stored leaderboard from its own mechanism run and step times: its rank and the "
         "ranks it is told apart from"))

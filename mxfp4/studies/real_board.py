"""The real-model board (``mxfp4.analysis.real_board``, ``mxfp4.report.real_board``): every recipe on a named
pretrained model before RL, its held-out problems the replicate. Per named model, every board recipe's GSM8K accuracy
per problem, error completions and training-pass time (``real-board``), or a user's recipe's beside BF16
(``real-board-place``); the board ranked from this run's measures (``real-leaderboard``); the user's recipe placed on
the stored board once its BF16 reproduces the board's (``real-leaderboard-place``). The rules that store the board
and a placed recipe with the baselines are ``workflow/rules/real_board.smk``'s."""

from __future__ import annotations

import sys
from pathlib import Path

from . import Study, recipe_axis, register_study
from .leaderboard import LEADERBOARD_UNITS
from .mechanism import definitions


def board_recipes(profile) -> list[str]:
    """What the real board measures beside BF16: plain MXFP4, W4A16 and the profile's leaderboard."""
    return ["mxfp4", "mxfp4-w4a16", *profile.leaderboard]


def recipes_record(items) -> Path:
    """Where a board's record (per recipe: accuracy, error rates, training pass) goes beside its per-problem rows."""
    return Path(items).with_name("recipes.json")


def options(parser, types) -> None:
    parser.add_argument("--recipe", nargs="+", default=None,
                        help="the recipes measured (bf16 always, first; default: plain MXFP4, W4A16 and the profile's "
                             "leaderboard)")
    parser.add_argument("--times-only", action="store_true",
                        help="time the training pass of the folder's recipes again (every recipe in turn), nothing "
                             "else")


def _measured(run, model: str, recipes: list[str], out) -> list[str]:
    from ..analysis.real_board import measure as evaluate

    evaluate(run, model, recipes, Path(out).parent, progress=lambda line: print(line, file=sys.stderr, flush=True))
    return [f"wrote {out} and {recipes_record(out).name}"]


def measure(run, model: str, out, args) -> list[str]:
    """Every board recipe's measures before RL on ``model`` into ``out`` (``items.csv``; the record and lm-eval's
    output per recipe beside it, in its folder).

    Args:
        run: the profile's ``Run``.
        model: a named model line of the profile.
        out: the per-problem rows written.
        args: the command's options (``--recipe``, ``--times-only``).
    """
    if args.times_only:
        from ..analysis.real_board import retime

        retime(run, model, Path(out).parent)
        return [f"rewrote the training-pass times of {recipes_record(out)}"]
    return _measured(run, model, args.recipe or board_recipes(run.profile), out)


REAL_BOARD = register_study(Study(
    name="real-board", run=f"{__name__}:measure", options=options,
    path=lambda layout, model: layout.real_board(model) / "items.csv", beside=lambda out: [recipes_record(out)],
    models=lambda profile: profile.named_models(),
    job_settings=lambda profile, model: definitions(board_recipes(profile)),
    method="The real-model board (profile `real-small-board`, ``report.real_board``)",
    help="the real-model board's measures before RL: per recipe, GSM8K through lm-eval per held-out problem, error "
         "completions, a training pass's time"))


def place_options(parser, types) -> None:
    parser.add_argument("--recipe", required=True, help="the recipe measured beside bf16")


def measure_placed(run, model: str, out, args) -> list[str]:
    """``args.recipe``'s measures before RL on ``model`` beside BF16's, into ``out`` (its own folder).

    Args:
        run: the profile's ``Run``.
        model: a named model line of the profile.
        out: the per-problem rows written.
        args: the command's options (``--recipe``).
    """
    return _measured(run, model, [args.recipe], out)


REAL_BOARD_PLACE = register_study(Study(
    name="real-board-place", run=f"{__name__}:measure_placed", options=place_options, axes=("recipe",),
    axis_values=recipe_axis, models=lambda profile: profile.named_models()[:1],
    path=lambda layout, model, recipe: layout.real_board(model, recipe) / "items.csv",
    beside=lambda out: [recipes_record(out)],
    job_settings=lambda profile, model, recipe: definitions([recipe]),
    method="The real-model board (profile `real-small-board`, ``report.real_board``)",
    help="a user's recipe's measures before RL on the real board's model, beside BF16's (to place it on the stored "
         "board)"))


def board_model(profile) -> str:
    """The model the real board ranks recipes on: the profile's first named model."""
    named = profile.named_models()
    if not named:
        raise ValueError(f"profile {profile.name!r} has no named pretrained model; accepted: e.g. real-small-board")
    return named[0]


def _board_files(layout, profile) -> list[Path]:
    if not profile.named_models():
        return []
    model = board_model(profile)
    return [REAL_BOARD.output(layout, model), LEADERBOARD_UNITS.output(layout, model)]


def _rank(run, out, board_dir, units, recipe=None, recipe_dir=None) -> list[str]:
    from ..config.recipes import refuse_redefined
    from ..report.network_claims import read_units
    from ..report.real_board import read_board
    from ..report.real_board import run as rank

    refuse_redefined(list(read_board(board_dir)[1]["recipes"]) + ([recipe] if recipe else []), "the real-model board")
    rows = rank(board_dir, run.profile.name, out, read_units([units]), recipe, recipe_dir)
    return [*(f"{r['rank']:2d}. {r['recipe']:22s} strict before RL {r['accuracy']:.3f} (- bf16 {r['diff']:+.3f})"
              for r in rows), f"wrote {out}"]


def page_options(parser, types) -> None:
    parser.add_argument("--board", default=None, help="the board's per-problem rows, items.csv of mxfp4 real-board "
                                                      "(default: this run's of the profile's first named model)")
    parser.add_argument("--units", default=None, help="its pathway harms, the per-unit file of mxfp4 "
                                                      "leaderboard-units on the same model (default: this run's)")


def ranked(run, model, out, args) -> list[str]:
    """The real-model board ranked into ``out`` (its rows as ``.json`` beside it).

    Args:
        run: the profile's ``Run``.
        model: None (a profile study).
        out: the page written.
        args: the command's options (``--board``, ``--units``).
    """
    board_model(run.profile)  # a profile without a named model is refused in one line
    items, units = _board_files(run.layout, run.profile)
    return _rank(run, out, Path(args.board or items).parent, args.units or units)


register_study(Study(
    name="real-leaderboard", run=f"{__name__}:ranked", scope="profile", options=page_options, loads_models=False,
    path=lambda layout, model: layout.real_leaderboard(), beside=lambda out: [Path(out).with_suffix(".json")],
    inputs=_board_files, method="The real-model board (profile `real-small-board`, ``report.real_board``)",
    help="the real-model board: every recipe ranked on a named model before RL, its held-out problems the replicate"))


def stored_board(layout, profile) -> list[Path]:
    """The stored board's per-problem rows and pathway units: what a recipe is placed among."""
    return [layout.stored(p) for p in _board_files(layout, profile)]


def placed(run, model, out, args) -> list[str]:
    """``args.recipe`` placed on the stored real-model board, once its run's BF16 reproduces the board's problem by
    problem, ranked into ``out`` (its rows as ``.json`` beside it).

    Args:
        run: the profile's ``Run``.
        model: None (a profile study).
        out: the page written.
        args: the command's options (``--recipe``, ``--board``, ``--units``).
    """
    board_model(run.profile)
    items, units = stored_board(run.layout, run.profile)
    mine = REAL_BOARD_PLACE.output(run.layout, board_model(run.profile), recipe=args.recipe)
    return _rank(run, out, Path(args.board or items).parent, args.units or units, args.recipe, mine.parent)


register_study(Study(
    name="real-leaderboard-place", run=f"{__name__}:placed", scope="profile", loads_models=False,
    options=lambda parser, types: (place_options(parser, types), page_options(parser, types)),
    axes=("recipe",), axis_values=recipe_axis, path=lambda layout, model, recipe: layout.real_leaderboard(recipe),
    beside=lambda out: [Path(out).with_suffix(".json")], inputs=stored_board,
    job_inputs=lambda layout, profile, model, recipe: [REAL_BOARD_PLACE.output(layout, board_model(profile),
                                                                               recipe=recipe)],
    method="The real-model board (profile `real-small-board`, ``report.real_board``)",
    help="a user's recipe placed on the stored real-model board once its BF16 reproduces the board's: its rank and "
         "the ranks it is told apart from"))

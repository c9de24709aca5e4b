"""A named model's headline (``mxfp4.report.headline``): the tested W4A4 recipe and plain MXFP4 against BF16's own
seed-to-seed band, over its GRPO seeds x held-out problems, on all seeds and each fixed half, and every seed's
curves (profile real-small-headline)."""

from __future__ import annotations

from pathlib import Path

from ..layout import REFERENCE_RECIPE
from . import Study, register_study


def options(parser, types) -> None:
    parser.add_argument("--model", default=None, help="the model (default: the profile's first)")
    parser.add_argument("--recipe", default=None,
                        help="the recipe tested (default: the profile's one besides bf16 and the premise)")
    parser.add_argument("--premise", default="mxfp4", help="the recipe whose harm is the premise (default mxfp4)")
    parser.add_argument("--aggregate", default=None,
                        help="the folder of cells.csv, items.csv and steps.csv (default: the profile's aggregate/)")


def curves(out) -> Path:
    """Where the headline's curves go beside its page."""
    return Path(out).with_name("headline_curves.png")


def run(run, model, out, args) -> list[str]:
    """The headline of ``args.model`` into ``out`` (markdown), its rows beside it (``.csv``) and its curves.

    Args:
        run: the profile's ``Run``.
        model: None (a profile study; the model is ``--model``).
        out: the markdown report written.
        args: the command's options (``--model``, ``--recipe``, ``--premise``, ``--aggregate``).
    """
    from ..report.headline import run as decide

    profile = run.profile
    tested = [r for r in profile.recipes if r not in (REFERENCE_RECIPE, args.premise)]
    if args.recipe is None and len(tested) != 1:
        raise ValueError(f"profile {profile.name!r} runs {len(tested)} recipes besides {REFERENCE_RECIPE} and "
                         f"{args.premise} ({', '.join(tested) or 'none'}); name the one tested with --recipe")
    result = decide(args.aggregate or run.layout.aggregate, args.model or next(iter(profile.models)),
                    args.recipe or tested[0], profile.name, out, curves(out), args.premise)
    return [*(f"{r['contrast']} {r['part']}: {r['verdict']}" for r in result["rows"]),
            f"wrote {out}, {out.with_suffix('.csv').name} and {curves(out).name}"]


def _tables(layout, profile) -> list[Path]:
    return [layout.table("cells"), layout.table("items"), layout.table("steps")]


HEADLINE = register_study(Study(
    name="headline", run=f"{__name__}:run", scope="profile", options=options, loads_models=False,
    help="a named model's W4A4 recipe against BF16's seed-to-seed band after GRPO, over its seeds x held-out problems",
    method="The headline at seeds that decide it (profile `real-small-headline`, ``report.headline``)",
    path=lambda layout, model: layout.root / "headline.md",
    beside=lambda out: [Path(out).with_suffix(".csv"), curves(out)],
    inputs=_tables, stores=_tables))

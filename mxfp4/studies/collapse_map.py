"""The collapse map: where W4A4 breaks a named model before RL, one decoder layer at a time in BF16 and each
operand role alone quantized (``mxfp4.analysis.collapse_map``; its page, ``mxfp4.report.collapse_map``, beside the
CSV as ``.md``)."""

from __future__ import annotations

import sys

from . import Study, register_study


def options(parser, types) -> None:
    parser.add_argument("--problems", type=types.positive_int, default=None,
                        help="held-out problems evaluated (default: the profile's evaluation limit)")
    parser.add_argument("--prompts", type=types.positive_int, default=8,
                        help="GSM8K test solutions teacher-forced (default 8)")


def run(run, model: str, out, args) -> list[str]:
    """Measure every configuration into ``out`` and write its page beside it.

    Args:
        run: the profile's ``Run``.
        model: a named model line of the profile.
        out: the CSV written.
        args: the command's options (``--problems``, ``--prompts``).
    """
    from ..analysis.collapse_map import measure
    from ..report.collapse_map import write

    rows = measure(run, model, out, args.problems, args.prompts,
                   progress=lambda line: print(line, file=sys.stderr, flush=True))
    write(rows, run.profile.name, out.with_suffix(".md"))
    return [f"wrote {out} and {out.with_suffix('.md').name}"]


COLLAPSE_MAP = register_study(Study(
    name="collapse-map", run=f"{__name__}:run", options=options, method="Where W4A4 breaks the named model",
    models=lambda profile: profile.named_models(),
    help="where W4A4 breaks a named model before RL: one decoder layer at a time in BF16, each operand role alone "
         "quantized"))

"""The ``mxfp4`` command line: one subcommand per job the Snakemake rules and users run, in three groups
(``numerics``: tensors and files alone; ``runs``: a profile's models; ``reports``: a run's files), each a module
that adds its commands."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..layout import Layout
from ..studies import registered
from . import arguments, numerics, reports, runs
from .arguments import model_args, out_file, profile_args, run_of, writable

# Commands that load transformers models (the RL processes).
MODEL_COMMANDS = ("pretrain", "cell", "probe-batch", "corrections-table", "weight-components",
                  "recipe-cost")


def hide_torchao_from_transformers() -> None:
    """transformers imports torchao when it is installed (for its TorchAO quantizer) as soon as any
    model class loads: 4.6 s in every cell, pretraining and pathway process. torchao is installed
    here only as the kernel benchmark's peer and no model of the harness is torchao-quantized, so
    the model commands tell transformers it is absent before its quantizers are imported."""
    import transformers.utils as utils
    from transformers.utils import import_utils

    def unavailable(*args, **kwargs) -> bool:
        return False

    utils.is_torchao_available = import_utils.is_torchao_available = unavailable


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line naming the argument and what is accepted (the
    usage block is one ``--help`` away)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = OneLineParser(prog="mxfp4", description=__doc__)
    parser.add_argument("--version", action="version", version=f"mxfp4 {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for group in (numerics, runs, reports):
        group.add_commands(sub)
    for study in registered().values():  # the study registry: one command a study
        if study.name in sub.choices:
            raise ValueError(f"study {study.name!r} ({study.run}) is named like a command of mxfp4; accepted: a "
                             "name of its own")
        p = sub.add_parser(study.name, help=study.help)
        (model_args if study.scope == "model" else profile_args)(p)
        study.options(p, arguments)
        default = study.output(Layout("results", "PROFILE"), "MODEL" if study.scope == "model" else None,
                               **{a: a.upper() for a in study.axes})
        p.add_argument("--out", type=out_file, default=None, help=f"the file written (default: {default})")
        p.set_defaults(func=_run_study, study=study)
    return parser


def _run_study(args) -> int:
    """A registered study's command: its function on the run, the model (None for a profile study) and the output
    it writes."""
    model = args.model if args.study.scope == "model" else None
    run = run_of(args)
    args.study.settings_of(run.profile)  # its block of the profile, checked before any work
    axes = {a: getattr(args, a) for a in args.study.axes}  # its options add them; None where one is left out
    several = [a for a, v in axes.items() if isinstance(v, list) and len(v) > 1]
    if several and args.out is None:
        raise ValueError(f"{len(axes[several[0]])} values of --{several[0]} measured together need --out (one file "
                         "for all)")
    axes = {a: v[0] if isinstance(v, list) else v for a, v in axes.items()}
    out = writable(args.out or args.study.output(args.layout, model, **axes))
    for figure in args.study.figures(args.layout, model, **axes):  # drawn by the command itself
        writable(figure)
    for line in args.study.function()(run, model, out, args):
        print(line)
    return 0


TORCH_WRITE_FAILURES = ("unexpected pos", "PytorchStreamWriter failed", "No space left on device")


def torch_write_failure(args) -> str:
    """One line for torch.save's write failure (a RuntimeError, not an OSError): usually a full disk."""
    import shutil

    folder = Path(getattr(args, "results", None) or ".")
    free = shutil.disk_usage(folder if folder.exists() else ".").free / 2**30
    return (f"torch.save could not write a checkpoint or tensor file ({free:.1f} GiB free where {folder} is): "
            "the disk is probably full; free space and rerun (a cell resumes from its last valid checkpoint)")


def os_error(err: OSError) -> str:
    """One line for an OSError: what the file system refused, on which file."""
    import errno

    where = f" {err.filename}" if err.filename else ""
    if err.errno == errno.ENOENT:
        return f"no such file or folder{where}"
    if err.errno == errno.ENOSPC:
        return f"cannot write{where}: the disk is full (No space left on device)"
    if err.errno == errno.EROFS:
        return f"cannot write{where}: the file system is read-only"
    return f"cannot write{where}: {err.strerror or err}"


def main(argv: list[str] | None = None) -> int:
    from ..machine import pin_cpu_numerics

    try:
        pin_cpu_numerics()  # before torch loads: the same numbers on every x86-64 machine
    except ValueError as err:
        print(f"mxfp4: error: {err}", file=sys.stderr)
        return 2
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # a usage error (one line, already printed), --help or --version
        return exit_.code
    except ValueError as err:  # a plugin that does not import, or registers a study under a taken name
        print(f"mxfp4: error: {err}", file=sys.stderr)
        return 2
    threads = os.environ.get("MXFP4_THREADS")
    if threads:
        import torch

        if not threads.isdigit() or int(threads) < 1:
            print(f"mxfp4: error: MXFP4_THREADS={threads!r}; accepted: a positive integer", file=sys.stderr)
            return 2
        torch.set_num_threads(int(threads))
    if args.command in MODEL_COMMANDS or getattr(getattr(args, "study", None), "loads_models", False):
        hide_torchao_from_transformers()
    if isinstance(getattr(args, "results", None), str) and isinstance(getattr(args, "profile", None), str):
        args.layout = Layout(args.results, args.profile)  # every path of the command's run
    try:
        return args.func(args)
    except (ValueError, FloatingPointError) as err:  # bad input, a diverged run: one line (MXFP4_TRACEBACK=1: +trace)
        if os.environ.get("MXFP4_TRACEBACK") == "1":
            import traceback

            traceback.print_exc()
        print(f"mxfp4 {args.command}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the file system's refusal: a missing input, permissions, a full or read-only disk
        print(f"mxfp4 {args.command}: error: {os_error(err)}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        if not any(m in str(err) for m in TORCH_WRITE_FAILURES):
            raise
        print(f"mxfp4 {args.command}: error: {torch_write_failure(args)}", file=sys.stderr)
        return 2

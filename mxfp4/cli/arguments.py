"""What the commands share: argument types, the profile and model arguments, and the helpers that load
a tensor or write a table."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from ..io import writable_folder, write_text_atomic

MAX_SAMPLE = 2**26  # elements of a decompose --dist sample, and of a prove test tensor
SAMPLE_DEFAULTS = {"rows": 256, "cols": 1024, "dtype": "float32", "seed": 0}  # decompose --dist only


def int_argument(low: int, high: int | None, accepted: str):
    """An argparse type: an integer in [low, high] (no upper bound for None), refused with ``accepted``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer; accepted: {accepted}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value}; accepted: {accepted}")
        return value

    return parse


def out_file(text: str) -> str:
    """An argparse type: a file to write, refused at once when it names a folder (not after the work)."""
    if Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; accepted: the path of a file to write")
    return text


def registered(what: str, registry: str):
    """An argparse type: a name in the registry ``registry`` ("module:attribute", imported when the argument is
    read, so that building the command line does not import torch: most jobs, the reports and figures, never
    read such a name); ``what`` names it in the error."""

    def parse(text: str) -> str:
        module, _, attribute = registry.partition(":")
        names = getattr(importlib.import_module(module), attribute)
        if text not in names:
            raise argparse.ArgumentTypeError(f"unknown {what} {text!r}; accepted: {', '.join(names)}")
        return text

    return parse


format_name = registered("format", "mxfp4.numerics.formats:FORMATS")  # `mxfp4 formats` lists them
distribution_name = registered("distribution", "mxfp4.verify.distributions:DISTRIBUTIONS")


positive_int = int_argument(1, None, "an integer >= 1")  # a count of rows, columns or layers
seed_int = int_argument(0, 2**32 - 1, "an integer in [0, 2**32 - 1]")  # numpy's and torch's seed range


def writable(path: Path | str) -> Path:
    """``path``, its folder made and checked writable before any work: an OSError (caught by ``main``
    as one line) rather than a result lost at the end."""
    writable_folder(Path(path).parent)
    return Path(path)


def load_tensor(args):
    import torch

    from ..verify.distributions import sample

    if args.tensor:
        given = [f"--{k}" for k in SAMPLE_DEFAULTS if getattr(args, k) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} describe a --dist sample and do not apply to --tensor; drop them")
        if not Path(args.tensor).is_file():
            raise ValueError(f"--tensor {args.tensor}: no such file (accepted: a file saved with torch.save)")
        try:
            obj = torch.load(args.tensor, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - any unreadable file is bad input
            raise ValueError(
                f"--tensor {args.tensor}: not a torch.save file of tensors ({type(err).__name__}: {err})"
            ) from None
        if isinstance(obj, dict):
            if args.key is None:
                raise ValueError(
                    f"{args.tensor} holds several tensors; pick one with --key from: {', '.join(map(str, obj))}"
                )
            if args.key not in obj:
                raise ValueError(f"--key {args.key!r} is not in {args.tensor}; accepted: {', '.join(map(str, obj))}")
            obj = obj[args.key]
        if not isinstance(obj, torch.Tensor):
            raise ValueError(f"{args.tensor} does not hold a tensor (got {type(obj).__name__})")
        return obj, args.tensor
    if args.key is not None:
        raise ValueError("--key picks a tensor of a --tensor file; it does not apply to --dist")
    opt = {k: default if getattr(args, k) is None else getattr(args, k) for k, default in SAMPLE_DEFAULTS.items()}
    dist = args.dist or "gaussian"
    if opt["rows"] * opt["cols"] > MAX_SAMPLE:
        raise ValueError(f"--rows x --cols = {opt['rows'] * opt['cols']:,} elements; accepted: at most {MAX_SAMPLE:,} "
                         "(the float64 split holds several copies; use --tensor for a larger saved tensor)")
    x = sample(dist, opt["rows"], opt["cols"], seed=opt["seed"], dtype=getattr(torch, opt["dtype"]))
    return x, dist


def check_plot_input(spec, path: Path) -> None:
    """A CSV input with a header holding the figure's columns and at least one row."""
    import csv

    if not spec.columns:
        return
    with path.open(encoding="utf-8", errors="replace", newline="") as f:
        reader = csv.reader(f)
        header, first = next(reader, []), next(reader, None)
    missing = [c for c in spec.columns if c not in header]
    if missing or first is None:
        what = f"no {', '.join(missing)} column" if missing else "a header and no rows"
        raise ValueError(f"plot {spec.name}: {path} is not the {spec.reads} ({what})")


def write_table(rows: list[dict], out: Path, markdown: str) -> int:
    """A command's rows as a CSV at ``out`` and its markdown summary beside it (``.md``)."""
    from ..report.aggregate import write_csv

    write_csv(rows, writable(out))
    write_text_atomic(out.with_suffix(".md"), markdown)
    print(f"wrote {out} and {out.with_suffix('.md')} ({len(rows)} rows)")
    return 0


def profile_of(args):
    """The command's profile, loaded and validated once (every layer below takes the ``Profile``)."""
    from ..config.profiles import load_profile

    return load_profile(args.profile)


def run_of(args):
    """The command's run: its profile (``profile_of``) with the layout ``main`` made for it (``args.layout``)."""
    from ..config.run import Run

    return Run(profile_of(args), args.layout)


def profile_args(p) -> None:
    """The arguments of a command that works on a profile's results."""
    p.add_argument("--profile", default="embedded", help="a profile of experiments/profiles/ (default embedded)")
    p.add_argument("--results", default="results", help="the results root (default results)")


def model_args(p) -> None:
    """The arguments of a command that works on one model of a profile."""
    profile_args(p)
    p.add_argument("--model", required=True, help="a model line of the profile (e.g. tiny-dense)")

"""The ``mxfp4`` command line: one subcommand per job the Snakemake rules and users run."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .io import write_json_atomic


def _cmd_formats(args) -> int:
    from .formats import FORMATS

    print(f"{'format':<12} {'element':<8} {'scale':<6} {'block':>5}  scale rules")
    for f in FORMATS.values():
        print(f"{f.name:<12} {f.element.name:<8} {f.scale:<6} {f.block_size:>5}  {', '.join(f.scale_rules)}")
    return 0


def _load_tensor(args):
    import torch

    from .distributions import sample

    if args.tensor:
        obj = torch.load(args.tensor, map_location="cpu", weights_only=True)
        if isinstance(obj, dict):
            if args.key is None:
                raise SystemExit(f"{args.tensor} holds several tensors; pick one with --key from: {', '.join(obj)}")
            obj = obj[args.key]
        if not isinstance(obj, torch.Tensor):
            raise SystemExit(f"{args.tensor} does not hold a tensor (got {type(obj).__name__})")
        return obj, args.tensor
    dtype = getattr(torch, args.dtype)
    return sample(args.dist, args.rows, args.cols, seed=args.seed, dtype=dtype), args.dist


def _cmd_decompose(args) -> int:
    from .decompose import COMPONENTS, decompose

    x, label = _load_tensor(args)
    stats = decompose(x, args.format, axis=args.axis, scale_rule=args.scale_rule).stats
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    print(f"{label}: {stats['format']} ({stats['scale_rule']}), shape {stats['shape']}, axis {stats['axis']}")
    print(f"{'component':<10} {'energy':>12} {'share':>8} {'shapley':>8} {'mean':>12}")
    for c in COMPONENTS:
        print(
            f"{c:<10} {stats[f'energy_{c}']:>12.5g} {stats[f'share_{c}']:>8.3f} "
            f"{stats[f'shapley_share_{c}']:>8.3f} {stats[f'mean_{c}']:>12.4g}"
        )
    print(f"{'cross':<10} {stats['cross_term']:>12.5g} {stats['cross_share']:>8.3f}")
    print(f"{'total':<10} {stats['energy_total']:>12.5g} {1.0:>8.3f} {1.0:>8.3f} {stats['mean_total']:>12.4g}")
    print(
        f"deadzone {stats['deadzone_fraction']:.4f}  saturated {stats['saturation_fraction']:.4f}  "
        f"relative error {stats['relative_error']:.4f}  identity residual {stats['identity_residual']:.3g}"
    )
    return 0


def _cmd_prove(args) -> int:
    from .prove import run_proofs

    def progress(i, n, entry):
        flag = "ok " if entry["passed"] else "FAIL"
        print(
            f"[{i:3d}/{n}] {flag} {entry['distribution']:<16} {entry['format']:<11} {entry['scale_rule']:<6} "
            f"{entry['dtype']:<9} residual {entry['identity_residual_rel']:.2e}",
            file=sys.stderr,
        )

    report = run_proofs(rows=args.rows, cols=args.cols, seed=args.seed, progress=progress)
    write_json_atomic(Path(args.out), report)
    print(f"{len(report['cases'])} cases, max relative identity residual {report['max_identity_residual_rel']:.3g}: "
          f"{'passed' if report['passed'] else 'FAILED'} -> {args.out}")
    return 0 if report["passed"] else 1


def _cmd_plot(args) -> int:
    from . import plots

    source = {"decomposition": args.proofs, "corrections": args.corrections, "training": args.steps,
              "accuracy": args.cells, "kernels": args.bench}[args.figure]
    if source is None:
        raise ValueError(f"plot {args.figure} needs its input file (see mxfp4 plot --help)")
    draw = {"decomposition": plots.decomposition_shares, "corrections": plots.correction_effects,
            "training": plots.training_curves, "accuracy": plots.accuracy_bars, "kernels": plots.kernel_throughput}
    paths = draw[args.figure](source, args.out)
    print("wrote " + ", ".join(map(str, paths)))
    return 0


def _cmd_aggregate(args) -> int:
    from .aggregate import aggregate

    counts = aggregate(args.results, args.profile, args.out or Path(args.results) / args.profile / "aggregate")
    print(f"aggregated {counts['cells']} cells, {counts['steps']} steps")
    return 0


def _cmd_claims(args) -> int:
    from .claims import run_claims

    rows = run_claims(args.cells, args.proofs, args.corrections, args.out, Path(args.cells).parent.parent.name)
    for r in rows:
        print(f"{r['held']:<40} {r['model']:<28} {r['claim']}")
    return 0


def _cmd_compare(args) -> int:
    from .compare import run_compare

    baselines = args.baselines or Path(args.results) / "baselines" / args.profile / "cells.csv"
    rows = run_compare(args.results, args.profile, args.recipe, baselines, args.out, args.figure)
    for r in rows:
        if r["metric"] == "gsm8k_strict_accuracy":
            print(f"{r['model']:<12} vs {r['baseline']:<16} accuracy {r['diff']:+.4f}: {r['verdict']}")
    return 0


def _cmd_corrections_table(args) -> int:
    from . import correction_table as ct
    from .io import write_json_atomic

    paths = {"tiny-dense": args.dense, "tiny-moe": args.moe}
    table = ct.rows(ct.build_sources(paths))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(ct.markdown(table))
    if args.json:
        write_json_atomic(args.json, table)
    print(f"wrote {args.out}")
    return 0


def _cmd_pretrain(args) -> int:
    from .pretrain import pretrain
    from .profiles import load_profile, model_dir

    profile = load_profile(args.profile, args.results)
    spec = profile["models"].get(args.model)
    if spec is None or "arch" not in spec:
        tiny = [m for m, s in profile["models"].items() if "arch" in s]
        raise ValueError(f"{args.model!r} is not a tiny model of profile {args.profile!r}; accepted: {', '.join(tiny)}")
    out = Path(args.out) if args.out else model_dir(args.results, args.profile, args.model)
    meta = pretrain(spec["arch"], out, max_steps_per_problem=profile["data"]["max_problem_steps"], **profile["pretrain"])
    print(json.dumps(meta, indent=2))
    return 0


def _cmd_cell(args) -> int:
    from .cell import cell_main

    return cell_main(args)


def build_parser() -> argparse.ArgumentParser:
    from .distributions import DISTRIBUTIONS
    from .formats import FORMATS

    parser = argparse.ArgumentParser(prog="mxfp4", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("formats", help="list the block formats and their scale rules").set_defaults(func=_cmd_formats)

    p = sub.add_parser("decompose", help="split one tensor's quantization error into its three components")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--tensor", help="a file saved with torch.save (a tensor, or a dict of them with --key)")
    src.add_argument("--dist", default="gaussian", choices=list(DISTRIBUTIONS), help="a named distribution")
    p.add_argument("--key", help="the tensor's key when --tensor holds a dict")
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--cols", type=int, default=1024)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--format", default="mxfp4", choices=list(FORMATS))
    p.add_argument("--scale-rule", default=None, help="floor (default), ceil, even, rceil; nearest for nvfp4")
    p.add_argument("--axis", type=int, default=-1, help="the axis the blocks run along")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.set_defaults(func=_cmd_decompose)

    p = sub.add_parser("prove", help="check the decomposition identity numerically; writes a JSON report")
    p.add_argument("--out", default="results/proofs.json")
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--cols", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_prove)

    p = sub.add_parser("corrections-table", help="each correction's effect on each error component (markdown)")
    p.add_argument("--out", default="docs/corrections.md")
    p.add_argument("--json", default=None, help="also write the rows as JSON")
    p.add_argument("--dense", default=None, help="a tiny dense checkpoint folder (default: random init)")
    p.add_argument("--moe", default=None, help="a tiny MoE checkpoint folder (default: random init)")
    p.set_defaults(func=_cmd_corrections_table)

    p = sub.add_parser("pretrain", help="warm-start a profile's tiny model with SFT and save it")
    p.add_argument("--profile", default="embedded")
    p.add_argument("--model", required=True)
    p.add_argument("--results", default="results")
    p.add_argument("--out", default=None, help="folder to save to (default results/<profile>/models/<model>)")
    p.set_defaults(func=_cmd_pretrain)

    p = sub.add_parser("cell", help="one ablation cell: GRPO under a recipe, then GSM8K eval via lm-eval")
    p.add_argument("--profile", default="embedded")
    p.add_argument("--model", required=True)
    p.add_argument("--recipe", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results", default="results")
    p.add_argument("--recipes", default=None, help="a recipes YAML (default experiments/recipes.yaml)")
    p.set_defaults(func=_cmd_cell)

    p = sub.add_parser("aggregate", help="tidy CSVs of a profile's finished cells (cells, steps, summary)")
    p.add_argument("--profile", default="embedded")
    p.add_argument("--results", default="results")
    p.add_argument("--out", default=None)
    p.set_defaults(func=_cmd_aggregate)

    p = sub.add_parser("claims", help="the paper's claims against a profile's measurements (markdown)")
    p.add_argument("--cells", required=True)
    p.add_argument("--proofs", required=True)
    p.add_argument("--corrections", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_claims)

    p = sub.add_parser("compare", help="a recipe's cells against stored baselines, with intervals and verdicts")
    p.add_argument("--profile", default="embedded")
    p.add_argument("--recipe", required=True)
    p.add_argument("--results", default="results")
    p.add_argument("--baselines", default=None, help="default results/baselines/<profile>/cells.csv")
    p.add_argument("--out", required=True)
    p.add_argument("--figure", default=None, help="output stem for the figure (.png and .pdf)")
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("plot", help="draw a figure from result files")
    p.add_argument("figure", choices=["decomposition", "corrections", "training", "accuracy", "kernels"])
    p.add_argument("--proofs", default=None)
    p.add_argument("--corrections", default=None)
    p.add_argument("--steps", default=None)
    p.add_argument("--cells", default=None)
    p.add_argument("--bench", default=None)
    p.add_argument("--out", required=True, help="output path without suffix; writes .png and .pdf")
    p.set_defaults(func=_cmd_plot)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    threads = os.environ.get("MXFP4_THREADS")
    if threads:
        import torch

        torch.set_num_threads(int(threads))
    try:
        return args.func(args)
    except ValueError as err:  # bad input: say what was wrong, no traceback
        print(f"mxfp4 {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

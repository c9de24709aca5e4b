"""Commands on tensors and files alone: the formats, one tensor's decomposition, the identity's proof, a figure."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..io import write_json_atomic
from ..report.figures import FIGURES
from .arguments import (
    MAX_SAMPLE,
    check_plot_input,
    distribution_name,
    format_name,
    load_tensor,
    out_file,
    positive_int,
    seed_int,
    writable,
)


def _cmd_formats(args) -> int:
    from ..numerics.formats import FORMATS

    print(f"{'format':<12} {'element':<8} {'scale':<6} {'block':>5}  scale rules")
    for f in FORMATS.values():
        print(f"{f.name:<12} {f.element.name:<8} {f.scale:<6} {f.block_size:>5}  {', '.join(f.scale_rules)}")
    return 0


def _cmd_decompose(args) -> int:
    from ..numerics.decompose import COMPONENTS, PAIRS, decompose
    from ..numerics.dispatch import requested_backend

    if requested_backend() not in ("auto", "reference"):
        raise ValueError(f"MXFP4_BACKEND={requested_backend()}: decompose runs the float64 reference split, not a "
                         "kernel; accepted: MXFP4_BACKEND unset, auto or reference")
    x, label = load_tensor(args)
    if args.recipe is None:
        stats = decompose(x, args.format or "mxfp4", axis=args.axis, scale_rule=args.scale_rule, form=args.form).stats
    else:
        from ..config.recipes import Recipe
        from ..corrections.base import numerics_hooks

        if args.format is not None or args.scale_rule is not None:
            raise ValueError("--recipe names its format and scale rule; drop --format / --scale-rule")
        quantizer = Recipe.named(args.recipe).quantizer()
        if quantizer is None:
            raise ValueError(f"--recipe {args.recipe!r} does not quantize; accepted: a recipe with quantize: true")
        stats = quantizer.decompose(x, args.axis, form=args.form).stats
        label = f"{label} under recipe {args.recipe}"
        applied = [f"{c.name} ({', '.join(numerics_hooks(c)) or 'no numerics hook: acts outside the quantizer'})"
                   for c in quantizer.corrections]
        stats["corrections_applied"] = applied
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    print(f"{label}: {stats['format']} ({stats['scale_rule']}), shape {stats['shape']}, axis {stats['axis']}, "
          f"{stats['form']} form")
    if "corrections_applied" in stats:
        print("corrections applied (their numerics hooks): " + ("; ".join(stats["corrections_applied"]) or "none"))
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
    print("cosine " + "  ".join(f"{a}/{b} {stats[f'cosine_{a}_{b}']:+.3f}" for a, b in PAIRS))
    return 0


def _cmd_prove(args) -> int:
    from tqdm import tqdm

    if args.rows * args.cols > MAX_SAMPLE:  # before any work: each case holds several float64 copies
        raise ValueError(f"--rows x --cols = {args.rows * args.cols:,} elements; accepted: at most {MAX_SAMPLE:,}")
    writable(args.out)

    from ..verify.prove import run_proofs

    bar = tqdm(desc="proofs", unit="case", file=sys.stderr)

    def progress(i, n, entry):
        bar.total = n
        bar.set_postfix_str(
            f"{entry['distribution']} {entry['format']} {entry['scale_rule']} "
            f"residual {entry['identity_residual_rel']:.1e}" + ("" if entry["passed"] else " FAIL")
        )
        bar.update(1)

    report = run_proofs(rows=args.rows, cols=args.cols, seed=args.seed, progress=progress)
    bar.close()
    write_json_atomic(Path(args.out), report)
    print(
        f"{len(report['cases'])} cases, max relative identity residual {report['max_identity_residual_rel']:.3g}: "
        f"{'passed' if report['passed'] else 'FAILED'} -> {args.out}"
    )
    return 0 if report["passed"] else 1


def _cmd_plot(args) -> int:
    spec = FIGURES[args.figure]
    if not Path(args.input).is_file():
        raise ValueError(f"plot {spec.name}: input {args.input} does not exist (expected the {spec.reads})")
    check_plot_input(spec, Path(args.input))
    try:
        paths = spec.drawing()(args.input, args.out)
    except (ValueError, KeyError, TypeError, IndexError) as err:  # a file of another kind, or damaged
        what = f"no {err} column or key" if isinstance(err, KeyError) else f"{type(err).__name__}: {err}"
        raise ValueError(f"plot {spec.name}: {args.input} is not the {spec.reads} ({what})") from None
    print("wrote " + ", ".join(map(str, paths)))
    return 0


def add_commands(sub) -> None:
    """This group's subcommands, added to the parser's ``sub``."""
    sub.add_parser("formats", help="list the block formats and their scale rules").set_defaults(func=_cmd_formats)

    p = sub.add_parser("decompose", help="split one tensor's quantization error into its three components")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--tensor", help="a file saved with torch.save (a tensor, or a dict of them with --key)")
    src.add_argument("--dist", type=distribution_name,
                     help="a named distribution (default gaussian; an unknown name lists them)")
    p.add_argument("--key", help="the tensor's key when --tensor holds a dict")
    p.add_argument("--rows", type=positive_int, help="--dist only (default 256)")
    p.add_argument("--cols", type=positive_int, help="--dist only (default 1024)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="--dist only (default float32)")
    p.add_argument("--seed", type=seed_int, help="--dist only (default 0)")
    p.add_argument("--format", default=None, type=format_name, help="the block format (default mxfp4; "
                   "`mxfp4 formats` lists them)")
    p.add_argument("--scale-rule", default=None, help="floor (default), ceil, even, rceil; nearest for nvfp4")
    p.add_argument("--recipe", default=None,
                   help="decompose as a named recipe quantizes (its format, scale rule and corrections; a rotating "
                        "correction's error in its rotated basis) instead of --format / --scale-rule")
    p.add_argument("--axis", type=int, default=-1, help="the axis the blocks run along")
    p.add_argument("--form", default="canonical", choices=["canonical", "gain"],
                   help="the decomposition: canonical (ideal-scale deadzone and grid) or gain (stored-scale deadzone, "
                        "scale bias the per-block gain; docs/decomposition.md)")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.set_defaults(func=_cmd_decompose)

    p = sub.add_parser("prove", help="check the decomposition identity numerically; writes a JSON report")
    p.add_argument("--out", type=out_file,
                   default="results/proofs.json", help="the JSON report (default results/proofs.json)")
    p.add_argument("--rows", type=positive_int, default=128, help="rows of each test tensor (default 128)")
    p.add_argument("--cols", type=positive_int, default=1024, help="columns of each test tensor (default 1024)")
    p.add_argument("--seed", type=seed_int, default=0, help="the seed of the test tensors (default 0)")
    p.set_defaults(func=_cmd_prove)

    p = sub.add_parser("plot", help="draw a figure from result files")
    p.add_argument("figure", choices=list(FIGURES), help="; ".join(f"{k}: {v.reads}" for k, v in FIGURES.items()))
    p.add_argument("input", help="the figure's input file")
    p.add_argument("--out", type=out_file,
                   required=True, help="output path (a suffix is replaced): writes .png and .pdf")
    p.set_defaults(func=_cmd_plot)

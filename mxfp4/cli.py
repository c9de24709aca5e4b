"""The ``mxfp4`` command line: one subcommand per job the Snakemake rules and users run."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

from .io import writable_folder, write_json_atomic, write_text_atomic
from .layout import GPU_SMOKE_DENSE, Layout
from .report.figures import FIGURES

MAX_SAMPLE = 2**26  # elements of a decompose --dist sample, and of a prove test tensor
SAMPLE_DEFAULTS = {"rows": 256, "cols": 1024, "dtype": "float32", "seed": 0}  # decompose --dist only

# Commands that load transformers models (the RL processes).
MODEL_COMMANDS = ("pretrain", "cell", "probe-batch", "pathways", "depth", "depth-optimizers",
                  "corrections-table", "weight-components", "recipe-cost", "mechanism")


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


positive_int = int_argument(1, None, "an integer >= 1")  # a count of rows, columns or layers
seed_int = int_argument(0, 2**32 - 1, "an integer in [0, 2**32 - 1]")  # numpy's and torch's seed range


def _cmd_formats(args) -> int:
    from .numerics.formats import FORMATS

    print(f"{'format':<12} {'element':<8} {'scale':<6} {'block':>5}  scale rules")
    for f in FORMATS.values():
        print(f"{f.name:<12} {f.element.name:<8} {f.scale:<6} {f.block_size:>5}  {', '.join(f.scale_rules)}")
    return 0


def _load_tensor(args):
    import torch

    from .verify.distributions import sample

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


def _cmd_decompose(args) -> int:
    from .numerics.decompose import COMPONENTS, PAIRS, decompose
    from .numerics.dispatch import requested_backend

    if requested_backend() not in ("auto", "reference"):
        raise ValueError(f"MXFP4_BACKEND={requested_backend()}: decompose runs the float64 reference split, not a "
                         "kernel; accepted: MXFP4_BACKEND unset, auto or reference")
    x, label = _load_tensor(args)
    if args.recipe is None:
        stats = decompose(x, args.format or "mxfp4", axis=args.axis, scale_rule=args.scale_rule, form=args.form).stats
    else:
        from .config.recipes import Recipe
        from .corrections.base import numerics_hooks

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


def writable(path: Path | str) -> Path:
    """``path``, its folder made and checked writable before any work: an OSError (caught by ``main``
    as one line) rather than a result lost at the end."""
    writable_folder(Path(path).parent)
    return Path(path)


def _cmd_prove(args) -> int:
    from tqdm import tqdm

    if args.rows * args.cols > MAX_SAMPLE:  # before any work: each case holds several float64 copies
        raise ValueError(f"--rows x --cols = {args.rows * args.cols:,} elements; accepted: at most {MAX_SAMPLE:,}")
    writable(args.out)

    from .verify.prove import run_proofs

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


def _check_plot_input(spec, path: Path) -> None:
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


def _cmd_plot(args) -> int:
    spec = FIGURES[args.figure]
    if not Path(args.input).is_file():
        raise ValueError(f"plot {spec.name}: input {args.input} does not exist (expected the {spec.reads})")
    _check_plot_input(spec, Path(args.input))
    try:
        paths = spec.drawing()(args.input, args.out)
    except (ValueError, KeyError, TypeError, IndexError) as err:  # a file of another kind, or damaged
        what = f"no {err} column or key" if isinstance(err, KeyError) else f"{type(err).__name__}: {err}"
        raise ValueError(f"plot {spec.name}: {args.input} is not the {spec.reads} ({what})") from None
    print("wrote " + ", ".join(map(str, paths)))
    return 0


def _cmd_aggregate(args) -> int:
    from .report.aggregate import aggregate

    counts = aggregate(args.layout, args.out, _profile(args), args.allow_missing, args.outside_grid)
    print(f"aggregated {counts['cells']} cells, {counts['steps']} steps")
    return 0


def _cmd_claims(args) -> int:
    from .report.claims import run_claims

    layout = args.layout
    inputs = {
        "cells": args.cells or layout.table("cells"),
        "proofs": args.proofs or layout.proofs,
        "corrections": args.corrections or layout.corrections,
    }
    for name, path in inputs.items():
        if not Path(path).is_file():
            raise ValueError(
                f"claims needs --{name} {path}, which does not exist (snakemake --cores all claims makes it)"
            )
    pathways = args.pathways or layout.pathways()
    if args.pathways and not Path(pathways).is_file():
        raise ValueError(f"claims: --pathways {pathways} does not exist (snakemake --cores all pathways makes it)")
    rows = run_claims(
        inputs["cells"],
        inputs["proofs"],
        inputs["corrections"],
        args.out or layout.claims,
        args.profile,
        pathways_csv=pathways,
    )
    for r in rows:
        print(f"{r['verdict']:<40} {r['model']:<28} {r['claim']}")
    return 0


def _cmd_primary_summary(args) -> int:
    from .report.claims import primary_summary
    from .report.network_claims import network_summary

    layouts = {p: Layout(args.results, p) for p in args.profiles}
    with_cells = [p for p, layout in layouts.items() if layout.stored(layout.table("cells")).is_file()]
    text = (f"# The paper's claims\n\nGenerated by `mxfp4 primary-summary {' '.join(args.profiles)}` from the stored "
            "baselines.\n\n## About the model class: the network as the replicate\n\n"
            "Each profile's primary claims recomputed from its stored per-unit files (`mxfp4 network-claims`): every "
            "unit (gradient batch, prompt) averaged within its network (an independently pretrained warm start), each "
            "test over networks, three outcomes (held: the claimed arm harms more than every rival; contradicted: a "
            "rival harms significantly more; no dominance: within the margin of a rival), each naming the rival that "
            "decided it, and the verdict on each half of the networks (fixed before the run). A verdict here is about "
            "the model class the networks were drawn from, at the profile's number of networks.\n\n"
            + network_summary(args.profiles, args.results))
    if with_cells:
        text += ("\n## About the networks that were trained: units pooled within them\n\n"
                 "Per profile with RL cells, its own primary family as its claims.md tests it (fixed in its profile "
                 "before the run; Holm over the family): the verdict, the effect (mechanism claims: the claimed "
                 "component's harm minus its closest rival's; recovery: mxfp4+all minus bf16 final accuracy) with its "
                 "interval at the verdict's level, n and the adjusted p. Its units (batches, prompts) are taken as "
                 "independent, so a verdict describes these few networks, not the class; another set of warm starts "
                 "can differ beyond these intervals.\n\n" + primary_summary(with_cells, args.results))
    write_text_atomic(args.out, text)
    print(text)
    return 0


def _cmd_network_claims(args) -> int:
    from .report.network_claims import run

    rows = run(args.units, args.profile, args.out)
    for r in rows:
        print(f"{r['family']:9s} {r['model']:12s} {r['claim']}: {r['verdict']} (decided by {r['decided_by']}; "
              f"halves: {' / '.join(r['half_verdicts'])})")
    print(f"wrote {args.out}")
    return 0


def _cmd_mechanism(args) -> int:
    from .analysis.mechanism import mechanism_arms, run_mechanism

    profile = _profile(args)
    if len(args.recipe) > 1 and args.out is None:
        raise ValueError(f"{len(args.recipe)} recipes measured together need --out (one per-unit file for all)")
    out = Path(args.out or args.layout.mechanism_units(args.recipe[0], args.model))
    writable(out)
    t0 = time.perf_counter()
    _, energy = run_mechanism(profile, args.model, args.recipe, args.results, out,
                              progress=lambda line: print(line, file=sys.stderr, flush=True))
    write_json_atomic(out.with_suffix(".energy.json"), energy)
    # what a run of these arms cost here: the leaderboard's estimate for a recipe placed on it
    write_json_atomic(out.with_suffix(".run.json"), {
        "seconds": time.perf_counter() - t0, "arms": 2 + len(mechanism_arms(profile, args.recipe)),
        "networks": len({profile.warm_start_of(s) for s in profile.seeds})})
    print(f"wrote {out} and {out.with_suffix('.energy.json').name}")
    return 0


def _cmd_mechanism_report(args) -> int:
    import json

    from .report.mechanism import run

    energy = []
    for units in args.units:
        path = Path(units).with_suffix(".energy.json")
        if path.is_file():
            energy += json.loads(path.read_text())
    out = args.out or args.layout.mechanism(args.recipe)
    rows = run(args.units, args.recipe, args.profile, writable(out), energy)
    for r in rows:
        print(f"{r['model']:12s} {r['pathway']:9s} vs {r['rival']:16s} {r['verdict']} ({r['networks']} networks; "
              f"rank {r['rank']} of {r['arms']})")
    print(f"wrote {out}")
    return 0


def _cmd_leaderboard(args) -> int:
    from .report.leaderboard import merged, run
    from .report.network_claims import read_units

    profile = _profile(args)
    if not profile.leaderboard:
        raise ValueError(f"profile {args.profile!r} ranks no recipes (leaderboard: [...]); accepted: e.g. networks")
    units = read_units(args.units)
    if args.recipe:
        if not args.recipe_units:
            raise ValueError(f"--recipe {args.recipe} needs --recipe-units: its per-unit files of mxfp4 mechanism")
        if args.recipe not in profile.leaderboard:
            units = merged(units, read_units(args.recipe_units), args.recipe)
    benches = {path: json.loads(Path(path).read_text()) for path in args.bench or []}
    out = args.out or args.layout.leaderboard(args.recipe if args.recipe not in profile.leaderboard else None)
    boards = run(units, args.profile, writable(out), profile.leaderboard, benches, args.accuracy_from, args.results,
                 args.recipe, args.figure)
    for model, rows in boards.items():
        for r in rows:
            print(f"{model:12s} {r['rank']:2d}. {r['recipe']:20s} harm removed {r['mean']:+.3f}")
    print(f"wrote {out}")
    return 0


def _cmd_power_design(args) -> int:
    import yaml

    from .report.pathway_table import read_rows
    from .report.power_design import design, units_in

    profile = _profile(args)
    claims = profile.pathways.claims if profile.pathways else None
    if claims is None:
        raise ValueError(f"profile {args.profile!r} sets no pathways.claims (form, control, margins) to size")
    if args.units:  # the network as the replicate: a pilot of the same design, its per-unit files
        from .config.profiles import load_profile
        from .report.network_claims import profile_networks, read_units
        from .report.power_design import network_design

        block = network_design(read_units(args.units), claims, family=args.family,
                               network_of=profile_networks(load_profile(args.pilot)))
        print(yaml.safe_dump({"network_power": {"pilot": args.pilot, **block}}, sort_keys=False).rstrip())
        for claim, size in block["claims"].items():
            short = "  <- more than the profile's networks" if size["networks"] > profile.warm_starts else ""
            print(f"# {claim}: needs {size['networks']} networks, the profile has {profile.warm_starts}{short}")
        return 0
    stored = Layout(args.results, args.pilot)
    block = design(read_rows(stored.stored(stored.pathways())), claims.margins, claims.form, args.pilot,
                   family=args.family, corrections=len(profile.pathways.corrections))
    print(yaml.safe_dump({"power": block}, sort_keys=False).rstrip())
    have = units_in(profile)
    for kind, suffix in (("claims", "_claim"), ("recoveries", "_recovery_claim")):
        for pathway, c in block[kind].items():
            short = have[pathway] < c["units"]
            mark = "  (exploratory)" if pathway + suffix in claims.exploratory else "  <- too few" if short else ""
            print(f"# {pathway} ({kind}): needs {c['units']} units, the profile measures {have[pathway]}{mark}")
    return 0


def _cmd_report(args) -> int:
    from .report.profile_report import run

    print(run(args.layout, args.out, stored=args.stored))
    return 0


def _cmd_compare(args) -> int:
    from .report.compare import answer_line, run_compare

    baselines = args.baselines or args.layout.stored(args.layout.table("cells"))
    rows = run_compare(args.layout, args.recipe, baselines, args.out, args.figure, args.reproduction, args.adjust,
                       items=not args.no_items, allow_setting_difference=args.allow_setting_difference,
                       mechanism_md=args.mechanism)
    print(answer_line(rows, args.recipe))
    return 0


def _cmd_profile_contrast(args) -> int:
    from .report.profile_contrast import run_profile_contrast

    la, lb = Layout(args.results, args.a), Layout(args.results, args.b)
    out = args.out or lb.contrast(args.a)
    rows = run_profile_contrast(la, lb, out)
    tested = [r for r in rows if r.get("p_holm") is not None]
    print(f"wrote {out} and its .csv: {len(rows)} rows, {len(tested)} tested (Holm), "
          f"{sum(r['p_holm'] < 0.05 for r in tested)} differ")
    return 0


def _cmd_reproduction(args) -> int:
    from .report.compare import check_reproduction

    cells = []
    for cell in args.cell:
        parts = cell.split("/")
        if len(parts) != 3 or not parts[2].startswith("seed") or not parts[2][4:].isdigit():
            raise ValueError(f"--cell {cell!r}; accepted: MODEL/RECIPE/seedN")
        cells.append((parts[0], parts[1], int(parts[2][4:])))
    baselines = args.baselines or args.layout.stored(args.layout.table("cells"))
    check = check_reproduction(args.layout, baselines, cells)
    write_json_atomic(writable(args.out), check)
    for c in check["cells"]:
        print(f"{c['cell']}: {len(c['differing'])} of {c['compared']} values differ from the stored row")
    print("the stored baselines " + ("reproduce here" if check["reproduces"] else "do not reproduce here"))
    return 0


def _cmd_recipe_cost(args) -> int:
    from .config.recipes import recipe_base
    from .layout import REFERENCE_RECIPE
    from .rl.step_cost import cost_lines, recipe_cost

    profile = _profile(args)
    base = args.base or recipe_base(args.recipe) or REFERENCE_RECIPE
    seed = profile.seeds[0]
    cost = recipe_cost(profile, args.model or next(iter(profile.models)), args.recipe, base, seed, args.results,
                       args.steps)
    if args.out:
        write_json_atomic(writable(args.out), cost)
    print("\n".join(cost_lines(cost)))
    return 0


def _cmd_corrections_table(args) -> int:
    from .analysis import correction_table as ct

    models = {}
    for item in args.model or []:
        label, sep, source = item.partition("=")
        if not sep or not label or not source:
            raise ValueError(
                f"--model {item!r}: expected NAME=PATH (a checkpoint folder, hub id, "
                "or tiny-dense/tiny-moe for random init)"
            )
        models[label] = source
    table = ct.rows(ct.build_sources(models or None), args.recipe or ())
    write_text_atomic(args.out, ct.markdown(table))
    if args.json:
        write_json_atomic(args.json, table)
    print(f"wrote {args.out}")
    return 0


def _cmd_pretrain(args) -> int:
    from .rl.pretrain import pretrain_model

    meta = pretrain_model(_profile(args), args.model, args.out, args.results, args.warm_start, args.sft_from)
    print(json.dumps(meta, indent=2))
    return 0


def _cmd_cell(args) -> int:
    from .rl.cell import run_cell

    m = run_cell(_profile(args), args.model, args.recipe, args.seed, results=args.results, recipes_file=args.recipes)
    if m is None:  # a rank other than the main process of a multi-process cell: the main one reports
        return 0
    print(
        json.dumps(
            {
                k: m[k]
                for k in (
                    "gsm8k_strict_accuracy",
                    "gsm8k_flexible_accuracy",
                    "mean_entropy",
                    "mean_grad_cosine",
                    "mean_step_time",
                    "wall_time_seconds",
                )
            },
            indent=2,
        )
    )
    return 0


def _cmd_memory_plan(args) -> int:
    from .analysis.memory_plan import write_plan

    report = write_plan(_profile(args), args.out, args.model, args.recipes, args.layers, args.device)
    peaks = {r: round(v["peak_gib"], 1) for r, v in report["recipes"].items()}
    print(f"peak GiB {json.dumps(peaks)} of {report['limit_gib']} ({args.out})")
    return 0 if all(r["fits"] for r in report["recipes"].values()) else 1


def _cmd_gpu_smoke_report(args) -> int:
    from .report.gpu_smoke import run

    rec = run(args.results or ["results"], args.profile, args.out, args.plan)
    print(
        json.dumps(
            {
                r: {k: v.get(k) for k in ("status", "step_time_vs_bf16", "rollout_time_vs_bf16", "peak_memory_gib",
                                          "peak_reserved_gib")}
                for r, v in rec["recipes"].items()
            },
            indent=2,
        )
    )
    return 0


def _cmd_probe_batch(args) -> int:
    from .rl.grpo import batch_digest
    from .rl.probe_batch import ensure_probe_batch, load_probe_batch

    profile = _profile(args)
    if args.seed < 0:
        raise ValueError(f"--seed must be an integer >= 0, got {args.seed}")
    path = ensure_probe_batch(profile, args.model, args.seed, args.results)
    print(f"{path}: digest {batch_digest(load_probe_batch(path))}")
    return 0


def _cmd_depth(args, optimizers: bool = False) -> int:
    """``mxfp4 depth`` (the gradient rows), or ``mxfp4 depth-optimizers`` (the short runs)."""
    from .analysis.depth import run_depth, run_depth_optimizers

    run = run_depth_optimizers if optimizers else run_depth
    out = args.out or (args.layout.depth_optimizer_units if optimizers else args.layout.depth_units)(args.model)
    units = run(_profile(args), args.model, args.results, out_units=out,
                progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(f"wrote {out} ({len(units)} rows)")
    return 0


def _cmd_pathways(args) -> int:
    from .analysis.pathways import run_pathways

    layout = args.layout
    out = args.out or layout.pathways(args.model, args.checkpoint)
    units = args.units or (layout.pathway_units(args.model, args.checkpoint) if args.checkpoint else None)
    rows = run_pathways(
        _profile(args),
        args.model,
        results=args.results,
        out_csv=out,
        progress=lambda msg: print(msg, file=sys.stderr, flush=True),
        checkpoint=args.checkpoint,
        out_units=units,
        dose=args.dose,
    )
    print(f"wrote {out} ({len(rows)} rows)" + (f" and {units}" if units else ""))
    return 0


def _write_table(rows: list[dict], out: Path, markdown: str) -> int:
    """A command's rows as a CSV at ``out`` and its markdown summary beside it (``.md``)."""
    from .report.aggregate import write_csv

    write_csv(rows, writable(out))
    write_text_atomic(out.with_suffix(".md"), markdown)
    print(f"wrote {out} and {out.with_suffix('.md')} ({len(rows)} rows)")
    return 0


def _cmd_weight_components(args) -> int:
    from .analysis.weight_components import run_weight_components, summary_markdown

    rows = run_weight_components(_profile(args), args.results)
    return _write_table(rows, Path(args.out or args.layout.weight_components),
                        summary_markdown(rows))


def _cmd_regime(args) -> int:
    from .analysis.regime import run_regime, summary_markdown

    rows = run_regime(_profile(args), args.results, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    return _write_table(rows, Path(args.out or args.layout.regime), summary_markdown(rows))


def _profile(args):
    """The command's profile, loaded and validated once (every layer below takes the ``Profile``)."""
    from .config.profiles import load_profile

    return load_profile(args.profile)


def _profile_args(p) -> None:
    """The arguments of a command that works on a profile's results."""
    p.add_argument("--profile", default="embedded", help="a profile of experiments/profiles/ (default embedded)")
    p.add_argument("--results", default="results", help="the results root (default results)")


def _model_args(p) -> None:
    """The arguments of a command that works on one model of a profile."""
    _profile_args(p)
    p.add_argument("--model", required=True, help="a model line of the profile (e.g. tiny-dense)")


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line naming the argument and what is accepted (the
    usage block is one ``--help`` away)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .numerics.formats import FORMATS
    from .verify.distributions import DISTRIBUTIONS

    parser = OneLineParser(prog="mxfp4", description=__doc__)
    parser.add_argument("--version", action="version", version=f"mxfp4 {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    sub.add_parser("formats", help="list the block formats and their scale rules").set_defaults(func=_cmd_formats)

    p = sub.add_parser("decompose", help="split one tensor's quantization error into its three components")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--tensor", help="a file saved with torch.save (a tensor, or a dict of them with --key)")
    src.add_argument("--dist", choices=list(DISTRIBUTIONS), help="a named distribution (default gaussian)")
    p.add_argument("--key", help="the tensor's key when --tensor holds a dict")
    p.add_argument("--rows", type=positive_int, help="--dist only (default 256)")
    p.add_argument("--cols", type=positive_int, help="--dist only (default 1024)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="--dist only (default float32)")
    p.add_argument("--seed", type=seed_int, help="--dist only (default 0)")
    p.add_argument("--format", default=None, choices=list(FORMATS), help="the block format (default mxfp4)")
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

    p = sub.add_parser("corrections-table", help="each correction's effect on each error component (markdown)")
    p.add_argument("--out", type=out_file,
                   default="docs/correction_table.md", help="the markdown table (default: that file)")
    p.add_argument("--json", type=out_file, default=None, help="also write the rows as JSON")
    p.add_argument(
        "--model",
        action="append",
        metavar="NAME=PATH",
        help="a model's weights as a source (checkpoint folder or hub id; tiny-dense / tiny-moe for random "
        "init); repeatable; default: both tiny stand-ins at random init",
    )
    p.add_argument("--recipe", action="append", default=None,
                   help="also a named recipe's corrections together (repeatable; plugins through MXFP4_PLUGINS), "
                        "each tensor decomposed in the basis the recipe quantizes it in")
    p.set_defaults(func=_cmd_corrections_table)

    p = sub.add_parser("pretrain", help="warm-start a profile's tiny model with SFT and save it")
    _model_args(p)
    p.add_argument("--warm-start", type=int, default=0, help="which warm start (its pretraining seed; 0 to "
                   "pretrain.warm_starts - 1, default 0)")
    p.add_argument("--out", default=None, help="folder to save to (default results/<profile>/models/<model>, "
                                               "models/ws<k>/<model> for warm start k)")
    p.add_argument("--sft-from", default=None, help="a warm start of the same SFT without outlier channels (e.g. "
                   "the stored one of the profile this one adds them to): add the channels to it instead of "
                   "running the SFT again")
    p.set_defaults(func=_cmd_pretrain)

    p = sub.add_parser("cell", help="one ablation cell: GRPO under a recipe, then GSM8K eval via lm-eval")
    _model_args(p)
    p.add_argument("--recipe", required=True, help="a named recipe (experiments/recipes.yaml or --recipes)")
    p.add_argument("--seed", type=seed_int, default=0, help="the cell's seed (default 0)")
    p.add_argument("--recipes", default=None, help="a recipes YAML (default experiments/recipes.yaml)")
    p.set_defaults(func=_cmd_cell)

    p = sub.add_parser(
        "pathways", help="the pathway matrix: each error component injected alone, on gradients, rollouts, entropy"
    )
    _model_args(p)
    p.add_argument("--checkpoint", default=None, choices=["warm", "grpo"],
                   help="one checkpoint only (default: every one the profile's pathways.checkpoints names)")
    p.add_argument("--out", type=out_file,
                   default=None, help="default results/<profile>/pathways/<model>/<checkpoint>.csv, or "
                                               "pathways.csv for every checkpoint")
    p.add_argument("--units", default=None, help="every unit's harm per pathway and arm; default, with --checkpoint: "
                                                 "results/<profile>/pathways/<model>/<checkpoint>_units.csv")
    p.add_argument("--dose", default=None, help="an outlier dose (c<channels>x<factor>, e.g. c2x32) given to the warm "
                                                "start first (the dose-response; with --checkpoint warm)")
    p.set_defaults(func=_cmd_pathways)

    p = sub.add_parser("depth", help="the depth study: per-layer gradient norm ratio and cosine of each component, "
                                     "its control and full MXFP4 against the unquantized gradient")
    _model_args(p)
    p.add_argument("--out", type=out_file, default=None, help="default results/<profile>/depth/<model>_units.csv")
    p.set_defaults(func=_cmd_depth)

    p = sub.add_parser("depth-optimizers", help="the depth study's short runs: per-layer displacement of SGD and AdamW "
                                                "with the scale component, its control and no injection")
    _model_args(p)
    p.add_argument("--out", type=out_file,
                   default=None, help="default results/<profile>/depth/optimizers/<model>_units.csv")
    p.set_defaults(func=functools.partial(_cmd_depth, optimizers=True))

    p = sub.add_parser("probe-batch", help="the GRPO batch every recipe's gradient probes of a model and seed are "
                                           "taken on (sampled once by the starting policy, unquantized)")
    _model_args(p)
    p.add_argument("--seed", type=seed_int, required=True, help="the seed whose batch to make or find")
    p.set_defaults(func=_cmd_probe_batch)

    p = sub.add_parser("weight-components", help="the decomposition of every weight tensor in both forms: shares "
                                                 "and pairwise component cosines (the paper's Figure 1)")
    _profile_args(p)
    p.add_argument("--out", type=out_file, default=None, help="default results/<profile>/weight_components.csv")
    p.set_defaults(func=_cmd_weight_components)

    p = sub.add_parser("regime", help="regime statistics of every GEMM operand (weights, activations, gradients) "
                                      "per model and layer, beside the published figures for real LLMs")
    _profile_args(p)
    p.add_argument("--out", type=out_file, default=None, help="default results/<profile>/regime.csv")
    p.set_defaults(func=_cmd_regime)

    p = sub.add_parser("aggregate", help="tidy CSVs of a profile's finished cells (cells, steps, summary)")
    _profile_args(p)
    p.add_argument("--out", default=None, help="default results/<profile>/aggregate/")
    p.add_argument("--allow-missing", action="store_true",
                   help="aggregate the finished cells when some of the profile's grid have not run (named)")
    p.add_argument("--outside-grid", action="store_true",
                   help="keep cells of recipes or seeds the profile no longer lists (default: named, left out)")
    p.set_defaults(func=_cmd_aggregate)

    p = sub.add_parser("claims", help="the paper's claims against a profile's measurements (markdown)")
    _profile_args(p)
    p.add_argument("--cells", default=None, help="default results/<profile>/aggregate/cells.csv")
    p.add_argument("--proofs", default=None, help="default results/<profile>/proofs/proofs.json")
    p.add_argument("--corrections", default=None, help="default results/<profile>/corrections.json")
    p.add_argument("--pathways", default=None, help="default results/<profile>/pathways/pathways.csv")
    p.add_argument("--out", type=out_file, default=None, help="default results/<profile>/claims.md")
    p.set_defaults(func=_cmd_claims)

    p = sub.add_parser("primary-summary", help="the primary family of several profiles' stored baselines side by "
                       "side (markdown)")
    p.add_argument("profiles", nargs="+", help="profiles with stored baselines (e.g. networks embedded-large)")
    p.add_argument("--results", default="results", help="the results root (default results)")
    p.add_argument("--out", type=out_file,
                   default="results/baselines/PRIMARY.md", help="default results/baselines/PRIMARY.md")
    p.set_defaults(func=_cmd_primary_summary)

    p = sub.add_parser("network-claims", help="every claim-level test recomputed from the per-unit files with the "
                       "network (warm start) as the replicate: three outcomes, the deciding rival, both halves")
    _profile_args(p)
    p.add_argument("units", nargs="+", help="per-unit files of the pathway matrix (<checkpoint>_units.csv)")
    p.add_argument("--out", type=out_file, required=True, help="the markdown table to write")
    p.set_defaults(func=_cmd_network_claims)

    p = sub.add_parser("mechanism", help="a recipe's arm in the pathway matrix at the warm starts, beside MXFP4, BF16 "
                       "and the profile's correction arms, unit by unit (minutes: no RL)")
    _model_args(p)
    p.add_argument("--recipe", required=True, nargs="+",
                   help="the recipe whose mechanism is measured (several: each an arm, one per-unit file, --out)")
    p.add_argument("--out", type=out_file, default=None,
                   help="the per-unit file (default results/<profile>/mechanism/<recipe>/<model>_units.csv)")
    p.set_defaults(func=_cmd_mechanism)

    p = sub.add_parser("mechanism-report", help="a recipe's mechanism decided from its per-unit files, the network "
                       "as the replicate: against MXFP4, BF16 and each correction, per pathway")
    _profile_args(p)
    p.add_argument("--recipe", required=True, help="the recipe of the per-unit files")
    p.add_argument("units", nargs="+", help="per-unit files of mxfp4 mechanism (their .energy.json read beside)")
    p.add_argument("--out", type=out_file, default=None, help="default results/<profile>/mechanism/<recipe>.md")
    p.set_defaults(func=_cmd_mechanism_report)

    p = sub.add_parser("leaderboard", help="the profile's MXFP4 recipes ranked at its warm starts by the share of "
                       "MXFP4's harm each removes, the network as the replicate (and a user's recipe beside them)")
    _profile_args(p)
    p.add_argument("units", nargs="+", help="per-unit files of mxfp4 mechanism --recipe <the profile's leaderboard>")
    p.add_argument("--recipe", default=None, help="a recipe to place on the board (its arm from --recipe-units)")
    p.add_argument("--recipe-units", nargs="+", default=None,
                   help="per-unit files of mxfp4 mechanism --recipe <recipe> on the same warm starts")
    p.add_argument("--bench", nargs="+", default=None,
                   help="bench_step.py JSON files (each recipe's step over the bf16 step of the same file)")
    p.add_argument("--accuracy-from", nargs="*", default=[],
                   help="profiles whose stored RL cells give a recipe's GSM8K accuracy (another set of networks)")
    p.add_argument("--out", type=out_file, default=None,
                   help="default results/<profile>/leaderboard/LEADERBOARD.md (LEADERBOARD_<recipe>.md with --recipe)")
    p.add_argument("--figure", type=out_file, default=None, help="the figure (.png; a .pdf beside it)")
    p.set_defaults(func=_cmd_leaderboard)

    p = sub.add_parser("power-design", help="a confirmatory profile's claim-level sample size from a pilot's stored "
                       "pathway matrix: the pathways.claims.power block to write into the profile")
    _profile_args(p)
    p.add_argument("--pilot", default="embedded", help="the pilot profile whose stored pathways.csv is read")
    p.add_argument("--family", type=positive_int, default=8,
                   help="hypotheses in the primary family (default 8: per model 3 mechanism claims and the headline; "
                        "14 with the 3 recovery claims)")
    p.add_argument("--units", nargs="+", default=None,
                   help="per-unit files of a pilot of the same design (three or more networks): size the design in "
                        "networks, the network as the replicate (the between-network sd at its upper 80%% limit)")
    p.set_defaults(func=_cmd_power_design)

    p = sub.add_parser("report", help="REPORT.md of a profile's run: held-out accuracy, the pathway matrix's "
                       "headline, the claims' verdicts")
    _profile_args(p)
    p.add_argument("--stored", action="store_true",
                   help="report the stored baselines (results/baselines/<profile>/) instead of the run")
    p.add_argument("--out", type=out_file,
                   default=None, help="default REPORT.md beside the run's (or the baselines') claims.md")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("profile-contrast", help="two profiles' runs that differ in one setting, side by side: operand "
                       "statistics, the pathway matrix (paired unit by unit at the warm start) and the recovery rows")
    p.add_argument("a", help="the reference profile (e.g. embedded-large)")
    p.add_argument("b", help="the profile that changes one setting (e.g. embedded-large-outliers)")
    p.add_argument("--results", default="results", help="the results root holding both runs (default results)")
    p.add_argument("--out", type=out_file, default=None, help="default results/<b>/contrast/<a>.md (and .csv)")
    p.set_defaults(func=_cmd_profile_contrast)

    p = sub.add_parser("compare", help="a recipe's cells against stored baselines, with intervals and verdicts")
    _profile_args(p)
    p.add_argument("--recipe", required=True, help="the recipe whose cells are compared")
    p.add_argument("--baselines", default=None, help="default results/baselines/<profile>/cells.csv")
    p.add_argument("--out", type=out_file, required=True, help="the markdown report")
    p.add_argument("--figure", default=None, help="output stem for the figure (.png and .pdf)")
    p.add_argument("--reproduction", default=None,
                   help="the JSON of mxfp4 reproduction: when the stored baselines do not reproduce here, this "
                        "run's own cells of the other recipes are the references")
    p.add_argument("--adjust", default="holm", choices=["holm", "fdr_bh"],
                   help="the report's multiplicity adjustment: holm (family-wise error, default) or fdr_bh "
                        "(Benjamini-Hochberg false discovery rate)")
    p.add_argument("--no-items", action="store_true",
                   help="report per seed only, without the per-problem rows (when the baselines' items.csv is absent)")
    p.add_argument("--allow-setting-difference", action="store_true",
                   help="report even though the baselines were made with another profile setting, data or code "
                        "version (differences then mix that change with the recipe's)")
    p.add_argument("--mechanism", default=None,
                   help="the recipe's mechanism report (mxfp4 mechanism-report), whose table leads the report")
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("reproduction", help="whether a stored baseline cell, rerun here, reproduces bit for bit")
    _profile_args(p)
    p.add_argument("--cell", required=True, action="append",
                   help="MODEL/RECIPE/seedN, run in this results folder (repeatable: all must reproduce)")
    p.add_argument("--baselines", default=None, help="default results/baselines/<profile>/cells.csv")
    p.add_argument("--out", type=out_file, required=True, help="the JSON of the check")
    p.set_defaults(func=_cmd_reproduction)

    p = sub.add_parser("recipe-cost", help="a recipe's measured step against its base on the stored warm start, "
                                           "and the hooks that force the host's reference path")
    _profile_args(p)
    p.add_argument("--recipe", required=True, help="the recipe to cost")
    p.add_argument("--base", default=None, help="what it is measured against (default: its base recipe, else bf16)")
    p.add_argument("--model", default=None, help="a model line of the profile (default: its first)")
    p.add_argument("--steps", type=int_argument(2, 50, "an integer in [2, 50]"), default=3,
                   help="GRPO steps each (the first is warm-up; default 3)")
    p.add_argument("--out", type=out_file, default=None, help="also write the measurements as JSON")
    p.set_defaults(func=_cmd_recipe_cost)

    p = sub.add_parser("memory-plan", help="peak memory of one GRPO step per recipe at a real configuration, "
                                           "computed on CPU under FakeTensorMode (nothing allocated)")
    p.add_argument("--profile", default="gpu-smoke-quick", help="a profile with a real configuration")
    p.add_argument("--model", default=None, help="a model of the profile with a real config (default: the first)")
    p.add_argument("--recipes", nargs="*", default=None, help="default: the profile's")
    p.add_argument("--layers", type=positive_int, default=None, help="fewer layers (a quick check; the plan uses all)")
    p.add_argument("--device", default="nvidia-h100-x1", help="whose memory limit is beside the plan")
    p.add_argument("--out", type=out_file, required=True, help="the JSON plan (rewritten after each recipe)")
    p.set_defaults(func=_cmd_memory_plan)

    p = sub.add_parser(
        "gpu-smoke-report", help="per recipe: step and generation time vs BF16, peak memory, weight update"
    )
    p.add_argument("--profile", default="gpu-smoke", help="a one-model, one-seed GPU profile")
    p.add_argument("--results", action="append",
                   help="a run's results folder (repeat to join runs, each against its own bf16; default results)")
    p.add_argument("--plan", default="results/gpu/memory_plan_qwen2.5-3b.json",
                   help="the memory plan whose peaks go beside the measured ones (skipped where absent)")
    p.add_argument("--out", type=out_file,
                   default=str(GPU_SMOKE_DENSE), help=f"the JSON report (default {GPU_SMOKE_DENSE})")
    p.set_defaults(func=_cmd_gpu_smoke_report)

    p = sub.add_parser("plot", help="draw a figure from result files")
    p.add_argument("figure", choices=list(FIGURES), help="; ".join(f"{k}: {v.reads}" for k, v in FIGURES.items()))
    p.add_argument("input", help="the figure's input file")
    p.add_argument("--out", type=out_file,
                   required=True, help="output path (a suffix is replaced): writes .png and .pdf")
    p.set_defaults(func=_cmd_plot)
    return parser


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
    from .machine import pin_cpu_numerics

    try:
        pin_cpu_numerics()  # before torch loads: the same numbers on every x86-64 machine
    except ValueError as err:
        print(f"mxfp4: error: {err}", file=sys.stderr)
        return 2
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # a usage error (one line, already printed), --help or --version
        return exit_.code
    threads = os.environ.get("MXFP4_THREADS")
    if threads:
        import torch

        if not threads.isdigit() or int(threads) < 1:
            print(f"mxfp4: error: MXFP4_THREADS={threads!r}; accepted: a positive integer", file=sys.stderr)
            return 2
        torch.set_num_threads(int(threads))
    if args.command in MODEL_COMMANDS:
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


if __name__ == "__main__":
    sys.exit(main())

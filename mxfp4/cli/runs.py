"""Commands that load a profile's models: warm starts, RL cells, regime and
weight statistics, the correction table, a recipe's cost, the memory plan."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..io import write_json_atomic, write_text_atomic
from .arguments import (
    int_argument,
    model_args,
    out_file,
    positive_int,
    profile_args,
    profile_of,
    run_of,
    seed_int,
    writable,
    write_table,
)


def _cmd_corrections_table(args) -> int:
    from ..analysis import correction_table as ct

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
    from ..rl.pretrain import pretrain_model

    meta = pretrain_model(run_of(args), args.model, args.out, args.warm_start, args.sft_from)
    print(json.dumps(meta, indent=2))
    return 0


def _cmd_cell(args) -> int:
    from ..rl.cell import run_cell

    cell = run_of(args).cell(args.model, args.recipe, args.seed, recipes_file=args.recipes)
    m = run_cell(cell)
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


def _cmd_probe_batch(args) -> int:
    from ..rl.grpo import batch_digest
    from ..rl.probe_batch import ensure_probe_batch, load_probe_batch

    run = run_of(args)
    for seed in dict.fromkeys(args.seed):  # each seeded and loaded on its own: the order does not matter
        path = ensure_probe_batch(run.start(args.model, seed))
        print(f"{path}: digest {batch_digest(load_probe_batch(path))}", flush=True)
    return 0


def _cmd_weight_components(args) -> int:
    from ..analysis.weight_components import run_weight_components, summary_markdown

    rows = run_weight_components(run_of(args))
    return write_table(rows, Path(args.out or args.layout.weight_components),
                        summary_markdown(rows))


def _cmd_regime(args) -> int:
    from ..analysis.regime import run_regime, summary_markdown

    rows = run_regime(run_of(args), progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    return write_table(rows, Path(args.out or args.layout.regime), summary_markdown(rows))


def _cmd_recipe_cost(args) -> int:
    from ..config.recipes import recipe_base
    from ..layout import REFERENCE_RECIPE
    from ..rl.step_cost import cost_lines, recipe_cost

    run = run_of(args)
    base = args.base or recipe_base(args.recipe) or REFERENCE_RECIPE
    start = run.start(args.model or next(iter(run.profile.models)), run.profile.seeds[0])
    cost = recipe_cost(start, args.recipe, base, args.steps)
    if args.out:
        write_json_atomic(writable(args.out), cost)
    print("\n".join(cost_lines(cost)))
    return 0


def _cmd_memory_plan(args) -> int:
    from ..analysis.memory_plan import write_plan

    report = write_plan(profile_of(args), args.out, args.model, args.recipes, args.layers, args.device)
    peaks = {r: round(v["peak_gib"], 1) for r, v in report["recipes"].items()}
    print(f"peak GiB {json.dumps(peaks)} of {report['limit_gib']} ({args.out})")
    return 0 if all(r["fits"] for r in report["recipes"].values()) else 1


def add_commands(sub) -> None:
    """This group's subcommands, added to the parser's ``sub``."""

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
    model_args(p)
    p.add_argument("--warm-start", type=int, default=0, help="which warm start (its pretraining seed; 0 to "
                   "pretrain.warm_starts - 1, default 0)")
    p.add_argument("--out", default=None, help="folder to save to (default results/<profile>/models/<model>, "
                                               "models/ws<k>/<model> for warm start k)")
    p.add_argument("--sft-from", default=None, help="a warm start of the same SFT without outlier channels (e.g. "
                   "the stored one of the profile this one adds them to): add the channels to it instead of "
                   "running the SFT again")
    p.set_defaults(func=_cmd_pretrain)

    p = sub.add_parser("cell", help="one ablation cell: GRPO under a recipe, then GSM8K eval via lm-eval")
    model_args(p)
    p.add_argument("--recipe", required=True, help="a named recipe (experiments/recipes.yaml or --recipes)")
    p.add_argument("--seed", type=seed_int, default=0, help="the cell's seed (default 0)")
    p.add_argument("--recipes", default=None, help="a recipes YAML (default experiments/recipes.yaml)")
    p.set_defaults(func=_cmd_cell)

    p = sub.add_parser("probe-batch", help="the GRPO batch every recipe's gradient probes of a model and seed are "
                                           "taken on (sampled once by the starting policy, unquantized)")
    model_args(p)
    p.add_argument("--seed", type=seed_int, required=True, action="append",
                   help="a seed whose batch to make or find (repeatable: one process for several seeds)")
    p.set_defaults(func=_cmd_probe_batch)

    p = sub.add_parser("weight-components", help="the decomposition of every weight tensor in both forms: shares "
                                                 "and pairwise component cosines (the paper's Figure 1)")
    profile_args(p)
    p.add_argument("--out", type=out_file, default=None, help="default results/<profile>/weight_components.csv")
    p.set_defaults(func=_cmd_weight_components)

    p = sub.add_parser("regime", help="regime statistics of every GEMM operand (weights, activations, gradients) "
                                      "per model and layer, beside the published figures for real LLMs")
    profile_args(p)
    p.add_argument("--out", type=out_file, default=None, help="default results/<profile>/regime.csv")
    p.set_defaults(func=_cmd_regime)

    p = sub.add_parser("recipe-cost", help="a recipe's measured step against its base on the stored warm start, "
                                           "and the hooks that force the host's reference path")
    profile_args(p)
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

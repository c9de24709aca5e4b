"""What a correction or a pathway arm costs per quantized operand on CPU, side by side in one process; writes
JSON.

Per recipe (plain MXFP4, macro-block scaling, outlier fallback, both) and per pathway arm of the component
injection (a component alone or removed, and its matched controls, in each decomposition form), operand
shape and blocked axis: the quantizer on the dispatch's choice (``auto``: the fused kernels) and on the eager torch path
(``reference``), each the best of ``--reps`` calls, the minimum over ``--runs`` repetitions; each as a
multiple of plain MXFP4's fused time on the same operand (the peer) and as a fraction of the CPU's copy
bandwidth at that size (bytes read + written), measured in the same run; every row says whether its values
and strides equal the torch path's.

    python kernels/bench/bench_corrections.py --out results/bench/corrections_cpu.json
"""

from __future__ import annotations

import argparse
import functools
import sys

from mxfp4.machine import describe, pin_cpu_numerics

pin_cpu_numerics()  # the CPU numerics of the cells, before torch loads

import torch  # noqa: E402

from bench_kernels import cpu_timer as best_time  # noqa: E402  (this script's folder: best of reps after a warm-up)
from mxfp4.config.recipes import Recipe  # noqa: E402
from mxfp4.io import write_json_atomic  # noqa: E402
from mxfp4.numerics import dispatch  # noqa: E402

RECIPES = ("mxfp4", "mxfp4+macro", "mxfp4+fallback", "mxfp4+all")
ARMS = ("+scale", "-grid", "+scale~signflip", "+grid~gaussian", "+dead~permuted")  # the pathway matrix's kinds
FORMS = ("canonical", "gain")


def quantizers() -> dict[str, object]:
    """Every quantizer benchmarked, by row name: the recipes, then the pathway arms in each form."""
    from mxfp4.analysis.pathways.measurement import row_quantizer

    return {**{r: Recipe.named(r).quantizer() for r in RECIPES},
            **{f"arm {a} ({form})": row_quantizer(a, "both", form=form) for form in FORMS for a in ARMS}}
# SmolLM2-135M's operands at 2048 tokens: activations [tokens, hidden] and an MLP weight [intermediate, hidden]
SHAPES = {"activation 2048x576": (2048, 576), "weight 1536x576": (1536, 576)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--reps", type=int, default=5, help="calls per timing (the best is kept)")
    p.add_argument("--runs", type=int, default=3, help="independent repetitions (the minimum is kept)")
    args = p.parse_args(argv)
    if args.reps < 1 or args.runs < 1:
        p.error("--reps and --runs must be >= 1")
    torch.manual_seed(0)
    rows = []
    for label, shape in SHAPES.items():
        x = torch.randn(shape)
        copy = min(best_time(x.clone, args.reps) for _ in range(args.runs))
        nbytes = 2 * x.numel() * x.element_size()
        for axis in (-1, 0):
            peer = None
            for recipe, q in quantizers().items():
                times, outputs = {}, {}
                for backend in ("auto", "reference"):
                    with dispatch.use_backend(backend):
                        call = functools.partial(q, x, axis)
                        times[backend] = min(best_time(call, args.reps) for _ in range(args.runs))
                        outputs[backend] = q(x, axis)
                peer = times["auto"] if recipe == "mxfp4" else peer
                a, r = outputs["auto"], outputs["reference"]
                for backend, seconds in times.items():
                    rows.append({"operand": label, "shape": list(shape), "axis": axis, "recipe": recipe,
                                 "backend": backend, "seconds": seconds, "x_plain_mxfp4_fused": seconds / peer,
                                 "fraction_of_copy_bandwidth": (nbytes / seconds) / (nbytes / copy),
                                 "bit_exact_with_torch_path": bool(torch.equal(a, r) and a.stride() == r.stride())})
                print(f"{label} axis {axis} {recipe}: fused {times['auto'] * 1e3:.2f} ms, torch path "
                      f"{times['reference'] * 1e3:.2f} ms", file=sys.stderr)
    report = {"device": f"{describe()['cpu']} ({torch.get_num_threads()} threads)", "machine": describe(),
              "command": "python kernels/bench/bench_corrections.py " + " ".join(argv or sys.argv[1:]),
              "method": f"best of {args.reps} calls, minimum over {args.runs} runs, one process; backend auto = the "
                        "dispatch's choice (the fused kernels), reference = the eager torch path; an arm row is "
                        "the pathway matrix's quantizer of that arm at site both; "
                        "x_plain_mxfp4_fused = seconds / plain MXFP4's fused seconds on the same operand and axis",
              "rows": rows}
    write_json_atomic(args.out, report)
    print(f"wrote {args.out} ({len(rows)} rows)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

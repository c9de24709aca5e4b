"""CPU (or CUDA) timing of the quantized MoE experts: the grouped path against the per-expert loop
(the oracle it equals bit for bit, tests/moe_oracle.py), same run, same inputs; writes JSON.

    python kernels/bench_moe.py --out results/bench/moe_cpu.json

Shapes: the tiny MoE (8 experts, top-2, H 128, I 96) and a 2-layer slice with Qwen3-30B-A3B's
routing (128 experts, top-8) at H 256, I 128 (the real H 2048, I 768 puts 400M-element expert
weights through the CPU reference quantizer: minutes per step), one forward + backward of every
layer's experts block under the mxfp4 recipe, best of ``--reps``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
import types
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from transformers import Qwen3MoeConfig  # noqa: E402
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts  # noqa: E402

from moe_oracle import per_expert_forward  # noqa: E402
from mxfp4.config.recipes import Recipe  # noqa: E402
from mxfp4.io import write_json_atomic  # noqa: E402
from mxfp4.nn import patch_model, unpatch_model  # noqa: E402

CASES = {  # name: (experts, top_k, hidden, moe_intermediate, layers, tokens)
    "tiny-moe (8 experts, top-2, H128, I96)": (8, 2, 128, 96, 2, 512),
    "qwen3-30b-a3b routing slice (128 experts, top-8, H256, I128), 2 layers": (128, 8, 256, 128, 2, 512),
}


def one_case(experts_n, k, h, inter, layers, tokens, reps, recipe):
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(hidden_size=h, moe_intermediate_size=inter, num_experts=experts_n, num_experts_per_tok=k)
    blocks = []
    for _ in range(layers):
        e = Qwen3MoeExperts(cfg)
        with torch.no_grad():
            e.gate_up_proj.normal_(0, 0.02)
            e.down_proj.normal_(0, 0.02)
        blocks.append(e)
    x = torch.randn(tokens, h)
    w, idx = torch.softmax(torch.randn(tokens, experts_n), -1).topk(k, dim=-1)
    holder = torch.nn.ModuleList(blocks)
    holder.config = types.SimpleNamespace(tie_word_embeddings=False)
    patch_model(holder, Recipe.named(recipe).quantizer())

    def step(forward_of):
        y = x.requires_grad_(True)
        for b in blocks:
            y = forward_of(b)(y, idx, w)
        y.sum().backward()
        for b in blocks:
            b.gate_up_proj.grad = b.down_proj.grad = None
        x.grad = None

    out = {}
    try:
        for name, fwd in (
            ("grouped", lambda b: b.forward),
            ("per-expert loop", lambda b: lambda *a: per_expert_forward(b, *a)),
        ):
            step(fwd)  # warm-up (and the weight cache)
            best = float("inf")
            for _ in range(reps):
                t = time.perf_counter()
                step(fwd)
                best = min(best, time.perf_counter() - t)
            out[name] = best
    finally:
        unpatch_model(holder)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--recipe", default="mxfp4")
    args = p.parse_args(argv)
    if args.reps < 1:
        raise SystemExit("--reps must be >= 1")
    rows = []
    for name, shape in tqdm(CASES.items(), desc="moe bench", unit="case", file=sys.stderr):
        t = one_case(*shape, args.reps, args.recipe)
        rows.append(
            {
                "case": name,
                "experts": shape[0],
                "top_k": shape[1],
                "hidden": shape[2],
                "moe_intermediate": shape[3],
                "layers": shape[4],
                "tokens": shape[5],
                "seconds_fwd_bwd": t,
                "speedup_grouped_over_loop": t["per-expert loop"] / t["grouped"],
            }
        )
    report = {
        "device": "cuda: " + torch.cuda.get_device_name()
        if torch.cuda.is_available()
        else f"cpu: {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)",
        "method": f"best of {args.reps} runs of one forward+backward through every layer's experts, "
        f"recipe {args.recipe}",
        "torch": torch.__version__,
        "rows": rows,
    }
    write_json_atomic(args.out, report)
    for r in rows:
        print(
            f"{r['case']}: grouped {r['seconds_fwd_bwd']['grouped']:.3f} s, "
            f"loop {r['seconds_fwd_bwd']['per-expert loop']:.3f} s, "
            f"{r['speedup_grouped_over_loop']:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Timing of the quantized MoE experts on CPU or CUDA: the unquantized experts (the BF16 baseline),
the grouped MXFP4 path and the per-expert loop (the oracle it equals bit for bit, tests/moe_oracle.py),
same run, same inputs; writes JSON after every case (a timeout keeps what was measured).

    python kernels/bench/bench_moe.py --out results/bench/moe_cpu.json
    python kernels/bench/bench_moe.py --device cuda --compute bfloat16 --cases all --out $OUT/gpu_smoke_moe.json

Shapes: the tiny MoE (8 experts, top-2, H 128, I 96) and a 2-layer slice with Qwen3-30B-A3B's
routing (128 experts, top-8) at H 256, I 128 (the real H 2048, I 768 puts 400M-element expert
weights through the CPU reference quantizer: minutes per step), under the mxfp4 recipe, best of ``--reps``:
- a training step: one forward + backward of every layer's experts block, the quantized-weight cache
  cleared before each (the trainer clears it at every optimizer step);
- generation: one forward without gradients of ``DECODE_TOKENS`` tokens (a decode step of that many
  sequences), the cache kept across calls (the weights do not change while generating).
The real layers run as Qwen3-30B-A3B would: its ~30B expert weights put the cache far over
``mxfp4.nn.WEIGHT_CACHE_LIMIT_BYTES``, so there every GEMM quantizes its weight (no cache). The
target on an H100: the grouped MXFP4 training step <= 1.5x the unquantized one on the real layers.
"""

from __future__ import annotations

import argparse
import copy
import platform
import sys
import time
import types
from pathlib import Path

import torch
import transformers
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from transformers import Qwen3MoeConfig  # noqa: E402
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts  # noqa: E402

from moe_oracle import per_expert_forward  # noqa: E402
from mxfp4.config.recipes import Recipe  # noqa: E402
from mxfp4.io import write_json_atomic  # noqa: E402
from mxfp4.nn import clear_weight_caches, patch_model, unpatch_model  # noqa: E402

CASES = {  # name: (experts, top_k, hidden, moe_intermediate, layers, tokens)
    "tiny-moe (8 experts, top-2, H128, I96)": (8, 2, 128, 96, 2, 512),
    "qwen3-30b-a3b routing slice (128 experts, top-8, H256, I128), 2 layers": (128, 8, 256, 128, 2, 512),
}
# Qwen3-30B-A3B's real expert layers (random init): for CUDA (minutes a step through the CPU reference)
REAL = {"qwen3-30b-a3b layers (128 experts, top-8, H2048, I768), 2 layers, 4096 tokens": (128, 8, 2048, 768, 2, 4096)}
DECODE_TOKENS = 64
BASELINE_EXPERTS = "grouped_mm"  # transformers' experts implementation for the unquantized baseline
TARGET_GROUPED_OVER_BF16 = 1.5  # the real layers' training step on an H100


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def warm_up_clocks(seconds: float = 2.0) -> None:
    """Dense bf16 matmuls for ``seconds``, so the first timed case does not run on idle clocks."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        (a @ a).sum().item()


def one_case(experts_n, k, h, inter, layers, tokens, reps, recipe, device="cpu", compute="float32",
             cache_weights=True):
    """Best-of-``reps`` seconds of a training step (forward + backward through every layer's experts) and
    of a generation step (forward of ``DECODE_TOKENS`` tokens, no gradients): unquantized (``bf16``: the
    baseline in the compute dtype), the grouped MXFP4 path and the per-expert loop; on CUDA also each
    path's peak memory (GiB) over both."""
    torch.manual_seed(0)
    # the experts as a real model configures them: transformers resolves an unset implementation to its
    # grouped_mm one where it can dispatch (a bare config would run its per-expert Python loop)
    cfg = Qwen3MoeConfig(hidden_size=h, moe_intermediate_size=inter, num_experts=experts_n, num_experts_per_tok=k,
                         experts_implementation=BASELINE_EXPERTS)
    blocks = []
    for _ in range(layers):
        e = Qwen3MoeExperts(cfg)
        with torch.no_grad():
            e.gate_up_proj.normal_(0, 0.02)
            e.down_proj.normal_(0, 0.02)
        blocks.append(e.to(device))
    x = torch.randn(tokens, h, device=device)
    w, idx = torch.softmax(torch.randn(tokens, experts_n, device=device), -1).topk(k, dim=-1)
    decode = min(DECODE_TOKENS, tokens)
    holder = torch.nn.ModuleList(blocks)
    holder.config = types.SimpleNamespace(tie_word_embeddings=False)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=compute == "bfloat16")
    # transformers' grouped_mm is not on autocast's list and casts its input to the weight's dtype: fp32
    # master weights run fp32 GEMMs under bf16 autocast. The baseline is a bf16 model's experts (weights in
    # the compute dtype); the fp32-master path, what an unpatched model with fp32 masters runs, is timed beside
    twins = {b: copy.deepcopy(b).to(torch.bfloat16 if compute == "bfloat16" else torch.float32) for b in blocks}

    def train_step(forward_of):
        clear_weight_caches(holder)  # as at every optimizer step (a no-op unpatched or without the cache)
        y = x.requires_grad_(True)
        with autocast:
            for b in blocks:
                y = forward_of(b)(y, idx, w)
        y.float().sum().backward()
        for b in [*blocks, *twins.values()]:
            b.gate_up_proj.grad = b.down_proj.grad = None
        x.grad = None

    def generate_step(forward_of):
        with torch.no_grad(), autocast:
            y = x[:decode]
            for b in blocks:
                y = forward_of(b)(y, idx[:decode], w[:decode])

    def best(step, fwd):
        step(fwd)  # warm-up: autotuning, compilation (and, generating, the weight cache)
        out = float("inf")
        for _ in range(reps):
            _sync(device)
            t = time.perf_counter()
            step(fwd)
            _sync(device)
            out = min(out, time.perf_counter() - t)
        return out

    def timed(fwd):
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        seconds = {"fwd_bwd": best(train_step, fwd), "generate": best(generate_step, fwd)}
        return seconds, torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None

    out, peaks = {}, {}
    out["bf16"], peaks["bf16"] = timed(lambda b: twins[b].forward)  # unpatched, compute-dtype weights: the baseline
    if compute == "bfloat16":
        out["fp32 masters"], peaks["fp32 masters"] = timed(lambda b: b.forward)
    twins.clear()  # free the copies before the quantized paths run
    patch_model(holder, Recipe.named(recipe).quantizer(), cache_weights=cache_weights)
    try:
        for name, fwd in (
            ("grouped", lambda b: b.forward),
            ("per-expert loop", lambda b: lambda *a: per_expert_forward(b, *a)),
        ):
            out[name], peaks[name] = timed(fwd)
    finally:
        unpatch_model(holder)
    return out, peaks


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--recipe", default="mxfp4")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--compute", default="float32", choices=["float32", "bfloat16"],
                   help="bfloat16: under bf16 autocast, as the GPU profiles train")
    p.add_argument("--cases", default="small", choices=["small", "real", "all"],
                   help="small: the tiny MoE and a routing slice; real: Qwen3-30B-A3B's expert layers (CUDA)")
    args = p.parse_args(argv)
    if args.reps < 1:
        raise SystemExit("--reps must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    cases = {"small": CASES, "real": REAL, "all": {**REAL, **CASES}}[args.cases]  # the case with a target first
    if args.device == "cuda":
        warm_up_clocks()
    rows = []
    for name, shape in tqdm(cases.items(), desc="moe bench", unit="case", file=sys.stderr):
        real = name in REAL
        t, peaks = one_case(*shape, args.reps, args.recipe, args.device, args.compute, cache_weights=not real)
        train = {path: s["fwd_bwd"] for path, s in t.items()}
        generate = {path: s["generate"] for path, s in t.items()}
        row = {
            "case": name,
            "experts": shape[0],
            "top_k": shape[1],
            "hidden": shape[2],
            "moe_intermediate": shape[3],
            "layers": shape[4],
            "tokens": shape[5],
            "decode_tokens": min(DECODE_TOKENS, shape[5]),
            "weight_cache": not real,
            "seconds_fwd_bwd": train,
            "seconds_generate": generate,
            "peak_memory_gib": peaks,
            "speedup_grouped_over_loop": train["per-expert loop"] / train["grouped"],
            "grouped_over_bf16": train["grouped"] / train["bf16"],
            "generate_grouped_over_bf16": generate["grouped"] / generate["bf16"],
        }
        if "fp32 masters" in train:
            row["grouped_over_fp32_masters"] = train["grouped"] / train["fp32 masters"]
        if real:
            row.update(target_grouped_over_bf16=TARGET_GROUPED_OVER_BF16,
                       meets_target=row["grouped_over_bf16"] <= TARGET_GROUPED_OVER_BF16)
        rows.append(row)
        report = {
            "device": "cuda: " + torch.cuda.get_device_name()
            if args.device == "cuda"
            else f"cpu: {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)",
            "method": f"best of {args.reps} runs (after one warm-up) of a training step (forward+backward through "
            f"every layer's experts, the weight cache cleared before each) and of a generation step (forward of "
            f"{DECODE_TOKENS} tokens, no gradients), recipe {args.recipe}, compute {args.compute}; bf16 = the "
            f"experts unquantized with weights in that compute dtype through transformers' {BASELINE_EXPERTS} "
            f"experts (a bf16 model); fp32 masters = the same unpatched experts on fp32 master weights under the "
            f"autocast (grouped_mm casts its input to the weight's dtype: fp32 GEMMs); the real layers without "
            f"the weight cache, as at 30B",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "baseline_experts_implementation": BASELINE_EXPERTS,
            "baseline_weights": "compute dtype",  # a bf16 model's experts under bfloat16 compute
            "complete": len(rows) == len(cases),
            "rows": rows,
        }
        write_json_atomic(args.out, report)  # after every case: a timeout keeps what was measured
    for r in rows:
        print(
            f"{r['case']}: grouped {r['seconds_fwd_bwd']['grouped']:.3f} s, "
            f"loop {r['seconds_fwd_bwd']['per-expert loop']:.3f} s, "
            f"{r['speedup_grouped_over_loop']:.2f}x; grouped / unquantized {r['grouped_over_bf16']:.2f} "
            f"(generation {r['generate_grouped_over_bf16']:.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where one decoder layer's time goes under every recipe: real-shape layers (Qwen2.5-3B's dense layer,
Qwen3-30B-A3B's MoE layer) with random weights, for one decode step and one training micro-batch, host time
against device time, the quantizer's calls and its host time per call, and the operations (CPU) or kernels
(CUDA) launched per call; every recipe against the same run's BF16 layer. Writes JSON after every case.

    python kernels/bench/bench_layer.py --out results/bench/layer_cpu.json
    python kernels/bench/bench_layer.py --device cuda --compute bfloat16 --out $OUT/layer_h100.json
    python kernels/bench/bench_layer.py --fused-corrections off ...   # the corrections composed in torch ops

- decode: one forward without gradients of ``--decode-batch`` sequences of one token (the GEMMs of a decode
  step; attention over the one token, no cache), the recipe's weights quantized once before (a rollout keeps
  them for the whole generation);
- train: one forward and backward of one sequence of ``--tokens`` tokens, the weight caches cleared first
  (the trainer clears them at every optimizer step).
Host time: the call's wall time before the device is synchronised; device time: CUDA events around it (on
CPU the two are one: the host computes). Each time is the median of ``--reps`` calls after one warm-up.
``--fused-corrections off`` composes the corrections' hooks around the plain kernel (the same values): one
run of each gives the fused kernels' effect on the same machine; ``--shared-inputs off`` has each layer quantize
its own copy of an input that several read (q/k/v, gate/up). A plain MXFP4 weight quantized along both axes in one
read is one dispatch call, not a quantizer call. ``--host-profile N``: where each recipe's
decode host time goes (cProfile over N calls, the top functions by their own time).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time

import torch
import transformers
from transformers import AutoConfig, Qwen3MoeConfig
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeDecoderLayer, Qwen3MoeRotaryEmbedding

import mxfp4
from mxfp4.config import model_line
from mxfp4.config.recipes import Recipe, load_recipe_table
from mxfp4.io import write_json_atomic
from mxfp4.machine import describe
from mxfp4.nn import clear_weight_caches, patch_model, unpatch_model, use_shared_inputs
from mxfp4.numerics import dispatch
from mxfp4.numerics.quantizer import Quantizer

RECIPES = ["bf16", "mxfp4", "mxfp4+aqn", "mxfp4+fallback", "mxfp4+macro", "mxfp4+all", "mxfp4+rht-sr"]
# Qwen3-30B-A3B's layer (config.json of the hub checkpoint): 128 experts, top-8, H 2048, moe I 768
QWEN3_30B_A3B = {"hidden_size": 2048, "moe_intermediate_size": 768, "intermediate_size": 6144,
                 "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
                 "num_experts_per_tok": 8, "norm_topk_prob": True, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
                 "max_position_embeddings": 40960, "vocab_size": 151936}


class LayerHolder(torch.nn.Module):
    """One decoder layer and its rotary embedding, as ``patch_model`` takes a model (a config, named modules)."""

    def __init__(self, layer, rotary, config):
        super().__init__()
        self.layer, self.rotary, self.config = layer, rotary, config

    def forward(self, hidden):
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0).expand(hidden.shape[0], -1)
        return self.layer(hidden, position_embeddings=self.rotary(hidden, positions), position_ids=positions)


def build_layer(kind: str, experts: int, dtype: torch.dtype, device: str) -> LayerHolder:
    """The dense (Qwen2.5-3B) or MoE (Qwen3-30B-A3B, ``experts`` of its 128) layer, random weights, seed 0."""
    torch.manual_seed(0)
    if kind == "dense":
        fields = {k: v for k, v in model_line("qwen2.5-3b").items() if not k.startswith("_")}
        config = AutoConfig.for_model(fields.pop("model_type"), **fields)
        layer_cls, rotary_cls = Qwen2DecoderLayer, Qwen2RotaryEmbedding
    else:
        config = Qwen3MoeConfig(**{**QWEN3_30B_A3B, "num_experts": experts})
        layer_cls, rotary_cls = Qwen3MoeDecoderLayer, Qwen3MoeRotaryEmbedding
    config._attn_implementation = "sdpa"
    config.tie_word_embeddings = False
    with torch.device(device):
        holder = LayerHolder(layer_cls(config, 0), rotary_cls(config), config)
    return holder.to(dtype)


@contextlib.contextmanager
def counting_quantizer():
    """Counts ``Quantizer.__call__`` invocations and their host time (no device synchronisation inside)."""
    seen = {"calls": 0, "host_s": 0.0}
    real = Quantizer.__call__

    def counted(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real(self, *args, **kwargs)
        finally:
            seen["host_s"] += time.perf_counter() - t0
            seen["calls"] += 1

    Quantizer.__call__ = counted
    try:
        yield seen
    finally:
        Quantizer.__call__ = real


def launches(fn, device: str) -> int:
    """Kernels launched by one ``fn()`` on CUDA; aten operations dispatched on CPU (nested ones included)."""
    kind = torch.profiler.ProfilerActivity.CUDA if device == "cuda" else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[kind]) as prof:
        fn()
    if device == "cuda":
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return sum(1 for e in prof.events() if e.name.startswith("aten::"))


def timed(fn, device: str, reps: int) -> dict:
    """Median host and device milliseconds of ``fn()`` over ``reps`` calls after one warm-up, with the
    quantizer's calls and host time per call."""
    fn()
    host, dev, per_call, calls = [], [], [], 0
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        with counting_quantizer() as seen:
            t0 = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t0) * 1e3)
        if device == "cuda":
            end.record()
            torch.cuda.synchronize()
            dev.append(start.elapsed_time(end))
        else:
            dev.append(host[-1])
        calls = seen["calls"]
        if calls:
            per_call.append(seen["host_s"] / calls * 1e6)
    return {"host_ms": statistics.median(host), "device_ms": statistics.median(dev), "quantizer_calls": calls,
            "quantizer_host_us_per_call": statistics.median(per_call) if per_call else None,
            "launches": launches(fn, device)}


def host_profile(fn, calls: int, top: int = 15) -> list[dict]:
    """Where the host time of ``fn()`` goes: cProfile over ``calls`` calls, the ``top`` functions by their own
    time, each with its calls and microseconds (own and cumulative) per ``fn()`` call."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    rows = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [{"function": f"{file.rsplit('/', 2)[-1] if '/' in file else file}:{line}({name})",
             "calls_per_call": n / calls, "own_us_per_call": own / calls * 1e6, "cum_us_per_call": cum / calls * 1e6}
            for (file, line, name), (_, n, own, cum, _) in rows]


def run_case(kind: str, recipe: str, args, dtype: torch.dtype) -> dict:
    holder = build_layer(kind, args.moe_experts, dtype, args.device)
    autocast = (torch.autocast(args.device, dtype=torch.bfloat16) if args.compute == "bfloat16"
                else contextlib.nullcontext())
    r = Recipe.named(recipe)
    if r.quantize:
        patch_model(holder, r.quantizer())
    g = torch.Generator().manual_seed(1)
    h = holder.config.hidden_size
    decode_x = torch.randn(args.decode_batch, 1, h, generator=g).to(args.device, dtype)
    train_x = torch.randn(1, args.tokens, h, generator=g).to(args.device, dtype).requires_grad_(True)

    def decode():
        with torch.no_grad(), autocast:
            holder(decode_x)

    def train():
        clear_weight_caches(holder)
        holder.zero_grad(set_to_none=True)
        with autocast:
            out = holder(train_x)
        out.float().square().mean().backward()

    try:
        result = {"decode": timed(decode, args.device, args.reps), "train": timed(train, args.device, args.reps)}
        if args.host_profile:
            result["decode"]["host_profile"] = host_profile(decode, args.host_profile)
        return result
    finally:
        if r.quantize:
            unpatch_model(holder)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--compute", default="float32", choices=["float32", "bfloat16"],
                   help="master weights float32; bfloat16 runs the layer under bf16 autocast (the GPU cells')")
    p.add_argument("--layers", nargs="+", default=["dense", "moe"], choices=["dense", "moe"])
    p.add_argument("--recipes", nargs="+", default=RECIPES, help="the first is the reference (bf16)")
    p.add_argument("--tokens", type=int, default=None, help="training micro-batch tokens (CPU 64, CUDA 4096)")
    p.add_argument("--decode-batch", type=int, default=8, help="sequences of one decode step")
    p.add_argument("--moe-experts", type=int, default=None, help="experts of the MoE layer (CPU 16, CUDA 128)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--fused-corrections", default="on", choices=["on", "off"],
                   help="off: the corrections composed around the plain kernel (dispatch.use_fused_corrections)")
    p.add_argument("--shared-inputs", default="on", choices=["on", "off"],
                   help="off: each layer quantizes its own copy of an input several read (nn.use_shared_inputs)")
    p.add_argument("--host-profile", type=int, default=0, metavar="N",
                   help="cProfile N decode calls of each recipe: the top functions by own host time")
    p.add_argument("--threads", type=int, default=1, help="torch's CPU threads (1: a cell of the main job)")
    p.add_argument("--out", required=True, help="the JSON report")
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("bench_layer: --device cuda but torch sees no CUDA device")
    if args.host_profile < 0:
        raise SystemExit(f"bench_layer: --host-profile must be at least 0, got {args.host_profile}")
    for name in ("tokens", "decode_batch", "moe_experts", "reps", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise SystemExit(f"bench_layer: --{name.replace('_', '-')} must be at least 1, got {value}")
    args.tokens = args.tokens or (4096 if cuda else 64)
    args.moe_experts = args.moe_experts or (128 if cuda else 16)
    if args.moe_experts < QWEN3_30B_A3B["num_experts_per_tok"]:
        raise SystemExit(f"bench_layer: --moe-experts must be at least the top-k, "
                         f"{QWEN3_30B_A3B['num_experts_per_tok']}")
    known = load_recipe_table()
    unknown = [r for r in args.recipes if r not in known]
    if unknown:
        raise SystemExit(f"bench_layer: unknown recipe(s) {unknown}; known: {', '.join(known)}")
    torch.set_num_threads(args.threads)
    command = ["python", "kernels/bench/bench_layer.py", *(argv if argv is not None else sys.argv[1:])]
    out = {"command": " ".join(command), "method": __doc__.split("\n\n", 2)[2].strip(),
           "machine": describe(), "platform": platform.platform(),
           "device": torch.cuda.get_device_name() if cuda else "cpu",
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "mxfp4": mxfp4.__version__},
           "settings": {**{k: v for k, v in vars(args).items() if k != "out"},
                        "autotune": os.environ.get("MXFP4_AUTOTUNE", "1") != "0"},  # off: each space's first tiles
           "layers": {}}
    with (dispatch.use_fused_corrections(args.fused_corrections == "on"),
          use_shared_inputs(args.shared_inputs == "on")):
        for kind in args.layers:
            rows = out["layers"].setdefault(kind, {})
            for recipe in args.recipes:
                print(f"{kind} {recipe}", file=sys.stderr, flush=True)
                rows[recipe] = run_case(kind, recipe, args, torch.float32)
                ref = rows[args.recipes[0]]
                for phase in ("decode", "train"):
                    rows[recipe][phase]["device_vs_reference"] = (rows[recipe][phase]["device_ms"]
                                                                 / ref[phase]["device_ms"])
                write_json_atomic(args.out, out)
    for kind, rows in out["layers"].items():
        for recipe, rec in rows.items():
            print(f"{kind:5s} {recipe:16s} " + "  ".join(
                f"{ph} {rec[ph]['device_ms']:8.2f} ms ({rec[ph]['device_vs_reference']:.2f}x, "
                f"{rec[ph]['launches']} launches)" for ph in ("decode", "train")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

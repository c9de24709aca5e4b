"""The real-model board's measures before RL, on one named pretrained model: per recipe, GSM8K through lm-eval on
every held-out problem the profile evaluates (strict correctness per problem, to pair with BF16's), each
completion's error class (``error_tokens``), the time of one training pass over BF16's, and the share of weight
elements the recipe keeps in BF16 (its edge layers). The pathway harms come from ``mxfp4 mechanism`` on the same
profile; ``report.real_board`` ranks.

A recipe generates as it would in its rollouts (``Recipe.rollout_precision``). Recipes whose generation is the same
computation give the same evaluation: where a recipe's logits on the check batch (the first ``CHECK_PROMPTS``
held-out prompts) equal an already evaluated recipe's bit for bit, its evaluation is that recipe's, and its row
names it (``same_as``).
"""

from __future__ import annotations

import hashlib
import statistics
import time
from pathlib import Path

import torch

from ..config.data_files import gsm8k_folder
from ..config.recipes import Recipe
from ..config.run import Run
from ..io import jsonl_records, write_csv_atomic, write_json_atomic
from ..nn import gemm_weights, generation_precision, patch_state, rollout_weight_cache, targets
from ..rl import data as gsm
from ..rl.evaluate import evaluate_gsm8k, hf_lm
from ..rl.models import load, model_reference
from .error_tokens import RULE, classify, vocabulary
from .pathways.measurement import Arm

CHECK_PROMPTS = 8
TIMED_PASSES = 3  # timed rounds over every recipe, after one untimed round; the median is reported
PASS_TOKENS = (2, 128)  # the timed training pass: 2 sequences of 128 tokens
ITEM_FIELDS = ["model", "recipe", "doc_id", "doc_hash", "strict", "flexible", "repetitive", "garbled", "error",
               "same_as"]


def bf16_fraction(model, quantizer) -> float:
    """The share of the recipe's GEMM weight elements its patched ``model`` leaves unquantized (its BF16 layers)."""
    if quantizer is None:
        return 0.0
    patched = set(patch_state(model).modules)
    sizes = {n: sum(p.numel() for p in gemm_weights(m).values()) for n, m, _ in targets(model, quantizer.modules)}
    return sum(v for n, v in sizes.items() if n not in patched) / sum(sizes.values())


def logits_digest(model, batch: dict, quantizer) -> str:
    with torch.no_grad(), generation_precision(model, quantizer):
        logits = model(**batch).logits
    return hashlib.sha256(logits.float().contiguous().numpy().tobytes()).hexdigest()


def _pass_seconds(model, batch: dict) -> float:
    model.train()
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    model(**batch, labels=batch["input_ids"]).loss.backward()
    seconds = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    model.eval()
    return seconds


def training_pass_seconds(model, recipes: dict[str, Recipe], batch: dict, rounds: int = TIMED_PASSES
                          ) -> dict[str, float]:
    """Per recipe, the median seconds of one forward and backward of the language-model loss on ``batch`` over
    ``rounds`` rounds, each round timing every recipe once in turn after one untimed pass (interleaved, so that
    a drift in the machine's speed falls on every recipe alike)."""
    times: dict[str, list[float]] = {name: [] for name in recipes}
    for i in range(rounds + 1):
        for name, recipe in recipes.items():
            with Arm(model, recipe.quantizer()):
                seconds = _pass_seconds(model, batch)
            if i:
                times[name].append(seconds)
    return {name: statistics.median(t) for name, t in times.items()}


def completions(output_dir: Path) -> dict[int, dict]:
    """{doc_id: {doc_hash, strict, flexible, completion}} from lm-eval's samples under ``output_dir``."""
    out: dict[int, dict] = {}
    for path in sorted(output_dir.glob("samples_*.jsonl")):
        for _, s in jsonl_records(path, advice="rerun mxfp4 real-board"):
            missing = [k for k in ("doc_id", "doc_hash", "filter", "exact_match", "resps") if k not in s]
            if missing:
                raise ValueError(f"{path}: a sample lacks {', '.join(missing)} (an lm-eval sample line has them)")
            row = out.setdefault(s["doc_id"], {"doc_hash": s["doc_hash"], "completion": s["resps"][0][0]})
            row["strict" if s["filter"] == "strict-match" else "flexible"] = float(s["exact_match"])
    if not out:
        raise ValueError(f"{output_dir}: lm-eval wrote no samples_*.jsonl")
    return out


def measure(run: Run, model_name: str, recipes: list[str], out_dir: Path | str, progress=print) -> dict:
    """Every recipe's evaluation before RL on ``model_name`` (a named pretrained model of the profile), written to
    ``out_dir``: ``items.csv`` (``ITEM_FIELDS``, one row per recipe and problem) and ``recipes.json`` (per recipe:
    accuracy, error rates, training-pass seconds and their ratio to BF16's, the share of the quantizable weight elements
    the recipe keeps in BF16, ``same_as``).

    Args:
        run: the run (its profile's data, evaluation and model line).
        model_name: a model line of the profile whose weights are pretrained (no warm start of ours).
        recipes: the recipes measured; bf16 is measured first whether named or not.
        out_dir: the folder written (lm-eval's output per evaluated recipe under ``eval/<recipe>``).
        progress: called with one line per recipe.

    Returns:
        the contents of ``recipes.json``.
    """
    profile, out_dir = run.profile, Path(out_dir)
    spec = profile.model(model_name)
    if spec.arch:
        raise ValueError(f"model {model_name!r} of profile {profile.name!r} is a tiny stand-in trained here; the "
                         "real-model board is about a named pretrained model (a hub or packaged model line)")
    names = list(dict.fromkeys(["bf16", *recipes]))
    built = {n: Recipe.named(n) for n in names}
    _, eval_folder = gsm.cell_data(run)
    vocab = vocabulary(f"{r['question']} {r['answer']}" for r in gsm.load_gsm8k("train", gsm8k_folder(profile)))
    model, tokenizer = load(model_reference(run.start(model_name)), dtype=torch.float32)
    model.eval()
    held_out = gsm.load_gsm8k("test", eval_folder)[:CHECK_PROMPTS]
    check = tokenizer([gsm.prompt(r["question"], tokenizer, spec.chat) for r in held_out], return_tensors="pt",
                      padding=True)
    ev = profile.eval
    digests: dict[str, str] = {}
    items, summary = [], {}
    t0 = time.time()
    for name in names:
        quantizer = built[name].quantizer()
        with Arm(model, quantizer):
            kept_fraction = bf16_fraction(model, quantizer)
            digest = logits_digest(model, check, quantizer)
            same_as = next((other for other, d in digests.items() if d == digest), None)
            digests.setdefault(name, digest)
            folder = out_dir / "eval" / (same_as or name)
            if same_as is None:
                lm = hf_lm(model, tokenizer, batch_size=ev.batch_size)
                with generation_precision(model, quantizer), rollout_weight_cache(model):
                    evaluate_gsm8k(lm, eval_folder, num_fewshot=ev.num_fewshot, limit=ev.limit,
                                   max_gen_toks=ev.max_gen_toks, output_dir=folder, seed=0, chat=spec.chat)
        per_doc = completions(folder)
        rows = []
        for doc_id, d in sorted(per_doc.items()):
            rows.append({"model": model_name, "recipe": name, "doc_id": doc_id, "doc_hash": d["doc_hash"],
                         "strict": d["strict"], "flexible": d["flexible"], **classify(d["completion"], vocab),
                         "same_as": same_as or ""})
        items += rows
        n = len(rows)
        summary[name] = {
            "n": n,
            "strict_accuracy": sum(r["strict"] for r in rows) / n,
            "error_rate": sum(r["error"] for r in rows) / n,
            "repetitive_rate": sum(r["repetitive"] for r in rows) / n,
            "garbled_rate": sum(r["garbled"] for r in rows) / n,
            "bf16_element_fraction": kept_fraction,
            "same_as": same_as,
        }
        progress(f"[{time.time() - t0:7.1f}s] {model_name} {name}: strict {summary[name]['strict_accuracy']:.3f} "
                 f"over {n} problems, error completions {summary[name]['error_rate']:.3f}"
                 + (f" (generation bit-identical to {same_as}'s)" if same_as else ""))
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(out_dir / "items.csv", items, ITEM_FIELDS)
    record = {"model": model_name, "profile": profile.name, "error_rule": RULE,
              "check": f"logits on the first {CHECK_PROMPTS} held-out prompts, bit for bit", "recipes": summary}
    return timed(record, model, tokenizer, built, eval_folder, spec.chat, out_dir)


def timed(record: dict, model, tokenizer, recipes: dict[str, Recipe], eval_folder, chat: bool, out_dir: Path
          ) -> dict:
    """``record`` with every recipe's training-pass seconds and ratio to BF16's (``training_pass_seconds``),
    written to ``out_dir/recipes.json``."""
    held_out = gsm.load_gsm8k("test", eval_folder)[:PASS_TOKENS[0]]
    texts = [gsm.prompt(r["question"], tokenizer, chat) + r["answer"] for r in held_out]
    batch = tokenizer(texts, return_tensors="pt", padding="max_length", truncation=True, max_length=PASS_TOKENS[1])
    seconds = training_pass_seconds(model, recipes, batch)
    for name, s in seconds.items():
        record["recipes"][name].update(training_pass_seconds=s, training_pass_ratio=s / seconds["bf16"])
    record["training_pass"] = (f"forward and backward of the LM loss on {PASS_TOKENS[0]} x {PASS_TOKENS[1]} tokens "
                               f"of held-out text, median of {TIMED_PASSES} rounds that time every recipe in turn "
                               "after one untimed round, one process")
    write_json_atomic(Path(out_dir) / "recipes.json", record)
    return record


def retime(run: Run, model_name: str, out_dir: Path | str) -> dict:
    """The training-pass times of a measured board (its ``recipes.json``) taken again, every recipe in turn."""
    import json

    out_dir = Path(out_dir)
    record = json.loads((out_dir / "recipes.json").read_text())
    model, tokenizer = load(model_reference(run.start(model_name)), dtype=torch.float32)
    _, eval_folder = gsm.cell_data(run)
    built = {n: Recipe.named(n) for n in record["recipes"]}
    return timed(record, model, tokenizer, built, eval_folder, run.profile.model(model_name).chat, out_dir)


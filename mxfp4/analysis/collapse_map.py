"""Where W4A4 MXFP4 breaks a named pretrained model before RL: the model with one decoder layer at a time left in
BF16 (the rest plain MXFP4), and with each operand role (weights, activations, gradients) alone quantized.

Per configuration, on the profile's model: the teacher-forced negative log-likelihood per token of the correct worked
solutions of ``prompts`` real GSM8K test problems (the rollout pathway's measure) and the share of MXFP4's excess over
BF16 it removes. For the references, the roles and the ``TOP_LAYERS`` layers that remove most (a layer's accuracy
before RL sits at MXFP4's floor of 0 otherwise, and each evaluation costs minutes of CPU): GSM8K strict accuracy
through lm-eval on the held-out problems, and the cosine of that supervised loss's gradient to BF16's (the gradient
pathway on fixed text). The problems, prompts and order are the same for every configuration: every contrast is
paired.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..config.data_files import gsm8k_folder
from ..config.recipes import BF16Layers, Recipe
from ..config.run import Run
from ..io import write_csv_atomic
from ..nn import rollout_weight_cache
from ..rl import data as gsm
from ..rl.evaluate import evaluate_gsm8k, hf_lm
from ..rl.grad_accuracy import compare
from ..rl.models import load, model_reference
from .pathways.measurement import Arm
from .teacher_forced import completion_nll, token_pairs

ROLES = {"weights alone": "mxfp4-weights-alone", "activations alone": "mxfp4-activations-alone",
         "gradients alone": "mxfp4-gradients-alone"}
TOP_LAYERS = 3  # the layers whose accuracy and gradient are measured: those whose BF16 removes most NLL
FIELDS = ["model", "config", "kind", "layer", "problems", "strict_accuracy", "prompts", "solution_nll",
          "nll_gap_removed", "grad_cosine"]


def configurations(layers: int) -> list[tuple[str, str, int | None, Recipe]]:
    """(name, kind, layer, recipe): bf16, mxfp4, each layer alone in BF16, each role alone quantized."""
    out = [("bf16", "reference", None, Recipe.named("bf16")), ("mxfp4", "reference", None, Recipe.named("mxfp4"))]
    base = Recipe.named("mxfp4")
    out += [(f"layer {i} in BF16", "layer", i,
             base.model_copy(update={"name": f"mxfp4-bf16-layer{i}", "bf16_layers": BF16Layers(layers=[i])}))
            for i in range(layers)]
    out += [(name, "role", None, Recipe.named(recipe)) for name, recipe in ROLES.items()]
    return out


def measure(run: Run, model_name: str, out_csv: Path | str, problems: int | None, prompts: int,
            top_layers: int = TOP_LAYERS, progress=print) -> list[dict]:
    """Every configuration's measures (``FIELDS``), written to ``out_csv``: the solution NLL for all; the gradient
    cosine for the references, the roles and the ``top_layers`` layers whose BF16 removes most of MXFP4's excess NLL,
    and for the roles and those layers the accuracy on ``problems`` held-out problems (None: the profile's evaluation
    limit; the references' is the real board's)."""
    profile = run.profile
    spec = profile.model(model_name)
    model, tokenizer = load(model_reference(run.start(model_name)), dtype=torch.float32)
    configs = configurations(int(model.config.num_hidden_layers))
    _, eval_folder = gsm.cell_data(run)
    test = gsm.load_gsm8k("test", gsm8k_folder(profile))[:prompts]
    solutions = token_pairs(tokenizer, [gsm.prompt(r["question"], tokenizer, spec.chat) for r in test],
                            [r["answer"] for r in test])
    pad = tokenizer.pad_token_id or 0
    rows = {name: {"model": model_name, "config": name, "kind": kind, "layer": layer, "problems": None,
                   "strict_accuracy": None, "prompts": len(test), "grad_cosine": None}
            for name, kind, layer, _ in configs}
    t0 = time.time()
    model.eval()
    for name, _, _, recipe in configs:
        with Arm(model, recipe.quantizer()), torch.no_grad():
            rows[name]["solution_nll"] = float(completion_nll(model, *solutions, pad))
        progress(f"[{time.time() - t0:7.1f}s] {model_name} {name}: solution NLL {rows[name]['solution_nll']:.4f}")
    low, high = rows["bf16"]["solution_nll"], rows["mxfp4"]["solution_nll"]
    for r in rows.values():
        r["nll_gap_removed"] = (high - r["solution_nll"]) / (high - low) if high > low else None
    layers = sorted((r for r in rows.values() if r["kind"] == "layer"), key=lambda r: -(r["nll_gap_removed"] or 0))
    deep = {r["config"] for r in rows.values() if r["kind"] == "role"} | {r["config"] for r in layers[:top_layers]}
    reference = None
    ev = profile.eval
    for name, kind, _, recipe in configs:
        if name not in deep and kind != "reference":
            continue
        with Arm(model, recipe.quantizer()):
            model.train()
            params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
            grads = torch.autograd.grad(completion_nll(model, *solutions, pad), [p for _, p in params],
                                        allow_unused=True)
            grad = {n: g.detach() for (n, _), g in zip(params, grads, strict=True) if g is not None}
            reference = grad if name == "bf16" else reference
            rows[name]["grad_cosine"] = compare(grad, reference)["total"]["cosine"]
            model.eval()
            if name not in deep:  # the references' accuracy is the real board's, on the same problems
                continue
            with rollout_weight_cache(model):
                scores = evaluate_gsm8k(hf_lm(model, tokenizer, batch_size=ev.batch_size), eval_folder,
                                        num_fewshot=ev.num_fewshot, limit=problems or ev.limit,
                                        max_gen_toks=ev.max_gen_toks, seed=0, chat=spec.chat)
        rows[name].update(problems=scores["n"], strict_accuracy=float(scores["strict_match"]))
        progress(f"[{time.time() - t0:7.1f}s] {model_name} {name}: strict {scores['strict_match']:.3f} over "
                 f"{scores['n']}, gradient cosine {rows[name]['grad_cosine']:.4f}")
    out = list(rows.values())
    write_csv_atomic(out_csv, out, FIELDS)
    return out

"""GSM8K evaluation through lm-eval: lm-eval's gsm8k task structure on an in-memory model (HFLM)."""

from __future__ import annotations

from pathlib import Path

import yaml

from ..layout import EVAL_RESULTS
from .data import CHAT_PROMPT

TASK_YAML = Path(__file__).resolve().parent / "tasks" / "gsm8k_local.yaml"


def task_config(data_dir: Path | str, num_fewshot: int, max_gen_toks: int | None = None, chat: bool = False) -> dict:
    """lm-eval's gsm8k config pointed at ``data_dir/{train,test}.jsonl``; with ``chat``, the question asks for
    the ``#### n`` answer (``data.CHAT_PROMPT``, the user turn ``apply_chat_template`` renders)."""
    data_dir = Path(data_dir)
    for split in ("train", "test"):
        if not (data_dir / f"{split}.jsonl").exists():
            raise ValueError(f"GSM8K evaluation needs {data_dir / f'{split}.jsonl'}")
    cfg = yaml.safe_load(TASK_YAML.read_text())
    cfg["dataset_kwargs"] = {"data_files": {s: str(data_dir / f"{s}.jsonl") for s in ("train", "test")}}
    cfg["num_fewshot"] = num_fewshot
    if max_gen_toks is not None:
        cfg["generation_kwargs"]["max_gen_toks"] = max_gen_toks
    if chat:
        cfg["doc_to_text"] = CHAT_PROMPT.replace("{question}", "{{question}}")
    return cfg


def hf_lm(model, tokenizer, batch_size: int = 32, max_length: int | None = None, compute_dtype=None):
    """lm-eval's HFLM around an in-memory (possibly patched, quantized) model; ``compute_dtype``: the
    autocast dtype of its forward passes and generation (HFLM's ``mixed_precision_dtype``; None: HFLM turns
    autocast off, whatever encloses it)."""
    from lm_eval.models.huggingface import HFLM

    kwargs = {"pretrained": model, "tokenizer": tokenizer, "batch_size": batch_size,
              "mixed_precision_dtype": compute_dtype}
    if max_length is not None:
        kwargs["max_length"] = max_length
    return HFLM(**kwargs)


class CompiledTemplate:
    """A task's Jinja template compiled once by lm-eval's own environment and rendered per document as
    lm-eval's ``apply_template`` renders it: lm-eval compiles a string template again for every document
    (seconds of every evaluation), a callable it calls. ``str`` gives the template back, which is what lm-eval
    writes for a callable in the config beside the results, so that file is unchanged too.

    Args:
        source: the template (a task config's ``doc_to_text`` or ``doc_to_target``).
    """

    def __init__(self, source: str):
        from lm_eval.utils import env

        self.source = source
        self._template = env.from_string(source)

    def __call__(self, doc: dict) -> str:
        return self._template.render(**doc)

    def __str__(self) -> str:
        return self.source

    def __deepcopy__(self, memo) -> CompiledTemplate:  # lm-eval copies its configs; a compiled one is immutable
        return self

    def __reduce__(self):  # Jinja's templates do not pickle: compile again from the source
        return CompiledTemplate, (self.source,)


def compiled_templates(cfg: dict) -> dict:
    """``cfg`` with its text and target templates compiled once (``CompiledTemplate``): the same prompts and
    targets, the same written config. A template that names a document field alone (lm-eval reads the
    field then) is left as it is."""
    out = dict(cfg)
    for key in ("doc_to_text", "doc_to_target"):
        if isinstance(out.get(key), str) and "{{" in out[key]:
            out[key] = CompiledTemplate(out[key])
    return out


def evaluate_gsm8k(lm, data_dir, num_fewshot: int = 0, limit: int | None = None, max_gen_toks: int | None = None,
                   output_dir: Path | str | None = None, seed: int = 0, chat: bool = False) -> dict | None:
    """Run the task; returns {strict_match, flexible_extract, n}. lm-eval's own results (and samples)
    are written under ``output_dir`` when given; ``chat``: each prompt is rendered by the tokenizer's chat
    template (an instruct model, ``data.prompt``). Under several processes every rank must call it
    (lm-eval splits the requests over the ranks and gathers them on rank 0); the other ranks get None."""
    from lm_eval import evaluator
    from lm_eval.tasks import TaskManager

    cfg = compiled_templates(task_config(data_dir, num_fewshot, max_gen_toks, chat))
    results = evaluator.simple_evaluate(
        model=lm,
        tasks=[cfg],
        # the task is given whole as a config: skip indexing lm-eval's thousands of bundled task YAMLs
        # (seconds per cell)
        task_manager=TaskManager(include_defaults=False),
        limit=limit,
        log_samples=output_dir is not None,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
        bootstrap_iters=0,
        apply_chat_template=chat,
    )
    if results is None:  # not rank 0: lm-eval gathered this rank's share on rank 0
        return None
    if output_dir is not None:
        _write_lm_eval_output(results, Path(output_dir))
    return _summary(results, cfg["task"], num_fewshot)


def _summary(results: dict, task: str, num_fewshot: int) -> dict:
    r = results["results"][task]
    return {
        "strict_match": r["exact_match,strict-match"],
        "flexible_extract": r["exact_match,flexible-extract"],
        "n": results["n-samples"][task]["effective"],
        "num_fewshot": num_fewshot,
    }


def read_summary(output_dir: Path | str) -> dict | None:
    """The summary ``evaluate_gsm8k`` returned, read back from the lm-eval output it wrote under
    ``output_dir`` (None when there is none: never evaluated, or interrupted before writing)."""
    import json

    path = Path(output_dir) / EVAL_RESULTS
    if not path.is_file():
        return None
    results = json.loads(path.read_text())
    task = yaml.safe_load(TASK_YAML.read_text())["task"]
    return _summary(results, task, results["configs"][task]["num_fewshot"])


def doc_hashes(output_dir: Path | str) -> list[tuple[int, str]]:
    """(doc_id, doc_hash) of every problem lm-eval scored under ``output_dir``, sorted: two
    evaluations scored the same problems exactly when these are equal."""
    import json

    out = set()
    for samples in sorted(Path(output_dir).glob("samples_*.jsonl")):
        for line in samples.read_text().splitlines():
            if line.strip():
                s = json.loads(line)
                out.add((int(s["doc_id"]), s["doc_hash"]))
    return sorted(out)


def _write_lm_eval_output(results: dict, out: Path) -> None:
    """lm-eval's results JSON and per-sample JSONL, as its own ``--output_path`` writes them."""
    import json

    from lm_eval.utils import handle_non_serializable

    out.mkdir(parents=True, exist_ok=True)
    samples = results.pop("samples", {})
    (out / EVAL_RESULTS).write_text(json.dumps(results, indent=2, default=handle_non_serializable))
    for task, rows in samples.items():
        with (out / f"samples_{task}.jsonl").open("w") as f:
            for row in rows:
                f.write(json.dumps(row, default=handle_non_serializable) + "\n")

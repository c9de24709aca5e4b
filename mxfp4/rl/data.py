"""GSM8K data: the real set (hub or local jsonl) and an embedded generator of GSM8K-format problems.

Every record has ``question`` and ``answer`` (a worked answer ending in ``#### n``), like
``openai/gsm8k`` (config ``main``). Prompts use lm-eval's gsm8k ``doc_to_text``:
``"Question: {question}\\nAnswer:"``, so training, rollouts and evaluation see one format.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

from ..config.data_files import default_gsm8k_dir, gsm8k_folder
from ..config.run import Run
from ..io import changed_files, file_sha256, jsonl_records, write_json_atomic, write_jsonl_atomic
from ..problems import embedded_split

HUB_ID = ("openai/gsm8k", "main")
PROMPT = "Question: {question}\nAnswer:"
CHAT_PROMPT = "{question}\nGive the final answer after ####."  # the user turn of an instruct model (``prompt``)
_FINAL = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")


def _is_number(text: str | None) -> bool:
    try:
        return text is not None and math.isfinite(float(text))
    except ValueError:
        return False


def validate_jsonl(path: Path | str) -> int:
    """Check a GSM8K jsonl file line by line (an object with string 'question' and 'answer' on
    every non-empty line); returns the record count. A bad line is an error naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} does not exist (expected a GSM8K jsonl file)")
    n = 0
    for lineno, rec in jsonl_records(path, skip_blank=True):
        if not isinstance(rec, dict) or not {"question", "answer"} <= set(rec):
            raise ValueError(f"{path}:{lineno}: expected an object with 'question' and 'answer'")
        if not all(isinstance(rec[k], str) for k in ("question", "answer")):
            raise ValueError(f"{path}:{lineno}: 'question' and 'answer' must be strings")
        if not _is_number(final_answer(rec["answer"])):
            raise ValueError(f"{path}:{lineno}: the answer has no final '#### n' line with a number n "
                             f"(got {rec['answer'][-40:]!r})")
        n += 1
    if n == 0:
        raise ValueError(f"{path} holds no records")
    return n


def validate_gsm8k_dir(folder: Path | str) -> dict[str, int]:
    """Both splits of a GSM8K folder validated up front (before any training): records per split."""
    folder = Path(folder)
    return {split: validate_jsonl(folder / f"{split}.jsonl") for split in ("train", "test")}


def load_gsm8k(split: str, source: str | Path | None = None) -> list[dict]:
    """GSM8K ``split`` (train or test) from a local folder of jsonl files (validated, then read by
    ``datasets``' json builder), or from the hub."""
    from datasets import load_dataset

    if split not in ("train", "test"):
        raise ValueError(f"unknown GSM8K split {split!r}; accepted: train, test")
    folder = Path(source) if source not in (None, "hub") else (default_gsm8k_dir() if source is None else None)
    if folder is not None:
        path = folder / f"{split}.jsonl"
        validate_jsonl(path)
        ds = load_dataset("json", data_files=str(path), split="train")
    else:
        ds = load_dataset(*HUB_ID, split=split)
    return [{"question": q, "answer": a} for q, a in zip(ds["question"], ds["answer"])]


def prompt(question: str, tokenizer=None, chat: bool = False) -> str:
    """The text a policy is prompted with: lm-eval's gsm8k ``doc_to_text``; for an instruct model (``chat``)
    the question asking for the ``#### n`` answer the reward and lm-eval's strict match read, as a user turn
    of the tokenizer's chat template (what lm-eval renders with ``apply_chat_template``). An instruct model
    prompted in the plain format rarely writes ``####``: no reward to learn from."""
    if not chat:
        return PROMPT.format(question=question)
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("chat prompts need a tokenizer with a chat template; this one has none "
                         "(set chat: false for the model in the profile)")
    turn = [{"role": "user", "content": CHAT_PROMPT.format(question=question)}]
    return tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)


def final_answer(text: str) -> str | None:
    """The ``#### n`` answer of a worked solution (lm-eval's strict-match regex), commas dropped."""
    m = _FINAL.search(text)
    return m.group(1).replace(",", "").rstrip(".") if m else None


def normalize(number: str) -> str:
    s = number.replace(",", "").replace("$", "").rstrip(".")
    try:
        v = float(s)
    except ValueError:
        return s
    return str(int(v)) if v == int(v) else str(v)


def is_correct(completion: str, answer: str) -> bool:
    """Strict: the completion's ``#### n`` equals the reference's final answer."""
    got, want = final_answer(completion), final_answer(answer)
    return got is not None and want is not None and normalize(got) == normalize(want)


def write_jsonl(records: list[dict], path: Path | str) -> Path:
    return write_jsonl_atomic(path, ({"question": r["question"], "answer": r["answer"]} for r in records))


def accuracy_reward(completions, answer, **kwargs) -> list[float]:
    """1 when the completion's ``#### n`` is the reference answer, else 0 (TRL reward signature)."""
    return [1.0 if is_correct(c, a) else 0.0 for c, a in zip(completions, answer)]


def token_parity_reward(completions, completion_ids, **kwargs) -> list[float]:
    """The fraction of a completion's token ids that are even (TRL reward signature). No task signal:
    for a random-weight model, which never earns the accuracy reward, it differs between the completions
    of a group, so GRPO's advantages and gradients are not all zero and a step does the real work."""
    return [sum(1 for t in ids if t % 2 == 0) / len(ids) if len(ids) else 0.0 for ids in completion_ids]


EMBEDDED_FILES = ("train.jsonl", "test.jsonl")


def _stamp_refusal(stamp: Path, made_by: dict) -> str | None:
    """Why the embedded data beside ``stamp`` must be made (again): "" when it was never made, what differs
    otherwise (other settings, a file changed since its digest was recorded); None when it is whole."""
    if not stamp.is_file():
        return ""
    try:
        recorded = json.loads(stamp.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"{stamp.name} is not JSON"
    if not isinstance(recorded, dict) or {k: v for k, v in recorded.items() if k != "digests"} != made_by:
        return "made by other settings"
    digests = recorded.get("digests")
    if not isinstance(digests, dict) or set(digests) != set(EMBEDDED_FILES):
        return "no digests of its files recorded"
    changed = changed_files(stamp.parent, digests)
    return f"{', '.join(changed)} changed since made (digests differ)" if changed else None


def _embedded_folder(folder: Path, made_by: dict, pool: list[dict], test: list[dict]) -> Path:
    """``folder`` with lm-eval's train.jsonl (the few-shot pool) and test.jsonl, (re)made unless its stamp says
    ``made_by`` made them and they are unchanged since."""
    stamp = folder / "settings.json"  # written last: the settings that made the files beside it, their digests
    why = _stamp_refusal(stamp, made_by)
    if why is not None:
        if why:
            print(f"{folder}: {why}; remaking its files from the profile's settings", file=sys.stderr, flush=True)
        write_jsonl(pool, folder / "train.jsonl")
        write_jsonl(test, folder / "test.jsonl")
        write_json_atomic(stamp, {**made_by, "digests": {f: file_sha256(folder / f) for f in EMBEDDED_FILES}})
    return folder


def cell_data(run: Run) -> tuple[list[dict], Path]:
    """(training problems, folder with train/test jsonl for lm-eval) for the run's data source, the GSM8K files
    checked (``validate_gsm8k_dir``)."""
    profile = run.profile
    d = profile.data
    if d.source == "embedded":
        train = embedded_split("train", d.n_train, seed=0, max_steps=d.max_problem_steps, holdout=d.holdout)
        made_by = {"n_eval": d.n_eval, "max_problem_steps": d.max_problem_steps, "fewshot_pool": 64}
        if d.arithmetic_held_out:
            made_by["holdout"] = d.holdout
        pool = embedded_split("train", 64, seed=1, max_steps=d.max_problem_steps, holdout=d.holdout)
        test = embedded_split("test", d.n_eval, seed=0, max_steps=d.max_problem_steps, holdout=d.holdout)
        return train, _embedded_folder(run.layout.data, made_by, pool, test)
    folder = gsm8k_folder(profile)
    validate_gsm8k_dir(folder)  # a damaged or foreign file is one line here, not an error inside datasets
    return load_gsm8k("train", folder), folder


def arithmetic_eval_folder(run: Run) -> Path:
    """The folder lm-eval reads the held-out arithmetic from (``data.holdout: arithmetic``): the same few-shot
    pool, and test.jsonl of ``data.n_eval`` problems that each need an arithmetic fact no training draw holds."""
    d = run.profile.data
    if not d.arithmetic_held_out:
        raise ValueError(f"profile {run.profile.name!r} holds out questions only (data.holdout {d.holdout!r}); "
                         "accepted: a profile with data.holdout: arithmetic")
    made_by = {"n_eval": d.n_eval, "max_problem_steps": d.max_problem_steps, "fewshot_pool": 64,
               "holdout": d.holdout, "split": "test-arithmetic"}
    pool = embedded_split("train", 64, seed=1, max_steps=d.max_problem_steps, holdout=d.holdout)
    test = embedded_split("test-arithmetic", d.n_eval, seed=0, max_steps=d.max_problem_steps, holdout=d.holdout)
    return _embedded_folder(run.layout.data / "arithmetic", made_by, pool, test)

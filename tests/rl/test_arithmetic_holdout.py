"""The never-trained arithmetic: no training draw shows a held-out fact, the arithmetic test side needs one, and a
cell of a profile that holds it out evaluates it before and after RL and aggregates it apart."""

import hashlib
import json
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mxfp4 import problems
from mxfp4.config.profiles import load_profile
from mxfp4.config.run import Run
from mxfp4.layout import ARITHMETIC_EVAL_FOLDERS, Layout

LINE = re.compile(r"(\d+)([+\-*])(\d+)=<<")  # a worked line, read here without the generator's parser


def _held_out(a: int, op: str, k: int) -> bool:
    """The held-out facts by an independent computation of their rule (SHA-256 of "a op k", 1 in 8)."""
    return int(hashlib.sha256(f"{a}{op}{k}".encode()).hexdigest()[:16], 16) % 8 == 0


def _facts(text: str) -> set[tuple[int, str, int]]:
    return {(int(a), op, int(k)) for a, op, k in LINE.findall(text)}


def _training_texts(profile, warm_starts=2):
    """Every text a profile that holds out arithmetic trains on: each warm start's SFT completions (flawed ones
    included), GRPO's problems and the few-shot pool."""
    from mxfp4.rl.pretrain import sft_dataset

    d, p = profile.data, profile.pretrain
    texts = []
    for k in range(warm_starts):
        records = problems.embedded_split("train", 3000, seed=profile.pretrain_seed(k), max_steps=d.max_problem_steps,
                                          holdout=d.holdout)
        texts += [r["completion"] for r in sft_dataset(records, "</s>", p.flawed_fraction, k, p.flaws)]
    for n, seed in ((d.n_train, 0), (64, 1)):
        texts += [r["answer"] for r in problems.embedded_split("train", n, seed=seed, max_steps=d.max_problem_steps,
                                                               holdout=d.holdout)]
    return texts


def test_no_training_draw_shows_a_held_out_fact_and_the_arithmetic_side_needs_one():
    profile = load_profile("networks-arithmetic")
    d = profile.data
    trained = set().union(*map(_facts, _training_texts(profile)))
    assert trained and not any(_held_out(*f) for f in trained)
    new = problems.embedded_split("test-arithmetic", d.n_eval, seed=0, max_steps=d.max_problem_steps,
                                  holdout=d.holdout)
    wording = problems.embedded_split("test", d.n_eval, seed=0, max_steps=d.max_problem_steps, holdout=d.holdout)
    assert len({r["question"] for r in new}) == len(new) == d.n_eval
    assert all(any(_held_out(*f) for f in _facts(r["answer"])) for r in new)
    assert all(problems.held_out(r["question"]) and not any(_held_out(*f) for f in _facts(r["answer"]))
               for r in wording)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(1, 3))
def test_the_fact_rule_and_the_demonstrations_match_an_independent_reading(seed, steps):
    p = problems.generate_problem(random.Random(seed), steps)
    assert set(problems.facts(p["answer"])) == _facts(p["answer"])
    assert all(problems.held_out_fact(f) == _held_out(*f) for f in _facts(p["answer"]))
    flawed = [problems.flawed_answer(p["answer"], fl) for fl in (["subtraction"], ["multiplication"],
                                                                 ["subtraction", "multiplication"])]
    shown = _facts(p["answer"]).union(*(_facts(f) for f in flawed if f))
    assert problems.demonstrated_facts(p["answer"]) == shown


def test_about_one_fact_in_eight_is_held_out_and_bad_splits_are_refused():
    rng = random.Random(0)
    seen = set().union(*(_facts(problems.generate_problem(rng, 2)["answer"]) for _ in range(20000)))
    share = sum(map(problems.held_out_fact, seen)) / len(seen)
    assert len(seen) > 300 and abs(share - 1 / problems.ARITHMETIC_HELD_OUT_SHARE) < 0.06
    with pytest.raises(ValueError, match="unknown split 'test-arithmetic' under holdout 'questions'"):
        problems.embedded_split("test-arithmetic", 4)
    with pytest.raises(ValueError, match="unknown holdout 'digits'"):
        problems.embedded_split("train", 4, holdout="digits")
    with pytest.raises(ValueError, match="needs the embedded source"):
        type(load_profile("smoke").data).model_validate({"source": "gsm8k", "holdout": "arithmetic"})


def test_holding_out_questions_alone_records_the_settings_it_always_did():
    """The default leaves a profile's cell setting and warm-start setting without the new key (their hashes, and
    so every stored cell and warm start, unchanged); holding out arithmetic changes both."""
    profile = load_profile("networks-rl")
    assert "holdout" not in profile.setting("tiny-dense")["data"]
    assert "holdout" not in profile.warm_start_setting("tiny-dense")
    arithmetic = load_profile("networks-arithmetic")
    assert arithmetic.setting("tiny-dense")["data"]["holdout"] == "arithmetic"
    assert arithmetic.warm_start_setting("tiny-dense")["holdout"] == "arithmetic"


@pytest.mark.slow
def test_a_cell_evaluates_the_held_out_arithmetic_before_and_after_rl(tmp_path):
    """A frozen cell (learning rate 0) of the smoke profile holding out arithmetic: both evaluations score the same
    problems, each needing a held-out fact, with the same answers (gain exactly 0); aggregate writes them apart."""
    from mxfp4.report.aggregate import aggregate, read_csv
    from mxfp4.rl.cell import run_cell
    from mxfp4.rl.pretrain import pretrain_model

    base = load_profile("smoke")
    profile = base.model_copy(update={
        "models": {"tiny-dense": base.models["tiny-dense"]}, "recipes": ["mxfp4"],
        "data": base.data.model_copy(update={"holdout": "arithmetic"}),
        "grpo": base.grpo.model_copy(update={"learning_rate": 0.0})})
    run = Run.of(profile, tmp_path)
    pretrain_model(run, "tiny-dense")
    m = run_cell(run.cell("tiny-dense", "mxfp4", 0))
    assert m["gsm8k_rl_gain_arithmetic"] == 0.0
    assert m["gsm8k_strict_accuracy_arithmetic"] == m["gsm8k_strict_accuracy_before_arithmetic"]
    cell = Layout(tmp_path, "smoke").cell("tiny-dense", "mxfp4", 0)
    docs = {}
    for stage, folder in ARITHMETIC_EVAL_FOLDERS.items():
        rows = [json.loads(line) for f in (cell / folder).glob("samples_*.jsonl")
                for line in f.read_text().splitlines()]
        docs[stage] = sorted({(r["doc_id"], r["doc_hash"]) for r in rows})
        assert all(any(_held_out(*f) for f in _facts(r["target"])) for r in rows)
    assert docs["before"] == docs["after"] and len(docs["after"]) == profile.data.n_eval
    counts = aggregate(Layout(tmp_path, "smoke"), profile=profile)
    items = read_csv(Layout(tmp_path, "smoke").table("items_arithmetic"))
    assert counts["items_arithmetic"] == len(items) == profile.data.n_eval
    assert all(r["strict"] == r["strict_before"] for r in items)
    cells = read_csv(Layout(tmp_path, "smoke").table("cells"))
    assert cells[0]["gsm8k_rl_gain_arithmetic"] == 0.0

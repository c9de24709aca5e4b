"""GSM8K loaders and the embedded generator."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mxfp4 import problems
from mxfp4.config.data_files import default_gsm8k_dir
from mxfp4.config.profiles import load_profile
from mxfp4.config.run import Run
from mxfp4.rl import data

GSM8K = default_gsm8k_dir()
needs_gsm8k = pytest.mark.skipif(GSM8K is None, reason="the real GSM8K files (../shared/data/gsm8k) are not here")


@needs_gsm8k
def test_real_gsm8k_splits_load_from_the_local_folder():
    test = data.load_gsm8k("test", GSM8K)
    train = data.load_gsm8k("train", GSM8K)
    assert len(test) == 1319 and len(train) == 7473
    assert all(data.final_answer(r["answer"]) is not None for r in test)
    assert data.final_answer(test[0]["answer"]) == "18"


def test_malformed_jsonl_line_is_an_error_naming_file_and_line(tmp_path):
    f = tmp_path / "test.jsonl"
    f.write_text('{"question": "a", "answer": "#### 1"}\n{"question": "b", "answer": \n')
    with pytest.raises(ValueError, match=r"test\.jsonl:2: malformed JSON"):
        data.load_gsm8k("test", tmp_path)
    f.write_text('{"question": "a"}\n')
    with pytest.raises(ValueError, match=r"test\.jsonl:1: expected an object with 'question' and 'answer'"):
        data.validate_jsonl(f)
    with pytest.raises(ValueError, match="unknown GSM8K split 'dev'"):
        data.load_gsm8k("dev", tmp_path)


def test_embedded_problems_are_deterministic_graded_and_self_consistent():
    a = problems.embedded_split("train", 50, seed=3, max_steps=3)
    assert a == problems.embedded_split("train", 50, seed=3, max_steps=3)
    assert a != problems.embedded_split("train", 50, seed=4, max_steps=3)
    assert {r["steps"] for r in a} == {1, 2, 3}
    for r in a:
        # the worked answer's last line computes the final answer
        last = r["answer"].splitlines()[-2]
        assert last.endswith(data.final_answer(r["answer"]))
        assert data.is_correct(" " + r["answer"], r["answer"])


def test_correctness_reads_the_final_answer_only():
    assert data.is_correct("x=<<3>>3\n#### 1,234", "#### 1234")
    assert not data.is_correct("the answer is 1234", "#### 1234")
    assert not data.is_correct("#### 12", "#### 1234")


def _keys(records):
    """Normalised question texts, by an independent normalisation (case and all whitespace folded)."""
    return {" ".join(r["question"].casefold().split()) for r in records}


@pytest.mark.parametrize("name", ["embedded", "embedded-large"])
def test_no_held_out_problem_appears_in_any_training_draw(name):
    """Every problem a profile trains on (each warm start's SFT set, GRPO's prompts, the few-shot pool)
    against the held-out problems it evaluates on: no question in common, and the held-out problems
    are distinct."""
    profile = load_profile(name)
    steps = profile.data.max_problem_steps
    test = problems.embedded_split("test", profile.data.n_eval, seed=0, max_steps=steps)
    assert len(_keys(test)) == len(test) == profile.data.n_eval
    trained = [r for k in range(profile.warm_starts)  # warm start k: pretraining seed k
               for r in problems.embedded_split("train", profile.pretrain.n_train, seed=k, max_steps=steps)]
    trained += problems.embedded_split("train", profile.data.n_train, seed=0, max_steps=steps)
    trained += problems.embedded_split("train", 64, seed=1, max_steps=steps)
    assert not _keys(test) & _keys(trained)
    # the pretraining's own check set is drawn from the held-out side as well
    assert not _keys(problems.embedded_split("test", 200, seed=0, max_steps=steps)) & _keys(trained)


@given(st.text(alphabet=st.characters(codec="ascii", categories=["L", "N", "P", "Zs"]), min_size=1, max_size=60))
def test_the_held_out_side_ignores_case_and_spacing(question):
    variant = "  " + question.upper().replace(" ", " \t ") + "\n"
    assert problems.held_out(question) == problems.held_out(variant)


def test_about_one_question_in_eight_is_held_out_and_a_split_that_runs_out_says_so():
    drawn = problems.embedded_split("train", 4000, seed=9, max_steps=2) + problems.embedded_split(
        "test", 500, seed=9, max_steps=2)
    raw = [problems.generate_problem(__import__("random").Random(i), 2)["question"] for i in range(8000)]
    share = sum(problems.held_out(q) for q in raw) / len(raw)
    assert abs(share - 1 / problems.HELD_OUT_SHARE) < 0.015  # 4 standard errors
    assert all(problems.held_out(r["question"]) == (i >= 4000) for i, r in enumerate(drawn))
    with pytest.raises(ValueError, match="ran out of distinct 1-step problems"):
        problems.embedded_split("test", 20000, seed=0, max_steps=1)


def test_problem_types_follow_the_planted_flaw():
    batch = problems.embedded_split("train", 300, seed=2, max_steps=3)
    for r in batch:
        subtracts = any("-" in line.split("=")[0] for line in r["answer"].splitlines()[:-1])
        assert problems.problem_type(r["answer"]) == ("flaw" if subtracts else "rest")
    assert problems.problem_type("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72") is None


@needs_gsm8k
def test_the_real_model_profile_trains_on_generated_problems_and_measures_on_gsm8k_test(tmp_path):
    """real-small: GRPO and the gradient batches draw generated problems; the rollout and entropy pathways'
    prompts are GSM8K test questions (pathways.prompts_from), none of which the training problems hold."""
    from mxfp4.analysis.pathways.matrix import seed_problems

    profile = load_profile("real-small")
    assert profile.pathways.prompts_from == "gsm8k-test"
    train, _ = data.cell_data(Run.of(profile, tmp_path))
    test = data.load_gsm8k("test", GSM8K)
    grad, roll = seed_problems(train, profile.pathways, 0, test)
    assert sorted(r["question"] for r in grad) == sorted(r["question"] for r in train)
    assert len(roll) == profile.pathways.prompts and _keys(roll) <= _keys(test)
    assert not _keys(test) & _keys(train)
    assert seed_problems(train, profile.pathways, 1, test)[1] != roll  # each seed its own questions

"""GSM8K loaders and the embedded generator."""

import pytest

from mxfp4.config.data_files import default_gsm8k_dir
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
    a = data.embedded_split("train", 50, seed=3, max_steps=3)
    assert a == data.embedded_split("train", 50, seed=3, max_steps=3)
    assert a != data.embedded_split("train", 50, seed=4, max_steps=3)
    assert {r["steps"] for r in a} == {1, 2, 3}
    test = data.embedded_split("test", 50, seed=3)
    assert not {r["question"] for r in test} & {r["question"] for r in data.embedded_split("train", 50, seed=3)}
    for r in a:
        # the worked answer's last line computes the final answer
        last = r["answer"].splitlines()[-2]
        assert last.endswith(data.final_answer(r["answer"]))
        assert data.is_correct(" " + r["answer"], r["answer"])


def test_correctness_reads_the_final_answer_only():
    assert data.is_correct("x=<<3>>3\n#### 1,234", "#### 1234")
    assert not data.is_correct("the answer is 1234", "#### 1234")
    assert not data.is_correct("#### 12", "#### 1234")

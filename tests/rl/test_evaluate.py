"""GSM8K evaluation through lm-eval: an oracle scores 1.0, a wrong model 0.0, on the real test split."""

import pytest
from lm_eval.api.model import LM

from mxfp4.config.data_files import default_gsm8k_dir
from mxfp4.rl.data import load_gsm8k
from mxfp4.rl.evaluate import evaluate_gsm8k

GSM8K = default_gsm8k_dir()
needs_gsm8k = pytest.mark.skipif(GSM8K is None, reason="the real GSM8K files (../shared/data/gsm8k) are not here")


class ScriptedLM(LM):
    """Answers each prompt from a table: the right worked answer, or a wrong one."""

    def __init__(self, answers: dict[str, str], wrong: bool):
        super().__init__()
        self.answers, self.wrong = answers, wrong

    def generate_until(self, requests):
        out = []
        for req in requests:
            question = req.args[0].rsplit("Question: ", 1)[-1].rsplit("\nAnswer:", 1)[0]
            answer = self.answers[question]
            out.append(" I think it is 7.\n#### -123456789" if self.wrong else " " + answer)
        return out

    def loglikelihood(self, requests):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests):
        raise NotImplementedError


@needs_gsm8k
@pytest.mark.parametrize("wrong,expected", [(False, 1.0), (True, 0.0)])
def test_scores_on_the_real_test_split(wrong, expected):
    test = load_gsm8k("test", GSM8K)
    assert len(test) == 1319
    lm = ScriptedLM({r["question"]: r["answer"] for r in test}, wrong)
    r = evaluate_gsm8k(lm, GSM8K, num_fewshot=0)
    assert r["n"] == 1319
    assert r["strict_match"] == expected
    assert r["flexible_extract"] == expected

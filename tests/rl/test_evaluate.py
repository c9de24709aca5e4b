"""GSM8K evaluation through lm-eval: an oracle scores 1.0, a wrong model 0.0, on the real test split."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lm_eval.api.model import LM
from lm_eval.api.task import ConfigurableTask
from lm_eval.utils import apply_template, handle_non_serializable

from mxfp4.config.data_files import default_gsm8k_dir
from mxfp4.rl.data import CHAT_PROMPT, load_gsm8k
from mxfp4.rl.evaluate import CompiledTemplate, compiled_templates, evaluate_gsm8k, task_config

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


@settings(max_examples=60, deadline=None)
@given(question=st.text(max_size=40), answer=st.text(max_size=40))
def test_a_compiled_template_renders_as_lm_eval_does(question, answer):
    """lm-eval renders a string template with ``apply_template``; the compiled one must give the same text."""
    doc = {"question": question, "answer": answer}
    for source in ("Question: {{question}}\nAnswer:", "{{answer}}", CHAT_PROMPT.replace("{question}", "{{question}}")):
        assert CompiledTemplate(source)(doc) == apply_template(source, doc)
        assert str(CompiledTemplate(source)) == source


@pytest.mark.parametrize("chat", [False, True])
def test_compiled_templates_build_the_same_task(tmp_path, chat):
    """A task built from the compiled config asks the same prompts with the same targets (few-shot context
    included) and writes the same config into its results file as one built from lm-eval's string templates."""
    rows = [{"question": f"What is {i} plus {i + 1}?", "answer": f"{i} + {i + 1} = {2 * i + 1}\n#### {2 * i + 1}"}
            for i in range(12)]
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plain = task_config(tmp_path, num_fewshot=2, chat=chat)
    compiled = compiled_templates(plain)
    assert isinstance(compiled["doc_to_text"], CompiledTemplate) and isinstance(plain["doc_to_text"], str)
    tasks = [ConfigurableTask(config=cfg) for cfg in (plain, compiled)]
    seen = []
    for task in tasks:
        task.set_fewshot_seed(seed=0)  # each task's few-shot draws from its own stream, seeded alike
        seen.append([(task.doc_to_text(doc), task.doc_to_target(doc), task.fewshot_context(doc, num_fewshot=2))
                     for doc in rows[:5]])
    assert seen[0] == seen[1]
    assert "Question: What is 0 plus 1?" in seen[0][0][0] if not chat else "What is 0 plus 1?" in seen[0][0][0]
    written = [json.dumps(task.dump_config(), default=handle_non_serializable) for task in tasks]  # as lm-eval writes
    assert written[0] == written[1]

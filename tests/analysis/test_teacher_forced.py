"""Teacher-forced measures against a token-by-token computation on each unpadded sequence."""

import pytest
import torch

from mxfp4.analysis.teacher_forced import teacher_forced, token_pairs
from mxfp4.config.recipes import Recipe
from mxfp4.nn import patch_model, unpatch_model
from mxfp4.rl.models import build_tiny

PROMPTS = ["Question: Tom has 3 pens.\nAnswer:", "Question: Ana has 12 eggs. Ana gives away 5 eggs.\nAnswer:"]
COMPLETIONS = [" 3+0=<<3+0=3>>3\n#### 3", " 12-5=<<12-5=7>>7\n#### 7"]


def _one_by_one(model, tokenizer, prompt, completion, temperature):
    """(log-likelihood, mean entropy) of one completion and its EOS, each token's distribution from its
    own prefix."""
    p = tokenizer(prompt)["input_ids"]
    c = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    loglik, entropies = 0.0, []
    with torch.no_grad():
        for j, token in enumerate(c):
            logits = model(input_ids=torch.tensor([p + c[:j]])).logits[0, -1].double() / temperature
            logp = torch.log_softmax(logits, -1)
            loglik += float(logp[token])
            entropies.append(float(-(logp.exp() * logp).sum()))
    return loglik, sum(entropies) / len(entropies)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_unquantized_arm_scores_the_models_own_distribution_on_the_same_tokens(temperature):
    model, tok = build_tiny("tiny-dense", seed=0)
    got = teacher_forced(model, *token_pairs(tok, PROMPTS, COMPLETIONS), temperature=temperature)
    for i, (p, c) in enumerate(zip(PROMPTS, COMPLETIONS)):
        loglik, entropy = _one_by_one(model, tok, p, c, temperature)
        assert got["loglik"][i] == pytest.approx(loglik, rel=1e-5, abs=1e-4)
        assert got["entropy"][i] == pytest.approx(entropy, rel=1e-5)


def test_kl_is_zero_against_itself_and_positive_under_mxfp4():
    model, tok = build_tiny("tiny-dense", seed=0)
    pairs = token_pairs(tok, PROMPTS, COMPLETIONS)
    ref = teacher_forced(model, *pairs)
    assert teacher_forced(model, *pairs, reference=ref["logp"])["kl"] == [0.0, 0.0]
    patch_model(model, Recipe.named("mxfp4").quantizer())
    try:
        arm = teacher_forced(model, *pairs, reference=ref["logp"])
    finally:
        unpatch_model(model)
    assert all(k > 0 for k in arm["kl"]) and arm["loglik"] != ref["loglik"]
    with pytest.raises(ValueError, match="score the same prompts and completions"):
        teacher_forced(model, *token_pairs(tok, PROMPTS[:1], COMPLETIONS[:1]), reference=ref["logp"])
    with pytest.raises(ValueError, match="one completion per prompt"):
        token_pairs(tok, PROMPTS, COMPLETIONS[:1])
    with pytest.raises(ValueError, match="empty prompt or completion"):
        teacher_forced(model, pairs[0], [pairs[1][0], []])

"""Teacher-forced measures of a policy on fixed completions: the paired, low-variance measures of the
rollout and entropy pathways. Every arm scores the same tokens (completions the unquantized policy
sampled once, or a correct worked solution), so arms differ only in their logits, not in what they
happened to sample.

Per prompt: the log-likelihood of its completion (the sum of the completion tokens' log-probabilities),
the mean token entropy of the policy's next-token distribution along it, and, against a reference arm's
distributions on the same positions, the mean token KL(reference || arm)."""

from __future__ import annotations

import torch


def token_pairs(tokenizer, prompts: list[str], completions: list[str], eos: bool = True) -> tuple[list, list]:
    """(prompt token ids, completion token ids) of text pairs: each side tokenized on its own (the
    completion without special tokens, then the EOS token where ``eos``: a worked solution is scored
    with its end), so exactly the completion's tokens are scored."""
    if len(prompts) != len(completions) or not prompts:
        raise ValueError(f"teacher forcing takes one completion per prompt, got {len(prompts)} prompts and "
                         f"{len(completions)} completions")
    end = [tokenizer.eos_token_id] if eos and tokenizer.eos_token_id is not None else []
    return ([tokenizer(p)["input_ids"] for p in prompts],
            [tokenizer(c, add_special_tokens=False)["input_ids"] + end for c in completions])


def completion_batch(prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int = 0) -> dict:
    """Prompt and completion token ids side by side, right-padded: ``input_ids``, ``attention_mask``,
    and per row the completion's first position and length (``starts``, ``lengths``)."""
    if len(prompt_ids) != len(completion_ids) or not prompt_ids:
        raise ValueError(f"teacher forcing takes one completion per prompt, got {len(prompt_ids)} prompts and "
                         f"{len(completion_ids)} completions")
    if any(not c for c in completion_ids) or any(not p for p in prompt_ids):
        raise ValueError("an empty prompt or completion cannot be scored")
    rows = [list(p) + list(c) for p, c in zip(prompt_ids, completion_ids)]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return {"input_ids": ids, "attention_mask": mask, "starts": [len(p) for p in prompt_ids],
            "lengths": [len(c) for c in completion_ids]}


def completion_logprobs(model, batch: dict, temperature: float = 1.0) -> tuple[torch.Tensor, ...]:
    """(log-probabilities [B, T, V] of the next token at each completion position, the completion's
    tokens [B, T], their mask [B, T]) in float32, T the longest completion; no gradient."""
    model.eval()
    with torch.no_grad():
        return _completion_logprobs(model, batch, temperature)


def _completion_logprobs(model, batch: dict, temperature: float) -> tuple[torch.Tensor, ...]:
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    b, t = len(batch["starts"]), max(batch["lengths"])
    index = torch.zeros(b, t, dtype=torch.long)
    mask = torch.zeros(b, t, dtype=torch.bool)
    for i, (s, n) in enumerate(zip(batch["starts"], batch["lengths"])):
        index[i, :n] = torch.arange(s - 1, s - 1 + n)  # the logits at position j predict token j + 1
        mask[i, :n] = True
    picked = logits.gather(1, index.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
    targets = batch["input_ids"].gather(1, (index + 1).clamp(max=batch["input_ids"].shape[1] - 1)) * mask
    return torch.log_softmax(picked / temperature, -1), targets, mask


def completion_nll(model, prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int = 0
                   ) -> torch.Tensor:
    """The mean negative log-likelihood per completion token, with its graph (a supervised loss on fixed
    text: what a batch of worked solutions puts through the backward GEMMs); the model's mode is kept."""
    logp, targets, mask = _completion_logprobs(model, completion_batch(prompt_ids, completion_ids, pad_id), 1.0)
    return -(logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1) * mask).sum() / mask.sum()


def teacher_forced(model, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                   reference: torch.Tensor | None = None, temperature: float = 1.0, pad_id: int = 0) -> dict:
    """Per row: ``loglik`` (sum of the completion tokens' log-probabilities), ``entropy`` (mean token
    entropy along the completion) and, given a ``reference`` arm's ``logp`` on the same rows, ``kl``
    (mean token KL(reference || this arm)); ``logp`` itself, to serve as a reference.

    Args:
        model: the policy, patched as the arm to measure (or not: the unquantized reference).
        prompt_ids, completion_ids: token ids per row (``token_pairs`` makes them from text), scored as given.
        reference: another arm's ``logp`` from this function on the same rows.
        temperature: the sampling temperature whose distribution is measured.
        pad_id: the id right padding uses (masked out).
    """
    logp, targets, mask = completion_logprobs(model, completion_batch(prompt_ids, completion_ids, pad_id), temperature)
    count = mask.sum(1).double()
    token_logp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1).double() * mask
    entropy = -(logp.exp() * logp).sum(-1).double() * mask
    out = {"loglik": token_logp.sum(1).tolist(), "entropy": (entropy.sum(1) / count).tolist(), "logp": logp}
    if reference is not None:
        if reference.shape != logp.shape:
            raise ValueError(f"the reference log-probabilities have shape {tuple(reference.shape)}, this arm's "
                             f"{tuple(logp.shape)}: score the same prompts and completions")
        kl = (reference.exp() * (reference - logp)).sum(-1).double() * mask
        out["kl"] = (kl.sum(1) / count).tolist()
    return out

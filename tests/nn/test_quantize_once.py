"""Each operand quantized once where its values allow: an input several layers read (q/k/v, gate/up and their
weight-gradient GEMMs), the input gradient's weight only when a backward runs, a plain weight's two axes in one
read. Every saving is checked against the path without it, bit for bit, and counted."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxfp4.config.recipes import Recipe
from mxfp4.nn import InputMemo, patch_model, patch_state, patched_modules, use_shared_inputs
from mxfp4.numerics.quantizer import Quantizer
from mxfp4.rl.models import build_tiny

REPEATABLE = ["mxfp4", "mxfp4+fallback", "mxfp4+macro", "mxfp4+all"]


def counting(monkeypatch) -> list:
    """Every ``Quantizer.__call__`` from here on, as (role, gemm, layer) of its operand."""
    seen = []
    real = Quantizer.__call__

    def counted(self, x, axis, *args, operand=None, **kwargs):
        seen.append((operand.role, operand.gemm, operand.layer) if operand is not None else None)
        return real(self, x, axis, *args, operand=operand, **kwargs)

    monkeypatch.setattr(Quantizer, "__call__", counted)
    return seen


def train_step(arch: str, recipe: str, checkpointing: bool = False, cache_weights: bool = True):
    """One forward and backward of a tiny model patched with ``recipe``: (logits, every gradient, the
    corrections' state, the quantizer)."""
    model, tok = build_tiny(arch, seed=0)
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        model.train()
    quantizer = Recipe.named(recipe).quantizer()
    patch_model(model, quantizer, cache_weights=cache_weights)
    batch = tok(["Q: 12+7=? A: 19 #### 19", "Tom has 3 apples and buys 4."], return_tensors="pt", padding=True)
    out = model(**batch, labels=batch["input_ids"])
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), grads, [c.state_dict() for c in quantizer.corrections], model


def same(a, b) -> bool:
    logits_a, grads_a, state_a, _ = a
    logits_b, grads_b, state_b, _ = b
    return (torch.equal(logits_a, logits_b) and grads_a.keys() == grads_b.keys()
            and all(torch.equal(grads_a[k], grads_b[k]) for k in grads_a) and state_a == state_b)


@pytest.mark.parametrize("arch", ["tiny-dense", "tiny-moe"])
@pytest.mark.parametrize("recipe", [*REPEATABLE, "mxfp4+rht-sr"])
def test_an_input_several_layers_read_is_quantized_once_bit_for_bit(arch, recipe, monkeypatch):
    """q_proj, k_proj and v_proj (and the dense MLP's gate_proj and up_proj) read one input: it is quantized once
    for the forward and once for their weight gradients, with the same logits, gradients and fallback counts as
    each layer quantizing its own copy; a quantizer with a random stream or a rotation (rht-sr) is never shared."""
    seen = counting(monkeypatch)
    shared = train_step(arch, recipe)
    shared_calls = list(seen)
    seen.clear()
    with use_shared_inputs(False):
        alone = train_step(arch, recipe)
    assert same(shared, alone)
    layers = shared[3].config.num_hidden_layers
    readers = {"tiny-dense": 3, "tiny-moe": 2}[arch]  # calls saved a layer: q/k/v -> 1, gate/up -> 1 (dense MLP)
    activations = [s for s in seen if s[0] == "activation"]
    saved = len(activations) - len([s for s in shared_calls if s[0] == "activation"])
    assert saved == (2 * readers * layers if patch_state(shared[3]).quantizer.repeatable else 0)
    assert len([s for s in seen if s[0] != "activation"]) == len([s for s in shared_calls if s[0] != "activation"])


def test_recomputation_under_checkpointing_shares_inputs_and_equals_the_unshared_step():
    """Under gradient checkpointing (the forward run again inside the backward) the shared quantizations give the
    same gradients as the unshared ones."""
    shared = train_step("tiny-dense", "mxfp4+all", checkpointing=True)
    with use_shared_inputs(False):
        alone = train_step("tiny-dense", "mxfp4+all", checkpointing=True)
    assert same(shared, alone)


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 6), cols=st.sampled_from([32, 48, 64]), seed=st.integers(0, 2**16),
       ops=st.lists(st.tuples(st.sampled_from(["full", "head", "tail", "t"]), st.sampled_from([-1, 0]),
                              st.booleans(), st.booleans()), min_size=1, max_size=8),
       recipe=st.sampled_from(REPEATABLE))
def test_input_memo_returns_what_a_fresh_quantization_returns(rows, cols, seed, ops, recipe):
    """A sequence of quantizations through one ``InputMemo`` of views of one tensor (whole, leading and trailing
    rows, transposed), with the tensor or a returned result changed in place between them: every result equals a
    fresh quantization of the view's values now (a second quantizer of the same recipe, no memo)."""
    base = torch.randn(rows * 2, cols, generator=torch.Generator().manual_seed(seed))
    views = {"full": lambda: base, "head": lambda: base[:rows], "tail": lambda: base[rows:], "t": lambda: base.T}
    memo, quantizer, fresh = InputMemo(), Recipe.named(recipe).quantizer(), Recipe.named(recipe).quantizer()
    for view, axis, mutate_input, mutate_result in ops:
        if mutate_input:
            base.mul_(1.5)
        x = views[view]()
        out = memo.quantize(quantizer, x, axis, operand=None)
        assert torch.equal(out, fresh(x.clone(), axis))
        if mutate_result:
            out.add_(1.0)
    assert [c.state_dict() for c in quantizer.corrections] == [c.state_dict() for c in fresh.corrections]


@pytest.mark.parametrize("arch", ["tiny-dense", "tiny-moe"])
def test_the_input_gradients_weight_is_quantized_by_the_backward_alone(arch, monkeypatch):
    """Without a weight cache (a 3B model's layers, the 30B model's experts) and with the forward recomputed
    (non-reentrant checkpointing): each weight (each expert stack) is quantized along N once, by the backward; a
    forward under autograd that is never differentiated quantizes none along N; the gradients equal those of the
    cached model bit for bit."""
    seen = counting(monkeypatch)
    lazy = train_step(arch, "mxfp4", checkpointing=True, cache_weights=False)
    model = lazy[3]
    weights = sum(1 for _, m, _ in patched_modules(model) for p in m.parameters(recurse=False) if p.dim() >= 2)
    along_n = [s for s in seen if s[:2] == ("weight", "input_grad")]
    assert len(along_n) == weights
    seen.clear()
    cached = train_step(arch, "mxfp4", checkpointing=True, cache_weights=True)
    assert same(lazy, cached)
    seen.clear()
    ids = torch.tensor([[1, 2, 3]])
    model.zero_grad(set_to_none=True)
    model(input_ids=ids)  # autograd on, no backward
    assert not [s for s in seen if s[:2] == ("weight", "input_grad")]


@pytest.mark.parametrize("arch", ["tiny-dense", "tiny-moe"])
def test_the_memo_keeps_no_input_nor_its_graph_alive(arch):
    """A forward under autograd that is never differentiated (a scoring pass): once the caller drops its output,
    no activation of it survives in the patched model (a kept input would keep the whole graph behind it: a full
    forward's saved tensors, per model, until the next forward)."""
    import gc
    import weakref

    model, tok = build_tiny(arch, seed=0)
    patch_model(model, Recipe.named("mxfp4").quantizer())
    alive = []
    hooks = [m.register_forward_hook(lambda m, args, out: alive.append(weakref.ref(args[0])))
             for _, m, _ in patched_modules(model)]
    out = model(**tok(["Q: 12+7=? A: 19 #### 19"], return_tensors="pt"))
    assert any(r() is not None for r in alive)  # inputs the graph saved live while the output holds it
    del out
    gc.collect()
    assert [r for r in alive if r() is not None] == []
    for h in hooks:
        h.remove()

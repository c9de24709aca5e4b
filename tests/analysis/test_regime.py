"""The regime statistics of GEMM operands (mxfp4.analysis.regime), the heavy-tail knob (outlier channels) and
the warm start's flawed demonstrations, each against an independent computation."""

import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxfp4.analysis.regime import observe, operand_stats, regime_rows
from mxfp4.analysis.weight_components import regime_stats
from mxfp4.config.data_files import default_gsm8k_dir
from mxfp4.layout import Layout
from mxfp4.rl.models import build_tiny
from mxfp4.rl.outlier_channels import add_outlier_channels

REPO = Path(__file__).resolve().parents[2]


def _loss(model, ids):
    return lambda m: m(input_ids=ids).logits.float().pow(2).mean()


def _hooked_operands(model, ids, module_name):
    """The input and the output gradient of one module, read by PyTorch's own hooks on the unpatched model."""
    module = dict(model.named_modules())[module_name]
    seen = {}

    def forward_hook(mod, inp, out):
        seen.setdefault("x", inp[0].detach().clone())
        out.register_hook(lambda g: seen.setdefault("dy", g.detach().clone()))

    hook = module.register_forward_hook(forward_hook)
    _loss(model, ids)(model).backward()
    hook.remove()
    model.zero_grad()
    return seen["x"], seen["dy"]


@pytest.mark.parametrize("arch", ["tiny-dense", "tiny-moe"])
def test_the_observed_operands_are_the_ones_the_unpatched_model_computes(arch):
    """The first attention projection's input (bit for bit: nothing patched runs before it) and output
    gradient (to float32 round-off: the patched layers after it compute the same products in another
    order), against forward and backward hooks on the same model unpatched; the model computes exactly
    what it computed before it was observed."""
    model, _ = build_tiny(arch, seed=3)
    ids = torch.randint(4, 80, (3, 21), generator=torch.Generator().manual_seed(0))
    before = model(input_ids=ids).logits.detach()
    x, dy = _hooked_operands(model, ids, "model.layers.0.self_attn.q_proj")
    collector, layers = observe(model, _loss(model, ids))
    name = "model.layers.0.self_attn.q_proj"
    assert torch.equal(collector.operand(name, "activation", x.shape[-1]), x.reshape(-1, x.shape[-1]))
    torch.testing.assert_close(collector.operand(name, "grad", dy.shape[-1]), dy.reshape(-1, dy.shape[-1]),
                               rtol=1e-4, atol=1e-9)
    assert torch.equal(model(input_ids=ids).logits, before)  # unpatched again
    if arch == "tiny-moe":  # the experts' gate_up reads every token's hidden state, once, before dispatch
        experts = "model.layers.1.mlp.experts"
        assert any(n == experts for n, _ in layers)
        xe, _ = _hooked_operands(model, ids, experts)
        assert torch.equal(collector.operand(experts, "activation", xe.shape[-1]), xe.reshape(-1, xe.shape[-1]))


def test_every_gemm_weight_has_its_three_operands():
    model, _ = build_tiny("tiny-moe", seed=0)
    ids = torch.randint(4, 80, (2, 17), generator=torch.Generator().manual_seed(1))
    rows = regime_rows(model, "tiny-moe", _loss(model, ids))
    layers = {r["layer"] for r in rows}
    assert "model.layers.0.mlp.experts.gate_up_proj" in layers and "model.layers.0.mlp.experts.down_proj" in layers
    for layer in layers:
        assert sorted(r["operand"] for r in rows if r["layer"] == layer) == ["activation", "grad", "weight"]
    down = next(r for r in rows if r["layer"].endswith("experts.down_proj") and r["operand"] == "activation")
    assert down["shape"].endswith("x96")  # the intermediate width I, not the hidden width


@settings(max_examples=20, deadline=None)
@given(zero_rows=st.integers(0, 7), seed=st.integers(0, 2**16))
def test_zero_rows_are_dropped_before_the_statistics(zero_rows, seed):
    """Rows of exact zeros (padding, positions outside the loss) change no statistic: they are counted
    and dropped, so the operand with them reads as the operand without them."""
    from mxfp4.config.recipes import Recipe

    q = Recipe.named("mxfp4").quantizer()
    t = torch.from_numpy(np.random.default_rng(seed).standard_t(3, (9, 64)).astype(np.float32))
    padded = torch.cat([torch.zeros(zero_rows, 64), t, torch.zeros(1, 64)])
    with_pad, without = operand_stats(padded, q), operand_stats(t, q)
    assert with_pad.pop("zero_rows") == zero_rows + 1 and without.pop("zero_rows") == 0
    assert with_pad == without
    assert without["excess_kurtosis"] == regime_stats(t)["excess_kurtosis"]


@pytest.mark.parametrize("arch", ["tiny-dense", "tiny-moe"])
def test_outlier_channels_leave_the_function_bit_for_bit_and_put_outliers_in_every_layer(arch):
    """Power-of-two gains moved between each norm and its readers: the logits are equal bit for bit, and
    the chosen channels of every attention input are the scale times larger than before."""
    model, _ = build_tiny(arch, seed=1, layers=3)
    ids = torch.randint(4, 80, (2, 19), generator=torch.Generator().manual_seed(2))
    logits = model(input_ids=ids).logits
    x_before = [_hooked_operands(model, ids, f"model.layers.{i}.self_attn.q_proj")[0] for i in range(3)]
    channels = add_outlier_channels(model, 3, 64.0, seed=5)
    assert len(channels) == 3 and torch.equal(model(input_ids=ids).logits, logits)
    for i in range(3):
        x_after = _hooked_operands(model, ids, f"model.layers.{i}.self_attn.q_proj")[0]
        assert torch.equal(x_after[..., channels], x_before[i][..., channels] * 64)
        rest = [c for c in range(x_after.shape[-1]) if c not in channels]
        assert torch.equal(x_after[..., rest], x_before[i][..., rest])


@settings(max_examples=12, deadline=None)
@given(arch=st.sampled_from(["tiny-dense", "tiny-moe"]), channels=st.integers(0, 8),
       factor=st.sampled_from([1, 4, 8, 16, 32, 1024]), seed=st.integers(0, 2**16))
def test_every_outlier_dose_leaves_the_logits_as_they_were(arch, channels, factor, seed):
    """Each dose of the dose-response (any channel count, any power-of-two factor) keeps the model's logits
    bit for bit, so every dose measures the same policy."""
    model, _ = build_tiny(arch, seed=seed % 7)
    ids = torch.randint(4, 80, (2, 13), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        before = model(input_ids=ids).logits
        assert len(add_outlier_channels(model, channels, float(factor), seed=seed)) == channels
        assert torch.equal(model(input_ids=ids).logits, before)


def test_outlier_channels_refuse_an_inexact_scale_and_an_unknown_reader():
    model, _ = build_tiny("tiny-dense", seed=0)
    with pytest.raises(ValueError, match="not a power of two"):
        add_outlier_channels(model, 2, 30.0)
    model.model.layers[0].mlp.register_parameter("extra", torch.nn.Parameter(torch.zeros(4, 128)))
    with pytest.raises(ValueError, match=r"parameters \['mlp.extra'\] of the hidden width"):
        add_outlier_channels(model, 2, 32.0)


_STEP = re.compile(r"^(\d+)([+*])(\d+)=<<(\d+)([+*])(\d+)=(\d+)>>(\d+)$")


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**20), steps=st.integers(1, 3))
def test_a_flawed_answer_adds_where_the_problem_subtracts_and_is_consistent_arithmetic(seed, steps):
    """Recomputed here from the question's sentences: every 'gives away k' becomes '+k', every other step is
    kept, each line's arithmetic is right for what it writes, and the final answer is then wrong."""
    import random

    from mxfp4.problems import flawed_answer, generate_problem
    from mxfp4.rl.data import final_answer

    p = generate_problem(random.Random(seed), steps)
    got = flawed_answer(p["answer"])
    if "gives away" not in p["question"]:
        assert got is None
        return
    total = int(re.search(r"has (\d+) ", p["question"]).group(1))
    for sentence, line in zip(re.findall(r"(gets \d+ more|gives away \d+|gets \d+ times)", p["question"]),
                              got.split("\n")[:-1]):
        k = int(re.search(r"\d+", sentence).group())
        expected = total * k if "times" in sentence else total + k
        m = _STEP.match(line)
        assert m and int(m.group(1)) == total and int(m.group(3)) == k and int(m.group(8)) == expected
        total = expected
    assert final_answer(got) == str(total) != final_answer(p["answer"])


def test_the_flawed_fraction_flaws_that_share_of_the_subtraction_problems_only():
    from mxfp4.problems import embedded_split
    from mxfp4.rl.pretrain import sft_dataset

    records = embedded_split("train", 400, seed=0, max_steps=2)
    subtracting = ["gives away" in r["question"] for r in records]
    for fraction in (0.0, 0.6, 1.0):
        ds = sft_dataset(records, "<eos>", flawed_fraction=fraction, seed=0)
        flawed = [c != " " + r["answer"] + "<eos>" for c, r in zip(ds["completion"], records)]
        assert not any(f and not s for f, s in zip(flawed, subtracting))
        share = sum(flawed) / sum(subtracting)
        assert share == pytest.approx(fraction, abs=0.08)
    with pytest.raises(ValueError, match="outside"):
        sft_dataset(records, "<eos>", flawed_fraction=1.5)


def test_a_stored_profiles_rows_read_back_into_its_stored_table():
    """regime_beside reads another profile's stored rows (not measured again): their summary is the stored
    regime.md table of that run, line for line, each model named with its profile."""
    from mxfp4.analysis.regime import stored_rows, summary_markdown

    rows = stored_rows(Layout(REPO / "results", "embedded"))
    assert {r["model"] for r in rows} == {"tiny-dense (embedded, stored)", "tiny-moe (embedded, stored)"}
    table = [line.replace(" (embedded, stored)", "") for line in summary_markdown(rows).splitlines()
             if line.startswith("| tiny-")]
    stored = (REPO / "results" / "baselines" / "embedded" / "regime.md").read_text().splitlines()
    assert table and table == [line for line in stored if line.startswith("| tiny-")]
    with pytest.raises(ValueError, match="regime_beside names 'smoke', whose stored baselines hold no"):
        stored_rows(Layout(REPO / "results", "smoke"))


def _labels_loss(model, prompt_ids, completion_ids):
    """transformers' own causal-LM loss: the prompt tokens and padding labelled -100 (ignored)."""
    width = max(len(p) + len(c) for p, c in zip(prompt_ids, completion_ids))
    ids = torch.zeros(len(prompt_ids), width, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        ids[i, :len(p) + len(c)] = torch.tensor(p + c)
        labels[i, len(p):len(p) + len(c)] = torch.tensor(c)
        mask[i, :len(p) + len(c)] = 1
    return model(input_ids=ids, attention_mask=mask, labels=labels).loss


@settings(max_examples=10, deadline=None)
@given(lengths=st.lists(st.tuples(st.integers(1, 9), st.integers(1, 9)), min_size=1, max_size=4),
       seed=st.integers(0, 2**16))
def test_the_teacher_forced_loss_is_transformers_causal_lm_loss(lengths, seed):
    """completion_nll (the regime's loss on worked solutions) equals the loss transformers computes from
    labels that ignore the prompt and the padding, and carries a finite gradient to every projection."""
    from mxfp4.analysis.teacher_forced import completion_nll

    model, _ = build_tiny("tiny-dense", seed=1)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(4, 80, (p,), generator=g).tolist() for p, _ in lengths]
    completions = [torch.randint(4, 80, (c,), generator=g).tolist() for _, c in lengths]
    ours = completion_nll(model, prompts, completions)
    torch.testing.assert_close(ours, _labels_loss(model, prompts, completions), rtol=1e-5, atol=1e-6)
    ours.backward()
    grads = [p.grad for n, p in model.named_parameters() if "proj" in n]
    assert all(g is not None and g.isfinite().all() for g in grads) and sum(g.abs().sum() for g in grads) > 0


@pytest.mark.skipif(default_gsm8k_dir() is None, reason="the real GSM8K files (../shared/data/gsm8k) are not here")
def test_a_gsm8k_regime_batch_is_real_test_text_under_its_solutions_loss():
    """regime_batch gsm8k-test: as many GSM8K test questions as a GRPO batch has sequences, drawn with the
    seed, scored on their reference solutions; every row is labelled with its batch, and the summary
    table names it."""
    from mxfp4.analysis.regime import BATCHES, gsm8k_loss, summary_markdown
    from mxfp4.analysis.teacher_forced import token_pairs
    from mxfp4.config.profiles import load_profile
    from mxfp4.config.run import Run
    from mxfp4.rl import data

    profile = load_profile("smoke").model_copy(update={"regime_batch": "gsm8k-test"})
    model_name = next(iter(profile.models))
    model, tokenizer = build_tiny("tiny-dense", seed=0)
    loss = gsm8k_loss(Run.of(profile).start(model_name, 5), tokenizer)
    test = data.load_gsm8k("test", default_gsm8k_dir())
    n = profile.grpo.prompts_per_step * profile.grpo.num_generations
    drawn = random.Random(5).sample(test, n)  # drawn here as the seed draws them, scored by transformers
    ids = token_pairs(tokenizer, [data.prompt(r["question"]) for r in drawn], [r["answer"] for r in drawn])
    torch.testing.assert_close(loss(model), _labels_loss(model, *ids), rtol=1e-5, atol=1e-6)
    rows = regime_rows(model, model_name, loss, rows=256, batch="gsm8k-test")
    assert {r["batch"] for r in rows} == {"gsm8k-test"}
    assert BATCHES["gsm8k-test"] in summary_markdown(rows)

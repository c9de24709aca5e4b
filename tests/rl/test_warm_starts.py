"""Several warm starts per model (each its own pretraining seed, each seed's cells starting from one) and a
second planted flaw (multiplication demonstrated as addition), checked against the question text and the
saved folders."""

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mxfp4 import problems
from mxfp4.config.profiles import PretrainSettings, load_profile, warm_start_hash
from mxfp4.config.run import Run
from mxfp4.rl.data import final_answer

WORDS = {"subtraction": "gives away", "multiplication": "times"}
FLAW_SETS = [("subtraction",), ("multiplication",), ("subtraction", "multiplication")]


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**20), steps=st.integers(1, 3), flaws=st.sampled_from(FLAW_SETS))
def test_a_flawed_answer_adds_exactly_where_a_planted_flaw_operates(seed, steps, flaws):
    """Recomputed from the question's sentences: a step of a planted flaw's operation becomes '+k', every other
    step keeps its operation, and the problem's type names the flaws it has a step of."""
    p = problems.generate_problem(random.Random(seed), steps)
    q = p["question"]
    present = [f for f in flaws if WORDS[f] in q]
    expected_type = "rest" if not present else "flaw" if len(flaws) == 1 else "flaw:" + "+".join(present)
    assert problems.problem_type(p["answer"], flaws) == expected_type
    got = problems.flawed_answer(p["answer"], flaws)
    if not present:
        assert got is None
        return
    total = int(re.search(r"has (\d+) ", q).group(1))
    sentences = re.findall(r"(gets \d+ more|gives away \d+|gets \d+ times)", q)
    lines = got.split("\n")[:-1]
    assert len(sentences) == len(lines) == steps
    for sentence, line in zip(sentences, lines):
        k = int(re.search(r"\d+", sentence).group())
        flawed = any(WORDS[f] in sentence for f in flaws)
        op = "+" if flawed or "more" in sentence else "-" if "gives away" in sentence else "*"
        result = {"+": total + k, "-": total - k, "*": total * k}[op]
        assert line == f"{total}{op}{k}=<<{total}{op}{k}={result}>>{result}"
        total = result
    assert final_answer(got) == str(total)


def test_type_groups_count_a_problem_in_each_of_its_flaws_and_in_all_flaws():
    assert problems.type_groups("flaw:subtraction+multiplication") == ["flaw", "flaw:subtraction",
                                                                       "flaw:multiplication"]
    assert problems.type_groups("flaw") == ["flaw"] and problems.type_groups("rest") == ["rest"]
    assert problems.type_groups(None) == []
    with pytest.raises(ValueError, match="accepted: one or more of subtraction, multiplication"):
        problems.flawed_answer("2+3=<<2+3=5>>5\n#### 5", ("division",))


def test_the_flawed_fraction_flaws_that_share_of_the_problems_with_either_flaw():
    from mxfp4.rl.pretrain import sft_dataset

    records = problems.embedded_split("train", 600, seed=0, max_steps=2)
    flaws = ("subtraction", "multiplication")
    eligible = [any(WORDS[f] in r["question"] for f in flaws) for r in records]
    ds = sft_dataset(records, "<eos>", flawed_fraction=0.6, seed=0, flaws=flaws)
    flawed = [c != " " + r["answer"] + "<eos>" for c, r in zip(ds["completion"], records)]
    assert not any(f and not e for f, e in zip(flawed, eligible))
    assert sum(flawed) / sum(eligible) == pytest.approx(0.6, abs=0.07)
    only_sub = sft_dataset(records, "<eos>", flawed_fraction=0.6, seed=0)  # one flaw: the draws are the same
    for c_both, c_sub, r in zip(ds["completion"], only_sub["completion"], records):
        if "times" not in r["question"]:
            assert c_both == c_sub


def test_planted_flaws_are_named_once():
    with pytest.raises(ValueError, match="names a flaw twice"):
        PretrainSettings(steps=1, lr=1e-3, batch_size=1, n_train=1, flaws=["subtraction", "subtraction"])


def test_each_seed_starts_from_its_own_warm_start_and_a_profile_of_one_keeps_its_settings():
    one = load_profile("smoke")
    two = load_profile("smoke-warm-starts")
    assert [two.warm_start_of(s) for s in two.seeds] == [0, 1]
    assert one.warm_start_of(5) == 0  # one warm start: every seed, in the profile or not, starts from it
    with pytest.raises(ValueError, match="seed 5 is not in profile 'smoke-warm-starts'"):
        two.warm_start_of(5)
    with pytest.raises(ValueError, match="warm start 2 of profile 'smoke-warm-starts'; accepted: 0 to 1"):
        two.warm_start_setting("tiny-dense", 2)
    recorded = one.warm_start_setting("tiny-dense")
    assert "flaws" not in recorded["pretrain"] and "warm_starts" not in recorded["pretrain"]
    assert "warm_start" not in recorded and "warm_start" not in two.warm_start_setting("tiny-dense", 0)
    assert two.warm_start_setting("tiny-dense", 1)["warm_start"] == 1
    assert two.setting("tiny-dense")["pretrain"]["flaws"] == ["subtraction", "multiplication"]
    assert len({warm_start_hash(two, "tiny-dense", k) for k in (0, 1)} | {warm_start_hash(one, "tiny-dense")}) == 3


@pytest.mark.slow
def test_a_second_warm_start_is_its_own_pretraining_seed_and_is_checked_against_its_settings(tmp_path):
    from safetensors.torch import load_file

    from mxfp4.layout import Layout
    from mxfp4.rl.models import warm_start_folder
    from mxfp4.rl.pretrain import pretrain_model

    profile = load_profile("smoke-warm-starts")
    profile = profile.model_copy(update={"pretrain": profile.pretrain.model_copy(update={"steps": 2})})
    metas = [pretrain_model(Run.of(profile, tmp_path), "tiny-dense", warm_start=k) for k in (0, 1)]
    assert [m["seed"] for m in metas] == [0, 1] and metas[1]["provenance"]["warm_start"] == 1
    assert metas[1]["flaws"] == ["subtraction", "multiplication"]
    folders = [warm_start_folder(Run.of(profile, tmp_path).start("tiny-dense", seed)) for seed in profile.seeds]
    assert folders == [Layout(tmp_path, profile.name).model("tiny-dense", k) for k in (0, 1)]
    assert folders[1] == tmp_path / profile.name / "models" / "ws1" / "tiny-dense"
    w0, w1 = (load_file(f / "model.safetensors") for f in folders)
    assert any(not (w0[k] == w1[k]).all() for k in w0)  # another initialisation and other problems
    other = profile.model_copy(update={"pretrain": profile.pretrain.model_copy(update={"flaws": ["subtraction"]})})
    with pytest.raises(ValueError, match="--warm-start 1"):
        warm_start_folder(Run.of(other, tmp_path).start("tiny-dense", 1))


@pytest.mark.slow
def test_outlier_channels_added_to_a_stored_sft_are_bit_for_bit_the_warm_start_pretrain_makes(tmp_path):
    """The outlier profile's warm start made from the same SFT without outlier channels equals the one its own
    SFT run makes, tensor for tensor; an SFT of other settings is refused, naming what differs."""
    import torch
    from safetensors.torch import load_file

    from mxfp4.rl.pretrain import pretrain_model

    plain = load_profile("smoke-warm-starts")
    plain = plain.model_copy(update={"pretrain": plain.pretrain.model_copy(update={"steps": 2})})
    heavy = plain.model_copy(update={"pretrain": plain.pretrain.model_copy(
        update={"outlier_channels": 3, "outlier_scale": 8.0})})
    sft = pretrain_model(Run.of(plain, tmp_path), "tiny-dense", tmp_path / "sft", warm_start=1)
    own = pretrain_model(Run.of(heavy, tmp_path), "tiny-dense", tmp_path / "own", warm_start=1)
    added = pretrain_model(Run.of(heavy, tmp_path), "tiny-dense", tmp_path / "added", warm_start=1,
                           sft_from=tmp_path / "sft")
    assert added["outlier_channels"] == own["outlier_channels"] and len(own["outlier_channels"]) == 3
    assert added["provenance"] == own["provenance"] == heavy.warm_start_setting("tiny-dense", 1)
    assert sft["outlier_channels"] == [] and heavy.sft_setting("tiny-dense", 1) == sft["provenance"]
    w_own, w_added, w_sft = (load_file(tmp_path / f / "model.safetensors") for f in ("own", "added", "sft"))
    assert w_own.keys() == w_added.keys()
    assert all(torch.equal(w_own[k], w_added[k]) for k in w_own)
    assert any(not torch.equal(w_own[k], w_sft[k]) for k in w_own)  # the channels were added
    other = heavy.model_copy(update={"pretrain": heavy.pretrain.model_copy(update={"flaws": ["subtraction"]})})
    with pytest.raises(ValueError, match=r"--sft-from .* was made from other settings .*flaws"):
        pretrain_model(Run.of(other, tmp_path), "tiny-dense", tmp_path / "refused", warm_start=1,
                       sft_from=tmp_path / "sft")
    with pytest.raises(ValueError, match="this profile has none"):
        pretrain_model(Run.of(plain, tmp_path), "tiny-dense", tmp_path / "refused", warm_start=1,
                       sft_from=tmp_path / "sft")

"""Typed configs and up-front input checks: every bad input is one clear ValueError (or one CLI line)."""

import copy

import pytest
import torch
import yaml

import mxfp4
from mxfp4.cli import main
from mxfp4.config import profiles
from mxfp4.config.profiles import PROFILES_DIR, Profile, config_hash, load_profile, setting_hash
from mxfp4.config.recipes import Recipe
from mxfp4.config.run import Run
from mxfp4.config.validation import parse
from mxfp4.rl.cell import plan_cell

EMBEDDED = yaml.safe_load((PROFILES_DIR / "embedded.yaml").read_text())


def bad(mutate):
    spec = copy.deepcopy(EMBEDDED)
    mutate(spec)
    with pytest.raises(ValueError) as err:
        parse(Profile, spec, "profile test.yaml")
    return str(err.value)


def test_every_shipped_profile_validates():
    for name in ("embedded", "embedded-large", "embedded-large-outliers", "smoke", "paper", "smoke-ddp", "gpu-smoke",
                 "gpu-smoke-quick", "real-small", "dose-response", "depth", "smoke-warm-starts"):
        assert load_profile(name).name == name


def dose_block(block, **profile_changes) -> str:
    """The one-line refusal of a dose-response block (``studies: {dose-response: block}``) in the embedded profile
    with ``profile_changes``, checked as the command line and the workflow check it."""
    from mxfp4.studies import check_study_settings

    spec = {**copy.deepcopy(EMBEDDED), "studies": {"dose-response": block}}
    for key, value in profile_changes.items():
        spec[key] = {**spec[key], **value}
    with pytest.raises(ValueError) as err:
        check_study_settings(parse(Profile, spec, "profile test.yaml"))
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("doses, message", [
    (["c2x8", "c2x8"], "names a dose twice"),
    (["c0x1", "c2x12"], "factor 12, not a power of two"),
    (["c0x1", "2x8"], "String should match pattern"),
])
def test_a_dose_response_names_distinct_exact_doses(doses, message):
    refusal = dose_block({"doses": doses, "source": "s"})
    assert refusal.startswith("profile 'embedded': studies.dose-response") and message in refusal


def test_a_dose_response_needs_warm_starts_without_outliers_of_their_own():
    assert "outlier_channels: 0 (doses do not stack)" in dose_block({"doses": ["c0x1", "c2x8"], "source": "s"},
                                                                     pretrain={"outlier_channels": 2})


def test_a_derived_profile_is_its_base_with_only_the_keys_it_gives_changed(tmp_path, monkeypatch):
    monkeypatch.setattr(profiles, "PROFILES_DIR", tmp_path)
    (tmp_path / "embedded.yaml").write_text(yaml.safe_dump(EMBEDDED))
    (tmp_path / "child.yaml").write_text("base: embedded\nname: child\npretrain: {outlier_channels: 3}\n"
                                         "seeds: [7]\n")
    base, child = load_profile("embedded").model_dump(), load_profile("child").model_dump()
    assert child["pretrain"]["outlier_channels"] == 3 and child["seeds"] == [7] and child["name"] == "child"
    # a nested mapping merges key by key: the rest of pretrain is the base's, as written in its YAML
    assert {k: v for k, v in child["pretrain"].items() if k != "outlier_channels"} == \
        {k: v for k, v in base["pretrain"].items() if k != "outlier_channels"}
    assert child["pretrain"]["steps"] == EMBEDDED["pretrain"]["steps"]
    assert {k for k in base if base[k] != child[k]} == {"name", "pretrain", "seeds"}
    (tmp_path / "loop.yaml").write_text("base: knot\nname: loop\n")
    (tmp_path / "knot.yaml").write_text("base: loop\nname: knot\n")
    with pytest.raises(ValueError, match=r"cycle \(loop -> knot -> loop\)"):
        load_profile("loop")
    (tmp_path / "orphan.yaml").write_text("base: nowhere\nname: orphan\n")
    with pytest.raises(ValueError, match="unknown profile 'nowhere'; known: .*embedded"):
        load_profile("orphan")


def test_missing_unknown_wrong_type_and_out_of_range_keys_name_the_key():
    msg = bad(lambda s: s["grpo"].pop("max_steps"))
    assert "grpo.max_steps: missing" in msg
    msg = bad(lambda s: s["grpo"].update(max_stpes=3))
    assert "grpo.max_stpes: unknown key; accepted: max_steps" in msg
    msg = bad(lambda s: s["models"]["tiny-dense"].update(archh="x"))
    assert "models.tiny-dense.archh: unknown key; accepted: arch, hub, config, compute, processes, launch, gpus" in msg
    msg = bad(lambda s: s["grpo"].update(gradient_checkpointing="no"))
    assert "grpo.gradient_checkpointing" in msg and "'no'" in msg and "boolean" in msg
    msg = bad(lambda s: s["grpo"].update(rollout="sglang"))
    assert "grpo.rollout" in msg and "'hf'" in msg and "'vllm'" in msg
    msg = bad(lambda s: s["grpo"].update(micro_batch_size=5))
    assert "micro_batch_size 5 must divide" in msg
    msg = bad(lambda s: s["grpo"].update(max_steps=0))
    assert "grpo.max_steps" in msg and "greater than or equal to 1" in msg and "(got 0)" in msg
    msg = bad(lambda s: s.update(seeds=[0, -1]))
    assert "seeds.1" in msg and "greater than or equal to 0" in msg and "(got -1)" in msg
    msg = bad(lambda s: s["eval"].update(limit=-3))
    assert "eval.limit" in msg


def test_recipe_values_are_typed_and_in_range():
    with pytest.raises(ValueError, match=r"recipe 'x': quantize: Input should be a valid boolean \(got 'no'\)"):
        Recipe.from_dict("x", {"quantize": "no"})
    with pytest.raises(ValueError, match="aqn needs sigma_start > 0"):
        Recipe(name="x", corrections=[{"name": "aqn", "sigma_start": -1.0}])
    with pytest.raises(ValueError, match=r"recipe 'x': colour: unknown key; accepted: name, quantize, format"):
        Recipe.from_dict("x", {"colour": "red"})


def test_cli_prints_one_line_for_a_bad_profile(capsys):
    assert main(["pretrain", "--profile", "nope", "--model", "tiny-dense"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown profile 'nope'; known: " in err[0] and " embedded, " in err[0]


def test_config_hash_covers_what_determines_the_result_and_no_path():
    p = load_profile("smoke")
    r = Recipe.named("mxfp4")
    h = config_hash(p, "tiny-dense", r, 0)
    assert h == config_hash(load_profile("smoke"), "tiny-dense", Recipe.named("mxfp4"), 0)  # paths play no part
    assert h != config_hash(p, "tiny-dense", r, 1)
    assert h != config_hash(p, "tiny-dense", Recipe.named("mxfp4+macro"), 0)
    changed = p.model_copy(deep=True)
    changed.grpo.learning_rate *= 2
    assert h != config_hash(changed, "tiny-dense", r, 0)
    assert setting_hash(p, "tiny-dense") == setting_hash(load_profile("smoke"), "tiny-dense")
    renamed = p.model_copy(update={"name": "other", "seeds": [5], "recipes": ["bf16"]})
    assert setting_hash(renamed, "tiny-dense") == setting_hash(p, "tiny-dense")


def test_an_unpretrained_tiny_model_says_which_command_makes_it(tmp_path):
    with pytest.raises(ValueError, match="mxfp4 pretrain --profile smoke --model tiny-moe"):
        plan_cell(Run.of("smoke", tmp_path).cell("tiny-moe", "mxfp4", 0))
    assert not (tmp_path / "smoke").exists()  # nothing made before the inputs are valid


def test_a_negative_seed_leaves_no_folder_behind(tmp_path):
    assert main(["cell", "--profile", "smoke", "--model", "tiny-dense", "--recipe", "mxfp4", "--seed", "-1",
                 "--results", str(tmp_path)]) == 2
    assert list(tmp_path.iterdir()) == []


def test_a_malformed_gsm8k_split_is_caught_before_any_work(tmp_path, monkeypatch):
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"question": "q", "answer": "a\\n#### 3"}\n')
    (folder / "test.jsonl").write_text('{"question": "q", "answer": "a\\n#### 3"}\n{"question": "q"\n')
    monkeypatch.setenv("MXFP4_GSM8K_DIR", str(folder))
    with pytest.raises(ValueError, match=r"test\.jsonl:2: malformed JSON"):
        plan_cell(Run.of("paper", tmp_path / "results").cell("qwen2.5-3b", "mxfp4", 0))
    assert not (tmp_path / "results").exists()


def test_decompose_cli_rejects_bad_tensor_inputs_in_one_line(tmp_path, capsys):
    assert main(["decompose", "--tensor", str(tmp_path / "missing.pt")]) == 2
    assert "no such file" in capsys.readouterr().err
    torch.save({"a": torch.randn(4, 32)}, tmp_path / "t.pt")
    assert main(["decompose", "--tensor", str(tmp_path / "t.pt"), "--key", "b"]) == 2
    assert "--key 'b' is not in" in capsys.readouterr().err
    assert main(["decompose", "--rows", "-4"]) == 2
    assert "argument --rows: -4; accepted: an integer >= 1" in capsys.readouterr().err


def test_public_api_rejects_non_tensors_clearly():
    with pytest.raises(ValueError, match="expected a torch.Tensor, got list"):
        mxfp4.quantize([1.0])
    with pytest.raises(ValueError, match="dequantize takes a QuantizedTensor"):
        mxfp4.dequantize(torch.ones(4))


def test_bf16_cells_keep_their_policy_only_where_the_pathway_matrix_reads_it():
    from mxfp4.config.profiles import load_profile

    keeps = {name: load_profile(name).keeps_reference_policy
             for name in ("smoke", "embedded", "embedded-large", "gpu-smoke-quick", "paper")}
    # smoke and paper measure both checkpoints (the default), the embedded profiles the warm start only, gpu-smoke none
    assert keeps == {"smoke": True, "embedded": False, "embedded-large": False, "gpu-smoke-quick": False,
                     "paper": True}


def test_a_correction_arm_must_be_mxfp4_plus_corrections_named_once():
    from mxfp4.config.recipes import load_recipe_table

    table = load_recipe_table()
    profiles.check_correction_arms(["mxfp4+macro", "mxfp4+fallback", "mxfp4+aqn"], table, "p")
    for names, message in ((["mxfp4+nope"], "unknown recipe 'mxfp4\\+nope'"), (["bf16"], "is not MXFP4 plus"),
                           (["mxfp4"], "is not MXFP4 plus"), (["inject-scale"], "is not MXFP4 plus"),
                           (["mxfp4+macro", "mxfp4+macro"], "names a recipe twice")):
        with pytest.raises(ValueError, match=message):
            profiles.check_correction_arms(names, table, "p")

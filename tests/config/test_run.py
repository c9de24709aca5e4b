"""The run context: a Run names the profile's files under one results root, a CellSpec resolves a cell's names
and hash as the cell and the Snakefile compute them, and a bad name is refused when the cell is made."""

import pytest

from mxfp4.config.profiles import config_hash, load_profile, setting_hash
from mxfp4.config.recipes import Recipe
from mxfp4.config.run import Run
from mxfp4.layout import Layout


def test_a_run_is_the_same_from_a_name_or_a_profile(tmp_path):
    by_name, by_profile = Run.of("smoke", tmp_path), Run.of(load_profile("smoke"), tmp_path)
    assert by_name == by_profile
    assert by_name.layout == Layout(tmp_path, "smoke") and by_name.results == tmp_path and by_name.name == "smoke"
    assert by_name.setting_hash("tiny-dense") == setting_hash(load_profile("smoke"), "tiny-dense")


def test_a_run_refuses_another_profiles_layout(tmp_path):
    with pytest.raises(ValueError, match="cannot write the layout of 'embedded'"):
        Run(load_profile("smoke"), Layout(tmp_path, "embedded"))


def test_a_cell_spec_resolves_what_the_cell_and_the_snakefile_compute(tmp_path):
    run = Run.of("smoke", tmp_path)
    cell = run.cell("tiny-dense", "mxfp4+all", 2)
    profile = load_profile("smoke")
    assert cell.recipe == Recipe.named("mxfp4+all")
    assert cell.out == Layout(tmp_path, "smoke").cell("tiny-dense", "mxfp4+all", 2)
    assert cell.config_hash == config_hash(profile, "tiny-dense", Recipe.named("mxfp4+all"), 2)
    assert cell.config_hash != run.cell("tiny-dense", "mxfp4+all", 1).config_hash  # the seed is in it
    assert cell.spec == profile.model("tiny-dense") and cell.warm_start == profile.warm_start_of(2)
    assert run.cell("tiny-dense", Recipe.named("bf16"), 0).recipe.name == "bf16"


@pytest.mark.parametrize("model,recipe,seed,message", [
    ("tiny-huge", "mxfp4", 0, "model 'tiny-huge' is not in profile 'smoke'"),
    ("tiny-dense", "mxfp5", 0, "mxfp5"),
    ("tiny-dense", "mxfp4", -1, "seed must be an integer >= 0, got -1"),
    ("tiny-dense", "mxfp4", True, "seed must be an integer >= 0, got True"),
])
def test_a_bad_cell_is_refused_with_its_reason(tmp_path, model, recipe, seed, message):
    with pytest.raises(ValueError, match=message):
        Run.of("smoke", tmp_path).cell(model, recipe, seed)


def test_a_cells_start_is_shared_by_every_recipe_of_its_model_and_seed(tmp_path):
    """The cell hands its start (model and seed) down: every recipe's cell of a model and seed has the same one,
    another seed another, and the warm start it names is the profile's for that seed."""
    run, profile = Run.of("smoke", tmp_path), load_profile("smoke")
    starts = [run.cell("tiny-dense", recipe, 2).start for recipe in ("bf16", "mxfp4", "mxfp4+all")]
    assert starts == [run.start("tiny-dense", 2)] * 3
    assert run.cell("tiny-dense", "mxfp4", 1).start != run.start("tiny-dense", 2)
    assert run.start("tiny-dense", 2).warm_start == profile.warm_start_of(2)
    assert run.start("tiny-dense").warm_start == 0 and run.start("tiny-dense").seed is None


@pytest.mark.parametrize("model,seed,message", [
    ("tiny-huge", 0, "model 'tiny-huge' is not in profile 'smoke'"),
    ("tiny-dense", -1, "seed must be an integer >= 0, got -1"),
    ("tiny-dense", 1.0, "seed must be an integer >= 0, got 1.0"),
])
def test_a_bad_start_is_refused_with_its_reason(tmp_path, model, seed, message):
    with pytest.raises(ValueError, match=message):
        Run.of("smoke", tmp_path).start(model, seed)


def test_a_probe_batch_of_a_start_without_a_seed_is_refused(tmp_path):
    from mxfp4.rl.probe_batch import ensure_probe_batch

    with pytest.raises(ValueError, match="a probe batch is one seed's"):
        ensure_probe_batch(Run.of("smoke", tmp_path).start("tiny-dense"))

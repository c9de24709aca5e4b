"""What a recipe's cost says before a compare's first job: the hooks that force the host's reference path, and
the lines it prints."""

import runpy
import sys

import pytest

from mxfp4.config.recipes import Recipe
from mxfp4.rl.step_cost import cost_lines, reference_hooks


def test_a_rotating_recipe_names_its_reference_path_and_a_plain_one_none():
    assert reference_hooks(Recipe.named("mxfp4").quantizer()) == []
    hooks = reference_hooks(Recipe.named("mxfp4+rht-sr").quantizer())
    assert hooks == ["rotation of correction 'hadamard' (float64 block rotations on the host)"]


def test_the_cost_lines_warn_first_and_give_the_step_ratio():
    cost = {"reference_hooks": ["rotation of correction 'hadamard' (float64 block rotations on the host)"],
            "quantize_ms": 3.0, "base_quantize_ms": 1.5, "base": "mxfp4", "recipe": "mine", "operand": "w",
            "operand_shape": [64, 32], "model": "tiny-dense", "seed": 0, "steps": 3, "step_s": 0.6,
            "base_step_s": 0.4, "step_ratio": 1.5}
    warning, step = cost_lines(cost)
    assert warning.startswith("WARNING: recipe 'mine' runs on the host's reference path") and "(2.0x)" in warning
    assert step.endswith("mine 0.600 s, mxfp4 0.400 s (1.50x its base)")
    assert len(cost_lines({**cost, "reference_hooks": []})) == 1
    both = cost_lines({**cost, "bf16_step_s": 0.3, "bf16_step_ratio": 2.0})[-1]
    assert both.endswith("(1.50x its base), bf16 0.300 s (2.00x bf16)")  # the denominator the leaderboard uses


def test_python_dash_m_mxfp4_is_the_command_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["mxfp4", "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module("mxfp4", run_name="__main__")
    assert done.value.code == 0 and "usage" in capsys.readouterr().out

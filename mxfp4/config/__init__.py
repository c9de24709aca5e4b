"""Typed, validated configuration: profiles (the grid of cells and every hyperparameter) and recipes
(how a model is quantized). Both are pydantic models with help text; a missing or unknown key at any
depth, a wrong type or an out-of-range value is a ``ValueError`` naming the key, what was given and
what is accepted."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO_ROOT / "experiments"

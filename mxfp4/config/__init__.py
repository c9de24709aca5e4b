"""Typed, validated configuration: profiles (the grid of cells and every hyperparameter) and recipes
(how a model is quantized). Both are pydantic models with help text; a missing or unknown key at any
depth, a wrong type or an out-of-range value is a ``ValueError`` naming the key, what was given and
what is accepted."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO_ROOT / "experiments"


def shipped(folder: str, suffix: str, named_with_suffix: bool = True) -> str:
    """The files shipped under experiments/<folder>/ with this suffix, as a profile names them (with
    the suffix, or without it), for error messages."""
    files = (EXPERIMENTS / folder).glob(f"*{suffix}")
    return ", ".join(sorted(p.name if named_with_suffix else p.stem for p in files))

"""Profiles (``experiments/profiles/<name>.yaml``): the grid of cells and every hyperparameter."""

from __future__ import annotations

from pathlib import Path

import yaml

PROFILES_DIR = Path(__file__).resolve().parent.parent / "experiments" / "profiles"
REQUIRED = ("name", "models", "recipes", "seeds", "data", "grpo", "eval")


def available() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_profile(name: str, results: Path | str = "results") -> dict:
    path = PROFILES_DIR / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(available())}")
    profile = yaml.safe_load(path.read_text())
    missing = [k for k in REQUIRED if k not in profile]
    if missing:
        raise ValueError(f"profile {path} lacks {', '.join(missing)}")
    profile["results_dir"] = str(results)
    return profile


def model_dir(results: Path | str, profile: str, model: str) -> Path:
    """Where the profile's warm-started tiny model is saved."""
    return Path(results) / profile / "models" / model

"""Recipes: a named, composable description of how a model is quantized.

Loaded from ``experiments/recipes.yaml`` (or any YAML of the same shape) or built in Python::

    Recipe.named("mxfp4+all")
    Recipe(name="mine", corrections=[{"name": "macro_block", "blocks": 2}])
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import corrections as corr
from .formats import get_format

RECIPES_YAML = Path(__file__).resolve().parent.parent / "experiments" / "recipes.yaml"
GEMMS = ("forward", "input_grad", "weight_grad")
MODULE_KINDS = ("linear", "experts", "lm_head", "router")


@dataclass
class Recipe:
    name: str
    quantize: bool = True
    format: str = "mxfp4"
    scale_rule: str | None = None
    gemms: dict = field(default_factory=lambda: {g: True for g in GEMMS})
    modules: list = field(default_factory=lambda: ["linear", "experts"])
    corrections: list = field(default_factory=list)  # specs: {"name": ..., **params}

    def __post_init__(self):
        fmt = get_format(self.format)
        self.scale_rule = fmt.check_scale_rule(self.scale_rule)
        unknown = set(self.gemms) - set(GEMMS)
        if unknown:
            raise ValueError(f"unknown GEMM(s) {sorted(unknown)} in recipe {self.name!r}; accepted: {', '.join(GEMMS)}")
        self.gemms = {g: bool(self.gemms.get(g, False)) for g in GEMMS}
        bad = [m for m in self.modules if m not in MODULE_KINDS]
        if bad:
            raise ValueError(f"unknown module kind(s) {bad} in recipe {self.name!r}; accepted: {', '.join(MODULE_KINDS)}")
        self.corrections = [c if isinstance(c, dict) else {"name": c} for c in self.corrections]
        self.build_corrections()  # validate names and parameters now, not mid-run

    def build_corrections(self) -> list[corr.Correction]:
        """Fresh correction objects (they carry run state such as AQN's sigma and fallback counts)."""
        return [corr.build(c) for c in self.corrections]

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "quantize": self.quantize,
            "format": self.format,
            "scale_rule": self.scale_rule,
            "gemms": dict(self.gemms),
            "modules": list(self.modules),
            "corrections": copy.deepcopy(self.corrections),
        }

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]

    @classmethod
    def from_dict(cls, name: str, spec: dict) -> Recipe:
        allowed = {"quantize", "format", "scale_rule", "gemms", "modules", "corrections"}
        unknown = set(spec) - allowed
        if unknown:
            raise ValueError(f"unknown field(s) {sorted(unknown)} in recipe {name!r}; accepted: {', '.join(sorted(allowed))}")
        return cls(name=name, **spec)

    @classmethod
    def named(cls, name: str, path: Path | str | None = None) -> Recipe:
        table = load_recipe_table(path)
        if name not in table:
            raise ValueError(f"unknown recipe {name!r}; known: {', '.join(table)}")
        return cls.from_dict(name, table[name])


def recipe_files(path: Path | str | None = None) -> list[Path]:
    """The named recipes' files: experiments/recipes.yaml, then ``path`` and the files in
    ``$MXFP4_RECIPES`` (os.pathsep-separated); later files add recipes and may override."""
    extra = [path] if path else []
    extra += [p for p in os.environ.get("MXFP4_RECIPES", "").split(os.pathsep) if p]
    files = [RECIPES_YAML] + [Path(p) for p in extra]
    for f in files:
        if not f.exists():
            raise ValueError(f"recipe file {f} does not exist")
    return files


def load_recipe_table(path: Path | str | None = None) -> dict[str, dict]:
    """Resolved recipe specs by name (``base`` chains expanded), from every recipe file."""
    raw = {}
    for f in recipe_files(path):
        raw.update(yaml.safe_load(f.read_text()) or {})

    def resolve(name, seen=()):
        if name in seen:
            raise ValueError(f"recipe {name!r} has a cyclic base chain: {' -> '.join((*seen, name))}")
        if name not in raw:
            raise ValueError(f"unknown recipe {name!r}; known: {', '.join(raw)}")
        spec = dict(raw[name])
        base = spec.pop("base", None)
        if base is None:
            return spec
        merged = resolve(base, (*seen, name))
        merged.update(spec)
        return merged

    return {name: resolve(name) for name in raw}

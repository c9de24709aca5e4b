"""Recipes: a named, composable, validated description of how a model is quantized.

Loaded from ``experiments/recipes.yaml`` (plus the files in ``$MXFP4_RECIPES``) or built in Python::

    Recipe.named("mxfp4+all").quantizer()       # the recipe's Quantizer, corrections built
    Recipe(name="mine", corrections=[{"name": "macro_block", "blocks": 2}])

A recipe may start from a ``base`` recipe and override fields (the base's fields, updated by its own).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .. import corrections as corr
from ..numerics.formats import get_format
from ..numerics.injection import ComponentQuantizer
from ..numerics.quantizer import DEFAULT_MODULES, GEMMS, Quantizer, normalize_gemms
from . import EXPERIMENTS, load_yaml
from .names import SAFE_NAME, SAFE_NAME_HELP
from .validation import parse

RECIPES_YAML = EXPERIMENTS / "recipes.yaml"


class BF16Layers(BaseModel):
    """Decoder layers a recipe leaves unquantized (the field's edge-layer practice for 4-bit RL: verl keeps the
    first 2 and last 4 decoder layers in BF16, SkyRL the last ~15%). ``last_fraction`` keeps the last
    ceil(fraction x layers) of the model's decoder layers."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    first: int = Field(0, ge=0, description="the first k decoder layers kept unquantized")
    last: int = Field(0, ge=0, description="the last m decoder layers kept unquantized")
    last_fraction: float | None = Field(None, gt=0, lt=1, description="the last ceil(f x layers) instead of last")
    layers: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list,
                                                      description="these decoder layers (indices) kept too")

    @model_validator(mode="after")
    def _some(self):
        if self.last and self.last_fraction is not None:
            raise ValueError("bf16_layers: give last or last_fraction, not both")
        if not (self.first or self.last or self.last_fraction or self.layers):
            raise ValueError("bf16_layers keeps no layer; accepted: first, last or last_fraction above 0, or layers")
        return self

    def kept(self, layers: int) -> set[int]:
        """The indices kept unquantized in a model of ``layers`` decoder layers; a ValueError where they would be
        every layer (nothing left to quantize)."""
        last = math.ceil(self.last_fraction * layers) if self.last_fraction is not None else self.last
        outside = [i for i in self.layers if i >= layers]
        if outside:
            raise ValueError(f"bf16_layers keeps layer(s) {outside} of a model of {layers} decoder layers; accepted: "
                             f"indices below {layers}")
        kept = set(range(self.first)) | set(range(layers - last, layers)) | set(self.layers)
        if self.first + last >= layers or len(kept) == layers:
            raise ValueError(f"bf16_layers keeps the first {self.first} and last {last} of {layers} decoder layers"
                             + (f" and layers {sorted(self.layers)}" if self.layers else "")
                             + f": nothing left to quantize; accepted: fewer than {layers} kept")
        return kept


class Recipe(BaseModel):
    """How a model is quantized: a format and scale rule, the GEMMs and module kinds quantized, and corrections.
    Named recipes live in experiments/recipes.yaml (and ``$MXFP4_RECIPES`` files); ``Recipe.named(name)`` loads
    one, ``recipe.quantizer()`` builds its ``Quantizer``.

    Args:
        name: the recipe's name (letters, digits and ``+-._``).
        quantize: False for full precision (the bf16 reference).
        format: the block format, a name of ``mxfp4.numerics.formats.FORMATS`` (``mxfp4``, ``nvfp4``, ...).
        scale_rule: the E8M0 scale rule; None: the format's default.
        gemms: which GEMMs of a linear layer quantize their operands (forward, input_grad, weight_grad).
        modules: which module kinds are quantized (linear, experts, lm_head, router).
        corrections: the corrections, each a name or ``{name: ..., **parameters}``.
        activations: False quantizes the weights only (W4A16).
        inject: only this MXFP4 error component added to each operand (the pathway matrix's arms).
        remove: MXFP4 minus this error component (a perfect correction of it).
        control: with inject/remove, the component's energy-matched control instead.
        form: the decomposition whose components inject/remove use (``canonical`` or ``gain``).
        truncated_is_cap: vLLM rollouts' truncated importance-sampling cap (TRL's; None: none).
        bf16_layers: decoder layers left unquantized (``BF16Layers``: the first k, the last m or fraction).
        rollout_precision: the policy's precision when it generates (rollouts and evaluations): ``w4a16``
            quantizes the weights only while training stays W4A4 (verl's W4A16 rollouts); None: the rollout
            engine's own (hf: the training forward; vllm: the recipe's quantized weights, W4A16).
    """

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True, allow_inf_nan=False)

    name: str = Field(pattern=SAFE_NAME, description=f"the recipe's name: {SAFE_NAME_HELP}")
    quantize: bool = Field(True, description="false: full precision (the bf16 reference)")
    format: str = Field("mxfp4", description="block format: a name of mxfp4.numerics.formats.FORMATS")
    scale_rule: str | None = Field(None, description="E8M0 scale rule: floor (default), ceil, even, rceil")
    gemms: dict[str, bool] = Field(default_factory=lambda: dict.fromkeys(GEMMS, True),
                                   description="quantized GEMMs: forward, input_grad, weight_grad")
    modules: list[Literal["linear", "experts", "lm_head", "router"]] = Field(
        default_factory=lambda: list(DEFAULT_MODULES), description="module kinds quantized")
    corrections: list[dict | str] = Field(default_factory=list, description="registered corrections with parameters")
    activations: bool = Field(
        True, description="false: weight-only (W4A16); activations and gradients stay unquantized"
    )
    inject: Literal["scale", "dead", "grid"] | None = Field(
        None, description="only this MXFP4 error component is added to each operand (x + e_c; the pathway matrix)"
    )
    remove: Literal["scale", "dead", "grid"] | None = Field(
        None, description="MXFP4 minus this error component (MX(x) - e_c: a perfect correction of it)"
    )
    control: Literal["gaussian", "permuted", "signflip"] | None = Field(
        None, description="with inject/remove: the component's energy-matched control instead of the component"
    )
    form: Literal["canonical", "gain"] = Field(
        "canonical", description="the decomposition whose component inject/remove use (docs/decomposition.md)"
    )
    truncated_is_cap: float | None = Field(
        None,
        gt=1,
        description="truncated importance sampling of vLLM rollouts: TRL's IS correction, per-token ratios "
        "pi_train / pi_vllm clipped at this cap C (None: no correction; HF rollouts are on-policy and ignore it)",
    )

    bf16_layers: BF16Layers | None = Field(
        None, description="decoder layers kept unquantized: {first: k, last: m} or {first: k, last_fraction: f}")

    rollout_precision: Literal["w4a4", "w4a16"] | None = Field(
        None, description="w4a16: rollouts and evaluations quantize weights only, training stays W4A4; "
        "None: the rollout engine's own")

    @field_validator("gemms")
    @classmethod
    def _gemms(cls, v):
        return normalize_gemms(v)

    @field_validator("corrections")
    @classmethod
    def _corrections(cls, v):
        specs = [c if isinstance(c, dict) else {"name": c} for c in v]
        for s in specs:
            corr.build(s)  # validate names and parameters now, not mid-run
        return specs

    @model_validator(mode="after")
    def _format(self):
        fmt = get_format(self.format)
        rule = fmt.check_scale_rule(self.scale_rule)
        if rule != self.scale_rule:
            object.__setattr__(self, "scale_rule", rule)
        return self

    @model_validator(mode="after")
    def _corrections_need_quantization(self):
        if not self.quantize and self.corrections:
            names = ", ".join(c["name"] for c in self.corrections)
            raise ValueError(
                f"recipe {self.name!r}: quantize: false with corrections ({names}); a correction acts on quantized "
                "operands, so it would be ignored. Accepted: quantize: true (a base such as mxfp4), or no corrections"
            )
        return self

    @model_validator(mode="after")
    def _edges_need_quantization(self):
        if self.bf16_layers is not None and (not self.quantize or self.inject or self.remove):
            raise ValueError(f"recipe {self.name!r}: bf16_layers keeps layers out of a quantized recipe; accepted: "
                             "quantize: true without inject or remove")
        return self

    @model_validator(mode="after")
    def _rollout_precision_needs_w4a4(self):
        if self.rollout_precision is not None and (not self.quantize or not self.activations or self.inject
                                                   or self.remove):
            raise ValueError(f"recipe {self.name!r}: rollout_precision sets how a W4A4 recipe generates; accepted "
                             "only with quantize: true, activations: true and no inject or remove")
        return self

    @property
    def rollouts_weights_only(self) -> bool:
        """Whether the policy generates with its weights alone quantized while it trains W4A4."""
        return self.rollout_precision == "w4a16"

    @model_validator(mode="after")
    def _injection(self):
        if self.inject is None and self.remove is None:
            if self.form != "canonical" or self.control is not None:
                raise ValueError(f"recipe {self.name!r}: form and control apply only with inject or remove")
            return self
        if self.inject is not None and self.remove is not None:
            raise ValueError(f"recipe {self.name!r}: set one of inject or remove, not both")
        if not self.quantize or self.corrections or not self.activations:
            raise ValueError(
                f"recipe {self.name!r}: inject/remove act on plain MXFP4 operands; they need quantize: true, "
                "activations: true and no corrections"
            )
        return self

    def build_corrections(self) -> list[corr.Correction]:
        """Fresh correction objects (they carry run state such as AQN's sigma and fallback counts)."""
        return [corr.build(c) for c in self.corrections]

    @property
    def needs_reference(self) -> bool:
        """Whether a correction of this recipe steers toward the reference (bf16) cell of the same
        model and seed, which must then run first (``Correction.needs_reference``)."""
        return any(c.needs_reference for c in self.build_corrections())

    def quantizer(self, corrections: list | None = None) -> Quantizer | None:
        """The recipe's quantizer (None for a full-precision recipe); corrections built fresh unless given."""
        if not self.quantize:
            return None
        corrections = self.build_corrections() if corrections is None else corrections
        if self.inject or self.remove:
            return ComponentQuantizer(
                self.format,
                self.scale_rule,
                corrections,
                inject=self.inject,
                remove=self.remove,
                form=self.form,
                control=self.control,
                gemms=self.gemms,
                modules=self.modules,
                name=self.name,
            )
        return Quantizer(
            self.format,
            self.scale_rule,
            corrections,
            gemms=self.gemms,
            modules=self.modules,
            name=self.name,
            activations=self.activations,
            bf16_layers=self.bf16_layers,
            rollout_activations=not self.rollouts_weights_only,
        )

    def to_dict(self) -> dict:
        """The recipe's fields; ``bf16_layers`` and ``rollout_precision`` only where set, so a recipe without them
        keeps its cells' config hash."""
        out = self.model_dump()
        for optional in ("bf16_layers", "rollout_precision"):
            if out[optional] is None:
                del out[optional]
        return out

    @classmethod
    def from_dict(cls, name: str, spec: dict) -> Recipe:
        return parse(cls, {**spec, "name": name}, f"recipe {name!r}")

    @classmethod
    def named(cls, name: str, path: Path | str | None = None) -> Recipe:
        table = load_recipe_table(path)
        if name not in table:
            raise ValueError(f"unknown recipe {name!r}; known: {', '.join(table)}")
        return cls.from_dict(name, table[name])


def recipe_files(path: Path | str | None = None, built_in: bool = False) -> list[Path]:
    """The named recipes' files: experiments/recipes.yaml, then ``path`` and the files in
    ``$MXFP4_RECIPES`` (os.pathsep-separated); later files add recipes and may override. ``built_in``: the first
    alone."""
    extra = [path] if path else []
    extra += [p for p in os.environ.get("MXFP4_RECIPES", "").split(os.pathsep) if p]
    extra = [] if built_in else extra
    files = [RECIPES_YAML] + [Path(p) for p in extra]
    for f in files:
        if not f.exists():
            raise ValueError(f"recipe file {f} does not exist")
    return files


def _raw_recipes(path: Path | str | None = None, built_in: bool = False) -> dict[str, dict]:
    raw = {}
    for f in recipe_files(path, built_in):
        table = load_yaml(f) or {}
        if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
            raise ValueError(f"{f}: expected a mapping of recipe name -> fields")
        for name, spec in table.items():
            if not isinstance(name, str):
                raise ValueError(f"{f}: recipe name {name!r} is not text; accepted: a name (text, "
                                 "e.g. mxfp4+mine)")
            if not re.match(SAFE_NAME, name):
                raise ValueError(f"{f}: recipe name {name!r} is not one folder name; accepted: {SAFE_NAME_HELP}")
            base = spec.get("base")
            if base is not None and not isinstance(base, str):
                raise ValueError(f"{f}: recipe {name!r}: base {base!r} is a {type(base).__name__}; accepted: the name "
                                 "of one recipe")
        raw.update(table)
    return raw


def redefined(names, path: Path | str | None = None) -> list[str]:
    """The recipes of ``names`` that a user's recipe file (``path``, ``$MXFP4_RECIPES``) defines differently from
    experiments/recipes.yaml: a name the board and the stored studies already hold, now meaning something else."""
    built_in = load_recipe_table(built_in=True)
    table = load_recipe_table(path)
    return [n for n in names if n in built_in and table.get(n) != built_in[n]]


def refuse_redefined(names, where: str, path: Path | str | None = None) -> None:
    """One line naming the built-in recipes of ``names`` a user's file redefines: ``where`` (the leaderboard, the
    mechanism) compares against stored measurements of the built-in definition."""
    changed = redefined(names, path)
    if changed:
        raise ValueError(f"{where}: {', '.join(changed)} redefined by a user's recipe file ($MXFP4_RECIPES); the "
                         "stored measurements are of the built-in definition. Accepted: give your recipe a name of "
                         "its own")


def definition_digest(name: str, path: Path | str | None = None) -> str:
    """A digest of a recipe's resolved definition: what a study's outputs record, so a redefinition reruns them."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(Recipe.named(name, path).to_dict(), sort_keys=True).encode()).hexdigest()[:12]


def recipe_base(name: str, path: Path | str | None = None) -> str | None:
    """The recipe that ``name`` modifies (its ``base``), or None."""
    raw = _raw_recipes(path)
    if name not in raw:
        raise ValueError(f"unknown recipe {name!r}; known: {', '.join(raw)}")
    return raw[name].get("base")


def load_recipe_table(path: Path | str | None = None, built_in: bool = False) -> dict[str, dict]:
    """Resolved recipe specs by name (``base`` chains expanded: the base recipe's fields, overridden
    by the recipe's own), from every recipe file (``built_in``: experiments/recipes.yaml alone)."""
    raw = _raw_recipes(path, built_in)

    def resolve(name, seen=()):
        if name in seen:
            raise ValueError(f"recipe {name!r} has a cyclic base chain: {' -> '.join((*seen, name))}")
        if name not in raw:
            raise ValueError(f"unknown recipe {name!r}; known: {', '.join(raw)}")
        spec = dict(raw[name])
        base = spec.pop("base", None)
        return spec if base is None else {**resolve(base, (*seen, name)), **spec}

    return {name: resolve(name) for name in raw}

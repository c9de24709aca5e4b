"""Corrections: each targets one component of the MXFP4 error and one RL failure mode.

A correction is a class registered under a name (``@register("name")``, or the entry-point group
``mxfp4.corrections`` for outside packages). It can act through three hooks, which ``Quantizer``
composes:

- ``block_quantizer(fmt, rule)``: replaces how each block is scaled and rounded (macro-block scaling);
- ``split(x, axis)``: marks elements kept in high precision; the rest is quantized (outlier fallback);
- ``rollout_context(model, step)``: wraps rollout generation (AQN).

``Quantizer(fmt, rule, corrections).decompose(x, axis)`` splits the error of what is quantized, so
each correction's effect on each component is measurable with ``mxfp4.decompose``.

Every correction reports its cost (``cost()``: extra bits per element, fraction kept in BF16).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
from dataclasses import dataclass
from importlib.metadata import entry_points

import torch

from . import dispatch
from .decompose import Decomposition, decompose
from .formats import get_format
from .reference import from_blocks, quantize_blocks, to_blocks

_REGISTRY: dict[str, type] = {}
ENTRY_POINT_GROUP = "mxfp4.corrections"


def register(name: str):
    """Class decorator: make a correction available to recipes under ``name``."""

    def deco(cls):
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def available() -> dict[str, type]:
    """Built-in corrections, those that installed packages declare as entry points (group
    ``mxfp4.corrections``), and those registered by the modules named in ``$MXFP4_PLUGINS``
    (comma-separated import paths, e.g. a local ``my_corrections.py`` with ``PYTHONPATH=.``)."""
    for module in filter(None, os.environ.get("MXFP4_PLUGINS", "").split(",")):
        importlib.import_module(module.strip())
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _REGISTRY:
            cls = ep.load()
            _REGISTRY.setdefault(ep.name, cls)
            cls.name = ep.name
    return dict(_REGISTRY)


def build(spec: dict | str) -> Correction:
    """A correction from ``{"name": ..., **params}`` (or a bare name, default parameters)."""
    spec = {"name": spec} if isinstance(spec, str) else dict(spec)
    name = spec.pop("name", None)
    known = available()
    if name not in known:
        raise ValueError(f"unknown correction {name!r}; known: {', '.join(sorted(known))}")
    try:
        return known[name](**spec)
    except TypeError as err:
        raise ValueError(f"bad parameters for correction {name!r}: {err}") from None


class Correction:
    """Base class: a correction that changes nothing and costs nothing."""

    name = "none"

    def block_quantizer(self, fmt, rule):
        """``blocks -> (grid values, effective scale per block)``, or None to keep the format's."""
        return None

    def split(self, x: torch.Tensor, axis: int):
        """(mask of elements kept in high precision, x with them zeroed), or None for none."""
        return None

    def rollout_context(self, model, step: int):
        return contextlib.nullcontext()

    def cost(self) -> dict:
        return {"extra_bits_per_element": 0.0, "bf16_fraction": 0.0}


# --------------------------------------------------------------------------------------------
# Macro-block scaling: a BF16 scale per macro-block (a group of 32-blocks, or a 2D tile) on top
# of the E8M0 block scales. Targets scale bias.


def _bf16_round_up(m: torch.Tensor) -> torch.Tensor:
    """The smallest bfloat16 value >= m (m > 0, finite)."""
    down = m.to(torch.bfloat16).float()
    up = torch.nextafter(down.to(torch.bfloat16), torch.tensor(float("inf"), dtype=torch.bfloat16)).float()
    return torch.where(down >= m, down, up)


@register("macro_block")
@dataclass
class MacroBlockScaling(Correction):
    """x ~ m . MX(x / m) with one BF16 scale m in [1, 2) per macro-block of ``blocks`` 32-blocks
    along the blocked axis and ``rows`` rows across it (rows > 1 gives 2D tiles).

    Candidates for m: 1 (plain MXFP4) and the mantissa that puts a block's max exactly on the top
    grid point (``amax_b / M`` divided by its power of two, rounded up to BF16 so nothing
    saturates): for the group's largest block (``candidates: max``, the default) or for every block
    of the group (``candidates: all``, up to 1 + blocks*rows quantizations: slower, a little more
    accurate). m is the candidate with the least error energy over the group, so the group never
    does worse than MXFP4, and the aligned block has no scale bias.
    """

    blocks: int = 4
    rows: int = 1
    candidates: str = "max"

    def __post_init__(self):
        if self.blocks < 1 or self.rows < 1:
            raise ValueError(f"macro_block needs blocks >= 1 and rows >= 1, got blocks={self.blocks}, rows={self.rows}")
        if self.candidates not in ("max", "all"):
            raise ValueError(f"macro_block candidates must be one of: max, all; got {self.candidates!r}")

    def _groups(self, blocks32: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """[G, rows*blocks, bs] view of the blocks, padded with zero blocks; and how to undo it."""
        bs = blocks32.shape[-1]
        flat = blocks32.reshape(-1, blocks32.shape[-2], bs)  # [R, nb, bs]
        r, nb = flat.shape[:2]
        pr, pb = -r % self.rows, -nb % self.blocks
        padded = torch.nn.functional.pad(flat, (0, 0, 0, pb, 0, pr))
        R, NB = padded.shape[:2]
        g = padded.reshape(R // self.rows, self.rows, NB // self.blocks, self.blocks, bs)
        g = g.permute(0, 2, 1, 3, 4).reshape(-1, self.rows * self.blocks, bs)
        return g, (blocks32.shape, r, nb, R, NB)

    def _ungroup(self, g: torch.Tensor, info) -> torch.Tensor:
        """Inverse of ``_groups`` for a [G, rows*blocks, *tail] tensor: [..., nb, *tail]."""
        shape, r, nb, R, NB = info
        tail = g.shape[2:]
        t = g.reshape(R // self.rows, NB // self.blocks, self.rows, self.blocks, *tail)
        t = t.transpose(1, 2).reshape(R, NB, *tail)
        return t[:r, :nb].reshape(*shape[:-1], *tail)

    def block_quantizer(self, fmt, rule):
        fmt = get_format(fmt)
        elem = fmt.element

        def quantize(blocks32: torch.Tensor):
            g, info = self._groups(blocks32)  # [G, n, bs]
            amax_b = g.abs().amax(-1)  # [G, n]
            if self.candidates == "max":
                amax_b = amax_b.amax(-1, keepdim=True)  # [G, 1]
            ratio = (amax_b / elem.max_value).clamp(min=torch.finfo(torch.float32).tiny)
            mant = ratio / torch.exp2(torch.floor(torch.log2(ratio)))
            mant = _bf16_round_up(mant.clamp(1.0, 2.0))
            candidates = torch.cat([torch.ones_like(mant[:, :1]), mant], dim=1).T  # [1+n, G]
            # all candidates in one batched call: [C, G, n, bs]
            grid, _, scale = quantize_blocks(g.unsqueeze(0) / candidates[:, :, None, None], fmt, rule)
            eff = scale * candidates[:, :, None]  # [C, G, n]
            err = (grid * eff.unsqueeze(-1) - g.unsqueeze(0)).pow(2).sum((2, 3))  # [C, G]
            best = err.argmin(0)  # first minimum: plain MXFP4 wins ties
            pick = torch.arange(g.shape[0])
            return self._ungroup(grid[best, pick], info), self._ungroup(eff[best, pick], info)

        return quantize

    def cost(self) -> dict:
        return {"extra_bits_per_element": 16.0 / (32 * self.blocks * self.rows), "bf16_fraction": 0.0}


# --------------------------------------------------------------------------------------------
# Outlier fallback: outliers stay in BF16; the rest is quantized with the scale of what remains,
# so entries of the deadzone come back. Targets deadzone truncation.


@register("outlier_fallback")
@dataclass
class OutlierFallback(Correction):
    """``mode: element`` keeps the ``k`` largest magnitudes of every 32-block in BF16 (cost k/32 of
    the elements plus a 5-bit index each); ``mode: block`` keeps whole blocks in BF16: the
    ``fraction`` of blocks with the largest crest factor (amax / rms)."""

    mode: str = "element"
    k: int = 1
    fraction: float = 0.05

    def __post_init__(self):
        if self.mode not in ("element", "block"):
            raise ValueError(f"outlier_fallback mode must be one of: element, block; got {self.mode!r}")
        if not 0 <= self.k < 32:
            raise ValueError(f"outlier_fallback k must be in 0..31, got {self.k}")
        if not 0 <= self.fraction <= 1:
            raise ValueError(f"outlier_fallback fraction must be in [0, 1], got {self.fraction}")
        self._kept = [0, 0]  # elements kept in BF16, elements seen

    def outlier_mask(self, x: torch.Tensor, axis: int) -> torch.Tensor:
        axis = axis % x.dim()
        blocks = to_blocks(x, axis, 32).abs()
        if self.mode == "element":
            mask = torch.zeros_like(blocks, dtype=torch.bool)
            if self.k:
                idx = blocks.argmax(-1, keepdim=True) if self.k == 1 else blocks.topk(self.k, dim=-1).indices
                mask.scatter_(-1, idx, True)
        else:
            rms = blocks.pow(2).mean(-1).sqrt().clamp(min=torch.finfo(torch.float32).tiny)
            crest = blocks.amax(-1) / rms
            n_keep = int(round(self.fraction * crest.numel()))
            keep = torch.zeros(crest.numel(), dtype=torch.bool)
            if n_keep:
                keep[crest.flatten().topk(n_keep).indices] = True
            mask = keep.view(crest.shape).unsqueeze(-1).expand_as(blocks)
        return from_blocks(mask, x.shape, axis)

    def split(self, x, axis):
        """(outlier mask, x with the outliers zeroed); counts what it keeps for ``cost()``."""
        mask = self.outlier_mask(x, axis)
        self._kept[0] += int(mask.sum())
        self._kept[1] += mask.numel()
        return mask, torch.where(mask, torch.zeros_like(x), x)

    def cost(self) -> dict:
        seen = self._kept[1]
        nominal = self.k / 32 if self.mode == "element" else self.fraction
        frac = self._kept[0] / seen if seen else nominal
        index_bits = 5 if self.mode == "element" else 0
        return {"extra_bits_per_element": frac * (16 + index_bits), "bf16_fraction": frac}


# --------------------------------------------------------------------------------------------
# AQN: adaptive quantization noise (after QeRL) on RMSNorm weights of the rollout policy.
# Targets the entropy collapse that grid noise causes.


@register("aqn")
@dataclass
class AdaptiveQuantizationNoise(Correction):
    """Gaussian noise N(0, sigma^2) added to every RMSNorm weight while the policy generates rollouts.

    Schedule (QeRL): training is split into ``stages`` equal stages; stage 0 is noise-free and stage
    k >= 1 uses ``sigma_k = sigma_start * (sigma_end / sigma_start) ** ((k - 1) / (stages - 2))``
    (exponential decay; with two stages, stage 1 uses sigma_start).
    Adaptive mode (``adaptive: true``): after the noise-free stage, sigma moves multiplicatively,
    ``sigma <- clip(sigma * exp(gain * (target_entropy - entropy)), sigma_min, sigma_max)``, holding
    the policy entropy near ``target_entropy`` (the BF16 run's).
    Noise is drawn from a generator seeded by (seed, step): the same step gives the same noise.
    """

    sigma_start: float = 1e-2
    sigma_end: float = 5e-4
    stages: int = 4
    total_steps: int = 100
    adaptive: bool = False
    target_entropy: float | None = None
    gain: float = 2.0
    sigma_min: float = 1e-5
    sigma_max: float = 5e-2
    seed: int = 0

    def __post_init__(self):
        if self.stages < 2:
            raise ValueError(f"aqn needs stages >= 2 (stage 0 is noise-free), got {self.stages}")
        if self.total_steps < 1:
            raise ValueError(f"aqn needs total_steps >= 1, got {self.total_steps}")
        if self.adaptive and self.target_entropy is None:
            raise ValueError("aqn adaptive mode needs target_entropy (the BF16 run's mean entropy)")
        self._sigma = self.sigma_start
        self.last_sigma = 0.0

    def stage(self, step: int) -> int:
        return min(self.stages - 1, step * self.stages // self.total_steps)

    def scheduled_sigma(self, step: int) -> float:
        k = self.stage(step)
        if k == 0:
            return 0.0
        if self.stages == 2:
            return self.sigma_start
        return self.sigma_start * (self.sigma_end / self.sigma_start) ** ((k - 1) / (self.stages - 2))

    def sigma(self, step: int) -> float:
        if not self.adaptive or self.stage(step) == 0:
            return self.scheduled_sigma(step)
        return self._sigma

    def observe_entropy(self, entropy: float) -> None:
        """Adaptive mode: move sigma toward holding ``entropy`` at the target."""
        if self.adaptive:
            s = self._sigma * math.exp(self.gain * (self.target_entropy - entropy))
            self._sigma = min(self.sigma_max, max(self.sigma_min, s))

    @staticmethod
    def norm_weights(model) -> list[torch.nn.Parameter]:
        return [m.weight for m in model.modules() if type(m).__name__.endswith("RMSNorm") and getattr(m, "weight", None) is not None]

    @contextlib.contextmanager
    def rollout_context(self, model, step: int):
        sigma = self.sigma(step)
        self.last_sigma = sigma
        weights = self.norm_weights(model)
        if sigma == 0 or not weights:
            yield sigma
            return
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        saved = [w.detach().clone() for w in weights]
        with torch.no_grad():
            for w in weights:
                w.add_(torch.randn(w.shape, generator=g, dtype=torch.float32).to(w) * sigma)
        try:
            yield sigma
        finally:
            with torch.no_grad():
                for w, s in zip(weights, saved):
                    w.copy_(s)


# --------------------------------------------------------------------------------------------


class Quantizer:
    """A tensor quantizer: ``q(x, axis)`` fake-quantizes x with blocks along ``axis``, the
    corrections' hooks composed: high-precision elements split off first, the rest quantized by
    the correction's block quantizer (or the format's, through the dispatch)."""

    def __init__(self, fmt="mxfp4", scale_rule=None, corrections=()):
        self.fmt = get_format(fmt)
        self.scale_rule = self.fmt.check_scale_rule(scale_rule)
        self.corrections = list(corrections)
        custom = [q for c in self.corrections if (q := c.block_quantizer(self.fmt, self.scale_rule)) is not None]
        if len(custom) > 1:
            raise ValueError("at most one correction may replace the block quantizer (e.g. one macro_block)")
        self.block_quantizer = custom[0] if custom else None

    def _split(self, x, axis):
        mask = None
        for c in self.corrections:
            part = c.split(x, axis)
            if part is not None:
                mask = part[0] if mask is None else mask | part[0]
        if mask is None:
            return None, x
        return mask, torch.where(mask, torch.zeros_like(x), x)

    def __call__(self, x: torch.Tensor, axis: int) -> torch.Tensor:
        mask, rest = self._split(x, axis)
        if self.block_quantizer is None:
            q = dispatch.fake_quantize(rest, self.fmt, axis, self.scale_rule)
        else:
            ax = axis % x.dim()
            grid, scale = self.block_quantizer(to_blocks(rest, ax, self.fmt.block_size))
            q = from_blocks(grid * scale.unsqueeze(-1), x.shape, ax).to(x.dtype)
        if mask is None:
            return q
        return torch.where(mask, x.to(torch.bfloat16).to(x.dtype), q)

    def decompose(self, x: torch.Tensor, axis: int) -> Decomposition:
        """The decomposition of what this quantizer quantizes (high-precision elements excluded)."""
        mask, rest = self._split(x, axis)
        return decompose(rest, self.fmt, axis, self.scale_rule, block_quantizer=self.block_quantizer, exclude=mask)

    def cost(self) -> dict:
        total = {"extra_bits_per_element": 0.0, "bf16_fraction": 0.0}
        for c in self.corrections:
            for k, v in c.cost().items():
                total[k] = total.get(k, 0.0) + v
        return total

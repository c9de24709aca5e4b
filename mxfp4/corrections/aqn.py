"""AQN: adaptive quantization noise (after QeRL, arXiv 2510.11696) on the RMSNorm weights of the
rollout policy. Targets the entropy effect of grid noise."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from .base import Correction
from .registry import register


@register("aqn")
@dataclass
class AdaptiveQuantizationNoise(Correction):
    """Gaussian noise N(0, sigma^2) added to every RMSNorm weight while the policy generates rollouts.

    Defaults are QeRL's (sigma 1e-2 -> 1e-4 over 10 stages).
    Schedule (QeRL): training is split into ``stages`` equal stages; stage 0 is noise-free and stage
    k >= 1 uses ``sigma_k = sigma_start * (sigma_end / sigma_start) ** ((k - 1) / (stages - 2))``
    (exponential decay; with two stages, stage 1 uses sigma_start).
    Adaptive mode (``adaptive: true``): after the noise-free stage, sigma moves multiplicatively,
    ``sigma <- clip(sigma * exp(gain * (target_entropy - entropy)), sigma_min, sigma_max)``, holding
    the policy entropy near ``target_entropy`` (the BF16 run's).
    Noise is drawn from a generator seeded by (seed, step): the same step gives the same noise.

    Args:
        sigma_start, sigma_end: the schedule's first and last noise scale (> 0).
        stages: equal stages of the run (stage 0 noise-free).
        total_steps: the run's optimizer steps (``bind`` sets it from the cell).
        adaptive: steer sigma toward ``target_entropy`` instead of following the schedule.
        target_entropy: a number, or ``"bf16"``: the BF16 cell's mean entropy of the same model and seed.
        gain: the adaptive step's gain.
        sigma_min, sigma_max: the adaptive sigma's bounds.
        seed: the noise's seed (``bind`` sets the cell's).
    """

    # the paper's ties: the pathway it restores and its correction arm (it lowers no tensor statistic)
    pathway = "entropy"
    arm = "mxfp4+aqn"

    sigma_start: float = 1e-2
    sigma_end: float = 1e-4
    stages: int = 10
    total_steps: int = 100
    adaptive: bool = False
    target_entropy: float | str | None = None  # a number, or "bf16": the bf16 cell's mean entropy (same model, seed)
    gain: float = 2.0
    sigma_min: float = 1e-5
    sigma_max: float = 5e-2
    seed: int = 0

    def __post_init__(self):
        if not (self.sigma_start > 0 and self.sigma_end > 0):
            raise ValueError(f"aqn needs sigma_start > 0 and sigma_end > 0, got {self.sigma_start}, {self.sigma_end}")
        if not 0 < self.sigma_min <= self.sigma_max:
            raise ValueError(f"aqn needs 0 < sigma_min <= sigma_max, got sigma_min {self.sigma_min}, "
                             f"sigma_max {self.sigma_max}")
        if not self.gain > 0:
            raise ValueError(f"aqn needs gain > 0 (the adaptive step's size), got {self.gain}")
        if not isinstance(self.target_entropy, str | None) and not self.target_entropy >= 0:
            raise ValueError(
                f"aqn target_entropy must be >= 0 (an entropy in nats) or 'bf16', got {self.target_entropy}")
        if self.stages < 2:
            raise ValueError(f"aqn needs stages >= 2 (stage 0 is noise-free), got {self.stages}")
        if self.total_steps < 1:
            raise ValueError(f"aqn needs total_steps >= 1, got {self.total_steps}")
        if self.adaptive and self.target_entropy is None:
            raise ValueError("aqn adaptive mode needs target_entropy (a number, or bf16: the BF16 cell's mean entropy)")
        if isinstance(self.target_entropy, str) and self.target_entropy != "bf16":
            raise ValueError(f"aqn target_entropy must be a number or 'bf16', got {self.target_entropy!r}")
        self._sigma = self.sigma_start
        self.last_sigma = 0.0

    def kernel_terms(self) -> dict:
        return {}  # no numerics hook: the noise goes on the RMSNorm weights around the rollout

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

    def bind(self, total_steps: int, seed: int) -> None:
        """The schedule spans the run's ``total_steps``; the noise is drawn from ``seed``."""
        if total_steps < 1:
            raise ValueError(f"aqn needs total_steps >= 1, got {total_steps}")
        self.total_steps, self.seed = total_steps, seed

    @property
    def needs_reference(self) -> bool:
        """True when the target entropy is the BF16 cell's (``bind_reference`` must be called first)."""
        return self.target_entropy == "bf16"

    def bind_reference(self, reference: dict) -> None:
        """Take the target entropy from the BF16 cell's metrics (same model and seed)."""
        if self.needs_reference:
            entropy = reference.get("mean_entropy")
            if entropy is None:
                raise ValueError("aqn target_entropy: bf16, but the bf16 cell's metrics hold no mean_entropy")
            self.target_entropy = float(entropy)

    def observe(self, metrics: dict) -> None:
        """Adaptive mode: move sigma toward holding the step's ``entropy`` at the target."""
        entropy = metrics.get("entropy")
        if self.adaptive and entropy is not None:
            if self.needs_reference:
                raise ValueError("aqn target_entropy: bf16 was never bound to the bf16 cell's entropy (bind_reference)")
            s = self._sigma * math.exp(self.gain * (self.target_entropy - entropy))
            self._sigma = min(self.sigma_max, max(self.sigma_min, s))

    def metrics(self) -> dict:
        return {"aqn/sigma": self.last_sigma}

    def perturbs_rollout(self, step: int) -> bool:
        return self.sigma(step) > 0

    def state_dict(self) -> dict:
        return {"sigma": self._sigma, "last_sigma": self.last_sigma}

    def load_state_dict(self, state: dict) -> None:
        self._sigma, self.last_sigma = float(state["sigma"]), float(state["last_sigma"])

    @staticmethod
    def norm_weights(model) -> list[torch.nn.Parameter]:
        return [
            m.weight
            for m in model.modules()
            if type(m).__name__.endswith("RMSNorm") and getattr(m, "weight", None) is not None
        ]

    @contextlib.contextmanager
    def rollout_context(self, model, step: int):
        sigma = self.sigma(step)
        self.last_sigma = sigma
        weights = self.norm_weights(model)
        if sigma == 0 or not weights:
            yield sigma
            return
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)  # CPU draws: same noise on any device
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

"""The correction protocol: every hook the code calls on a correction, each declared on ``Correction``
with a default that changes nothing.

Numerics hooks (``block_quantizer``, ``fake_quantize``, ``rotation``, ``gemm_transform``, ``rounding_generator``,
``split``, ``blocks_per_group``, ``rows_per_group``) are composed by ``mxfp4.numerics.quantizer.Quantizer`` on every
quantized operand, told which operand (``Operand``: role, GEMM, layer) where the caller knows;
lifecycle hooks (``bind``, ``needs_reference`` / ``bind_reference``, ``rollout_context``,
``perturbs_rollout``, ``observe``, ``metrics``, ``state_dict`` / ``load_state_dict``) are called by the
GRPO cell, which never names a correction; ``cost()`` is always reported. Each method's docstring says
when it is called; docs/corrections.md shows them at work.
"""

from __future__ import annotations

import contextlib

import torch


class Correction:
    """Base class: a correction that changes nothing and costs nothing."""

    name = "none"
    # What the reports read off the class (``registry.paper_corrections``): the RL pathway the paper ties the
    # correction to (gradient, rollout, entropy), the recipe of its correction arm, the error statistic it is built
    # to lower with its label (``(stats key, label)``), and its parameter settings in the corrections table.
    pathway: str | None = None
    arm: str | None = None
    lowers: tuple[str, str] | None = None
    table_settings: tuple[dict, ...] = ()

    # numerics hooks -----------------------------------------------------------------------
    takes_operand = False  # True: the value hooks below are called with ``operand=`` (``Operand`` or None)

    def block_quantizer(self, fmt, rule):
        """``blocks -> (grid values, effective scale per block)``, or None to keep the format's. With
        ``takes_operand`` the function is called as ``f(blocks, operand=...)``: told which operand the blocks are
        of."""
        return None

    def quantizes_blocks_of(self, operand) -> bool:
        """Whether ``block_quantizer`` replaces the format's blocks of this operand (``Operand``: role, GEMM,
        layer; None without context): a correction of some operands only (2D weight scales) says False for the
        others, which the format quantizes as it would without it."""
        return True

    def fake_quantize(self, x: torch.Tensor, axis: int, fmt, rule, operand=None) -> torch.Tensor | None:
        """The values of ``block_quantizer`` for all of x, computed through the dispatch's fake-quantizations (used
        where the dispatch runs Triton); None: use the block path. ``operand`` only with ``takes_operand``."""
        return None

    rotates = False  # True: ``rotation`` may return a matrix (the quantizer's values are then not bf16 numbers)

    def rotation(self, operand, block_size: int, device) -> torch.Tensor | None:
        """An orthogonal [block_size, block_size] matrix R: every block b of this operand (``Operand``:
        role, GEMM, layer; None without context) is quantized as Q(b R) R^T, so that a GEMM whose two
        operands share R along its reduction axis equals the product of the rotated quantized operands.
        None: no rotation. Only with ``rotates = True``."""
        return None

    transforms_gemm = False  # True: ``gemm_transform`` may return a change of basis

    def gemm_transform(self, activation: torch.Tensor, weight: torch.Tensor, operand) -> torch.Tensor | None:
        """A change of basis of the forward GEMM ``activation . weight^T`` of the layer ``operand.layer``, along its
        contracted axis K, that leaves the product unchanged: a positive vector s [K] (the activation quantized as
        X / s, the weight as W * s) or an invertible [K, K] matrix T (X T^-1 and W T^T); None: none. Called at every
        forward of a patched Linear, before either operand is quantized, with both as they are now (detached,
        float32; the activation [..., K], the weight [N, K]); the weight's cached quantization is keyed on what it
        returns. The backward GEMMs contract other axes and are not transformed. Only with
        ``transforms_gemm = True``; docs/corrections.md shows the call order."""
        return None

    rounds_stochastically = False  # True: ``rounding_generator`` may return a generator

    def rounding_generator(self, operand, device) -> torch.Generator | None:
        """A generator whose draws round this operand's elements stochastically onto the grid (unbiased
        within it, ``reference.stochastic_round_to_grid``), or None for round-to-nearest. Only with
        ``rounds_stochastically = True``."""
        return None

    def split(self, x: torch.Tensor, axis: int, valid: torch.Tensor | None = None, operand=None):
        """(mask of elements kept in high precision, x with them zeroed), or None for none.
        ``valid`` (broadcastable to x) marks the real elements when x holds zero padding (grouped
        MoE experts), so that what a correction counts covers only those. ``operand``: which operand x is
        (``Operand`` or None), passed only with ``takes_operand``."""
        return None

    def kernel_terms(self) -> dict | None:
        """This correction's numerics in the terms the fused kernels compute, so that a quantizer whose
        corrections all have terms runs them in one kernel pass: ``{}`` (no numerics hook: it acts outside the
        quantizer), ``{"split": "block_max"}`` (each block's largest magnitude kept in bfloat16, ``split``'s
        values), ``{"macro_blocks": n}`` (macro-block scaling over n blocks, one row, the largest block's
        candidate). None (the default): no kernel computes it, and the quantizer composes its hooks."""
        return None

    def value_bits(self, fmt) -> int | None:
        """The most significant bits a value of this correction's ``block_quantizer`` has in ``fmt`` (a GEMM on
        its values is exact in TF32 where this is at most 11), or None where it is not known."""
        return None

    def record_split(self, kept: int, seen: int) -> None:
        """Told, where a fused kernel ran this correction's ``split`` (``kernel_terms``), how many elements
        it kept in high precision out of how many it saw: what ``split`` would have counted."""

    def blocks_per_group(self) -> int:
        """How many consecutive blocks along the blocked axis the correction treats together."""
        return 1

    def rows_per_group(self) -> int:
        """How many rows across the blocked axis the correction treats together (2D tiles)."""
        return 1

    # lifecycle hooks ----------------------------------------------------------------------
    def bind(self, total_steps: int, seed: int) -> None:
        """Called once before training with the number of optimizer steps and the cell's seed."""

    needs_reference = False  # True: call bind_reference with the bf16 cell's metrics before training

    def bind_reference(self, reference: dict) -> None:
        """Called before training with the bf16 cell's metrics.json when ``needs_reference``."""

    def rollout_context(self, model, step: int):
        """Wraps the policy's rollout generation at optimizer step ``step``."""
        return contextlib.nullcontext()

    def perturbs_rollout(self, step: int) -> bool:
        """True when ``rollout_context`` changes the policy at optimizer step ``step``."""
        return False

    def observe(self, metrics: dict) -> None:
        """Sees the metrics logged for each finished step (keys as in ``train_log.jsonl``)."""

    def state_dict(self) -> dict:
        """JSON-serialisable run state (what ``observe`` and the numerics hooks accumulate)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned (resuming from a checkpoint)."""

    def metrics(self) -> dict:
        """Metrics to log for the current step, e.g. ``{"aqn/sigma": 0.01}``."""
        return {}

    def cost(self) -> dict:
        return {"extra_bits_per_element": 0.0, "bf16_fraction": 0.0}


NUMERICS_HOOKS = ("split", "block_quantizer", "fake_quantize", "rotation", "gemm_transform", "rounding_generator")


def numerics_hooks(correction) -> list[str]:
    """The numerics hooks ``correction`` overrides (what the quantizer calls on it beyond the defaults that change
    nothing): what ``mxfp4 decompose --recipe`` lists, so the screen confirms a plugin ran."""
    return [h for h in NUMERICS_HOOKS if getattr(type(correction), h, None) is not getattr(Correction, h)]

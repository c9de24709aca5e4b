"""The recipe's quantizer: the one object that says how a GEMM operand is quantized.

``Quantizer(fmt, scale_rule, corrections, gemms=...)`` fake-quantizes a tensor along an axis with
the corrections' numerics hooks composed (high-precision elements split off first, the rest
quantized by a correction's block quantizer or the format's own, through the one dispatch), and
says which GEMMs of a linear layer it applies to. ``Recipe.quantizer()`` builds it; the model
patcher (``mxfp4.nn.patch_model``) takes it; ``decompose`` splits the error of exactly what it
quantizes. It calls only the hooks that ``mxfp4.corrections.base.Correction`` declares (the numerics
layer does not import the corrections).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from dataclasses import dataclass

import torch

from . import dispatch, fused_cpu, hooks
from .decompose import Decomposition, decompose
from .formats import get_format
from .hooks import HookError
from .reference import from_blocks, to_blocks
from .transform import GemmTransform, checked_transform, decomposition_back

GEMMS = ("forward", "input_grad", "weight_grad")
MODULE_KINDS = ("linear", "experts", "lm_head", "router")
DEFAULT_MODULES = ("linear", "experts")


def normalize_gemms(gemms: dict | None) -> dict[str, bool]:
    """Every GEMM named, as a bool (missing ones off); all on for None. Unknown names are an error."""
    if gemms is None:
        return dict.fromkeys(GEMMS, True)
    unknown = set(gemms) - set(GEMMS)
    if unknown:
        raise ValueError(f"unknown GEMM(s) {sorted(unknown)}; accepted: {', '.join(GEMMS)}")
    return {g: bool(gemms.get(g, False)) for g in GEMMS}


ROLES = ("weight", "activation", "grad")


@dataclass(frozen=True)
class Operand:
    """Which operand of which GEMM a quantization is for, and in which layer: what a correction's hooks
    are told, so a correction can act on some operands only (stochastic rounding of gradients, a
    rotation of the weight-gradient GEMM's operands). ``role``: weight, activation or grad; ``gemm``:
    forward (X W^T), input_grad (dY W) or weight_grad (dY^T X).

    Args:
        role: ``weight``, ``activation`` or ``grad``.
        gemm: ``forward``, ``input_grad`` or ``weight_grad``.
        layer: the module's name in the model ("" outside one).
    """

    role: str
    gemm: str
    layer: str = ""

    def __post_init__(self):
        if self.role not in ROLES or self.gemm not in GEMMS:
            raise ValueError(f"Operand(role={self.role!r}, gemm={self.gemm!r}); accepted: role one of "
                             f"{', '.join(ROLES)}, gemm one of {', '.join(GEMMS)}")


class Quantizer:
    """``q(x, axis)``: x fake-quantized with blocks along ``axis``.

    ``gemms``: which GEMMs of a patched layer quantize their operands (forward X.W^T, input grad
    dY.W, weight grad dY^T.X); all three by default. ``modules``: which module kinds a patched
    model quantizes (linear: every nn.Linear but lm_head; experts: fused MoE 3D weights; lm_head;
    router). ``name``: the recipe it came from (shown in the repr of patched modules).
    ``activations=False``: weight-only quantization (W4A16): only the weights of those GEMMs are
    quantized; on GPU a patched Linear then generates through the packed W4A16 kernel.

    Args:
        fmt: the block format's name (``mxfp4``, ``nvfp4``, ...) or a ``BlockFormat``.
        scale_rule: the E8M0 scale rule (``floor``, ``ceil``, ``even``, ``rceil``); None: the format's default.
        corrections: built corrections (``mxfp4.corrections.build``) whose numerics hooks it composes.
        gemms: {GEMM name: bool} of the GEMMs whose operands a patched layer quantizes; None: all three.
        modules: the module kinds a patched model quantizes (``MODULE_KINDS``).
        name: the recipe it came from, shown in the repr of patched modules.
        activations: False quantizes the weights only (W4A16).
        bf16_layers: decoder layers ``patch_model`` leaves unquantized: an object with ``kept(layers)`` returning
            their indices (``config.recipes.BF16Layers``); None: every layer quantized.
        rollout_activations: False: the policy generates (rollouts, evaluations) with its weights alone quantized
            (``nn.weights_only``) while it trains with activations and gradients quantized too.
    """

    def __init__(self, fmt="mxfp4", scale_rule=None, corrections=(), gemms=None, modules=DEFAULT_MODULES, name=None,
                 activations=True, bf16_layers=None, rollout_activations=True):
        self.fmt = get_format(fmt)
        self.rollout_activations = bool(rollout_activations)
        self.bf16_layers = bf16_layers
        self.activations = bool(activations)  # False: weight-only (W4A16), activations and gradients unquantized
        self.scale_rule = self.fmt.check_scale_rule(scale_rule)
        self.corrections = list(corrections)
        self.gemms = normalize_gemms(gemms)
        bad = [m for m in modules if m not in MODULE_KINDS]
        if bad:
            raise ValueError(f"unknown module kind(s) {bad}; accepted: {', '.join(MODULE_KINDS)}")
        self.modules = tuple(modules)
        self.name = name
        custom = [(c, q) for c in self.corrections
                  if (q := hooks.call(c, c.block_quantizer, self.fmt, self.scale_rule)) is not None]
        if len(custom) > 1:
            raise ValueError("at most one correction may replace the block quantizer (e.g. one macro_block)")
        self._block_owner, self.block_quantizer = custom[0] if custom else (None, None)
        self._rotating = [c for c in self.corrections if c.rotates]
        if len(self._rotating) > 1:
            raise ValueError("at most one correction may rotate the blocks (e.g. one hadamard)")
        transforming = [c for c in self.corrections if c.transforms_gemm]
        if len(transforming) > 1 or (transforming and self._rotating):
            raise ValueError("at most one correction may change a GEMM's basis (one gemm_transform, no rotation "
                             "beside it)")
        self._transforming = transforming[0] if transforming else None
        rounding = [c for c in self.corrections if c.rounds_stochastically]
        if len(rounding) > 1 or (rounding and self._block_owner is not None):
            raise ValueError("stochastic rounding replaces the element rounding: it takes no second rounding "
                             "correction and no block-replacing one (macro_block)")
        self._rounding = rounding[0] if rounding else None
        self._kernel_terms = self._merged_kernel_terms()
        self._splitters = [c for c in self.corrections if "split" in (c.kernel_terms() or {})]  # told what is kept
        self._repeatable = self._rounding is None and not self._rotating and self._transforming is None and all(
            c.kernel_terms() is not None for c in self.corrections)
        self._kernel_strides: dict = {}
        self._stride_probe: Quantizer | None = None
        self._checked_rotation = hooks.RotationCheck()

    @property
    def weights_only_rollouts(self) -> bool:
        """Whether the policy generates with its weights alone quantized while it trains with activations quantized
        too (a weight-only recipe generates as it trains: nothing to switch)."""
        return self.activations and not self.rollout_activations

    @property
    def transforms_gemm(self) -> bool:
        """Whether a correction changes each forward GEMM's basis from its two operands (``gemm_transform``)."""
        return self._transforming is not None

    def gemm_transform(self, activation: torch.Tensor, weight: torch.Tensor, layer: str = ""
                       ) -> GemmTransform | None:
        """The transforming correction's change of basis for the forward GEMM ``activation . weight^T`` of
        ``layer`` (checked: ``transform.checked_transform``), computed from both operands as they are now; None
        without one. The operands are detached float32 copies: a correction's statistics never reach autograd."""
        c = self._transforming
        if c is None:
            return None
        with torch.no_grad():
            a, w = activation.detach().float(), weight.detach().float()
            out = hooks.call(c, c.gemm_transform, a, w, Operand("activation", "forward", layer))
        return checked_transform(c, out, weight.shape[-1], weight.device)

    @property
    def plain(self) -> bool:
        """Plain MXFP4 (no correction, no component injection): what the fused Triton paths compute."""
        return not self.corrections and self.fmt.name == "mxfp4"

    @property
    def exact_in_bf16(self) -> bool:
        """Every value this quantizer returns is a bfloat16 number (MX elements times a power-of-two
        scale, high-precision elements rounded to BF16), so a bf16 GEMM on them is exact; not so with
        a per-tensor FP32 scale (NVFP4), a BF16 mantissa on the block scale (macro-block) or a rotation
        (the rotated-back values) or a GEMM transform (a matrix's mapped-back values). Stochastic rounding lands on
        the grid: exact."""
        return (not self.fmt.tensor_scale and self.block_quantizer is None and not self._rotating
                and self._transforming is None)

    @property
    def exact_in_tf32(self) -> bool:
        """Every value this quantizer returns has at most 11 significant bits (TF32's), so a GEMM on them with
        TF32 inputs and float32 accumulation multiplies them exactly: the bf16-exact values, and a block-replacing
        correction's whose ``value_bits`` say so (macro-block scaling of MXFP4: 2 + 8 bits), without a
        per-tensor scale or a rotation."""
        if self.exact_in_bf16:
            return True
        if self.fmt.tensor_scale or self._rotating or self._transforming is not None or self._block_owner is None:
            return False
        bits = self._block_owner.value_bits(self.fmt)
        return bits is not None and bits <= 11

    def widened(self, x: torch.Tensor) -> torch.Tensor:
        """x as this quantizer must read it: a 16-bit x in float32 when its results are not all bf16
        numbers (macro-block, NVFP4, component injection), so they are never rounded back to 16 bits
        (under bf16 autocast, o_proj and down_proj receive bf16 inputs); x itself otherwise."""
        if self.exact_in_bf16 or x.dtype in (torch.float32, torch.float64):
            return x
        return x.float()

    def token_alignment(self) -> int:
        """Rows along a blocked axis that one quantization group spans (the block size, times the
        blocks a correction groups): segments aligned to it never share a block or a group."""
        return self.fmt.block_size * math.lcm(1, *[c.blocks_per_group() for c in self.corrections])

    def row_alignment(self) -> int:
        """Rows across the blocked axis that one quantization group spans (a 2D macro-block tile's rows)."""
        return math.lcm(1, *[c.rows_per_group() for c in self.corrections])

    def __repr__(self) -> str:
        corr = ", ".join(c.name for c in self.corrections) or "none"
        on = ",".join(g for g, v in self.gemms.items() if v) or "none"
        label = f"recipe={self.name}, " if self.name else ""
        weights_only = "" if self.activations else ", weights only"
        weights_only += ", W4A16 rollouts" if self.weights_only_rollouts else ""
        return (f"Quantizer({label}format={self.fmt.name}, scale_rule={self.scale_rule}, corrections=[{corr}], "
                f"gemms={on}{weights_only})")

    def _merged_kernel_terms(self) -> dict | None:
        """The corrections' ``kernel_terms`` merged, where every one has terms and together they split or
        group blocks (what the fused CPU kernel for corrections computes); None otherwise."""
        terms: dict = {}
        for c in self.corrections:
            t = c.kernel_terms()
            if t is None:
                return None
            terms.update(t)
        if terms.get("split", "block_max") != "block_max" or not terms or self.fmt.scale != "e8m0":
            return None
        if self.fmt.block_size * terms.get("macro_blocks", 1) > fused_cpu.LANE_SPAN:
            return None
        return terms

    def _fused_corrected(self, x: torch.Tensor, axis: int, valid) -> torch.Tensor | None:
        """The corrections' values from one pass of a fused kernel (the C++ one on CPU, Triton on CUDA), laid out
        as the torch composition lays them out, where it applies (kernel terms for every correction, the fused
        corrections switched on (``dispatch.use_fused_corrections``), with a padding mask no split to count);
        None otherwise or where x is not finite (the torch path then runs)."""
        terms = self._kernel_terms
        if (terms is None or not dispatch.fused_corrections_enabled() or not x.numel()
                or (valid is not None and "split" in terms)):  # the split counts valid elements only: its mask
            return None
        backend = dispatch.backend_for(x, self.fmt)
        if backend == "fused" and x.dtype != torch.float32:
            return None
        ax = axis % x.dim()
        key = (backend, tuple(x.shape), x.stride(), x.dtype, ax)
        strides = self._kernel_strides.get(key)
        if strides is None:
            if backend not in ("fused", "triton"):
                return None
            if len(self._kernel_strides) >= 4096:  # token counts vary step by step: keep the cache bounded
                self._kernel_strides.clear()
            strides = self._kernel_strides[key] = self._composed_strides(x, ax, backend)
        split = "split" in terms
        out = dispatch.fake_quantize_corrected(x, self.fmt, ax, self.scale_rule, split, terms.get("macro_blocks", 0),
                                               strides)
        if out is not None and split:
            self.repeat_counts(x, ax)
        return out

    @property
    def repeatable(self) -> bool:
        """The same x along the same axis gives the same values, whatever the operand, and changes no state but the
        split counts ``repeat_counts`` records: no random stream, no rotation, every correction in kernel terms
        (outlier fallback's one element a block, macro-block scaling of one row, AQN). A patched model then
        quantizes an input that several layers read once (``nn.linear.InputMemo``). Fixed at construction, as the
        corrections are: asked at every activation's quantization."""
        return self._repeatable

    def repeat_counts(self, x: torch.Tensor, axis: int) -> None:
        """Record in each splitting correction what quantizing x along ``axis`` keeps (one element a block, the
        kernel terms' split), as a call on x records it."""
        if not self._splitters or not x.numel():
            return
        ax = axis % x.dim()
        kept = x.numel() // x.shape[ax] * -(-x.shape[ax] // self.fmt.block_size)
        for c in self._splitters:
            c.record_split(kept, x.numel())

    def _composed_strides(self, x: torch.Tensor, axis: int, backend: str) -> tuple:
        """The strides of the torch composition's result on ``backend`` for an x of this shape and strides: the
        composition run on a meta tensor (no data, the same stride rules; the hooks' torch paths, the plain
        kernel's layout) by a quantizer of fresh copies of the corrections, whose counts are their own."""
        if self._stride_probe is None:
            fresh = [dataclasses.replace(c) if dataclasses.is_dataclass(c) else copy.deepcopy(c)
                     for c in self.corrections]
            self._stride_probe = Quantizer(self.fmt, self.scale_rule, fresh)
        fmt, rule = self.fmt, self.scale_rule
        meta = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        with dispatch.use_backend("reference"):
            return self._stride_probe._compose(meta, axis, None, None, lambda r: torch.empty_strided(
                r.shape, dispatch.plain_output_strides(r, axis, fmt, rule, backend), dtype=r.dtype,
                device="meta")).stride()

    def _split(self, x, axis, valid=None, operand=None):
        mask = None
        for c in self.corrections:
            part = hooks.checked_split(c, hooks.call(c, c.split, x, axis, valid=valid,
                                                     **hooks.operand_kwargs(c, operand)), x)
            if part is not None:
                mask = part[0] if mask is None else mask | part[0]
        if mask is None:
            return None, x
        return mask, torch.where(mask, torch.zeros_like(x), x)

    def __call__(self, x: torch.Tensor, axis: int, valid: torch.Tensor | None = None,
                 operand: Operand | None = None, transform: GemmTransform | None = None) -> torch.Tensor:
        """``valid`` (broadcastable to x): the real elements when x holds padding (grouped experts);
        padding must be zeros and only changes what corrections count. ``operand``: which operand of
        which GEMM x is (None: no context; a correction then acts as on any operand). ``transform``: the forward
        GEMM's change of basis (``gemm_transform``): x is quantized in the transformed basis and mapped back. The
        result has x's dtype, or float32 for a 16-bit x when the quantizer's values need it (``widened``)."""
        x = self.widened(x)
        if transform is not None:
            role = _transform_role(operand, axis, x)
            return transform.back(self(transform.into(x, role), axis, valid, operand), role)
        rotation = self._rotation(x, operand)
        if rotation is None:
            return self._quantize(x, axis, valid, operand)
        return self._in_rotated_basis(x, axis, valid, rotation, lambda r, v: self._quantize(r, -1, v, operand))

    def _quantize(self, x: torch.Tensor, axis: int, valid, operand) -> torch.Tensor:
        fused = self._fused_corrected(x, axis, valid)
        if fused is not None:
            return fused
        return self._compose(x, axis, valid, operand, lambda r: dispatch.fake_quantize(r, self.fmt, axis,
                                                                                       self.scale_rule))

    def _compose(self, x: torch.Tensor, axis: int, valid, operand, plain) -> torch.Tensor:
        """The corrections' hooks composed: high-precision elements split off, the rest rounded
        stochastically, by the block-replacing correction or by ``plain``, the split elements put back."""
        mask, rest = self._split(x, axis, valid, operand)
        generator = self._generator(x, operand)
        if generator is not None:
            q = dispatch.fake_quantize_stochastic(rest, self.fmt, axis, self.scale_rule, generator)
        elif self._replaces_blocks(operand):
            q = self._block_quantize(rest, axis, operand)
        else:
            q = plain(rest)
        if mask is None:
            return q
        return torch.where(mask, x.to(torch.bfloat16).to(x.dtype), q)

    def _replaces_blocks(self, operand) -> bool:
        """Whether the block-replacing correction quantizes this operand's blocks (else the format does)."""
        owner = self._block_owner
        return owner is not None and hooks.predicate(owner.quantizes_blocks_of, operand)

    def _rotation(self, x: torch.Tensor, operand) -> torch.Tensor | None:
        """The rotating correction's orthogonal [block, block] matrix for this operand, or None."""
        if not self._rotating:
            return None
        c = self._rotating[0]
        return self._checked_rotation(c, hooks.call(c, c.rotation, operand, self.fmt.block_size, x.device),
                                      self.fmt.block_size)

    def _generator(self, x: torch.Tensor, operand) -> torch.Generator | None:
        """The stochastic-rounding correction's random stream for this operand, or None (nearest)."""
        if self._rounding is None:
            return None
        c = self._rounding
        return hooks.checked_generator(c, hooks.call(c, c.rounding_generator, operand, x.device))

    def _in_rotated_basis(self, x, axis, valid, rotation, quantize, inverse: bool = True):
        """``quantize`` applied to x's blocks along ``axis`` rotated by ``rotation`` (each zero-padded
        block times the matrix, laid out along the last axis, with ``valid`` laid out alike), then
        rotated back and cropped when ``inverse``; else the rotated result as is (decomposition)."""
        ax = axis % x.dim()
        bs = self.fmt.block_size
        r = rotation.to(torch.float64)  # both rotations in float64, each result rounded once to x's dtype
        blocks = (to_blocks(x, ax, bs, torch.float64) @ r).to(x.dtype)
        v = None if valid is None else to_blocks(valid.expand_as(x).float(), ax, bs).flatten(-2) > 0
        out = quantize(blocks.flatten(-2), v)
        if not inverse:
            return out
        return from_blocks(out.to(torch.float64).unflatten(-1, (-1, bs)) @ r.T, x.shape, ax).to(x.dtype)

    def _block_quantize(self, x: torch.Tensor, axis: int, operand=None) -> torch.Tensor:
        """x through the block-replacing correction: where the dispatch runs a kernel (Triton, the fused
        CPU one) and the correction has a path through it (its ``fake_quantize``), that path; else the
        reference block path (identical values)."""
        owner = self._block_owner
        if dispatch.backend_for(x, self.fmt) != "reference":
            q = hooks.call(owner, owner.fake_quantize, x, axis, self.fmt, self.scale_rule,
                           **hooks.operand_kwargs(owner, operand))
            if q is not None:
                return hooks.checked_values(owner, "fake_quantize", q, x)
        blocks = to_blocks(x, axis % x.dim(), self.fmt.block_size)
        grid, scale = self._checked_blocks(blocks, operand)
        return from_blocks(grid * scale.unsqueeze(-1), x.shape, axis % x.dim()).to(x.dtype)

    def _checked_blocks(self, blocks: torch.Tensor, operand=None):
        """The block-replacing correction's (grid values, scales) of ``blocks``: what it raises, or a return of the
        wrong kind, shape or with non-finite values, one ``HookError`` naming the correction and the hook (the same
        check for a quantization and for a decomposition)."""
        owner = self._block_owner
        try:
            out = self.block_quantizer(blocks, **hooks.operand_kwargs(owner, operand))
        except HookError:
            raise
        except Exception as err:  # noqa: BLE001 - named, with its cause chained
            raise HookError.of(owner, "block_quantizer", err) from err
        if not isinstance(out, tuple | list) or len(out) != 2:
            raise HookError.says(owner, "block_quantizer", f"returned {type(out).__name__}; expected (grid values, "
                                                           "scales)")
        return hooks.checked_block_values(owner, *out, blocks)

    def decompose(self, x: torch.Tensor, axis: int, valid: torch.Tensor | None = None,
                  form: str = "canonical", operand: Operand | None = None,
                  transform: GemmTransform | None = None) -> Decomposition:
        """The decomposition (of ``form``) of what this quantizer quantizes, in the basis it quantizes
        in: a rotating correction's rotated blocks (laid out along the last axis: a rotation keeps every energy),
        a GEMM transform's transformed operand (``transform``, the one ``gemm_transform`` gave the step), taken
        there and mapped back to the operand's own basis (``transform.decomposition_back``: the energies are
        those of the error the GEMM really sees, without Shapley values), high-precision elements and, with
        ``valid``, padding excluded. Stochastic rounding is not decomposed: the grid component is that of
        round-to-nearest."""
        if transform is not None:
            role = _transform_role(operand, axis, x)
            return decomposition_back(self.decompose(transform.into(x, role), axis, valid, form, operand), transform,
                                      role)
        rotation = self._rotation(x, operand)
        if rotation is not None:
            return self._in_rotated_basis(x, axis, valid, rotation,
                                          lambda r, v: self._decompose(r, -1, v, form, operand), inverse=False)
        return self._decompose(x, axis, valid, form, operand)

    def _decompose(self, x: torch.Tensor, axis: int, valid, form: str, operand=None) -> Decomposition:
        mask, rest = self._split(x, axis, valid, operand)
        if valid is not None:
            pad = ~valid.expand_as(x)
            mask = pad if mask is None else mask | pad
            rest = torch.where(pad, torch.zeros_like(rest), rest)
        blocks = functools.partial(self._checked_blocks, operand=operand) if self._replaces_blocks(operand) else None
        return decompose(rest, self.fmt, axis, self.scale_rule, block_quantizer=blocks, exclude=mask,
                         form=form)

    def fused_stats(self, x: torch.Tensor, axis: int) -> dict | None:
        """The decomposition energies and counts of ``x`` from the fused Triton kernel (float32
        arithmetic, 0-dim device tensors, no host sync) where it applies: a tensor the dispatch
        sends to Triton (CUDA), MXFP4, no correction. None otherwise (use ``decompose``)."""
        if not self.plain:
            return None
        return dispatch.fused_stats(x, self.fmt, axis, self.scale_rule)

    def cost(self) -> dict:
        total = {"extra_bits_per_element": 0.0, "bf16_fraction": 0.0}
        for c in self.corrections:
            for k, v in hooks.lifecycle(c.cost).items():
                total[k] = total.get(k, 0.0) + v
        return total


def _transform_role(operand: Operand | None, axis: int, x: torch.Tensor) -> str:
    """The side of a GEMM transform x is on: a forward GEMM's activation or weight, blocked along the contracted
    (last) axis; anything else is refused (the transform is the forward GEMM's)."""
    if operand is None or operand.gemm != "forward" or operand.role == "grad" or axis % x.dim() != x.dim() - 1:
        raise ValueError(f"a GEMM transform applies to the forward GEMM's activation and weight along their "
                         f"contracted (last) axis; got {operand} along axis {axis}")
    return operand.role

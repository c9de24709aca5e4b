"""A correction's hooks called at the boundary: what a hook raises or returns against its protocol becomes one
``HookError`` naming the correction, the hook and what was expected.

A plugin is outside input. Shapes, dtypes and protocol types are checked on every call (host-side facts,
free); finiteness needs a device read, so it is checked for every call of a plugin's hooks and not on the
hot path of the built-in corrections, whose values the test suite holds bit-exact. A rotation is checked
once per matrix: a correction that caches its matrices pays for the check once.
"""

from __future__ import annotations

import contextlib
import json
import math
import weakref

import torch

ORTHOGONALITY_TOLERANCE = 1e-4  # max |R R^T - I|: a float32-rounded orthogonal matrix passes, 2*I does not


class HookError(ValueError):
    """A correction's hook raised or returned what its protocol does not allow: the message names the
    correction, its class and the hook (a raised exception is its ``__cause__``; ``MXFP4_TRACEBACK=1``
    makes the CLI print it)."""

    @classmethod
    def of(cls, correction, hook: str, err: BaseException) -> HookError:
        return cls.says(correction, hook, f"{type(err).__name__}: {err}", failed=True)

    @classmethod
    def says(cls, correction, hook: str, what: str, failed: bool = False) -> HookError:
        where = f"{type(correction).__module__}.{type(correction).__qualname__}"
        verb = "failed in" if failed else "broke the protocol of"
        return cls(f"correction {correction.name!r} ({where}) {verb} its {hook} hook: {what}")


def is_plugin(correction) -> bool:
    """A correction defined outside this package: its outputs are checked for finiteness too."""
    return not type(correction).__module__.startswith("mxfp4.")


def call(correction, hook, *args, **kwargs):
    """``hook(*args, **kwargs)``, a hook of ``correction`` (``correction.split``, say), whatever it raises named
    (``HookError``)."""
    try:
        return hook(*args, **kwargs)
    except HookError:
        raise
    except Exception as err:  # noqa: BLE001 - named, with its cause chained
        raise HookError.of(correction, _name(hook), err) from err


def operand_kwargs(correction, operand) -> dict:
    """``{"operand": operand}`` for a correction that declares ``takes_operand``, else nothing: its value hooks
    (``split``, ``fake_quantize``, the function ``block_quantizer`` returns) are told which operand they quantize
    when they say they take it."""
    return {"operand": operand} if correction.takes_operand else {}


def _name(hook) -> str:
    return getattr(hook, "__name__", "hook")


def _finite_where(out: torch.Tensor, x: torch.Tensor) -> bool:
    """Every element of ``out`` finite where ``x`` is (a non-finite input may give a non-finite output); a meta
    tensor (the layout probe) has no values to check."""
    if out.is_meta or x.is_meta:
        return True
    return bool((torch.isfinite(out) | ~torch.isfinite(x)).all())


def checked_values(correction, hook: str, out, x: torch.Tensor) -> torch.Tensor:
    """A hook's fake-quantized values for ``x``: a tensor of x's shape, floating, finite where x is (plugins)."""
    if not isinstance(out, torch.Tensor):
        raise HookError.says(correction, hook, f"returned {type(out).__name__}; expected a tensor of shape "
                                               f"{tuple(x.shape)} (or None)")
    if out.shape != x.shape or not out.is_floating_point():
        raise HookError.says(correction, hook, f"returned a {out.dtype} tensor of shape {tuple(out.shape)}; expected "
                                               f"a floating tensor of x's shape {tuple(x.shape)}")
    if is_plugin(correction) and not _finite_where(out, x):
        raise HookError.says(correction, hook, "returned non-finite values for finite inputs")
    return out


def checked_split(correction, part, x: torch.Tensor):
    """``split``'s return: None, or (bool mask of x's shape, x with those elements zeroed: x's shape and dtype)."""
    if part is None:
        return None
    expected = f"None or (a bool mask of shape {tuple(x.shape)}, the rest: a {x.dtype} tensor of that shape)"
    if not isinstance(part, tuple | list) or len(part) != 2:
        raise HookError.says(correction, "split", f"returned {type(part).__name__}; expected {expected}")
    mask, rest = part
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != x.shape:
        got = f"a {mask.dtype} mask of shape {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else \
            type(mask).__name__
        raise HookError.says(correction, "split", f"returned {got}; expected {expected}")
    if not isinstance(rest, torch.Tensor) or rest.shape != x.shape or rest.dtype != x.dtype:
        got = f"a {rest.dtype} rest of shape {tuple(rest.shape)}" if isinstance(rest, torch.Tensor) else \
            type(rest).__name__
        raise HookError.says(correction, "split", f"returned {got}; expected {expected}")
    if is_plugin(correction) and not _finite_where(rest, x):
        raise HookError.says(correction, "split", "returned a rest with non-finite values for finite inputs")
    return mask, rest


def checked_block_values(correction, grid, scale, blocks: torch.Tensor):
    """``block_quantizer``'s (grid values [..., block], effective scale [...]) for ``blocks``: tensors of those
    shapes, floating, finite where the blocks are (the check is on the host path only: the reference backend)."""
    expected = f"(grid values of shape {tuple(blocks.shape)}, scales of shape {tuple(blocks.shape[:-1])})"
    for name, t, shape in (("grid values", grid, blocks.shape), ("scales", scale, blocks.shape[:-1])):
        if not isinstance(t, torch.Tensor) or t.shape != shape or not t.is_floating_point():
            got = f"{t.dtype} {name} of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise HookError.says(correction, "block_quantizer", f"returned {got}; expected {expected}")
    if blocks.is_meta:  # the layout probe: no values to check
        return grid, scale
    finite_blocks = torch.isfinite(blocks).all(-1)
    if not bool((torch.isfinite(scale) | ~finite_blocks).all()) or not _finite_where(grid, blocks):
        raise HookError.says(correction, "block_quantizer", "returned non-finite grid values or scales for finite "
                                                            "blocks")
    return grid, scale


class RotationCheck:
    """Each rotation matrix checked once (kept by weak reference: a freed matrix is forgotten, so a new one at its
    address is checked again)."""

    def __init__(self):
        self._seen: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def __call__(self, correction, r, block_size: int):
        if r is None:
            return None
        if not isinstance(r, torch.Tensor) or r.shape != (block_size, block_size) or not r.is_floating_point():
            got = f"a {r.dtype} matrix of shape {tuple(r.shape)}" if isinstance(r, torch.Tensor) else type(r).__name__
            raise HookError.says(correction, "rotation", f"returned {got}; expected None or an orthogonal floating "
                                                         f"[{block_size}, {block_size}] matrix")
        if self._seen.get(id(r)) is r:
            return r
        r64 = r.detach().to(torch.float64)
        eye = torch.eye(block_size, dtype=torch.float64, device=r.device)
        err = float((r64 @ r64.T - eye).abs().max())
        if not math.isfinite(err) or err > ORTHOGONALITY_TOLERANCE:
            raise HookError.says(correction, "rotation", f"returned a matrix that is not orthogonal (max |R R^T - I| "
                                                         f"= {err:.3g}; tolerance {ORTHOGONALITY_TOLERANCE:g})")
        self._seen[id(r)] = r
        return r


def checked_generator(correction, g):
    """``rounding_generator``'s return: None or a ``torch.Generator``."""
    if g is not None and not isinstance(g, torch.Generator):
        raise HookError.says(correction, "rounding_generator", f"returned {type(g).__name__}; expected None or a "
                                                               "torch.Generator")
    return g


# lifecycle hooks: what each must return ------------------------------------------------------------------------


def _none(value) -> str | None:
    return None if value is None else f"returned {type(value).__name__}; expected None"


def _bool(value) -> str | None:
    return None if isinstance(value, bool) else f"returned {type(value).__name__}; expected a bool"


def _metric_values(value) -> str | None:
    if not isinstance(value, dict):
        return f"returned {type(value).__name__}; expected a dict of metric name to number"
    for k, v in value.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int | float):
            return f"returned {{{k!r}: {v!r}}}; expected string keys and numbers"
        if not math.isfinite(v):
            return f"returned {k!r} = {v}; expected finite numbers"
    return None


def _state(value) -> str | None:
    if not isinstance(value, dict):
        return f"returned {type(value).__name__}; expected a JSON-serialisable dict"
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as err:
        return f"returned a dict that is not JSON-serialisable ({err})"
    return None


def _context(value) -> str | None:
    if isinstance(value, contextlib.AbstractContextManager) or (hasattr(value, "__enter__") and
                                                                  hasattr(value, "__exit__")):
        return None
    return f"returned {type(value).__name__}; expected a context manager"


def _cost(value) -> str | None:
    if not isinstance(value, dict) or not {"extra_bits_per_element", "bf16_fraction"} <= set(value):
        return (f"returned {type(value).__name__ if not isinstance(value, dict) else sorted(value)}; expected a dict "
                "with extra_bits_per_element and bf16_fraction")
    return _metric_values(value)


LIFECYCLE = {"bind": _none, "bind_reference": _none, "observe": _none, "load_state_dict": _none,
             "metrics": _metric_values, "state_dict": _state, "rollout_context": _context, "perturbs_rollout": _bool,
             "cost": _cost}


def predicate(hook, *args):
    """A correction's yes-or-no numerics hook called (``c.quantizes_blocks_of``, say): what it raises, or a return
    that is not a bool, is one ``HookError`` naming the correction and the hook."""
    correction, name = hook.__self__, _name(hook)
    value = call(correction, hook, *args)
    problem = _bool(value)
    if problem is not None:
        raise HookError.says(correction, name, problem)
    return value


def lifecycle(hook, *args, **kwargs):
    """A correction's lifecycle hook called (``c.metrics``, say; ``LIFECYCLE`` says what it must return): what it
    raises or wrongly returns is one ``HookError`` naming the correction and the hook."""
    correction, name = hook.__self__, _name(hook)
    value = call(correction, hook, *args, **kwargs)
    problem = LIFECYCLE[name](value)
    if problem is not None:
        raise HookError.says(correction, name, problem)
    return value

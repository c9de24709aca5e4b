"""A CPU-runnable check that quantizers and corrections make every tensor on their input's device.

On a GPU, an op that meets a CUDA input and a tensor made on the CPU (``torch.tensor(inf)`` without
``device=``, a code table kept on the CPU, a mask built on the CPU and indexed with CUDA indices)
fails, or silently copies. Such bugs hide on CPU-only machines, where every tensor is a CPU tensor;
and the ``meta`` device alone does not find them all (0-dim CPU operands are accepted there, and
data-dependent ops cannot run).

The method in full: docs/methods.md, ``mxfp4.verify.device_audit``."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

ELSEWHERE = torch.device("meta")
_CROSS_DEVICE_COPIES = {torch.ops.aten.copy_.default, torch.ops.aten._to_copy.default}


class DeviceLeak(RuntimeError):
    """An op mixed a tensor on the input's device with a tensor made on the CPU."""


class Elsewhere(torch.Tensor):
    """CPU values posing as a tensor on another device (``.device`` is ``meta``)."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        out = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.shape,
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            device=ELSEWHERE,
            requires_grad=elem.requires_grad,
        )
        out.elem = elem
        return out

    def __repr__(self):
        return f"Elsewhere({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # only reached outside DeviceAudit
        raise RuntimeError(f"Elsewhere tensors work only under DeviceAudit (got {func})")


def _unwrap(x):
    return x.elem if isinstance(x, Elsewhere) else x


def _wrap(x):
    return Elsewhere(x) if isinstance(x, torch.Tensor) and not isinstance(x, Elsewhere) else x


class DeviceAudit(TorchDispatchMode):
    """Raises ``DeviceLeak`` when an op mixes ``Elsewhere`` tensors with plain CPU tensors."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        leaves, _ = tree_flatten((args, kwargs))
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        on_device = any(isinstance(t, Elsewhere) for t in tensors)
        on_cpu = [t for t in tensors if not isinstance(t, Elsewhere)]
        if on_device and on_cpu and func not in _CROSS_DEVICE_COPIES:
            shapes = ", ".join(str(tuple(t.shape)) for t in on_cpu)
            raise DeviceLeak(
                f"{func} mixes a tensor on the input's device with CPU tensor(s) of shape {shapes}: make "
                "them with device=<input>.device (or .to(<input>))"
            )
        to_device = kwargs.get("device") == ELSEWHERE
        if to_device:
            kwargs["device"] = torch.device("cpu")
        elif func is torch.ops.aten._to_copy.default and kwargs.get("device") is not None:
            on_device = False  # an explicit copy off the device: a plain CPU tensor, as .cpu() gives
        out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
        if func is torch.ops.aten.copy_.default and isinstance(args[0], Elsewhere):
            return args[0]
        return tree_map(_wrap, out) if (on_device or to_device) else out


def audit_devices(fn, *tensors: torch.Tensor):
    """``fn(*tensors)`` with every input posing as a tensor on another device; raises ``DeviceLeak``
    on the first op that mixes it with a tensor made on the CPU. Returns fn's result with its
    tensors as plain CPU tensors."""
    with DeviceAudit():
        out = fn(*(Elsewhere(t.detach().cpu()) for t in tensors))
        return tree_map(lambda x: x.elem if isinstance(x, Elsewhere) else x, out)

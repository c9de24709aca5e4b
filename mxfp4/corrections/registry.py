"""The correction registry: built-in corrections, entry points and ``$MXFP4_PLUGINS`` modules."""

from __future__ import annotations

import importlib
import os
from importlib.metadata import entry_points

from .base import Correction

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
        try:
            importlib.import_module(module.strip())
        except ImportError as err:
            raise ValueError(
                f"MXFP4_PLUGINS names {module.strip()!r}, which does not import ({err}); "
                "accepted: importable module paths, comma-separated (PYTHONPATH=. for local files)"
            ) from None
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

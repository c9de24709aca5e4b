"""The correction registry: built-in corrections, entry points and ``$MXFP4_PLUGINS`` modules."""

from __future__ import annotations

import dataclasses
import functools
import typing
from importlib.metadata import entry_points

import pydantic

from ..plugins import import_plugins
from ..stats import first_non_finite
from .base import Correction

REGISTRY: dict[str, type] = {}
ENTRY_POINT_GROUP = "mxfp4.corrections"


def register(name: str):
    """Class decorator: make a correction available to recipes under ``name``.

    Args:
        name: the name recipes give it (``corrections: [{name: ..., **parameters}]``); one class a name.
    """

    def deco(cls):
        if not (isinstance(cls, type) and issubclass(cls, Correction)):
            raise ValueError(f"correction {name!r}: {getattr(cls, '__qualname__', cls)!r} is not a subclass of "
                             "mxfp4.corrections.Correction; accepted: class Mine(Correction) (its hooks' defaults "
                             "change nothing)")
        held = REGISTRY.get(name)
        if held is not None and _qualname(held) != _qualname(cls):  # the same class imported again is fine
            raise ValueError(
                f"correction name {name!r} is taken by {_qualname(held)}; {_qualname(cls)} must register under "
                f"another name (a second {name!r} would run under the same recipe and config hash as the first)"
            )
        cls.name = name
        REGISTRY[name] = cls
        return cls

    return deco


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def available() -> dict[str, type]:
    """Built-in corrections, those that installed packages declare as entry points (group
    ``mxfp4.corrections``), and those registered by the modules named in ``$MXFP4_PLUGINS``
    (comma-separated import paths, e.g. a local ``my_corrections.py`` with ``PYTHONPATH=.``)."""
    import_plugins()
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in REGISTRY:
            try:
                cls = ep.load()
            except Exception as err:  # noqa: BLE001
                raise ValueError(f"plugin entry point {ep.name!r} ({ep.value}) failed to load: "
                                 f"{type(err).__name__}: {err}") from None
            if not (isinstance(cls, type) and issubclass(cls, Correction)):
                raise ValueError(f"plugin entry point {ep.name!r} ({ep.value}) is not a subclass of "
                                 "mxfp4.corrections.Correction; accepted: class Mine(Correction)")
            REGISTRY.setdefault(ep.name, cls)
            cls.name = ep.name
    return dict(REGISTRY)


@functools.cache
def _parameters_model(cls: type) -> type[pydantic.BaseModel]:
    """A strict pydantic model of a dataclass correction's fields (types from its annotations)."""
    hints = typing.get_type_hints(cls)
    fields = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        default = f.default if f.default is not dataclasses.MISSING else ...
        if f.default_factory is not dataclasses.MISSING:
            default = pydantic.Field(default_factory=f.default_factory)
        fields[f.name] = (hints[f.name], default)
    config = pydantic.ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
    return pydantic.create_model(f"{cls.__name__}Parameters", __config__=config, **fields)


def _checked_parameters(name: str, cls: type, params: dict) -> dict:
    """``params`` checked against a dataclass correction's field types, strictly (2.5 is no int, "no"
    is no bool); one ValueError naming each bad parameter and what is accepted."""
    try:
        model = _parameters_model(cls).model_validate(params)
    except pydantic.ValidationError as err:
        problems = []
        for e in err.errors():
            key = ".".join(str(p) for p in e["loc"]) or "(top level)"
            if e["type"] == "extra_forbidden":
                accepted = ", ".join(f.name for f in dataclasses.fields(cls) if f.init)
                problems.append(f"{key}: unknown parameter; accepted: {accepted}")
            else:
                problems.append(f"{key}: {e['msg']} (got {e.get('input')!r})")
        raise ValueError(f"correction {name!r}: " + "; ".join(problems)) from None
    return {k: getattr(model, k) for k in params}


def build(spec: dict | str) -> Correction:
    """A correction from ``{"name": ..., **params}`` (or a bare name, default parameters). A
    dataclass correction's parameters are checked strictly against its field types first.

    Args:
        spec: a registered name, or ``{"name": name, **parameters}``.
    """
    spec = {"name": spec} if isinstance(spec, str) else dict(spec)
    name = spec.pop("name", None)
    known = available()
    if name not in known:
        raise ValueError(f"unknown correction {name!r}; known: {', '.join(sorted(known))} (a correction of your own: "
                         "name its module in MXFP4_PLUGINS, or install it under the mxfp4.corrections entry point)")
    cls = known[name]
    # checked whatever the class's style, so a plain-class plugin gets no NaN either (a dataclass's: its typed fields)
    bad = None if dataclasses.is_dataclass(cls) else first_non_finite(spec)
    if bad:
        raise ValueError(f"correction {name!r}: parameter {bad[0]} is {bad[1]}; accepted: finite numbers")
    if dataclasses.is_dataclass(cls):
        spec = _checked_parameters(name, cls, spec)
    try:
        return cls(**spec)
    except (TypeError, ValueError) as err:
        raise ValueError(f"correction {name!r}: {err}") from None
    except Exception as err:  # noqa: BLE001 - a plugin's constructor, reported with its name
        raise ValueError(
            f"correction {name!r} ({_qualname(cls)}) failed to build: {type(err).__name__}: {err}") from None


PATHWAY_ORDER = ("gradient", "rollout", "entropy")


def paper_corrections() -> dict[str, type]:
    """{pathway: the registered correction the paper ties to it}, in the pathways' order (the built-ins declare
    ``pathway``; a plugin that claims a pathway another correction holds is an error, not a silent swap)."""
    out: dict[str, type] = {}
    for cls in REGISTRY.values():
        if cls.pathway is None:
            continue
        if cls.pathway not in PATHWAY_ORDER:
            raise ValueError(f"correction {cls.name!r} declares pathway {cls.pathway!r}; accepted: "
                             f"{', '.join(PATHWAY_ORDER)}")
        if cls.pathway in out:
            raise ValueError(f"corrections {out[cls.pathway].name!r} and {cls.name!r} both declare the "
                             f"{cls.pathway} pathway; accepted: one correction a pathway")
        out[cls.pathway] = cls
    return {p: out[p] for p in PATHWAY_ORDER if p in out}

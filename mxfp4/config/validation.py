"""Turn pydantic's validation errors into one ``ValueError`` that names the key, what was given and
what is accepted."""

from __future__ import annotations

import re
import types
import typing

import pydantic


def _accepted_keys(model: type[pydantic.BaseModel], loc: tuple) -> list[str]:
    """The field names of the (nested) model that holds ``loc[-1]``."""
    cls = model
    for part in loc[:-1]:
        if isinstance(cls, type) and issubclass(cls, pydantic.BaseModel):
            field = cls.model_fields.get(part)
            if field is None:
                return []
            cls = field.annotation
        elif typing.get_origin(cls) is dict:
            cls = typing.get_args(cls)[1]
        else:
            return []
        while typing.get_origin(cls) in (typing.Union, types.UnionType):
            cls = next(a for a in typing.get_args(cls) if a is not type(None))
    if isinstance(cls, type) and issubclass(cls, pydantic.BaseModel):
        return list(cls.model_fields)
    return []


def _yaml_number_hint(value) -> str:
    """Why a number came as text: YAML 1.1 reads an exponent without a dot (1e-5) or without a sign (1.0e9) as a
    string; the advice is the form it reads as a number (a dot in the mantissa, a signed exponent)."""
    text = value.strip() if isinstance(value, str) else ""
    match = re.fullmatch(r"([-+]?\d+)(\.\d*)?[eE]([-+]?)(\d+)", text)
    if match:
        mantissa, fraction, sign, exponent = match.groups()
        return (f"; YAML reads {value} as text, not a number: write "
                f"{mantissa}{fraction if fraction and fraction != '.' else '.0'}e{sign or '+'}{exponent}")
    return ""


def parse(model: type[pydantic.BaseModel], data, where: str):
    """``model.model_validate(data)``, its errors raised as one ValueError."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping of keys, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as err:
        problems = []
        for e in err.errors():
            loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
            key = ".".join(str(p) for p in loc) or "(top level)"
            if e["type"] == "extra_forbidden":
                accepted = _accepted_keys(model, loc)
                problems.append(f"{key}: unknown key" + (f"; accepted: {', '.join(accepted)}" if accepted else ""))
            elif e["type"] == "missing":
                problems.append(f"{key}: missing (required)")
            else:
                msg = e["msg"].removeprefix("Value error, ")
                got = f" (got {e.get('input')!r})" if loc else ""  # a whole-file check: the file is the input
                problems.append(f"{key}: {msg}{got}{_yaml_number_hint(e.get('input'))}")
        raise ValueError(f"{where}: " + "; ".join(problems)) from None

"""How a report writes a number that may be missing: one dash for "no value" in every table, so that a reader (and a
test that compares stored markdown) sees one convention."""

from __future__ import annotations

MISSING = "—"


def number(v, fmt: str = "{:+.3g}") -> str:
    """``v`` through ``fmt``, or ``MISSING`` where there is no value (None)."""
    return MISSING if v is None else fmt.format(v)


def formatter(default: str):
    """``number`` with a report's own default format: ``f(v)`` or ``f(v, fmt)``."""

    def f(v, fmt: str = default) -> str:
        return number(v, fmt)

    return f


def p_value(v) -> str:
    """A p value to three significant digits, or ``MISSING``."""
    return number(v, "{:.3g}")

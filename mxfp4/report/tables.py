"""One validated reader for every table a report draws a verdict from: the aggregate CSVs (cells, steps, items,
summary), the pathway matrix and the JSON reports (proofs, corrections table, reproduction check).

Each table has a schema (pydantic): its required columns, their types, finite numbers, ranges, and the columns
that key a row, which no two rows share. A violation is one ``TableError`` naming the file, the row (its line in
a CSV) and the field, before any statistic is computed from the table. A CSV's text is validated as written
(a "nan" is refused, not read as missing); the rows are then handed on as the readers downstream know them.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Annotated, Any, ClassVar

import pandas as pd
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from ..stats import first_non_finite


class TableError(ValueError):
    """A stored table that breaks its schema: the message names the file, the row and the field."""


def _blank_is_none(v: Any) -> Any:
    return None if isinstance(v, str) and v.strip() == "" else v


def _optional(*constraints) -> Any:
    """An optional number (a blank cell is None) meeting ``constraints`` where given."""
    inner = Annotated[float, *constraints] if constraints else float
    return Annotated[inner | None, BeforeValidator(_blank_is_none)]


Opt = Annotated[Any, BeforeValidator(_blank_is_none)]
Number = _optional()
Unit = _optional(Field(ge=0, le=1))
Cosine = _optional(Field(ge=-1, le=1))
NonNegative = _optional(Field(ge=0))
Count = Annotated[Annotated[int, Field(ge=0)] | None, BeforeValidator(_blank_is_none)]
Binary = _optional(Field(ge=0, le=1, multiple_of=1))
Text = Annotated[str, Field(min_length=1)]


class _Row(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    columns: ClassVar[tuple[str, ...]] = ()  # columns the file must have even where a cell may be blank


class CellRow(_Row):
    """A row of ``cells.csv`` (``mxfp4 aggregate``): one finished cell."""

    model: Text
    recipe: Text
    seed: int = Field(ge=0)
    gsm8k_strict_accuracy: float = Field(ge=0, le=1)
    gsm8k_strict_accuracy_before: Unit = None
    gsm8k_strict_accuracy_unquantized: Unit = None
    gsm8k_rl_gain: Cosine = None
    gsm8k_flexible_accuracy: Unit = None
    mean_reward: Number = None
    mean_rollout_accuracy: Unit = None
    mean_entropy: NonNegative = None
    final_entropy: NonNegative = None
    mean_kl: Number = None
    mean_grad_cosine: Cosine = None
    mean_grad_rel_norm_error: NonNegative = None
    mean_step_time: NonNegative = None
    wall_time_seconds: NonNegative = None
    extra_bits_per_element: NonNegative = None
    bf16_fraction: Unit = None
    learning_signal_steps: Count = None


class StepRow(_Row):
    """A row of ``steps.csv``: one optimizer step of a cell."""

    model: Text
    recipe: Text
    seed: int = Field(ge=0)
    step: int = Field(ge=1)
    reward: Number = None
    entropy: Number = None
    kl: Number = None
    grad_cosine: Cosine = None
    step_time: NonNegative = None


class ItemRow(_Row):
    """A row of ``items.csv``: one GSM8K problem of a cell, each correctness 0 or 1."""

    model: Text
    recipe: Text
    seed: int = Field(ge=0)
    doc_hash: Text
    doc_id: int = Field(ge=0)
    strict: Binary = None
    flexible: Binary = None
    strict_before: Binary = None
    strict_unquantized: Binary = None


class SummaryRow(_Row):
    """A row of ``summary.csv``: one metric of a (model, recipe) over its cells."""

    model: Text
    recipe: Text
    metric: Text
    n: Count = None
    mean: Number = None
    std: NonNegative = None
    ci_low: Number = None
    ci_high: Number = None
    p: Unit = None
    method: Opt = None


class PathwayRow(_Row):
    """A row of ``pathways.csv`` (``mxfp4 pathways``): one measure of one arm at one checkpoint."""

    columns: ClassVar[tuple[str, ...]] = ("mean", "ci_low", "ci_high")  # what every reader takes

    model: Text
    checkpoint: Text
    injection: Text
    site: Text
    layer: Text
    metric: Text
    mean: Number = None
    ci_low: Number = None
    ci_high: Number = None
    sd: NonNegative = None
    n: Count = None
    p: Unit = None
    p_contradicted: Unit = None
    method: Opt = None
    form: Opt = None


class UnitRow(_Row):
    """A row of a per-unit file of the pathway matrix (``pathways.spec.UNIT_FIELDS``): one unit's harm."""

    model: Text
    checkpoint: Text
    form: Text
    pathway: Text
    arm: Text
    unit: int = Field(ge=0)
    group: Text
    seed: Count = None
    key: Opt = None
    harm: Number = None


class BoardItemRow(_Row):
    """A row of the real-model board's ``items.csv`` (``mxfp4 real-board``): one recipe's completion of one held-out
    problem before RL."""

    model: Text
    recipe: Text
    doc_id: int = Field(ge=0)
    doc_hash: Text
    strict: float = Field(ge=0, le=1, multiple_of=1)
    flexible: float = Field(ge=0, le=1, multiple_of=1)
    repetitive: bool
    garbled: bool
    error: bool
    same_as: Opt = None


CSV_SCHEMAS: dict[str, tuple[type[_Row], tuple[str, ...]]] = {  # table -> (row schema, the columns that key a row)
    "cells": (CellRow, ("model", "recipe", "seed")),
    "steps": (StepRow, ("model", "recipe", "seed", "step")),
    "items": (ItemRow, ("model", "recipe", "seed", "doc_hash")),
    "summary": (SummaryRow, ("model", "recipe", "metric")),
    "pathways": (PathwayRow, ("model", "checkpoint", "injection", "site", "layer", "metric", "form")),
    "units": (UnitRow, ("model", "checkpoint", "form", "pathway", "arm", "unit")),
    "board_items": (BoardItemRow, ("model", "recipe", "doc_id")),
}


def _first_problem(err: ValidationError) -> str:
    e = err.errors()[0]
    field = ".".join(map(str, e["loc"])) or "(row)"
    if e["type"] == "missing":
        return f"{field}: missing"
    return f"{field}: {e['msg']} (got {e.get('input')!r})"


def validate_rows(path: Path | str, kind: str, rows: list[dict], first_line: int = 2) -> list[dict]:
    """``rows`` of table ``kind`` read from ``path`` checked against its schema and key (``CSV_SCHEMAS``); the row
    of ``rows[i]`` is line ``first_line + i`` of the file. The rows themselves are returned unchanged."""
    schema, key = CSV_SCHEMAS[kind]
    seen: dict[tuple, int] = {}
    for i, row in enumerate(rows):
        line = first_line + i
        try:
            schema.model_validate(row)
        except ValidationError as err:
            raise TableError(f"{path}: row {line}: {_first_problem(err)}; accepted: a {kind} table as "
                             f"{schema.__name__} describes it") from None
        k = tuple(_blank_is_none(row.get(c)) for c in key)
        if k in seen:
            raise TableError(f"{path}: rows {seen[k]} and {line} share the key ({', '.join(key)}) = {k}; accepted: "
                             f"one row per key")
        seen[k] = line
    return rows


def _csv_text(path: Path) -> tuple[list[str], list[dict]]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def read_table(path: Path | str, kind: str) -> list[dict]:
    """A stored CSV table of ``kind`` (``CSV_SCHEMAS``), validated, as dicts with pandas' column types (empty
    cells None): what the reports compute from."""
    path = Path(path)
    if kind not in CSV_SCHEMAS:
        raise ValueError(f"no schema for table {kind!r}; accepted: {', '.join(CSV_SCHEMAS)}")
    try:
        columns, text_rows = _csv_text(path)
    except UnicodeDecodeError:
        raise TableError(f"{path}: not UTF-8 text; accepted: a {kind} table (CSV)") from None
    except csv.Error as err:
        raise TableError(f"{path}: not a CSV file ({err}); accepted: a {kind} table") from None
    schema, key = CSV_SCHEMAS[kind]
    required = [c for c, f in schema.model_fields.items() if f.is_required()] + list(schema.columns)
    missing = [c for c in required if c not in columns]
    if missing:
        raise TableError(f"{path}: no {', '.join(missing)} column(s); accepted: a {kind} table (columns "
                         f"{', '.join(required)} at least)")
    validate_rows(path, kind, text_rows)
    if not text_rows:
        return []
    df = pd.read_csv(path)
    return df.astype(object).where(df.notna(), None).to_dict("records")


def read_text_table(path: Path | str, kind: str) -> list[dict]:
    """A stored CSV table of ``kind``, validated, as dicts of the text as written (the pathway matrix's readers
    format its numbers themselves)."""
    path = Path(path)
    read_table(path, kind)
    return _csv_text(path)[1]


# Each pathway's harm per unit, the range a measured one lies in (pathways.spec.HARMS): 1 - a cosine, a negative
# log-likelihood, an entropy.
HARM_RANGES = {"gradient": (0.0, 2.0), "rollout": (0.0, math.inf), "entropy": (0.0, math.inf)}


def read_unit_files(paths, models: list[str] | None = None) -> list[dict]:
    """The per-unit files of the pathway matrix (``pathways.spec.UNIT_FIELDS``) as one list, ``harm`` a float,
    each file validated (``read_table``'s schema and key) and then, across the files:

    - every harm present, finite and in its pathway's range (``HARM_RANGES``), every pathway a known one;
    - one model a file, and one of ``models`` where given;
    - no unit twice across the files (a unit: model, checkpoint, form, pathway, arm, unit, seed), so that files of
      one run are never merged with another's;
    - every arm of a (model, checkpoint, form, pathway) on the same units, so that no contrast is taken over
      fewer units than the others.
    Anything else is a TableError naming the file, the row or the arm and what is accepted."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise TableError("no per-unit file given; accepted: one or more <model>_<checkpoint>_units.csv files")
    rows, origin = [], {}
    for path in paths:
        if not path.is_file():
            raise TableError(f"{path}: no such per-unit file")
        text = read_text_table(path, "units")
        file_models = sorted({r["model"] for r in text})
        if len(file_models) > 1:
            raise TableError(f"{path}: rows of {len(file_models)} models ({', '.join(file_models)}); accepted: one "
                             "model a file, as the pathway matrix writes it")
        if models is not None and file_models and file_models[0] not in models:
            raise TableError(f"{path}: units of model {file_models[0]!r}; accepted: {', '.join(models)}")
        for line, r in enumerate(text, start=2):
            if r["pathway"] not in HARM_RANGES:
                raise TableError(f"{path}: row {line}: pathway {r['pathway']!r}; accepted: {', '.join(HARM_RANGES)}")
            try:
                harm = float(r["harm"])
            except (TypeError, ValueError):
                harm = math.nan
            low, high = HARM_RANGES[r["pathway"]]
            if not (math.isfinite(harm) and low <= harm <= high):
                raise TableError(f"{path}: row {line}: {r['pathway']} harm {r['harm']!r} of arm {r['arm']!r}; "
                                 f"accepted: a finite number in [{low:g}, {high:g}]")
            unit = (r["model"], r["checkpoint"], r["form"], r["pathway"], r["arm"], int(r["unit"]), r.get("seed"))
            if unit in origin:
                raise TableError(f"{path}: row {line}: unit {unit} is also in {origin[unit]}; accepted: each unit in "
                                 "one file (files of one run, never two runs merged)")
            origin[unit] = f"{path} row {line}"
            rows.append({**r, "harm": harm})
    arms: dict = {}
    for r in rows:
        arms.setdefault((r["model"], r["checkpoint"], r["form"], r["pathway"]), {}).setdefault(r["arm"], set()).add(
            (r.get("seed"), int(r["unit"])))
    for (model, checkpoint, form, pathway), by_arm in arms.items():
        most = max(by_arm.values(), key=len)
        short = {a: len(u) for a, u in by_arm.items() if u != most}
        if short:
            arm, n = next(iter(short.items()))
            raise TableError(f"{model} {checkpoint} {form} {pathway}: arm {arm!r} has {n} units where another has "
                             f"{len(most)}; accepted: every arm measured on the same units")
    return rows


def read_board_items(path: Path | str, model: str | None = None) -> list[dict]:
    """The real-model board's per-problem file (``mxfp4 real-board``'s ``items.csv``), validated (``read_table``:
    columns, types, 0/1 scores, one row per recipe and problem), then: one model (``model`` where given), a bf16 row
    set, and every recipe scored on exactly bf16's problems (the same doc ids and hashes), so that every paired
    difference is over the same problems. Anything else is a TableError naming the file and what is accepted."""
    path = Path(path)
    if not path.is_file():
        raise TableError(f"{path}: no such board file; accepted: the items.csv that mxfp4 real-board writes")
    rows = read_table(path, "board_items")
    models = sorted({r["model"] for r in rows})
    if len(models) != 1 or (model is not None and models != [model]):
        raise TableError(f"{path}: rows of model(s) {', '.join(models) or 'none'}; accepted: one model"
                         + (f", {model!r}" if model is not None else ""))
    problems: dict[str, set] = {}
    for r in rows:
        problems.setdefault(r["recipe"], set()).add((int(r["doc_id"]), r["doc_hash"]))
    if "bf16" not in problems:
        raise TableError(f"{path}: no bf16 rows; accepted: a board measured beside bf16 (mxfp4 real-board does)")
    for recipe, got in problems.items():
        if got != problems["bf16"]:
            raise TableError(f"{path}: recipe {recipe!r} scored {len(got)} problems, {len(got ^ problems['bf16'])} "
                             f"of them or of bf16's {len(problems['bf16'])} not in both; accepted: every recipe on "
                             "bf16's problems")
    return rows


# the JSON reports -----------------------------------------------------------------------------------------------


class ProofCase(_Row):
    format: Text
    distribution: Text
    scale_rule: Text
    dtype: Text
    identity_residual: float = Field(ge=0)
    identity_residual_rel: float = Field(ge=0)
    passed: bool


class Proofs(_Row):
    """``proofs.json`` (``mxfp4 prove``)."""

    max_identity_residual: float = Field(ge=0)
    max_identity_residual_rel: float = Field(ge=0)
    passed: bool
    cases: list[ProofCase] = Field(min_length=1)


class CorrectionRow(_Row):
    """A row of the corrections table (``mxfp4 corrections-table``): each measure before and after."""

    source: Text
    correction: Text
    energy_scale_before: float = Field(ge=0)
    energy_scale_after: float = Field(ge=0)
    energy_dead_before: float = Field(ge=0)
    energy_dead_after: float = Field(ge=0)
    energy_grid_before: float = Field(ge=0)
    energy_grid_after: float = Field(ge=0)
    energy_total_before: float = Field(ge=0)
    energy_total_after: float = Field(ge=0)
    deadzone_fraction_before: float = Field(ge=0, le=1)
    deadzone_fraction_after: float = Field(ge=0, le=1)


class Corrections(BaseModel):
    rows: list[CorrectionRow]


class ReproducedCell(_Row):
    cell: dict
    compared: int = Field(ge=1)
    differing: dict
    reproduces: bool


class Reproduction(_Row):
    """The reproduction check compare writes (``check_reproduction``)."""

    reproduces: bool
    cells: list[ReproducedCell] = Field(min_length=1)


JSON_SCHEMAS: dict[str, type[BaseModel]] = {"proofs": Proofs, "corrections": Corrections,
                                            "reproduction": Reproduction}


def read_report(path: Path | str, kind: str):
    """A stored JSON report of ``kind`` (``JSON_SCHEMAS``), validated (every number in it finite), as parsed."""
    path = Path(path)
    if kind not in JSON_SCHEMAS:
        raise ValueError(f"no schema for report {kind!r}; accepted: {', '.join(JSON_SCHEMAS)}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TableError(f"{path}: not JSON ({err}); accepted: the {kind} report") from None
    bad = first_non_finite(data)
    if bad:
        raise TableError(f"{path}: {bad[0] or '(top level)'}: not a finite number; accepted: the {kind} report with "
                         "finite numbers")
    try:
        JSON_SCHEMAS[kind].model_validate({"rows": data} if kind == "corrections" else data)
    except ValidationError as err:
        raise TableError(f"{path}: {_first_problem(err)}; accepted: the {kind} report") from None
    return data

"""A finished cell as the reports read it, validated: ``metrics.json`` (types, ranges, finite values),
its ``train_log.jsonl`` (the digest the cell recorded, consecutive steps, finite values) and, given the
profile, its provenance (the setting and recipe it was made from against what the profile and recipe
say now). Anything else is refused with one line naming the file and the field: a report never
aggregates a partial, edited or stale cell."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..config.profiles import Profile, differences, setting_hash
from ..config.recipes import Recipe
from ..io import jsonl_records
from ..layout import TRAIN_LOG


class CellMetrics(BaseModel):
    """The fields of ``metrics.json`` the reports read (the cell writes more; those pass through)."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    profile: str
    model: str
    recipe: str
    seed: int = Field(ge=0)
    steps: int = Field(ge=1, description="rows of train_log.jsonl")
    config_hash: str
    setting_hash: str | None = None
    train_log_sha256: str | None = None
    eval_n: int = Field(ge=1)
    gsm8k_strict_accuracy: float = Field(ge=0, le=1)
    gsm8k_flexible_accuracy: float = Field(ge=0, le=1)
    gsm8k_strict_accuracy_before: float | None = Field(None, ge=0, le=1)
    gsm8k_strict_accuracy_unquantized: float | None = Field(None, ge=0, le=1)
    gsm8k_rl_gain: float | None = Field(None, ge=-1, le=1)
    mean_reward: float | None = None
    mean_rollout_accuracy: float | None = None
    mean_entropy: float | None = None
    final_entropy: float | None = None
    mean_kl: float | None = None
    mean_grad_cosine: float | None = Field(None, ge=-1, le=1)
    mean_grad_rel_norm_error: float | None = None
    mean_step_time: float | None = Field(None, ge=0)
    wall_time_seconds: float | None = Field(None, ge=0)


def _one_line(err: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top level)'}: "
                     + ("missing" if e["type"] == "missing" else f"{e['msg']} (got {e.get('input')!r})")
                     for e in err.errors())


def read_metrics(path: Path) -> dict:
    """``metrics.json`` of a finished cell, validated (``CellMetrics``); a ValueError naming the file and field."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a JSON object ({err}); rerun the cell") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(raw).__name__}; rerun the cell")
    try:
        CellMetrics.model_validate(raw)
    except ValidationError as err:
        raise ValueError(f"{path}: {_one_line(err)}; rerun the cell") from None
    return raw


def read_log(metrics_path: Path, metrics: dict) -> list[dict]:
    """The cell's ``train_log.jsonl`` beside ``metrics_path``: the file the cell finished with (its
    recorded digest), steps 1..``metrics['steps']`` in order, each a JSON object with finite numbers."""
    path = Path(metrics_path).parent / TRAIN_LOG
    if not path.is_file():
        raise ValueError(f"{path}: missing beside {metrics_path.name}; rerun the cell")
    data = path.read_bytes()
    recorded = metrics.get("train_log_sha256")
    if recorded is not None and hashlib.sha256(data).hexdigest() != recorded:
        raise ValueError(f"{path}: not the log the cell finished with (its SHA-256 differs from the one "
                         f"{metrics_path.name} records); rerun the cell")
    rows = []
    for lineno, row in jsonl_records(path, data.splitlines(), advice="rerun the cell"):
        if not isinstance(row, dict) or row.get("step") != lineno:
            raise ValueError(f"{path}:{lineno}: expected step {lineno}, got "
                             f"{row.get('step') if isinstance(row, dict) else row!r}; rerun the cell")
        bad = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
        if bad:
            raise ValueError(f"{path}:{lineno}: {', '.join(bad)} not finite ({row[bad[0]]}); rerun the cell")
        rows.append(row)
    if len(rows) != metrics["steps"]:
        raise ValueError(f"{path}: {len(rows)} steps, but {metrics_path.name} records {metrics['steps']}; "
                         "rerun the cell")
    return rows


def check_provenance(path: Path, metrics: dict, profile: Profile) -> None:
    """A cell made from what ``profile`` and its recipe say now, or a ValueError naming what differs."""
    model = metrics["model"]
    if metrics["profile"] != profile.name:
        raise ValueError(f"{path}: a cell of profile {metrics['profile']!r} in the results of {profile.name!r}")
    if model not in profile.models:
        raise ValueError(f"{path}: model {model!r} is not in profile {profile.name!r} (known: "
                         f"{', '.join(profile.models)}); remove the cell or restore the model line")
    if metrics.get("setting_hash") != setting_hash(profile, model):
        recorded = metrics.get("setting")
        what = ("; ".join(differences(recorded, profile.setting(model))) if isinstance(recorded, dict)
                else f"setting hash {metrics.get('setting_hash')} -> {setting_hash(profile, model)}")
        raise ValueError(f"{path}: made from other settings than profile {profile.name!r} gives now (recorded -> "
                         f"now: {what}); rerun it (snakemake reruns cells whose settings changed)")
    check_recipe(path, metrics)


def check_recipe(path: Path, metrics: dict) -> None:
    """A cell made under the definition its recipe has now, or a ValueError naming both (recorded -> now)."""
    recipe = metrics["recipe"]
    try:
        now = Recipe.named(recipe).to_dict()
    except ValueError as err:
        raise ValueError(f"{path}: its recipe cannot be checked ({err}); give its recipes file "
                         "(MXFP4_RECIPES) and plugins (MXFP4_PLUGINS) as when it ran") from None
    made = (metrics.get("config") or {}).get("recipe")
    if made != now:
        what = "; ".join(differences(made, now)) if isinstance(made, dict) else "no recipe recorded"
        raise ValueError(f"{path}: recipe {recipe!r} has changed since the cell ran (recorded -> now: {what}); "
                         "rerun it")


SAMPLE_KEYS = ("doc_id", "doc_hash", "filter", "exact_match")


def read_samples(path: Path) -> list[dict]:
    """lm-eval's per-sample lines of one evaluation of a cell, each with the keys the items table reads."""
    rows = []
    for lineno, s in jsonl_records(path, advice="rerun the cell"):
        missing = [k for k in SAMPLE_KEYS if not isinstance(s, dict) or k not in s]
        if missing:
            raise ValueError(f"{path}:{lineno}: lacks {', '.join(missing)} (an lm-eval sample line has them)")
        rows.append(s)
    return rows

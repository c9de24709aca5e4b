"""Where a profile's GSM8K files are, and the digest of their content: a cell records it (through its
setting), so a changed or swapped data folder makes a different cell, never a resumed or reused one."""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

from . import REPO_ROOT

SHARED_GSM8K = REPO_ROOT.parent / "shared" / "data" / "gsm8k"
SPLITS = ("train.jsonl", "test.jsonl")


def default_gsm8k_dir() -> Path | None:
    """``$MXFP4_GSM8K_DIR`` (which must hold the files: a set variable never falls back), else the
    shared folder beside the checkout if it holds them, else None."""
    env = os.environ.get("MXFP4_GSM8K_DIR")
    if env:
        missing = [f for f in SPLITS if not (Path(env) / f).is_file()]
        if missing:
            raise ValueError(f"MXFP4_GSM8K_DIR={env}: no {' or '.join(missing)} there; accepted: a folder holding "
                             "GSM8K's train.jsonl and test.jsonl (or unset it)")
        return Path(env)
    return SHARED_GSM8K if (SHARED_GSM8K / "test.jsonl").exists() else None


def gsm8k_folder(profile) -> Path:
    """The GSM8K folder of a profile: its ``data.dir``, else ``default_gsm8k_dir``; a ValueError when none."""
    folder = default_gsm8k_dir() if profile.data.dir is None else Path(profile.data.dir)
    if folder is None:
        raise ValueError(
            "the gsm8k data source needs the GSM8K jsonl folder: set data.dir in the profile or "
            "MXFP4_GSM8K_DIR (a folder with train.jsonl and test.jsonl)"
        )
    return folder


def data_digest(profile) -> str | None:
    """SHA-256 (16 hex digits) of the GSM8K files a gsm8k profile reads; None when the folder is not
    found here (a cell cannot run then; a report that compares digests names the field)."""
    try:
        folder = gsm8k_folder(profile)
    except ValueError:
        return None
    files = [folder / f for f in SPLITS]
    if not all(f.is_file() for f in files):
        return None
    return _digest(tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files))


@functools.cache
def _digest(files: tuple) -> str:
    """The content digest, cached per (path, mtime, size): a Snakefile evaluates it once per cell."""
    h = hashlib.sha256()
    for path, _, _ in files:
        h.update(Path(path).name.encode())
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:16]

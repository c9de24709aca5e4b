"""Atomic result files: a run interrupted midway never leaves a half-written output behind.

``atomic_path(path)`` is the one mechanism: it yields a temporary path beside ``path`` and renames it
into place only when the block finishes without error. The writers below use it.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: Path | str):
    """Yield a temporary file path beside ``path``; on success it replaces ``path`` (mode 0644)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def writable_folder(folder: Path | str) -> Path:
    """``folder``, made if missing and checked writable before any work is done for it; an OSError
    (a file in the way, no permission) otherwise."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if not os.access(folder, os.W_OK):
        raise PermissionError(13, "Permission denied", str(folder))
    return folder


@contextlib.contextmanager
def exclusive(folder: Path | str, what: str):
    """Hold an exclusive lock on ``folder`` (``flock`` on ``folder/.lock``) for the block; a second
    holder, in this process or another, gets a ValueError at once. The kernel drops the lock when its
    process dies, so a hard kill never leaves it stale."""
    import fcntl

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"{what} is being written by another process ({folder / '.lock'} is locked); "
                             "wait for it to finish, or stop it: two writers would corrupt it") from None
        try:
            yield folder
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_text_atomic(path: Path | str, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_csv_atomic(path: Path | str, rows: list[dict], fields) -> Path:
    """Rows (dicts with no keys outside ``fields``) as a CSV with the columns ``fields``, in that order."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(fields))
    writer.writeheader()
    writer.writerows(rows)
    return write_text_atomic(path, buf.getvalue())


def write_json_atomic(path: Path | str, obj) -> Path:
    """Write ``obj`` as indented JSON."""
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_jsonl_atomic(path: Path | str, rows) -> Path:
    return write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))


def copy_atomic(src: Path | str, dst: Path | str) -> Path:
    with atomic_path(dst) as tmp:
        tmp.write_bytes(Path(src).read_bytes())
    return Path(dst)


def jsonl_records(path: Path | str, lines=None, skip_blank: bool = False, advice: str = ""):
    """(line number, parsed value) of each line of a JSON-lines file; ``lines``: its lines as bytes when
    they are already read. A line that is not UTF-8 or not JSON is one ValueError naming the file and the
    line, then ``advice`` (what to do about it)."""
    tail = f"; {advice}" if advice else ""
    if lines is None:
        with open(path, "rb") as f:
            yield from jsonl_records(path, f, skip_blank, advice)
        return
    for lineno, raw in enumerate(lines, 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{path}:{lineno}: not UTF-8 text ({err.reason}); accepted: UTF-8 JSON lines{tail}") \
                from None
        if skip_blank and not text.strip():
            continue
        try:
            yield lineno, json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{lineno}: malformed JSON ({err.msg}){tail}") from None


def file_sha256(path: Path | str) -> str:
    """The SHA-256 of a file's bytes (hex), read in chunks."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def changed_files(folder: Path | str, digests: dict) -> list[str]:
    """The files of ``digests`` (name -> SHA-256, as recorded where ``folder`` was made) whose bytes differ
    now, or that are gone."""
    folder = Path(folder)
    return [name for name, want in sorted(digests.items())
            if not (folder / name).is_file() or file_sha256(folder / name) != want]

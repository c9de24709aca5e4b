"""The modules a user names in ``$MXFP4_PLUGINS`` (comma-separated import paths, e.g. a local ``my_corrections.py``
with ``PYTHONPATH=.``): imported before a registry is read, so that what they register (corrections, studies) is
there."""

from __future__ import annotations

import importlib
import os


def import_plugins() -> None:
    """Import every module of ``$MXFP4_PLUGINS`` (already imported ones are not run again); one that does not import,
    or fails while importing, is a ValueError naming it."""
    for module in filter(None, os.environ.get("MXFP4_PLUGINS", "").split(",")):
        try:
            importlib.import_module(module.strip())
        except ImportError as err:
            raise ValueError(
                f"MXFP4_PLUGINS names {module.strip()!r}, which does not import ({err}); "
                "accepted: importable module paths, comma-separated (PYTHONPATH=. for local files)"
            ) from None
        except Exception as err:  # noqa: BLE001 - a plugin's own failure, reported with its name
            raise ValueError(f"plugin {module.strip()!r} (MXFP4_PLUGINS) failed while importing: "
                             f"{type(err).__name__}: {err}") from None

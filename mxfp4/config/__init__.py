"""Typed, validated configuration: profiles (the grid of cells and every hyperparameter) and recipes
(how a model is quantized). Both are pydantic models with help text; a missing or unknown key at any
depth, a wrong type or an out-of-range value is a ``ValueError`` naming the key, what was given and
what is accepted."""

import json
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
# experiments/ of the checkout this package runs from; installed from a wheel, the copy shipped inside the package
# (mxfp4/experiments/). A user's own recipe files (MXFP4_RECIPES) add to and override the shipped recipes.
EXPERIMENTS = (REPO_ROOT / "experiments" if (REPO_ROOT / "experiments" / "recipes.yaml").is_file()
               else Path(__file__).resolve().parents[1] / "experiments")


def shipped(folder: str, suffix: str, named_with_suffix: bool = True) -> str:
    """The files shipped under experiments/<folder>/ with this suffix, as a profile names them (with
    the suffix, or without it), for error messages."""
    files = (EXPERIMENTS / folder).glob(f"*{suffix}")
    return ", ".join(sorted(p.name if named_with_suffix else p.stem for p in files))


def model_line(name: str) -> dict | None:
    """``experiments/models/<name>.json`` as written (architecture fields, and ``_``-keys saying where the
    model comes from), or None when no model line has that name (a hub id, a path)."""
    path = EXPERIMENTS / "models" / f"{name}.json"
    return json.loads(path.read_text()) if "/" not in name and path.is_file() else None


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping with the same key twice (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                kind = "list" if isinstance(key_node, yaml.SequenceNode) else "mapping"
                raise yaml.constructor.ConstructorError(
                    None, None, f"a key must be a plain name, got a {kind}", key_node.start_mark)
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {seen[key] + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


MAX_YAML_BYTES = 1 << 20  # a profile or recipe file is a few KiB
MAX_YAML_NODES = 100_000  # values after aliases are expanded: an alias bomb stops here, not in memory


def _expanded_nodes(node, memo: dict) -> int:
    """The values a composed YAML node becomes once every alias is expanded (each alias counted as the whole value
    it repeats), in one pass over the composed graph."""
    key = id(node)
    if key not in memo:
        memo[key] = 0  # a recursive alias counts once (the constructor refuses it)
        if isinstance(node, yaml.SequenceNode):
            memo[key] = 1 + sum(_expanded_nodes(n, memo) for n in node.value)
        elif isinstance(node, yaml.MappingNode):
            memo[key] = 1 + sum(_expanded_nodes(k, memo) + _expanded_nodes(v, memo) for k, v in node.value)
        else:
            memo[key] = 1
    return memo[key]


def load_yaml(path: Path | str):
    """A YAML file's content; a syntax error, a duplicate key, a file over ``MAX_YAML_BYTES`` or one whose aliases
    expand past ``MAX_YAML_NODES`` values is one ValueError naming the file, the line and the problem."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_YAML_BYTES:
            raise ValueError(f"{path}: {path.stat().st_size:,} bytes; accepted: a YAML file of at most "
                             f"{MAX_YAML_BYTES:,} bytes")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason}); accepted: a UTF-8 YAML file") \
            from None
    except OSError as err:
        raise ValueError(f"{path}: cannot be read ({err.strerror or err})") from None
    try:
        loader = _UniqueKeyLoader(text)
        try:
            root = loader.get_single_node()
            if root is not None and _expanded_nodes(root, {}) > MAX_YAML_NODES:
                raise ValueError(f"{path}: its aliases expand to more than {MAX_YAML_NODES:,} values (an alias "
                                 "bomb?); accepted: a file without self-multiplying anchors")
            return None if root is None else loader.construct_document(root)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ValueError(f"{where}: {err.problem or err.context}") from None
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML ({err})") from None

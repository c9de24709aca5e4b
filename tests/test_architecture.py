"""The package's layering, read from its imports, and the house style (ruff)."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "mxfp4"

# Each layer may import itself and the layers listed before it; the leaf modules import no mxfp4 layer.
LAYERS = ["numerics", "verify", "corrections", "config", "nn", "rl", "analysis", "report", "studies", "cli"]
LEAVES = {"io", "stats", "layout", "machine", "problems", "plugins"}
KERNEL_WRAPPERS = {"mxfp4.numerics.triton_kernels", "mxfp4.numerics.triton_gemm"}
KERNEL_CALLERS = {"mxfp4.numerics.dispatch", "mxfp4.verify.kernel_checks", *KERNEL_WRAPPERS}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, names: bool = False) -> set[str]:
    """Every mxfp4 module that ``path`` imports, at the top or inside a function (relative imports
    resolved; ``from x import y`` counted as x.y, which is what a submodule import names); with
    ``names``, the imported names themselves (``y`` of ``from x import y``)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("mxfp4")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("mxfp4"):
                out |= {a.name if names else f"{target}.{a.name}" for a in node.names}
    return out


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def _module_graph() -> dict[str, set[str]]:
    """Module -> the mxfp4 modules it imports (``x.y`` of ``from x import y`` read as module x when y is
    a name in x, not a submodule)."""
    graph = _graph()
    modules = set(graph)

    def module_of(target: str) -> str:
        while target not in modules and "." in target:
            target = target.rsplit(".", 1)[0]
        return target

    return {m: {module_of(t) for t in targets} - {m} for m, targets in graph.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(root):
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_the_import_reader_resolves_relative_imports():
    """The checks below see relative imports (``from ..numerics import dispatch`` in mxfp4/nn/linear.py),
    so their passing means something."""
    assert "mxfp4.numerics.dispatch" in _imports(PACKAGE / "nn" / "linear.py")
    assert "mxfp4.nn.linear.gemm_context" in _imports(PACKAGE / "nn" / "experts.py")


def test_every_layer_imports_only_the_layers_below_it():
    bad = []
    for module, targets in _graph().items():
        here = _layer(module)
        if here is None or here == "__main__":
            continue
        for target in targets:
            there = _layer(target)
            if there is None or there == here:
                continue
            if here in LEAVES:
                bad.append(f"{module} -> {target} (a leaf module imports no layer)")
            elif there not in LEAVES and there in LAYERS and LAYERS.index(there) > LAYERS.index(here):
                bad.append(f"{module} -> {target} (upward)")
    assert not bad, "\n".join(bad)


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle():
    """The check below means something: a three-module loop is found, a chain and a self-edge are not."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"d"}}) == []


def test_no_module_imports_itself_back_through_a_cycle():
    """No import cycle anywhere in the package, within a layer too, function-local imports counted."""
    assert not _cycles(_module_graph()), _cycles(_module_graph())


def test_the_reports_never_reach_the_rl_harness():
    """Tables, figures and claims read files; none of them loads TRL, directly or through another module."""
    graph = _module_graph()
    bad = {m: sorted(t for t in _reachable(graph, m) if t.startswith("mxfp4.rl"))
           for m in graph if m.startswith("mxfp4.report")}
    assert not any(bad.values()), {m: t for m, t in bad.items() if t}


def test_no_private_name_is_imported_from_another_module():
    bad = {_module_name(p): sorted(n for n in _imports(p, names=True) if n.startswith("_") and not n.startswith("__"))
           for p in PACKAGE.rglob("*.py")}
    assert not any(bad.values()), {m: n for m, n in bad.items() if n}


def test_the_quantized_layers_and_the_kernel_scripts_do_not_reach_into_rl():
    nn = [t for m, ts in _graph().items() if m.startswith("mxfp4.nn") for t in ts if t.startswith("mxfp4.rl")]
    assert not nn, nn
    for script in (REPO / "kernels").rglob("*.py"):
        if script.name == "bench_step.py":  # times the cell's own GRPO step: the one script that runs rl
            continue
        assert "mxfp4.rl" not in script.read_text(), script.name


def _layout_builders(path: Path) -> list[int]:
    """The lines of ``path`` that call ``Layout(...)``."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Layout"]


def test_only_the_entry_points_build_a_run_layout():
    """A run's layout is made once where the run starts (the command line, ``Run.of``) and handed down: no module
    of rl/, analysis/ or report/ rebuilds one from a results root and a profile name."""
    assert _layout_builders(PACKAGE / "config" / "run.py")  # the finder sees a call
    entry = {PACKAGE / "config" / "run.py", PACKAGE / "layout.py", *(PACKAGE / "cli").glob("*.py")}
    bad = {_module_name(p): _layout_builders(p) for p in PACKAGE.rglob("*.py") if p not in entry}
    assert not any(bad.values()), {m: lines for m, lines in bad.items() if lines}


def test_only_the_dispatch_and_the_kernel_checks_call_the_triton_wrappers():
    def is_wrapper(target: str) -> bool:
        return any(target == w or target.startswith(w + ".") for w in KERNEL_WRAPPERS)

    callers = {m for m, targets in _graph().items() if any(is_wrapper(t) for t in targets)}
    assert callers <= KERNEL_CALLERS, sorted(callers - KERNEL_CALLERS)


def test_no_module_cites_a_design_file_outside_the_repository():
    for path in [*PACKAGE.rglob("*.py"), *(REPO / "docs").glob("*.md"), REPO / "README.md",
                 *(REPO / "experiments").rglob("*.yaml"), *(REPO / "tests").rglob("*.py")]:
        if path.name != Path(__file__).name:
            assert "DESIGN.md" not in path.read_text(), path


# What a work log says and a reference harness's code and docs must not: issue numbers, dates, rounds and
# sessions, and words that narrate a change instead of describing what is.
HISTORY = re.compile(r"\bissues? #?\d+|\bissue-\d+|\b20\d\d-[01]\d-[0-3]\d\b|\b(?:this|last|next) (?:round|session)\b"
                     r"|\bsessions? \d+|\bas it always was\b|\bpreviously\b", re.IGNORECASE)
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".smk", ".sh", ".rst", ".toml", ".txt", ".cfg"}


def _sources() -> list[Path]:
    """Code, tests, docs and configs: every text file of the repository but the generated and stored results."""
    roots = ["mxfp4", "tests", "docs", "kernels", "workflow", "experiments", "figures"]
    files = [p for root in roots for p in (REPO / root).rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES]
    return [*files, REPO / "README.md", REPO / "Snakefile", REPO / "pyproject.toml", REPO / "setup.sh"]


def test_the_history_guard_finds_what_a_work_log_would_say():
    n, day = 7, "-".join(("2031", "01", "02"))  # built here, so this file holds no history of its own
    for text in (f"fixed in issue {n}", f"see Issue #{n}", f"issue-{n} targets", f"measured {day}", "in this round",
                 f"session {n}'s plan", "as it always was", "previously it failed"):
        assert HISTORY.search(text), text
    for text in ("the issue budget of 24.8 instructions", "arXiv 2605.20402", "seeds 10-12", "issue rate"):
        assert not HISTORY.search(text), text


def test_code_tests_and_docs_never_mention_their_history():
    """Issue numbers, dates and work-log words belong in commit messages, not in what a newcomer reads."""
    bad = [f"{p.relative_to(REPO)}:{i}: {line.strip()[:100]}" for p in _sources() if p.name != Path(__file__).name
           for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if HISTORY.search(line)]
    assert not bad, "\n".join(bad)


def test_the_code_passes_ruff():
    """The linter configuration in pyproject.toml ([tool.ruff]: line length, import order, TRL's rules)."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: pip install -e '.[test]'")
    r = subprocess.run([ruff, "check", "--no-cache", "."], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_the_correction_protocol_is_declared_not_inspected():
    """Every hook the code calls on a correction has a default in corrections/base.py, and nothing
    asks a correction what it has (getattr / hasattr / signature inspection)."""
    import torch

    from mxfp4.corrections import Correction
    from mxfp4.numerics.quantizer import Quantizer

    hooks = ["block_quantizer", "fake_quantize", "split", "takes_operand", "gemm_transform", "transforms_gemm",
             "blocks_per_group", "rows_per_group", "bind",
             "needs_reference", "bind_reference", "rollout_context", "perturbs_rollout", "observe", "state_dict",
             "load_state_dict", "metrics", "cost"]
    assert all(h in vars(Correction) for h in hooks)
    q = Quantizer(corrections=[Correction()])
    x = torch.randn(4, 64)
    assert torch.equal(q(x, -1, valid=torch.ones(4, 1, dtype=torch.bool)), Quantizer()(x, -1))
    assert (q.token_alignment(), q.row_alignment()) == (32, 1)
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        assert "inspect.signature" not in text, path
        for probe in ("getattr(c,", "hasattr(c,", "getattr(corr", "hasattr(corr"):
            assert probe not in text, (path, probe)


# A file of the repository as code and docs name it: a top-level folder, then a path ending in a file suffix (no
# placeholder such as <profile> or {model}).
REPO_PATH = re.compile(r"(?<![\w/.<{-])((?:mxfp4|docs|tests|kernels|experiments|workflow)/[\w./+-]*\w"
                       r"\.(?:py|md|yaml|smk|json|sh|cpp|rst|toml))(?![\w/])")


def test_every_repository_path_named_in_code_and_docs_exists():
    """A renamed or moved file leaves no reference behind in the package, the kernels, the workflow or the docs
    (the tests name missing files on purpose, and are not read)."""
    files = [*PACKAGE.rglob("*.py"), *(REPO / "kernels").rglob("*.py"), *(REPO / "kernels").rglob("*.md"),
             *(REPO / "workflow").rglob("*.smk"), *(REPO / "docs").glob("*.md"), REPO / "README.md",
             REPO / "Snakefile", *(REPO / "experiments").rglob("*.yaml")]
    missing = [f"{f.relative_to(REPO)}:{i}: {m.group(1)}" for f in files
               for i, line in enumerate(f.read_text(errors="replace").splitlines(), 1)
               for m in REPO_PATH.finditer(line) if not (REPO / m.group(1)).exists()]
    assert not missing, "\n".join(missing)
    assert REPO_PATH.search("see docs/corrections.md.") and not REPO_PATH.search("results/<profile>/cells.csv")


def test_every_public_callable_documents_its_arguments():
    """What a user calls or subclasses (``mxfp4``'s and ``mxfp4.corrections``' public names) says each of its
    arguments in an ``Args:`` section, as TRL's docstrings do (a result it only receives: ``Attributes:``)."""
    import inspect

    import mxfp4
    import mxfp4.corrections as corrections

    public = [getattr(mxfp4, n) for n in mxfp4.__all__] + [getattr(corrections, n) for n in corrections.__all__]
    missing = []
    for obj in public:
        if not callable(obj) or isinstance(obj, type) and issubclass(obj, Exception):
            continue
        params = [p for p in inspect.signature(obj).parameters if p not in ("self", "args", "kwargs")]
        doc = inspect.getdoc(obj) or ""
        heading = next((h for h in ("Args:", "Attributes:") if h in doc), None)
        section = doc.split(heading, 1)[1] if heading else ""
        absent = [p for p in params if p not in section]
        if params and absent:
            missing.append(f"{obj.__module__}.{obj.__qualname__}: {absent}")
    assert not missing, "\n".join(missing)

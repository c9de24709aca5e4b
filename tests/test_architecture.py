"""The package's layering, read from its imports, and the house style (ruff)."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "mxfp4"

# Each layer may import itself and the layers listed before it; the leaf modules import no mxfp4 layer.
LAYERS = ["numerics", "corrections", "config", "nn", "rl", "report", "cli"]
LEAVES = {"io", "stats", "layout", "machine"}
KERNEL_WRAPPERS = {"mxfp4.numerics.triton_kernels", "mxfp4.numerics.triton_gemm"}
KERNEL_CALLERS = {"mxfp4.numerics.dispatch", "mxfp4.numerics.kernel_checks", *KERNEL_WRAPPERS}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every mxfp4 module that ``path`` imports (relative imports resolved; ``from x import y``
    counted as x.y, which is what a submodule import names)."""
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
                out |= {f"{target}.{a.name}" for a in node.names}
    return out


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}


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


def test_the_quantized_layers_and_the_kernel_scripts_do_not_reach_into_rl():
    nn = [t for m, ts in _graph().items() if m.startswith("mxfp4.nn") for t in ts if t.startswith("mxfp4.rl")]
    assert not nn, nn
    for script in (REPO / "kernels").glob("*.py"):
        assert "mxfp4.rl" not in script.read_text(), script.name


def test_only_the_dispatch_and_the_kernel_checks_call_the_triton_wrappers():
    def is_wrapper(target: str) -> bool:
        return any(target == w or target.startswith(w + ".") for w in KERNEL_WRAPPERS)

    callers = {m for m, targets in _graph().items() if any(is_wrapper(t) for t in targets)}
    assert callers <= KERNEL_CALLERS, sorted(callers - KERNEL_CALLERS)


def test_no_module_cites_a_design_file_outside_the_repository():
    for path in [*PACKAGE.rglob("*.py"), *(REPO / "docs").glob("*.md"), REPO / "README.md",
                 *(REPO / "experiments").rglob("*.yaml"), *(REPO / "tests").glob("*.py")]:
        if path.name != Path(__file__).name:
            assert "DESIGN.md" not in path.read_text(), path


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

    hooks = ["block_quantizer", "fake_quantize", "split", "blocks_per_group", "rows_per_group", "bind",
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

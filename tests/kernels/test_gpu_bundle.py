"""The carried wheel bundle against the GPU image and the harness's requirements."""

import importlib.metadata
import json
from pathlib import Path

import pytest

from gpu_fixtures import kernels_script, session_env


def _wheel(folder: Path, name: str, version: str, module_text: str) -> Path:
    """A minimal pure-Python wheel of package ``name`` (one ``__init__.py``), as pip builds one."""
    import zipfile

    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": module_text,
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{dist}/RECORD"])
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for f, text in files.items():
            archive.writestr(f, text)
    return path


def test_the_gpu_wheel_bundle_pins_the_versions_the_harness_is_tested_with():
    bundle = kernels_script("gpu_bundle")
    wheels, pins = bundle.read_packages(bundle.WHEELS), bundle.read_packages(bundle.ROOT / "constraints.txt")
    assert {"transformers", "trl", "lm-eval", "datasets", "pydantic", "pydantic-core", "torchao"} <= set(wheels)
    assert {name: v for name, v in wheels.items() if name in pins and pins[name] != v} == {}
    assert "torch" not in wheels and "triton" not in wheels  # the machines' own CUDA builds stay


def test_the_requirement_walk_reads_markers_for_the_gpu_python_and_finds_absent_and_outdated_packages():
    bundle = kernels_script("gpu_bundle")
    roots = {"a": ["b>=2", "c", "d>=1.0", "e",
                   "tomli; python_version < '3.11'",     # false on the GPU's 3.12
                   "pywin32; sys_platform == 'win32'",   # false on Linux
                   "newer; python_version >= '3.12'"]}  # true there, false on this 3.11 interpreter
    present = {"b": "1.5", "c": "1.0", "d": None, "e": "2.0", "f": "0.9"}
    requires = {"c": ["f>=1"], "e": ["c"]}.get
    unmet, unverified = bundle.check(roots, present, requires, walk_into=lambda name: name in {"c", "e"})
    found = {(f.requirer, f.requirement, f.found) for f in unmet}
    assert found == {("a", "b>=2", "version 1.5"), ("a", "newer; python_version >= '3.12'", "absent"),
                     ("c", "f>=1", "version 0.9")}  # c is walked once though required twice
    assert [(f.requirer, f.requirement) for f in unverified] == [("a", "d>=1.0")]


def test_the_stand_in_for_the_gpu_image_takes_the_image_packages_required_at_the_image_versions(tmp_path):
    """What kernels/gpu/emulate_gpu_image.sh installs: the image's packages that the harness or a carried package
    requires, pinned where the image's version is known; never a carried one (the bundle shadows it) nor one
    nobody requires."""
    bundle = kernels_script("gpu_bundle")
    image, wheels = tmp_path / "image.txt", tmp_path / "wheels.txt"
    image.write_text("torch==2.11.0\ntriton==3.6.0\nnumpy==2.5.2\npyyaml\njax==0.11.2\npydantic==2.9.0\n")
    wheels.write_text("pydantic==2.14.3  # carried: shadows the image's copy\n")
    needed = bundle.required_from_image(image=image, wheels=wheels)
    # triton's requirement carries a marker (Linux): true on the GPU machines
    assert needed == {"numpy": "2.5.2", "pyyaml": None, "torch": "2.11.0", "triton": "3.6.0"}
    real = bundle.required_from_image()
    assert real["torch"] == "2.11.0" and real["triton"] == "3.6.0" and "transformers" not in real  # 5.23 carried


def test_the_carried_wheels_and_the_gpu_image_meet_every_requirement_of_the_harness(tmp_path):
    bundle = kernels_script("gpu_bundle")
    unmet, _, unread = bundle.check_here()
    assert unmet == []
    for name in unread:  # read from the wheel where .whl/ holds it, else from the installed copy
        with pytest.raises(importlib.metadata.PackageNotFoundError):
            importlib.metadata.version(name)
    # The walk reads the carried packages' real requirements: without httpx2, huggingface-hub 2 (and so
    # `import transformers`) would fail on the machine.
    without = tmp_path / "wheels.txt"
    without.write_text("".join(line + "\n" for line in bundle.WHEELS.read_text().splitlines()
                               if not line.startswith("httpx2==")))
    unmet, _, _ = bundle.check_here(wheels=without)
    assert [(f.requirer, f.found) for f in unmet if f.requirement.startswith("httpx2")] == [
        ("huggingface-hub", "absent")]
    with pytest.raises(ValueError, match=r"'torch==' is neither 'name' nor 'name==version'"):
        (tmp_path / "bad.txt").write_text("torch==\n")
        bundle.read_packages(tmp_path / "bad.txt")


@pytest.mark.slow
def test_the_carried_wheels_are_installed_once_and_shadow_the_images_own_packages(tmp_path):
    """On the device the carried wheels must win over the image's copies (transformers 5.23 over its 5.17), and a
    warm machine's next call must not install them again. A carried torchao 99.0 over this environment's own: the
    stack step reports the carried one, and a second call finds the bundle in place and leaves it."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    wheels, site = tmp_path / "whl", tmp_path / "site"
    wheels.mkdir()
    _wheel(wheels, "torchao", "99.0", "__version__ = '99.0'\n")
    for call in ("one", "two"):
        out = tmp_path / call
        env = session_env(out, tmp_path / f"work-{call}", wheels, SITE=str(site))
        done = subprocess.run(["bash", "kernels/gpu/gpu_session.sh", "stack"], cwd=root, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert json.loads((out / "stack.json").read_text())["torchao"] == "99.0"
        if call == "one":
            installed = (site / "torchao" / "__init__.py").stat().st_mtime_ns
    assert (site / "torchao" / "__init__.py").stat().st_mtime_ns == installed and (site / ".bundle").is_file()

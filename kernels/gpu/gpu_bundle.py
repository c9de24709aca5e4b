"""Does the carried wheel bundle complete the GPU machines' image?

The GPU machines have no network: what the harness needs beyond their image ('cuda', CPython 3.12 on x86-64
Linux) travels as the wheels of `gpu_wheels.txt`, installed there with `pip --no-deps --target`, which resolves
nothing. So a requirement of a carried package that neither the image nor the bundle meets is found only at
import time, on device time. This walks the requirements instead, the way pip's resolver reads them
(`packaging`'s requirement and marker grammar, the GPU machines' Python for the markers):

    python kernels/gpu/gpu_bundle.py            # here: requirements read from this environment's metadata,
                                            # checked against gpu_image_packages.txt + gpu_wheels.txt
    python kernels/gpu/gpu_bundle.py --installed --out stack_requirements.json
                                            # on the GPU machine (gpu_session.sh stack): every version known
    python kernels/gpu/gpu_bundle.py --image-pins   # the image's packages the harness needs, for a CPU stand-in

A requirement is "unmet" when its package is absent or present at a version outside its specifier, and
"unverified" when the image holds the package at a version nobody has read (checked on the machine).
"""

from __future__ import annotations

import argparse
import email.parser
import importlib.metadata as metadata
import json
import sys
import tomllib
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / "kernels" / "gpu" / "gpu_wheels.txt"
IMAGE = ROOT / "kernels" / "gpu" / "gpu_image_packages.txt"

# The GPU machines' interpreter, for environment markers (python3 there is CPython 3.12.3, x86-64 Linux).
GPU_PYTHON = {
    "python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
    "implementation_version": "3.12.3", "platform_python_implementation": "CPython", "os_name": "posix",
    "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "extra": "",
}
# What the GPU session runs: cells, tests and benchmarks straight from the checkout (PYTHONPATH), so the
# harness's own requirements with these extras, less the DAG runner and the linter it never calls there.
GPU_EXTRAS = ("rl", "test", "bench")
NOT_RUN_ON_GPU = {"snakemake", "ruff"}


@dataclass(frozen=True)
class Finding:
    requirer: str
    requirement: str
    found: str  # "absent", "version X" or "version not read"


def read_packages(path: Path) -> dict[str, str | None]:
    """`name==version` or bare `name` lines (comments after #) -> {canonical name: version or None}."""
    out: dict[str, str | None] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#")[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        if not name.strip() or (_ and not version.strip()):
            raise ValueError(f"{path}:{number}: '{line}' is neither 'name' nor 'name==version'")
        out[canonicalize_name(name)] = version.strip() or None
    return out


def harness_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The harness's requirements on a GPU machine: its dependencies and GPU_EXTRAS, less NOT_RUN_ON_GPU."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project.get("optional-dependencies", {})
    unknown = [name for name in GPU_EXTRAS if name not in extras]
    if unknown:
        raise ValueError(f"pyproject.toml has no extra {unknown}; it has {sorted(extras)}")
    specs = list(project["dependencies"]) + [spec for name in GPU_EXTRAS for spec in extras[name]]
    return [spec for spec in specs if canonicalize_name(Requirement(spec).name) not in NOT_RUN_ON_GPU]


def check(roots: dict[str, list[str]], present: dict[str, str | None], requires: Callable[[str], list[str]],
          walk_into: Callable[[str], bool], env: dict[str, str] = GPU_PYTHON) -> tuple[list[Finding], list[Finding]]:
    """Walk the requirements from `roots` ({requirer: requirement strings}) through the packages
    `walk_into` accepts (their requirements read by `requires`), against `present` ({name: version or None}).
    Returns (unmet, unverified)."""
    unmet: list[Finding] = []
    unverified: list[Finding] = []
    seen: set[str] = set()
    todo = list(roots.items())
    while todo:
        requirer, specs = todo.pop()
        for spec in specs:
            requirement = Requirement(spec)
            if requirement.marker is not None and not requirement.marker.evaluate(env):
                continue
            name = canonicalize_name(requirement.name)
            if name not in present:
                unmet.append(Finding(requirer, spec, "absent"))
                continue
            version = present[name]
            if version is None:
                if str(requirement.specifier):
                    unverified.append(Finding(requirer, spec, "version not read"))
            elif not requirement.specifier.contains(Version(version), prereleases=True):
                unmet.append(Finding(requirer, spec, f"version {version}"))
            if name not in seen and walk_into(name):
                seen.add(name)
                todo.append((name, requires(name)))
    key = lambda finding: (finding.requirer, finding.requirement)  # noqa: E731
    return sorted(unmet, key=key), sorted(unverified, key=key)


def installed_requirements(name: str) -> list[str] | None:
    """Requires-Dist of this environment's installed copy of ``name``; None where it is not installed."""
    try:
        return metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        return None


def _installed_or_empty(name: str) -> list[str]:
    return installed_requirements(name) or []


def wheel_requirements(name: str, version: str, folder: Path = ROOT / ".whl") -> list[str] | None:
    """Requires-Dist of the carried wheel itself (.whl/, made by fetch_gpu_wheels.sh), else of this
    environment's installed copy; None where neither is here."""
    for wheel in sorted(folder.glob("*.whl")) if folder.is_dir() else []:
        if parse_wheel_filename(wheel.name)[:2] == (name, Version(version)):
            with zipfile.ZipFile(wheel) as archive:
                info = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
                return email.parser.Parser().parsestr(archive.read(info).decode()).get_all("Requires-Dist") or []
    return installed_requirements(name)


def bundle_roots(carried: dict[str, str | None]) -> tuple[dict[str, list[str]], list[str]]:
    """({requirer: requirement strings} of the harness and of every carried package, the carried packages
    whose requirements could not be read here): where both checks of the bundle start."""
    requirements = {name: wheel_requirements(name, version) for name, version in carried.items()}
    roots = {"mxfp4": harness_requirements(), **{name: r for name, r in requirements.items() if r is not None}}
    return roots, sorted(name for name, r in requirements.items() if r is None)


def check_here(image: Path = IMAGE, wheels: Path = WHEELS) -> tuple[list[Finding], list[Finding], list[str]]:
    """Static: the image's list and the bundle's pins; the carried packages' requirements read from their
    wheels, else from this environment's installed copies (setup.sh installs most of them). Returns
    (unmet, unverified, the carried packages whose requirements could not be read here). The image's own
    packages are not walked into: the image was installed whole, so their requirements hold among themselves."""
    carried = read_packages(wheels)
    present = {**read_packages(image), **carried}  # a carried wheel shadows the image's copy (--target first)
    roots, unread = bundle_roots(carried)
    unmet, unverified = check(roots, present, _installed_or_empty, walk_into=lambda name: False)
    return unmet, unverified, unread


def check_installed() -> tuple[list[Finding], list[Finding], list[str]]:
    """On the machine: every distribution on sys.path at the version imports would find (the first on the
    path, so the carried copy over the image's), the whole closure walked."""
    present: dict[str, str | None] = {}
    for dist in metadata.distributions():  # sys.path order: the first of a name is the one imported
        if dist.metadata["Name"]:  # a broken install's metadata can lack it
            present.setdefault(canonicalize_name(dist.metadata["Name"]), dist.version)
    unmet, unverified = check({"mxfp4": harness_requirements()}, present, _installed_or_empty,
                              walk_into=lambda name: True)
    return unmet, unverified, []


def required_from_image(image: Path = IMAGE, wheels: Path = WHEELS) -> dict[str, str | None]:
    """The image's packages that the harness or a carried package requires directly, not carried themselves
    ({name: version, or None where unread}): what a CPU stand-in for the image must hold
    (kernels/gpu/emulate_gpu_image.sh installs them, each at the image's version where it is known)."""
    carried = read_packages(wheels)
    in_image = read_packages(image)
    roots, _ = bundle_roots(carried)
    needed: dict[str, str | None] = {}
    for spec in (spec for specs in roots.values() for spec in specs):
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        applies = requirement.marker is None or requirement.marker.evaluate(GPU_PYTHON)
        if applies and name in in_image and name not in carried:
            needed[name] = in_image[name]
    return dict(sorted(needed.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--installed", action="store_true",
                        help="check this machine's installed packages (on the GPU machine), not the lists")
    parser.add_argument("--out", type=Path, help="write the findings as JSON here")
    parser.add_argument("--image-pins", action="store_true",
                        help="print the image's packages the harness and the bundle need, as pip requirements "
                             "(name==version where the image's version is known), and nothing else")
    args = parser.parse_args(argv)
    if args.image_pins:
        for name, version in required_from_image().items():
            print(f"{name}=={version}" if version else name)
        return 0
    unmet, unverified, unread = check_installed() if args.installed else check_here()
    report = {"method": "installed metadata on sys.path" if args.installed
              else f"{IMAGE.name} + {WHEELS.name}, requirements from the wheels in .whl/ or installed copies",
              "unmet": [asdict(f) for f in unmet], "unverified": [asdict(f) for f in unverified],
              "requirements_not_read": unread}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    for label, findings in (("unmet", unmet), ("unverified (checked on the machine)", unverified)):
        print(f"{label}: {len(findings)}")
        for f in findings:
            print(f"  {f.requirer}: {f.requirement} ({f.found})")
    if unread:
        print(f"requirements not read (no wheel in .whl/, not installed here; kernels/gpu/fetch_gpu_wheels.sh "
              f"fetches them): {', '.join(unread)}")
    return 1 if unmet or unread else 0


if __name__ == "__main__":
    sys.exit(main())

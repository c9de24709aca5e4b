"""The package used outside a checkout: the wheel ships the recipes and profiles, and the README's ``quantize_``
lines run from it in a folder that is no checkout."""

import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds a wheel

REPO = Path(__file__).resolve().parent.parent


def test_the_declared_packages_are_every_package_of_the_source():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "mxfp4").rglob("__init__.py")}
    shipped = {"mxfp4.experiments", *(f"mxfp4.experiments.{d.name}" for d in (REPO / "experiments").iterdir()
                                      if d.is_dir())}
    assert set(declared) == found | shipped


def test_the_wheel_quantizes_a_model_outside_a_checkout(tmp_path):
    source = tmp_path / "source"  # a copy: building writes build/ and egg-info beside the sources
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "mxfp4", "experiments"):
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy
        copy(REPO / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                            if (REPO / name).is_dir() else {}))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(source)], check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("mxfp4-*.whl"))
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    script = textwrap.dedent(f"""
        import mxfp4, torch
        from pathlib import Path
        from transformers import AutoModelForCausalLM, Qwen2Config
        from mxfp4.config import EXPERIMENTS
        site = Path({str(site)!r})
        assert Path(mxfp4.__file__).is_relative_to(site), mxfp4.__file__
        assert EXPERIMENTS.is_relative_to(site) and (EXPERIMENTS / "profiles" / "embedded.yaml").is_file()
        config = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                             num_key_value_heads=1, vocab_size=128)
        model = AutoModelForCausalLM.from_config(config)
        mxfp4.quantize_(model, "mxfp4+all")   # the README's lines, with a model made here
        assert "MXLinear" in repr(model)
        mxfp4.unpatch_model(model)
        assert "MXLinear" not in repr(model)
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": str(site)}  # HOME kept: the fused CPU kernel's build cache
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]

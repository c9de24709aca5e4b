"""The study registry: each study declared in one module gets its command, its rule and its path; a study
registered from outside the package (``$MXFP4_PLUGINS``) gets them too, with nothing else added."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mxfp4.cli import build_parser
from mxfp4.layout import Layout
from mxfp4.studies import Study, registered

REPO = Path(__file__).resolve().parents[1]


def test_every_registered_study_has_its_command_its_path_and_its_method():
    studies = registered()
    assert "collapse-map" in studies
    commands = build_parser()._subparsers._group_actions[0].choices
    methods = (REPO / "docs" / "methods.md").read_text()
    for name, study in studies.items():
        assert name in commands and commands[name].get_default("study") is study
        out = study.output(Layout("results", "p"), "m")
        assert out.is_relative_to("results/p") and "m" in out.name  # under the run's results, one file a model
        if study.path is None:
            assert out == Path("results/p") / study.target / f"m{study.suffix}"
        assert f"### {study.method}" in methods or f"## {study.method}" in methods, study.method
        assert callable(study.function())
    assert studies["collapse-map"].output(Layout("results", "real-small-board"), "smollm2-135m") == \
        Path("results/real-small-board/collapse_map/smollm2-135m.csv")  # where the stored outputs were made
    assert studies["depth"].output(Layout("results", "depth"), "tiny-dense-l2") == \
        Path("results/depth/depth/tiny-dense-l2_units.csv")
    assert studies["depth-optimizers"].output(Layout("results", "depth"), "tiny-dense-l2") == \
        Path("results/depth/depth/optimizers/tiny-dense-l2_units.csv")


def test_a_study_name_is_one_command_and_one_folder():
    with pytest.raises(ValueError, match="study name 'Toy/seeds'; accepted: lowercase letters"):
        Study(name="Toy/seeds", help="", run="m:f", method="")
    with pytest.raises(ValueError, match="run 'f'; accepted: 'module:function'"):
        Study(name="toy", help="", run="f", method="")


@pytest.mark.slow
def test_a_study_from_outside_gets_its_command_its_rule_and_its_path(tmp_path):
    """tests/toy_study.py, named in $MXFP4_PLUGINS: `mxfp4 toy-seeds` runs it into the path it declares, and a dry
    run of Snakemake plans `toy_seeds` through `study_toy_seeds` for every model of the profile."""
    env = {**os.environ, "MXFP4_PLUGINS": "toy_study", "PYTHONPATH": str(REPO / "tests")}
    r = subprocess.run([sys.executable, "-m", "mxfp4", "toy-seeds", "--profile", "embedded", "--model", "tiny-dense",
                        "--results", str(tmp_path / "results"), "--scale", "3"], env=env, capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = tmp_path / "results/embedded/toy_seeds/tiny-dense.json"
    assert json.loads(out.read_text()) == {"model": "tiny-dense", "profile": "embedded", "seeds": [0, 3, 6]}
    bad = subprocess.run([sys.executable, "-m", "mxfp4", "toy-seeds", "--model", "tiny-dense", "--scale", "0"],
                         env=env, capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "--scale" in bad.stderr and bad.stderr.count("\n") == 1
    dry = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "toy_seeds"], cwd=REPO, env=env,
                         capture_output=True, text=True)
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    assert "results/embedded/toy_seeds/tiny-dense.json" in dry.stdout and "study_toy_seeds" in dry.stdout
    assert "results/embedded/toy_seeds/tiny-moe.json" in dry.stdout


def test_a_study_named_like_a_command_is_one_line(monkeypatch, capsys):
    from mxfp4 import studies
    from mxfp4.cli import main

    monkeypatch.setitem(studies.STUDIES, "cell", Study(name="cell", help="", run="toy:run", method=""))
    assert main(["formats"]) == 2
    assert capsys.readouterr().err == ("mxfp4: error: study 'cell' (toy:run) is named like a command of mxfp4; "
                                       "accepted: a name of its own\n")

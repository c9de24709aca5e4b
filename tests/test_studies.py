"""The study registry: each study declared in one module gets its command, its rule and its path; a study
registered from outside the package (``$MXFP4_PLUGINS``) gets them too, with nothing else added."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mxfp4.cli import build_parser
from mxfp4.config.profiles import load_profile
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
        axes = dict.fromkeys(study.axes, "AXIS")
        if study.scope == "model":
            out = study.output(Layout("results", "p"), "MODEL", **axes)
            # under the run's results, one file a model (and a value of each axis)
            assert out.is_relative_to("results/p") and "MODEL" in str(out) and ("AXIS" in str(out)) == bool(axes)
        else:
            out = study.output(Layout("results", "p"), **axes)
            given = [arg for a in study.axes for arg in (f"--{a}", "AXIS")]
            assert out.is_relative_to("results/p") and commands[name].parse_args(given).profile == "embedded"
        if study.path is None:
            assert out == Path("results/p") / study.target / f"MODEL{study.suffix}"
        assert f"### {study.method}" in methods or f"## {study.method}" in methods, study.method
        assert callable(study.function())
    assert studies["collapse-map"].output(Layout("results", "real-small-board"), "smollm2-135m") == \
        Path("results/real-small-board/collapse_map/smollm2-135m.csv")  # where the stored outputs were made
    assert studies["depth-gradients"].output(Layout("results", "depth"), "tiny-dense-l2") == \
        Path("results/depth/depth/tiny-dense-l2_units.csv")
    assert studies["depth-runs"].output(Layout("results", "depth"), "tiny-dense-l2") == \
        Path("results/depth/depth/optimizers/tiny-dense-l2_units.csv")
    assert studies["pathways"].outputs(Layout("results", "embedded"), "tiny-dense", checkpoint="warm") == \
        [Path("results/embedded/pathways/tiny-dense/warm.csv"),
         Path("results/embedded/pathways/tiny-dense/warm_units.csv")]
    assert studies["mechanism"].outputs(Layout("results", "networks"), "tiny-dense", recipe="mxfp4+smooth")[:2] == \
        [Path("results/networks/mechanism/mxfp4+smooth/tiny-dense_units.csv"),
         Path("results/networks/mechanism/mxfp4+smooth/tiny-dense_units.energy.json")]
    # the profile studies write where their stored baselines were made
    made = {"entropy-trajectory": ("networks-rl", ["entropy_trajectory.md", "entropy_trajectory.csv"]),
            "network-recovery": ("networks-rl", ["recovery_networks.md", "recovery_networks.csv"]),
            "headline": ("real-small-headline", ["headline.md", "headline.csv", "headline_curves.png"]),
            "network-claims": ("embedded", ["claims_networks.md"]), "claims": ("embedded", ["claims.md"]),
            "depth": ("depth", ["depth/depth.csv", "depth/depth.md", "depth/depth_shrinkage.csv",
                                "depth/depth_shrinkage.md"]),
            "depth-optimizers": ("depth", ["depth/depth_optimizers.csv", "depth/depth_optimizers.md"]),
            "dose-response": ("dose-response", ["dose_response/dose_response.csv", "dose_response/dose_response.md",
                                                "dose_response/dose_response_series.csv"]),
            "pathways-table": ("embedded", ["pathways/pathways.md", "pathways/pathways.csv"]),
            "mechanism-report": ("networks", ["mechanism/mxfp4+smooth.md", "mechanism/mxfp4+smooth.json"])}
    for name, (profile, files) in made.items():
        outputs = studies[name].outputs(Layout("results", profile), **dict.fromkeys(studies[name].axes, "mxfp4+smooth"))
        assert outputs == [Path("results") / profile / f for f in files]
        layout = Layout(REPO / "results", profile)
        assert all(layout.stored(REPO / "results" / profile / f).is_file() for f in files
                   if not f.endswith("_series.csv")), name  # the points file is stored from its next run on


def test_a_study_name_is_one_command_and_one_folder():
    with pytest.raises(ValueError, match="study name 'Toy/seeds'; accepted: lowercase letters"):
        Study(name="Toy/seeds", help="", run="m:f", method="")
    with pytest.raises(ValueError, match="run 'f'; accepted: 'module:function'"):
        Study(name="toy", help="", run="f", method="")
    with pytest.raises(ValueError, match="scope 'run'; accepted: model, profile"):
        Study(name="toy", help="", run="m:f", method="", scope="run")
    with pytest.raises(ValueError, match="a profile study names its output"):
        Study(name="toy", help="", run="m:f", method="", scope="profile")
    with pytest.raises(ValueError, match="axes checkpoint need a named output"):
        Study(name="toy", help="", run="m:f", method="", axes=("checkpoint",))
    with pytest.raises(ValueError, match="over='pathways' needs a profile study"):
        Study(name="toy", help="", run="m:f", method="", over="pathways")
    with pytest.raises(ValueError, match="axes model; accepted: names other than every study's options"):
        Study(name="toy", help="", run="m:f", method="", axes=("model",), path=lambda layout, model, **axes: "x")


def test_a_profile_study_is_over_a_registered_model_study_of_its_axes(monkeypatch):
    from mxfp4 import studies

    monkeypatch.setattr(studies, "STUDIES", dict(studies.registered()))
    assert studies.registered()["mechanism-report"].over == "mechanism"
    for over in ("nothing", "claims", "pathways"):  # no study; a profile study; axes (checkpoint) it lacks
        monkeypatch.setitem(studies.STUDIES, "toy", Study(name="toy", help="", run="m:f", method="", scope="profile",
                                                          path=lambda layout, model: "x", over=over))
        with pytest.raises(ValueError, match=f"study 'toy': over='{over}'; accepted: a registered model study"):
            studies.registered()


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
    # the profile study: its command reads the model study's files and writes its page and the file beside it
    results = ["--profile", "embedded", "--results", str(tmp_path / "results")]
    assert list(load_profile("embedded").models) == ["tiny-dense", "tiny-moe"]
    subprocess.run([sys.executable, "-m", "mxfp4", "toy-seeds", "--model", "tiny-moe", *results], env=env, check=True,
                   capture_output=True, cwd=tmp_path)  # seeds 0, 1, 2 unscaled
    r = subprocess.run([sys.executable, "-m", "mxfp4", "toy-summary", *results], env=env, capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "results/embedded/toy_summary.md").read_text() == "seeds summed over 2 models: 12\n"
    assert (tmp_path / "results/embedded/toy_summary.csv").read_text() == "total\n12\n"
    bad = subprocess.run([sys.executable, "-m", "mxfp4", "toy-summary", "--model", "tiny-dense"], env=env,
                         capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "unrecognized arguments: --model" in bad.stderr  # a profile study takes none
    # its rule waits for every model's file (study_toy_seeds each), and its store rule keeps both outputs
    dry = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "store_toy_summary"], cwd=REPO,
                         env=env, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    for planned in ("rule study_toy_summary:", "rule store_toy_summary:", "results/embedded/toy_summary.csv",
                    "results/embedded/toy_seeds/tiny-moe.json"):
        assert planned in dry.stdout, planned


@pytest.mark.slow
def test_a_study_with_an_axis_gets_a_wildcard_and_a_profile_study_over_it_gets_its_files(tmp_path):
    """tests/toy_study.py's toy-powers (an axis, power) and toy-powers-table (over it, at each power): the command
    writes where the axis puts it, the rule of each model and power is one job, and the table of a power waits for
    and is given every model's file at that power, not another power's."""
    env = {**os.environ, "MXFP4_PLUGINS": "toy_study", "PYTHONPATH": str(REPO / "tests")}
    results = ["--profile", "embedded", "--results", str(tmp_path / "results")]
    for model in ("tiny-dense", "tiny-moe"):
        subprocess.run([sys.executable, "-m", "mxfp4", "toy-powers", "--model", model, "--power", "2", *results],
                       env=env, check=True, capture_output=True, cwd=tmp_path)
    files = sorted((tmp_path / "results/embedded/toy_powers").glob("*/2.json"))
    assert [f.parent.name for f in files] == ["tiny-dense", "tiny-moe"]
    assert json.loads(files[0].read_text()) == [0, 1, 4]  # embedded's seeds 0, 1, 2 squared
    r = subprocess.run([sys.executable, "-m", "mxfp4", "toy-powers-table", "--power", "2", *map(str, files),
                        *results], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "results/embedded/toy_powers/table_2.md").read_text() == "power 2: 10\n"
    dry = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "--cores", "1", "toy_powers_table"],
                         cwd=REPO, env=env, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    jobs = dry.stdout.splitlines()
    assert jobs.count("rule study_toy_powers:") == 4 and jobs.count("rule study_toy_powers_table:") == 2  # 2 x 2
    table = next(line for line in dry.stdout.splitlines() if "toy-powers-table --profile embedded --power '2'" in line)
    assert "toy_powers/tiny-dense/2.json" in table and "toy_powers/tiny-moe/2.json" in table
    assert "1.json" not in table


def test_a_study_named_like_a_command_is_one_line(monkeypatch, capsys):
    from mxfp4 import studies
    from mxfp4.cli import main

    monkeypatch.setitem(studies.STUDIES, "cell", Study(name="cell", help="", run="toy:run", method=""))
    assert main(["formats"]) == 2
    assert capsys.readouterr().err == ("mxfp4: error: study 'cell' (toy:run) is named like a command of mxfp4; "
                                       "accepted: a name of its own\n")


@pytest.mark.parametrize("argv, refusal", [
    (["mechanism", "--profile", "networks", "--model", "tiny-dense", "--recipe", "mxfp4+tis", "mxfp4+macro"],
     "2 values of --recipe measured together need --out (one file for all)"),
    (["real-leaderboard", "--profile", "networks", "--out", "{out}"],
     "profile 'networks' has no named pretrained model"),
    (["real-leaderboard-place", "--profile", "embedded", "--recipe", "mxfp4+tis", "--out", "{out}"],
     "profile 'embedded' has no named pretrained model"),
    (["leaderboard", "--profile", "embedded", "--out", "{out}"],
     "profile 'embedded' ranks no recipes (leaderboard: [...])"),
    (["leaderboard-place", "--profile", "networks", "--recipe", "mxfp4+macro", "--out", "{out}"],
     "--recipe mxfp4+macro is on the stored board; a recipe placed with its own units needs a name of its own"),
    (["pathways-table", "--profile", "gpu-smoke-quick", "--results", "nowhere", "--out", "{out}"],
     "profile 'gpu-smoke-quick' measures no pathways"),
])
def test_the_board_and_axis_studies_refuse_in_one_line_before_any_work(argv, refusal, tmp_path, capsys, monkeypatch):
    """Several values of an axis without --out, a board of a profile without its model or recipes, a placed recipe
    named like a board's, a table of no pathways: one line each, nothing written."""
    from mxfp4.cli import main

    monkeypatch.chdir(REPO)
    assert main([a.format(out=tmp_path / "out.md") for a in argv]) == 2
    err = capsys.readouterr().err
    assert refusal in err and err.count("\n") == 1, err
    assert not (tmp_path / "out.md").exists()


def test_the_board_and_mechanism_commands_remake_their_stored_pages_from_the_stored_files(tmp_path, monkeypatch):
    """The registered commands, given the stored baselines as the run's results, find the files their rules hand them
    where the stored ones are kept and remake the stored pages byte for byte: the real-model board from its stored
    measures and pathway units, a recipe's mechanism report from its stored per-unit files and energies."""
    from mxfp4.cli import main

    monkeypatch.chdir(REPO)
    stored = REPO / "results" / "baselines"
    argv = ["--results", str(stored), "--out"]
    assert main(["real-leaderboard", "--profile", "real-small-board", *argv, str(tmp_path / "real.md")]) == 0
    assert (tmp_path / "real.md").read_bytes() == (stored / "real-small-board/real_board/LEADERBOARD.md").read_bytes()
    assert (tmp_path / "real.json").read_bytes() == \
        (stored / "real-small-board/real_board/LEADERBOARD.json").read_bytes()
    assert main(["mechanism-report", "--profile", "networks-outliers", "--recipe", "mxfp4+smooth", *argv,
                 str(tmp_path / "mechanism.md")]) == 0
    assert (tmp_path / "mechanism.md").read_bytes() == \
        (stored / "networks-outliers/mechanism/mxfp4+smooth.md").read_bytes()


@pytest.fixture
def toy_profiles(tmp_path, monkeypatch):
    """The profiles of experiments/profiles/ with one more written here (a toy profile that sets the toy study's
    block), and tests/toy_study.py registered as a plugin, each undone afterwards."""
    import shutil

    from mxfp4 import studies
    from mxfp4.config import profiles

    folder = tmp_path / "profiles"
    shutil.copytree(profiles.PROFILES_DIR, folder)
    monkeypatch.setattr(profiles, "PROFILES_DIR", folder)
    monkeypatch.setattr(studies, "STUDIES", dict(studies.STUDIES))
    monkeypatch.delitem(sys.modules, "toy_study", raising=False)
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    monkeypatch.setenv("MXFP4_PLUGINS", "toy_study")
    return folder


def test_a_toy_study_is_one_module_and_its_block_in_a_profile_yaml(toy_profiles, tmp_path, capsys):
    """The toy study reads its own block of a profile written here (``studies: {toy-seeds: {scale: 3}}``), validated
    by its settings model: a bad value or a block naming no study is one line before any work."""
    from mxfp4.cli import main
    from mxfp4.config.profiles import load_profile
    from mxfp4.studies import check_study_settings

    (toy_profiles / "toy.yaml").write_text("base: embedded\nname: toy\nstudies:\n  toy-seeds: {scale: 3}\n")
    results = ["--results", str(tmp_path / "results")]
    assert main(["toy-seeds", "--profile", "toy", "--model", "tiny-dense", *results]) == 0
    out = json.loads((tmp_path / "results/toy/toy_seeds/tiny-dense.json").read_text())
    assert out == {"model": "tiny-dense", "profile": "toy", "seeds": [0, 3, 6]}
    check_study_settings(load_profile("toy"))

    (toy_profiles / "toy.yaml").write_text("base: embedded\nname: toy\nstudies:\n  toy-seeds: {scale: 0}\n")
    capsys.readouterr()
    assert main(["toy-seeds", "--profile", "toy", "--model", "tiny-dense", *results]) == 2
    assert capsys.readouterr().err == ("mxfp4 toy-seeds: error: profile 'toy': studies.toy-seeds.scale: Input "
                                       "should be greater than or equal to 1\n")
    (toy_profiles / "toy.yaml").write_text("base: embedded\nname: toy\nstudies:\n  toy-sed: {scale: 2}\n")
    with pytest.raises(ValueError, match="studies.toy-sed: no registered study 'toy-sed'; accepted: .*toy-seeds"):
        check_study_settings(load_profile("toy"))
    (toy_profiles / "toy.yaml").write_text("base: embedded\nname: toy\nstudies:\n  headline: {model: x}\n")
    with pytest.raises(ValueError, match="studies.headline: the study takes no settings"):
        check_study_settings(load_profile("toy"))

"""The figure registry: one entry makes a figure drawable by the CLI and a rule of the workflow."""

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from mxfp4.cli import main  # noqa: E402
from mxfp4.report.figures import FIGURES, FigureSpec, register_figure  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def draw_toy(csv_path, out_stem):
    """A toy drawing function: one line through the CSV's x, y columns."""
    rows = [line.split(",") for line in Path(csv_path).read_text().splitlines()[1:]]
    fig, ax = plt.subplots()
    ax.plot([float(r[0]) for r in rows], [float(r[1]) for r in rows])
    out = Path(out_stem).with_suffix(".png")
    fig.savefig(out)
    plt.close(fig)
    return [out]


@pytest.fixture
def toy_figure():
    spec = register_figure(FigureSpec("toy", "toy_curve", f"{__name__}:draw_toy", lambda lay: lay.root / "toy.csv",
                                      "toy.csv of the test", "Toy", columns=("x", "y")))
    yield spec
    FIGURES.pop("toy")  # the registry as it was


def test_one_registry_entry_makes_a_figure_the_cli_draws_and_checks(toy_figure, tmp_path):
    data = tmp_path / "toy.csv"
    data.write_text("x,y\n0,1\n1,3\n")
    out = tmp_path / "toy_curve.png"
    assert main(["plot", "toy", str(data), "--out", str(out)]) == 0 and out.stat().st_size > 1000
    (tmp_path / "bad.csv").write_text("x,z\n0,1\n")
    assert main(["plot", "toy", str(tmp_path / "bad.csv"), "--out", str(out)]) == 2  # no y column: refused


def test_a_name_or_stem_taken_twice_is_refused(toy_figure):
    for clash in (FigureSpec("toy", "other", "draw_toy", lambda lay: lay.root, "-", "Toy"),
                  FigureSpec("other", "toy_curve", "draw_toy", lambda lay: lay.root, "-", "Toy")):
        with pytest.raises(ValueError, match="clashes"):
            register_figure(clash)


def test_every_registered_figure_draws_with_a_function_and_a_caption_that_exist():
    for spec in FIGURES.values():
        assert callable(spec.drawing()), spec.name
        assert (REPO / "workflow" / "report" / spec.caption_file()).is_file(), spec.name


def test_the_workflow_names_no_figure_of_its_own():
    """The figure rules, the figures target, the study targets and the stored baselines all derive from the
    registry: no rule file names a registered figure's file (``L.figure("<stem>"...)``, ``<stem>.png``), and a
    figure drawn for a study's target is asked for through its study (``study_figures``)."""
    stems = {spec.stem for spec in FIGURES.values()}
    text = "\n".join(p.read_text() for p in [REPO / "Snakefile", *(REPO / "workflow" / "rules").glob("*.smk")])
    named = {s for s in stems if re.search(rf"figure\(\s*f?[\"']{s}\b|\b{s}\.(png|pdf)\b", text)}
    assert not named, named
    from mxfp4.studies import registered

    targets = {study.target for study in registered().values() if study.collect}
    for study in {spec.study for spec in FIGURES.values()} - {""}:  # a registered study's, or a rule's of its own
        assert study in targets or f'study_figures("{study}"' in text, study

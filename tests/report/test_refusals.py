"""What the reports refuse: a finished cell that is partial, edited or stale (aggregate), and references
that are missing, partial, of another profile or of another setting (compare). Each case is one
ValueError naming the file and the field; the untouched run passes, so each refusal is the case's."""

import json
import shutil

import pytest

from mxfp4.config.profiles import load_profile
from mxfp4.config.run import Run
from mxfp4.layout import EVAL_FOLDERS, METRICS, TABLES, TRAIN_LOG, Layout
from mxfp4.report.aggregate import aggregate, read_csv, write_csv
from mxfp4.report.compare import run_compare
from mxfp4.rl.cell import run_cell

CELL = ("tiny-dense", "mxfp4", 0)


@pytest.fixture(scope="module")
def finished(smoke_results, tmp_path_factory):
    """A smoke run with the cells tiny-dense/{bf16,mxfp4}/seed0, aggregated into stored baselines."""
    root = tmp_path_factory.mktemp("finished")
    shutil.copytree(smoke_results / "smoke" / "models", root / "smoke" / "models")
    for recipe in ("bf16", "mxfp4"):
        run_cell(Run.of("smoke", root).cell("tiny-dense", recipe, 0))
    aggregate(Layout(root, "smoke"), root / "stored", load_profile("smoke"), allow_missing=True)
    return root


@pytest.fixture
def run(finished, tmp_path):
    shutil.copytree(finished, tmp_path, dirs_exist_ok=True)
    return tmp_path


def _cell(root):
    return Layout(root, "smoke").cell(*CELL)


def _edit_metrics(**changes):
    def edit(root):
        path = _cell(root) / METRICS
        m = json.loads(path.read_text())
        m.update(changes)
        path.write_text(json.dumps(m))
    return edit


def _duplicate_a_log_line(root):
    path = _cell(root) / TRAIN_LOG
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], *lines]) + "\n")
    _edit_metrics(train_log_sha256=None)(root)  # the digest aside: the step check alone


def _keep_first_log_line(root):
    path = _cell(root) / TRAIN_LOG
    path.write_text(path.read_text().splitlines()[0] + "\n")


def _stopped_short(root):
    """A cell whose run state was edited to skip its last step: a consistent log and metrics of one step less."""
    path = _cell(root) / TRAIN_LOG
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))
    _edit_metrics(steps=2, train_log_sha256=None)(root)


def _delete_samples(root):
    for f in (_cell(root) / EVAL_FOLDERS["after"]).glob("samples_*.jsonl"):
        f.unlink()


def _profile_with_more_steps():
    p = load_profile("smoke")
    return p.model_copy(update={"grpo": p.grpo.model_copy(update={"max_steps": p.grpo.max_steps + 1})})


AGGREGATE = [  # (case, how the run is changed, the profile aggregate is given, the refusal)
    ("metrics.json is {}", lambda r: (_cell(r) / METRICS).write_text("{}"), None,
     r"metrics.json: profile: missing; model: missing"),
    ("metrics.json is not JSON", lambda r: (_cell(r) / METRICS).write_text("{"), None,
     r"metrics.json: not a JSON object"),
    ("mean_entropy NaN", _edit_metrics(mean_entropy=float("nan")), None,
     r"metrics.json: mean_entropy: Input should be a finite number"),
    ("an accuracy given as a string", _edit_metrics(gsm8k_strict_accuracy="0.5"), None,
     r"metrics.json: gsm8k_strict_accuracy: Input should be a valid number"),
    ("an accuracy above 1", _edit_metrics(gsm8k_strict_accuracy=1.5), None,
     r"gsm8k_strict_accuracy: Input should be less than or equal to 1"),
    ("a log line twice", _duplicate_a_log_line, None, r"train_log.jsonl:2: expected step 2, got 1"),
    ("a log of a rerun stopped after one step", _keep_first_log_line, None,
     r"train_log.jsonl: not the log the cell finished with"),
    ("the log deleted", lambda r: (_cell(r) / TRAIN_LOG).unlink(), None, r"train_log.jsonl: missing beside"),
    ("the per-problem samples deleted", _delete_samples, None,
     r"eval: the cell records its after evaluation, and no lm-eval samples"),
    ("a cell that stopped a step short", _stopped_short, None,
     r"metrics.json: steps 2, but profile 'smoke' trains 3 \(grpo.max_steps\); rerun the cell"),
    ("the before-RL evaluation deleted", lambda r: shutil.rmtree(_cell(r) / EVAL_FOLDERS["before"]), None,
     r"eval_before: the cell records its before evaluation, and no lm-eval samples_\*.jsonl is there"),
    ("a profile edited after the run", lambda r: None, _profile_with_more_steps(),
     r"made from other settings than profile 'smoke' gives now \(recorded -> now: grpo.max_steps: 3 -> 4\)"),
]


@pytest.mark.slow
@pytest.mark.parametrize("case,damage,profile,refusal", AGGREGATE, ids=[c[0] for c in AGGREGATE])
def test_aggregate_refuses_a_partial_edited_or_stale_cell(run, case, damage, profile, refusal):
    aggregate(Layout(run, "smoke"), run / "before", load_profile("smoke"), allow_missing=True)  # untouched: passes
    profile = profile or load_profile("smoke")
    damage(run)
    with pytest.raises(ValueError, match=refusal) as err:
        aggregate(Layout(run, "smoke"), run / "after", profile, allow_missing=True)
    assert "\n" not in str(err.value)


def test_aggregate_takes_the_profiles_grid_exactly(run, capsys):
    layout = Layout(run, "smoke")
    with pytest.raises(ValueError, match=r"4 cell\(s\) of profile 'smoke'.s grid not finished under .*: "
                                         r"tiny-dense/mxfp4\+all/seed0, tiny-moe/bf16/seed0, .*--allow-missing"):
        aggregate(layout, run / "strict", load_profile("smoke"))
    shutil.copytree(_cell(run), layout.cell("tiny-dense", "mxfp4", 7))  # a seed the profile does not list
    path = layout.cell("tiny-dense", "mxfp4", 7) / METRICS
    path.write_text(json.dumps({**json.loads(path.read_text()), "seed": 7}))
    counts = aggregate(layout, run / "grid", load_profile("smoke"), allow_missing=True)
    assert counts["cells"] == 2 and "left out 1 cell(s) outside profile 'smoke'" in capsys.readouterr().err
    assert {r["seed"] for r in read_csv(run / "grid" / TABLES["cells"])} == {0}
    assert aggregate(layout, run / "wide", load_profile("smoke"), allow_missing=True, outside_grid=True)["cells"] == 3


def test_aggregate_refuses_a_cell_whose_recipe_changed_since_it_ran(run, tmp_path, monkeypatch):
    changed = tmp_path / "recipes.yaml"
    changed.write_text("mxfp4:\n  scale_rule: ceil\n")
    monkeypatch.setenv("MXFP4_RECIPES", str(changed))
    with pytest.raises(ValueError, match=r"recipe 'mxfp4' has changed since the cell ran \(recorded -> now: "
                                         r"scale_rule: 'floor' -> 'ceil'\)"):
        aggregate(Layout(run, "smoke"), run / "after", load_profile("smoke"), allow_missing=True)


def _edit_stored(column, value, where=lambda r: True):
    def edit(root):
        path = root / "stored" / TABLES["cells"]
        rows = read_csv(path)
        write_csv([{**r, column: value} if where(r) else r for r in rows], path)
    return edit


def _header_only(root):
    path = root / "stored" / TABLES["cells"]
    path.write_text(path.read_text().splitlines()[0] + "\n")


def _drop_bf16(root):
    path = root / "stored" / TABLES["cells"]
    write_csv([r for r in read_csv(path) if r["recipe"] != "bf16"], path)


COMPARE = [  # (case, how the stored baselines are changed, compare's options, the refusal)
    ("baselines of another profile", _edit_stored("profile", "embedded"), {},
     r"holds cells of profile\(s\) embedded, not 'smoke'"),
    ("a header-only cells.csv", _header_only, {}, r"cells.csv holds no cells"),
    ("no bf16 cells", _drop_bf16, {}, r"has no cells of tiny-dense/bf16, a primary reference of 'mxfp4'"),
    ("a bf16 seed missing", _edit_stored("seed", 7, lambda r: r["recipe"] == "bf16"), {},
     r"lacks seed\(s\) \[0\] of tiny-dense/bf16 that 'mxfp4' ran"),
    ("items.csv deleted", lambda r: (r / "stored" / TABLES["items"]).unlink(), {},
     r"per-problem items of tiny-dense/bf16 are missing .* or pass --no-items"),
    ("another setting", _edit_stored("setting_hash", "0123456789ab"), {},
     r"the setting differs from the baselines' .* pass --allow-setting-difference"),
    ("the baselines missing", lambda r: shutil.rmtree(r / "stored"), {}, r"stored/cells.csv do not exist"),
]


@pytest.mark.slow
@pytest.mark.parametrize("case,damage,options,refusal", COMPARE, ids=[c[0] for c in COMPARE])
def test_compare_refuses_missing_partial_or_foreign_references(run, case, damage, options, refusal):
    stored = run / "stored" / TABLES["cells"]
    run_compare(Layout(run, "smoke"), "mxfp4", stored, run / "before.md", **options)  # the untouched run compares
    damage(run)
    with pytest.raises(ValueError, match=refusal) as err:
        run_compare(Layout(run, "smoke"), "mxfp4", stored, run / "after.md", **options)
    assert "\n" not in str(err.value)


def test_compare_reports_a_reduced_comparison_only_when_asked(run):
    stored = run / "stored" / TABLES["cells"]
    (run / "stored" / TABLES["items"]).unlink()
    rows = run_compare(Layout(run, "smoke"), "mxfp4", stored, run / "seeds.md", items=False)
    assert rows and not [r for r in rows if "per problem" in r["metric"]]
    assert "Per-problem rows left out (--no-items)" in (run / "seeds.md").read_text()
    _edit_stored("setting_hash", "0123456789ab")(run)
    run_compare(Layout(run, "smoke"), "mxfp4", stored, run / "other.md", items=False, allow_setting_difference=True)
    assert "WARNING: the setting differs from the baselines'" in (run / "other.md").read_text()


def test_a_cell_without_a_learning_signal_is_labelled_never_a_gain_of_zero():
    """Every advantage zero at every step (TRL's frac_reward_zero_std = 1): the cell's RL gain is left out of the
    summary with the reason in its method, and its per-problem items leave the crossed RL gain."""
    from mxfp4.report.aggregate import learning_signal_steps, rl_gain_rows, summarize

    assert learning_signal_steps([{"frac_reward_zero_std": 1.0}, {"frac_reward_zero_std": 0.5}]) == 1
    assert learning_signal_steps([{"loss": 0.1}]) is None
    cells = [{"model": "m", "recipe": "r", "seed": s, "gsm8k_rl_gain": g, "learning_signal_steps": n}
             for s, g, n in ((0, 0.0, 0), (1, 0.10, 3), (2, 0.20, 3))]
    gain = next(r for r in summarize(cells) if r["metric"] == "gsm8k_rl_gain")
    assert gain["n"] == 2 and gain["mean"] == pytest.approx(0.15)
    assert "1 of 3 cells had no learning signal (every advantage zero) and are left out" in gain["method"]
    items = [{"model": "m", "recipe": "r", "seed": s, "doc_id": d, "doc_hash": str(d), "strict": 1.0,
              "strict_before": 0.0} for s in (0, 1, 2) for d in range(4)]
    assert rl_gain_rows(items, {("m", "r", 0)})[0]["seeds"] == 2

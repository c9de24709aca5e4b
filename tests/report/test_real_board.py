"""The real-model board's ranking, reader and placement on constructed board folders, against a direct count."""

import json

import numpy as np
import pytest
from scipy import stats

from mxfp4.io import write_csv_atomic
from mxfp4.report.real_board import attach, board, placed, read_board, run
from mxfp4.report.tables import TableError

FIELDS = ["model", "recipe", "doc_id", "doc_hash", "strict", "flexible", "repetitive", "garbled", "error", "same_as"]
N = 60


def _folder(tmp_path, scores: dict[str, np.ndarray], name="board", same_as=None):
    folder = tmp_path / name
    folder.mkdir()
    rows = []
    for recipe, s in scores.items():
        rows += [{"model": "m", "recipe": recipe, "doc_id": i, "doc_hash": f"h{i}", "strict": float(v),
                  "flexible": float(v), "repetitive": i % 7 == 0 and recipe != "bf16", "garbled": False,
                  "error": i % 7 == 0 and recipe != "bf16", "same_as": (same_as or {}).get(recipe, "")}
                 for i, v in enumerate(s)]
    write_csv_atomic(folder / "items.csv", rows, FIELDS)
    record = {"model": "m", "error_rule": "rule", "training_pass": "pass", "check": "check",
              "recipes": {r: {"training_pass_seconds": 1.0 + i, "training_pass_ratio": 1.0 + i,
                              "bf16_element_fraction": 0.2 if r == "mxfp4+bf16-edges" else 0.0,
                              "same_as": (same_as or {}).get(r)} for i, r in enumerate(scores)}}
    (folder / "recipes.json").write_text(json.dumps(record))
    return folder


def _scores(seed=0):
    rng = np.random.default_rng(seed)
    bf16 = (rng.random(N) < 0.5).astype(float)
    return {"bf16": bf16, "mxfp4": np.zeros(N), "mxfp4+aqn": np.zeros(N),
            "mxfp4+bf16-edges": np.where(rng.random(N) < 0.8, bf16, 0.0)}


def test_ranks_ties_and_told_apart_sets_match_a_direct_paired_t_with_holm(tmp_path):
    scores = _scores()
    items, record = read_board(_folder(tmp_path, scores, same_as={"mxfp4+aqn": "mxfp4"}))
    rows = {r["recipe"]: r for r in board(items, record)}
    assert rows["bf16"]["rank"] == 1 and rows["mxfp4"]["rank"] == rows["mxfp4+aqn"]["rank"] == 3  # a tie is a tie
    d = scores["mxfp4+bf16-edges"] - scores["bf16"]
    ci = stats.ttest_1samp(d, 0).confidence_interval(0.95)
    edges = rows["mxfp4+bf16-edges"]
    assert edges["diff"] == pytest.approx(d.mean()) and edges["ci_low"] == pytest.approx(ci.low)
    assert edges["extra_bits_per_element"] == pytest.approx(0.2 * (16 - 4.25))
    assert edges["precision"] == "W4A4" and rows["bf16"]["precision"] == "BF16"
    names = list(scores)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    p = []
    for a, b in pairs:
        diff = scores[a] - scores[b]
        p.append(1.0 if not diff.any() else stats.ttest_1samp(diff, 0).pvalue)
    holm = sorted(range(len(p)), key=lambda i: p[i])
    apart, still = set(), True
    for k, i in enumerate(holm):
        still = still and p[i] <= 0.05 / (len(p) - k)
        if still:
            apart.add(pairs[i])
    for a, b in pairs:
        told = rows[b]["rank"] in rows[a]["apart_from"]
        assert told == ((a, b) in apart), (a, b)
    assert rows["mxfp4"]["error_rate"] == pytest.approx(np.mean([i % 7 == 0 for i in range(N)]))


def test_a_recipe_on_other_problems_or_a_missing_bf16_is_one_line(tmp_path):
    scores = _scores()
    folder = _folder(tmp_path, scores)
    text = (folder / "items.csv").read_text().splitlines()
    (folder / "items.csv").write_text("\n".join(line for line in text if not line.startswith("m,mxfp4,5,")) + "\n")
    with pytest.raises(TableError, match="recipe 'mxfp4' scored 59 problems"):
        read_board(folder)
    (folder / "items.csv").write_text("\n".join(line for line in text if ",bf16," not in line) + "\n")
    with pytest.raises(TableError, match="no bf16 rows"):
        read_board(folder)
    (folder / "items.csv").write_text("\n".join(text).replace("m,mxfp4,3,h3,0.0", "m,mxfp4,3,h3,0.5", 1) + "\n")
    with pytest.raises(TableError, match="strict"):
        read_board(folder)


def test_a_placed_recipe_joins_once_bf16_reproduces_and_never_under_a_stored_name(tmp_path, monkeypatch):
    (tmp_path / "mine.yaml").write_text("mine: {base: mxfp4, scale_rule: ceil}\n")
    monkeypatch.setenv("MXFP4_RECIPES", str(tmp_path / "mine.yaml"))
    scores = _scores()
    stored = read_board(_folder(tmp_path, scores))
    mine = {"bf16": scores["bf16"], "mine": scores["bf16"].copy()}
    items, record = placed(stored, read_board(_folder(tmp_path, mine, "mine")), "mine")
    rows = {r["recipe"]: r for r in board(items, record)}
    assert rows["mine"]["rank"] == rows["bf16"]["rank"] == 1 and len(rows) == 5
    with pytest.raises(ValueError, match="'mxfp4' is already on the stored board"):
        placed(stored, read_board(_folder(tmp_path, {"bf16": scores["bf16"], "mxfp4": np.ones(N)}, "x")), "mxfp4")
    other = scores["bf16"].copy()
    other[7] = 1 - other[7]
    with pytest.raises(ValueError, match="does not reproduce the stored board's at problem 7"):
        placed(stored, read_board(_folder(tmp_path, {"bf16": other, "mine": other}, "y")), "mine")


def test_the_page_holds_the_network_board_and_the_real_one_once(tmp_path):
    scores = _scores()
    out = tmp_path / "real.md"
    run(_folder(tmp_path, scores), "real-small-board", out)
    page = tmp_path / "LEADERBOARD.md"
    page.write_text("# Leaderboard: networks\n\nrows\n")
    attach(page, out)
    attach(page, out)
    text = page.read_text()
    assert text.startswith("# Leaderboard: networks") and text.count("# Real-model board") == 1


def test_the_stored_board_is_what_its_stored_measures_make(tmp_path):
    """results/baselines/real-small-board: the board page regenerates byte for byte from the stored items, record
    and per-unit harms, and the page LEADERBOARD.md holds it below the network board."""
    from pathlib import Path

    from mxfp4.report.network_claims import read_units

    base = Path(__file__).resolve().parents[2] / "results/baselines"
    stored = base / "real-small-board"
    units = read_units([stored / "leaderboard/smollm2-135m_units.csv"])
    rows = run(stored / "real_board/smollm2-135m", "real-small-board", tmp_path / "board.md", units)
    assert (tmp_path / "board.md").read_text() == (stored / "real_board/LEADERBOARD.md").read_text()
    assert rows[0]["recipe"] == "bf16" and len(rows) == 23 and rows[0]["problems"] == 192
    page = (base / "LEADERBOARD.md").read_text()
    assert page.index("# Leaderboard: the field's MXFP4 recipes") < page.index("# Real-model board")

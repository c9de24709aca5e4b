"""The named model's headline against BF16's seed band, on constructed cells and items whose answer is known."""

import numpy as np
import pytest

from mxfp4.report.headline import analyse, band, markdown

SEEDS = [3, 4, 5, 6, 7]
PROBLEMS = 40


def _tables(correct: dict[str, np.ndarray], signal: dict[str, int] | None = None):
    """cells and items from a {recipe: [seed, problem] 0/1 array}."""
    cells, items = [], []
    for recipe, grid in correct.items():
        for i, seed in enumerate(SEEDS):
            cells.append({"model": "m", "recipe": recipe, "seed": seed, "gsm8k_strict_accuracy": float(grid[i].mean()),
                          "learning_signal_steps": (signal or {}).get(recipe, 3)})
            items += [{"model": "m", "recipe": recipe, "seed": seed, "doc_id": p, "doc_hash": f"h{p}",
                       "strict": float(grid[i, p])} for p in range(PROBLEMS)]
    return cells, items


def _bf16(rng):
    return (rng.random((len(SEEDS), PROBLEMS)) < rng.uniform(0.3, 0.5, (len(SEEDS), 1))).astype(float)


def test_the_band_is_the_bf16_seeds_and_a_copy_of_bf16_is_within_it():
    rng = np.random.default_rng(0)
    bf16 = _bf16(rng)
    cells, items = _tables({"bf16": bf16, "mxfp4": np.zeros_like(bf16), "r": bf16.copy()},
                           signal={"mxfp4": 0})
    b = band(cells, "m")
    acc = bf16.mean(1)
    assert b["low"] == acc.min() and b["sd"] == pytest.approx(acc.std(ddof=1))
    assert b["mean"] == pytest.approx(acc.mean())
    result = analyse(cells, items, "m", "r")
    assert result["inside"]["r"]["inside"] and not result["inside"]["mxfp4"]["inside"]
    headline, *_, premise = result["rows"]
    assert headline["diff"] == 0 and headline["verdict"].startswith("within the band (r - bf16")
    # a recipe without learning signal keeps its zeros: its premise row is decided, outside, never dropped
    assert premise["verdict"].startswith("outside the band (mxfp4 - bf16") and premise["seeds"] == 5
    assert premise["diff"] == pytest.approx(-bf16.mean())
    assert "| mxfp4 | 0.000, 0.000, 0.000, 0.000, 0.000 | 0.000 | outside | 0, 0, 0, 0, 0 |" in markdown(result, "p")


def test_a_small_loss_on_few_problems_is_undecided_not_outside():
    rng = np.random.default_rng(1)
    bf16 = _bf16(rng)
    r = bf16.copy()
    r[:, :2] = 0  # at most 2 of 40 problems lost a seed: a loss within the seed spread, measured on little
    cells, items = _tables({"bf16": bf16, "mxfp4": np.zeros_like(bf16), "r": r})
    row = analyse(cells, items, "m", "r")["rows"][0]
    assert row["ci_low"] < -row["margin"] < row["ci_high"] or row["ci_low"] > -row["margin"]
    assert not row["verdict"].startswith("outside")


def test_halves_are_the_seeds_alternately_and_a_missing_seed_is_refused():
    rng = np.random.default_rng(2)
    bf16 = _bf16(rng)
    cells, items = _tables({"bf16": bf16, "mxfp4": np.zeros_like(bf16), "r": bf16.copy()})
    result = analyse(cells, items, "m", "r")
    assert result["halves"] == ([3, 5, 7], [4, 6])
    assert [r["seeds"] for r in result["rows"]] == [5, 3, 2, 5]
    with pytest.raises(ValueError, match=r"r has seeds \[3, 4, 5, 6\], the band's bf16 seeds are \[3, 4, 5, 6, 7\]"):
        analyse([c for c in cells if not (c["recipe"] == "r" and c["seed"] == 7)], items, "m", "r")


def test_the_report_writes_its_table_rows_and_every_seeds_curves(tmp_path):
    from mxfp4.report.aggregate import write_csv
    from mxfp4.report.headline import run

    rng = np.random.default_rng(3)
    bf16 = _bf16(rng)
    cells, items = _tables({"bf16": bf16, "mxfp4": np.zeros_like(bf16), "r": bf16.copy()})
    steps = [{"model": "m", "recipe": c["recipe"], "seed": c["seed"], "step": k, "reward": 0.1 * k, "entropy": 0.8,
              "kl": 0.01 * k, "rollout_accuracy": 0.1, "frac_reward_zero_std": 0.5 if k % 2 else 1.0}
             for c in cells for k in range(1, 5)]
    for name, rows in (("cells", cells), ("items", items), ("steps", steps)):
        write_csv(rows, tmp_path / f"{name}.csv")
    result = run(tmp_path, "m", "r", "p", tmp_path / "headline.md", tmp_path / "curves.png")
    text = (tmp_path / "headline.md").read_text()
    assert "| r - bf16 | all seeds | 5 | 40 |" in text and result["rows"][0]["verdict"].startswith("within")
    assert (tmp_path / "headline.csv").read_text().count("\n") == 5  # a header and four rows
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_the_stored_headline_is_what_its_stored_tables_make(tmp_path):
    """results/baselines/real-small-headline: the page and rows regenerate byte for byte from the stored cells,
    items and steps (`mxfp4 headline --aggregate results/baselines/real-small-headline`)."""
    from pathlib import Path

    from mxfp4.report.headline import run

    stored = Path(__file__).resolve().parents[2] / "results/baselines/real-small-headline"
    result = run(stored, "smollm2-135m", "mxfp4+fallback", "real-small-headline", tmp_path / "headline.md",
                 tmp_path / "curves.png")
    assert (tmp_path / "headline.md").read_text() == (stored / "headline.md").read_text()
    assert (tmp_path / "headline.csv").read_text() == (stored / "headline.csv").read_text()
    assert len(result["band"]["seeds"]) == 5 and result["rows"][0]["verdict"].startswith("outside the band")

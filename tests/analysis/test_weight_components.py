"""Regime statistics of a tensor (mxfp4.analysis.weight_components) against independent computations, and the
per-tensor table of a tiny model."""

import numpy as np
import pytest
import torch
from scipy import stats

from mxfp4.analysis.weight_components import OUTLIER_RATIO, regime_stats, tensor_rows


@pytest.mark.parametrize(("name", "draw", "kurtosis"), [
    ("gaussian", lambda g, n: g.standard_normal(n), 0.0),
    ("laplace", lambda g, n: g.laplace(size=n), 3.0),
    ("uniform", lambda g, n: g.uniform(-1, 1, n), -1.2),
])
def test_excess_kurtosis_matches_scipy_and_the_distributions_known_value(name, draw, kurtosis):
    x = draw(np.random.default_rng(0), 256 * 1024)
    got = regime_stats(torch.from_numpy(x).view(256, 1024))["excess_kurtosis"]
    assert got == pytest.approx(stats.kurtosis(x, fisher=True, bias=True), abs=1e-9)
    assert got == pytest.approx(kurtosis, abs=0.2)  # the sample kurtosis of 262,144 draws


def test_the_outlier_block_fraction_counts_the_blocks_one_value_dominates():
    """Blocks of 32 values in [0.5, 1); an outlier of 4 planted in 37 of 512 blocks (and, as a
    near miss, 1.9 in 20 others: below twice the second largest)."""
    rng = np.random.default_rng(1)
    x = rng.uniform(0.5, 1.0, (512, 32)) * rng.choice([-1, 1], (512, 32))
    planted = rng.choice(512, 57, replace=False)
    x[planted[:37], rng.integers(0, 32, 37)] = 4.0
    x[planted[37:], rng.integers(0, 32, 20)] = 1.9
    s = regime_stats(torch.from_numpy(x.reshape(64, 256)))
    assert s["outlier_block_fraction"] == pytest.approx(37 / 512)
    assert OUTLIER_RATIO == 2.0
    a = np.abs(x)
    assert s["max_over_median"] == pytest.approx(a.max() / np.median(a))


def test_a_tiny_models_table_has_both_forms_of_every_tensor():
    from mxfp4.rl.models import build_tiny

    model, _ = build_tiny("tiny-moe", seed=0)
    rows = tensor_rows(model, "tiny-moe")
    tensors = {r["tensor"] for r in rows}
    assert len(rows) == 2 * len(tensors) and {r["form"] for r in rows} == {"canonical", "gain"}
    assert any(t.endswith(".0.gate_proj") for t in tensors) and any(t.endswith(".0.up_proj") for t in tensors)
    for r in rows:
        assert abs(r["share_scale"] + r["share_dead"] + r["share_grid"] + r["cross_share"] - 1) < 1e-9


def test_a_q41_weight_moves_off_its_grid_within_its_own_cells():
    """A tensor built as Q4_1 builds it (per 32-block: w = m + d q, codes 0 and 15 used): the dithered values stay
    within half a step of their grid point and leave the grid, and a row
    that is not whole blocks is refused."""
    from mxfp4.analysis.weight_components import q41_dithered

    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (8, 4, 32), generator=g).double()
    codes[..., 0], codes[..., 1] = 0, 15
    step = torch.rand(8, 4, 1, generator=g, dtype=torch.float64) * 0.1 + 0.01
    offset = torch.randn(8, 4, 1, generator=g, dtype=torch.float64)
    w = (offset + step * codes).reshape(8, 128)
    moved = q41_dithered(w, torch.Generator().manual_seed(1)).reshape(8, 4, 32)
    cell = (moved - offset) / step  # in grid steps from the block's offset
    assert (cell - codes).abs().max() <= 0.5 + 1e-9
    assert ((cell - codes).abs() > 1e-6).float().mean() > 0.99
    with pytest.raises(ValueError, match="whole blocks of 32; got a last axis of 40"):
        q41_dithered(torch.zeros(2, 40), g)

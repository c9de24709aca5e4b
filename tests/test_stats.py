"""Seeds as the outer unit (mxfp4.stats.nested_mean): against independent computations (scipy's t over
units and over seed means), and the coverage it promises where pooling the units does not keep it; the
claim-level dominance test and its power calculation, against scipy and simulation."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mxfp4 import stats as mxstats
from mxfp4.stats import nested_mean, nested_paired


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 5), st.integers(2, 6), st.integers(0, 2**31 - 1))
def test_balanced_seeds_give_the_one_way_random_effects_interval(k, m, seed):
    """Balanced one-way random effects by ANOVA (an independent path): REML's seed variance is
    (MSB - MSW)/m when positive, so the standard error is that of the k seed means (MSB/(k m)); at its
    boundary the model pools every unit (SST/(N - 1)/N). Either on k - 1 degrees of freedom."""
    rng = np.random.default_rng(seed)
    groups = [g for g in range(k) for _ in range(m)]
    y = np.array([rng.normal(0.3 * g, 1.0) for g in groups])
    got = nested_mean(list(y), groups)
    blocks = y.reshape(k, m)
    msb = m * blocks.mean(1).var(ddof=1)
    msw = blocks.var(1, ddof=1).mean()
    se = np.sqrt((msb if msb >= msw else y.var(ddof=1)) / y.size)
    low, high = stats.t.interval(0.95, k - 1, loc=y.mean(), scale=se)
    assert got["mean"] == pytest.approx(y.mean(), abs=1e-9)
    # REML by numerical optimisation (Powell): agreement to 0.1%
    assert (got["ci_low"], got["ci_high"]) == pytest.approx((low, high), rel=1e-3, abs=1e-6)
    assert (got["n"], got["seeds"]) == (k * m, k)


def test_one_seed_is_the_t_interval_over_units():
    y = [0.1, 0.4, -0.2, 0.7, 0.3]
    got = nested_mean(y, [0] * 5)
    ref = stats.ttest_1samp(y, 0.0)
    assert (got["ci_low"], got["ci_high"]) == pytest.approx(tuple(ref.confidence_interval(0.95)))
    assert got["p"] == pytest.approx(ref.pvalue)


def test_constant_and_missing_values():
    assert nested_mean([0.0, 0.0, 0.0, 0.0], [0, 0, 1, 1])["p"] == 1.0
    got = nested_paired([1.0, None, 2.0, 3.0], [0.5, 1.0, float("nan"), 2.0], [0, 0, 1, 1])
    assert got["n"] == 2 and got["diff"] == pytest.approx(0.75)
    with pytest.raises(ValueError):
        nested_mean([1.0, 2.0], [0])


@pytest.mark.slow
def test_seed_effects_keep_their_coverage_where_pooled_units_lose_it():
    """Seeds with their own offsets (the policies after GRPO differ): the nested interval covers the
    true mean about 95% of the time; a t interval over the pooled units covers far less."""
    rng = np.random.default_rng(0)
    k, m, reps = 4, 8, 300
    groups = [g for g in range(k) for _ in range(m)]
    nested = pooled = 0
    for _ in range(reps):
        offsets = rng.normal(0.0, 1.0, k)
        y = [offsets[g] + rng.normal(0.0, 1.0) for g in groups]
        est = nested_mean(y, groups)
        nested += est["ci_low"] <= 0.0 <= est["ci_high"]
        low, high = stats.ttest_1samp(y, 0.0).confidence_interval(0.95)
        pooled += low <= 0.0 <= high
    assert nested / reps >= 0.91  # 95% nominal; a binomial 1-in-1000 low tail at n = 300 is about 0.91
    assert pooled / reps <= 0.80


@settings(max_examples=20, deadline=None)
@given(st.integers(3, 12), st.integers(2, 5), st.integers(0, 2**31 - 1))
def test_crossed_design_matches_statsmodels_two_way_anova(rows, cols, seed):
    """Problems x seeds, both random: the grand mean's variance (MS_rows + MS_cols - MS_error) / (r c)
    on Satterthwaite's df, with the mean squares from statsmodels' two-way ANOVA of an OLS fit (an
    independent path to the same sums of squares)."""
    import pandas as pd
    import statsmodels.api as sm
    from statsmodels.formula.api import ols

    from mxfp4.stats import crossed_mean

    rng = np.random.default_rng(seed)
    a, b = rng.normal(0, 1.0, rows), rng.normal(0, 0.5, cols)
    df = pd.DataFrame([{"r": i, "c": j, "y": 0.2 + a[i] + b[j] + rng.normal(0, 0.7)}
                       for i in range(rows) for j in range(cols)])
    table = sm.stats.anova_lm(ols("y ~ C(r) + C(c)", df).fit())
    ms = table["sum_sq"] / table["df"]
    ms_r, ms_c, ms_e = ms["C(r)"], ms["C(c)"], ms["Residual"]
    combo = max(ms_r + ms_c - ms_e, ms_e)
    dof = combo**2 / (ms_r**2 / (rows - 1) + ms_c**2 / (cols - 1) + ms_e**2 / ((rows - 1) * (cols - 1)))
    low, high = stats.t.interval(0.95, dof, loc=df.y.mean(), scale=np.sqrt(combo / len(df)))
    got = crossed_mean(list(df.y), list(df.r), list(df.c))
    assert got["mean"] == pytest.approx(df.y.mean())
    assert (got["ci_low"], got["ci_high"], got["df"]) == pytest.approx((low, high, dof), rel=1e-9)


def test_crossed_design_covers_where_treating_problems_as_independent_does_not():
    """With a seed effect shared by every problem of a seed, the crossed interval keeps its 95% coverage
    (>= 90% in 400 simulations of 50 problems x 4 seeds), while a t interval over the 200 values as if
    independent falls far below it."""
    from mxfp4.stats import crossed_mean

    rng = np.random.default_rng(0)
    covered = naive = 0
    for _ in range(400):
        y = rng.normal(0, 1, (50, 1)) + rng.normal(0, 0.4, (1, 4)) + rng.normal(0, 0.5, (50, 4))
        r = crossed_mean(list(y.ravel()), [i for i in range(50) for _ in range(4)], list(range(4)) * 50)
        covered += r["ci_low"] <= 0 <= r["ci_high"]
        lo, hi = stats.t.interval(0.95, y.size - 1, loc=y.mean(), scale=y.std(ddof=1) / np.sqrt(y.size))
        naive += lo <= 0 <= hi
    assert covered / 400 >= 0.90 and naive / 400 <= 0.80


def test_an_incomplete_crossed_design_is_refused():
    from mxfp4.stats import crossed_mean

    with pytest.raises(ValueError, match="not complete"):
        crossed_mean([1.0, 2.0, 3.0], ["p", "p", "q"], [0, 1, 0])
    with pytest.raises(ValueError, match="measured twice"):
        crossed_mean([1.0, 2.0], ["p", "p"], [0, 0])


def test_one_seed_gives_the_t_interval_over_problems():
    """A crossed design with one seed is one sample of problems: scipy's one-sample t over them."""
    from mxfp4.stats import crossed_mean

    y = [0.0, 1.0, 1.0, 0.0, 1.0, -1.0, 1.0]
    got = crossed_mean(y, list(range(7)), [0] * 7)
    ci = stats.ttest_1samp(y, 0.0).confidence_interval(0.95)
    assert (got["ci_low"], got["ci_high"]) == pytest.approx((ci.low, ci.high)) and got["df"] == 6


def _experiment(rng, n, effects, sd):
    """One simulated pathway experiment: per unit, the arm's harm and each rival's, the rivals' harms
    below the arm's by ``effects[r]`` on average with normal differences of spread ``sd``."""
    base = rng.normal(1.0, 0.5, n)
    own = base + rng.normal(0, sd / np.sqrt(2), n)
    return own, {r: base - e + rng.normal(0, sd / np.sqrt(2), n) for r, e in effects.items()}


def test_the_claims_p_is_its_weakest_contrasts_and_it_never_holds_when_one_contrast_does_not():
    rng = np.random.default_rng(0)
    for _ in range(50):
        own, rivals = _experiment(rng, 30, {"dead": 0.4, "grid": rng.uniform(-0.2, 0.4), "own~signflip": 0.3}, 1.0)
        res = mxstats.dominance_test(list(own), {r: list(h) for r, h in rivals.items()}, margin=0.1)
        ps = {r: stats.ttest_rel(own, h, alternative="greater").pvalue for r, h in rivals.items()}
        assert res["p_held"] == pytest.approx(max(ps.values()), rel=1e-9)
        assert res["weakest"] == max(ps, key=ps.get)
        if any(p >= 0.05 for p in ps.values()):
            assert res["p_held"] >= 0.05


def test_a_true_dominance_is_held_and_a_rival_that_dominates_contradicts():
    rng = np.random.default_rng(1)
    own, rivals = _experiment(rng, 200, {"dead": 0.5, "grid": 0.6, "scale~signflip": 0.5}, 1.0)
    held = mxstats.dominance_test(list(own), {r: list(h) for r, h in rivals.items()}, margin=0.1)
    assert held["p_held"] < 1e-4 and held["p_contradicted"] > 0.5
    own, rivals = _experiment(rng, 200, {"dead": -0.5, "grid": 0.6, "scale~signflip": 0.5}, 1.0)
    contradicted = mxstats.dominance_test(list(own), {r: list(h) for r, h in rivals.items()}, margin=0.1)
    assert contradicted["p_held"] > 0.5 and contradicted["p_contradicted"] < 1e-4
    with pytest.raises(ValueError, match="at least one rival"):
        mxstats.dominance_test([1.0, 2.0], {}, margin=0.1)


@pytest.mark.parametrize(("effect", "comparisons"), [(0.3, 1), (0.5, 3)])
def test_the_units_for_power_give_that_power_in_simulation(effect, comparisons):
    """n from the power calculation, 800 simulated experiments: the claim is held in 80% +- 5% of
    them (one comparison: the exact noncentral-t power) or at least 75% (three correlated comparisons,
    each at power 0.8^(1/3): the product is a lower bound)."""
    alpha, sd = 0.05 / 14, 1.0  # a claim in a family of 14 under Bonferroni, the conservative end of Holm
    n = mxstats.units_for_power(effect, sd, alpha, comparisons=comparisons)
    assert mxstats.paired_power(effect, sd, n, alpha) >= 0.8 ** (1 / comparisons) > mxstats.paired_power(
        effect, sd, n - 1, alpha)
    rng = np.random.default_rng(2)
    effects = {f"r{k}": effect for k in range(comparisons)}
    held = []
    for _ in range(800):
        own, rivals = _experiment(rng, n, effects, sd)
        res = mxstats.dominance_test(list(own), {k: list(v) for k, v in rivals.items()}, margin=0.0)
        held.append(res["p_held"] < alpha)
    rate = float(np.mean(held))
    if comparisons == 1:
        assert abs(rate - 0.80) <= 0.05, (n, rate)
    else:
        assert rate >= 0.75, (n, rate)

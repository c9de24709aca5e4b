"""The network as the replicate: intervals and three-outcome verdicts on network means, checked by simulation
against known between-network variance (an independent computation: numpy draws, the truth known)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mxfp4.stats import (
    between_half_z,
    fixed_halves,
    network_contrast,
    network_means,
    three_outcome_test,
    three_outcome_verdict,
    upper_sd,
)


def _draw(rng, networks, units, effect, between, within):
    """Per unit (own harm, rival harm, network): the contrast's true mean ``effect``, a network's own shift of sd
    ``between`` shared by its units, unit noise of sd ``within``."""
    own, rival, nets = [], [], []
    for g in range(networks):
        shift = effect + rng.normal(0, between)
        base = rng.normal(0, 1, units)
        own += list(base + shift + rng.normal(0, within, units))
        rival += list(base)
        nets += [g] * units
    return own, rival, nets


def test_the_network_interval_covers_at_95_percent_where_pooled_units_do_not():
    """8 networks of 20 units, between-network sd 3x the unit sd's share: the t interval over network means covers
    the true contrast in 93-97% of 2000 runs; pooling the 160 units as independent covers far less."""
    rng = np.random.default_rng(0)
    net_hits = pooled_hits = 0
    runs = 2000
    for _ in range(runs):
        own, rival, nets = _draw(rng, 8, 20, 0.3, between=0.3, within=0.3)
        c = network_contrast(network_means(own, nets), network_means(rival, nets), margin=0.1)
        net_hits += c["ci_low"] < 0.3 < c["ci_high"]
        d = np.array(own) - np.array(rival)
        half = 1.96 * d.std(ddof=1) / math.sqrt(len(d))
        pooled_hits += d.mean() - half < 0.3 < d.mean() + half
    assert 0.93 <= net_hits / runs <= 0.97
    assert pooled_hits / runs < 0.6


@pytest.mark.slow
def test_an_aa_comparison_gives_at_most_five_percent_false_verdicts():
    """Own and three rivals drawn alike (no true difference, margin 0): held or contradicted in at most 5% of runs (the
    observed rate of 4000 runs within its Monte Carlo error, 1.96 standard errors, of 5%)."""
    rng = np.random.default_rng(1)
    false = 0
    runs = 4000
    for _ in range(runs):
        arms = {}
        for name in ("own", "a", "b", "c"):
            arms[name] = {g: rng.normal(0, 1) for g in range(8)}
        test = three_outcome_test(arms["own"], {r: arms[r] for r in "abc"}, margin=0.0)
        verdict, _ = three_outcome_verdict(test)
        false += verdict.startswith(("held", "contradicted"))
    assert false / runs <= 0.05 + 1.96 * math.sqrt(0.05 * 0.95 / runs)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), k=st.integers(2, 12), margin=st.floats(0, 2))
def test_the_test_is_symmetric_held_for_one_arm_is_contradicted_for_the_other(seed, k, margin):
    """With one rival, swapping the arms swaps the held and contradicted p values and keeps the equivalence p."""
    rng = np.random.default_rng(seed)
    a = {g: float(rng.normal(0.5, 1)) for g in range(k)}
    b = {g: float(rng.normal(0, 1)) for g in range(k)}
    ab, ba = three_outcome_test(a, {"b": b}, margin), three_outcome_test(b, {"a": a}, margin)
    assert ab["p_held"] == pytest.approx(ba["p_contradicted"], abs=1e-12)
    assert ab["p_contradicted"] == pytest.approx(ba["p_held"], abs=1e-12)
    assert ab["p_equivalent"] == pytest.approx(ba["p_equivalent"], abs=1e-12)


def test_a_tie_is_a_tie_and_each_verdict_names_its_rival():
    """A true lead of 0 with 30 precise networks: no dominance, named after the rival within the margin; a rival that
    harms more: contradicted by that rival; a clear lead over both: held, decided by the weaker contrast."""
    rng = np.random.default_rng(2)
    own = {g: float(rng.normal(1.0, 0.05)) for g in range(30)}
    tie = {g: own[g] + float(rng.normal(0, 0.05)) for g in range(30)}
    low = {g: own[g] - 0.5 + float(rng.normal(0, 0.05)) for g in range(30)}
    high = {g: own[g] + 0.5 + float(rng.normal(0, 0.05)) for g in range(30)}
    lower = {g: own[g] - 0.8 + float(rng.normal(0, 0.05)) for g in range(30)}
    assert three_outcome_verdict(three_outcome_test(own, {"tie": tie, "low": low}, 0.1)) == ("no dominance", "tie")
    assert three_outcome_verdict(three_outcome_test(own, {"high": high, "low": low}, 0.1)) == ("contradicted", "high")
    assert three_outcome_verdict(three_outcome_test(own, {"lower": lower, "low": low}, 0.1)) == ("held", "low")


def test_between_half_z_squares_average_one_when_contrasts_replicate():
    """Halves of 8 networks each, fixed in advance by ``fixed_halves``: over 2000 replicating contrasts, the mean
    z^2 is near 1 (between 0.85 and 1.25: the t-based standard errors of 8 networks run a little small)."""
    rng = np.random.default_rng(3)
    zs = []
    first, second = fixed_halves(list(range(16)))
    assert first == [0, 2, 4, 6, 8, 10, 12, 14] and second == [1, 3, 5, 7, 9, 11, 13, 15]
    for _ in range(2000):
        own = {g: float(rng.normal(0.2, 1)) for g in range(16)}
        rival = dict.fromkeys(range(16), 0.0)
        halves = [network_contrast({g: own[g] for g in h}, rival, 0.1) for h in (first, second)]
        zs.append(between_half_z(*halves))
    assert 0.85 <= float(np.mean(np.square(zs))) <= 1.25
    assert between_half_z(network_contrast({0: 1.0}, {0: 0.0}, 0.1), halves[1]) is None  # one network: no se


def test_network_means_nest_units_and_refuse_mismatched_lengths():
    assert network_means([1.0, 3.0, None, 5.0], ["a", "a", "b", "b"]) == {"a": 2.0, "b": 5.0}
    with pytest.raises(ValueError):
        network_means([1.0, 2.0], ["a"])
    with pytest.raises(ValueError, match="at least one rival"):
        three_outcome_test({0: 1.0}, {}, 0.1)
    with pytest.raises(ValueError, match="margin"):
        three_outcome_test({0: 1.0}, {"r": {0: 0.0}}, -1)


def test_the_upper_sd_limit_exceeds_the_estimate_and_shrinks_toward_it_with_more_networks():
    assert upper_sd(1.0, 3) > upper_sd(1.0, 8) > upper_sd(1.0, 100) > 1.0
    with pytest.raises(ValueError):
        upper_sd(1.0, 1)

"""The confirmatory profiles' sample sizes: written into each profile from its pilot's stored pathway
matrix before the run, and large enough for the calculation they state."""

import numpy as np
import pytest

from mxfp4 import stats as mxstats
from mxfp4.config.profiles import available, load_profile
from mxfp4.layout import Layout
from mxfp4.report.pathway_table import read_rows
from mxfp4.report.power_design import RIVALS, claim_units, design, units_in

SIZED = [p for p in available() if (s := load_profile(p).pathways) and s.claims and s.claims.power]


def test_at_least_one_confirmatory_profile_states_its_power_calculation():
    assert SIZED, "no profile writes pathways.claims.power"


@pytest.mark.parametrize("name", SIZED)
def test_a_profiles_power_block_is_its_pilots_calculation_and_its_units_meet_it(name):
    profile = load_profile(name)
    claims = profile.pathways.claims
    written = claims.power
    rows = Layout("results", name).power_pilot_rows(written.pilot)  # the pilot's rows frozen with the design
    again = design(read_rows(rows), claims.margins, claims.form, written.pilot,
                   written.alpha, written.family, written.power, len(profile.pathways.corrections))
    assert again == written.model_dump(), "rerun mxfp4 power-design and write its block into the profile"
    have = units_in(profile)
    for key, (pathway, c) in [*((f"{p}_claim", (p, c)) for p, c in written.claims.items()),
                              *((f"{p}_recovery_claim", (p, c)) for p, c in written.recoveries.items())]:
        # a test the profile took out of the primary family is exempt: its n is the budget's, stated as such
        assert have[pathway] >= c.units or key in claims.exploratory, (key, have[pathway], c.units)


def test_the_held_side_is_sized_at_the_larger_of_the_pilot_effect_and_the_margin():
    level = 0.05 / 8 / 2
    big = claim_units(0.5, 1.0, 0.1, 0.05, 8, 0.8)
    assert big["effect"] == 0.5 and big["units"] == mxstats.units_for_power(0.5, 1.0, level, comparisons=RIVALS)
    small = claim_units(0.01, 1.0, 0.1, 0.05, 8, 0.8)  # a pilot effect below the smallest effect of interest
    assert small["effect"] == 0.1
    against = claim_units(-0.2, 1.0, 0.1, 0.05, 8, 0.8)  # the contradicted side: margin - d, Bonferroni over rivals
    assert against["effect"] == pytest.approx(0.3)
    assert against["units"] == mxstats.units_for_power(0.3, 1.0, level / RIVALS)


def test_the_contradicted_side_has_its_power_in_simulation():
    """A rival truly beats the claimed component by 0.2 (margin 0.1): at the calculated n the claim is
    contradicted at the claim's level in at least 80% - 5% of 400 simulated experiments."""
    level = 0.05 / 8 / 2
    n = claim_units(-0.2, 1.0, 0.1, 0.05, 8, 0.8)["units"]
    rng = np.random.default_rng(3)
    hits = 0
    for _ in range(400):
        base = rng.normal(0, 1, n)
        own = base + rng.normal(0, 1 / np.sqrt(2), n)
        rivals = {"r0": base + 0.2 + rng.normal(0, 1 / np.sqrt(2), n),
                  **{f"r{k}": base - 5.0 + rng.normal(0, 1 / np.sqrt(2), n) for k in (1, 2)}}
        res = mxstats.dominance_test(list(own), {k: list(v) for k, v in rivals.items()}, margin=0.1)
        hits += res["p_contradicted"] < level
    assert hits / 400 >= 0.75, (n, hits)


def test_recovery_claims_are_sized_with_their_own_rivals_and_a_pilot_without_them_is_refused():
    """A pilot's recovery claim rows size the recovery claims, each comparison among its rivals (plain MXFP4 and
    the other correction arms) at power 0.8^(1/rivals); a pilot without them cannot size a profile that asks."""
    def row(metric, mean, sd):
        return {"checkpoint": "warm (gain)", "metric": metric, "mean": str(mean), "sd": str(sd)}

    pilot = [row(f"{p}_claim", 0.1, 0.2) for p in ("gradient", "rollout", "entropy")]
    margins = {"gradient": 0.02, "rollout": 0.1, "entropy": 0.0025}
    assert design(pilot, margins, "gain", "pilot")["recoveries"] == {}
    with pytest.raises(ValueError, match="recovery claim rows"):
        design(pilot, margins, "gain", "pilot", corrections=3)
    pilot += [row(f"{p}_recovery_claim", 0.3, 0.5) for p in ("gradient", "rollout", "entropy")]
    block = design(pilot, margins, "gain", "pilot", family=12, corrections=4)
    level = 0.05 / 12 / 2
    assert block["recoveries"]["rollout"]["units"] == mxstats.units_for_power(0.3, 0.5, level, comparisons=4)
    assert block["claims"]["rollout"]["units"] == mxstats.units_for_power(0.1, 0.2, level, comparisons=RIVALS)


NETWORK_SIZED = [p for p in available() if (s := load_profile(p).pathways) and s.claims and s.claims.network_power
                 and s.claims.replicate == "networks"]  # a named model's own-effect sizing: test_network_claims


def test_at_least_one_network_design_states_its_networks():
    assert NETWORK_SIZED, "no profile writes pathways.claims.network_power"


@pytest.mark.parametrize("name", NETWORK_SIZED)
def test_a_network_designs_block_is_its_pilots_calculation_from_the_stored_units(name):
    from mxfp4.report.network_claims import profile_networks, read_units, stored_units
    from mxfp4.report.power_design import network_design

    profile = load_profile(name)
    written = profile.pathways.claims.network_power
    units = stored_units(Layout("results", written.pilot))
    assert units, f"the pilot {written.pilot} stores no per-unit files"
    measured = [u for u in read_units(units) if u["model"] in profile.models]  # the pilot's units of these models
    again = network_design(measured, profile.pathways.claims, written.alpha, written.family, written.power,
                           network_of=profile_networks(load_profile(written.pilot)))
    assert {"pilot": written.pilot, **again} == written.model_dump(), \
        "rerun mxfp4 power-design --units and write its block into the profile"
    assert profile.warm_starts >= 8  # the design's floor, whatever the pilot's spread

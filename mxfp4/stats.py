"""The statistics that summaries, comparisons and the claims table use (scipy.stats underneath).

Every function returns its n next to the estimate; intervals are Student-t intervals (95% unless a
``level`` is given), per-problem contrasts exact binomial (McNemar) with the matching Clopper-Pearson
interval. The power functions give the smallest effect a design detects and the n a design needs.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy import stats

ALPHA = 0.05  # the error rate every verdict of the reports is held to
POWER = 0.80  # the power that minimum detectable effects and needed n are stated at

# Direction of improvement, for verdicts.
HIGHER_IS_BETTER = {
    "gsm8k_strict_accuracy": True, "gsm8k_flexible_accuracy": True, "mean_reward": True, "mean_rollout_accuracy": True,
    "mean_grad_cosine": True, "mean_grad_rel_norm_error": False, "mean_step_time": False,
}


def _clean(values) -> list[float]:
    return [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]


def first_non_finite(value, where: str = "") -> tuple[str, float] | None:
    """The first NaN or infinite float in ``value`` (nested dicts, lists and tuples too) with its dotted path
    ("" for ``value`` itself), or None: what a parameter list or a parsed JSON report is checked with."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) else ()
    for k, v in items:
        hit = first_non_finite(v, f"{where}.{k}" if where else str(k))
        if hit:
            return hit
    return None


def no_spread(x: np.ndarray) -> bool:
    """Every value equal up to round-off (scipy would warn of catastrophic cancellation)."""
    return float(x.std(ddof=1)) <= 16 * np.finfo(float).eps * float(np.abs(x).max())


def mean_ci(values: list[float]) -> dict:
    """Mean, sample std and 95% t interval of the mean (interval undefined for one value)."""
    vals = _clean(values)
    n = len(vals)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "ci_low": None, "ci_high": None}
    m = float(np.mean(vals))
    if n == 1:
        return {"n": 1, "mean": m, "std": None, "ci_low": None, "ci_high": None}
    sd = float(np.std(vals, ddof=1))
    if sd == 0:
        return {"n": n, "mean": m, "std": 0.0, "ci_low": m, "ci_high": m}
    low, high = stats.t.interval(0.95, n - 1, loc=m, scale=sd / math.sqrt(n))
    return {"n": n, "mean": m, "std": sd, "ci_low": float(low), "ci_high": float(high)}


def welch_diff(a: list[float], b: list[float], level: float = 0.95) -> dict:
    """mean(a) - mean(b) with a Welch interval at ``level`` and the two-sided p value
    (``scipy.stats.ttest_ind(equal_var=False)``), and each side's std; undefined with fewer than two
    values a side."""
    a, b = _clean(a), _clean(b)
    out = {"diff": None, "ci_low": None, "ci_high": None, "n_a": len(a), "n_b": len(b), "p": None,
           "sd_a": None, "sd_b": None}
    if not a or not b:
        return out
    out["diff"] = float(np.mean(a) - np.mean(b))
    if len(a) < 2 or len(b) < 2:
        return out
    out.update(sd_a=float(np.std(a, ddof=1)), sd_b=float(np.std(b, ddof=1)))
    if np.var(a) == 0 and np.var(b) == 0:
        out.update(ci_low=out["diff"], ci_high=out["diff"], p=1.0 if out["diff"] == 0 else 0.0)
        return out
    res = stats.ttest_ind(a, b, equal_var=False)
    ci = res.confidence_interval(level)
    out.update(ci_low=float(ci.low), ci_high=float(ci.high), p=float(res.pvalue))
    return out


def _pairs(a: list, b: list) -> list[tuple[float, float]]:
    """The pairs (a[i], b[i]) with both sides present and finite, as floats."""
    return [(float(x), float(y)) for x, y in zip(a, b) if _clean([x]) and _clean([y])]


def paired_diff(a: list, b: list, level: float = 0.95) -> dict:
    """mean(a - b) over pairs (a[i], b[i]) with a paired t interval at ``level``
    (``scipy.stats.ttest_rel``), the pairs' sample std and the two-sided p value. A pair with a missing
    side is dropped."""
    pairs = _pairs(a, b)
    n = len(pairs)
    out = {"diff": None, "ci_low": None, "ci_high": None, "n": n, "sd": None, "p": None}
    if n == 0:
        return out
    d = np.array([x - y for x, y in pairs])
    out["diff"] = float(d.mean())
    if n < 2:
        return out
    out["sd"] = float(d.std(ddof=1))
    if no_spread(d):  # equal differences, up to round-off
        out.update(sd=0.0, ci_low=out["diff"], ci_high=out["diff"], p=1.0 if out["diff"] == 0 else 0.0)
        return out
    res = stats.ttest_rel([x for x, _ in pairs], [y for _, y in pairs])
    ci = res.confidence_interval(level)
    out.update(ci_low=float(ci.low), ci_high=float(ci.high), p=float(res.pvalue))
    return out


def mcnemar_diff(pairs: list[tuple[float, float]], level: float = 0.95) -> dict:
    """Paired 0/1 outcomes (a, b): the difference of the two accuracies over the pairs, McNemar's exact
    test on the discordant pairs with the central two-sided p value (twice the smaller binomial tail),
    and the interval at ``level`` from the Clopper-Pearson interval of the share of discordant pairs
    that ``a`` won (conditional on their number). Central p and Clopper-Pearson are dual: the interval
    excludes 0 exactly when p < 1 - level."""
    pairs = [(a, b) for a, b in pairs if _clean([a]) and _clean([b])]
    n = len(pairs)
    gained = sum(1 for a, b in pairs if a > b)
    lost = sum(1 for a, b in pairs if a < b)
    out = {"diff": None, "ci_low": None, "ci_high": None, "n": n, "p": None, "gained": gained, "lost": lost,
           "discordant_rate": (gained + lost) / n if n else None}
    if n == 0:
        return out
    out["diff"] = (gained - lost) / n
    discordant = gained + lost
    if discordant == 0:
        out.update(ci_low=0.0, ci_high=0.0, p=1.0)
        return out
    tail_low = stats.binom.cdf(gained, discordant, 0.5)
    tail_high = stats.binom.sf(gained - 1, discordant, 0.5)
    ci = stats.binomtest(gained, discordant, 0.5).proportion_ci(level, method="exact")
    scale = discordant / n
    out.update(p=float(min(1.0, 2 * min(tail_low, tail_high))), ci_low=float(scale * (2 * ci.low - 1)),
               ci_high=float(scale * (2 * ci.high - 1)))
    return out


def min_detectable_effect(sd: float | None, n: int, alpha: float = 0.05, power: float = 0.80,
                          one_sided: bool = False) -> float | None:
    """Smallest true mean difference a t test of n pairs with this spread detects with ``power`` at
    level ``alpha`` (two-sided unless ``one_sided``)."""
    if sd is None or n < 2:
        return None
    a = alpha if one_sided else alpha / 2
    return float((stats.t.ppf(1 - a, n - 1) + stats.t.ppf(power, n - 1)) * sd / math.sqrt(n))


def _smallest_n(enough, lo: int, hi: int) -> int | None:
    """The smallest n in [lo, hi] for which ``enough(n)`` holds, for an ``enough`` that stays true once
    true (power grows with n), by bisection; None when even ``hi`` is not enough."""
    if not enough(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if enough(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def n_needed(effect: float | None, sd: float | None, alpha: float = 0.05, power: float = 0.80,
             one_sided: bool = False) -> int | None:
    """Pairs a t test needs to detect ``effect`` with ``power`` at level ``alpha`` (None when there is
    no spread, no effect, or more than a million pairs would be needed)."""
    if effect is None or sd is None or sd == 0 or effect == 0:
        return None
    # the detectable effect falls strictly with n
    return _smallest_n(lambda n: min_detectable_effect(sd, n, alpha, power, one_sided) <= abs(effect), 2, 1_000_000)


def mcnemar_pairs_needed(effect: float, discordant_rate: float | None, alpha: float = 0.05,
                         power: float = 0.80) -> int | None:
    """Pairs McNemar's test needs to detect a difference ``effect`` in accuracy when a share
    ``discordant_rate`` of pairs disagree (Connor 1987, two-sided normal approximation):
    n = (z_{1-a/2} sqrt(p_d) + z_power sqrt(p_d - effect^2))^2 / effect^2. None when p_d <= effect^2
    (no such design: that many discordant pairs cannot produce the effect)."""
    if not discordant_rate or effect == 0 or discordant_rate <= effect**2:
        return None
    za, zb = stats.norm.ppf(1 - alpha / 2), stats.norm.ppf(power)
    n = (za * math.sqrt(discordant_rate) + zb * math.sqrt(discordant_rate - effect**2)) ** 2 / effect**2
    return math.ceil(n)


def mcnemar_min_detectable_effect(n: int, discordant_rate: float | None, alpha: float = 0.05,
                                  power: float = 0.80) -> float | None:
    """The smallest accuracy difference McNemar's test of n pairs detects (the inverse of
    ``mcnemar_pairs_needed``, by bisection)."""
    if not n or not discordant_rate:
        return None
    lo, hi = 1e-9, math.sqrt(discordant_rate) * (1 - 1e-12)
    if (mcnemar_pairs_needed(hi, discordant_rate, alpha, power) or math.inf) > n:
        return None
    for _ in range(100):
        mid = (lo + hi) / 2
        if (mcnemar_pairs_needed(mid, discordant_rate, alpha, power) or math.inf) <= n:
            hi = mid
        else:
            lo = mid
    return hi


def verdict_level(p: float | None, p_adj: float | None, alpha: float = ALPHA) -> float:
    """The level at which a test with raw p gives the verdict of its adjusted p: ``1 - alpha p / p_adj``
    (its interval at that level excludes the null exactly when p_adj < alpha; ``1 - alpha/m`` under
    Bonferroni). 0.95 without a test, or when p_adj is 0 (p underflowed, or the difference has no
    spread: every level short of 1 excludes the null, and at 1 the interval would be everything)."""
    if p is None or not p_adj:
        return 0.95
    return 1 - alpha * p / p_adj


def verdict(d: dict, higher_is_better: bool | None = True) -> str:
    if d["diff"] is None:
        return "n/a"
    if d["ci_low"] is None:
        return "n/a (needs two seeds a side)"
    if d["ci_low"] <= 0 <= d["ci_high"]:
        return "no significant difference"
    if higher_is_better is None:
        return "higher" if d["diff"] > 0 else "lower"
    return "better" if (d["diff"] > 0) == higher_is_better else "worse"


def nested_mean(values: list, groups: list, level: float = 0.95) -> dict:
    """Mean of units (batches, prompts) nested in outer units (the seeds' policies), with an interval
    at ``level`` and the two-sided p of the mean against 0, the outer unit the replicate.

    One outer unit: Student t over the units. Two or more: a linear mixed model with a random
    intercept per outer unit (statsmodels ``MixedLM``, REML); its fixed intercept and standard error on
    a t distribution with k - 1 degrees of freedom for k outer units (the between-within rule: the
    outer units, not the units, are the replicates; with balanced groups this is the t interval over
    the k group means). ``interval`` says which was used. None and NaN values are dropped."""
    kept = [(g, float(v)) for v, g in zip(values, groups, strict=True) if _clean([v])]
    n, k = len(kept), len({g for g, _ in kept})
    out = {"mean": None, "ci_low": None, "ci_high": None, "n": n, "seeds": k, "p": None, "interval": None}
    if n == 0:
        return out
    y = np.array([v for _, v in kept])
    out["mean"] = float(y.mean())
    if n < 2:
        return out
    if no_spread(y):  # every unit equal
        out.update(ci_low=out["mean"], ci_high=out["mean"], p=1.0 if out["mean"] == 0 else 0.0, interval="constant")
        return out
    if k < 2:
        res = stats.ttest_1samp(y, 0.0)
        ci = res.confidence_interval(level)
        out.update(ci_low=float(ci.low), ci_high=float(ci.high), p=float(res.pvalue), interval="t over units")
        return out
    import warnings

    from statsmodels.regression.mixed_linear_model import MixedLM
    from statsmodels.tools.sm_exceptions import ConvergenceWarning, SingularMatrixWarning

    labels = np.array([str(g) for g, _ in kept])
    mean, se = None, None
    if n > k:
        with warnings.catch_warnings():  # a zero seed variance (the boundary) is a valid REML fit
            for kind in (ConvergenceWarning, SingularMatrixWarning, RuntimeWarning):
                warnings.simplefilter("ignore", kind)
            try:
                fit = MixedLM(y, np.ones((n, 1)), groups=labels).fit(reml=True, method=["powell", "lbfgs"])
                mean, se = float(fit.fe_params[0]), float(fit.bse_fe[0])
            except (np.linalg.LinAlgError, ValueError):
                mean = None
    if mean is None or not math.isfinite(se) or se <= 0:  # one unit per seed, or no fit: t over seed means
        means = np.array([y[labels == g].mean() for g in np.unique(labels)])
        mean, se, how = float(means.mean()), float(means.std(ddof=1) / math.sqrt(k)), f"t over {k} seed means"
    else:
        how = f"mixed model (statsmodels MixedLM, REML, random intercept per seed), t with {k - 1} df"
    q = stats.t.ppf(0.5 + level / 2, k - 1)
    p = float(2 * stats.t.sf(abs(mean) / se, k - 1)) if se > 0 else (1.0 if mean == 0 else 0.0)
    out.update(mean=mean, ci_low=float(mean - q * se), ci_high=float(mean + q * se), p=p, interval=how)
    return out


def nested_paired(a: list, b: list, groups: list, level: float = 0.95) -> dict:
    """``nested_mean`` of the paired differences a[i] - b[i] (a pair with a missing side is dropped),
    keyed like ``paired_diff`` (``diff``, ``ci_low``, ``ci_high``, ``n``, ``p``) plus ``seeds`` and
    ``interval``."""
    d = [None if not _clean([x]) or not _clean([y]) else float(x) - float(y) for x, y in zip(a, b, strict=True)]
    est = nested_mean(d, groups, level)
    return {"diff": est.pop("mean"), **est}


def crossed_mean(values: list, rows: list, cols: list, level: float = 0.95) -> dict:
    """Mean of a complete two-way crossed design, every row (problem) measured under every column (seed)
    once, both random factors: the grand mean with Var = (MS_rows + MS_cols - MS_error) / (r c) (the
    two-way random-effects ANOVA; never below MS_error / (r c)) on Satterthwaite's df, and the two-sided
    p of the mean against 0; with one column (one seed) or one row, a t interval over the other factor's
    values. An incomplete or repeated cell is a ValueError; None values are dropped with their whole row
    (problem) so that the design stays complete."""
    table: dict = {}
    for v, r, c in zip(values, rows, cols, strict=True):
        if (r, c) in table:
            raise ValueError(f"crossed_mean: row {r!r} and column {c!r} measured twice; accepted: one value per cell")
        table[(r, c)] = v
    row_ids, col_ids = sorted({r for r, _ in table}, key=str), sorted({c for _, c in table}, key=str)
    missing = [(r, c) for r in row_ids for c in col_ids if (r, c) not in table]
    if missing:
        raise ValueError(f"crossed_mean: the design is not complete ({len(missing)} of {len(row_ids) * len(col_ids)} "
                         f"cells missing, e.g. {missing[0]}); accepted: every row measured under every column")
    kept = [r for r in row_ids if all(_clean([table[(r, c)]]) for c in col_ids)]
    y = np.array([[float(table[(r, c)]) for c in col_ids] for r in kept])
    n_r, n_c = y.shape if y.size else (0, len(col_ids))
    out = {"mean": None, "ci_low": None, "ci_high": None, "n": int(y.size), "rows": n_r, "cols": n_c, "p": None,
           "df": None, "interval": None}
    if not y.size:
        return out
    m = float(y.mean())
    out["mean"] = m
    if y.size < 2:
        return out
    if no_spread(y.ravel()):
        out.update(ci_low=m, ci_high=m, p=1.0 if m == 0 else 0.0, interval="constant")
        return out
    if n_r < 2 or n_c < 2:  # one level of a factor: the other's values are the replicates (one seed: t over problems)
        res = stats.ttest_1samp(y.ravel(), 0.0)
        ci = res.confidence_interval(level)
        out.update(ci_low=float(ci.low), ci_high=float(ci.high), p=float(res.pvalue), df=float(y.size - 1),
                   interval=f"t over {y.size} {'problems' if n_c == 1 else 'seeds'} (one level of the other factor)")
        return out
    r_means, c_means = y.mean(1), y.mean(0)
    ms_r = n_c * float(((r_means - m) ** 2).sum()) / (n_r - 1)
    ms_c = n_r * float(((c_means - m) ** 2).sum()) / (n_c - 1)
    resid = y - r_means[:, None] - c_means[None, :] + m
    ms_e = float((resid ** 2).sum()) / ((n_r - 1) * (n_c - 1))
    combo = max(ms_r + ms_c - ms_e, ms_e)
    df = combo ** 2 / (ms_r ** 2 / (n_r - 1) + ms_c ** 2 / (n_c - 1) + ms_e ** 2 / ((n_r - 1) * (n_c - 1)))
    se = math.sqrt(combo / y.size)
    q = stats.t.ppf(0.5 + level / 2, df)
    out.update(ci_low=m - q * se, ci_high=m + q * se, p=float(2 * stats.t.sf(abs(m) / se, df)), df=float(df),
               se=se, interval=f"two-way crossed random effects ({n_r} x {n_c}), Satterthwaite df {df:.1f}",
               components={"rows": max(0.0, (ms_r - ms_e) / n_c), "cols": max(0.0, (ms_c - ms_e) / n_r),
                           "residual": ms_e})
    return out


def crossed_differences(diffs: dict, level: float = 0.95) -> dict | None:
    """``crossed_mean`` of paired differences keyed (row, column), e.g. (problem, seed): only the rows measured
    under every column are kept, so that the design is complete; None with fewer than two columns or rows."""
    cols = sorted({c for _, c in diffs})
    rows = sorted({r for r, _ in diffs}, key=str)
    complete = [r for r in rows if all((r, c) in diffs for c in cols)]
    if len(cols) < 2 or len(complete) < 2:
        return None
    keys = [(r, c) for r in complete for c in cols]
    return crossed_mean([diffs[k] for k in keys], [r for r, _ in keys], [c for _, c in keys], level)


def crossed_mde(components: dict, rows: int, cols: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest mean a crossed design of ``rows`` x ``cols`` detects (two-sided ``alpha``, ``power``; normal
    approximation) with the variance ``components`` of ``crossed_mean`` (rows, cols, residual):
    (z_{1-alpha/2} + z_power) sqrt(s2_rows / rows + s2_cols / cols + s2_residual / (rows cols))."""
    var = components["rows"] / rows + components["cols"] / cols + components["residual"] / (rows * cols)
    return float((stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)) * math.sqrt(var))


def crossed_cols_needed(effect: float, components: dict, rows: int, alpha: float = ALPHA, power: float = POWER,
                        limit: int = 100_000) -> int | None:
    """The columns (networks, seeds) a crossed design of ``rows`` problems needs to detect ``effect``
    (``crossed_mde``); None where no number of columns suffices with that many rows (the rows' own variance)."""
    if effect <= 0:
        raise ValueError(f"crossed_cols_needed needs effect > 0, got {effect}")
    return _smallest_n(lambda c: crossed_mde(components, rows, c, alpha, power) <= effect, 2, limit)


def hierarchical_bootstrap(values_by_seed: dict, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """Mean over all units, with a percentile interval from a two-stage bootstrap: seeds (the outer
    unit) resampled with replacement, then the units (batches, prompts) within each drawn seed. With
    one seed it is the ordinary bootstrap over units. None values are dropped."""
    groups = [np.array(_clean(v)) for v in values_by_seed.values()]
    groups = [g for g in groups if g.size]
    n = sum(g.size for g in groups)
    out = {"mean": None, "ci_low": None, "ci_high": None, "n": n, "seeds": len(groups)}
    if not n:
        return out
    out["mean"] = float(np.concatenate(groups).mean())
    if n < 2:
        return out
    rng = np.random.default_rng(seed)
    stats_ = np.empty(n_boot)
    for b in range(n_boot):
        drawn = [groups[i] for i in rng.integers(0, len(groups), len(groups))] if len(groups) > 1 else groups
        stats_[b] = np.concatenate([g[rng.integers(0, g.size, g.size)] for g in drawn]).mean()
    tail = (1 - level) / 2
    out["ci_low"], out["ci_high"] = (float(q) for q in np.quantile(stats_, [tail, 1 - tail]))
    return out


def one_sided_paired(a: list, b: list, margin: float = 0.0, greater: bool = True) -> dict:
    """The paired t test of mean(a - b) against ``margin``, one-sided: H1 mean(a - b) > margin
    (``greater``) or < margin; the mean difference, its n, sd and p. Pairs with a missing side are
    dropped; with no spread, p is 0 or 1 by the side the difference is on."""
    d = np.array([x - y for x, y in _pairs(a, b)]) - margin
    out = {"diff": float(d.mean() + margin) if len(d) else None, "n": len(d), "sd": None, "p": None}
    if len(d) < 2:
        return out
    out["sd"] = float(d.std(ddof=1))
    if no_spread(d):
        out.update(sd=0.0, p=0.0 if (d.mean() > 0) == greater and d.mean() != 0 else 1.0)
        return out
    out["p"] = float(stats.ttest_1samp(d, 0.0, alternative="greater" if greater else "less").pvalue)
    return out


def dominance_test(own: list, rivals: dict[str, list], margin: float) -> dict:
    """The claim "this arm's harm exceeds every rival's" on paired units, decided both ways:

    - held: an intersection-union test. Every rival r (the other components and the arm's own
      control) must be beaten, mean(own - r) > 0, each by a one-sided paired t test; the claim's p is
      the largest of those p values (it rejects only where every component test rejects: no
      multiplicity correction is needed inside the claim).
    - contradicted: some rival comes within the margin, mean(own - r) < margin, shown by a one-sided
      paired t test; a union over the rivals, Bonferroni-corrected (the smallest p times their number).

    ``own`` and each rival hold one harm per unit (the same units in the same order). Returns both p
    values, the weakest contrast (the rival with the largest held p) and every contrast."""
    if not rivals:
        raise ValueError("dominance_test needs at least one rival arm")
    if margin < 0 or not math.isfinite(margin):
        raise ValueError(f"margin must be finite and >= 0, got {margin!r}")
    beat = {r: one_sided_paired(own, h, 0.0, greater=True) for r, h in rivals.items()}
    near = {r: one_sided_paired(own, h, margin, greater=False) for r, h in rivals.items()}
    if any(c["p"] is None for c in beat.values()):
        return {"p_held": None, "p_contradicted": None, "weakest": None, "contrasts": beat}
    weakest = max(beat, key=lambda r: beat[r]["p"])
    return {"p_held": beat[weakest]["p"], "p_contradicted": min(1.0, min(c["p"] for c in near.values()) * len(near)),
            "weakest": weakest, "contrasts": beat, "margin": margin}


def paired_power(effect: float, sd: float, n: int, alpha: float) -> float:
    """The power of a one-sided paired t test of n units at level ``alpha`` when the true mean
    difference is ``effect`` and the differences' sd is ``sd`` (the noncentral t distribution, exact
    for normal differences)."""
    if n < 2 or sd <= 0:
        raise ValueError(f"paired_power needs n >= 2 and sd > 0, got n={n}, sd={sd}")
    critical = stats.t.ppf(1 - alpha, n - 1)
    return float(stats.nct.sf(critical, n - 1, effect * math.sqrt(n) / sd))


def units_for_power(effect: float, sd: float, alpha: float, power: float = POWER, comparisons: int = 1,
                    limit: int = 100_000) -> int:
    """Units a dominance claim needs so that each of its ``comparisons`` one-sided paired tests rejects
    with probability ``power ** (1 / comparisons)`` at level ``alpha`` (then all of them do with at least
    ``power`` when they are independent or positively correlated, as contrasts that share the arm's own
    harms are: the intersection-union test is at least that powerful);
    ``alpha`` is the level the claim is tested at after the family's correction. A ValueError where no
    n up to ``limit`` suffices."""
    if effect <= 0 or sd <= 0:
        raise ValueError(f"units_for_power needs effect > 0 and sd > 0, got effect={effect}, sd={sd}")
    each = power ** (1 / comparisons)
    n = _smallest_n(lambda n: paired_power(effect, sd, n, alpha) >= each, 2, limit)
    if n is None:
        raise ValueError(f"no design of up to {limit} units has power {power} for effect {effect} at sd {sd}")
    return n


def network_means(values: list, networks: list) -> dict:
    """{network: the mean of its units' values}: units (batches, prompts) are nested in the network they were
    measured on, so a network, not a unit, is one replicate. None and NaN values are dropped."""
    by: dict = {}
    for v, g in zip(values, networks, strict=True):
        if _clean([v]):
            by.setdefault(g, []).append(float(v))
    return {g: float(np.mean(vs)) for g, vs in sorted(by.items(), key=lambda kv: str(kv[0]))}


def network_contrast(own: dict, rival: dict, margin: float, level: float = 0.95) -> dict:
    """own - rival over the networks both have (one value each: ``network_means``), a one-sample t on k - 1 df:
    the mean, sd, standard error and interval at ``level``; one-sided p of the mean above 0 (``p_greater``) and
    below 0 (``p_less``); the equivalence p (TOST: the mean inside (-margin, +margin), the larger of its two
    one-sided p). Fewer than two networks: estimates only, p None."""
    nets = [g for g in own if g in rival]
    d = np.array([own[g] - rival[g] for g in nets])
    out = {"diff": float(d.mean()) if len(d) else None, "networks": len(d), "sd": None, "se": None, "ci_low": None,
           "ci_high": None, "p_greater": None, "p_less": None, "p_equivalent": None,
           "per_network": {str(g): float(x) for g, x in zip(nets, d)}}
    if len(d) < 2:
        return out
    k, m = len(d), float(d.mean())
    sd = float(d.std(ddof=1))
    if no_spread(d):
        sd = 0.0
    se = sd / math.sqrt(k)
    out.update(sd=sd, se=se)
    if se == 0:
        out.update(ci_low=m, ci_high=m, p_greater=0.0 if m > 0 else 1.0, p_less=0.0 if m < 0 else 1.0,
                   p_equivalent=0.0 if abs(m) < margin else 1.0)
        return out
    q = stats.t.ppf(0.5 + level / 2, k - 1)
    out.update(ci_low=m - q * se, ci_high=m + q * se, p_greater=float(stats.t.sf(m / se, k - 1)),
               p_less=float(stats.t.cdf(m / se, k - 1)),
               p_equivalent=float(max(stats.t.sf((m + margin) / se, k - 1), stats.t.cdf((m - margin) / se, k - 1))))
    return out


def three_outcome_test(own: dict, rivals: dict[str, dict], margin: float) -> dict:
    """The claim "this arm harms more than every rival", decided three ways on network values (one per network,
    ``network_means``; each contrast a t over networks, ``network_contrast``), each outcome naming the contrast
    that decided it:

    - held: own - r > 0 for every rival r (intersection-union: p = the largest one-sided p; ``held_by``, the
      weakest contrast);
    - contradicted: some rival harms significantly more, own - r < 0 (union over rivals, Bonferroni: the
      smallest one-sided p times their number; ``contradicted_by``);
    - no dominance: own within +-margin of some rival (TOST per rival, union over rivals, Bonferroni;
      ``equivalent_to``).
    Held and contradicted exclude each other; no dominance may accompany either (a lead or deficit inside the
    margin). ``margin`` >= 0 is the smallest difference of interest, in the harm's units."""
    if not rivals:
        raise ValueError("three_outcome_test needs at least one rival arm")
    if margin < 0 or not math.isfinite(margin):
        raise ValueError(f"margin must be finite and >= 0, got {margin!r}")
    contrasts = {r: network_contrast(own, h, margin) for r, h in rivals.items()}
    out = {"contrasts": contrasts, "networks": min(c["networks"] for c in contrasts.values()), "p_held": None,
           "p_contradicted": None, "p_equivalent": None, "held_by": None, "contradicted_by": None,
           "equivalent_to": None, "margin": margin}
    if any(c["p_greater"] is None for c in contrasts.values()):
        return out
    n = len(contrasts)
    held_by = max(contrasts, key=lambda r: contrasts[r]["p_greater"])
    contra_by = min(contrasts, key=lambda r: contrasts[r]["p_less"])
    equiv_to = min(contrasts, key=lambda r: contrasts[r]["p_equivalent"])
    out.update(p_held=contrasts[held_by]["p_greater"], held_by=held_by,
               p_contradicted=min(1.0, contrasts[contra_by]["p_less"] * n), contradicted_by=contra_by,
               p_equivalent=min(1.0, contrasts[equiv_to]["p_equivalent"] * n), equivalent_to=equiv_to)
    return out


OUTCOMES = ("held", "contradicted", "no dominance")


def three_outcome_verdict(test: dict, p_adjusted: dict | None = None, alpha: float = ALPHA) -> tuple[str, str | None]:
    """(verdict, the rival whose contrast decided it) of a ``three_outcome_test`` at ``alpha`` (with the family's
    adjusted p of each outcome where given): contradicted where a rival harms significantly more; else held
    where every rival is beaten (noting a lead inside the margin); else no dominance where a rival is shown
    within the margin; else not shown (the rival of the weakest contrast named)."""
    p = p_adjusted or {"held": test["p_held"], "contradicted": test["p_contradicted"],
                       "no dominance": test["p_equivalent"]}
    if p["held"] is None:
        return "inconclusive (fewer than two networks)", None
    if p["contradicted"] < alpha:
        return "contradicted", test["contradicted_by"]
    if p["held"] < alpha:
        if p["no dominance"] < alpha:
            return "held (a lead inside the margin)", test["held_by"]
        return "held", test["held_by"]
    if p["no dominance"] < alpha:
        return "no dominance", test["equivalent_to"]
    return "not shown", test["held_by"]


def between_half_z(a: dict, b: dict) -> float | None:
    """z of the difference between one contrast's estimates on two disjoint halves of the networks
    (``network_contrast`` results): (d_a - d_b) / sqrt(se_a^2 + se_b^2); None where a half has no standard
    error (fewer than two networks). Over many contrasts that replicate, z^2 averages 1."""
    if a.get("se") is None or b.get("se") is None or (a["se"] == 0 and b["se"] == 0):
        return None
    return float((a["diff"] - b["diff"]) / math.sqrt(a["se"] ** 2 + b["se"] ** 2))


def fixed_halves(networks: list) -> tuple[list, list]:
    """The two replication halves, fixed before any value is seen: the networks in their sorted order, alternately
    (the first, third, ... against the second, fourth, ...)."""
    ordered = sorted(networks, key=lambda g: (len(str(g)), str(g)))
    return ordered[0::2], ordered[1::2]


def upper_sd(sd: float, k: int, confidence: float = 0.80) -> float:
    """The upper ``confidence`` limit of a standard deviation estimated from k values (chi-square on k - 1 df):
    what a power calculation takes where the pilot had few replicates."""
    if k < 2 or not sd > 0:
        raise ValueError(f"upper_sd needs k >= 2 and sd > 0, got k={k}, sd={sd}")
    return float(sd * math.sqrt((k - 1) / stats.chi2.ppf(1 - confidence, k - 1)))


def half_splits(k: int, first: int, draws: int = 2000, seed: int = 0) -> np.ndarray:
    """Boolean rows, each a split of k replicates into a first half of ``first`` and the rest: every split where
    there are at most ``draws`` of them (C(k, first)), else ``draws`` drawn uniformly (seeded)."""
    if not 2 <= first <= k - 2:
        raise ValueError(f"a split-half check needs at least two replicates in each half; got {first} of {k}")
    if math.comb(k, first) <= draws:
        rows = []
        for chosen in itertools.combinations(range(k), first):
            row = np.zeros(k, dtype=bool)
            row[list(chosen)] = True
            rows.append(row)
        return np.array(rows)
    rng = np.random.default_rng(seed)
    out = np.zeros((draws, k), dtype=bool)
    for row in out:
        row[rng.choice(k, first, replace=False)] = True
    return out


def split_z(differences: np.ndarray, splits: np.ndarray) -> np.ndarray:
    """``between_half_z`` of every contrast (rows of ``differences``: one value per replicate) under every split
    (rows of ``splits``, ``half_splits``): the z of the difference between the two halves' mean contrasts, each
    with its own t standard error; NaN where both halves have no spread. Shape (splits, contrasts)."""
    d = np.asarray(differences, dtype=float)
    s = splits.astype(float)
    n1, n2 = s.sum(1, keepdims=True), (1 - s).sum(1, keepdims=True)
    m1, m2 = s @ d.T / n1, (1 - s) @ d.T / n2
    v1 = np.maximum(s @ (d ** 2).T - n1 * m1 ** 2, 0) / (n1 - 1)
    v2 = np.maximum((1 - s) @ (d ** 2).T - n2 * m2 ** 2, 0) / (n2 - 1)
    se = np.sqrt(v1 / n1 + v2 / n2)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(se > 0, (m1 - m2) / se, np.nan)

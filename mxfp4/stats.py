"""The statistics that summaries, comparisons and the claims table use (scipy.stats underneath).

Every function returns its n next to the estimate; intervals are 95% Student-t intervals.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

# Direction of improvement, for verdicts.
HIGHER_IS_BETTER = {
    "gsm8k_strict_accuracy": True, "gsm8k_flexible_accuracy": True, "mean_reward": True, "mean_rollout_accuracy": True,
    "mean_grad_cosine": True, "mean_grad_rel_norm_error": False, "mean_step_time": False,
}


def _clean(values) -> list[float]:
    return [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]


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


def welch_diff(a: list[float], b: list[float]) -> dict:
    """mean(a) - mean(b) with a 95% Welch interval (``scipy.stats.ttest_ind(equal_var=False)``);
    undefined with fewer than two values a side."""
    a, b = _clean(a), _clean(b)
    if not a or not b:
        return {"diff": None, "ci_low": None, "ci_high": None, "n_a": len(a), "n_b": len(b)}
    out = {"diff": float(np.mean(a) - np.mean(b)), "ci_low": None, "ci_high": None, "n_a": len(a), "n_b": len(b)}
    if len(a) < 2 or len(b) < 2:
        return out
    if np.var(a) == 0 and np.var(b) == 0:
        out["ci_low"] = out["ci_high"] = out["diff"]
        return out
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    out.update(ci_low=float(ci.low), ci_high=float(ci.high))
    return out


def paired_diff(a: list, b: list) -> dict:
    """mean(a - b) over pairs (a[i], b[i]) with a 95% paired t interval (``scipy.stats.ttest_rel``),
    the pairs' sample std and the two-sided p value. A pair with a missing side is dropped."""
    pairs = [(float(x), float(y)) for x, y in zip(a, b) if _clean([x]) and _clean([y])]
    n = len(pairs)
    out = {"diff": None, "ci_low": None, "ci_high": None, "n": n, "sd": None, "p": None}
    if n == 0:
        return out
    d = np.array([x - y for x, y in pairs])
    out["diff"] = float(d.mean())
    if n < 2:
        return out
    out["sd"] = float(d.std(ddof=1))
    if out["sd"] == 0:
        out.update(ci_low=out["diff"], ci_high=out["diff"], p=1.0 if out["diff"] == 0 else 0.0)
        return out
    res = stats.ttest_rel([x for x, _ in pairs], [y for _, y in pairs])
    ci = res.confidence_interval(0.95)
    out.update(ci_low=float(ci.low), ci_high=float(ci.high), p=float(res.pvalue))
    return out


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

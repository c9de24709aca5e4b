"""The pathway matrix's statistics: from the units each arm measured (``measurement.Measured``) to the rows
(``spec.FIELDS``): nested means with the policy as the outer unit, paired contrasts, Shapley attribution, the
controls' excess, the claim-level and recovery tests, and every unit's harm (``spec.UNIT_FIELDS``).

The method in full: docs/methods.md."""

from __future__ import annotations

from ...config.recipes import Recipe
from ...numerics.decompose import COMPONENTS, interaction, shapley_values
from ...stats import dominance_test, hierarchical_bootstrap, nested_mean, nested_paired, paired_diff
from .measurement import Measured
from .spec import (
    CLAIM_METHOD,
    COALITIONS,
    CONTRAST_METHOD,
    EXCESS_METHOD,
    GRAD_METHOD,
    HARMS,
    MAPPING,
    PAIRED_METHOD,
    RECOVERIES,
    RECOVERY_CLAIM_METHOD,
    RECOVERY_HARMS,
    RECOVERY_METHOD,
    SHAPLEY_METHOD,
    TEACHER_FORCED,
    UNITS,
)


def _paired(a: list, b: list, groups: list) -> dict:
    """A row estimate of the mean per-unit difference a - b, paired unit by unit (``nested_paired``)."""
    d = nested_paired(a, b, groups)
    return {**d, "mean": d.pop("diff")}


def make_row(model, checkpoint, injection, site, layer, metric, est, method) -> dict:
    """One row of ``spec.FIELDS`` from an estimate (``est``: mean, interval, n and the outer units it pooled)."""
    how = est.get("interval")
    return {
        "model": model,
        "checkpoint": checkpoint,
        "injection": injection,
        "site": site,
        "layer": layer,
        "metric": metric,
        "mean": est["mean"],
        "ci_low": est["ci_low"],
        "ci_high": est["ci_high"],
        "n": est["n"],
        "seeds": None,  # filled in by the caller: the seeds whose data the row pools
        "policies": est.get("seeds"),  # the outer units (policies) of the interval
        "p": est.get("p"),
        "method": f"{method} [{how}]" if how and how != "constant" else method,
    }


def scalar_estimate(value, n: int = 1) -> dict:
    """An estimate without an interval: one measured value (``make_row``'s ``est``)."""
    return {"mean": value, "ci_low": None, "ci_high": None, "n": n}


def unit_rows(model: str, checkpoint: str, form: str, m: Measured, sites, arms=None) -> list[dict]:
    """Every unit's harm, per pathway and arm (``UNIT_FIELDS``), with its outer unit and data digest; ``arms``: those
    arms alone (a run part-way, whose later arms are not measured on every unit yet)."""
    rows = []
    for pathway, per_arm in m.harms(sites).items():
        groups, keys, seeds = m.groups(pathway), m.keys(pathway), m.unit_seeds(pathway)
        for arm, values in per_arm.items():
            if arms is not None and arm not in arms:
                continue
            rows += [{"model": model, "checkpoint": checkpoint, "form": form, "pathway": pathway, "arm": arm,
                      "unit": i, "group": g, "seed": s, "key": k, "harm": v}
                     for i, (g, s, k, v) in enumerate(zip(groups, seeds, keys, values, strict=True))]
    return rows


def contrast_rows(model, checkpoint, harms: dict[str, dict[str, list]], m: Measured) -> list[dict]:
    """For each pathway, the claimed dominant component's harm minus each other component's, paired
    over the same units (metric ``<pathway>_harm_contrast``; positive = the claimed one hurts more)."""
    rows = []
    for pathway, top in MAPPING.items():
        per = harms.get(pathway, {})
        for other in (c for c in COMPONENTS if c != top):
            if f"+{top}" not in per or f"+{other}" not in per:
                continue
            rows.append(
                make_row(
                    model,
                    checkpoint,
                    f"+{top} vs +{other}",
                    "forward" if pathway != "gradient" else "both",
                    "total",
                    f"{pathway}_harm_contrast",
                    _paired(per[f"+{top}"], per[f"+{other}"], m.groups(pathway)),
                    CONTRAST_METHOD.format(units=UNITS[pathway], a=top, b=other, harm=HARMS[pathway]),
                )
            )
    return rows


def shapley_rows(model, checkpoint, harms: dict[str, dict[str, list]], m: Measured, seed: int) -> list[dict]:
    """Per pathway with every corner measured: each component's Shapley value and the interaction of
    the game v(T) = harm of the arm injecting T, per unit, then their means with bootstrap intervals
    (outer unit the policy; metric ``<pathway>_shapley``; injection ``shapley:<c>`` or
    ``shapley:interaction``)."""
    rows = []
    for pathway, per_arm in harms.items():
        if not all(per_arm.get(a) for a in COALITIONS):
            continue
        per = {c: {} for c in (*COMPONENTS, "interaction")}
        for i, group in enumerate(m.groups(pathway)):
            v = {COALITIONS[a]: per_arm[a][i] for a in COALITIONS}
            if any(x is None for x in v.values()):
                continue
            for c, phi in shapley_values(v).items():
                per[c].setdefault(group, []).append(phi)
            per["interaction"].setdefault(group, []).append(interaction(v))
        for name, values in per.items():
            est = {**hierarchical_bootstrap(values, seed=seed), "seeds": len(m.seeds)}
            rows.append(make_row(model, checkpoint, f"shapley:{name}", "both" if pathway == "gradient" else "forward",
                             "total", f"{pathway}_shapley", est,
                             SHAPLEY_METHOD.format(unit=UNITS[pathway], harm=HARMS[pathway])))
    return rows


def excess_rows(model, checkpoint, harms: dict[str, dict[str, list]], controls, m: Measured) -> list[dict]:
    """Per pathway and component: the excess harm over each energy-matched control (paired over units),
    the component's harm per unit of injected energy (its weight energy relative to MXFP4's error
    energy, averaged over the policies), and the paper's mapping tested on excess harms:
    excess(+claimed) - excess(+other)."""
    rows = []
    share = {c: sum(s[c] for s in m.shares) / len(m.shares) for c in COMPONENTS} if m.shares else {}
    for pathway, per_arm in harms.items():
        site = "both" if pathway == "gradient" else "forward"
        unit, harm, groups = UNITS[pathway], HARMS[pathway], m.groups(pathway)
        excess: dict[str, dict[str, list]] = {}
        for k in controls:
            excess[k] = {}
            for c in COMPONENTS:
                a, b = per_arm.get(f"+{c}"), per_arm.get(f"+{c}~{k}")
                if not a or not b:
                    continue
                excess[k][c] = [None if x is None or y is None else x - y for x, y in zip(a, b)]
                rows.append(make_row(model, checkpoint, f"+{c} vs +{c}~{k}", site, "total", f"{pathway}_excess_harm",
                                 _paired(a, b, groups), EXCESS_METHOD.format(unit=unit, c=c, k=k, harm=harm)))
            top = MAPPING[pathway]
            for other in (c for c in COMPONENTS if c != top):
                if top in excess[k] and other in excess[k]:
                    rows.append(make_row(
                        model, checkpoint, f"+{top} vs +{other} (excess over ~{k})", site, "total",
                        f"{pathway}_excess_contrast",
                        _paired(excess[k][top], excess[k][other], groups),
                        f"paired over {unit}: excess harm(+{top}) - excess harm(+{other}), each over its ~{k} "
                        f"control; 95% t interval, two-sided p"))
        base = per_arm.get("none")
        for c in COMPONENTS:
            if not per_arm.get(f"+{c}") or not share.get(c) or not base:
                continue
            est = _paired(per_arm[f"+{c}"], base, groups)
            for key in ("mean", "ci_low", "ci_high"):
                est[key] = None if est[key] is None else est[key] / share[c]
            method = (f"(harm(+{c}) - harm(none)) / (weight energy of e_{c} / MXFP4 error energy = {share[c]:.3f}), "
                      f"paired over {unit}; 95% t interval")
            rows.append(make_row(model, checkpoint, f"+{c}", site, "total", f"{pathway}_harm_per_energy", est, method))
    return rows


def _dominance_row(model, checkpoint, injection: str, pathway: str, metric: str, own: list, rivals: dict[str, list],
                   margin: float, method) -> dict | None:
    """``stats.dominance_test`` of ``own`` against ``rivals`` (harms per unit, larger = the claimed side) as a
    row: the weakest contrast's mean and 95% t interval, p held (``p``), p contradicted and the contrast's
    sd; ``method(weakest)`` states it. None where a contrast has too few units."""
    test = dominance_test(own, rivals, margin)
    if test["weakest"] is None:
        return None
    weakest = test["contrasts"][test["weakest"]]
    est = paired_diff(own, rivals[test["weakest"]])
    row = make_row(model, checkpoint, injection, _site(pathway), "total", metric,
               {**est, "mean": weakest["diff"], "p": test["p_held"]}, method(test["weakest"]))
    return {**row, "p_contradicted": test["p_contradicted"], "sd": weakest["sd"]}


def claim_rows(model, checkpoint, m: Measured, design) -> list[dict]:
    """The claim-level test of each mechanism claim (``design``: the profile's ``pathways.claims``):
    ``stats.dominance_test`` of the claimed component's harm against each other component's and its own
    control's, on the pathway harms (``Measured.harms``: the low-variance measures), paired over units.
    One row a pathway (metric ``<pathway>_claim``): the weakest contrast's mean and 95% t interval, p held
    (``p``) and p contradicted (``p_contradicted``). The warm start only: its units share one policy."""
    rows = []
    for pathway, per_arm in m.harms(["both"]).items():
        top = MAPPING[pathway]
        names = [f"+{c}" for c in COMPONENTS if c != top] + [f"+{top}~{design.control}"]
        if f"+{top}" not in per_arm or any(r not in per_arm for r in names):
            continue
        margin = design.margins[pathway]
        row = _dominance_row(
            model, checkpoint, f"+{top} dominates", pathway, f"{pathway}_claim", per_arm[f"+{top}"],
            {r: per_arm[r] for r in names}, margin,
            lambda weakest, top=top, names=names, margin=margin, pathway=pathway: CLAIM_METHOD.format(
                unit=UNITS[pathway], c=top, rivals=", ".join(names), margin=margin, harm=HARMS[pathway],
                weakest=f"+{top} vs {weakest}"))
        rows += [row] if row else []
    return rows


def recovery_harms(m: Measured) -> dict[str, dict[str, list]]:
    """Per pathway and arm, the harm a correction recovers, per unit (``RECOVERY_HARMS``): the pathway harms
    (``Measured.harms``), with the entropy pathway's the gap to the unquantized arm's entropy."""
    harms = m.harms(["both"])
    if "entropy" in harms:
        base = harms["entropy"]["none"]
        harms["entropy"] = {arm: [abs(h - b) for h, b in zip(values, base, strict=True)]
                            for arm, values in harms["entropy"].items()}
    return harms


def _site(pathway: str) -> str:
    return "both" if pathway == "gradient" else "forward"


def recovery_rows(model, checkpoint, m: Measured, corrections) -> list[dict]:
    """Per pathway and correction arm: what the correction recovers, MXFP4's harm (arm ``all``) minus the
    arm's, paired over units (metric ``<pathway>_recovery``; > 0: it recovers)."""
    rows = []
    for pathway, per_arm in recovery_harms(m).items():
        for k in corrections:
            if k in per_arm and "all" in per_arm:
                rows.append(make_row(model, checkpoint, k, _site(pathway), "total", f"{pathway}_recovery",
                                 _paired(per_arm["all"], per_arm[k], m.groups(pathway)),
                                 RECOVERY_METHOD.format(unit=UNITS[pathway], k=k, harm=RECOVERY_HARMS[pathway])))
    return rows


def _arm_name(arm: str) -> str:
    """An arm as the recovery rows name it: plain MXFP4's arm (``all``) is ``mxfp4``."""
    return "mxfp4" if arm == "all" else arm


def _negated(values: list) -> list:
    return [None if v is None else -v for v in values]


def recovery_claim_rows(model, checkpoint, m: Measured, corrections, design) -> list[dict]:
    """The claim-level test of each recovery claim (``RECOVERIES``) whose correction has an arm: on its
    pathway, the correction arm's harm is below plain MXFP4's and below each other correction arm's
    (``stats.dominance_test`` on the negated harms, paired over units; margin ``design.margins``). One row a
    pathway (metric ``<pathway>_recovery_claim``), as ``claim_rows``. The first arm of ``corrections`` that
    holds the claimed correction is the claimed one."""
    rows = []
    for pathway, per_arm in recovery_harms(m).items():
        arms = [correction_arm_targets(k) for k in corrections if k in per_arm]
        claimed = next((k for k, targets in arms if pathway in targets), None)
        if claimed is None or "all" not in per_arm:
            continue
        rivals = ["all"] + [k for k, _ in arms if k != claimed]
        margin = design.margins[pathway]

        def method(weakest, claimed=claimed, rivals=rivals, margin=margin, pathway=pathway) -> str:
            return RECOVERY_CLAIM_METHOD.format(unit=UNITS[pathway], k=claimed,
                                                rivals=", ".join(map(_arm_name, rivals)), margin=margin,
                                                harm=RECOVERY_HARMS[pathway],
                                                weakest=f"{_arm_name(weakest)} vs {claimed}")

        row = _dominance_row(model, checkpoint, f"{claimed} recovers most", pathway, f"{pathway}_recovery_claim",
                             _negated(per_arm[claimed]), {r: _negated(per_arm[r]) for r in rivals}, margin, method)
        rows += [row] if row else []
    return rows


def correction_arm_targets(name: str) -> tuple[str, set[str]]:
    """(recipe name, the pathways its corrections are the paper's recovery of)."""
    names = {c["name"] for c in Recipe.named(name).corrections}
    return name, {p for p, c in RECOVERIES.items() if c in names}


def _grad_rows(model_name, ckpt, injection, site, per_batch: list[dict], groups: list) -> list[dict]:
    rows = []
    layers = ["total"] + sorted(per_batch[0]["per_layer"], key=_depth)
    for layer in layers:
        for metric in ("cosine", "rel_norm_error", "norm_ratio"):
            vals = [(b["total"] if layer == "total" else b["per_layer"][layer])[metric] for b in per_batch]
            rows.append(make_row(model_name, ckpt, injection, site, layer, f"grad_{metric}", nested_mean(vals, groups),
                             GRAD_METHOD))
    return rows


def _depth(layer: str):
    return (0, int(layer[5:])) if layer.startswith("layer") and layer[5:].isdigit() else (1, layer)


def teacher_forced_rows(model_name: str, ckpt: str, m: Measured) -> list[dict]:
    """The teacher-forced measures of every arm (``TEACHER_FORCED``), per prompt: each arm's mean, and
    its difference from the unquantized arm paired per prompt (the KL is a difference already)."""
    rows = []
    for row, per_metric in m.teacher.items():
        for metric, values in per_metric.items():
            rows.append(make_row(model_name, ckpt, row, "forward", "total", metric, nested_mean(values, m.roll_groups),
                             TEACHER_FORCED[metric]))
            if row != "none" and metric != "tf_kl":
                rows.append(make_row(model_name, ckpt, row, "forward", "total", f"{metric}_diff",
                                 _paired(values, m.teacher["none"][metric], m.roll_groups),
                                 f"{TEACHER_FORCED[metric]}; {PAIRED_METHOD}"))
    return rows


def form_rows(model_name: str, ckpt: str, m: Measured, settings, seed: int) -> list[dict]:
    """The rows of one checkpoint and decomposition form from its measurements: gradient rows (and the
    scale-rule group), rollout and entropy rows, the contrasts, the Shapley rows and the excess harm
    over the matched controls."""
    rows: list[dict] = []
    harms = m.harms(settings.sites)
    if len(m.grad_groups) >= 2:
        for (row, site), per_batch in m.grad.items():
            rows += _grad_rows(model_name, ckpt, row, site, per_batch, m.grad_groups)
        for rule, per_batch in m.rules.items():
            rows += [r for r in _grad_rows(model_name, ckpt, f"rule:{rule}", "both", per_batch, m.grad_groups)
                     if r["layer"] == "total"]
            pooled = m.rule_weights[rule]
            for metric in ("energy_scale", "share_scale"):
                value = sum(w[metric] for w in pooled) / len(pooled)
                rows.append(make_row(model_name, ckpt, f"rule:{rule}", "weights", "total", f"weight_{metric}",
                                 scalar_estimate(value, len(pooled)),
                                 "pooled over all quantized weights (float64), mean over the policies"))
    scores = m.scores
    for row in scores:
        for i, metric in enumerate(("rollout_accuracy", "entropy")):
            rows.append(make_row(model_name, ckpt, row, "forward", "total", metric,
                             nested_mean(scores[row][i], m.roll_groups), "mean over prompts, 95% t interval"))
            if row != "none":
                rows.append(make_row(model_name, ckpt, row, "forward", "total", f"{metric}_diff",
                                 _paired(scores[row][i], scores["none"][i], m.roll_groups), PAIRED_METHOD))
    rows += teacher_forced_rows(model_name, ckpt, m)
    rows += contrast_rows(model_name, ckpt, harms, m)
    rows += shapley_rows(model_name, ckpt, harms, m, seed)
    rows += excess_rows(model_name, ckpt, harms, settings.controls, m)
    rows += recovery_rows(model_name, ckpt, m, settings.corrections)
    if ckpt == "warm" and settings.claims is not None:
        rows += claim_rows(model_name, ckpt, m, settings.claims)
        rows += recovery_claim_rows(model_name, ckpt, m, settings.corrections, settings.claims)
    for r in rows:
        r["seeds"] = len(m.seeds)
    return rows

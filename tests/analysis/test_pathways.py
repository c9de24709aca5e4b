"""The pathway matrix (mxfp4.analysis.pathways): every arm measured on the same data, the rows it promises,
gradient arms that differ from the unquantized one only by the injected error."""

import csv

import pytest
import torch

from mxfp4.analysis.pathways.matrix import run_pathways
from mxfp4.analysis.pathways.measurement import Arm, row_quantizer
from mxfp4.analysis.pathways.spec import FIELDS
from mxfp4.config.profiles import Profile, load_profile
from mxfp4.config.run import Run
from mxfp4.layout import Layout
from mxfp4.numerics.injection import ROWS
from mxfp4.rl.batches import batch_gradient, probe_trainer
from mxfp4.rl.cell import run_cell
from mxfp4.rl.grad_accuracy import compare
from mxfp4.rl.models import build_tiny


@pytest.fixture(scope="module")
def pathway_rows(smoke_results):
    if not (Layout(smoke_results, "smoke").policy("tiny-dense", 0) / "config.json").exists():
        run_cell(Run.of("smoke", smoke_results).cell("tiny-dense", "bf16", 0))
    out = smoke_results / "smoke" / "pathways" / "tiny-dense" / "pathways.csv"
    rows = run_pathways(Run.of("smoke", smoke_results), "tiny-dense", out_csv=out,
                        progress=lambda m: None, out_units=out.with_name("units.csv"))
    return rows, out


@pytest.mark.slow
def test_both_checkpoints_every_arm_and_a_tidy_csv(pathway_rows):
    rows, out = pathway_rows
    with out.open() as f:
        assert csv.DictReader(f).fieldnames == FIELDS
    assert {r["checkpoint"] for r in rows} == {"warm", "grpo"}
    for ckpt in ("warm", "grpo"):
        for arm in ROWS:
            metrics = {r["metric"] for r in rows if r["checkpoint"] == ckpt and r["injection"] == arm}
            assert {"rollout_accuracy", "entropy", "tf_entropy", "tf_kl", "tf_solution_loglik"} <= metrics, (ckpt, arm)
            if arm != "none":
                assert {"rollout_accuracy_diff", "entropy_diff", "tf_entropy_diff",
                        "tf_solution_loglik_diff"} <= metrics
        # the teacher-forced KL of the unquantized arm to itself is exactly zero; MXFP4's is positive
        kl = {r["injection"]: r["mean"] for r in rows if r["checkpoint"] == ckpt and r["metric"] == "tf_kl"}
        assert kl["none"] == 0.0 and kl["all"] > 0
        skipped = next(r for r in rows if r["checkpoint"] == ckpt and r["metric"] == "skipped_zero_advantage_batches")
        usable = skipped["n"] - skipped["mean"]
        grad = [r for r in rows if r["checkpoint"] == ckpt and r["metric"] == "grad_cosine"]
        assert bool(grad) == (usable >= 2)  # a batch with all-zero advantages never enters a gradient row
    contrasts = [r for r in rows if r["metric"].endswith("_harm_contrast")]
    assert {r["metric"] for r in contrasts} >= {"rollout_harm_contrast", "entropy_harm_contrast"}
    assert all(r["n"] == 4 for r in rows if r["metric"] == "entropy_diff")  # smoke: 4 prompts, paired


def test_the_unquantized_arm_reproduces_its_own_rollouts(smoke_results):
    """Same prompts, same seed: two runs of one arm give the same per-prompt scores, so every
    difference between arms is the injected error's."""
    from mxfp4.analysis.pathways.measurement import rollout_scores
    from mxfp4.problems import embedded_split
    from mxfp4.rl.models import load

    model, tok = load(str(smoke_results / "smoke" / "models" / "tiny-dense"))
    problems = embedded_split("train", 3, seed=0, max_steps=1)
    a = rollout_scores(model, tok, problems, 2, 16, 1.0, seed=5)
    b = rollout_scores(model, tok, problems, 2, 16, 1.0, seed=5)
    with Arm(model, row_quantizer("+grid", "forward")):
        c = rollout_scores(model, tok, problems, 2, 16, 1.0, seed=5)
    assert a == b and a[1] != c[1]


def test_arms_that_do_not_sample_score_the_same_fixed_completions(smoke_results):
    """sample_every_arm false: only the unquantized arm samples; every arm's teacher-forced measures are
    those of a run where every arm samples (they score the unquantized arm's completions either way)."""
    from mxfp4.analysis.pathways.measurement import Measured, measure_rollouts
    from mxfp4.problems import embedded_split
    from mxfp4.rl.models import load

    model, tok = load(str(smoke_results / "smoke" / "models" / "tiny-dense"))
    profile = load_profile("smoke")
    problems = embedded_split("train", 3, seed=0, max_steps=1)
    measured = {}
    for every in (True, False):
        settings = profile.pathways.model_copy(update={"sample_every_arm": every, "controls": ["signflip"]})
        m = Measured()
        measure_rollouts(m, model, tok, problems, profile.model_copy(update={"pathways": settings}), "gain", "warm", 3)
        measured[every] = m
    assert set(measured[True].scores) == set(measured[True].teacher) and set(measured[False].scores) == {"none"}
    assert measured[False].scores["none"] == measured[True].scores["none"]
    assert measured[False].teacher == measured[True].teacher
    assert measured[True].teacher["all"]["tf_entropy"] != measured[True].teacher["none"]["tf_entropy"]


def _varied_reward(completions, **kw):
    return [float(len(c) % 2) for c in completions]


def test_the_unit_harms_reproduce_the_rows_and_name_their_data(pathway_rows):
    """Every row's estimate is recomputed from the units file alone (the plain mean where one policy is
    the only outer unit: the warm start), and each unit's data digest is the same in every arm."""
    rows, out = pathway_rows
    with out.with_name("units.csv").open() as f:
        units = list(csv.DictReader(f))
    warm = [u for u in units if u["checkpoint"] == "warm" and u["form"] == "canonical"]
    assert {u["pathway"] for u in warm} >= {"rollout", "entropy"} and {u["group"] for u in warm} == {"warm"}

    def harms(pathway, arm):
        return [float(u["harm"]) for u in sorted(warm, key=lambda u: int(u["unit"]))
                if u["pathway"] == pathway and u["arm"] == arm]

    for arm in ROWS:  # the harms are the teacher-forced measures: token entropy, minus the solution's log-likelihood
        row = next(r for r in rows if r["checkpoint"] == "warm" and r["injection"] == arm
                   and r["metric"] == "tf_entropy" and r["form"] == "canonical")
        assert sum(harms("entropy", arm)) / len(harms("entropy", arm)) == pytest.approx(row["mean"], abs=1e-12)
        assert len(harms("rollout", arm)) == row["n"]
        if arm != "none":
            diff = next(r for r in rows if r["checkpoint"] == "warm" and r["injection"] == arm
                        and r["metric"] == "tf_solution_loglik_diff" and r["form"] == "canonical")
            d = [-(a - b) for a, b in zip(harms("rollout", arm), harms("rollout", "none"))]
            assert sum(d) / len(d) == pytest.approx(diff["mean"], abs=1e-12)
    for pathway in {u["pathway"] for u in units}:
        keys = {}
        for u in units:
            if u["pathway"] == pathway:
                keys.setdefault((u["checkpoint"], u["unit"]), set()).add(u["key"])
        assert all(len(k) == 1 for k in keys.values()), pathway  # every arm measured the same unit


def test_gradient_arms_differ_from_the_unquantized_gradient_only_by_the_injection():
    model, tok = build_tiny("tiny-dense", seed=0)
    profile = load_profile("smoke")
    trainer = probe_trainer(model, tok, profile, seed=0)
    trainer.reward_funcs = [_varied_reward]
    torch.manual_seed(0)
    inputs = [
        {"prompt": f"Question: {i}+1\nAnswer:", "answer": "0"}
        for i in range(2)
        for _ in range(profile.grpo.num_generations)
    ]
    batch = trainer.scored_batch(inputs)
    assert batch["advantages"].abs().max() > 0
    ref = batch_gradient(trainer, batch)
    again = batch_gradient(trainer, batch)
    assert compare(again, ref)["total"]["cosine"] == pytest.approx(1.0, abs=1e-12)
    with Arm(model, row_quantizer("+scale", "backward")):
        back = batch_gradient(trainer, batch)
    with Arm(model, row_quantizer("+scale", "both")):
        both = batch_gradient(trainer, batch)
    assert all(torch.equal(p, model.get_parameter(n)) for n, p in model.named_parameters())  # nothing trained
    for g in (back, both):
        score = compare(g, ref)["total"]
        assert score["cosine"] < 1 - 1e-6 and score["rel_norm_error"] > 1e-6


def test_the_markdown_matrix_has_a_line_per_arm_and_checkpoint(pathway_rows):
    from mxfp4.report.pathway_table import markdown

    rows, out = pathway_rows
    text = markdown(list(csv.DictReader(out.open())))
    for ckpt in ("warm", "grpo"):
        for arm in ("+scale", "+dead", "+grid", "all", "-scale", "-dead", "-grid"):
            assert f"| tiny-dense | {ckpt} | {arm} |" in text
    entropy = next(
        r for r in rows if r["checkpoint"] == "warm" and r["injection"] == "+grid" and r["metric"] == "entropy_diff"
    )
    assert f"{entropy['mean']:+.3f}" in text.split("| tiny-dense | warm | +grid |")[1].splitlines()[0]


def test_gradient_comparison_memory_does_not_grow_with_the_number_of_parameters():
    """The float64 comparison never makes a tensor larger than one parameter (before: the whole
    model's gradients concatenated, 69 GiB at 3B), and its numbers equal a concatenating computation."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    self.numel = max(self.numel, t.numel())
            return out

    g = torch.Generator().manual_seed(0)
    ref = {f"model.layers.{i}.mlp.w{j}": torch.randn(64, 48, generator=g) for i in range(6) for j in range(3)}
    quant = {n: t + 0.1 * torch.randn(t.shape, generator=g) for n, t in ref.items()}
    with Largest() as seen:
        got = compare(quant, ref)
    assert seen.numel <= 64 * 48
    q = torch.cat([quant[n].double().flatten() for n in ref])
    r = torch.cat([ref[n].double().flatten() for n in ref])
    assert got["total"]["cosine"] == pytest.approx(float(q @ r / (q.norm() * r.norm())), rel=1e-12)
    assert got["total"]["rel_norm_error"] == pytest.approx(float((q - r).norm() / r.norm()), rel=1e-12)
    assert sorted(got["per_layer"]) == [f"layer{i}" for i in range(6)]


def test_control_arms_excess_harm_and_shapley_rows_come_with_every_checkpoint(pathway_rows):
    rows, _ = pathway_rows
    for ckpt in ("warm", "grpo"):
        mine = [r for r in rows if r["checkpoint"] == ckpt]
        for c in ("scale", "dead", "grid"):
            for k in ("gaussian", "permuted"):
                arm = {r["metric"] for r in mine if r["injection"] == f"+{c}~{k}"}
                assert {"rollout_accuracy_diff", "entropy_diff"} <= arm, (ckpt, c, k)
                excess = [r for r in mine if r["injection"] == f"+{c} vs +{c}~{k}"]
                assert {"rollout_excess_harm", "entropy_excess_harm"} <= {r["metric"] for r in excess}
        shapley = {(r["metric"], r["injection"]) for r in mine if r["metric"].endswith("_shapley")}
        assert {("entropy_shapley", f"shapley:{c}") for c in ("scale", "dead", "grid", "interaction")} <= shapley
        contrasts = {r["metric"] for r in mine if r["metric"].endswith("_excess_contrast")}
        assert {"rollout_excess_contrast", "entropy_excess_contrast"} <= contrasts
        # efficiency, per checkpoint: the Shapley values sum to harm(all) - harm(none) (entropy pathway)
        phi = sum(float(r["mean"]) for r in mine
                  if r["metric"] == "entropy_shapley" and r["injection"] != "shapley:interaction")
        full = next(float(r["mean"]) for r in mine if r["metric"] == "tf_entropy_diff" and r["injection"] == "all")
        assert phi == pytest.approx(full, abs=1e-9)


@pytest.mark.slow
def test_every_seed_measures_its_own_data_and_the_rows_pool_the_seeds(smoke_results, monkeypatch):
    from mxfp4.analysis.pathways.matrix import seed_problems
    from mxfp4.rl import data
    from mxfp4.rl.data import cell_data

    # the smoke model rarely solves a problem: a reward that varies within each group gives every seed
    # gradient batches (the arms are what is tested here, not the model)
    monkeypatch.setattr(data, "accuracy_reward", _varied_reward)

    base = load_profile("smoke")
    settings = base.pathways.model_copy(update={"checkpoints": ["warm"], "additivity_steps": [],
                                                "sites": ["backward", "both"], "scale_rules": ["floor"],
                                                "controls": ["gaussian"]})
    two = base.model_copy(update={"seeds": [0, 1], "pathways": settings})
    train, _ = cell_data(Run.of(two, smoke_results))
    assert seed_problems(train, settings, 0)[1] != seed_problems(train, settings, 1)[1]
    rows = run_pathways(Run.of(two, smoke_results), "tiny-dense", progress=lambda m: None)
    diff = [r for r in rows if r["metric"] == "entropy_diff"]
    assert diff and all(r["n"] == 2 * settings.prompts and r["seeds"] == 2 for r in diff)
    # one policy (the warm start) for both seeds: the units are exchangeable, the interval is over units
    assert all("t over units" in r["method"] or r["ci_low"] == r["ci_high"] for r in diff)
    # backward only: each component injected and full MXFP4, total and per layer; removals and controls at both
    backward = {r["injection"] for r in rows if r["metric"] == "grad_cosine" and r["site"] == "backward"}
    assert backward == {"+scale", "+dead", "+grid", "all"}
    layers = {r["layer"] for r in rows if r["metric"] == "grad_cosine" and r["site"] == "backward"}
    assert {"total", "layer0", "layer1"} <= layers
    from mxfp4.report.pathway_table import markdown, sites_markdown

    text = sites_markdown([{k: "" if v is None else str(v) for k, v in r.items()} for r in rows])
    assert "| +scale | backward |" in text and "| +scale | both |" in text
    # the headline table reads gradients at site both, never a single site's row
    table = markdown([{k: "" if v is None else str(v) for k, v in r.items()} for r in rows])
    both = next(r for r in rows if r["metric"] == "grad_cosine" and r["site"] == "both" and r["layer"] == "total"
                and r["injection"] == "+scale")
    assert f"{1 - both['mean']:+.3f}" in next(line for line in table.splitlines() if "| +scale |" in line)


def test_policies_after_grpo_are_the_outer_unit():
    """Synthetic measurements of two seeds' policies: the rows' intervals come from the mixed model over
    the policies, not from the pooled prompts."""
    import random

    from mxfp4.analysis.pathways.estimates import form_rows
    from mxfp4.analysis.pathways.measurement import Measured
    from mxfp4.analysis.pathways.spec import control_rows

    settings = load_profile("smoke").pathways
    rng = random.Random(0)
    m = Measured(roll_groups=["grpo/seed0"] * 4 + ["grpo/seed1"] * 4, seeds={0, 1})
    for arm in (*ROWS, *control_rows(settings.controls)):
        m.scores[arm] = ([rng.random() for _ in range(8)], [rng.random() for _ in range(8)])
        m.teacher[arm] = {k: [rng.random() for _ in range(8)] for k in ("tf_entropy", "tf_kl", "tf_solution_loglik")}
    rows = form_rows("tiny-dense", "grpo", m, settings, seed=0)
    paired = [r for r in rows if r["metric"] in ("entropy_diff", "rollout_harm_contrast", "entropy_excess_harm")]
    assert paired and all("mixed model" in r["method"] or "seed means" in r["method"] for r in paired)
    assert all(r["n"] == 8 and r["seeds"] == 2 for r in paired)


def test_grpo_checkpoints_need_every_seeds_policy(tmp_path):
    from mxfp4.analysis.pathways.matrix import checkpoints

    base = load_profile("smoke")
    profile = base.model_copy(update={"seeds": [0, 7], "pathways": base.pathways.model_copy(
        update={"checkpoints": ["grpo"]})})
    with pytest.raises(ValueError, match="seed7"):
        checkpoints(Run.of(profile, tmp_path), "tiny-dense")


def _teacher_measured(harms: dict):
    """A Measured whose teacher-forced entropy and solution log-likelihood give every arm ``harms``
    (rollout harm = - log-likelihood), on one policy's units."""
    from mxfp4.analysis.pathways.measurement import Measured

    m = Measured()
    n = len(next(iter(harms.values())))
    m.teacher = {arm: {"tf_entropy": list(h), "tf_solution_loglik": list(-h), "tf_kl": [0.0] * n}
                 for arm, h in harms.items()}
    m.roll_groups = ["warm"] * n
    return m


def test_a_claim_holds_where_its_component_dominates_and_is_contradicted_where_a_rival_does():
    """Synthetic harms where grid noise dominates every rival and its own sign-flip control: the entropy
    claim (grid) is held; the rollout claim (dead) on the same harms is contradicted, since grid beats it."""
    import numpy as np

    from mxfp4.analysis.pathways.estimates import claim_rows
    from mxfp4.config.profiles import ClaimDesign
    from mxfp4.report.claims import build_claims

    rng = np.random.default_rng(0)
    base = rng.normal(1.0, 0.1, 60)  # the units' shared level: it cancels in every paired contrast
    harms = {"+grid": base + 0.3, "+grid~signflip": base + 0.1, "+dead": base + 0.05, "+dead~signflip": base,
             "+scale": base, "+scale~signflip": base}
    harms = {arm: h + rng.normal(0, 0.05, h.size) for arm, h in harms.items()}
    design = ClaimDesign(margins={"gradient": 0.01, "rollout": 0.02, "entropy": 0.02}, premise_margins=3)
    rows = {r["metric"]: r for r in claim_rows("tiny-dense", "warm", _teacher_measured(harms), design)}
    assert set(rows) == {"rollout_claim", "entropy_claim"}  # no gradient batches measured
    entropy = rows["entropy_claim"]
    assert entropy["p"] < 1e-6 and entropy["p_contradicted"] > 0.5
    assert "+grid vs +grid~signflip" in entropy["method"]  # the weakest rival: its own control (+0.2)
    assert abs(entropy["mean"] - 0.2) < 0.05 and entropy["ci_low"] < entropy["mean"] < entropy["ci_high"]
    assert rows["rollout_claim"]["p"] > 0.5 and rows["rollout_claim"]["p_contradicted"] < 1e-6
    # the claims table decides the same harms, as per-unit rows, three ways with the unit as the replicate
    proofs = {"max_identity_residual_rel": 0.0, "passed": True, "cases": [1]}
    units = [{"model": "tiny-dense", "checkpoint": "warm", "form": "gain", "pathway": pathway, "arm": arm, "unit": i,
              "group": "warm", "seed": 0, "key": "", "harm": float(h[i])}
             for pathway in ("rollout", "entropy") for arm, h in harms.items() for i in range(h.size)]
    named = design.model_copy(update={"replicate": "units"})
    claims = build_claims([], proofs, [], [], design=named, units=units)
    verdicts = {r["claim"]: (r["verdict"], r["test"].split("decided by ")[-1]) for r in claims
                if r.get("family") == "primary"}
    assert verdicts == {"Grid noise dominates policy entropy": ("held", "+dead"),
                        "Deadzone truncation dominates rollout quality": ("contradicted", "+grid")}


def test_a_recovery_claim_holds_where_its_correction_recovers_most_on_the_entropy_gap():
    """Synthetic harms: outlier fallback lowers the rollout harm well below plain MXFP4's and every other
    correction's, so its claim is held; on entropy AQN moves the entropy as far below the unquantized arm's
    as MXFP4 is above it, so the entropy gap it leaves is MXFP4's (no recovery: contradicted), and a
    recovery row reads the gap, not the signed entropy."""
    import numpy as np

    from mxfp4.analysis.pathways.estimates import recovery_claim_rows, recovery_rows
    from mxfp4.config.profiles import ClaimDesign

    rng = np.random.default_rng(1)
    base = rng.normal(2.0, 0.3, 50)
    noise = rng.normal(0, 0.02, (5, 50))
    rollout = {"none": base, "all": base + 1.0, "mxfp4+macro": base + 0.9, "mxfp4+fallback": base + 0.4,
               "mxfp4+aqn": base + 1.0}
    rollout = {arm: h + noise[i] for i, (arm, h) in enumerate(rollout.items())}
    entropy = {"none": base, "all": base + 0.5, "mxfp4+macro": base + 0.45, "mxfp4+fallback": base + 0.5,
               "mxfp4+aqn": base - 0.5}
    m = _teacher_measured(entropy)
    for arm, h in rollout.items():
        m.teacher[arm]["tf_solution_loglik"] = list(-h)
    design = ClaimDesign(margins={"gradient": 0.01, "rollout": 0.1, "entropy": 0.1}, premise_margins=3)
    arms = ["mxfp4+macro", "mxfp4+fallback", "mxfp4+aqn"]
    claims = {r["metric"]: r for r in recovery_claim_rows("tiny-dense", "warm", m, arms, design)}
    assert set(claims) == {"rollout_recovery_claim", "entropy_recovery_claim"}  # no gradient batches
    rollout_claim = claims["rollout_recovery_claim"]
    assert rollout_claim["p"] < 1e-6 and rollout_claim["p_contradicted"] > 0.5
    assert "mxfp4+macro vs mxfp4+fallback" in rollout_claim["method"]  # the weakest rival: macro's 0.9
    assert abs(rollout_claim["mean"] - 0.5) < 0.05
    assert claims["entropy_recovery_claim"]["p"] > 0.5 and claims["entropy_recovery_claim"]["p_contradicted"] < 1e-6
    recovered = {(r["metric"], r["injection"]): r["mean"] for r in recovery_rows("tiny-dense", "warm", m, arms)}
    assert recovered[("entropy_recovery", "mxfp4+aqn")] == pytest.approx(0.0, abs=1e-12)  # |-0.5| = |+0.5|
    assert recovered[("entropy_recovery", "mxfp4+macro")] == pytest.approx(0.05, abs=1e-12)
    assert recovered[("rollout_recovery", "mxfp4+fallback")] == pytest.approx(0.6, abs=0.02)


@pytest.mark.slow
def test_correction_arms_run_every_pathway_and_aqn_leaves_the_training_gradient_alone(smoke_results):
    """The correction arms at the warm start: a recovery row per pathway and arm; AQN perturbs only the
    rollout policy, so its gradient equals plain MXFP4's bit for bit while its teacher-forced measures do
    not, and the policy's RMSNorm weights are restored after it; macro-block scaling changes the gradient."""
    profile = load_profile("smoke")
    settings = profile.pathways.model_copy(update={
        "checkpoints": ["warm"], "controls": [], "additivity_steps": [], "scale_rules": [], "batches": 3,
        "forms": ["gain", "canonical"], "corrections": ["mxfp4+macro", "mxfp4+fallback", "mxfp4+aqn"]})
    profile = profile.model_copy(update={"pathways": settings})
    units = smoke_results / "corrections_units.csv"
    rows = run_pathways(Run.of(profile, smoke_results), "tiny-dense", progress=lambda m: None, out_units=units)
    recovery = {(r["metric"], r["injection"]): r for r in rows
                if r["metric"].endswith("_recovery") and r["form"] == "gain"}
    assert {m for m, _ in recovery} == {"gradient_recovery", "rollout_recovery", "entropy_recovery"}
    assert {k for _, k in recovery} == set(settings.corrections)
    with units.open() as f:
        harm = {}
        for u in csv.DictReader(f):
            harm.setdefault((u["pathway"], u["arm"]), []).append(float(u["harm"]))
    assert harm[("gradient", "mxfp4+aqn")] == harm[("gradient", "all")]
    assert harm[("gradient", "mxfp4+macro")] != harm[("gradient", "all")]
    assert harm[("rollout", "mxfp4+aqn")] != harm[("rollout", "all")]
    assert recovery[("gradient_recovery", "mxfp4+aqn")]["mean"] == 0.0
    # the table shows each arm once, not once per decomposition form (a correction arm has none)
    from mxfp4.report.pathway_table import checkpoint_label, recovery_markdown

    table = recovery_markdown([{**r, "checkpoint": checkpoint_label(r["checkpoint"], r["form"])} for r in rows])
    assert all(table.count(f"| {k} |") == 1 for k in settings.corrections), table
    # the unquantized arm, measured before the AQN arm, equals a fresh measurement after it
    from mxfp4.analysis.pathways.measurement import correction_arm
    from mxfp4.rl.models import load

    model, _ = load(str(Layout(smoke_results, "smoke").model("tiny-dense")))
    before = {n: p.clone() for n, p in model.named_parameters()}
    arm = correction_arm("mxfp4+aqn", "forward", profile, 0)
    assert arm.step > 0  # AQN's first noisy stage, not its noise-free stage 0
    with Arm(model, arm.quantizer), arm.rollout(model) as _:
        changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert changed and all("norm" in n for n in changed)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


@pytest.mark.slow
def test_an_outlier_dose_measures_the_same_policy_and_data_and_moves_only_the_operands(smoke_results, tmp_path,
                                                                                     monkeypatch):
    """At dose c2x32 the warm start computes what it computed without outliers: the same gradient batches and
    prompts are drawn (their digests), the unquantized arm's teacher-forced harms agree to float32 round-off;
    what moves is the activations' outlier-block fraction. A dose is given to the warm start only."""
    import csv

    from mxfp4.rl import data

    monkeypatch.setattr(data, "accuracy_reward", _varied_reward)
    base = load_profile("smoke")
    settings = base.pathways.model_copy(update={"checkpoints": ["warm"], "additivity_steps": [], "forms": ["gain"],
                                                "scale_rules": ["floor"], "controls": ["signflip"], "prompts": 2,
                                                "samples_per_prompt": 1})
    profile = base.model_copy(update={"pathways": settings})
    units, fraction = {}, {}
    for d in ("c0x1", "c2x32"):
        path = tmp_path / f"{d}.csv"
        rows = run_pathways(Run.of(profile, smoke_results), "tiny-dense", progress=lambda m: None,
                            checkpoint="warm", out_units=path, dose=d)
        fraction[d] = next(r for r in rows if r["metric"] == "activation_outlier_block_fraction")
        units[d] = list(csv.DictReader(path.open()))
    key = [(u["pathway"], u["arm"], u["unit"], u["key"]) for u in units["c0x1"]]
    assert key == [(u["pathway"], u["arm"], u["unit"], u["key"]) for u in units["c2x32"]]
    none = [[float(u["harm"]) for u in units[d] if u["arm"] == "none" and u["pathway"] == "entropy"]
            for d in ("c0x1", "c2x32")]
    assert none[0] and none[0] == pytest.approx(none[1], rel=1e-5, abs=1e-6)
    assert fraction["c2x32"]["mean"] > fraction["c0x1"]["mean"] + 0.2  # 2 of 4 blocks a row can hold one
    with pytest.raises(ValueError, match="given to the warm start; accepted: checkpoint 'warm'"):
        run_pathways(Run.of(profile, smoke_results), "tiny-dense", progress=lambda m: None, dose="c2x32")


def test_the_matrix_measures_only_the_seeds_its_pathways_name(tmp_path):
    from mxfp4.analysis.pathways.matrix import checkpoints
    from mxfp4.report.power_design import units_in

    base = load_profile("smoke")
    one = base.pathways.model_copy(update={"checkpoints": ["grpo"], "seeds": [7]})
    profile = Profile.model_validate({**base.model_dump(), "seeds": [0, 7], "pathways": one.model_dump()})
    assert profile.pathway_seeds == [7]
    # only the measured seed's policy is needed: the error names seed 7's, never seed 0's
    with pytest.raises(ValueError, match="seed7") as err:
        checkpoints(Run.of(profile, tmp_path), "tiny-dense")
    assert "seed0" not in str(err.value)
    assert units_in(profile) == {"gradient": one.batches, "rollout": one.prompts, "entropy": one.prompts}
    every = profile.model_copy(update={"pathways": one.model_copy(update={"seeds": None})})
    assert every.pathway_seeds == [0, 7] and units_in(every)["rollout"] == 2 * one.prompts
    with pytest.raises(ValueError, match=r"pathways.seeds \[3\] are not all seeds of the profile; accepted: some of "
                                         r"\[0, 7\]"):
        Profile.model_validate({**profile.model_dump(), "pathways": {**one.model_dump(), "seeds": [3]}})


@pytest.mark.skipif(__import__("mxfp4.config.data_files", fromlist=["x"]).default_gsm8k_dir() is None,
                    reason="the real GSM8K files (../shared/data/gsm8k) are not here")
def test_a_held_out_design_draws_nothing_its_pilot_could_have_measured():
    """real-small-claims against its pilot real-small: every problem of the pilot's rollout draw and of its gradient
    draw up to the batches it used and skipped is out of the pools, and the confirmatory seed's draw then shares
    no question with the pilot's."""
    from pathlib import Path

    from mxfp4.analysis.pathways.matrix import pilot_problems, seed_problems, without_pilot
    from mxfp4.config.data_files import gsm8k_folder
    from mxfp4.config.profiles import load_profile
    from mxfp4.config.run import Run
    from mxfp4.rl import data as gsm

    results = Path(__file__).resolve().parents[2] / "results"
    profile, pilot = load_profile("real-small-claims"), load_profile("real-small")
    run = Run.of(profile, results)
    train, _ = gsm.cell_data(run)
    test = gsm.load_gsm8k("test", gsm8k_folder(profile))
    kept, kept_test, removed = without_pilot(profile, "smollm2-135m", train, test, run.layout)
    reached = pilot_problems(pilot, train, test, skipped=0)
    assert removed >= len(reached) and not reached & {r["question"] for r in kept + kept_test}
    grad, roll = seed_problems(kept, profile.pathways, 1, kept_test)
    assert not {r["question"] for r in roll} & {r["question"] for r in seed_problems(train, pilot.pathways, 0, test)[1]}

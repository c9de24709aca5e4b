"""The corrections table's rows of the field's recipe settings, against the decomposition of each weight alone."""

import pytest

from mxfp4.analysis.correction_table import rows
from mxfp4.nn import gemm_weights, targets
from mxfp4.numerics.decompose import decompose
from mxfp4.numerics.quantizer import Operand
from mxfp4.rl.models import build_tiny


@pytest.fixture(scope="module")
def weights():
    model = build_tiny("tiny-dense", seed=0, layers=8)[0]
    return {f"{n}.{a}": (p.detach(), p.dim() - 1, Operand("weight", "forward", n))
            for n, m, _ in targets(model, ("linear",)) for a, p in gemm_weights(m).items()}


def test_edge_layers_remove_exactly_their_weights_error_and_generation_settings_remove_none(weights):
    """mxfp4+bf16-edges keeps layers 0-1 and 4-7 of 8: its error energy is the plain decomposition's over layers 2-3
    alone, its deadzone the fraction of all elements truncated there; W4A16 rollouts and a BF16 backward leave the
    weights' forward quantization as plain MXFP4's."""
    table = {r["correction"]: r for r in rows({"w": weights}, ["mxfp4+bf16-edges", "mxfp4+w4a16-rollouts",
                                                               "mxfp4+bf16-backward"])}
    quantized = [(decompose(t, axis=axis).stats, t.numel()) for name, (t, axis, _) in weights.items()
                 if int(name.split(".layers.")[1].split(".")[0]) in (2, 3)]
    n = sum(t.numel() for t, _, _ in weights.values())
    edges = table["recipe mxfp4+bf16-edges"]
    for c in ("scale", "dead", "grid", "total"):
        assert edges[f"energy_{c}_after"] == pytest.approx(sum(s[f"energy_{c}"] for s, _ in quantized), rel=1e-12)
    assert edges["deadzone_fraction_after"] == pytest.approx(sum(s["deadzone_fraction"] * k for s, k in quantized) / n)
    for name in ("recipe mxfp4+w4a16-rollouts", "recipe mxfp4+bf16-backward"):
        assert table[name]["energy_total_after"] == table[name]["energy_total_before"]


def test_the_energy_table_measures_each_operand_as_the_recipe_quantizes_it(tmp_path, monkeypatch):
    """Removals known by construction, on a tiny model's weights and the activations recorded on one forward:
    weights alone quantized leaves the activations no error and the weights MXFP4's; activations alone the
    reverse; a forward Hadamard rotation is decomposed in its rotated basis (the correction's own decomposition of
    each operand, told what it is)."""
    import torch

    from mxfp4.analysis.correction_table import model_weights, recipe_energy, recorded_activations
    from mxfp4.config.recipes import Recipe

    (tmp_path / "rot.yaml").write_text("rot: {base: mxfp4, corrections: [{name: hadamard, gemms: [forward]}]}\n")
    monkeypatch.setenv("MXFP4_RECIPES", str(tmp_path / "rot.yaml"))
    model, tok = build_tiny("tiny-dense", seed=0)
    acts = recorded_activations(model, dict(tok(["Q: 12+7=? A: 19 #### 19", "Tom has 3 apples."], return_tensors="pt",
                                                padding=True)))
    assert acts and all(op.role == "activation" for _, _, op in acts.values())
    weights = model_weights("tiny-dense")
    cases = ((acts, "mxfp4-weights-alone", True), (weights, "mxfp4-weights-alone", False),
             (weights, "mxfp4-activations-alone", True), (acts, "mxfp4-activations-alone", False))
    for operands, recipe, zero in cases:
        e = recipe_energy(operands, recipe, form="gain")
        if zero:
            assert e["energy_total_after"] == 0 and e["energy_total_before"] > 0
        else:
            assert e["energy_total_after"] == e["energy_total_before"]
    rot = Recipe.named("rot").quantizer()
    e = recipe_energy(acts, "rot", form="gain")
    own = sum(rot.decompose(x, axis, operand=op, form="gain").stats["energy_scale"] for x, axis, op in acts.values())
    assert e["energy_scale_after"] == pytest.approx(own, rel=1e-12) and e["energy_scale_after"] != e[
        "energy_scale_before"]
    assert torch.is_tensor(next(iter(acts.values()))[0])

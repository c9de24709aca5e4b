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

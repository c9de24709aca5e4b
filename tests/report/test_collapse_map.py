"""The collapse map's configurations and page on constructed rows."""

from mxfp4.analysis.collapse_map import ROLES, configurations
from mxfp4.report.collapse_map import markdown


def test_every_layer_alone_in_bf16_and_every_role_alone_quantized():
    configs = configurations(4)
    layers = [(c[2], c[3].bf16_layers.kept(4)) for c in configs if c[1] == "layer"]
    assert layers == [(i, {i}) for i in range(4)]
    roles = {c[0]: c[3].build_corrections()[0].roles for c in configs if c[1] == "role"}
    assert roles == {"weights alone": ["activation", "grad"], "activations alone": ["weight", "grad"],
                     "gradients alone": ["weight", "activation"]}
    assert set(ROLES) == set(roles)


def _row(config, kind, nll, layer=None, removed=None):
    return {"model": "m", "config": config, "kind": kind, "layer": layer, "problems": 192 if kind != "layer" else None,
            "strict_accuracy": 0.1 if kind != "layer" else None, "prompts": 16, "solution_nll": nll,
            "nll_gap_removed": removed, "grad_cosine": 0.5 if kind != "layer" else None}


def test_the_page_orders_layers_by_what_they_remove_and_gives_each_role_its_share():
    rows = [_row("bf16", "reference", 1.0, removed=1.0), _row("mxfp4", "reference", 3.0, removed=0.0),
            _row("layer 0 in BF16", "layer", 2.9, 0, 0.05), _row("layer 1 in BF16", "layer", 2.0, 1, 0.5),
            _row("activations alone", "role", 2.2, removed=0.4)]
    text = markdown(rows, "p")
    assert text.index("| 1 | 2.0000 | +0.500") < text.index("| 0 | 2.9000 | +0.050")
    assert "| activations alone | 2.2000 | 0.600 |" in text and "sum to +0.550" in text

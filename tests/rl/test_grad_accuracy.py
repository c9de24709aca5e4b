"""The gradient measures: cosine, relative norm error and norm ratio against the full-precision
gradient, per layer and in total."""

import math

import pytest
import torch

from mxfp4.rl.grad_accuracy import compare


def _chain_grads(weights, gains, x, g):
    """Gradients of <y, g> for the linear chain y = c_L W_L ... c_1 W_1 x, by autograd."""
    params = [w.clone().requires_grad_(True) for w in weights]
    h = x
    for w, c in zip(params, gains):
        h = c * (h @ w.T)
    (h * g).sum().backward()
    return {f"model.layers.{k}.weight": p.grad for k, p in enumerate(params)}


@pytest.mark.parametrize("depth", [2, 4, 8])
def test_a_gain_on_every_layer_shows_as_the_product_of_the_gains_in_the_norm_ratio(depth):
    """Each layer's weight gradient carries every layer's gain once (those before it through its
    input, those after it through its output gradient, its own through the chain rule): the norm ratio
    of every layer and of the whole model is the product of the gains, and the direction is unchanged."""
    gen = torch.Generator().manual_seed(depth)
    weights = [torch.randn(16, 16, generator=gen, dtype=torch.float64) / 4 for _ in range(depth)]
    x, g = (torch.randn(8, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    gains = [0.9 + 0.05 * k for k in range(depth)]
    res = compare(_chain_grads(weights, gains, x, g), _chain_grads(weights, [1.0] * depth, x, g))
    product = math.prod(gains)
    assert res["total"]["norm_ratio"] == pytest.approx(product, rel=1e-12)
    assert res["total"]["cosine"] == pytest.approx(1.0, abs=1e-12)
    assert res["total"]["rel_norm_error"] == pytest.approx(abs(product - 1), rel=1e-9)
    assert len(res["per_layer"]) == depth
    assert all(v["norm_ratio"] == pytest.approx(product, rel=1e-12) for v in res["per_layer"].values())


def test_a_zero_reference_gradient_has_no_ratio():
    zero = {"w": torch.zeros(3)}
    assert compare({"w": torch.ones(3)}, zero)["total"] == {"cosine": None, "rel_norm_error": None,
                                                            "norm_ratio": None}

"""The field's standard recipe, built in: a random-sign Hadamard rotation of chosen GEMMs' operands and
stochastic rounding of chosen roles, each told which operand it quantizes; checked against independent
computations (the numpy/ml_dtypes oracle, explicit matrices)."""

import contextlib

import ml_dtypes
import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

import mxfp4
from mxfp4 import corrections as corr
from mxfp4.config.recipes import Recipe
from mxfp4.corrections.hadamard import hadamard_matrix
from mxfp4.numerics.quantizer import Operand, Quantizer
from mxfp4.numerics.reference import stochastic_round_to_grid
from oracle import oracle_decode, oracle_quantize

E2M1_GRID = np.unique(np.abs(np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)))


def _neighbours(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The E2M1 grid values at or below and at or above |v| (ml_dtypes' grid, |v| clipped at 6)."""
    a = np.minimum(np.abs(v), 6.0)
    lo = E2M1_GRID[np.searchsorted(E2M1_GRID, a, side="right") - 1]
    hi = E2M1_GRID[np.minimum(np.searchsorted(E2M1_GRID, a, side="left"), len(E2M1_GRID) - 1)]
    return lo, hi


@given(seed=st.integers(0, 2**31 - 1), scale=st.floats(1e-3, 1e3))
def test_stochastic_rounding_lands_on_a_neighbouring_grid_value_under_the_nearest_roundings_scales(seed, scale):
    """Every element lands on one of the two E2M1 values around x/s, with s the block scale the oracle
    computes for round-to-nearest; values on the grid stay exact."""
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(seed)) * scale
    q = Quantizer(corrections=[corr.build("stochastic_rounding")])(x, -1)  # no context: rounded stochastically
    codes, scale_bytes, _ = oracle_quantize(x.numpy(), "e2m1", 32, "e8m0", "floor")
    s = np.ldexp(1.0, scale_bytes.astype(np.int64) - 127)[..., None]
    v = x.numpy().astype(np.float64).reshape(8, 2, 32) / s
    lo, hi = _neighbours(v)
    got = np.abs(q.numpy().astype(np.float64).reshape(8, 2, 32) / s)
    assert np.all((got == lo) | (got == hi))
    on_grid = torch.from_numpy(oracle_decode(codes, "e2m1").reshape(8, 64) * np.repeat(s.reshape(8, 2), 32, 1))
    assert torch.equal(Quantizer(corrections=[corr.build("stochastic_rounding")])(on_grid.float(), -1),
                       on_grid.float())


def test_stochastic_rounding_is_unbiased_within_the_grid():
    """The mean of many roundings of one value is the value (|y| <= 6), to 4 standard errors."""
    y = torch.tensor([0.1, 0.3, 0.75, 1.2, 2.5, 3.3, 4.9, 5.99, -0.4, -2.2]).repeat(20000, 1)
    q = stochastic_round_to_grid(y, mxfp4.numerics.formats.E2M1, torch.Generator().manual_seed(0)).double()
    lo, hi = _neighbours(y[0].numpy().astype(np.float64))
    sd = np.sqrt((hi - np.abs(y[0].numpy())) * (np.abs(y[0].numpy()) - lo)) / np.sqrt(len(y))
    assert np.all(np.abs(q.mean(0).numpy() - y[0].numpy()) <= 4 * sd + 1e-12)


def test_a_hadamard_rotation_is_orthogonal_and_quantizes_in_its_basis():
    """R = D H is orthogonal; the rotating quantizer returns Q(x R) R^T blockwise (computed here with
    explicit matrices and the oracle), and two operands of one GEMM share R, so their product is that of
    the rotated quantized operands."""
    h = corr.build({"name": "hadamard", "gemms": ["weight_grad"]})
    h.bind(total_steps=1, seed=3)
    op = Operand("grad", "weight_grad", "layers.0.mlp")
    r = h.rotation(op, 32, "cpu")
    assert torch.allclose(r @ r.T, torch.eye(32, dtype=torch.float64), atol=1e-12)
    assert torch.equal(r.abs(), hadamard_matrix(32).abs())
    assert torch.equal(r, h.rotation(Operand("activation", "weight_grad", "layers.0.mlp"), 32, "cpu"))
    assert h.rotation(Operand("grad", "input_grad", "layers.0.mlp"), 32, "cpu") is None  # not its GEMM
    assert not torch.equal(r, h.rotation(Operand("grad", "weight_grad", "layers.1.mlp"), 32, "cpu"))

    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(1))
    x[:, 5] *= 40
    q = Quantizer(corrections=[h])(x, -1, operand=op)
    rotated = (x.double().reshape(6, 2, 32) @ r).reshape(6, 64).float()
    codes, scale_bytes, _ = oracle_quantize(rotated.numpy(), "e2m1", 32, "e8m0", "floor")
    deq = oracle_decode(codes, "e2m1") * np.ldexp(1.0, scale_bytes.astype(np.int64) - 127)[..., None]
    expected = (torch.from_numpy(deq.astype(np.float32)).double() @ r.T).reshape(6, 64).float()
    assert torch.equal(q, expected)
    assert (q - x).norm() < Quantizer()(x, -1).sub(x).norm()  # the outlier column spread: a smaller error


def test_decomposition_of_a_rotating_recipe_is_in_its_basis():
    """On data with outlier columns RHT's deadzone fraction differs from plain MXFP4's and equals the
    decomposition of the explicitly rotated tensor."""
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(2))
    x[:, ::37] *= 30
    h = corr.build({"name": "hadamard", "gemms": ["forward"]})
    op = Operand("activation", "forward", "l")
    stats = Quantizer(corrections=[h]).decompose(x, -1, operand=op).stats
    r = h.rotation(op, 32, "cpu")
    direct = mxfp4.decompose((x.double().reshape(64, 8, 32) @ r).reshape(64, 256).float(), axis=-1).stats
    plain = mxfp4.decompose(x, axis=-1).stats
    assert stats["deadzone_fraction"] == direct["deadzone_fraction"]
    assert stats["energy_total"] == direct["energy_total"]
    assert stats["deadzone_fraction"] < plain["deadzone_fraction"] / 2


def test_stochastic_rounding_state_replays_the_draws_after_a_resume():
    """A checkpoint's state restores the call counts: the next draws are the uninterrupted run's."""
    op = Operand("grad", "input_grad", "l")
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(5))
    run = corr.build("stochastic_rounding")
    run.bind(total_steps=3, seed=9)
    q = Quantizer(corrections=[run])
    q(x, -1, operand=op)
    saved = run.state_dict()
    expected = q(x, -1, operand=op)
    resumed = corr.build("stochastic_rounding")
    resumed.bind(total_steps=3, seed=9)
    resumed.load_state_dict(saved)
    assert torch.equal(Quantizer(corrections=[resumed])(x, -1, operand=op), expected)
    assert not torch.equal(Quantizer(corrections=[run])(x, -1, operand=op), expected)  # a fresh draw each call


def test_the_standard_recipe_touches_only_its_operands_in_a_patched_model():
    """mxfp4+rht-sr leaves the forward GEMM as plain MXFP4 computes it (bit for bit) and changes the
    gradients (rotation of the weight-gradient GEMM, stochastic rounding of dY); every hook hears which
    operand of which GEMM of which layer it quantizes."""
    from mxfp4.rl.models import build_tiny

    def outputs(recipe):
        model, tok = build_tiny("tiny-dense", seed=0, layers=1)
        mxfp4.quantize_(model, Recipe.named(recipe))
        ids = tok("Question: 3+4\nAnswer:", return_tensors="pt").input_ids
        out = model(ids).logits
        out.float().square().mean().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain_y, plain_g = outputs("mxfp4")
    std_y, std_g = outputs("mxfp4+rht-sr")
    assert torch.equal(plain_y, std_y)
    assert any(not torch.equal(plain_g[n], std_g[n]) for n in plain_g)
    assert all(torch.isfinite(g).all() for g in std_g.values())

    seen = set()

    class Recording(corr.Correction):
        """Hears every operand through the rounding hook, and rounds none stochastically."""

        rounds_stochastically = True

        def rounding_generator(self, operand, device):
            seen.add((operand.role, operand.gemm, operand.layer.rsplit(".", 1)[-1]))
            return None

    model, tok = build_tiny("tiny-dense", seed=0, layers=1)
    mxfp4.nn.patch_model(model, Quantizer(corrections=[Recording()]), cache_weights=False)
    model(tok("Question: 3+4", return_tensors="pt").input_ids).logits.float().mean().backward()
    roles = {(r, g) for r, g, _ in seen}
    assert roles == {("weight", "forward"), ("weight", "input_grad"), ("activation", "forward"),
                     ("grad", "input_grad"), ("grad", "weight_grad"), ("activation", "weight_grad")}
    assert {"q_proj", "down_proj"} <= {layer for _, _, layer in seen}


def test_the_worked_example_of_docs_corrections_runs_as_written():
    """Every python block of docs/corrections.md, in order, in one namespace (its asserts included)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "corrections.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 5
    namespace = {}
    try:
        for block in blocks:
            exec(compile(block, "docs/corrections.md", "exec"), namespace)  # noqa: S102 - the page's own code
        assert namespace["correction"].state_dict()["calls"] == 1
    finally:
        corr.REGISTRY.pop("late_weight_grad_sr", None)
        corr.REGISTRY.pop("two_level", None)
        corr.REGISTRY.pop("my_smoothing", None)


def test_decompose_and_the_correction_table_take_a_recipe_and_decompose_in_its_basis(tmp_path):
    """``mxfp4 decompose --recipe`` and ``corrections-table --recipe``: the rotating recipe's deadzone
    fraction is that of the explicitly rotated sample, not the original's."""
    import json

    from mxfp4.analysis import correction_table as ct
    from mxfp4.cli import main
    from mxfp4.verify.distributions import sample

    out = tmp_path / "stats.json"
    with open(out, "w") as f, contextlib.redirect_stdout(f):
        assert main(["decompose", "--dist", "llm_rows", "--recipe", "mxfp4+rht-sr", "--json"]) == 0
    got = json.loads(out.read_text())
    assert got["corrections_applied"] == ["hadamard (rotation)", "stochastic_rounding (rounding_generator)"]
    h = Recipe.named("mxfp4+rht-sr").build_corrections()[0]
    x = sample("llm_rows", 256, 1024, seed=0)
    rotated = (x.double().reshape(256, 32, 32) @ h.rotation(None, 32, "cpu")).reshape(256, 1024).float()
    assert got["deadzone_fraction"] == mxfp4.decompose(rotated, axis=-1).stats["deadzone_fraction"]
    assert got["deadzone_fraction"] < mxfp4.decompose(x, axis=-1).stats["deadzone_fraction"]
    rows = ct.rows({"llm_rows": {"llm_rows": (x, -1, None)}}, ["mxfp4+rht-sr"])
    row = next(r for r in rows if r["correction"] == "recipe mxfp4+rht-sr")
    assert row["deadzone_fraction_after"] == got["deadzone_fraction"]


def test_every_quantizer_takes_the_operand_its_callers_pass():
    """Patched layers call every quantizer with ``operand=``: each subclass's ``__call__`` accepts it."""
    import inspect

    import mxfp4.analysis.regime  # noqa: F401 - its ObservingQuantizer
    import mxfp4.numerics.injection  # noqa: F401 - its ComponentQuantizer

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    found = list(subclasses(Quantizer))
    assert {c.__name__ for c in found} >= {"ComponentQuantizer", "ObservingQuantizer"}
    for cls in [Quantizer, *found]:
        assert "operand" in inspect.signature(cls.__call__).parameters, cls.__name__

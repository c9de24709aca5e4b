"""The format table: one registered BlockFormat is a format for every path (dispatch, recipes, the CLI)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mxfp4
from mxfp4.config.recipes import Recipe
from mxfp4.numerics import dispatch, formats
from mxfp4.numerics.formats import E2M1, BlockFormat, register_format
from oracle import oracle_decode, oracle_quantize

TOY = BlockFormat("mxfp4_b16", E2M1, "e8m0", 16)  # MXFP4's elements on blocks of 16


@pytest.fixture(scope="module")
def toy_format():
    saved = dict(formats.FORMATS)
    register_format(TOY)
    yield TOY
    formats.FORMATS.clear()
    formats.FORMATS.update(saved)


def oracle_values(x: np.ndarray, rule: str) -> np.ndarray:
    codes, scales, _ = oracle_quantize(x, "e2m1", 16, "e8m0", rule)
    s = scales.view(np.uint8).astype(np.int64)
    values = oracle_decode(codes, "e2m1") * np.ldexp(np.float32(1.0), s - 127).astype(np.float32)[..., None]
    return values.reshape(x.shape[0], -1)[:, : x.shape[1]]


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 6), cols=st.integers(1, 70), rule=st.sampled_from(["floor", "ceil", "even", "rceil"]),
       seed=st.integers(0, 2**16), spread=st.floats(0.01, 8.0))
def test_a_registered_format_quantizes_as_the_independent_oracle_on_every_backend(toy_format, rows, cols, rule,
                                                                                   seed, spread):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.exp(torch.randn(rows, cols, generator=g) * spread)
    want = oracle_values(x.numpy(), rule)
    for backend in ("reference", "fused"):
        with dispatch.use_backend(backend):
            got = mxfp4.fake_quantize(x, "mxfp4_b16", -1, rule)
        np.testing.assert_array_equal(got.numpy(), want, err_msg=backend)


def test_a_registered_format_is_a_recipe_format_and_a_cli_choice(toy_format, capsys):
    q = Recipe(name="toy", format="mxfp4_b16").quantizer()
    assert q.fmt is TOY and q.token_alignment() == 16
    x = torch.randn(3, 40)
    assert torch.equal(q(x, -1), mxfp4.fake_quantize(x, "mxfp4_b16"))
    from mxfp4.cli import main

    assert main(["formats"]) == 0 and "mxfp4_b16" in capsys.readouterr().out


def test_a_name_registered_twice_is_refused(toy_format):
    with pytest.raises(ValueError, match="registered already"):
        register_format(BlockFormat("mxfp4", E2M1, "e8m0", 32))

"""Device safety of quantizers and corrections (docs/design.md: every tensor made on its input's device).

On CPU, ``audit_devices`` runs each on inputs posing as tensors of another device and fails on any
op that mixes them with a tensor made on the CPU; the ``gpu``-marked tests run the same on CUDA and
compare bit for bit with the CPU."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mxfp4.config.recipes import Recipe
from mxfp4.corrections.macro_block import MacroBlockScaling
from mxfp4.corrections.outlier_fallback import OutlierFallback
from mxfp4.numerics import dispatch, reference
from mxfp4.numerics.formats import FORMATS
from mxfp4.numerics.quantizer import Quantizer
from mxfp4.verify.device_audit import DeviceLeak, audit_devices

FORMAT_RULES = [(f, r) for f, fmt in FORMATS.items() for r in fmt.scale_rules]
CORRECTIONS = {
    "macro": lambda: [MacroBlockScaling(blocks=4)],
    "macro-2d-all": lambda: [MacroBlockScaling(blocks=2, rows=2, candidates="all")],
    "fallback-element": lambda: [OutlierFallback(mode="element", k=2)],
    "fallback-block": lambda: [OutlierFallback(mode="block", fraction=0.1)],
    "fallback+macro": lambda: [OutlierFallback(mode="element", k=1), MacroBlockScaling(blocks=4)],
}
INJECTION = ["inject-scale", "inject-dead", "inject-grid", "remove-scale", "remove-dead", "remove-grid"]


def _x(shape=(64, 256), seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * torch.exp2(torch.randint(-12, 12, shape, generator=g).float())


# --- the audit finds the bugs that crashed on an H100 ----------------------------------------------

def test_the_audit_catches_a_cpu_scalar_operand_of_nextafter():
    """The old _bf16_round_up: torch.nextafter(x, torch.tensor(inf)), fine on CPU, a crash on CUDA."""
    with pytest.raises(DeviceLeak, match="nextafter"):
        audit_devices(
            lambda x: torch.nextafter(x.to(torch.bfloat16), torch.tensor(math.inf, dtype=torch.bfloat16)), _x()
        )


def test_the_audit_catches_a_cpu_mask_indexed_with_device_indices():
    """The old block mode of outlier fallback: a CPU mask indexed with the input's topk indices."""

    def block_mask(x):
        keep = torch.zeros(x.shape[0], dtype=torch.bool)
        keep[x.abs().amax(-1).topk(4).indices] = True
        return keep

    with pytest.raises(DeviceLeak, match="index_put"):
        audit_devices(block_mask, _x())


def test_the_audit_catches_a_code_table_kept_on_the_cpu():
    """The old formats.py: element code tables on the CPU, indexed with the codes of a device tensor."""
    table = FORMATS["mxfp6_e2m3"].element.code_table.float()
    with pytest.raises(DeviceLeak, match="index"):
        audit_devices(lambda codes: table[codes.long()], torch.randint(0, 64, (8, 32)))


def test_the_audit_lets_explicit_copies_through():
    out = audit_devices(lambda x: (x + torch.ones(3).to(x)).cpu() * torch.tensor(2.0), torch.zeros(3))
    assert torch.equal(out, torch.full((3,), 2.0))


# --- every format, scale rule and correction is device-clean ----------------------------------------


@pytest.mark.parametrize("fmt,rule", FORMAT_RULES)
def test_every_format_and_scale_rule_makes_its_tensors_on_the_input_device(fmt, rule):
    x = _x()
    fake = audit_devices(lambda t: reference.fake_quantize(t, fmt, -1, rule), x)
    back = audit_devices(lambda t: reference.dequantize(reference.quantize(t, fmt, 0, rule), torch.float32), x)
    assert torch.equal(fake, reference.fake_quantize(x, fmt, -1, rule))
    assert torch.equal(back, reference.dequantize(reference.quantize(x, fmt, 0, rule), torch.float32))


@pytest.mark.parametrize("name", list(CORRECTIONS))
@pytest.mark.parametrize("axis", [-1, 0])
def test_every_correction_makes_its_tensors_on_the_input_device(name, axis):
    x = _x()
    audited = audit_devices(lambda t: Quantizer(corrections=CORRECTIONS[name]())(t, axis), x)
    assert torch.equal(audited, Quantizer(corrections=CORRECTIONS[name]())(x, axis))
    stats = audit_devices(lambda t: Quantizer(corrections=CORRECTIONS[name]()).decompose(t, axis).stats, x)
    assert stats == Quantizer(corrections=CORRECTIONS[name]()).decompose(x, axis).stats


@pytest.mark.parametrize("recipe", INJECTION)
def test_component_injection_makes_its_tensors_on_the_input_device(recipe):
    x = _x()
    audited = audit_devices(lambda t: Recipe.named(recipe).quantizer()(t, -1), x)
    assert torch.equal(audited, Recipe.named(recipe).quantizer()(x, -1))


def test_aqn_noise_lands_on_the_weights_device():
    """AQN draws its noise on the CPU (same noise on any device) and moves it with .to(weight)."""
    from mxfp4.corrections.aqn import AdaptiveQuantizationNoise as AQN

    class RMSNorm(torch.nn.Module):
        def __init__(self, w):
            super().__init__()
            self.weight = w

    def noisy(w):
        aqn = AQN(sigma_start=1e-2, sigma_end=1e-4, stages=2)
        aqn.bind(total_steps=2, seed=0)
        model = torch.nn.Sequential(RMSNorm(w))
        with aqn.rollout_context(model, 1):
            return w.clone()

    out = audit_devices(noisy, torch.ones(64))
    assert 0 < (out - 1).abs().max() < 0.1


# --- macro-block through the Triton path --------------------------------------------------------


@pytest.mark.slow
@given(
    st.integers(0, 2**16),
    st.sampled_from(
        [((64, 256), -1, 1), ((256, 64), 0, 1), ((64, 256), -1, 2), ((2, 64, 128), 1, 1), ((32, 96), -1, 4)]
    ),
)
def test_macro_block_through_the_kernels_equals_the_reference_block_path(seed, case):
    """On CUDA macro-block runs as two fake-quantizations by the Triton kernels (interpreter here);
    the values must be those of the reference block path, bit for bit."""
    shape, axis, rows = case
    x = _x(shape, seed)
    q = Quantizer(corrections=[MacroBlockScaling(blocks=4, rows=rows)])
    with dispatch.use_backend("reference"):
        ref = q(x, axis)
    with dispatch.use_backend("triton"):
        tri = q(x, axis)
    assert torch.equal(ref, tri)


# --- which quantized values a bf16 GEMM takes exactly --------------------------------------------------


@given(st.integers(0, 2**16), st.sampled_from(["mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "fallback"]))
def test_quantizers_that_claim_bf16_exactness_return_bf16_numbers(seed, name):
    """``exact_in_bf16`` lets the patched GEMMs run in bf16 under autocast and the weight cache hold
    bf16: every value must survive a round trip through bfloat16 unchanged."""
    q = Quantizer(corrections=[OutlierFallback(k=1)]) if name == "fallback" else Quantizer(fmt=name)
    assert q.exact_in_bf16
    v = q(_x((32, 128), seed), -1)
    assert torch.equal(v, v.to(torch.bfloat16).float())


def test_macro_block_and_nvfp4_values_are_not_all_bf16_numbers():
    """Why those quantizers run their GEMMs in float32 under autocast."""
    for q in (Quantizer(corrections=[MacroBlockScaling(blocks=4)]), Quantizer(fmt="nvfp4")):
        assert not q.exact_in_bf16
        v = q(_x((64, 256), 3), -1)
        assert not torch.equal(v, v.to(torch.bfloat16).float())


def _in_tf32(v: torch.Tensor) -> torch.Tensor:
    """v rounded to TF32 (10 fraction bits), nearest with ties to even, by integer arithmetic on the float32 bits."""
    bits = v.contiguous().view(torch.int32).long() & 0xFFFFFFFF
    mag, sign = bits & 0x7FFFFFFF, bits & 0x80000000
    rounded = ((mag + 0xFFF + ((mag >> 13) & 1)) & ~0x1FFF) | sign
    return (rounded - ((rounded >> 31) << 32)).to(torch.int32).view(torch.float32).view(v.shape)


@given(st.integers(0, 2**16), st.integers(-120, 100), st.sampled_from([1, 2, 4, 8]),  # finite: |x| < 2**116
       st.sampled_from(["macro", "macro+fallback", "macro-all"]))
def test_quantizers_that_claim_tf32_exactness_return_tf32_numbers(seed, log_scale, blocks, name):
    """``exact_in_tf32`` lets the float32 GEMMs of macro-block scaling take TF32 inputs on CUDA: every value
    (a grid value's 2 bits times a BF16 mantissa's 8, times a power of two) survives rounding to TF32."""
    macro = MacroBlockScaling(blocks=blocks, candidates="all" if name == "macro-all" else "max")
    q = Quantizer(corrections=[OutlierFallback(k=1), macro] if name == "macro+fallback" else [macro])
    assert q.exact_in_tf32 and not q.exact_in_bf16
    v = q(_x((32, 256), seed) * 2.0 ** log_scale, -1)
    assert torch.equal(v.view(torch.int32), _in_tf32(v).view(torch.int32))


def test_quantizers_whose_values_need_float32_do_not_claim_tf32():
    """A per-tensor FP32 scale (NVFP4), a rotation, or a block format whose macro-block values have more than
    11 significant bits: their GEMMs stay in strict float32, and their values do lose bits in TF32."""
    for q, tensor_scale in ((Quantizer(fmt="nvfp4"), True),
                            (Quantizer(fmt="mxfp8_e4m3", corrections=[MacroBlockScaling(blocks=4)]), False)):
        assert not q.exact_in_tf32
        v = q(_x((64, 256), 3) * (1.0 if tensor_scale else 1.37), -1)
        assert not torch.equal(v, _in_tf32(v))


# --- the same on CUDA, bit for bit against the CPU ----------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,rule", FORMAT_RULES)
def test_every_format_and_scale_rule_on_cuda_equals_the_cpu(fmt, rule):
    x = _x()
    q = Quantizer(fmt=fmt, scale_rule=rule)
    assert torch.equal(q(x.cuda(), -1).cpu(), q(x, -1))
    qt = dispatch.quantize(x.cuda(), fmt, 0, rule)
    assert torch.equal(
        reference.dequantize(qt, torch.float32).cpu(),
        reference.dequantize(reference.quantize(x, fmt, 0, rule), torch.float32),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CORRECTIONS))
@pytest.mark.parametrize("axis", [-1, 0])
def test_every_correction_on_cuda_equals_the_cpu(name, axis):
    x = _x()
    assert torch.equal(
        Quantizer(corrections=CORRECTIONS[name]())(x.cuda(), axis).cpu(),
        Quantizer(corrections=CORRECTIONS[name]())(x, axis),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["mxfp4", "mxfp4+macro", "mxfp4+fallback", "mxfp4+all"])
def test_a_patched_model_trains_a_step_on_cuda_under_bf16_autocast(recipe):
    from mxfp4.nn import patch_model
    from mxfp4.rl.models import build_tiny

    model, _ = build_tiny("tiny-dense", seed=0)
    model.cuda()
    patch_model(model, Recipe.named(recipe).quantizer())
    ids = torch.randint(4, 60, (2, 64), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)

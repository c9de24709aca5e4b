"""Triton kernels bit-exact with the reference: under TRITON_INTERPRET=1 on CPU tensors (the suite; set
by conftest), and compiled on CUDA (the same checks marked gpu: MXFP4_TEST_CUDA=1 on a GPU machine).
The checks run when a test asks for them, never at collection."""

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mxfp4
from mxfp4.numerics import dispatch, reference
from mxfp4.verify import kernel_checks
from mxfp4.verify.adversarial import adversarial_rows

DEVICES = [pytest.param("cpu", id="interpreter"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


@functools.cache
def results(device: str, kernel: str) -> list[dict]:
    """Every case of one kernel on ``device``: each test checks its own kernel, so pytest-xdist workers share
    the compiles out instead of each compiling every kernel's cases."""
    return list(kernel_checks.check_cases(device, kernels=(kernel,)))


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", kernel_checks.KERNELS)
def test_kernel_is_bit_exact_with_reference_on_every_case(kernel, device):
    mine = results(device, kernel)
    assert {r["kernel"] for r in mine} == {kernel}
    # 2D cases (adversarial rows + the transposed one) x 2 axes, 3D cases x 3 axes; x dtypes x rules
    assert len(mine) == ((len(adversarial_rows()) + 1) * 2 + 2 * 3) * 3 * 4
    failed = [r for r in mine if not r["passed"]]
    assert not failed, failed[:5]
    skipped = [r for r in mine if r["detail"].startswith("skipped")]
    assert len(skipped) < len(mine) / 2  # most cases really ran


@settings(max_examples=12)  # the edit loop's share of the sweep above (marked slow): a sample of its cases
@given(kernel=st.sampled_from(kernel_checks.KERNELS), case=st.sampled_from(sorted(kernel_checks.kernel_cases())),
       dtype=st.sampled_from(kernel_checks.DTYPES), rule=st.sampled_from(kernel_checks.SCALE_RULES_E8M0),
       axis_index=st.integers(0, 2))
def test_a_sampled_kernel_case_is_bit_exact_with_reference(kernel, case, dtype, rule, axis_index):
    x = kernel_checks.kernel_cases()[case].to(dtype=dtype)
    if case == "transposed":
        x = x.t().contiguous().t()
    axes = kernel_checks.AXES[x.dim()]
    ok, detail = kernel_checks.check_one(kernel, x, axes[axis_index % len(axes)], rule)
    assert ok, detail


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_on_mxfp4_operands_matches_exact_products(device):
    for name, r in kernel_checks.check_matmul(device).items():
        assert r["passed"], (name, r)


def test_same_tells_negative_zero_and_nan_apart():
    assert kernel_checks.same(torch.tensor([float("nan"), 1.0]), torch.tensor([float("nan"), 1.0]))
    assert not kernel_checks.same(torch.tensor([-0.0]), torch.tensor([0.0]))
    assert not kernel_checks.same(torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.bfloat16))


def test_dispatch_uses_triton_when_asked_and_reference_by_default():
    x = adversarial_rows()["ties"]
    assert dispatch.backend_for(x) in ("fused", "reference")  # the fused C++ kernel where it builds
    with mxfp4.use_backend("triton"):
        assert dispatch.backend_for(x) == "triton"
        assert dispatch.backend_for(x, "nvfp4") == "reference"
        q = mxfp4.quantize(x)
        y, stats = mxfp4.fake_quantize_with_stats(x)
    ref_y, ref_stats = mxfp4.fake_quantize_with_stats(x)
    assert torch.equal(q.codes, reference.quantize(x).codes)
    assert torch.equal(y, ref_y)
    assert stats["deadzone_count"] == ref_stats["deadzone_count"]


def test_unknown_backend_is_an_error_naming_the_accepted_ones():
    with pytest.raises(ValueError, match="accepted: auto, reference, fused, triton"):
        with mxfp4.use_backend("cuda"):
            pass


@pytest.mark.gpu
def test_cuda_tensors_dispatch_to_triton():
    x = torch.randn(256, 256, device="cuda")
    assert dispatch.backend_for(x) == "triton"
    assert torch.equal(mxfp4.fake_quantize(x).cpu(), reference.fake_quantize(x.cpu()))


@pytest.mark.gpu
def test_on_cuda_each_new_shape_bucket_is_tuned_once_and_counted(monkeypatch):
    """Triton's own autotuner (the device's version): a shape in a bucket not yet seen tunes and counts one
    key; the same bucket again counts nothing; the next power of two counts one more."""
    from mxfp4.numerics import triton_kernels as tk

    monkeypatch.setenv("MXFP4_AUTOTUNE", "1")  # the session's tests step turns it off for the other tests
    counted = []
    for rows in (300, 300, 400, 600):  # buckets 512, 512, 512, 1024; K = 352 (11 blocks), used nowhere else
        before = tk.autotune_spent()
        out = mxfp4.fake_quantize(torch.randn(rows, 352, device="cuda"))
        torch.cuda.synchronize()
        counted.append(tk.autotune_spent()[1] - before[1])
        assert out.shape == (rows, 352)
    assert counted == [1, 0, 0, 1]


def assert_stats_match_the_float64_reference(stats: dict, x: torch.Tensor, axis: int, rule: str = "floor", label=()):
    """The stats kernel's counts equal the float64 decomposition's exactly; its energies (float32 partials)
    within ENERGY_RTOL of the total error energy."""
    from mxfp4.numerics.decompose import decompose

    ref = decompose(x.cpu(), "mxfp4", axis, rule)
    assert int(stats["deadzone_count"]) == int(ref.dead.sum()), label
    assert int(stats["saturation_count"]) == int(ref.saturated.sum()), label
    for k in kernel_checks.ENERGY_KEYS:
        assert abs(float(stats[k]) - ref.stats[k]) <= kernel_checks.ENERGY_RTOL * ref.stats["energy_total"], (*label, k)


@pytest.mark.gpu
@pytest.mark.parametrize("axis", [-1, 0])
def test_on_cuda_the_stats_of_a_call_that_tunes_equal_the_float64_reference(monkeypatch, axis):
    """The device's autotuner benchmarks every config into the stats partials before the chosen one runs
    (the CPU test above runs Triton's Autotuner under the interpreter; this one, the device's timer and
    configs). A shape used nowhere else, so this call tunes."""
    from mxfp4.numerics import triton_kernels as tk

    monkeypatch.setenv("MXFP4_AUTOTUNE", "1")
    x = torch.randn(1000, 2080, generator=torch.Generator().manual_seed(7)).bfloat16()
    keys = tk.autotune_spent()[1]
    _, stats = tk.fake_quantize_with_stats(x.cuda(), axis)
    torch.cuda.synchronize()
    assert tk.autotune_spent()[1] == keys + 1
    assert_stats_match_the_float64_reference(stats, x, axis)


def test_stats_kernel_returns_device_tensors_that_match_the_float64_reference():
    from mxfp4.numerics import triton_kernels as tk

    x = torch.randn(40, 96, generator=torch.Generator().manual_seed(3)).bfloat16()
    _, stats = tk.fake_quantize_with_stats(x, 0)
    assert all(isinstance(stats[k], torch.Tensor) and stats[k].dim() == 0 for k in kernel_checks.ENERGY_KEYS)
    assert_stats_match_the_float64_reference(stats, x, 0)


@pytest.mark.parametrize("axis", [-1, 0])
def test_the_stats_of_a_call_that_autotunes_count_only_the_chosen_configs_programs(monkeypatch, axis):
    """On CUDA the first call of a new shape runs Triton's autotuner: every config of the space is
    benchmarked into the same per-program partials buffer (sized for the config with the most programs)
    before the best one runs. Rows the best config does not write must be zero then, or the energies and
    counts of that call add other configs' partials. Triton's real Autotuner runs here, its kernels under
    the interpreter and its timer replaced (each config run once; the last config, with fewer programs than
    the first ones, wins), so the check runs without a GPU. It failed before the fix: twice the counts."""
    from mxfp4.numerics import triton_kernels as tk

    tuned = tk._quant_rows_tuned if axis == -1 else tk._quant_cols_tuned
    shape = (64, 1024) if axis == -1 else (256, 64)  # rows mode; column mode with B = 1, R = 256, C = 64
    x = torch.randn(shape, generator=torch.Generator().manual_seed(5)).bfloat16()
    runs = []

    def one_run_each(kernel_call, quantiles):  # each config run once, each faster than the last: the last wins,
        kernel_call()  # and the last config of both spaces launches fewer programs than the first ones
        runs.append(None)
        return [1.0 / len(runs)] * len(quantiles)

    monkeypatch.setattr(tk, "triton_interpreting", lambda: False)
    monkeypatch.setenv("MXFP4_AUTOTUNE", "1")
    monkeypatch.setattr(tuned, "cache", {})
    monkeypatch.setattr(tuned, "_do_bench", one_run_each)
    _, stats = tk.fake_quantize_with_stats(x, axis)
    assert len(tuned.cache) == 1  # this call tuned: every config ran before the chosen one
    assert_stats_match_the_float64_reference(stats, x, axis)


@pytest.mark.slow
def test_every_config_the_autotuner_may_pick_is_bit_exact(monkeypatch):
    """Under the interpreter a kernel runs the interpreter's tiles, and the device's checks run each space's
    first config: the other configs of an autotune space (other tiles, so other masks and program
    counts) ran nowhere until the autotuner picked one in training. Each is forced here and checked
    (memory kernels bit for bit, GEMMs within the float32 accumulation bound). The whole-K W4A16 spaces
    are taken from two weight tiles on, not 96 as on the device (the configs are the same; the split-K
    ones still at one tile)."""
    from mxfp4.numerics import triton_gemm as tg

    monkeypatch.setattr(tg, "DIRECT_MIN_TILES", 2)
    results = list(kernel_checks.check_every_config())
    assert {r["space"] for r in results} == set(tg.autotune_spaces()) and len(results) == sum(
        len(tuned.configs) * len(checks) for _, tuned, checks in kernel_checks.checks_per_autotune_space()
    )
    assert [r for r in results if not r["passed"]] == []


CONFIGS = [(space, i) for space, tuned, _ in kernel_checks.checks_per_autotune_space()
           for i in range(len(tuned.configs))]


@settings(max_examples=3)  # the edit loop's share of the every-config sweep above (marked slow)
@given(picked=st.sampled_from(CONFIGS))
def test_a_sampled_config_the_autotuner_may_pick_is_bit_exact(picked):
    from unittest import mock

    from mxfp4.numerics import triton_gemm as tg

    with mock.patch.object(tg, "DIRECT_MIN_TILES", 2):
        results = list(kernel_checks.check_every_config(pick={picked}))
    assert results and {(r["space"]) for r in results} == {picked[0]}
    assert [r for r in results if not r["passed"]] == []


def test_the_list_of_autotune_spaces_holds_every_autotuner_of_the_kernel_modules():
    """The every-config check and the compile reports walk ``triton_gemm.autotune_spaces``: an autotuner the
    kernel modules define outside it would be neither checked nor compiled config by config. Found here
    independently, by scanning the modules' globals (and the dictionaries among them) for Autotuner objects."""
    from triton.runtime.autotuner import Autotuner

    from mxfp4.numerics import triton_gemm as tg
    from mxfp4.numerics import triton_kernels as tk

    found = set()
    for module in (tk, tg):
        for value in vars(module).values():
            for v in value.values() if isinstance(value, dict) else (value,):
                if isinstance(v, Autotuner):
                    found.add(id(v))
    listed = [id(t) for t in tg.autotune_spaces().values()]
    assert len(set(listed)) == len(listed) == 14 and set(listed) == found


def test_a_config_the_device_cannot_run_is_skipped_as_the_autotuner_skips_it_and_an_error_fails_only_its_check(
    monkeypatch,
):
    """On the device a forced config may not fit (shared memory, registers): Triton's autotuner skips such a
    config, so it is never picked, and the check says so instead of failing. Any other error fails that
    check alone; the other configs are still checked."""
    from triton.runtime.errors import OutOfResources

    from mxfp4.numerics import triton_kernels as tk

    tuned = tk._dequant_rows_tuned
    qt = reference.quantize(torch.randn(8, 64))

    def too_big():
        tk.dequantize(qt)
        raise OutOfResources(300000, 232448, "shared memory")

    def broken():
        tk.dequantize(qt)
        raise ValueError("a fault of this config")

    space = [("dequantize rows", tuned, [("too big", too_big), ("broken", broken)])]
    monkeypatch.setattr(kernel_checks, "checks_per_autotune_space", lambda device, seed: space)
    rows = list(kernel_checks.check_every_config())
    assert len(rows) == 2 * len(tuned.configs)
    assert all(r["passed"] and r["skipped"] and "shared memory" in r["detail"] for r in rows[::2])
    assert all(not r["passed"] and not r["skipped"] and "a fault of this config" in r["detail"] for r in rows[1::2])


def test_a_forced_config_must_belong_to_the_space_and_a_check_that_launches_nothing_fails():
    from mxfp4.numerics import triton_kernels as tk

    with pytest.raises(ValueError, match="not a config of this autotune space"):
        with tk.forced_config(tk._quant_rows_tuned, tk._quant_cols_tuned.configs[1]):
            pass
    with tk.forced_config(tk._quant_rows_tuned, tk._quant_rows_tuned.configs[1]) as forced:
        tk.quantize(torch.randn(8, 64), axis=0)  # column mode: another space
    assert forced.launches == 0 and not tk._FORCED
    with tk.forced_config(tk._quant_rows_tuned, tk._quant_rows_tuned.configs[1]) as forced:
        tk.quantize(torch.randn(8, 64), axis=-1)
    assert forced.launches == 1


def test_a_tensor_stored_transposed_is_read_in_place_and_3d_along_a_middle_axis_without_a_copy():
    from mxfp4.numerics.triton_kernels import _Geometry

    base = torch.randn(64, 96)
    g = _Geometry(base.t(), 1)  # blocks along the transposed view's last axis = base's axis 0
    assert g.src.data_ptr() == base.data_ptr() and not g.rows_mode
    experts = torch.randn(4, 64, 32)
    g = _Geometry(experts, 1)
    assert g.view.data_ptr() == experts.data_ptr() and (g.b, g.r, g.c) == (4, 64, 32)


def test_packed_weight_layout_holds_elements_j_and_64_plus_j_of_each_128_chunk_and_scale_words():
    from mxfp4.numerics import triton_gemm as tg

    w = torch.randn(5, 200, generator=torch.Generator().manual_seed(1))
    w[2] *= 2.0**40  # scale bytes above 128: the exact float32 upcast
    qt = reference.quantize(w)
    packed = tg.pack_weight(qt)
    elems = qt.element_codes().reshape(5, -1)  # independent: the reference's own unpacking
    elems = torch.nn.functional.pad(elems, (0, packed.k_pad - elems.shape[1]))
    chunks = elems.reshape(5, -1, 128)
    assert torch.equal(packed.codes.reshape(5, -1, 64) & 0xF, chunks[..., :64])
    assert torch.equal(packed.codes.reshape(5, -1, 64) >> 4, chunks[..., 64:])
    words = packed.scales.t()  # [N, K_pad / 128] int32, little-endian bytes = blocks 4c .. 4c + 3
    blocks = torch.stack([(words >> (8 * b)) & 0xFF for b in range(4)], dim=-1).reshape(5, -1)
    assert torch.equal(blocks[:, : qt.scales.shape[1]], qt.scales.long())
    assert (blocks[:, qt.scales.shape[1]:] == 127).all() and not packed.fast_upcast
    assert tg.pack_weight(reference.quantize(torch.randn(5, 200))).fast_upcast


def test_fused_w4a16_kernel_is_refused_above_decode_m_and_bad_input_is_named():
    from mxfp4.numerics import triton_gemm as tg

    packed = tg.pack_weight(reference.quantize(torch.randn(8, 64)))
    with pytest.raises(ValueError, match="decode path: M <= 64, got M = 65"):
        tg.w4a16_matmul(torch.randn(65, 64).bfloat16(), packed, fused=True)
    with pytest.raises(ValueError, match="x has K = 32, the weight has K = 64"):
        tg.w4a16_matmul(torch.randn(2, 32).bfloat16(), packed)
    with pytest.raises(ValueError, match="takes an mxfp4 weight"):
        tg.pack_weight(reference.quantize(torch.randn(8, 64), axis=0))


# The causes as triton 3.6.0's interpreter raised them on this machine (numpy 2.4.6, then numpy 2.3.5)
INDEX_FAULT = "only 0-dimensional arrays can be converted to Python scalars"
NO_DOT_SCALED = "'InterpreterBuilder' object has no attribute 'create_dot_scaled'"
FORMAT_STR = "'str' object has no attribute 'value'"


@pytest.mark.parametrize(
    "error, triton_version, numpy_version, remedy",
    [
        (INDEX_FAULT, "3.6.0", "2.4.6", "triton-lang/triton#9171"),
        (INDEX_FAULT, "3.6.0", "2.5.2", "triton-lang/triton#9171"),  # the GPU machines' own pair
        (INDEX_FAULT, "3.3.1", "2.4.0rc1", "triton-lang/triton#9171"),
        (INDEX_FAULT, "3.6.0", "2.3.5", None),  # numpy before 2.4 only warned: not this fault
        (INDEX_FAULT, "3.7.0", "2.4.6", None),  # fixed (triton-lang/triton#9172)
        (INDEX_FAULT, "3.10.0", "2.4.0", None),  # versions compare as numbers, not strings
        (INDEX_FAULT, "3.6.0+git9f3a1c2", "2.4.0.dev0", "triton-lang/triton#9171"),  # local and dev builds
        (FORMAT_STR, "3.6.0", "2.3.5", "no tl.dot_scaled"),
        (NO_DOT_SCALED, "3.7.1", "2.4.6", "no tl.dot_scaled"),
        (NO_DOT_SCALED, "3.8.0", "2.4.6", None),  # the interpreter has it from 3.8
        ("KeyError('bf16_bits_rne')", "3.6.0", "2.4.6", None),  # any other error passes unchanged
    ],
)
def test_known_faults_of_older_triton_interpreters_are_named_with_their_remedy(
    error, triton_version, numpy_version, remedy
):
    from mxfp4.numerics import triton_kernels as tk

    message = tk.known_interpreter_fault(error, triton_version, numpy_version)
    if remedy is None:
        assert message is None
    else:
        assert remedy in message and f"triton {triton_version}" in message and "triton>=3.8" in message


def test_only_launches_that_tune_a_new_key_count_as_autotuning(monkeypatch):
    """The CUDA branch of launch_tuned against a stand-in autotuner (its ``cache`` as Triton's: one entry a key
    tuned): a launch that tunes counts its time and one key, a launch of a tuned key counts nothing."""
    import time

    from mxfp4.numerics import dispatch
    from mxfp4.numerics import triton_kernels as tk

    class Tuner:
        def __init__(self):
            self.cache = {}

        def __getitem__(self, grid):
            def launch(n, **constexprs):
                if n not in self.cache:
                    time.sleep(0.2)  # compiling and benchmarking the space
                    self.cache[n] = "best config"
                else:
                    time.sleep(0.3)  # a launch that waits (as one does behind a full queue): not tuning

            return launch

    monkeypatch.setattr(tk, "triton_interpreting", lambda: False)
    monkeypatch.setenv("MXFP4_AUTOTUNE", "1")
    tuner, (seconds0, keys0) = Tuner(), tk.autotune_spent()
    for n in (4096, 4096, 8192, 4096):
        tk.launch_tuned(None, tuner, lambda meta: (1,), {}, (n,))
    seconds, keys = tk.autotune_spent()
    assert keys - keys0 == 2 and 0.4 <= seconds - seconds0 < 0.9  # 1.0 or more if the other two counted
    assert dispatch.autotune_spent() == (seconds, keys)  # the kernels are loaded: the same account


def test_w4a16_direct_path_stores_the_output_dtype_exactly_as_split_k_adds_float32(monkeypatch):
    """The whole-K path (taken on a device with enough weight tiles) forced at a small shape: no
    zeroed buffer, one float32 accumulation per output stored as float32 or rounded once to bfloat16."""
    from mxfp4.numerics import triton_gemm as tg
    from mxfp4.verify.kernel_checks import _error_over_bound

    g = torch.Generator().manual_seed(3)
    qt = reference.quantize(torch.randn(40, 200, generator=g))
    packed = tg.pack_weight(qt)
    x = torch.randn(5, 200, generator=g).bfloat16()
    deq = reference.dequantize(qt, torch.bfloat16).double()
    launches = []
    real_launch = tg.launch_tuned

    def spy(kernel, tuned, grid_of, interp_meta, args, **constexprs):
        launches.append((interp_meta["SPLIT_K"], args[3].dtype))  # args[3]: the output the kernel writes
        return real_launch(kernel, tuned, grid_of, interp_meta, args, **constexprs)

    monkeypatch.setattr(tg, "launch_tuned", spy)
    split = tg.w4a16_matmul(x, packed, torch.float32)
    monkeypatch.setattr(tg, "DIRECT_MIN_TILES", 1)
    direct = tg.w4a16_matmul(x, packed, torch.float32)
    direct_bf16 = tg.w4a16_matmul(x, packed)
    assert launches == [(2, torch.float32), (1, torch.float32), (1, torch.int16)]  # bfloat16 stored as its bits
    assert direct_bf16.dtype == torch.bfloat16 and direct_bf16.shape == (5, 40)
    assert torch.equal(direct_bf16, direct.bfloat16())  # the same float32 sums, rounded once
    assert _error_over_bound(direct, x.double(), deq) <= 1.0
    assert _error_over_bound(split, x.double(), deq) <= 1.0
    # exact products on bfloat16 midpoints: 1.5 * (1 + 2**-7) rounds up to the even 1.515625, 1.5 *
    # (1 + 3 * 2**-7) down to the even 1.53125 (truncation gives 1.5078125; half-up 1.5390625); NaN stays NaN
    ties = torch.zeros(3, 32)
    ties[:, 0] = torch.tensor([1 + 2**-7, 1 + 3 * 2**-7, float("nan")])
    one_and_half = tg.pack_weight(reference.quantize(torch.nn.functional.pad(torch.tensor([[1.5]]), (0, 31))))
    got = tg.w4a16_matmul(ties.bfloat16(), one_and_half)[:, 0].float()
    assert got[:2].tolist() == [1.515625, 1.53125] and got[2].isnan()


@pytest.mark.slow
def test_device_check_of_the_w4a16_direct_path_runs_and_passes_under_the_interpreter():
    """check_matmul adds it on CUDA only (6144 weight rows); here it runs once so that the device's
    check is itself checked (it fails a truncating bfloat16 store: max error over bound 1.9)."""
    from mxfp4.verify.kernel_checks import _check_w4a16_direct

    results = _check_w4a16_direct("cpu", 200, torch.Generator().manual_seed(1))
    assert sorted(results) == ["w4a16_direct_bfloat16", "w4a16_direct_float32"]
    assert all(r["passed"] for r in results.values()), results


def test_probe_uses_the_fused_stats_kernel_where_triton_runs_and_agrees_with_float64():
    from mxfp4.config.recipes import Recipe
    from mxfp4.rl.grpo import DecompositionProbe

    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(9))
    quantizer = Recipe.named("mxfp4").quantizer()
    cpu_probe = DecompositionProbe(quantizer, {"l"})
    cpu_probe("l", "activation", x, -1)
    assert quantizer.fused_stats(x, -1) is None  # CPU tensors: the reference decomposition
    with mxfp4.use_backend("triton"):
        fused_probe = DecompositionProbe(quantizer, {"l"})
        fused_probe("l", "activation", x, -1)
        assert isinstance(fused_probe.stats["activation"][0]["energy_total"], torch.Tensor)
    fused, ref = fused_probe.summary(), cpu_probe.summary()
    assert "decomp/activation/shapley_share_scale" in ref and "decomp/activation/shapley_share_scale" not in fused
    for key in ("share_scale", "share_dead", "share_grid", "deadzone_fraction"):
        assert abs(fused[f"decomp/activation/{key}"] - ref[f"decomp/activation/{key}"]) < 1e-5, key


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["floor", "ceil", "even", "rceil"])
def test_every_bfloat16_value_rounds_and_decomposes_as_the_reference(rule):
    """All finite bfloat16 values below the block max, in blocks whose max is 7.9375 (one scale for
    every block; y = x / 2**e covers the whole grid, its midpoints and the saturating range) or
    5.625 (the ideal scale 5.625 / 6 puts exact ties of the ideal rounding on bfloat16 values, and
    6 / 5.625 is inexact in float32): the kernels' codes, scales and fake-quantized values (blocks
    along either axis) equal the reference's, and so do the deadzone and saturation counts and,
    to the stated float32 tolerance, the energies."""
    from mxfp4.numerics import triton_kernels as tk

    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    for anchor in (7.9375, 5.625):
        values = every[every.float().abs() <= anchor]
        values = torch.cat([values, torch.zeros((-len(values)) % 31, dtype=torch.bfloat16)]).reshape(-1, 31)
        x = torch.cat([torch.full((len(values), 1), anchor, dtype=torch.bfloat16), values], dim=1)  # [blocks, 32]
        for axis, xx in ((-1, x), (0, x.t().contiguous())):
            q, ref = tk.quantize(xx, axis, rule), reference.quantize(xx, "mxfp4", axis, rule)
            assert torch.equal(q.codes, ref.codes) and torch.equal(q.scales, ref.scales)
            assert kernel_checks.same(tk.fake_quantize(xx, axis, rule), reference.dequantize(ref))
            _, stats = tk.fake_quantize_with_stats(xx, axis, rule)
            assert_stats_match_the_float64_reference(stats, xx, axis, rule, label=(anchor, axis))


@pytest.mark.slow
def test_every_kernel_variant_compiles_for_hopper_without_a_gpu(tmp_path):
    """kernels/bench/inspect_sass.py --compile-all (a subprocess, the interpreter flag off): the memory kernels'
    bfloat16 launches under every scale rule and layout, the corrections kernel's variants, the W4A16 decode spaces
    and both tl.dot_scaled operand formats, each at its space's first config, compiled for sm_90a with this
    machine's Triton. The whole sweep (every dtype and config, with the device's Triton) is docs/kernels.md's; the
    interpreter does not compile, so a kernel that only the compiler refuses would otherwise first fail on the
    device."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "compile.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).parents[2] / "kernels" / "bench" / "inspect_sass.py"
    only = ["torch.bfloat16 floor", "torch.bfloat16 ceil", "w4a16", "dot_scaled", "dequantize torch.bfloat16",
            "corrections torch.float32 floor"]
    done = subprocess.run(
        [sys.executable, str(script), "--compile-all", "--first-config", "--out", str(out),
         *(a for o in only for a in ("--only", o))],
        env=env, capture_output=True, text=True,
    )
    report = json.loads(out.read_text())
    assert done.returncode == 0 and report["failed"] == 0, report["failures"]
    assert report["compiled"] >= 20, report


@pytest.mark.slow
def test_hopper_compile_report_keeps_the_quantize_under_the_issue_budget_and_w4a16_loads_pipelined(tmp_path):
    """kernels/bench/inspect_sass.py compiles for sm_90a without a GPU (a subprocess: it must not see the
    interpreter flag). The row quantize must stay under its budget (24.8 SASS instructions a bf16 element
    at 3 TB/s), and the W4A16 decode loop must load nothing outside its cp.async pipeline (scale bytes
    included) and run on tensor cores."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "sass.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).parents[2] / "kernels" / "bench" / "inspect_sass.py"
    subprocess.run(
        [
            sys.executable,
            str(script),
            "--out",
            str(out),
            "--shape",
            "256x1024",
            "--first-config",
            "--only",
            "quantize rows",
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    report = json.loads(out.read_text())
    quantize = next(r for r in report["rows"] if r["path"] == "quantize rows")
    assert quantize["instructions_per_element"] < report["issue_budget_per_element"] and quantize["spill_ops"] == 0
    assert len(report["w4a16_decode"]) == 4
    for row in report["w4a16_decode"]:
        assert row["loop_plain_global_loads"] == 0 and row["loop_mma"]["HGMMA"] + row["loop_mma"]["HMMA"] > 0, row
        assert row["loop_instructions_per_weight_element"] < 10, row

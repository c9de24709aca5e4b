import os

# The CPU numerics of the mxfp4 command and the workflow (AVX2 on every x86-64 machine), before torch
# loads: in-process runs then match the subprocess runs of the same cell bit for bit. MKL in its strict
# mode too: the tests that hold two paths equal bit for bit (grouped experts against the per-expert loop)
# then test what the paths compute, not how the BLAS blocks a padded GEMM on this CPU.
from mxfp4.machine import pin_cpu_numerics

pin_cpu_numerics(strict_gemm=True)

# Two modes, because triton decides at import time whether its kernels are compiled or interpreted:
# - the suite (default, CI and every machine, a GPU machine too): the Triton kernels run under the
#   interpreter on CPU tensors; tests marked gpu are skipped;
# - MXFP4_TEST_CUDA=1 (a GPU machine; kernels/gpu/gpu_session.sh tests): the kernels compiled for CUDA;
#   only the tests marked gpu run (the CUDA paths: kernels, formats, corrections, training steps).
CUDA_TESTS = os.environ.get("MXFP4_TEST_CUDA") == "1"
if not CUDA_TESTS:
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402 - after the pins above
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=25, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# One torch thread a pytest-xdist worker (the workers already fill the cores: two threads each doubled the CPU
# time of the suite on 2 cores); two in a single process.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, os.cpu_count() or 1)))

# What the CLI's model commands do (mxfp4.cli): transformers need not import torchao with every model class.
from mxfp4.cli import hide_torchao_from_transformers  # noqa: E402

hide_torchao_from_transformers()


def pytest_configure(config):
    if CUDA_TESTS and not torch.cuda.is_available():
        raise pytest.UsageError("MXFP4_TEST_CUDA=1 runs the compiled CUDA kernels, but torch sees no CUDA device")


# Fixtures whose tests belong to the slow tier wherever they are: they train or load a real model.
SLOW_FIXTURES = {
    "smoke_results",  # pretrains the smoke profile's tiny models
    "smollm2",  # loads SmolLM2-135M-Instruct from its GGUF file
}


def pytest_collection_modifyitems(config, items):
    if CUDA_TESTS:
        skip = pytest.mark.skip(reason="MXFP4_TEST_CUDA=1 runs only the tests marked gpu (the rest of the suite "
                                       "runs the Triton kernels under the interpreter: run it without MXFP4_TEST_CUDA)")
        wanted = lambda item: "gpu" not in item.keywords  # noqa: E731
    else:
        skip = pytest.mark.skip(reason="marked gpu: the compiled CUDA kernels (MXFP4_TEST_CUDA=1 on a GPU machine)")
        wanted = lambda item: "gpu" in item.keywords  # noqa: E731
    for item in items:
        if wanted(item):
            item.add_marker(skip)
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def smoke_results(tmp_path_factory):
    """A results folder with the smoke profile's tiny models warm-started (shared by the cell and
    pathway tests). The pretraining runs once per pytest run: under pytest-xdist the first worker makes
    it under a file lock in the run's shared folder and every worker copies it into a folder of its own
    (pretraining is deterministic: the copy is what the worker would have made)."""
    import shutil

    from filelock import FileLock

    from mxfp4.config.profiles import load_profile
    from mxfp4.config.run import Run
    from mxfp4.rl.pretrain import pretrain_model

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "smoke_pretrained"
    with FileLock(f"{shared}.lock"):
        if not (shared / "complete").exists():
            profile = load_profile("smoke")
            for model in profile.models:
                pretrain_model(Run.of(profile, shared), model)
            (shared / "complete").write_text("")
    root = tmp_path_factory.mktemp("results")
    shutil.copytree(shared / "smoke", root / "smoke")
    return root

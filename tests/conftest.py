import os

# The CPU numerics of the mxfp4 command and the workflow (AVX2 on every x86-64 machine), before torch
# loads: in-process runs then match the subprocess runs of the same cell bit for bit.
from mxfp4.machine import pin_cpu_numerics

pin_cpu_numerics()

# The Triton kernels run under the interpreter on CPU; triton decides at import time.
try:
    import torch as _torch

    if not _torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover
    pass

import pytest  # noqa: E402 - after the pins above
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=25, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

# What the CLI's model commands do (mxfp4.cli): transformers need not import torchao with every model class.
from mxfp4.cli import hide_torchao_from_transformers  # noqa: E402

hide_torchao_from_transformers()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smoke_results(tmp_path_factory):
    """A results folder with the smoke profile's tiny models warm-started (shared by the cell and
    pathway tests)."""
    from mxfp4.config.profiles import load_profile
    from mxfp4.layout import Layout
    from mxfp4.rl.pretrain import pretrain

    root = tmp_path_factory.mktemp("results")
    profile = load_profile("smoke")
    for model, spec in profile.models.items():
        pretrain(
            spec.arch, Layout(root, "smoke").model(model), max_steps_per_problem=1, **profile.pretrain.model_dump()
        )
    return root

import os

# The Triton kernels run under the interpreter on CPU; triton decides at import time.
try:
    import torch as _torch

    if not _torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover
    pass

import pytest
import torch
from hypothesis import settings

settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=25, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


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
    from mxfp4.config.profiles import load_profile, model_dir
    from mxfp4.rl.pretrain import pretrain

    root = tmp_path_factory.mktemp("results")
    profile = load_profile("smoke")
    for model, spec in profile.models.items():
        pretrain(spec.arch, model_dir(root, "smoke", model), max_steps_per_problem=1, **profile.pretrain.model_dump())
    return root

"""A correction arm's rollout policy is the one its recipe generates with."""

import torch

from mxfp4.analysis.pathways.measurement import Arm, correction_arm
from mxfp4.config.profiles import load_profile
from mxfp4.nn import patched_modules
from mxfp4.rl.models import build_tiny


def test_a_w4a16_rollout_arm_generates_with_its_weights_alone_quantized():
    """mxfp4+w4a16-rollouts' teacher-forced measures run as its rollouts generate: inside the arm's rollout context
    every patched layer passes its activations unquantized, and its logits are those of the W4A16 recipe; plain
    MXFP4's arm keeps W4A4."""
    profile = load_profile("embedded")
    model, tok = build_tiny("tiny-dense", seed=0)
    batch = tok(["Q: 12+7=? A: 19 #### 19"], return_tensors="pt")
    logits = {}
    for name in ("mxfp4+w4a16-rollouts", "mxfp4-w4a16", "mxfp4"):
        arm = correction_arm(name, "forward", profile, 0)
        with Arm(model, arm.quantizer), arm.rollout(model), torch.no_grad():
            only = {g.weights_only for _, _, g in patched_modules(model)}
            logits[name] = model(**batch).logits
        assert only == {name == "mxfp4+w4a16-rollouts"}
    assert torch.equal(logits["mxfp4+w4a16-rollouts"], logits["mxfp4-w4a16"])
    assert not torch.equal(logits["mxfp4"], logits["mxfp4-w4a16"])

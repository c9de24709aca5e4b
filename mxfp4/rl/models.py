"""Models: the paper's hub checkpoints, tiny stand-ins of the same architectures, and randomly
initialised models of the paper's real configurations.

The tiny models keep the real architectures (Qwen2 dense; Qwen3-MoE with fused 3D experts) at a
size that trains on two CPU cores, with a character tokenizer built locally by ``tokenizers``.
They are saved like any checkpoint and loaded back through the same code as hub ids.

The method in full: docs/methods.md, ``mxfp4.rl.models``."""

from __future__ import annotations

import json
import os
import shutil
import string
from pathlib import Path

import torch

from ..config import model_line, shipped
from ..config.profiles import differences
from ..config.run import Start
from ..io import changed_files, file_sha256

PAPER_MODELS = {"qwen2.5-3b": "Qwen/Qwen2.5-3B", "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B-Base"}
TINY_ARCHS = ("tiny-dense", "tiny-moe")
SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = string.digits + string.ascii_letters + " \n.,:;!?'\"()+-*/=$%#<>&@_[]{}^|~`\\"


def build_char_tokenizer(vocab_size: int | None = None):
    """A character-level tokenizer (one token per character) as a PreTrainedTokenizerFast; with
    ``vocab_size``, padded with never-produced ``<extra_i>`` tokens to exactly that many ids (the
    embedding and logit widths of a real configuration)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARS:
        vocab.setdefault(ch, len(vocab))
    if vocab_size is not None:
        if vocab_size < len(vocab):
            raise ValueError(f"vocab_size {vocab_size} is below the {len(vocab)} tokens of the character tokenizer")
        vocab.update({f"<extra_{i}>": i for i in range(len(vocab), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )


TINY_LAYERS = 2


def tiny_config(arch: str, vocab_size: int, layers: int = TINY_LAYERS):
    """Config of a tiny stand-in of ``layers`` decoder layers; every GEMM dimension a multiple of 32
    (whole MX blocks)."""
    common = dict(
        vocab_size=vocab_size,
        hidden_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    if arch == "tiny-dense":
        from transformers import Qwen2Config

        return Qwen2Config(intermediate_size=384, **common)
    if arch == "tiny-moe":
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(
            intermediate_size=384,
            moe_intermediate_size=96,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            **common,
        )
    raise ValueError(f"unknown tiny architecture {arch!r}; accepted: {', '.join(TINY_ARCHS)}")


def build_tiny(arch: str, seed: int = 0, layers: int = TINY_LAYERS):
    """(randomly initialised model in float32, tokenizer), deterministic under ``seed``."""
    from transformers import AutoModelForCausalLM

    tokenizer = build_char_tokenizer()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, len(tokenizer), layers), dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer


RANDOM_PREFIX = "random:"


def real_config(name: str):
    """The transformers config of ``experiments/models/<name>.json`` (a real model's architecture)."""
    from transformers import AutoConfig

    line = model_line(name)
    if line is None:
        raise ValueError(f"no model configuration experiments/models/{name}.json; "
                         f"known: {shipped('models', '.json', named_with_suffix=False)}")
    fields = {k: v for k, v in line.items() if not k.startswith("_")}
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def build_random(
    name: str, seed: int | None = None, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
):
    """(model of the real configuration ``name`` with random weights, tokenizer of its vocabulary size);
    ``seed`` None draws from torch's current RNG (the cell seeds it)."""
    from transformers import AutoModelForCausalLM

    config = real_config(name)
    tokenizer = build_char_tokenizer(config.vocab_size)
    config.pad_token_id, config.bos_token_id, config.eos_token_id = (
        tokenizer.pad_token_id,
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
    )
    if seed is not None:
        torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model, tokenizer


def parameter_count(name: str) -> int:
    """Parameters of the real configuration ``name`` (counted on the meta device: no memory, no weights)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(real_config(name))
    return sum(p.numel() for p in model.parameters())


WARM_START_META = "mxfp4_meta.json"  # written last by ``save``: a warm start without it is incomplete
WARM_START_FILES = ("config.json", "model.safetensors", "tokenizer.json", WARM_START_META)


def save(model, tokenizer, path: Path | str, meta: dict | None = None) -> None:
    """Save model, tokenizer and ``meta`` whole or not at all: written into a sibling folder, then
    renamed into place (a kill while saving leaves the old folder, or none, never a partial one)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.saving")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if meta is not None:  # with the digests of what it saved: a reader finds a changed or damaged file
        meta = {**meta, "digests": {f: file_sha256(tmp / f) for f in WARM_START_FILES if f != WARM_START_META}}
        (tmp / WARM_START_META).write_text(json.dumps(meta, indent=2))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


def missing_warm_start_files(folder: Path | str) -> list[str]:
    """The files of a complete warm start (``pretrain``) that ``folder`` lacks."""
    return [f for f in WARM_START_FILES if not (Path(folder) / f).is_file()]


def made_from(folder: Path | str, setting: dict) -> bool:
    """Whether ``folder`` is a whole warm start that records it was made from ``setting``."""
    return provenance_refusal(folder, setting) is None


def edited_since(folder: Path | str, want: dict) -> list[str]:
    """The files of a whole warm start recorded as made from ``want`` that differ from its recorded digests (edited
    or damaged since): a stored one that must be refused, not silently trained again."""
    if missing_warm_start_files(folder) or recorded_setting(folder, "rerun mxfp4 pretrain") != want:
        return []
    digests = json.loads((Path(folder) / WARM_START_META).read_text()).get("digests")
    return changed_files(folder, digests) if isinstance(digests, dict) else []


def provenance_refusal(folder: Path | str, want: dict, remake: str = "rerun mxfp4 pretrain") -> str | None:
    """Why ``folder`` is not a whole warm start made from ``want`` (the files it lacks, no recorded settings,
    or the settings that differ, recorded -> wanted), or None when it is; ``remake`` ends the error of a
    meta file that cannot be read."""
    missing = missing_warm_start_files(folder)
    if missing:
        return f"lacks {', '.join(missing)}"
    made = recorded_setting(folder, remake)
    if made != want:
        if not isinstance(made, dict):
            return "records no settings"
        return "was made from other settings (recorded -> wanted: " + "; ".join(differences(made, want)) + ")"
    digests = json.loads((Path(folder) / WARM_START_META).read_text()).get("digests")
    if not isinstance(digests, dict):
        return "records no digests of its files"
    changed = changed_files(folder, digests)
    if changed:
        return f"has files that differ from the digests recorded when it was made ({', '.join(changed)}): changed " \
               "or damaged since"
    return None


def recorded_setting(folder: Path | str, remake: str = "rerun mxfp4 pretrain") -> dict | None:
    """The settings a complete warm start records it was made from (``Profile.warm_start_setting``, saved
    by ``pretrain``), or None when it records none; a ValueError (ending in ``remake``) when its meta file
    is not the JSON object pretrain writes."""
    meta = Path(folder) / WARM_START_META
    try:
        return json.loads(meta.read_text()).get("provenance")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        raise ValueError(f"{meta} is not the JSON object pretrain writes; {remake}") from None


def warm_start_folder(start: Start) -> Path:
    """The folder of a tiny model's warm start (the one ``start``'s seed starts from; the first without a seed),
    checked whole and made from the profile's current ``warm_start_setting``; a ValueError saying what differs and
    how to make it again otherwise.

    Args:
        start: the model and seed of a run (``Run.start``).
    """
    profile, model_name, index = start.profile, start.model, start.warm_start
    folder = start.layout.model(model_name, index)
    flag = f" --warm-start {index}" if index else ""
    remake = (f"make it with: mxfp4 pretrain --profile {profile.name} --model {model_name}{flag} (or snakemake "
              f"--cores all pretrain --config profile={profile.name}, which rebuilds a warm start whose settings "
              "changed)")
    why = provenance_refusal(folder, profile.warm_start_setting(model_name, index), remake)
    if why:
        raise ValueError(f"the warm start {folder} of the tiny model {model_name!r} of profile {profile.name!r} "
                         f"{why}; {remake}")
    return folder


def initial_device(name_or_path: str) -> str:
    """Where a cell first materialises its model: random weights of a real configuration directly on this
    process's GPU where there is one (drawing Qwen2.5-3B's 3.1e9 normals on the CPU takes about 15 s, and
    then a 12 GB host-to-device copy), so their draw is the device's generator's under the same seed;
    anything loaded from disk on the CPU (the trainer moves it)."""
    if name_or_path.startswith(RANDOM_PREFIX) and torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return "cpu"


def packaged_gguf(name: str) -> dict | None:
    """The ``_gguf`` entry of ``experiments/models/<name>.json`` (``package``, ``file`` inside it, ``install``):
    a pretrained checkpoint that a pip package ships as one GGUF file, loaded by name like a hub id."""
    return (model_line(name) or {}).get("_gguf")


def gguf_path(name: str, entry: dict) -> Path:
    """Where the installed package keeps the GGUF file of the model line ``name``; a ValueError naming the
    install command when the package (or the ``gguf`` reader transformers needs) is missing."""
    from importlib import metadata
    from importlib.util import find_spec

    missing = f"the model {name!r} is the GGUF file {entry['file']} of the package {entry['package']}"
    try:
        path = Path(metadata.distribution(entry["package"]).locate_file(entry["file"]))
    except metadata.PackageNotFoundError:
        raise ValueError(f"{missing}, which is not installed; install it with: {entry['install']}") from None
    if not path.is_file():
        raise ValueError(f"{missing}, whose installed copy lacks {path}; reinstall it with: {entry['install']}")
    if find_spec("gguf") is None:
        raise ValueError(f"{missing}; transformers reads it with the gguf package, which is not installed; "
                         f"install it with: {entry['install']}")
    return path


def load_gguf(name: str, entry: dict, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """(model, tokenizer) of a packaged GGUF checkpoint through ``from_pretrained(folder, gguf_file=...)``,
    dequantized into plain float ``nn.Linear`` weights (``GgufConfig(dequantize=True)``: trainable, saved like
    any checkpoint; without it transformers keeps packed GGUF blocks where a kernel exists), with the file's
    tokenizer and chat template (``entry``: ``packaged_gguf(name)``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    path = gguf_path(name, entry)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype,
                                                 quantization_config=GgufConfig(dequantize=True)).to(device)
    return model, tokenizer


def load(name_or_path: str, dtype: torch.dtype = torch.float32, device: str | None = None):
    """(model, tokenizer) from a hub id, a short name of PAPER_MODELS, a packaged GGUF checkpoint's model
    line (``packaged_gguf``), a local folder, or
    ``random:<config>`` (random weights of a real configuration, seeded by the caller's RNG), on
    ``device`` (default ``initial_device``: the same for a cell and for its probe batch, which must draw
    the same random weights).

    A local folder whose tokenizer we built is loaded as ``PreTrainedTokenizerFast``: ``AutoTokenizer``
    on a folder whose model type is qwen2 silently substitutes a byte-level BPE tokenizer.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    device = initial_device(name_or_path) if device is None else device
    if name_or_path.startswith(RANDOM_PREFIX):
        return build_random(name_or_path[len(RANDOM_PREFIX) :], dtype=dtype, device=device)
    ref = PAPER_MODELS.get(name_or_path, name_or_path)
    local = Path(ref)
    gguf = packaged_gguf(ref)
    if gguf is not None:
        model, tokenizer = load_gguf(ref, gguf, dtype, device)
    else:
        if local.exists():
            if not (local / "config.json").exists():
                raise ValueError(f"{local} is not a model folder (no config.json)")
            tokenizer_class = PreTrainedTokenizerFast if (local / "tokenizer.json").exists() else AutoTokenizer
            tokenizer = tokenizer_class.from_pretrained(local)
        else:
            tokenizer = AutoTokenizer.from_pretrained(ref)
        model = AutoModelForCausalLM.from_pretrained(ref, dtype=dtype).to(device)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer


def model_reference(start: Start) -> str:
    """What ``models.load`` loads as a model's starting policy: the warm-started tiny model's folder
    (the one ``start``'s seed starts from, checked whole), a random initialisation of a real configuration, or the
    hub id.

    Args:
        start: the model and seed of a run (``Run.start``).
    """
    spec = start.spec
    if spec.arch:
        return str(warm_start_folder(start))
    return f"{RANDOM_PREFIX}{spec.config}" if spec.config else spec.hub

"""The batch every recipe's gradient probes are taken on, per model and seed.

A probe compares the recipe's quantized gradient with its full-precision shadow gradient. Taken on
the batch the recipe's own policy just sampled, two recipes' probes would compare different prompts
and completions, so "paired by seed" would pair different batches. Instead one GRPO batch per model
and seed is sampled once, by the warm-started policy unquantized (TRL's own generation, reward and
advantages, through ``MXGRPOTrainer.scored_batch``), stored, and every cell of that model and seed
scores those same prompts and completions under its own policy and quantization at every probe.
Each cell records the digests (prompt and completion token ids) of the batches it probed in its
metrics.json (``probe_batches``), so a reader sees that two recipes of a seed probed the same batch.
"""

from __future__ import annotations

import gc
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import set_seed

from ..config.run import Start
from ..io import file_sha256, write_json_atomic
from .batches import gradient_batches, probe_trainer
from .data import cell_data
from .models import load, model_reference
from .training import preserved_rng


def make_probe_batch(start: Start, train: Sequence[dict] | None = None) -> dict:
    """One GRPO batch (``grpo.prompts_per_step`` prompts x ``num_generations``, non-zero advantages)
    sampled by the starting policy (the warm start; a random initialisation from the seed), unquantized,
    from a seed's own order of the training problems. The caller's random streams are left as they were.

    Args:
        start: the model and seed of a run (``Run.start``, a seed given).
        train: the run's training problems (``data.cell_data``; read from the run where not given).
    """
    _seeded(start)
    with preserved_rng():
        set_seed(start.seed)  # as the cell does before loading its starting policy
        model, tokenizer = load(model_reference(start), dtype=torch.float32)
        return _sample(start, model, tokenizer, cell_data(start.run)[0] if train is None else train)


def _seeded(start: Start) -> int:
    if start.seed is None:
        raise ValueError(f"a probe batch is one seed's, and the start of {start.model!r} names none; accepted: "
                         "Run.start(model, seed)")
    return start.seed


def _sample(start: Start, model, tokenizer, train: Sequence[dict]) -> dict:
    profile, seed, model_name = start.profile, start.seed, start.model
    size = profile.grpo.prompts_per_step
    trainer = probe_trainer(model, tokenizer, profile, seed, prompts=size)
    problems = random.Random(seed).sample(train, len(train))
    batches, _ = gradient_batches(trainer, problems, profile, 1, seed, size=size, keep_first=True,
                                  chat=profile.model(model_name).chat)
    if not batches:
        raise ValueError(f"the probe batch needs grpo.prompts_per_step = {size} training problems; the profile's data "
                         f"has {len(problems)}")
    batch = batches[0]
    if batch["advantages"].abs().max() == 0:  # a policy that never (or always) solves: random weights on a GPU
        print(f"probe batch of {model_name} seed {seed}: no group of the {len(problems)} training problems has "
              "non-zero advantages; the first batch is kept (its policy-gradient term is zero: the probes' "
              "gradient cosines are undefined)", file=sys.stderr, flush=True)
    if profile.grpo.beta:  # the KL term's reference is the starting policy: the one that sampled
        batch["ref_per_token_logps"] = trainer._completion_logps(batch)
    return {k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in batch.items()}


def ensure_probe_batch(start: Start, train: Sequence[dict] | None = None) -> Path:
    """The stored probe batch of a model and seed, made (and saved atomically) if missing.

    Args:
        start: the model and seed of a run (``Run.start``, a seed given).
        train: the run's training problems, where the caller has them (``make_probe_batch``).
    """
    model_name, seed = start.model, _seeded(start)
    path = start.layout.probe_batch(model_name, seed)
    if not path.exists() or not stamp_of(path).exists():
        batch = make_probe_batch(start, train)
        gc.collect()  # its policy and trainer hold each other (callbacks): free them before the cell's own load
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(batch, tmp)
        tmp.replace(path)
        write_json_atomic(stamp_of(path), {"model": model_name, "seed": seed, "sha256": file_sha256(path)})
    return path


def stamp_of(path: Path) -> Path:
    """The file beside a probe batch that records whose it is (model, seed) and its SHA-256 when made."""
    return Path(path).with_suffix(".json")


def load_probe_batch(path, model_name: str | None = None, seed: int | None = None) -> dict:
    """The probe batch at ``path``, checked against what was recorded when it was made: its bytes (SHA-256) and,
    given them, that it is ``model_name``'s batch of ``seed`` (a batch copied over another is refused)."""
    path = Path(path)
    stamp = stamp_of(path)
    remake = f"delete {path} and {stamp.name} to sample it again"
    try:
        made = json.loads(stamp.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no {stamp.name} records what it is; {remake}") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"{stamp}: not the JSON object the probe batch's maker writes; {remake}") from None
    if not isinstance(made, dict) or made.get("sha256") != file_sha256(path):
        raise ValueError(f"{path}: its bytes differ from the SHA-256 recorded when it was made (changed, damaged or "
                         f"swapped); {remake}")
    want = {"model": model_name, "seed": seed}
    for key, value in want.items():
        if value is not None and made.get(key) != value:
            raise ValueError(f"{path}: recorded as the probe batch of {key} {made.get(key)!r}, read as that of "
                             f"{value!r}; {remake}")
    return torch.load(path, map_location="cpu", weights_only=True)

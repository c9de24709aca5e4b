"""The edges where outside input enters, none silent: each case builds its input twice, untouched and broken.
The untouched one passes (so the refusal is the case's, not the fixture's); the broken one is one clear line
naming what was wrong and what is accepted.

Classes: a correction's hook outputs and lifecycle hooks, plugin parameters, the digests of what a cell reads,
the stored tables a verdict is drawn from, and the bounds and early checks of the command line."""

import contextlib
import csv
import io
import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from mxfp4 import corrections as corr
from mxfp4.cli import main
from mxfp4.config.run import Run
from mxfp4.corrections import Correction
from mxfp4.corrections.hadamard import hadamard_matrix
from mxfp4.io import file_sha256, write_json_atomic
from mxfp4.numerics.hooks import HookError, lifecycle
from mxfp4.numerics.quantizer import Quantizer

BASELINE = Path(__file__).resolve().parents[1] / "results" / "baselines" / "embedded"
NAN, INF = float("nan"), float("inf")


def cli(*argv) -> tuple[int, str]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(list(argv))
        except SystemExit as exit_:
            code = exit_.code
    return code, err.getvalue() + out.getvalue()


def cli_call(*argv):
    """A call that runs the command and raises its one-line error as a ValueError."""
    def run():
        code, said = cli(*argv)
        if code != 0:
            raise ValueError(said.strip().splitlines()[-1])
    return run


# a correction's hooks ------------------------------------------------------------------------------------------


class Blocks(Correction):
    """A block quantizer that keeps each block as is (scale 1), or breaks it with ``grid`` / ``scale`` factors."""

    name = "blocks"

    def __init__(self, grid=1.0, scale=1.0):
        self.grid, self.scale = grid, scale

    def block_quantizer(self, fmt, rule):
        return lambda b: (b * self.grid, torch.full(b.shape[:-1], self.scale))


class WrongShape(Correction):
    name = "wrong"

    def __init__(self, broken):
        self.broken = broken

    def block_quantizer(self, fmt, rule):
        return lambda b: (b[..., :16] if self.broken else b, torch.ones(b.shape[:-1]))


class Rotating(Correction):
    name = "rotating"
    rotates = True

    def __init__(self, matrix):
        self.matrix = matrix

    def rotation(self, operand, block_size, device):
        return self.matrix(block_size)


class Splitting(Correction):
    name = "splitting"

    def __init__(self, result):
        self.result = result

    def split(self, x, axis, valid=None):
        return self.result(x)


class Rounding(Correction):
    name = "rounding"
    rounds_stochastically = True

    def __init__(self, generator):
        self.generator = generator

    def rounding_generator(self, operand, device):
        return self.generator()


class Plain(Correction):
    """A plugin in the README's plain-class style: no dataclass, a parameter of its own."""

    def __init__(self, strength: float = 0.5):
        self.strength = strength


def quantized(correction):
    return lambda: Quantizer("mxfp4", None, [correction])(torch.randn(4, 64), axis=-1)


def built_plain(monkeypatch, strength):
    monkeypatch.setattr(corr.registry, "REGISTRY", dict(corr.registry.REGISTRY))
    corr.register("plain")(Plain)
    return lambda: corr.build({"name": "plain", "strength": strength})


class Lifecycle(Correction):
    name = "lifecycle"

    def __init__(self, **returns):
        self.returns = returns

    def metrics(self):
        return self.returns.get("metrics", {"mine/sigma": 0.1})

    def state_dict(self):
        return self.returns.get("state_dict", {"calls": 1})

    def rollout_context(self, model, step):
        return self.returns.get("rollout_context", contextlib.nullcontext())

    def perturbs_rollout(self, step):
        return self.returns.get("perturbs_rollout", False)

    def cost(self):
        return self.returns.get("cost", {"extra_bits_per_element": 0.0, "bf16_fraction": 0.0})

    def bind(self, total_steps, seed):
        if self.returns.get("bind_raises"):
            raise RuntimeError("no schedule for 0 steps")


def hook(hook_name, *args, **returns):
    return lambda: lifecycle(getattr(Lifecycle(**returns), hook_name), *args)


# digests of what a cell reads ------------------------------------------------------------------------------------


def warm_start(tmp, smoke_results, broken):
    from mxfp4.config.profiles import load_profile
    from mxfp4.layout import Layout
    from mxfp4.rl.models import provenance_refusal

    folder = tmp / "tiny-dense"
    shutil.copytree(Layout(smoke_results, "smoke").model("tiny-dense"), folder)
    if broken:
        weights = folder / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-3] ^= 0x01  # one flipped bit in a weight
        weights.write_bytes(bytes(data))
    want = load_profile("smoke").warm_start_setting("tiny-dense", 0)

    def check():
        why = provenance_refusal(folder, want)
        if why:
            raise ValueError(f"{folder} {why}")
    return check


def probe_batch(tmp, swap=False, seed=0):
    from mxfp4.rl.probe_batch import load_probe_batch, stamp_of

    path = tmp / "probe_batches" / "m" / "seed0.pt"
    path.parent.mkdir(parents=True)
    torch.save({"prompt_ids": torch.arange(6).reshape(2, 3)}, path)
    write_json_atomic(stamp_of(path), {"model": "m", "seed": 0, "sha256": file_sha256(path)})
    if swap:  # another seed's batch copied over this one
        torch.save({"prompt_ids": torch.arange(6).reshape(3, 2)}, path)
    return lambda: load_probe_batch(path, "m", seed)


# stored tables ---------------------------------------------------------------------------------------------------


def edited_table(tmp, name, kind, edit=None):
    """A call reading stored table ``name`` of the embedded baselines through the validated reader, after
    ``edit`` (rows of text -> rows) where given."""
    from mxfp4.report.tables import read_table

    path = tmp / name
    with (BASELINE / name).open(newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = list(reader.fieldnames), list(reader)
    if edit is not None:
        fields, rows = edit(fields, rows)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(rows)
    return lambda: read_table(path, kind)


def set_value(column, value, row=0):
    def edit(fields, rows):
        rows[row] = {**rows[row], column: value}
        return fields, rows
    return edit


def duplicate_with(column, value):
    def edit(fields, rows):
        return fields, rows + [{**rows[0], column: value}]
    return edit


def drop_column(column):
    def edit(fields, rows):
        return [f for f in fields if f != column], [{k: v for k, v in r.items() if k != column} for r in rows]
    return edit


def report_json(tmp, kind, data):
    from mxfp4.report.tables import read_report

    path = tmp / f"{kind}.json"
    path.write_text(json.dumps(data))
    return lambda: read_report(path, kind)


GOOD_CORRECTION = {"source": "gaussian", "correction": "macro_block", **{
    f"{k}_{w}": 0.5 for k in ("energy_scale", "energy_dead", "energy_grid", "energy_total", "deadzone_fraction")
    for w in ("before", "after")}}
GOOD_REPRODUCTION = {"reproduces": True, "cells": [{"cell": {"model": "m", "recipe": "bf16", "seed": 0},
                                                     "compared": 12, "differing": {}, "reproduces": True}]}


# the command line and the configuration ------------------------------------------------------------------------


def recipes(tmp, monkeypatch, text):
    from mxfp4.config.recipes import Recipe

    path = tmp / "recipes.yaml"
    path.write_text(text)
    monkeypatch.setenv("MXFP4_RECIPES", str(path))
    return lambda: Recipe.named("mine")


def profile_with(**pretrain_or_grpo):
    import copy

    import yaml

    from mxfp4.config.profiles import PROFILES_DIR, Profile
    from mxfp4.config.validation import parse

    spec = copy.deepcopy(yaml.safe_load((PROFILES_DIR / "embedded.yaml").read_text()))
    for key, value in pretrain_or_grpo.items():
        section, field = key.split("__")
        spec.setdefault(section, {})[field] = value
    return lambda: parse(Profile, spec, "profile test.yaml")


CASES = [  # (case, make(tmp, monkeypatch, smoke_results, broken) -> call, the refusal of the broken input)
    # a correction's numerics hooks
    ("a block quantizer's NaN grid values", lambda t, m, s, b: quantized(Blocks(grid=NAN if b else 1.0)),
     r"correction 'blocks' \(.*Blocks\) broke the protocol of its block_quantizer hook: returned non-finite grid"),
    ("a block quantizer's infinite scales", lambda t, m, s, b: quantized(Blocks(scale=INF if b else 1.0)),
     r"block_quantizer hook: returned non-finite grid values or scales for finite blocks"),
    ("a rotation that is not orthogonal (2 I)",
     lambda t, m, s, b: quantized(Rotating(lambda n: 2 * torch.eye(n) if b else hadamard_matrix(n))),
     r"correction 'rotating' .* rotation hook: returned a matrix that is not orthogonal \(max \|R R\^T - I\| = 3"),
    ("a rotation full of NaN",
     lambda t, m, s, b: quantized(Rotating(lambda n: torch.full((n, n), NAN) if b else torch.eye(n))),
     r"rotation hook: returned a matrix that is not orthogonal \(max \|R R\^T - I\| = nan"),
    ("a rotation of the wrong shape",
     lambda t, m, s, b: quantized(Rotating(lambda n: torch.eye(n // 2 if b else n))),
     r"rotation hook: returned a torch.float32 matrix of shape \(16, 16\); expected None or an orthogonal"),
    ("a split that returns a bare tensor",
     lambda t, m, s, b: quantized(Splitting(lambda x: x if b else (torch.zeros_like(x, dtype=torch.bool), x))),
     r"correction 'splitting' .* split hook: returned Tensor; expected None or \(a bool mask of shape \(4, 64\)"),
    ("a split whose mask is float",
     lambda t, m, s, b: quantized(Splitting(lambda x: (torch.zeros_like(x, dtype=torch.float32 if b else torch.bool),
                                                       x))),
     r"split hook: returned a torch.float32 mask of shape \(4, 64\); expected"),
    ("a rounding generator that is no generator",
     lambda t, m, s, b: quantized(Rounding(lambda: 3 if b else torch.Generator().manual_seed(0))),
     r"correction 'rounding' .* rounding_generator hook: returned int; expected None or a torch.Generator"),
    ("a NaN parameter of a plain-class plugin", lambda t, m, s, b: built_plain(m, NAN if b else 0.5),
     r"correction 'plain': parameter strength is nan; accepted: finite numbers"),
    # a correction's lifecycle hooks
    ("bind raises", lambda t, m, s, b: hook("bind", 3, 0, bind_raises=b),
     r"correction 'lifecycle' \(.*Lifecycle\) failed in its bind hook: RuntimeError: no schedule for 0 steps"),
    ("a NaN metric", lambda t, m, s, b: hook("metrics", metrics={"mine/sigma": NAN if b else 0.1}),
     r"broke the protocol of its metrics hook: returned 'mine/sigma' = nan; expected finite numbers"),
    ("a state that is not JSON", lambda t, m, s, b: hook("state_dict", state_dict={"calls": {1, 2} if b else 1}),
     r"state_dict hook: returned a dict that is not JSON-serialisable"),
    ("a rollout context that is none", lambda t, m, s, b: hook("rollout_context", None, 0,
                                                              **({"rollout_context": 3} if b else {})),
     r"rollout_context hook: returned int; expected a context manager"),
    ("perturbs_rollout saying 'yes'", lambda t, m, s, b: hook("perturbs_rollout", 0,
                                                             perturbs_rollout="yes" if b else False),
     r"perturbs_rollout hook: returned str; expected a bool"),
    # digests of what a cell reads
    ("a warm start with a flipped bit", lambda t, m, s, b: warm_start(t, s, b),
     r"has files that differ from the digests recorded when it was made \(model.safetensors\)"),
    ("a probe batch swapped for another", lambda t, m, s, b: probe_batch(t, swap=b),
     r"seed0.pt: its bytes differ from the SHA-256 recorded when it was made"),
    ("a probe batch read as another seed's", lambda t, m, s, b: probe_batch(t, seed=1 if b else 0),
     r"seed0.pt: recorded as the probe batch of seed 0, read as that of 1"),
    # stored tables
    ("cells.csv with a NaN accuracy",
     lambda t, m, s, b: edited_table(t, "cells.csv", "cells", set_value("gsm8k_strict_accuracy", "nan") if b else None),
     r"cells.csv: row 2: gsm8k_strict_accuracy: Input should be a finite number"),
    ("cells.csv with an accuracy of 1.5",
     lambda t, m, s, b: edited_table(t, "cells.csv", "cells", set_value("gsm8k_strict_accuracy", "1.5", 3) if b
                                     else None),
     r"cells.csv: row 5: gsm8k_strict_accuracy: Input should be less than or equal to 1"),
    ("cells.csv without its seed column",
     lambda t, m, s, b: edited_table(t, "cells.csv", "cells", drop_column("seed") if b else None),
     r"cells.csv: no seed column\(s\); accepted: a cells table"),
    ("items.csv with a problem twice, conflicting",
     lambda t, m, s, b: edited_table(t, "items.csv", "items", duplicate_with("strict", "1.0") if b else None),
     r"items.csv: rows 2 and 4802 share the key \(model, recipe, seed, doc_hash\)"),
    ("items.csv with a correctness of 0.5",
     lambda t, m, s, b: edited_table(t, "items.csv", "items", set_value("strict", "0.5") if b else None),
     r"items.csv: row 2: strict: Input should be a multiple of 1"),
    ("pathways.csv with a NaN mean",
     lambda t, m, s, b: edited_table(t, "pathways.csv", "pathways", set_value("mean", "nan") if b else None),
     r"pathways.csv: row 2: mean: Input should be a finite number"),
    ("a corrections table without its energies",
     lambda t, m, s, b: report_json(t, "corrections", [{k: v for k, v in GOOD_CORRECTION.items()
                                                        if not (b and k == "energy_scale_before")}]),
     r"corrections.json: rows.0.energy_scale_before: missing"),
    ("a reproduction check with NaN",
     lambda t, m, s, b: report_json(t, "reproduction", {**GOOD_REPRODUCTION, "score": NAN if b else 1.0}),
     r"reproduction.json: score: not a finite number"),
    # bounds and early checks
    ("prove of 10^12 elements", lambda t, m, s, b: cli_call("prove", "--rows", "1000000" if b else "2", "--cols",
                                                           "1000000" if b else "32", "--out", str(t / "p.json")),
     r"--rows x --cols = 1,000,000,000,000 elements; accepted: at most 67,108,864"),
    ("an output path that is a folder", lambda t, m, s, b: cli_call("prove", "--rows", "2", "--cols", "32", "--out",
                                                                   str(t if b else t / "p.json")),
     r"argument --out: .* is a folder; accepted: the path of a file to write"),
    ("power-design --family 0", lambda t, m, s, b: cli_call("power-design", "--family", "0" if b else "1"),
     r"argument --family: 0; accepted: an integer >= 1"),
    ("a recipe whose base is a list",
     lambda t, m, s, b: recipes(t, m, "mine:\n  base: [mxfp4]\n" if b else "mine:\n  base: mxfp4\n"),
     r"recipes.yaml: recipe 'mine': base \['mxfp4'\] is a list; accepted: the name of one recipe"),
    ("a recipe named by an integer",
     lambda t, m, s, b: recipes(t, m, "mine:\n  base: mxfp4\n" + ("3:\n  base: mxfp4\n" if b else "")),
     r"recipes.yaml: recipe name 3 is not text"),
    ("an outlier scale of 3", lambda t, m, s, b: profile_with(pretrain__outlier_scale=3 if b else 32),
     r"pretrain.outlier_scale: 3.0 is not a power of two in 2..1024 \(the outlier-channel transform is exact only "),
    ("a learning rate YAML reads as text", lambda t, m, s, b: profile_with(grpo__learning_rate="1e-5" if b else 1e-5),
     r"grpo.learning_rate: .*\(got '1e-5'\); YAML reads 1e-5 as text, not a number: write 1.0e-5"),
]


@pytest.mark.parametrize("case,make,refusal", CASES, ids=[c[0] for c in CASES])
def test_each_edge_passes_untouched_and_refuses_broken(case, make, refusal, tmp_path, monkeypatch, smoke_results):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the stored baselines, as a user's checkout has them
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    make(tmp_path / "good", monkeypatch, smoke_results, False)()
    with pytest.raises(ValueError, match=refusal) as err:
        make(tmp_path / "bad", monkeypatch, smoke_results, True)()
    assert "\n" not in str(err.value), "one line"
    if isinstance(err.value, HookError):
        assert "correction '" in str(err.value)


def test_built_in_rotations_are_checked_once_per_matrix():
    """The orthogonality check reads the matrix once; a correction that caches its matrices pays it once."""
    from mxfp4.numerics.hooks import RotationCheck

    check, r = RotationCheck(), hadamard_matrix(32)
    calls = []
    real = torch.Tensor.__matmul__
    try:
        torch.Tensor.__matmul__ = lambda a, b: calls.append(1) or real(a, b)
        for _ in range(5):
            check(None, r, 32)
    finally:
        torch.Tensor.__matmul__ = real
    assert len(calls) == 1


def test_edited_embedded_data_is_made_again(tmp_path, capsys):
    """An embedded data file edited after it was made (every answer 999999) is found by its digest and made
    again from the profile's settings, byte for byte as first made."""
    from mxfp4.config.profiles import load_profile
    from mxfp4.rl.data import cell_data

    profile = load_profile("smoke")
    _, folder = cell_data(Run.of(profile, tmp_path))
    made = (folder / "test.jsonl").read_bytes()
    rows = [json.loads(line) for line in made.decode().splitlines()]
    (folder / "test.jsonl").write_text("".join(json.dumps({**r, "answer": "#### 999999"}) + "\n" for r in rows))
    cell_data(Run.of(profile, tmp_path))
    assert "test.jsonl changed since made (digests differ); remaking" in capsys.readouterr().err
    assert (folder / "test.jsonl").read_bytes() == made
    cell_data(Run.of(profile, tmp_path))  # whole now: nothing said, nothing made
    assert capsys.readouterr().err == ""


def test_a_diverged_run_is_one_line_at_the_command_line(monkeypatch):
    """The NaN-gradient stop (FloatingPointError) reaches the user as one line, not a traceback."""
    import mxfp4.cli as cli_module

    def diverged(args):
        raise FloatingPointError("step 1: the gradient norm is nan, so the optimizer step made the weights non-finite")

    monkeypatch.setattr(cli_module.numerics, "_cmd_formats", diverged)  # the parser takes it by name when built
    code, said = cli("formats")
    assert code == 2 and said.strip() == ("mxfp4 formats: error: step 1: the gradient norm is nan, so the optimizer "
                                          "step made the weights non-finite")


def test_compare_refuses_stored_cells_of_a_recipe_redefined_since(tmp_path, monkeypatch):
    """The stored cells' config hashes against the recipes in force: untouched they agree; with mxfp4 redefined
    (another scale rule) its stored cells are refused, both hashes named."""
    from mxfp4.report.compare import check_definitions
    from mxfp4.report.tables import read_table

    cells = read_table(BASELINE / "cells.csv", "cells")
    check_definitions(cells, "embedded", "stored")
    (tmp_path / "recipes.yaml").write_text("mxfp4:\n  quantize: true\n  scale_rule: ceil\n")
    monkeypatch.setenv("MXFP4_RECIPES", str(tmp_path / "recipes.yaml"))
    with pytest.raises(ValueError, match=r"stored: cell tiny-dense/mxfp4/seed0 was made under another definition of "
                                         r"recipe 'mxfp4' \(config hash recorded \w+ -> now \w+\)"):
        check_definitions(cells, "embedded", "stored")


# the per-unit files every claims command reads ------------------------------------------------------------------

UNITS = Path(__file__).resolve().parents[1] / "results" / "baselines" / "real-small" / "units" / \
    "smollm2-135m_warm_units.csv"


def units_file(tmp, broken, edit):
    """A copy of real-small's stored per-unit file, ``edit(rows)`` applied where ``broken``; the reader over it
    (and over any second file ``edit`` returns)."""
    from mxfp4.report.network_claims import read_units

    with UNITS.open(newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, list(reader)
    extra = edit(rows) if broken else None
    path = tmp / "units.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(rows)
    return lambda: read_units([path, *([extra] if extra else [])])


def _second_copy(rows):
    """The same units again in a second file (another run's, merged)."""
    return UNITS


def _set(i, **values):
    def edit(rows):
        rows[i].update(values)
    return edit


UNIT_CASES = [
    ("an empty harm", _set(0, harm=""), r"units.csv: row 2: gradient harm '' of arm 'none'; accepted: a finite"),
    ("a gradient harm of -5", _set(0, harm="-5"), r"row 2: gradient harm '-5' of arm 'none'; accepted: a finite "
                                                   r"number in \[0, 2\]"),
    ("a misspelt pathway", _set(0, pathway="gradiant"), r"row 2: pathway 'gradiant'; accepted: gradient, rollout"),
    ("an arm on fewer units", lambda rows: rows.pop(0) and None,
     r"smollm2-135m warm gain gradient: arm 'none' has 7 units where another has 8; accepted: every arm"),
    ("a second file of the same units", _second_copy,
     r"unit \('smollm2-135m', 'warm', 'gain', 'gradient', 'none', 0, '0'\) is also in .*units.csv row 2; accepted"),
    ("another model's rows in the file", _set(5, model="other"),
     r"units.csv: rows of 2 models \(other, smollm2-135m\)"),
]


@pytest.mark.parametrize("case,edit,refusal", UNIT_CASES, ids=[c[0] for c in UNIT_CASES])
def test_each_units_file_edge_passes_untouched_and_refuses_broken(case, edit, refusal, tmp_path):
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    assert units_file(tmp_path / "good", False, edit)()
    with pytest.raises(ValueError, match=refusal) as err:
        units_file(tmp_path / "bad", True, edit)()
    assert "\n" not in str(err.value), "one line"


def truncated_codes(broken):
    import dataclasses

    import mxfp4

    q = mxfp4.quantize(torch.randn(4, 64))
    return lambda: mxfp4.dequantize(dataclasses.replace(q, codes=q.codes[..., :-3]) if broken else q)


def pathways_without(column, broken):
    from mxfp4.report.claims import read_pathways

    tmp = Path(tempfile.mkdtemp())
    stored = Path(__file__).resolve().parents[1] / "results/baselines/embedded/pathways.csv"
    with stored.open(newline="") as f:
        rows = list(csv.DictReader(f))
    fields = [c for c in rows[0] if not (broken and c == column)]
    path = tmp / f"pathways_{broken}.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return lambda: read_pathways(path)


def recipe_file_named(name):
    from mxfp4.config.recipes import load_recipe_table

    path = Path(tempfile.mkdtemp()) / "mine.yaml"
    path.write_text(f"{name}: {{base: mxfp4}}\n")
    return lambda: load_recipe_table(path)


# edges that need no smoke run: each passes untouched and is one line broken
FAST_CASES = [
    ("claims' pathways.csv without its mean column", lambda b: pathways_without("mean", b),
     r"pathways_True.csv: no mean column\(s\); accepted: a pathways table"),
    ("a QuantizedTensor with truncated codes", truncated_codes,
     r"QuantizedTensor holds 116 code bytes for 8 blocks of 32 \(128 bytes expected\): its codes are truncated"),
    ("a cost() of None", lambda b: hook("cost", **({"cost": None} if b else {})),
     r"correction 'lifecycle' .* cost hook: returned NoneType; expected a dict with extra_bits_per_element and "
     r"bf16_fraction"),
    ("a cost() with a NaN, through a recipe's quantizer",
     lambda b: Quantizer("mxfp4", None, [Lifecycle(cost={"extra_bits_per_element": NAN if b else 0.5,
                                                         "bf16_fraction": 0.0})]).cost,
     r"cost hook: returned 'extra_bits_per_element' = nan; expected finite numbers"),
    ("decompose under a block quantizer of NaN grid values",
     lambda b: lambda: Quantizer("mxfp4", None, [Blocks(grid=NAN if b else 1.0)]).decompose(torch.randn(4, 64), -1),
     r"correction 'blocks' .* block_quantizer hook: returned non-finite grid values or scales for finite blocks"),
    ("decompose under a block quantizer of the wrong shape",
     lambda b: lambda: Quantizer("mxfp4", None, [WrongShape(b)]).decompose(torch.randn(4, 64), -1),
     r"correction 'wrong' .* block_quantizer hook: returned torch.float32 grid values of shape \(4, 2, 16\); "
     r"expected"),
    ("a registered class that is no Correction",
     lambda b: lambda: (corr.register("not_one")(type("Mine", (object,), {})) if b  # nothing registered either way
                        else corr.register("macro_block")(corr.MacroBlockScaling)),
     r"correction 'not_one': 'Mine' is not a subclass of mxfp4.corrections.Correction"),
    ("a recipe name with a slash", lambda b: recipe_file_named("my/recipe" if b else "my-recipe"),
     r"recipe name 'my/recipe' is not one folder name; accepted: letters, digits"),
    ("1.0e9 in a profile reads as text", lambda b: profile_with(grpo__learning_rate="1.0e9" if b else 1e-5),
     r"grpo.learning_rate: .*\(got '1.0e9'\); YAML reads 1.0e9 as text, not a number: write 1.0e\+9"),
]


@pytest.mark.parametrize("case,make,refusal", FAST_CASES, ids=[c[0] for c in FAST_CASES])
def test_each_fast_edge_passes_untouched_and_refuses_broken(case, make, refusal):
    make(False)()
    with pytest.raises(ValueError, match=refusal) as err:
        make(True)()
    assert "\n" not in str(err.value), "one line"


def test_a_users_recipe_never_shadows_a_built_in_on_the_boards_or_in_mechanism(tmp_path, monkeypatch, capsys):
    """A placed recipe named like a stored one, or a user's file redefining a built-in, is one line at the
    leaderboard and in mechanism; the definition digest a study's outputs record changes with the redefinition."""
    from mxfp4.cli import main
    from mxfp4.config.recipes import definition_digest

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    units = "results/baselines/networks/leaderboard/tiny-dense_units.csv"
    assert main(["leaderboard-place", "--profile", "networks", units, "--recipe", "mxfp4+4over6", "--board", units,
                 "--out", str(tmp_path / "b.md")]) == 2
    assert "--recipe mxfp4+4over6 is on the stored board; a recipe placed with its own units needs a name of its " \
           "own" in capsys.readouterr().err
    before = definition_digest("mxfp4+4over6")
    (tmp_path / "mine.yaml").write_text("mxfp4+4over6: {base: mxfp4, scale_rule: ceil}\n")
    monkeypatch.setenv("MXFP4_RECIPES", str(tmp_path / "mine.yaml"))
    assert definition_digest("mxfp4+4over6") != before
    for argv in (["leaderboard", "--profile", "networks", units, "--out", str(tmp_path / "b.md")],
                 ["mechanism", "--profile", "networks", "--model", "tiny-dense", "--recipe", "mxfp4+4over6",
                  "--out", str(tmp_path / "u.csv")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "mxfp4+4over6 redefined by a user's recipe file ($MXFP4_RECIPES)" in err and err.count("\n") == 1


def test_units_of_another_profile_are_refused_not_read_as_its_networks(tmp_path):
    """networks' per-unit files (8 networks' seeds) handed to embedded's mechanism report: one line naming the seeds
    the profile does not measure, where they were read as embedded's one network."""
    from mxfp4.config.profiles import load_profile
    from mxfp4.report.mechanism import mechanism_rows
    from mxfp4.report.network_claims import read_units

    units = read_units([Path(__file__).resolve().parents[1] / "results/baselines/networks/leaderboard/"
                        "tiny-dense_units.csv"])
    assert mechanism_rows(units, "mxfp4+macro", load_profile("networks"))
    with pytest.raises(ValueError, match=r"units measured at seed\(s\) \[.*\], which profile 'embedded' does not "
                                         r"measure \(its pathway seeds: \[0, 1, 2\]\)") as err:
        mechanism_rows(units, "mxfp4+macro", load_profile("embedded"))
    assert "\n" not in str(err.value)


def test_mechanism_report_refuses_a_missing_or_nan_energy_file(tmp_path, monkeypatch, capsys):
    from mxfp4.cli import main

    stored = Path(__file__).resolve().parents[1] / "results/baselines/networks/leaderboard"
    units = tmp_path / "tiny-dense_units.csv"
    shutil.copy(stored / "tiny-dense_units.csv", units)
    argv = ["mechanism-report", "--profile", "networks", "--recipe", "mxfp4+macro", str(units), "--out",
            str(tmp_path / "m.md")]
    assert main(argv) == 2
    assert "tiny-dense_units.energy.json: missing; accepted: the .energy.json mxfp4 mechanism writes" in \
        capsys.readouterr().err
    energy = json.loads((stored / "tiny-dense_units.energy.json").read_text())
    units.with_suffix(".energy.json").write_text(json.dumps(energy))
    assert main(argv) == 0
    capsys.readouterr()
    energy[1]["energy_scale_after"] = float("nan")
    units.with_suffix(".energy.json").write_text(json.dumps(energy))
    assert main(argv) == 2
    assert "1.energy_scale_after is nan, not a finite number" in capsys.readouterr().err


def test_an_edited_stored_warm_start_is_named_not_trained_again(tmp_path):
    """The stored warm start a warm_starts=stored run asks for, with a byte changed: edited_since names the file
    (the rule refuses on it), where made_from alone only said no and the run trained a new one in silence."""
    from mxfp4.config.profiles import load_profile
    from mxfp4.rl.models import edited_since, made_from

    stored = Path(__file__).resolve().parents[1] / "results/baselines/embedded/models/tiny-dense"
    copy = tmp_path / "tiny-dense"
    shutil.copytree(stored, copy)
    want = load_profile("embedded").warm_start_setting("tiny-dense", 0)
    assert made_from(copy, want) and edited_since(copy, want) == []
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(data))
    assert not made_from(copy, want) and edited_since(copy, want) == ["model.safetensors"]
    other = load_profile("embedded-large").warm_start_setting("tiny-dense", 0)
    assert edited_since(copy, other) == []  # another setting's warm start is not this run's: no refusal
    rules = (Path(__file__).resolve().parents[1] / "workflow/rules/cells.smk").read_text()
    assert "edited = edited_since(candidate, want)" in rules and "raise ValueError(f\"warm_starts=stored:" in rules


def test_claims_with_no_primary_test_measured_is_refused_where_the_profile_fixes_one(tmp_path):
    """embedded fixes its primary family (pathways.claims): its stored pathway table and units give the family;
    an empty pathway table and no units give none of it, which is one line, not a table saying nothing and exit 0."""
    import csv as csv_module

    from mxfp4.report.claims import run_claims

    base = Path(__file__).resolve().parents[1] / "results/baselines/embedded"
    proofs = tmp_path / "proofs.json"
    proofs.write_text(json.dumps({"max_identity_residual": 0.0, "max_identity_residual_rel": 0.0, "passed": True,
                                  "cases": [{"format": "mxfp4", "distribution": "gaussian", "scale_rule": "floor",
                                             "dtype": "float32", "identity_residual": 0.0,
                                             "identity_residual_rel": 0.0, "passed": True}]}))
    corrections = tmp_path / "corrections.json"
    corrections.write_text(json.dumps([GOOD_CORRECTION]))
    rows = run_claims(base / "cells.csv", proofs, corrections, tmp_path / "claims.md", "embedded",
                      pathways_csv=base / "pathways.csv", unit_files=sorted((base / "units").glob("*.csv")))
    assert any(r.get("family") == "primary" for r in rows)
    empty = tmp_path / "pathways.csv"
    with (base / "pathways.csv").open(newline="") as f:
        header = next(csv_module.reader(f))
    empty.write_text(",".join(header) + "\n")
    with pytest.raises(ValueError, match="claims: profile 'embedded' fixes a primary family .*, and none of its tests "
                                         "could be measured") as err:
        run_claims(base / "cells.csv", proofs, corrections, tmp_path / "claims.md", "embedded", pathways_csv=empty)
    assert "\n" not in str(err.value)


def test_compare_of_the_reference_recipe_points_to_the_reproduction_check(tmp_path, monkeypatch, capsys):
    """compare --recipe bf16 (an A/A check) has no reference to set bf16 against: one line naming the command that
    checks bf16's cells against the stored ones, not a setting check over an empty set of baselines."""
    from mxfp4.report.compare import primary_references

    assert primary_references("mxfp4") == ["bf16"] and primary_references("bf16") == []
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "--profile", "embedded", "--recipe", "bf16", "--out", str(tmp_path / "c.md")]) == 2
    err = capsys.readouterr().err
    assert "recipe 'bf16' is the reference every contrast is against" in err
    assert "mxfp4 reproduction --profile embedded --cell MODEL/bf16/seedN" in err and err.count("\n") == 1


def test_units_missing_one_of_the_profiles_networks_are_refused_not_tested_on_fewer():
    """networks' stored per-unit file without one network's seed: one line naming the missing seed, where its claims
    and its leaderboard place were decided on the networks left."""
    from mxfp4.config.profiles import load_profile
    from mxfp4.report.network_claims import profile_networks, read_units

    profile = load_profile("networks")
    units = read_units([Path(__file__).resolve().parents[1] / "results/baselines/networks/leaderboard/"
                        "tiny-dense_units.csv"])
    assert profile_networks(profile, units)
    dropped = profile.pathway_seeds[-1]
    with pytest.raises(ValueError, match=rf"the units of tiny-dense lack seed\(s\) \[{dropped}\] of profile "
                                         r"'networks'.s pathway seeds") as err:
        profile_networks(profile, [r for r in units if int(r["seed"]) != dropped])
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("arm,label", [("none", "bf16"), ("all", "mxfp4"), ("mxfp4+macro", "mxfp4+macro")])
def test_a_mechanism_file_without_an_arm_is_refused_not_read_without_its_rows(arm, label):
    """The stored smoothing mechanism on networks: whole, every row; without one arm (bf16, mxfp4 or a correction of
    the profile), one line naming it, where its rows (and with bf16 the entropy pathway) vanished."""
    from mxfp4.config.profiles import load_profile
    from mxfp4.report.mechanism import mechanism_rows
    from mxfp4.report.network_claims import read_units

    units = read_units([Path(__file__).resolve().parents[1] / "results/baselines/networks/mechanism/mxfp4+smooth/"
                        "tiny-dense_units.csv"])
    profile = load_profile("networks")
    assert len(mechanism_rows(units, "mxfp4+smooth", profile)) == 15
    with pytest.raises(ValueError, match=rf"tiny-dense: the gradient units hold no arm {re.escape(label)}; accepted") \
            as err:
        mechanism_rows([r for r in units if r["arm"] != arm], "mxfp4+smooth", profile)
    assert "\n" not in str(err.value)

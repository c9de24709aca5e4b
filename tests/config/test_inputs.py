"""Every bad input of this table is one clear
error line naming what was wrong and what is accepted, raised before any model loads."""

import contextlib
import io

import pytest
import torch

import mxfp4
from mxfp4.cli import main
from mxfp4.config.recipes import Recipe
from mxfp4.numerics.formats import BlockFormat, get_format


def cli(*argv) -> tuple[int, str]:
    """(exit code, stderr + stdout) of the mxfp4 command run in this process."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(list(argv))
        except SystemExit as exit_:  # argparse's own exits (--version, bad choices)
            code = exit_.code
    return code, err.getvalue() + out.getvalue()


def recipe_with(correction: dict):
    return lambda: Recipe.from_dict("r", {"quantize": True, "corrections": [correction]})


def recipes_file(tmp_path, monkeypatch, text: str):
    path = tmp_path / "my_recipes.yaml"
    path.write_text(text)
    monkeypatch.setenv("MXFP4_RECIPES", str(path))
    return lambda: Recipe.named("mine")


def gsm8k_dir_set_to(folder, monkeypatch):
    from mxfp4.config.data_files import default_gsm8k_dir

    monkeypatch.setenv("MXFP4_GSM8K_DIR", str(folder))
    return default_gsm8k_dir


def profile_with(mutate):
    """A call that validates the embedded profile changed by ``mutate`` (its parsed YAML)."""
    import copy

    import yaml

    from mxfp4.config.profiles import PROFILES_DIR, Profile
    from mxfp4.config.validation import parse

    spec = copy.deepcopy(yaml.safe_load((PROFILES_DIR / "embedded.yaml").read_text()))
    mutate(spec)
    return lambda: parse(Profile, spec, "profile test.yaml")


def yaml_file(tmp_path, content: bytes):
    from mxfp4.config import load_yaml

    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    return lambda: load_yaml(path)


def gsm8k_test_line(tmp_path, line: str):
    from mxfp4.rl.data import validate_jsonl

    path = tmp_path / "test.jsonl"
    path.write_text(line + "\n")
    return lambda: validate_jsonl(path)


def plugin_named(tmp_path, monkeypatch, body: str):
    """A call that builds correction 'x' with a plugin module of ``body`` on MXFP4_PLUGINS."""
    from mxfp4 import corrections as corr

    module = f"plugin_{abs(hash(body))}"
    (tmp_path / f"{module}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MXFP4_PLUGINS", module)
    monkeypatch.setattr(corr.registry, "REGISTRY", dict(corr.registry.REGISTRY))
    return lambda: corr.build({"name": "x"})


def quantize_with_plugin(tmp_path, monkeypatch, body: str):
    """A call that quantizes a tensor through a recipe whose correction 'x' is a plugin of ``body``."""
    build = plugin_named(tmp_path, monkeypatch, body)
    return lambda: Recipe.from_dict("r", {"corrections": [{"name": "x"}]}).quantizer([build()])(
        torch.randn(4, 64), axis=-1)


FAILING_SPLIT = ("from mxfp4.corrections import Correction, register\n@register('x')\nclass Split(Correction):\n"
                 "    def split(self, x, axis, valid=None):\n        return 1 / 0\n")
FAILING_BLOCKS = ("from mxfp4.corrections import Correction, register\n@register('x')\nclass Blocks(Correction):\n"
                  "    def block_quantizer(self, fmt, rule):\n        return lambda blocks: blocks.nonexistent\n")
SHADOW_AQN = "from mxfp4.corrections import Correction, register\n@register('aqn')\nclass Mine(Correction):\n    pass\n"
RAISING_PLUGIN = "raise RuntimeError('no GPU here')\n"

ALIAS_BOMB = b"a: &a [x, x, x, x, x, x, x, x, x, x]\n" + b"".join(  # each level ten times the last
    b"%c: &%c [*%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c]\n" % ((c, c) + (c - 1,) * 10) for c in range(98, 108))

RAISES = [  # (case, function of (tmp_path, monkeypatch) giving the call, the error it must raise)
    ("an infinite learning rate", lambda t, m: profile_with(lambda s: s["grpo"].update(learning_rate=float("inf"))),
     r"grpo.learning_rate: Input should be a finite number"),
    ("an infinite temperature", lambda t, m: profile_with(lambda s: s["grpo"].update(temperature=float("inf"))),
     r"grpo.temperature: Input should be a finite number"),
    ("a NaN beta", lambda t, m: profile_with(lambda s: s["grpo"].update(beta=float("nan"))),
     r"grpo.beta: Input should be a finite number"),
    ("max_steps of 1e20", lambda t, m: profile_with(lambda s: s["grpo"].update(max_steps=10**20)),
     r"grpo.max_steps: Input should be less than or equal to 100000"),
    ("a seed twice", lambda t, m: profile_with(lambda s: s.update(seeds=[1, 1])),
     r"seeds \[1, 1\] name a seed twice; accepted: distinct seeds"),
    ("a model name with a slash",
     lambda t, m: profile_with(lambda s: s["models"].update({"a/b": {"arch": "tiny-dense"}})),
     r"model name\(s\) \['a/b'\] are not safe folder names; accepted: letters, digits"),
    ("a recipe named my/rec", lambda t, m: lambda: Recipe.from_dict("my/rec", {}),
     r"name: String should match pattern"),
    ("AQN sigma infinite", lambda t, m: recipe_with({"name": "aqn", "sigma_start": float("inf")}),
     r"correction 'aqn': sigma_start: Input should be a finite number"),
    ("AQN target entropy NaN",
     lambda t, m: recipe_with({"name": "aqn", "adaptive": True, "target_entropy": float("nan")}),
     r"correction 'aqn': target_entropy"),
    ("AQN gain NaN", lambda t, m: recipe_with({"name": "aqn", "gain": float("nan")}),
     r"correction 'aqn': gain: Input should be a finite number"),
    ("AQN sigma_min above sigma_max", lambda t, m: recipe_with({"name": "aqn", "sigma_min": 0.1, "sigma_max": 0.01}),
     r"correction 'aqn': aqn needs 0 < sigma_min <= sigma_max, got sigma_min 0.1, sigma_max 0.01"),
    ("corrections on a recipe that does not quantize",
     lambda t, m: lambda: Recipe.from_dict("r", {"quantize": False, "corrections": ["aqn"]}),
     r"quantize: false with corrections \(aqn\); a correction acts on quantized operands"),
    ("a plugin that registers a built-in's name", lambda t, m: plugin_named(t, m, SHADOW_AQN),
     r"plugin 'plugin_\d+' \(MXFP4_PLUGINS\) failed while importing: ValueError: correction name 'aqn' is taken"),
    ("a plugin that raises at import", lambda t, m: plugin_named(t, m, RAISING_PLUGIN),
     r"plugin 'plugin_\d+' \(MXFP4_PLUGINS\) failed while importing: RuntimeError: no GPU here"),
    ("a plugin whose split hook raises", lambda t, m: quantize_with_plugin(t, m, FAILING_SPLIT),
     r"correction 'x' \(plugin_\d+.Split\) failed in its split hook: ZeroDivisionError: division by zero"),
    ("a plugin whose block quantizer raises", lambda t, m: quantize_with_plugin(t, m, FAILING_BLOCKS),
     r"correction 'x' \(plugin_\d+.Blocks\) failed in its block_quantizer hook: AttributeError"),
    ("a YAML key that is a list", lambda t, m: yaml_file(t, b"name: x\n[a, b]: 1\n"),
     r"bad.yaml:2:1: a key must be a plain name, got a list"),
    ("a YAML file that is not UTF-8", lambda t, m: yaml_file(t, b"name: \xff\xfe\n"),
     r"bad.yaml: not UTF-8 text"),
    ("a YAML alias bomb (10^11 values)", lambda t, m: yaml_file(t, ALIAS_BOMB),
     r"bad.yaml: its aliases expand to more than 100,000 values"),
    ("a YAML file of 2 MB", lambda t, m: yaml_file(t, b"a: " + b"x" * (2 << 20) + b"\n"),
     r"bad.yaml: 2,097,156 bytes; accepted: a YAML file of at most 1,048,576 bytes"),
    ("a GSM8K answer of '#### .'", lambda t, m: gsm8k_test_line(t, '{"question": "q", "answer": "a #### ."}'),
     r"test.jsonl:1: the answer has no final '#### n' line with a number n"),
    ("AQN adaptive given as a string", lambda t, m: recipe_with({"name": "aqn", "adaptive": "no"}),
     r"correction 'aqn': adaptive: Input should be a valid boolean \(got 'no'\)"),
    ("AQN stages not an integer", lambda t, m: recipe_with({"name": "aqn", "stages": 2.5}),
     r"stages: Input should be a valid integer \(got 2.5\)"),
    ("macro-block blocks not an integer", lambda t, m: recipe_with({"name": "macro_block", "blocks": 2.5}),
     r"correction 'macro_block': blocks: Input should be a valid integer"),
    ("fallback k not an integer", lambda t, m: recipe_with({"name": "outlier_fallback", "k": 1.5}),
     r"correction 'outlier_fallback': k: Input should be a valid integer"),
    ("a correction parameter that does not exist", lambda t, m: recipe_with({"name": "macro_block", "size": 4}),
     r"size: unknown parameter; accepted: blocks, rows, candidates"),
    ("duplicate YAML keys", lambda t, m: recipes_file(t, m, "mine:\n  quantize: true\n  quantize: false\n"),
     r"my_recipes.yaml:3:3: duplicate key 'quantize' \(first at line 2\)"),
    ("a YAML syntax error", lambda t, m: recipes_file(t, m, "mine:\n  corrections: [aqn\n"),
     r"my_recipes.yaml:3:1: expected ',' or ']'"),
    ("MXFP4_GSM8K_DIR naming a missing folder", lambda t, m: gsm8k_dir_set_to(t / "nowhere", m),
     r"MXFP4_GSM8K_DIR=.*nowhere: no train.jsonl or test.jsonl there; accepted: a folder holding"),
    ("decompose on a meta tensor", lambda t, m: lambda: mxfp4.decompose(torch.empty(4, 64, device="meta")),
     r"got one on the meta device"),
    ("a float axis", lambda t, m: lambda: mxfp4.fake_quantize(torch.randn(4, 64), axis=1.0),
     r"axis must be an int, got 1.0"),
    ("a block size of 0", lambda t, m: lambda: BlockFormat("x", get_format("mxfp4").element, "e8m0", 0),
     r"block_size must be an int >= 1, got 0"),
]


@pytest.mark.parametrize("case,call,message", RAISES, ids=[c[0] for c in RAISES])
def test_bad_input_is_one_clear_error(case, call, message, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=message) as err:
        call(tmp_path, monkeypatch)()
    assert "\n" not in str(err.value), "one line"


CLI = [  # (case, arguments, what stderr must say)
    ("decompose --key with --dist", ["decompose", "--dist", "gaussian", "--key", "w"],
     "--key picks a tensor of a --tensor file; it does not apply to --dist"),
    ("decompose --rows with --tensor", ["decompose", "--tensor", "{tensor}", "--rows", "4"],
     "--rows describe a --dist sample and do not apply to --tensor"),
    ("decompose --rows 0", ["decompose", "--rows", "0"], "argument --rows: 0; accepted: an integer >= 1"),
    ("prove --rows -3", ["prove", "--rows", "-3", "--out", "{file}.json"],
     "argument --rows: -3; accepted: an integer >= 1"),
    ("memory-plan --layers 0", ["memory-plan", "--layers", "0", "--out", "{file}.json"],
     "argument --layers: 0; accepted: an integer >= 1"),
    ("cell --seed -1", ["cell", "--profile", "smoke", "--model", "m", "--recipe", "bf16", "--seed", "-1"],
     "argument --seed: -1; accepted: an integer in [0, 2**32 - 1]"),
    ("decompose of 1e18 elements", ["decompose", "--rows", "1000000000", "--cols", "1000000000"],
     "accepted: at most 67,108,864"),
    ("decompose --recipe that does not quantize", ["decompose", "--recipe", "bf16"],
     "--recipe 'bf16' does not quantize; accepted: a recipe with quantize: true"),
    ("decompose --recipe with --format", ["decompose", "--recipe", "mxfp4", "--format", "nvfp4"],
     "--recipe names its format and scale rule; drop --format / --scale-rule"),
    ("plot on the wrong file", ["plot", "pathways", "{file}", "--out", "{file}.png"],
     "plot pathways: {file} is not the pathways/pathways.csv"),
    ("prove --out under an existing file", ["prove", "--out", "{file}/proofs.json"], "cannot write"),
]


@pytest.mark.parametrize("case,argv,message", CLI, ids=[c[0] for c in CLI])
def test_bad_command_lines_are_one_line_errors(case, argv, message, tmp_path):
    torch.save(torch.randn(4, 64), tmp_path / "t.pt")
    (tmp_path / "f").write_text("a file, not a folder")
    argv = [a.format(tensor=tmp_path / "t.pt", file=tmp_path / "f") for a in argv]
    code, text = cli(*argv)
    assert code == 2 and message.format(file=tmp_path / "f") in text, text[-2000:]
    assert "Traceback" not in text


def test_decompose_refuses_a_backend_it_does_not_use(monkeypatch):
    monkeypatch.setenv("MXFP4_BACKEND", "triton")
    code, text = cli("decompose", "--rows", "8", "--cols", "64")
    assert code == 2 and "decompose runs the float64 reference split" in text


def test_version():
    code, text = cli("--version")
    assert code == 0 and text.strip() == f"mxfp4 {mxfp4.__version__}"


def test_fake_quantize_on_a_tensor_that_requires_grad_is_straight_through():
    """Documented: the values are the fake-quantized ones bit for bit, the gradient passes unchanged
    (before: an output whose gradient was identically 0)."""
    x = torch.randn(8, 64, requires_grad=True)
    y = mxfp4.fake_quantize(x)
    assert torch.equal(y, mxfp4.fake_quantize(x.detach())) and y.requires_grad
    g = torch.randn(8, 64)
    y.backward(g)
    assert torch.equal(x.grad, g)

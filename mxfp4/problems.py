"""The embedded GSM8K-format problems: a generator of graded difficulty (1 to 3 arithmetic steps) with
worked answers in GSM8K's format, the warm start's planted flaws (subtraction, and optionally multiplication,
done as addition), and the split of the problem space into a training side and a held-out side that share no
question; optionally (``holdout="arithmetic"``) a share of the arithmetic facts never trained either, with a
test split of problems that need one.

A leaf module (no mxfp4 layer imported): the RL cells draw problems from it and the reports classify
them by it."""

from __future__ import annotations

import hashlib
import random
import re

NAMES = ["Tom", "Ana", "Sam", "Lea", "Max", "Mia", "Ben", "Zoe"]
ITEMS = ["apples", "books", "coins", "pens", "cards", "eggs"]


def _step(rng: random.Random, total: int, item: str, name: str):
    """One arithmetic step on the running total: (sentence, worked line, new total)."""
    op = rng.choice(["+", "-", "*"] if total <= 12 else ["+", "-"])
    if op == "+":
        k = rng.randint(1, 9)
        return f"{name} gets {k} more {item}.", f"{total}+{k}=<<{total}+{k}={total + k}>>{total + k}", total + k
    if op == "-" and total > 1:
        k = rng.randint(1, min(9, total - 1))
        return f"{name} gives away {k} {item}.", f"{total}-{k}=<<{total}-{k}={total - k}>>{total - k}", total - k
    k = rng.randint(2, 3)
    return f"{name} gets {k} times as many {item}.", f"{total}*{k}=<<{total}*{k}={total * k}>>{total * k}", total * k


def generate_problem(rng: random.Random, steps: int) -> dict:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    total = rng.randint(2, 9)
    sentences, lines = [f"{name} has {total} {item}."], []
    for _ in range(steps):
        sentence, line, total = _step(rng, total, item, name)
        sentences.append(sentence)
        lines.append(line)
    question = " ".join(sentences) + f" How many {item} does {name} have?"
    return {"question": question, "answer": "\n".join(lines) + f"\n#### {total}", "steps": steps}


_LINE = re.compile(r"^(\d+)([+\-*])(\d+)=<<")
# The planted flaws: the operation a flawed demonstration does as an addition (a demonstrator who misreads
# "gives away k" or "k times as many" as "k more"), by name.
FLAW_OPERATIONS = {"subtraction": "-", "multiplication": "*"}
DEFAULT_FLAWS = ("subtraction",)


def _flaw_operations(flaws) -> set[str]:
    unknown = [f for f in flaws if f not in FLAW_OPERATIONS]
    if unknown or not flaws:
        raise ValueError(f"planted flaws {list(flaws)}; accepted: one or more of {', '.join(FLAW_OPERATIONS)}")
    return {FLAW_OPERATIONS[f] for f in flaws}


def _steps(answer: str) -> list[re.Match]:
    steps = [_LINE.match(line) for line in answer.split("\n")[:-1]]
    if not steps or not all(steps):
        raise ValueError(f"not a worked answer of the embedded generator: {answer!r}")
    return steps


def flawed_answer(answer: str, flaws=DEFAULT_FLAWS) -> str | None:
    """The worked answer of an embedded problem with every step of a planted flaw's operation (``flaws``:
    subtraction, multiplication) done as an addition, the wrong total carried on to the end (a systematic
    error); None when the problem has no such step."""
    steps, wrong = _steps(answer), _flaw_operations(flaws)
    if not any(m.group(2) in wrong for m in steps):
        return None
    total, out = int(steps[0].group(1)), []
    for m in steps:
        op, k = ("+" if m.group(2) in wrong else m.group(2)), int(m.group(3))
        result = total + k if op == "+" else total - k if op == "-" else total * k
        out.append(f"{total}{op}{k}=<<{total}{op}{k}={result}>>{result}")
        total = result
    return "\n".join(out) + f"\n#### {total}"


HELD_OUT_SHARE = 8  # one question in 8 of the generator's problem space is a test question, never trained on
MAX_DRAWS = 1000  # draws per problem before a split is declared exhausted


def question_key(question: str) -> str:
    """A question's normalised text (lower case, one space between words): what "the same question" means."""
    return " ".join(question.lower().split())


def held_out(question: str) -> bool:
    """Whether a question is on the test side of the embedded problem space: a fixed share of all
    questions (``1 / HELD_OUT_SHARE``, by the SHA-256 of the normalised text), so that no draw of
    training problems (warm start, GRPO, few-shot pool), however large, contains a test question."""
    digest = hashlib.sha256(question_key(question).encode()).digest()
    return int.from_bytes(digest[:8], "big") % HELD_OUT_SHARE == 0


def problem_type(answer: str, flaws=DEFAULT_FLAWS) -> str | None:
    """``rest`` for an embedded problem without a step of a planted flaw; with one planted flaw, ``flaw``;
    with several, ``flaw:`` and the flaws it has a step of (``flaw:subtraction+multiplication``); None for a
    worked answer the generator did not write (real GSM8K)."""
    try:
        ops = {m.group(2) for m in _steps(answer)}
    except ValueError:
        return None
    _flaw_operations(flaws)
    present = [f for f in flaws if FLAW_OPERATIONS[f] in ops]
    if not present:
        return "rest"
    return "flaw" if len(flaws) == 1 else "flaw:" + "+".join(present)


def type_groups(kind: str | None) -> list[str]:
    """The problem groups a problem of type ``kind`` counts in: ``rest``; ``flaw``; or ``flaw`` and each of
    its flaws (``flaw:subtraction``), so that each planted flaw and all of them together have a row."""
    if kind is None:
        return []
    if not kind.startswith("flaw:"):
        return [kind]
    return ["flaw", *(f"flaw:{f}" for f in kind.removeprefix("flaw:").split("+"))]


ARITHMETIC_HELD_OUT_SHARE = 8  # with holdout="arithmetic", one arithmetic fact in 8 is never trained
HOLDOUTS = ("questions", "arithmetic")
SPLITS = {"questions": ("train", "test"), "arithmetic": ("train", "test", "test-arithmetic")}


def facts(answer: str) -> list[tuple[int, str, int]]:
    """The arithmetic facts of a worked answer of the generator: (a, op, k) of each line ``a op k = r``."""
    return [(int(m.group(1)), m.group(2), int(m.group(3))) for m in _steps(answer)]


def held_out_fact(fact: tuple[int, str, int]) -> bool:
    """Whether an arithmetic fact (a, op, k) is on the never-trained side under ``holdout="arithmetic"``: a fixed
    share (``1 / ARITHMETIC_HELD_OUT_SHARE``, by the SHA-256 of ``a op k``), whatever the wording around it."""
    a, op, k = fact
    digest = hashlib.sha256(f"{a}{op}{k}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % ARITHMETIC_HELD_OUT_SHARE == 0


def demonstrated_facts(answer: str) -> set[tuple[int, str, int]]:
    """Every fact a training demonstration of the problem can show: its worked answer's and those of each
    flawed version of it (every non-empty set of planted flaws, whose wrong totals carry on to new facts)."""
    out = set(facts(answer))
    names = list(FLAW_OPERATIONS)
    for mask in range(1, 2 ** len(names)):
        flawed = flawed_answer(answer, [f for i, f in enumerate(names) if mask >> i & 1])
        if flawed is not None:
            out |= set(facts(flawed))
    return out


def needs_held_out_fact(answer: str) -> bool:
    """Whether solving the problem takes an arithmetic fact never trained under ``holdout="arithmetic"``."""
    return any(held_out_fact(f) for f in facts(answer))


def _on_side(problem: dict, split: str, holdout: str) -> bool:
    """Whether a generated problem belongs to ``split`` of the problem space under ``holdout``."""
    if holdout == "questions":
        return held_out(problem["question"]) == (split == "test")
    if split == "train":
        return not held_out(problem["question"]) and not any(map(held_out_fact, demonstrated_facts(problem["answer"])))
    if split == "test":  # new wording, trained arithmetic
        return held_out(problem["question"]) and not needs_held_out_fact(problem["answer"])
    return needs_held_out_fact(problem["answer"])  # test-arithmetic: a fact no training draw holds


def embedded_split(split: str, n: int, seed: int = 0, max_steps: int = 2, holdout: str = "questions") -> list[dict]:
    """``n`` problems, steps spread evenly over 1..max_steps. Train problems come from the training side
    of the problem space and test problems from the held-out side (``held_out``), so the two share no
    question; test problems are distinct. Each split and seed has its own random stream.

    Args:
        split: train, test, or (``holdout="arithmetic"``) test-arithmetic.
        n: problems drawn.
        seed: the split's random stream.
        max_steps: arithmetic steps of the longest problems.
        holdout: what the test side holds out: ``questions`` (new wording of trained arithmetic), or
            ``arithmetic``: training also leaves out every problem one of whose demonstrations (correct or
            flawed) shows a held-out fact (``held_out_fact``), ``test`` keeps to trained facts and
            ``test-arithmetic`` draws problems that need a held-out fact.
    """
    if holdout not in HOLDOUTS:
        raise ValueError(f"unknown holdout {holdout!r}; accepted: {', '.join(HOLDOUTS)}")
    if split not in SPLITS[holdout]:
        raise ValueError(f"unknown split {split!r} under holdout {holdout!r}; accepted: {', '.join(SPLITS[holdout])}")
    rng = random.Random(f"{split}-{seed}")
    test = split != "train"
    out, seen = [], set()
    for i in range(n):
        steps = 1 + i % max_steps
        for _ in range(MAX_DRAWS):
            problem = generate_problem(rng, steps)
            key = question_key(problem["question"])
            if _on_side(problem, split, holdout) and not (test and key in seen):
                break
        else:
            raise ValueError(f"the embedded {split} split ran out of distinct {steps}-step problems after {len(out)} "
                             f"of {n}; ask for fewer (data.n_eval) or more steps (data.max_problem_steps)")
        seen.add(key)
        out.append(problem)
    return out

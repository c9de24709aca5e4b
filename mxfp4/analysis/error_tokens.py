"""Error completions: the garbled and repetitive text QaRL (arXiv 2604.07853) names as the failure of quantized
rollouts, by one stated rule a completion at a time.

- repetitive: some run of ``NGRAM`` consecutive words occurs at least ``REPEATS`` times in the completion (a
  decoding loop);
- garbled: ``RUN`` or more consecutive alphabetic words, none of them in the vocabulary (the lower-cased words of
  the GSM8K training split), or a character outside printable ASCII that is not a letter or a digit.

Words are maximal runs of letters, digits and apostrophes; numbers are never out of vocabulary.
"""

from __future__ import annotations

import re
from collections import Counter

NGRAM, REPEATS, RUN = 3, 3, 3
WORD = re.compile(r"[A-Za-z0-9']+")
RULE = (f"repetitive: a {NGRAM}-word sequence occurring {REPEATS}+ times; garbled: {RUN}+ consecutive alphabetic words "
        "outside the GSM8K training split's vocabulary, or a character that is neither printable ASCII nor a letter "
        "or digit")


def vocabulary(texts) -> frozenset[str]:
    """The lower-cased words of ``texts`` (the GSM8K training split's questions and answers)."""
    return frozenset(w.lower() for t in texts for w in WORD.findall(t))


def repetitive(text: str) -> bool:
    words = [w.lower() for w in WORD.findall(text)]
    grams = Counter(tuple(words[i:i + NGRAM]) for i in range(len(words) - NGRAM + 1))
    return bool(grams) and max(grams.values()) >= REPEATS


def garbled(text: str, vocab: frozenset[str]) -> bool:
    if any(not (ch.isascii() and (ch.isprintable() or ch in "\n\t")) and not ch.isalnum() for ch in text):
        return True
    run = 0
    for w in WORD.findall(text):
        unknown = w.isalpha() and w.lower() not in vocab
        run = run + 1 if unknown else 0
        if run >= RUN:
            return True
    return False


def classify(text: str, vocab: frozenset[str]) -> dict:
    """{"repetitive": bool, "garbled": bool, "error": either} of one completion."""
    rep, garb = repetitive(text), garbled(text, vocab)
    return {"repetitive": rep, "garbled": garb, "error": rep or garb}

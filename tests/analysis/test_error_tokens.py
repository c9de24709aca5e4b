"""The error-completion rule on constructed strings, against a second computation written out by hand."""

from hypothesis import given
from hypothesis import strategies as st

from mxfp4.analysis.error_tokens import NGRAM, REPEATS, RUN, classify, garbled, repetitive, vocabulary

VOCAB = vocabulary(["Mia has 3 apples and buys 4 more. How many apples does she have?", "#### 7 The answer is 7."])


def test_a_clean_answer_is_no_error():
    assert classify("Mia has 3 apples and buys 4 more. The answer is 7.\n#### 7", VOCAB) == {
        "repetitive": False, "garbled": False, "error": False}


def test_a_loop_is_repetitive_once_a_three_word_run_occurs_three_times():
    assert (NGRAM, REPEATS) == (3, 3)
    assert not repetitive("you are a user. you are a user.")
    assert repetitive("you are a user. you are a user. You are a user")  # case and punctuation do not hide it


def test_garbled_runs_of_unknown_words_and_stray_characters():
    assert RUN == 3
    assert not garbled("Mia has zorb 3 apples", VOCAB)  # one unknown word
    assert not garbled("zorb flim 12 blat", VOCAB)  # a number breaks the run
    assert garbled("the answer is zorb flim blat", VOCAB)
    assert garbled("Mia has 3 apples \ufffd", VOCAB)  # the replacement character of broken bytes
    assert garbled("Mia has 3 apples and 4 € more", VOCAB)  # not ASCII, not a letter or digit


@given(st.lists(st.sampled_from(["mia", "has", "apples", "the", "answer", "is", "7", "zorb", "flim"]), max_size=30))
def test_the_rule_matches_a_direct_count(words):
    text = " ".join(words)
    grams = [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
    expected_rep = any(grams.count(g) >= 3 for g in grams)
    longest, run = 0, 0
    for w in words:
        run = run + 1 if w in ("zorb", "flim") else 0
        longest = max(longest, run)
    assert classify(text, VOCAB) == {"repetitive": expected_rep, "garbled": longest >= 3,
                                     "error": expected_rep or longest >= 3}

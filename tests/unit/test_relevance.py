"""Injection's relevance floor: which words of a prompt are uncommon, and when a memory
shares enough of them (ctxd/memory/_relevance.py)."""

from __future__ import annotations

import pytest
from tests_support import COUNTER

from ctxd.memory._relevance import COMMON_RANK, Vocabulary, shares_enough

MEMORY = ("pytest flaky fixture: Run the tests with -p no:randomly when the tmp_path "
          "fixture is flaky; it is a test order issue.")


@pytest.fixture
def vocabulary() -> Vocabulary:
    return Vocabulary(COUNTER)


def test_common_words_are_the_tokenizer_s_first_tokens_numbers_and_words_of_asking(
        vocabulary: Vocabulary) -> None:
    for word in ("it", "is", "run", "test", "good", "error"):
        [token] = COUNTER.encode(" " + word)
        assert token < COMMON_RANK, word
    assert vocabulary.uncommon_keys("it is run test good error 42 8080 why please") == set()
    assert vocabulary.uncommon_keys("weather fixture pytest") == {"weath", "fixtur", "pyt"}


@pytest.mark.parametrize(("prompt", "uncommon"), [
    ("run it", set()),
    # Uncommon by the tokenizer's order, but words of asking, not of a topic.
    ("Continue, please. Why does it fail? Thanks!", set()),
    ("Continue with the migration, please", {"migr"}),
    ("run step 2 then 3 on port 8080", {"step", "port"}),
    ("Is this a good test of the weather?", {"weath"}),
    # "tests" is common through its stem; "fixtures" and "fixture" share a key.
    ("Run the tests: the fixtures are flaky under pytest", {"fixtur", "flaky", "pyt"}),
])
def test_a_prompt_s_uncommon_words(vocabulary: Vocabulary, prompt: str,
                                   uncommon: set[str]) -> None:
    assert vocabulary.uncommon_keys(prompt) == uncommon


@pytest.mark.parametrize(("prompt", "needed", "relevant"), [
    ("run it", 2, False),  # no uncommon word: nothing to match by
    ("Is this a good test of the weather?", 2, False),  # only "is" and "test" shared
    ("why is the fixture flaky", 2, True),
    ("the fixture broke the weather report", 2, False),  # one of two
    ("the fixture broke the weather report", 1, True),
    ("what is that fixture", 2, True),  # its one uncommon word is enough
    ("flaky fixture under pytest on the weather station", 3, True),
    ("flaky fixture under the weather station", 3, False),
])
def test_a_memory_shares_enough_of_the_prompt_s_uncommon_words(
        vocabulary: Vocabulary, prompt: str, needed: int, relevant: bool) -> None:
    assert shares_enough(vocabulary.uncommon_keys(prompt), vocabulary.keys(MEMORY),
                         needed) is relevant

"""Fitting memories into a branch's injected message by exact token counts."""

import random
import string

from tests_support import COUNTER

from ctxd.memory._injection import HEADER, fit

AWKWARD = string.ascii_letters + string.digits + " .,;:!?-\n\t()[]{}'\"`~/\\|@#$%^&*_+=<>é中😀"


def test_the_items_and_the_header_add_up_to_the_message_exactly() -> None:
    # Texts that end in punctuation, spaces or newlines would merge with a following
    # separator in a naive concatenation; the blocks are built so that they never do.
    rng = random.Random(7)
    for _ in range(500):
        candidates = [(i, "".join(rng.choice(AWKWARD) for _ in range(rng.randint(0, 20))),
                       "".join(rng.choice(AWKWARD) for _ in range(rng.randint(1, 120))),
                       0.8, rng.choice(["success", "failure"]))
                      for i in range(1, rng.randint(2, 11))]
        injected = fit(candidates, COUNTER, 100_000)
        assert injected.text is not None
        assert injected.tokens == COUNTER.message_tokens("user", injected.text)
        assert injected.tokens == COUNTER.message_tokens("user", HEADER) + sum(
            item.tokens for item in injected.items)


def test_items_that_do_not_fit_are_skipped_and_later_ones_still_tried() -> None:
    candidates = [(1, "long", "word " * 400, 0.9, "success"),
                  (2, "short", "run the tests with the venv", 0.8, "failure"),
                  (3, "also short", "bump user_version", 0.75, "success")]
    injected = fit(candidates, COUNTER, 60)
    assert [item.memory_id for item in injected.items] == [2, 3]
    assert injected.text == (HEADER + "- short (confidence 0.80, learned from a failure): "
                             "run the tests with the venv\n- also short (confidence 0.75): "
                             "bump user_version\n")
    assert injected.tokens == COUNTER.message_tokens("user", injected.text) <= 60
    nothing = fit(candidates[:1], COUNTER, 60)
    assert (nothing.text, nothing.injection.status) == (None, "none_found")

"""Injection's relevance floor: a memory goes beside a prompt only when it shares enough of
the prompt's uncommon words (docs/protocol.md, Injection into a new branch; measured in
docs/performance.md, "Injection's relevance floor").

Retrieval ranks: whatever the prompt, its best memories come first, and the fusion's scores
are ranks, so a lone memory that shares only "is" and "test" with a prompt ranks first.
The lexical leg's IDF cannot tell "is" from "pytest" in a store of a few memories, so which
words are common comes from the tokenizer's vocabulary: a byte-pair encoding learns its
tokens in the order of their frequency in a large corpus, and a word whose space-led form
is one of its first `COMMON_RANK` tokens (" the", " it", " run", " test", " error") is a
word most texts hold. Words are compared by the hashing embedder's light stem (`Vocabulary`
keys), so "fixtures" shares "fixture".

It is calibrated for English prompts on cl100k_base (docs/decisions.md, Memory): in a language
whose function words the order ranks later, fewer words are common and the floor filters
less; a text written without spaces (Chinese, Japanese) is one long word, which few
memories share, so little is injected beside it.
"""

from __future__ import annotations

from ctxd.memory._embedders import WORD, stem
from ctxd.tokens import TokenCounter

COMMON_RANK = 2_000
"""A word whose space-led form, or its stem's, is one token below this rank is common
(cl100k_base: " test" 1296, " run" 1629, " error" 1493 are; " weather" 9282, " fixture"
12790, " pytest" 28864 are not)."""
ASKING_WORDS = frozenset("""
    able actually anything awesome broken bug bugs continue cool describe done excellent
    explain fail failed failing fails failure fine fix fixed fixes fixing great hello hey hi
    implement issue issues maybe might nice nothing ok okay perfect perhaps please problem
    problems proceed something stuff sure tell thank thanks thing things tried trying why
    works wrong yeah yes""".split())
"""Words the tokenizer's order finds uncommon that say what to do or how it went, not what
it is about ("why?", "please fix the bug", "the test fails", "thanks!"): common too."""
KEPT_WORDS = 1 << 16
"""Words whose stem and commonness are kept (emptied when full)."""


class Vocabulary:
    """Words' keys, and which are common, by the counter's tokenizer (kept once found)."""

    def __init__(self, counter: TokenCounter):
        self._counter = counter
        self._keys: dict[str, str] = {}
        self._common: dict[str, bool] = {}

    def _key(self, word: str) -> str:
        """What a word is compared by: its light stem, a final "e" dropped ("fixture" and
        "fixtures" both "fixtur", "cache" and "caching" both "cach")."""
        found = self._keys.get(word)
        if found is None:
            if len(self._keys) >= KEPT_WORDS:
                self._keys.clear()
            found = stem(word)
            if found.endswith("e") and len(found) > 3:
                found = found[:-1]
            self._keys[word] = found
        return found

    def _is_common(self, word: str) -> bool:
        found = self._common.get(word)
        if found is None:
            if len(self._common) >= KEPT_WORDS:
                self._common.clear()
            # A number is common: a line, a port, a step (the tokenizer splits digits
            # into tokens of their own, so its order says nothing of them). The stem's
            # rank makes "tests" as common as "test"; it also makes "notes" as common as
            # "not", a few words missed.
            found = self._common[word] = (
                word.isdigit() or word in ASKING_WORDS or self._one_common_token(word)
                or self._one_common_token(stem(word)))
        return found

    def _one_common_token(self, word: str) -> bool:
        tokens = self._counter.encode(" " + word)
        return len(tokens) == 1 and tokens[0] < COMMON_RANK

    def keys(self, text: str) -> set[str]:
        """The keys (`_key`) of a text's words, lowercased."""
        known = self._keys
        return {known.get(word) or self._key(word)
                for word in set(WORD.findall(text.lower()))}

    def uncommon_keys(self, text: str) -> frozenset[str]:
        """The keys of a text's uncommon words: neither the word nor its stem is common."""
        return frozenset(self._key(word) for word in set(WORD.findall(text.lower()))
                         if not self._is_common(word))

    def uncommon_words(self, text: str) -> list[str]:
        """A text's uncommon words (lowercased), the first of each key, in their order."""
        first: dict[str, str] = {}
        for word in WORD.findall(text.lower()):
            if not self._is_common(word):
                first.setdefault(self._key(word), word)
        return list(first.values())


def shares_enough(prompt: frozenset[str], memory: set[str], needed: int) -> bool:
    """Whether a memory's keys hold ``needed`` of the prompt's uncommon keys (all of them
    when the prompt has fewer, and at least one: a prompt of common words only, such as
    "run it", matches no memory)."""
    return len(prompt & memory) >= max(1, min(needed, len(prompt)))

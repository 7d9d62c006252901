"""The tests' emulation of Anthropic's prompt cache (ctxd/cost.py): what the
gateway's cache-safety test and bench/agents.py price requests with."""

from __future__ import annotations

from typing import Any

import pytest

from ctxd.cost import CacheUsage, PromptCache

MARK = {"type": "ephemeral"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def request(*turns: str, marked: int | None = -1, system: str = "You are terse.") -> dict[str, Any]:
    """A body of user/assistant text turns, the turn at ``marked`` a breakpoint."""
    messages: list[dict[str, Any]] = []
    for index, text in enumerate(turns):
        block: dict[str, Any] = {"type": "text", "text": text}
        if marked is not None and index == (marked % len(turns)):
            block["cache_control"] = MARK
        messages.append({"role": "user" if index % 2 == 0 else "assistant", "content": [block]})
    return {"system": system, "messages": messages}


def test_a_request_without_breakpoints_is_all_input() -> None:
    usage = PromptCache().charge(request("hello there", "hi", "go on", marked=None))
    assert usage.cache_read_tokens == usage.cache_write_tokens == 0
    assert usage.input_tokens > 0


def test_the_prefix_to_a_breakpoint_is_written_once_then_read() -> None:
    cache = PromptCache(Clock())
    body = request("read the file " * 50, "done " * 30, "now the tests", marked=1)
    first = cache.charge(body)
    assert first.cache_read_tokens == 0
    assert first.cache_write_tokens > 0
    assert first.input_tokens > 0
    again = cache.charge(body)
    assert again == CacheUsage(first.input_tokens, first.cache_write_tokens, 0)
    assert again.cost() == pytest.approx(first.input_tokens + 0.1 * first.cache_write_tokens)


def test_an_extended_conversation_reads_the_old_prefix_and_writes_the_new_turns() -> None:
    cache = PromptCache(Clock())
    turns = ["read the file " * 50, "done " * 30, "now the tests " * 20]
    first = cache.charge(request(*turns))
    longer = request(*turns, "passed " * 10, "and the docs " * 10)
    whole = PromptCache().charge(longer)
    extended = cache.charge(longer)
    assert extended.cache_read_tokens == first.cache_write_tokens
    assert extended.cache_read_tokens + extended.cache_write_tokens == whole.cache_write_tokens
    assert extended.input_tokens == whole.input_tokens == 0


def test_a_changed_early_message_breaks_the_cache_after_it() -> None:
    cache = PromptCache(Clock())
    turns = ["read the file " * 50, "done " * 30, "now the tests " * 20]
    first = cache.charge(request(*turns))
    edited = cache.charge(request(turns[0], "DONE " * 30, turns[2]))
    assert edited.cache_read_tokens == 0
    assert edited.cache_write_tokens == first.cache_write_tokens


def test_a_moved_breakpoint_keeps_what_was_cached() -> None:
    cache = PromptCache(Clock())
    turns = ["read the file " * 50, "done " * 30, "now the tests " * 20]
    first = cache.charge(request(*turns, marked=1))
    moved = cache.charge(request(*turns, marked=2))
    assert moved.cache_read_tokens == first.cache_write_tokens
    assert moved.cache_write_tokens == first.input_tokens
    assert moved.input_tokens == 0


def test_an_entry_expires_five_minutes_after_its_last_read() -> None:
    clock = Clock()
    cache = PromptCache(clock)
    body = request("read the file " * 50, "done", "go on")
    written = cache.charge(body).cache_write_tokens
    clock.now += 299
    assert cache.charge(body).cache_read_tokens == written  # refreshed here
    clock.now += 299
    assert cache.charge(body).cache_read_tokens == written
    clock.now += 301
    assert cache.charge(body) == CacheUsage(0, 0, written)


def test_a_read_looks_back_at_most_twenty_blocks_before_a_breakpoint() -> None:
    cache = PromptCache(Clock())
    turns = [f"turn {n} " * 5 for n in range(3)]
    cache.charge(request(*turns))
    near = [*turns, *(f"more {n}" for n in range(20))]
    assert cache.charge(request(*near)).cache_read_tokens > 0
    far_cache = PromptCache(Clock())
    far_cache.charge(request(*turns))
    far = [*turns, *(f"more {n}" for n in range(21))]
    assert far_cache.charge(request(*far)).cache_read_tokens == 0


def test_more_than_four_breakpoints_are_refused() -> None:
    body = request("a", "b", "c")
    body["tools"] = [{"name": f"t{n}", "input_schema": {}, "cache_control": MARK}
                     for n in range(4)]
    with pytest.raises(ValueError, match="5 cache_control blocks"):
        PromptCache().charge(body)

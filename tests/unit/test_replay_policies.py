"""The replay's policies and their price (clients/ctxclient/_policies.py) on hand-made
calls, the costs worked out by hand: a block's tokens are the number its text starts with
(a call's, its input's ``n``), else its count of words, so each figure below is the sum
of the blocks read, written and answered, at input 1, cache write 1.25, cache read 0.1
and output 5."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ctxclient._policies import (
    SUMMARY_INSTRUCTION,
    Call,
    claude_code,
    context_editing,
    observation_masking,
    price,
    raw,
)
from ctxd.cost import PRICES, PromptCache


def count(encoded: str) -> int:
    _, _, block = json.loads(encoded)
    if block.get("type") == "tool_use":
        return int(block["input"]["n"])
    text = block["content"] if block.get("type") == "tool_result" else block["text"]
    words = text.split()
    return int(words[0]) if words and words[0].isdigit() else len(words)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def calls_tool(call_id: str, tokens: int) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "tool_use", "id": call_id,
                                              "name": "Bash", "input": {"n": tokens}}]}


def result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id,
                                         "content": text}]}


def replay_of(messages: list[dict[str, Any]], times: list[float]) -> list[Call]:
    """The calls of a thread: one before each assistant message, at ``times``."""
    starts = [k for k, message in enumerate(messages) if message["role"] == "assistant"]
    return [Call(messages[:k], at, messages[k]) for k, at in zip(starts, times, strict=True)]


CHAT = [user("1000 start"), assistant("50 ok"), user("200 more"), assistant("30 fine"),
        user("100 last"), assistant("20 bye")]
TOOLS = [user("100 go"), calls_tool("t1", 10), result("t1", "500 big"), calls_tool("t2", 10),
         result("t2", "300 more"), assistant("5 done")]


def test_raw_reads_the_cached_prefix_and_pays_it_again_after_five_minutes() -> None:
    cache = PromptCache(count=count)
    # 60 s after the first call its prefix is read; the third comes 301 s after the second,
    # when both entries (written or refreshed at 60 s) have expired.
    report = price(raw(replay_of(CHAT, [0, 60, 361]), CHAT, 200_000, cache),
                   "claude-sonnet-4-5", 1.0, cache)
    first = 1.25 * 1000 + 5 * 50
    second = 0.1 * 1000 + 1.25 * (50 + 200) + 5 * 30
    third = 1.25 * (1000 + 50 + 200 + 30 + 100) + 5 * 20
    assert report.cost == first + second + third == 3887.5
    assert (report.input_tokens, report.cache_read_tokens, report.cache_write_tokens,
            report.output_tokens) == (0, 1000, 2630, 100)
    assert report.dollars == round((2630 * 3.75 + 1000 * 0.30 + 100 * 15) / 1e6, 4)
    assert [point["cumulative_cost"] for point in report.series] == [
        first, first + second, first + second + third]
    assert report.peak_tokens == 1380
    assert (report.model_calls, report.retrievable_fraction) == (3, 1.0)


def test_raw_within_five_minutes_reads_everything_it_sent_before() -> None:
    cache = PromptCache(count=count)
    report = price(raw(replay_of(CHAT, [0, 60, 120]), CHAT, 200_000, cache),
                   "claude-sonnet-4-5", 1.0, cache)
    third = 0.1 * (1000 + 50 + 200) + 1.25 * (30 + 100) + 5 * 20
    assert report.cost == 1.25 * 1000 + 250 + 0.1 * 1000 + 1.25 * 250 + 150 + third


def test_masking_an_old_result_breaks_the_cache_where_it_was() -> None:
    cache = PromptCache(count=count)
    applied = observation_masking(replay_of(TOOLS, [0, 10, 20]), TOOLS, 200_000, cache,
                                  keep=1)
    placeholder = "Old environment output: (1 lines omitted)"
    assert applied.sent[2].messages[2] == result("t1", placeholder)
    assert applied.final[2] == result("t1", placeholder)
    report = price(applied, "claude-sonnet-4-5", 1.0, cache)
    # Third call: only the first message is still a cached prefix; the placeholder (6
    # words) and all after it are written again.
    assert report.cost == (1.25 * 100 + 5 * 10) + (0.1 * 100 + 1.25 * 510 + 5 * 10) + (
        0.1 * 100 + 1.25 * (10 + 6 + 10 + 300) + 5 * 5)
    assert (applied.removed_bytes, report.retrievable_fraction) == (len("500 big"), 0.0)


def test_context_editing_clears_only_past_its_trigger() -> None:
    cache = PromptCache(count=count)
    # The second call's 610 tokens are past 600, but its one result is the latest kept;
    # the third call's first result is cleared.
    applied = context_editing(replay_of(TOOLS, [0, 10, 20]), TOOLS, 200_000, cache,
                              trigger=600, keep=1)
    assert [call.messages for call in applied.sent[:2]] == [TOOLS[:1], TOOLS[:3]]
    assert applied.sent[2].messages[2] == result("t1", "[Tool result cleared]")
    report = price(applied, "claude-sonnet-4-5", 1.0, cache)
    assert report.cost == 175 + 697.5 + 0.1 * 100 + 1.25 * (10 + 3 + 10 + 300) + 5 * 5
    untouched = context_editing(replay_of(TOOLS, [0, 10, 20]), TOOLS, 200_000, cache,
                                trigger=1_000, keep=1)
    assert [sent.messages for sent in untouched.sent] == [TOOLS[:1], TOOLS[:3], TOOLS[:5]]


def test_claude_code_compacts_past_its_threshold_with_a_call_of_its_own() -> None:
    cache = PromptCache(count=count)
    asked = replay_of(TOOLS, [0, 10, 20])
    # Past 0.5 of a 1,200-token window (600): the second call's 610 tokens.
    applied = claude_code(asked, TOOLS, 1_200, cache, compact_at=0.5, summary_tokens=60)
    instruction = len(SUMMARY_INSTRUCTION.split())
    compaction, after, again, last = applied.sent[1:]
    assert compaction.messages == [*TOOLS[:3], user(SUMMARY_INSTRUCTION)]
    assert compaction.output_tokens == 60
    summary = after.messages[0]
    assert summary["role"] == "user"
    assert count(json.dumps(
        ["user", True, {"type": "text", "text": summary["content"]}])) == 60
    assert "User: 100 go" in summary["content"]
    # The thread after a compaction starts at the last assistant message.
    assert after.messages[1:] == TOOLS[1:3]
    assert again.messages == [summary, *TOOLS[1:5], user(SUMMARY_INSTRUCTION)]
    assert last.messages[1:] == TOOLS[3:5]
    assert last.messages[0] != summary
    report = price(applied, "claude-sonnet-4-5", 1.0, cache)
    first = 1.25 * 100 + 5 * 10
    second = (0.1 * 100 + 1.25 * (10 + 500 + instruction) + 5 * 60) + (
        1.25 * (60 + 10 + 500) + 5 * 10)
    third = (0.1 * (60 + 10 + 500) + 1.25 * (10 + 300 + instruction) + 5 * 60) + (
        1.25 * (60 + 10 + 300) + 5 * 5)
    assert report.cost == pytest.approx(first + second + third)
    assert report.model_calls == 5
    assert [point["call"] for point in report.series] == [1, 2, 3]
    assert applied.retrievable_bytes == 0
    assert applied.removed_bytes > 0


def test_claude_code_previews_a_large_output_which_stays_one_read_away() -> None:
    cache = PromptCache(count=count)
    big = "7 " + "x" * 40_000
    thread = [user("100 go"), calls_tool("t1", 10), result("t1", big), assistant("5 done")]
    applied = claude_code(replay_of(thread, [0, 10]), thread, 200_000, cache)
    preview = applied.sent[1].messages[2]["content"][0]["content"]
    assert preview.startswith("<persisted-output>\nOutput too large (40,002 characters).")
    assert big[:2_000] in preview
    assert big[:2_001] not in preview
    assert applied.readable == [big]
    assert applied.removed_bytes == applied.retrievable_bytes == len(big)


def test_more_than_four_breakpoints_cannot_be_priced() -> None:
    cache = PromptCache(count=count)
    marked = [{"role": "user", "content": [
        {"type": "text", "text": f"{n} words", "cache_control": {"type": "ephemeral"}}]}
        for n in range(5)]
    with pytest.raises(ValueError, match="at most 4"):
        cache.charge({"messages": marked})


def test_every_price_keeps_anthropics_ratios() -> None:
    for model, prices in PRICES.items():
        assert (prices.cache_write / prices.input, prices.cache_read / prices.input,
                prices.output / prices.input) == pytest.approx((1.25, 0.1, 5.0)), model


def test_claude_codes_next_summary_carries_the_first_and_adds_what_came_since() -> None:
    cache = PromptCache(count=count)
    thread = [user("100 first request"), calls_tool("t1", 10), result("t1", "500 big"),
              {"role": "assistant", "content": [{"type": "tool_use", "id": "t2",
                                                 "name": "Bash",
                                                 "input": {"n": 10, "command": "make deploy"}}]},
              result("t2", "400 more"), assistant("5 and"), user("100 new request"),
              calls_tool("t3", 10), result("t3", "300 last"), assistant("5 done")]
    applied = claude_code(replay_of(thread, [0, 10, 20, 30, 40]), thread, 1_200, cache,
                          compact_at=0.5, summary_tokens=200)
    summaries = [sent.messages[0]["content"] for sent in applied.sent
                 if sent.messages[0]["content"].startswith("This session")]
    first, *_, last = summaries
    assert "User: 100 first request" in first
    assert "User: 100 first request" in last
    assert "User: 100 new request" in last
    assert "Bash: command=make deploy" in last
    assert last != first

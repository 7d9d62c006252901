"""prompt.build against a real daemon: order, exact tokens, cache breakpoints, formats,
a cacheable prefix that stays byte-identical, a session's own sections (its params' checks:
tests/unit/test_routes.py)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import DaemonProcess
from tests_support import COUNTER, hello_text

from ctxclient import Client

EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture
def client(shared_daemon: DaemonProcess) -> Client:
    with shared_daemon.client() as connected:
        yield connected  # type: ignore[misc]


def build(client: Client, **params: Any) -> dict[str, Any]:
    return client.call("prompt.build", params)  # type: ignore[no-any-return]


def section(name: str, content: str, cacheable: bool | None = None) -> dict[str, Any]:
    given: dict[str, Any] = {"name": name, "content": content}
    if cacheable is not None:
        given["cacheable"] = cacheable
    return given


def test_sections_are_ordered_static_to_dynamic_with_exact_tokens(client: Client) -> None:
    # Given out of order: known names take their places, cacheable ones first; the
    # custom cacheable "style" follows the known cacheable names.
    given = [section("context_status", hello_text(6)),
             section("scratchpad", hello_text(5)),
             section("style", hello_text(4), cacheable=True),
             section("memories", hello_text(3)),
             section("project_rules", hello_text(2)),
             section("base_instructions", hello_text(10))]
    result = build(client, sections=given)
    names = ["base_instructions", "project_rules", "memories", "style", "scratchpad",
             "context_status"]
    contents = {s["name"]: s["content"] for s in given}
    assert result["text"] == "\n\n".join(contents[name] for name in names)
    # hello_text(n) is n tokens, "\n\n" between two words one more: the sums are exact.
    assert [(s["name"], s["cacheable"], s["tokens"]) for s in result["sections"]] == [
        ("base_instructions", True, 10), ("project_rules", True, 2), ("memories", True, 3),
        ("style", True, 4), ("scratchpad", False, 5), ("context_status", False, 6)]
    assert result["tokens"] == 10 + 2 + 3 + 4 + 5 + 6 + 5 == COUNTER.count(result["text"])
    for info in result["sections"]:
        assert result["text"][info["offset"]:info["offset"] + info["length"]] \
            == contents[info["name"]]
    # Four cacheable sections: a breakpoint after each (the limit is four).
    ends = [59, 72, 91, 116]  # hello_text(n) is 6n - 1 characters
    assert result["cache_breakpoints"] == [
        {"section": "base_instructions", "index": 0, "offset": ends[0], "prefix_tokens": 10},
        {"section": "project_rules", "index": 1, "offset": ends[1], "prefix_tokens": 13},
        {"section": "memories", "index": 2, "offset": ends[2], "prefix_tokens": 17},
        {"section": "style", "index": 3, "offset": ends[3], "prefix_tokens": 22}]
    assert result["text"][:ends[3]].endswith(contents["style"])
    assert (result["format"], result["system"]) == ("openai", None)


def test_real_text_counts_match_the_tokenizer(client: Client) -> None:
    rules = "Use the project's .venv/bin/pytest.\nNever push to main!\n"
    pad = "Étape 2 : 東京 の テスト — ok.\n\n"
    big = "The quick brown fox jumps over the lazy dog. " * 20_000  # 900 KB: off the loop
    result = build(client, sections=[section("scratchpad", pad), section("skills", big),
                                     section("project_rules", rules)])
    text = rules + "\n\n" + big + "\n\n" + pad
    assert result["text"] == text
    assert result["tokens"] == COUNTER.count(text)
    assert [s["tokens"] for s in result["sections"]] == [
        COUNTER.count(rules), COUNTER.count(big), COUNTER.count(pad)]
    assert result["cache_breakpoints"] == [
        {"section": "project_rules", "index": 0, "offset": len(rules),
         "prefix_tokens": COUNTER.count(rules)},
        {"section": "skills", "index": 1, "offset": len(rules) + 2 + len(big),
         "prefix_tokens": COUNTER.count(rules + "\n\n" + big)}]


def test_more_than_four_cacheable_sections_get_the_first_three_and_the_last(
        client: Client) -> None:
    given = [section(f"part{index}", hello_text(index + 1), cacheable=True)
             for index in range(6)] + [section("context_status", "now")]
    result = build(client, sections=given, format="anthropic")
    assert [(m["section"], m["index"], m["prefix_tokens"])
            for m in result["cache_breakpoints"]] == [
        ("part0", 0, 1), ("part1", 1, 4), ("part2", 2, 8), ("part5", 5, 26)]
    assert result["system"] == [
        {"type": "text", "text": hello_text(1), "cache_control": EPHEMERAL},
        {"type": "text", "text": hello_text(2), "cache_control": EPHEMERAL},
        {"type": "text", "text": hello_text(3), "cache_control": EPHEMERAL},
        {"type": "text", "text": hello_text(4)},
        {"type": "text", "text": hello_text(5)},
        {"type": "text", "text": hello_text(6), "cache_control": EPHEMERAL},
        {"type": "text", "text": "now"}]


def test_no_cacheable_section_no_breakpoint(client: Client) -> None:
    result = build(client, format="anthropic",
                   sections=[section("base_instructions", "Be brief.", cacheable=False),
                             section("notes", "x")])
    assert result["cache_breakpoints"] == []
    assert result["system"] == [{"type": "text", "text": "Be brief."},
                                {"type": "text", "text": "x"}]


def test_changing_dynamic_sections_keeps_the_cacheable_prefix_byte_identical(
        client: Client) -> None:
    static = [section("base_instructions", "You are a careful coding agent.\n"),
              section("project_rules", "Run tests with .venv/bin/pytest -q.\n"),
              section("skills", "Skill: git bisect — find the commit that broke it.")]
    first = build(client, format="anthropic", sections=[
        *static, section("scratchpad", "Plan: 1. reproduce"),
        section("context_status", "[Context: 12% used]")])
    second = build(client, format="anthropic", sections=[
        section("context_status", "[Context: 47% used, and much longer now]"),
        section("scratchpad", "Plan: 1. reproduce 2. bisect 3. fix — 東京"),
        *reversed(static)])
    assert first["cache_breakpoints"] == second["cache_breakpoints"]
    end = first["cache_breakpoints"][-1]["offset"]
    assert first["text"][:end].encode() == second["text"][:end].encode()
    assert first["text"] != second["text"]
    assert first["system"][:3] == second["system"][:3]
    assert first["system"][3:] != second["system"][3:]
    assert [s["tokens"] for s in first["sections"][:3]] \
        == [s["tokens"] for s in second["sections"][:3]]


def test_a_sessions_prompt_is_built_from_what_ctxd_knows(client: Client, sid: str) -> None:
    project = "p" + sid
    for params in [
        {"title": "Rule one", "content": "Pin TZ=UTC.", "scope": f"project:{project}"},
        {"title": "Elsewhere", "content": "Not this project.", "scope": "project:other"},
        {"title": "Rule two", "content": "Rebase before pushing.",
         "scope": f"project:{project}"}]:
        client.call("memory.record", params)
    client.call("session.open", {"session_id": sid, "project": project})
    client.call("message.append", {"session_id": sid, "messages": [
        {"role": "user", "content": hello_text(1000)}]})
    state = client.call("session.get", {"session_id": sid})["context_state"]
    # The project's memories (and the global ones, none in this module), not another's.
    memories = ("Memories from earlier work:\n- Rule one: Pin TZ=UTC.\n"
                "- Rule two: Rebase before pushing.")
    assert (state["total_tokens"], state["effective_window"]) == (3 + 1 + 1000, 191_808)
    status = "[Context: 1% used (1,004 of 191,808 tokens); health: ok.]"
    first = build(client, session_id=sid, format="anthropic")
    assert first["text"] == memories + "\n\n" + status
    assert first["system"] == [{"type": "text", "text": memories, "cache_control": EPHEMERAL},
                               {"type": "text", "text": status}]
    assert [(s["name"], s["cacheable"], s["tokens"]) for s in first["sections"]] == [
        ("memories", True, COUNTER.count(memories)),
        ("context_status", False, COUNTER.count(status))]
    client.call("message.append", {"session_id": sid, "messages": [
        {"role": "assistant", "content": hello_text(20_000)}]})
    second = build(client, session_id=sid)
    assert second["sections"][1]["tokens"] == first["sections"][1]["tokens"]
    assert second["text"].startswith(memories + "\n\n[Context: 11% used (21,008 of ")
    assert second["cache_breakpoints"] == first["cache_breakpoints"]


def test_a_session_without_memories_gets_its_status_alone(client: Client, sid: str) -> None:
    # No project: the global scope, where this module records nothing.
    client.call("session.open", {"session_id": sid})
    result = build(client, session_id=sid)
    assert result["text"] == "[Context: 0% used (0 of 191,808 tokens); health: ok.]"
    assert result["cache_breakpoints"] == []

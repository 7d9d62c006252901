"""Tool deferral against a real daemon: tools.register, what ctxd.render leaves out and in
which order, use from assistant messages, tools.search's ranking and promotion, the
tool_descriptions component of budget.measure, the tools.deferred event (the params'
checks: tests/unit/test_routes.py)."""

from __future__ import annotations

from typing import Any

import msgspec
from conftest import DaemonProcess
from tests_support import COUNTER, hello_text, next_event

from ctxclient import Client

# An effective window of 10,000 tokens: the default threshold (0.10) is 1,000 tokens.
BUDGET = {"context_window": 12_000, "max_output_tokens": 2_000}
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


def tool(name: str, source: str, words: str, padding: int = 250) -> dict[str, Any]:
    return {"name": name, "description": f"{words}. {hello_text(padding)}",
            "input_schema": SCHEMA, "source": source}


def tokens_of(definition: dict[str, Any]) -> int:
    """The counted form (docs/protocol.md, Tool deferral): the compact JSON of name,
    description and input_schema."""
    return COUNTER.count(msgspec.json.encode(
        {k: definition[k] for k in ("name", "description", "input_schema")}).decode())


TOOLS = [tool("read_file", "builtin", "Read a file from the workspace"),
         tool("github_create_issue", "mcp", "Create an issue in a GitHub repository"),
         tool("slack_post_message", "mcp", "Post a message to a Slack channel"),
         tool("skill_pdf_extract", "skill", "Extract the text of a PDF file"),
         tool("skill_chart_plot", "skill", "Plot a chart from a table"),
         tool("skill_sql_query", "skill", "Run an SQL query on a database")]
BY_NAME = {t["name"]: t for t in TOOLS}


def render(client: Client, sid: str) -> dict[str, Any]:
    return client.call("ctxd.render", {"session_id": sid})  # type: ignore[no-any-return]


def names(rendered: dict[str, Any]) -> list[str]:
    return [t["name"] for t in rendered["tools"]]


def note(count: int) -> str:
    return f"[{count} tools deferred to save context. Use tool_search to find them.]"


def test_deferral_order_use_search_promotion_and_budget(shared_daemon: DaemonProcess,
                                                        sid: str) -> None:
    counts = {t["name"]: tokens_of(t) for t in TOOLS}
    # Six tools of about 270 tokens: 1,000 fit three of them.
    assert 3 * max(counts.values()) <= 1_000 < 4 * min(counts.values())
    with shared_daemon.client() as client, shared_daemon.client() as watcher:
        client.call("session.open", {"session_id": sid, "budget": BUDGET})
        watcher.call("events.subscribe", {"session_id": sid, "types": ["tools.deferred"]})
        registered = client.call("tools.register", {"session_id": sid, "tools": TOOLS})
        # Both MCP tools go first, then the least recently used skill (never used: by name).
        deferred = ["github_create_issue", "slack_post_message", "skill_chart_plot"]
        assert registered == {
            "registered": [{"name": t["name"], "tokens": counts[t["name"]],
                            "replaced": False} for t in TOOLS],
            "total_tools": 6, "total_tokens": sum(counts.values()),
            "threshold_tokens": 1_000, "deferred": deferred}
        event = next_event(watcher)
        active = ["read_file", "skill_pdf_extract", "skill_sql_query"]
        assert (event["type"], event["data"]) == ("tools.deferred", {
            "count": 3, "names": deferred,
            "active_tokens": sum(counts[n] for n in active),
            "deferred_tokens": sum(counts[n] for n in deferred), "threshold_tokens": 1_000})
        rendered = render(client, sid)
        assert rendered["tools"] == [BY_NAME[n] for n in active]
        assert rendered["tool_tokens"] == sum(counts[n] for n in active)
        assert rendered["tools_note"] == note(3)
        assert rendered["messages"] == []  # the note is a field, not a message

        # budget.measure counts the active tools in tool_descriptions, with any given.
        measured = client.call("budget.measure", {"session_id": sid})
        assert measured["tool_descriptions"] == sum(counts[n] for n in active)
        extra = {"name": "x", "description": "y", "input_schema": {}}
        measured = client.call("budget.measure", {"session_id": sid,
                                                  "tool_definitions": [extra]})
        assert measured["tool_descriptions"] == sum(counts[n] for n in active) \
            + COUNTER.count(msgspec.json.encode(extra).decode())

        # An assistant message calls skill_chart_plot (a tool_use part) and
        # github_create_issue (OpenAI's meta.tool_calls): the chart skill is now the most
        # recently used skill, so skill_pdf_extract goes in its place; MCP tools still go
        # first, used or not.
        client.call("message.append", {"session_id": sid, "messages": [
            {"role": "user", "content": "plot it"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Plotting."},
                {"type": "tool_use", "id": "t1", "name": "skill_chart_plot", "input": {}}],
             "meta": {"tool_calls": [{"id": "c1", "type": "function",
                                      "function": {"name": "github_create_issue",
                                                   "arguments": "{}"}}]}}]})
        rendered = render(client, sid)
        assert names(rendered) == ["read_file", "skill_chart_plot", "skill_sql_query"]
        assert rendered["tools_note"] == note(3)
        event = next_event(watcher)
        assert event["data"]["names"] == ["github_create_issue", "slack_post_message",
                                          "skill_pdf_extract"]

        # tools.search ranks the deferred tools only, and promotes its matches.
        found = client.call("tools.search", {"session_id": sid, "limit": 2,
                                             "query": "Create a GitHub issue"})
        # github_create_issue: "create", "github", "issue" are words of its name (3 each)
        # and of its description (1 each), and so is "a" of its description (1); "a" is
        # a word of the other two deferred tools' descriptions, and the tie goes by name.
        assert found == {"matches": [{
            "name": "github_create_issue", "source": "mcp",
            "description": BY_NAME["github_create_issue"]["description"],
            "input_schema": SCHEMA, "score": 13.0,
            "tokens": counts["github_create_issue"]}, {
            "name": "skill_pdf_extract", "source": "skill",
            "description": BY_NAME["skill_pdf_extract"]["description"],
            "input_schema": SCHEMA, "score": 1.0,
            "tokens": counts["skill_pdf_extract"]}], "deferred": 3}
        # The promoted tools are in the next render; to stay under the threshold, the
        # other tools that can be deferred make room (MCP first, then skills by last use).
        rendered = render(client, sid)
        assert names(rendered) == ["read_file", "github_create_issue", "skill_pdf_extract"]
        assert rendered["tool_tokens"] == sum(counts[n] for n in names(rendered))
        assert rendered["tools_note"] == note(3)
        assert next_event(watcher)["data"]["names"] == ["slack_post_message",
                                                        "skill_chart_plot", "skill_sql_query"]
        # Promotion lasts until the next assistant message: unused, they go back out.
        client.call("message.append", {"session_id": sid, "messages": [
            {"role": "assistant", "content": "Done."}]})
        assert names(render(client, sid)) == ["read_file", "skill_chart_plot",
                                              "skill_sql_query"]


def test_below_the_threshold_nothing_is_deferred_and_a_name_is_replaced(
        shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})  # 200,000 - 32,000: 16,800
        assert render(client, sid)["tools"] == []
        client.call("tools.register", {"session_id": sid, "tools": TOOLS[:3]})
        shorter = tool("github_create_issue", "skill", "Open an issue", padding=1)
        again = client.call("tools.register", {"session_id": sid, "tools": [shorter]})
        assert again["registered"] == [{"name": "github_create_issue",
                                        "tokens": tokens_of(shorter), "replaced": True}]
        assert (again["total_tools"], again["deferred"]) == (3, [])
        rendered = render(client, sid)
        # The replaced tool keeps its place.
        assert rendered["tools"] == [TOOLS[0], shorter, TOOLS[2]]
        assert rendered["tools_note"] is None
        assert rendered["tool_tokens"] == tokens_of(TOOLS[0]) + tokens_of(shorter) \
            + tokens_of(TOOLS[2])
        # Nothing is deferred: a search finds nothing to promote.
        assert client.call("tools.search", {"session_id": sid, "query": "issue"}) == {
            "matches": [], "deferred": 0}

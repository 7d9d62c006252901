"""The providers' own message shapes against a real daemon (docs/protocol.md, "Provider
shapes"): OpenAI's assistant ``tool_calls`` and ``tool`` messages, Anthropic's ``tool_use``
and ``tool_result`` blocks, appended as given and rendered back exactly; each render one
that the provider's API takes (checked by the gateway's own rules and, for Anthropic, sent
with the real SDK to the scripted Messages API); offloaded and cleared results still
answering their calls; bad shapes refused with what to fix."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import DaemonProcess
from mock_anthropic import MockAnthropic, text
from tests_support import rpc_error

from ctxclient import Client
from ctxd.gateway import _anthropic, _openai

SYSTEM = "You are a careful coding agent."
ARGS = '{"cmd": "seq 1 3000"}'
"""Arguments as a model writes them (not compact JSON): they render back as written."""
OUTPUT = "".join(f"{i}\n" for i in range(1, 3001))
"""A tool's output over the offload threshold (4,096 bytes)."""

OPENAI = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "How many numbers does seq 1 3000 print?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "bash", "arguments": ARGS}},
        {"id": "call_2", "type": "function",
         "function": {"name": "read_file", "arguments": '{"path":"README.md"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "3000"},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "# ctxd"}]},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_3", "type": "function",
         "function": {"name": "bash", "arguments": "not json"}}]},
    {"role": "tool", "tool_call_id": "call_3", "content": "error: bad arguments"},
    {"role": "assistant", "content": "It prints 3000 numbers."},
]

ANTHROPIC = [
    {"role": "user", "content": "How many numbers does seq 1 3000 print?"},
    {"role": "assistant", "content": [
        {"type": "text", "text": "Let me run it."},
        {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"cmd": "seq 1 3000"}},
        {"type": "tool_use", "id": "toolu_2", "name": "bash", "input": {"cmd": "false"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3000",
         "cache_control": {"type": "ephemeral"}},
        {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
         "content": [{"type": "text", "text": "exit status 1"}]},
        {"type": "text", "text": "Why did the second fail?"}]},
    {"role": "assistant", "content": "false always fails."},
    {"role": "user", "content": "Thanks."},
]


def open_session(client: Client, sid: str, **budget: int) -> None:
    client.call("session.open", {"session_id": sid, **({"budget": budget} if budget else {})})


def render(client: Client, sid: str, form: str) -> dict[str, Any]:
    return client.call("ctxd.render", {"session_id": sid, "format": form})  # type: ignore[no-any-return]


def test_openai_messages_round_trip_exactly_and_are_recorded_in_ctxd_form(
        shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        open_session(client, sid)
        appended = client.call("message.append", {"session_id": sid, "messages": OPENAI})
        assert len(appended["appended"]) == len(OPENAI)
        openai = render(client, sid, "openai")
        assert openai["messages"] == OPENAI
        assert openai["system"] is None
        assert _openai.problems(openai["messages"]) == []
        plain = client.call("ctxd.render", {"session_id": sid})
        assert openai["tokens"] == plain["tokens"]
        assert plain["messages"][2] == {"role": "assistant", "content": [
            {"type": "tool_use", "id": "call_1", "name": "bash",
             "input": {"cmd": "seq 1 3000"}},
            {"type": "tool_use", "id": "call_2", "name": "read_file",
             "input": {"path": "README.md"}}]}
        assert plain["messages"][3] == {"role": "tool", "content": "3000", "name": "bash",
                                        "tool_call_id": "call_1"}
        stored = client.call("message.list", {"session_id": sid})["messages"]
        assert stored[2]["meta"] == {"shape": {"arguments": {"call_1": ARGS}}}
        assert stored[5]["meta"] == {"shape": {"content": "", "arguments": {
            "call_3": "not json"}}}
        anthropic_form = render(client, sid, "anthropic")
        assert anthropic_form["system"] == SYSTEM
        assert _anthropic.problems(anthropic_form["messages"]) == []
        assert anthropic_form["messages"][1] == {"role": "assistant", "content": [
            {"type": "tool_use", "id": "call_1", "name": "bash",
             "input": {"cmd": "seq 1 3000"}},
            {"type": "tool_use", "id": "call_2", "name": "read_file",
             "input": {"path": "README.md"}}]}
        assert anthropic_form["messages"][2] == {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": "3000"},
            {"type": "tool_result", "tool_use_id": "call_2",
             "content": [{"type": "text", "text": "# ctxd"}]}]}
        assert anthropic_form["messages"][3]["content"] == [
            {"type": "tool_use", "id": "call_3", "name": "bash",
             "input": {"arguments": "not json"}}]


def test_anthropic_messages_round_trip_exactly_and_the_sdk_sends_them(
        shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        open_session(client, sid)
        given = [{"role": "system", "content": SYSTEM}, *ANTHROPIC]
        appended = client.call("message.append", {"session_id": sid, "messages": given})
        # The user turn with two results and a question is recorded as three messages.
        assert len(appended["appended"]) == len(given) + 2
        rendered = render(client, sid, "anthropic")
        assert rendered["system"] == SYSTEM
        assert rendered["messages"] == ANTHROPIC
        stored = client.call("message.list", {"session_id": sid})["messages"]
        assert [(m["role"], m.get("tool_call_id"), m.get("name")) for m in stored[3:6]] == [
            ("tool", "toolu_1", "bash"), ("tool", "toolu_2", "bash"), ("user", None, None)]
        assert stored[4]["meta"] == {"is_error": True}
        openai = render(client, sid, "openai")
        assert _openai.problems(openai["messages"]) == []
        assert openai["messages"][2:6] == [
            {"role": "assistant", "content": "Let me run it.", "tool_calls": [
                {"id": "toolu_1", "type": "function",
                 "function": {"name": "bash", "arguments": '{"cmd":"seq 1 3000"}'}},
                {"id": "toolu_2", "type": "function",
                 "function": {"name": "bash", "arguments": '{"cmd":"false"}'}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "3000"},
            {"role": "tool", "tool_call_id": "toolu_2",
             "content": [{"type": "text", "text": "exit status 1"}]},
            {"role": "user", "content": [{"type": "text", "text": "Why did the second fail?"}]}]

    import anthropic  # 1 s of CPU to import: only for the test that sends with it

    # Closed by its block: a client left to the garbage collector closes its pooled
    # connection from whatever test runs then, as an unclosed socket's ResourceWarning.
    with (MockAnthropic([[text("Glad to help.")]]) as server,
          anthropic.Anthropic(base_url=server.origin, api_key="test") as client):
        reply = client.messages.create(
            model="claude-test", max_tokens=100, system=rendered["system"],
            messages=rendered["messages"], tools=[{
                "name": "bash", "description": "Run a command",
                "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}])
    assert reply.content[0].text == "Glad to help."  # type: ignore[union-attr]
    [(path, body)] = server.requests
    assert path == "/v1/messages"
    assert body["system"] == SYSTEM
    assert body["messages"] == ANTHROPIC


def test_native_results_offloaded_and_cleared_still_answer_their_calls(
        shared_daemon: DaemonProcess, sid: str) -> None:
    """An offloaded result renders as its stub under its call's id, in both shapes; a
    compaction that clears old results keeps every call answered."""
    filler = " ".join(f"word{i}" for i in range(500))  # about 3.4 KB: inline, clearable
    with shared_daemon.client() as client:
        open_session(client, sid, context_window=12_000, max_output_tokens=1_000)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Go."}]
        for i in range(8):
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function",
                 "function": {"name": "bash", "arguments": ARGS}}]})
            messages.append({"role": "tool", "tool_call_id": f"call_{i}",
                             "content": OUTPUT if i == 0 else filler})
        appended = client.call("message.append", {"session_id": sid, "messages": messages})
        assert appended["compactions"] == []
        ref = appended["appended"][2]["ref_id"]
        assert ref.startswith("res_")
        openai = render(client, sid, "openai")
        stub = openai["messages"][2]
        assert stub["role"] == "tool"
        assert stub["tool_call_id"] == "call_0"
        assert ref in stub["content"]
        assert OUTPUT not in stub["content"]
        assert len(stub["content"]) < 1_000
        assert _openai.problems(openai["messages"]) == []
        anthropic_form = render(client, sid, "anthropic")
        assert anthropic_form["messages"][2]["content"][0]["tool_use_id"] == "call_0"
        assert ref in anthropic_form["messages"][2]["content"][0]["content"]
        assert client.call("result.read", {"ref_id": ref})["content"] == OUTPUT[:8000]

        done = client.call("context.compact", {"session_id": sid, "strategies": ["clear"]})
        assert (done["cleared"], done["before_msgs"], done["after_msgs"]) == (2, 17, 17)
        openai = render(client, sid, "openai")
        assert _openai.problems(openai["messages"]) == []
        results = [m for m in openai["messages"] if m["role"] == "tool"]
        assert [m["tool_call_id"] for m in results] == [f"call_{i}" for i in range(8)]
        assert [m["content"] == filler for m in results] == [False] * 2 + [True] * 6
        assert ref in results[0]["content"]
        assert OUTPUT not in results[0]["content"]
        assert filler not in results[1]["content"]
        assert "res_" in results[1]["content"]
        assert _anthropic.problems(render(client, sid, "anthropic")["messages"]) == []


@pytest.mark.parametrize(("message", "path", "reason"), [
    ({"role": "user", "content": "hi", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
     "$.messages[0].tool_calls", "only an assistant message makes tool calls"),
    ({"role": "assistant", "content": None, "tool_calls": []},
     "$.messages[0].tool_calls", "is empty; leave it out"),
    ({"role": "assistant", "content": None},
     "$.messages[0].content", "only an assistant message with tool_calls may leave it null"),
    ({"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "c", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
     "$.messages[0].tool_calls[1].id", "call id 'c' is given twice"),
    ({"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]},
     "$.messages[0].content[0].input", "a tool_use part's input must be an object"),
    ({"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
     "$.messages[0].role", "tool_result blocks go in a user message"),
    ({"role": "user", "content": [{"type": "tool_result", "content": "x"}]},
     "$.messages[0].content[0].tool_use_id", "a tool_result block needs the tool_use_id"),
    ({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                   "is_error": "yes"}]},
     "$.messages[0].content[0].is_error", "must be true or false"),
])
def test_a_bad_shape_is_refused_with_what_to_fix(
        shared_daemon: DaemonProcess, sid: str, message: dict[str, Any], path: str,
        reason: str) -> None:
    with shared_daemon.client() as client:
        open_session(client, sid)
        error = rpc_error(client, "message.append", {"session_id": sid, "messages": [message]})
        assert error.code == -32602
        assert error.data["path"] == path
        assert reason in error.data["reason"]
        assert client.call("message.list", {"session_id": sid})["messages"] == []


def test_a_tool_call_without_its_type_is_refused(shared_daemon: DaemonProcess,
                                                  sid: str) -> None:
    with shared_daemon.client() as client:
        open_session(client, sid)
        error = rpc_error(client, "message.append", {"session_id": sid, "messages": [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c", "function": {"name": "f", "arguments": json.dumps({})}}]}]})
        assert error.code == -32602
        assert error.data["path"] == "$.messages[0].tool_calls[0]"
        assert "type" in error.data["reason"]

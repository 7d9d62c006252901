"""The providers' message shapes as pure functions (ctxd/transcripts/_providers.py): the
cases a daemon's round trip does not reach."""

from __future__ import annotations

from typing import Any

import msgspec

from ctxd.gateway import _anthropic, _openai
from ctxd.transcripts import anthropic_messages, openai_messages, recorded
from ctxd.wire.types import AppendMessage, RenderedMessage

_decode = msgspec.json.Decoder(list[AppendMessage]).decode


def rows(messages: list[dict[str, Any]]) -> list[tuple[RenderedMessage, Any]]:
    """The messages recorded, as a render reads them back (message and meta)."""
    made = recorded(_decode(msgspec.json.encode(messages)))
    return [(RenderedMessage(role=m.role, content=m.content, name=m.name,
                             tool_call_id=m.tool_call_id), m.meta) for m in made]


CALL = {"id": "call_1", "type": "function",
        "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}


def test_openai_content_left_out_or_given_as_parts_comes_back_as_given() -> None:
    given = [{"role": "user", "content": "go"},
             {"role": "assistant", "tool_calls": [CALL]},
             {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
             {"role": "assistant", "content": [{"type": "text", "text": "and"}],
              "tool_calls": [{**CALL, "id": "call_2"}]},
             {"role": "tool", "tool_call_id": "call_2", "content": "b.py"}]
    assert openai_messages(rows(given)) == given


def test_the_calls_a_client_kept_in_meta_render_as_tool_calls() -> None:
    """The shape that failed a newcomer: an empty assistant message with its calls in
    ``meta.tool_calls``, then the tool's result."""
    given = [{"role": "user", "content": "go"},
             {"role": "assistant", "content": "", "meta": {"tool_calls": [CALL]}},
             {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
             {"role": "assistant", "content": "Listing.",
              "meta": {"tool_calls": [{"id": "call_2", "name": "bash"}]}},
             {"role": "tool", "tool_call_id": "call_2", "content": "b.py"}]
    openai = openai_messages(rows(given))
    assert openai[1] == {"role": "assistant", "content": None, "tool_calls": [CALL]}
    assert openai[3] == {"role": "assistant", "content": "Listing.", "tool_calls": [
        {"id": "call_2", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}
    assert _openai.problems(openai) == []
    system, anthropic = anthropic_messages(rows(given))
    assert system is None
    assert anthropic[1] == {"role": "assistant", "content": [
        {"type": "tool_use", "id": "call_1", "name": "bash", "input": {"cmd": "ls"}}]}
    assert _anthropic.problems(anthropic) == []


def test_arguments_kept_as_written_yield_to_an_input_that_changed() -> None:
    """A compaction that clears a call's input writes a new message: the arguments kept
    as written no longer match it, and its compact JSON is sent instead."""
    [(assistant, meta)] = rows([{"role": "assistant", "content": None,
                                 "tool_calls": [CALL]}])
    assert meta == {"shape": {"arguments": {"call_1": '{"cmd": "ls"}'}}}
    assert isinstance(assistant.content, list)
    cleared = msgspec.structs.replace(assistant, content=[
        {**assistant.content[0], "input": {"cmd": "[cleared]"}}])
    [rendered] = openai_messages([(cleared, meta)])
    assert rendered["tool_calls"][0]["function"]["arguments"] == '{"cmd":"[cleared]"}'


def test_a_branch_opening_and_later_system_text_alternate_in_the_anthropic_render() -> None:
    given = [{"role": "system", "content": "Be brief."},
             {"role": "system", "content": [{"type": "text", "text": "Use the shell."}]},
             {"role": "user", "content": "Fix it."},
             {"role": "assistant", "content": "On it."},
             {"role": "system", "content": "Branch mode."},
             {"role": "user", "content": "Find the bug."}]
    system, messages = anthropic_messages(rows(given))
    assert system == "Be brief.\n\nUse the shell."
    assert messages == [
        {"role": "user", "content": "Fix it."},
        {"role": "assistant", "content": "On it."},
        {"role": "user", "content": [{"type": "text", "text": "Branch mode."},
                                     {"type": "text", "text": "Find the bug."}]}]

"""OpenAI Chat Completions' ``messages``, as pure functions: their shape checked, their
recorded form, a tool message's substitution, and the rules a valid request keeps
(docs/architecture.md, Gateway). Parts and fields ctxd does not change pass on as given."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec

from ctxd.errors import params_error
from ctxd.gateway._blocks import ToolResult, bare, content_text, marked
from ctxd.hygiene import clear_inputs
from ctxd.transcripts import call_part
from ctxd.wire.types import MessageIn

__all__ = ["ToolResult", "bare", "body_with", "calls", "cleared_inputs", "counted", "is_system",
           "marked",
           "messages_of", "problems", "result_end", "results", "summary_message",
           "system_and_tools", "to_ctxd", "with_note", "with_result"]

_encode = msgspec.json.Encoder().encode
ROLES = ("system", "developer", "user", "assistant", "tool")


def messages_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's messages, their shape checked as far as ctxd reads them.

    Raises:
        CtxdError: -32602 naming the first part that is not as the API defines it.
    """
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise params_error("$.messages", "must be a list of messages")
    for i, message in enumerate(messages):
        where = f"$.messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise params_error(where, f"must be an object whose role is one of {ROLES}")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise params_error(f"{where}.content", "must be a string, a list or null")
        if isinstance(content, list) and not all(
                isinstance(part, dict) and isinstance(part.get("type"), str)
                for part in content):
            raise params_error(f"{where}.content", "each part must have a string type")
        if message["role"] == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise params_error(f"{where}.tool_call_id", "a tool message needs one")
        tool_calls = message.get("tool_calls")
        if message["role"] == "assistant" and tool_calls is not None:
            if not isinstance(tool_calls, list) or not all(
                    isinstance(call, dict) and isinstance(call.get("id"), str)
                    and isinstance(call.get("function"), dict)
                    and isinstance(call["function"].get("name"), str)
                    for call in tool_calls):
                raise params_error(f"{where}.tool_calls",
                                   "each call needs a string id and function.name")
    return messages


def _parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content) if isinstance(content, list) else []


def calls(message: dict[str, Any]) -> list[tuple[str, str]]:
    """(id, name) of each tool call of an assistant message."""
    if message.get("role") != "assistant":
        return []
    return [(call["id"], call["function"]["name"]) for call in message.get("tool_calls") or ()]


def to_ctxd(messages: list[dict[str, Any]], start: int) -> list[list[MessageIn]]:
    """Each message from ``start`` on as ctxd records it: system and developer messages
    as system ones, an assistant's text and tool calls as parts (``tool_use``, as every
    other door records them), a tool message as a tool message named after its call."""
    names = dict(call for message in messages[:start] for call in calls(message))
    recorded: list[list[MessageIn]] = []
    for position, message in enumerate(messages[start:], start):
        meta = {"source": {"format": "gateway", "api": "openai", "position": position}}
        role = message["role"]
        content = message.get("content")
        if role in ("system", "developer", "user"):
            recorded.append([MessageIn(role="user" if role == "user" else "system",
                                       content=content if isinstance(content, str | list)
                                       else "", meta=meta)])
        elif role == "assistant":
            parts = _parts(content)
            for call in message.get("tool_calls") or ():
                names[call["id"]] = call["function"]["name"]
                parts.append(call_part(call["id"], call["function"]["name"],
                                       call["function"].get("arguments")))
            recorded.append([MessageIn(role="assistant", content=parts, meta=meta)])
        else:
            call_id = message["tool_call_id"]
            text = content_text(content)
            recorded.append([MessageIn(
                role="tool", content=text if text is not None else _parts(content),
                tool_call_id=call_id[:256], name=names.get(call_id, "tool")[:256],
                meta=meta)])
    return recorded


def results(message: dict[str, Any]) -> list[ToolResult]:
    """The tool result a tool message is."""
    if message.get("role") != "tool":
        return []
    return [ToolResult(index=-1, call_id=message["tool_call_id"],
                       content=message.get("content"), is_error=False)]


def cleared_inputs(message: dict[str, Any], ref_id: str, tools: frozenset[str],
                   stored: Callable[[str], str] | None) -> tuple[dict[str, Any], str] | None:
    """An assistant message with the large arguments of its calls of ``tools`` cleared
    (`clear_inputs` over each call's arguments as an object: the markers name ``ref_id``;
    ``stored``, what the blob keeps of each), and the blob text they make; None when
    there is none. Only a call that changed has its arguments written again (as JSON)."""
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or not isinstance(calls, list):
        return None
    parts: list[dict[str, Any]] = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else None
        except ValueError:
            parsed = None
        name = function.get("name") if isinstance(function, dict) else None
        parts.append({"type": "tool_use", "input": parsed}
                     if isinstance(parsed, dict) and name in tools else {"type": "text"})
    cleared = clear_inputs(parts, [k for k, part in enumerate(parts)
                                   if part["type"] == "tool_use"], ref_id, stored)
    if cleared is None:
        return None
    written = [{**call, "function": {**call["function"], "arguments": json.dumps(
        new["input"], ensure_ascii=False)}} if new != old else call
        for call, old, new in zip(calls, parts, cleared[0], strict=True)]
    return {**message, "tool_calls": written}, cleared[1]


def with_result(message: dict[str, Any], index: int, text: str) -> dict[str, Any]:
    """The tool message holding ``text`` instead."""
    return {**message, "content": text}


def result_end(messages: list[dict[str, Any]], position: int) -> int:
    """The last tool message after ``position`` (``position`` itself when none follows)."""
    end = position
    while end + 1 < len(messages) and messages[end + 1]["role"] == "tool":
        end += 1
    return end


def is_system(message: dict[str, Any]) -> bool:
    """Whether the message is part of the system prompt."""
    return message["role"] in ("system", "developer")


def summary_message(text: str) -> dict[str, Any]:
    """The user message that stands for a compacted span."""
    return {"role": "user", "content": text}


def with_note(message: dict[str, Any], text: str) -> dict[str, Any] | None:
    """A user message with ``text`` added as a last text part (None: not a user's)."""
    if message["role"] != "user":
        return None
    return {**message, "content": [*_parts(message.get("content")),
                                   {"type": "text", "text": text}]}


def counted(message: dict[str, Any]) -> MessageIn:
    """The message as ctxd's token counter takes it: its content and its tool calls'
    JSON."""
    parts = _parts(message.get("content")) + list(message.get("tool_calls") or ())
    return MessageIn(role="system" if is_system(message) else message["role"],
                     content=parts, tool_call_id=message.get("tool_call_id"))


def system_and_tools(body: dict[str, Any]) -> tuple[MessageIn | None, list[str]]:
    """No system prompt outside the messages; each tool definition's JSON."""
    tools = body.get("tools")
    return None, [_encode(tool).decode() for tool in tools] if isinstance(tools, list) else []


def problems(messages: list[dict[str, Any]]) -> list[str]:
    """Why the API would refuse these messages (nothing: it would take them): each
    assistant's tool calls answered, all and only them, by the tool messages right after
    it, and no other tool message."""
    found = []
    if not messages:
        return ["no messages"]
    i = 0
    while i < len(messages):
        called = [call_id for call_id, _ in calls(messages[i])]
        if messages[i]["role"] == "tool":
            found.append(f"tool message {i} answers no call")
        end = result_end(messages, i) if called else i
        answered = [messages[j]["tool_call_id"] for j in range(i + 1, end + 1)]
        if called and end + 1 < len(messages) and sorted(called) != sorted(answered):
            found.append(f"the tool calls of message {i} are not answered right after it")
        i = end + 1
    return found


def body_with(body: dict[str, Any], messages: list[dict[str, Any]] | msgspec.Raw
              ) -> bytes:
    """The request's JSON with these messages."""
    return _encode({**body, "messages": messages})

"""The Anthropic Messages API's ``messages``, as pure functions: their shape checked, their
recorded form (Claude Code's conversion, ctxd/transcripts), a tool result's substitution,
and the rules a valid request keeps (docs/architecture.md, Gateway).

Blocks ctxd does not change — thinking with its signature, ``server_tool_use``,
``web_search_tool_result``, images, documents, any type it does not know — are passed on
as the agent gave them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import msgspec

from ctxd.errors import params_error
from ctxd.gateway._blocks import ToolResult, bare, marked
from ctxd.hygiene import clear_inputs
from ctxd.sessions import read_inside
from ctxd.transcripts import ClaudeCodeParser, saved_output
from ctxd.wire.types import MessageIn

__all__ = ["ToolResult", "bare", "body_with", "calls", "cleared_inputs", "counted", "is_system",
           "marked",
           "messages_of", "problems", "result_end", "results", "summary_message",
           "system_and_tools", "to_ctxd", "with_note", "with_result"]

_encode = msgspec.json.Encoder().encode
ROLES = ("user", "assistant", "system")
"""A message's roles (Claude Code sends system messages among the others: its
environment, reminders)."""


def messages_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's messages, their shape checked as far as ctxd reads them.

    Raises:
        CtxdError: -32602 naming the first part that is not as the API defines it.
    """
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise params_error("$.messages", "must be a list of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise params_error(f"$.messages[{i}]",
                               f"must be an object whose role is one of {ROLES}")
        content = message.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise params_error(f"$.messages[{i}].content", "must be a string or a list")
        for j, block in enumerate(content):
            where = f"$.messages[{i}].content[{j}]"
            if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                raise params_error(where, "must be an object with a string type")
            kind = block["type"]
            if kind == "tool_use" and not (isinstance(block.get("id"), str)
                                           and isinstance(block.get("name"), str)):
                raise params_error(where, "a tool_use needs a string id and name")
            if kind == "tool_result" and not isinstance(block.get("tool_use_id"), str):
                raise params_error(where, "a tool_result needs a string tool_use_id")
    return messages


def to_ctxd(messages: list[dict[str, Any]], start: int) -> list[list[MessageIn]]:
    """Each message from ``start`` on as ctxd records it, by Claude Code's conversion: a
    user message's tool results first, one tool message each in block order, then its
    other blocks as one user message; an assistant's text and tool calls (thinking is not
    recorded)."""
    parser = ClaudeCodeParser()
    parser.tool_names.update(call for message in messages[:start] for call in calls(message))
    recorded = []
    for position, message in enumerate(messages[start:], start):
        source = {"format": "gateway", "api": "anthropic", "position": position}
        if is_system(message):
            recorded.append([MessageIn(role="system", content=bare(message)["content"],
                                       meta={"source": source})])
            continue
        entry = parser.parse_record({"type": message["role"], "message": message},
                                    position + 1, position + 1)
        recorded.append([msgspec.structs.replace(m, meta={**(m.meta or {}), "source": source})
                         for m in entry.messages])
    return recorded


def results(message: dict[str, Any]) -> list[ToolResult]:
    """The tool results a user message carries, in block order."""
    content = message.get("content")
    if message.get("role") != "user" or not isinstance(content, list):
        return []
    return [ToolResult(index=index, call_id=block["tool_use_id"],
                       content=block.get("content"), is_error=block.get("is_error") is True)
            for index, block in enumerate(content) if block.get("type") == "tool_result"]


def with_result(message: dict[str, Any], index: int, text: str) -> dict[str, Any]:
    """The message with the tool result at block ``index`` holding ``text`` instead."""
    content = list(message["content"])
    content[index] = {**content[index], "content": text}
    return {**message, "content": content}


def cleared_inputs(message: dict[str, Any], ref_id: str, tools: frozenset[str],
                   stored: Callable[[str], str] | None) -> tuple[dict[str, Any], str] | None:
    """An assistant message with the large arguments of its calls of ``tools`` cleared
    (`clear_inputs`: the markers name ``ref_id``; ``stored``, what the blob keeps of
    each), and the blob text they make; None when there is none."""
    content = message.get("content")
    if message.get("role") != "assistant" or not isinstance(content, list):
        return None
    cleared = clear_inputs(content, [index for index, block in enumerate(content)
                                     if isinstance(block, dict)
                                     and block.get("type") == "tool_use"
                                     and block.get("name") in tools
                                     and isinstance(block.get("input"), dict)], ref_id, stored)
    return None if cleared is None else ({**message, "content": cleared[0]}, cleared[1])


def calls(message: dict[str, Any]) -> list[tuple[str, str]]:
    """(id, name) of each tool call of an assistant message."""
    content = message.get("content")
    if message.get("role") != "assistant" or not isinstance(content, list):
        return []
    return [(block["id"], block["name"]) for block in content
            if block.get("type") == "tool_use"]


def result_end(messages: list[dict[str, Any]], position: int) -> int:
    """The last message that carries the results of the calls at ``position``."""
    return position + 1


def is_system(message: dict[str, Any]) -> bool:
    """Whether the message is part of the system prompt (a system message among the
    others; the ``system`` field is counted by itself)."""
    return bool(message["role"] == "system")


def summary_message(text: str) -> dict[str, Any]:
    """The user message that stands for a compacted span."""
    return {"role": "user", "content": text}


def with_note(message: dict[str, Any], text: str) -> dict[str, Any] | None:
    """A user message with ``text`` added as a last text block (None: not a user
    message, it cannot carry one)."""
    if message.get("role") != "user":
        return None
    content = message["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    return {**message, "content": [*blocks, {"type": "text", "text": text}]}


def counted(message: dict[str, Any]) -> MessageIn:
    """The message as ctxd's token counter takes it (a block that is not text counts as
    its JSON)."""
    return MessageIn(role=message["role"], content=message["content"])


def system_and_tools(body: dict[str, Any]) -> tuple[MessageIn | None, list[str]]:
    """The system prompt (as a system message) and each tool definition's JSON."""
    system = body.get("system")
    tools = body.get("tools")
    return (MessageIn(role="system", content=system)
            if isinstance(system, str | list) and system else None,
            [_encode(tool).decode() for tool in tools] if isinstance(tools, list) else [])


def _ids(message: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The ids of the tool calls an assistant message makes, or those a user message
    answers."""
    content = message["content"]
    if not isinstance(content, list):
        return [], []
    kind, key = (("tool_use", "id") if message["role"] == "assistant"
                 else ("tool_result", "tool_use_id"))
    ids = [block[key] for block in content if block["type"] == kind]
    return (ids, []) if message["role"] == "assistant" else ([], ids)


def problems(messages: list[dict[str, Any]]) -> list[str]:
    """Why the API would refuse these messages (nothing: it would take them): the first
    is a user's, roles alternate, and each assistant's tool calls are answered, all and
    only them, by the next message (system messages aside)."""
    # System messages stand between the others without breaking their order.
    messages = [message for message in messages if not is_system(message)]
    if not messages:
        return ["no messages"]
    found = []
    if messages[0]["role"] != "user":
        found.append("the first message is not a user's")
    ids = [_ids(message) for message in messages]
    for i, message in enumerate(messages):
        if i and message["role"] == messages[i - 1]["role"]:
            found.append(f"messages {i - 1} and {i} are both {message['role']}'s")
        called, answered = ids[i]
        if called and i + 1 < len(messages) and sorted(called) != sorted(ids[i + 1][1]):
            found.append(f"the tool calls of message {i} are not answered by message {i + 1}")
        if answered and (i == 0 or not ids[i - 1][0]):
            found.append(f"message {i} answers tool calls that message {i - 1} did not make")
    return found


def body_with(body: dict[str, Any], messages: list[dict[str, Any]] | msgspec.Raw
              ) -> bytes:
    """The request's JSON with these messages."""
    return _encode({**body, "messages": messages})


SAVED_OUTPUT_MAX_BYTES = 4 << 20
"""The largest output read back from the file Claude Code saved it to (as the hook's)."""


def saved_output_of(text: str, session_id: str) -> str | None:
    """The whole output behind a ``<persisted-output>`` preview in a tool result of Claude
    Code's session ``session_id``: the file it names, read only when it is Claude Code's
    own file of that session (``<session_id>/tool-results/`` inside ``$CLAUDE_CONFIG_DIR``,
    else ``~/.claude``), a regular file of at most `SAVED_OUTPUT_MAX_BYTES` that begins with
    the preview. A tool's output that imitates the preview cannot name another file.
    Blocking: run it in a thread."""
    root = os.environ.get("CLAUDE_CONFIG_DIR") or os.path.join(os.path.expanduser("~"),
                                                               ".claude")

    def read(path: str) -> str | None:
        folder = os.path.dirname(path)
        if (os.path.basename(folder) != "tool-results"
                or os.path.basename(os.path.dirname(folder)) != session_id):
            return None
        return read_inside(path, root, SAVED_OUTPUT_MAX_BYTES)

    return saved_output(text, read)

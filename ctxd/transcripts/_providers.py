"""The providers' message shapes: OpenAI Chat Completions' and Anthropic Messages' messages
as ctxd records them, and ctxd's messages rendered back in either (docs/protocol.md,
"Provider shapes").

ctxd records one form, whatever the shape given: an assistant's tool calls are content
parts of type ``tool_use`` (``id``, ``name``, ``input``), each tool result is a ``tool``
message with the call's ``tool_call_id`` (the form every other door records: the gateway,
the importers), so offloading, clearing and compaction treat every shape alike. What that
form cannot say of a message as given (an OpenAI ``content`` left out or empty, arguments
not written as compact JSON, a ``tool_result`` block's other keys) is kept in its
``meta.shape``, so that a message renders back in its own shape exactly as it was given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from ctxd.errors import params_error
from ctxd.wire.types import AppendMessage, Content, MessageIn, RenderedMessage, ToolDefinition

__all__ = ["SHAPE", "anthropic_messages", "anthropic_tools", "call_part", "decoded_arguments",
           "openai_messages", "openai_tools", "recorded"]

SHAPE = "shape"
"""The ``meta`` key that keeps what ctxd's form leaves out of a message as given."""
_RESULT_KEYS = frozenset({"type", "tool_use_id", "content", "is_error"})
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def decoded_arguments(arguments: str) -> Any:
    """An OpenAI tool call's ``arguments`` as a call part's ``input``: the JSON they hold,
    or the text itself when it is not JSON (a model may write broken JSON)."""
    try:
        return _decode(arguments)
    except msgspec.DecodeError:
        return arguments


def call_part(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """An OpenAI tool call as the ``tool_use`` part ctxd records: its ``arguments``
    (`decoded_arguments` when they are text) as the ``input``."""
    return {"type": "tool_use", "id": call_id, "name": name,
            "input": decoded_arguments(arguments) if isinstance(arguments, str) else arguments}


def _ids_and_names(content: Any) -> list[tuple[str, str]]:
    return [(part["id"], part["name"]) for part in content
            if part.get("type") == "tool_use"] if isinstance(content, list) else []


def _tool_use(where: str, part: dict[str, Any]) -> None:
    if not (isinstance(part.get("id"), str) and 0 < len(part["id"]) <= 256):
        raise params_error(f"{where}.id", "a tool_use part needs an id of 1-256 characters")
    if not (isinstance(part.get("name"), str) and 0 < len(part["name"]) <= 256):
        raise params_error(f"{where}.name",
                           "a tool_use part needs the tool's name (1-256 characters)")
    if not isinstance(part.get("input"), dict):
        raise params_error(f"{where}.input", "a tool_use part's input must be an object")


def _tool_result(where: str, part: dict[str, Any]) -> None:
    call_id = part.get("tool_use_id")
    if not (isinstance(call_id, str) and 0 < len(call_id) <= 256):
        raise params_error(f"{where}.tool_use_id",
                           "a tool_result block needs the tool_use_id (1-256 characters) "
                           "of the call it answers")
    content = part.get("content")
    if "content" in part and not (isinstance(content, str) or (isinstance(content, list) and all(
            isinstance(block, dict) and isinstance(block.get("type"), str)
            for block in content))):
        raise params_error(f"{where}.content", "a tool_result's content is a string or a "
                                               "list of blocks, each with a string type")
    if "is_error" in part and not isinstance(part["is_error"], bool):
        raise params_error(f"{where}.is_error", "must be true or false")


def _with_shape(meta: dict[str, Any] | None, shape: dict[str, Any]) -> dict[str, Any] | None:
    return {**(meta or {}), SHAPE: shape} if shape else meta


def _openai_call(i: int, message: AppendMessage) -> MessageIn:
    """An assistant message with OpenAI ``tool_calls``, as ctxd records it."""
    where = f"$.messages[{i}]"
    calls = message.tool_calls or []
    if message.role != "assistant":
        raise params_error(f"{where}.tool_calls",
                           "only an assistant message makes tool calls; a tool's result "
                           "is a tool message with the call's tool_call_id")
    if not calls:
        raise params_error(f"{where}.tool_calls", "is empty; leave it out")
    shape: dict[str, Any] = {}
    parts: list[dict[str, Any]] = []
    content = message.content
    if isinstance(content, msgspec.UnsetType):
        shape["content"] = "absent"
    elif isinstance(content, str):
        if content:
            parts.append({"type": "text", "text": content})
        else:
            shape["content"] = ""
    elif isinstance(content, list):
        parts.extend(content)
        shape["content"] = "parts"
    seen: set[str] = set()
    raw: dict[str, str] = {}
    for j, call in enumerate(calls):
        if call.id in seen:
            raise params_error(f"{where}.tool_calls[{j}].id",
                               f"call id {call.id!r} is given twice; each call needs its own")
        seen.add(call.id)
        part = call_part(call.id, call.function.name, call.function.arguments)
        if _encode(part["input"]).decode() != call.function.arguments:
            raw[call.id] = call.function.arguments
        parts.append(part)
    if raw:
        shape["arguments"] = raw
    return MessageIn(role="assistant", content=parts, name=message.name,
                     tool_call_id=message.tool_call_id, component=message.component,
                     meta=_with_shape(message.meta, shape))


def _anthropic_results(i: int, message: AppendMessage, content: list[dict[str, Any]],
                       names: dict[str, str]) -> list[MessageIn]:
    """A user message with ``tool_result`` blocks: a tool message for each, in block
    order, then the message's other blocks as a user message (when it has any)."""
    recorded: list[MessageIn] = []
    rest = []
    for j, part in enumerate(content):
        if part.get("type") != "tool_result":
            rest.append(part)
            continue
        _tool_result(f"$.messages[{i}].content[{j}]", part)
        shape: dict[str, Any] = {}
        if "content" not in part:
            shape["content"] = "absent"
        extra = {key: value for key, value in part.items() if key not in _RESULT_KEYS}
        if extra:
            shape["block"] = extra
        meta = _with_shape(message.meta, shape)
        if "is_error" in part:
            meta = {**(meta or {}), "is_error": part["is_error"]}
        call_id = part["tool_use_id"]
        recorded.append(MessageIn(role="tool", content=part.get("content", ""),
                                  name=names.get(call_id), tool_call_id=call_id,
                                  component=message.component, meta=meta))
    if rest:
        recorded.append(MessageIn(role="user", content=rest, name=message.name,
                                  component=message.component, meta=message.meta))
    return recorded


def recorded(messages: Sequence[AppendMessage]) -> list[MessageIn]:
    """The messages of an append as ctxd records them (see the module's docstring); a
    ``tool`` message without a ``name`` takes that of its call when the same append makes
    it.

    Raises:
        CtxdError: -32602 naming the first field that is not as the shape defines it.
    """
    names: dict[str, str] = {}
    out: list[MessageIn] = []
    for i, message in enumerate(messages):
        content = message.content
        if message.tool_calls is not None:
            made = _openai_call(i, message)
            names.update(_ids_and_names(made.content))
            out.append(made)
            continue
        if content is None or isinstance(content, msgspec.UnsetType):
            raise params_error(f"$.messages[{i}].content",
                               "a message needs content (a string or a list of parts); only "
                               "an assistant message with tool_calls may leave it null")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if part.get("type") == "tool_use":
                    if message.role != "assistant":
                        raise params_error(f"$.messages[{i}].content[{j}]",
                                           "only an assistant message makes tool calls")
                    _tool_use(f"$.messages[{i}].content[{j}]", part)
            names.update(_ids_and_names(content))
            if any(part.get("type") == "tool_result" for part in content):
                if message.role != "user":
                    raise params_error(f"$.messages[{i}].role",
                                       "tool_result blocks go in a user message (or give "
                                       "each result as a tool message)")
                out.extend(_anthropic_results(i, message, content, names))
                continue
        name = message.name
        if message.role == "tool" and name is None and message.tool_call_id is not None:
            name = names.get(message.tool_call_id)
        out.append(MessageIn(role=message.role, content=content, name=name,
                             tool_call_id=message.tool_call_id, component=message.component,
                             meta=message.meta))
    return out


# ---- rendering ------------------------------------------------------------------------

Row = tuple[RenderedMessage, dict[str, Any] | None]
"""A rendered message with its stored ``meta``."""


def _calls(message: RenderedMessage, meta: dict[str, Any] | None
           ) -> list[tuple[str, str, Any, str | None]]:
    """(id, name, input, arguments as written or None) of each tool call of an assistant
    message: its ``tool_use`` parts (their arguments as written in ``meta.shape``), else
    the entries of ``meta.tool_calls`` with an id and a name (``function.name`` or
    ``name``; docs/protocol.md, Tool deferral), as clients recorded calls before."""
    content = message.content
    raw = _shape(meta).get("arguments")
    raw = raw if isinstance(raw, dict) else {}
    parts = [(part["id"], part["name"], part.get("input"), raw.get(part["id"]))
             for part in content if part.get("type") == "tool_use"] \
        if isinstance(content, list) else []
    if parts or meta is None or not isinstance(meta.get("tool_calls"), list):
        return parts
    for call in meta["tool_calls"]:
        if not isinstance(call, dict) or not isinstance(call.get("id"), str):
            continue
        function = call.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            arguments = function.get("arguments")
            written = arguments if isinstance(arguments, str) else None
            parts.append((call["id"], function["name"], {} if written is None
                          else decoded_arguments(written), written))
        elif isinstance(call.get("name"), str):
            parts.append((call["id"], call["name"], call.get("input", {}), None))
    return parts


def _texts(content: Content) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content
                     if part.get("type") == "text" and isinstance(part.get("text"), str))


def _shape(meta: dict[str, Any] | None) -> dict[str, Any]:
    shape = meta.get(SHAPE) if meta is not None else None
    return shape if isinstance(shape, dict) else {}


def _named(message: RenderedMessage, rendered: dict[str, Any]) -> dict[str, Any]:
    return rendered if message.name is None else {**rendered, "name": message.name}


def openai_messages(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """A thread as OpenAI Chat Completions takes it: an assistant's calls as its
    ``tool_calls`` (its text as ``content``, null when it has none), each result a
    ``tool`` message (a result without a ``tool_call_id`` answers no call: a ``user``
    message)."""
    out: list[dict[str, Any]] = []
    for message, meta in rows:
        content = message.content
        if message.role == "tool":
            if message.tool_call_id is None:
                out.append({"role": "user", "content": content})
            else:
                out.append({"role": "tool", "tool_call_id": message.tool_call_id,
                            "content": content})
            continue
        calls = _calls(message, meta) if message.role == "assistant" else []
        if not calls:
            if message.role == "assistant" and isinstance(content, list):
                content = _texts(content)
            out.append(_named(message, {"role": message.role, "content": content}))
            continue
        shape = _shape(meta)
        rendered: dict[str, Any] = {"role": "assistant"}
        given = shape.get("content")
        if given == "parts" and isinstance(content, list):
            rendered["content"] = [part for part in content if part.get("type") != "tool_use"]
        elif given != "absent":
            text = _texts(content)
            rendered["content"] = text if text or given == "" else None
        tool_calls = []
        for call_id, name, arguments, written in calls:
            if not isinstance(written, str) or decoded_arguments(written) != arguments:
                written = arguments if isinstance(arguments, str) \
                    else _encode(arguments).decode()
            tool_calls.append({"id": call_id, "type": "function",
                               "function": {"name": name, "arguments": written}})
        rendered["tool_calls"] = tool_calls
        out.append(_named(message, rendered))
    return out


def _blocks(content: Content) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def anthropic_messages(rows: Sequence[Row]) -> tuple[str | None, list[dict[str, Any]]]:
    """A thread as the Anthropic Messages API takes it: the system messages before the
    first other one as ``system`` (their texts joined by a blank line; a later one is a
    user's text), each tool result a ``tool_result`` block of the user turn after the call,
    and a role's consecutive messages one turn (roles alternate)."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message, meta in rows:
        content = message.content
        if message.role == "system" and not turns:
            system.append(_texts(content))
            continue
        role = "assistant" if message.role == "assistant" else "user"
        if message.role == "tool" and message.tool_call_id is not None:
            block: dict[str, Any] = {"type": "tool_result",
                                     "tool_use_id": message.tool_call_id}
            shape = _shape(meta)
            if shape.get("content") != "absent" or content:
                block["content"] = content
            if meta is not None and isinstance(meta.get("is_error"), bool):
                block["is_error"] = meta["is_error"]
            extra = shape.get("block")
            if isinstance(extra, dict):
                block.update({key: value for key, value in extra.items()
                              if key not in _RESULT_KEYS})
            turn: dict[str, Any] = {"role": "user", "content": [block]}
        elif message.role == "assistant":
            turn = {"role": "assistant", "content": _assistant_blocks(message, meta)}
        else:
            turn = {"role": "user", "content": content}
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] = _blocks(turns[-1]["content"]) + _blocks(turn["content"])
        else:
            turns.append(turn)
    return ("\n\n".join(system) if system else None), turns


def _assistant_blocks(message: RenderedMessage, meta: dict[str, Any] | None) -> Content:
    """An assistant message's content as Anthropic takes it: as given (a string, or its
    blocks), calls kept in ``meta.tool_calls`` as ``tool_use`` blocks, a call's input
    that is not an object (arguments that were not JSON) as ``{"arguments": text}``, and
    OpenAI's ``refusal`` parts left out."""
    content = message.content
    blocks: list[dict[str, Any]] = []
    if isinstance(content, str):
        if not (meta is not None and meta.get("tool_calls")):
            return content
        blocks = [{"type": "text", "text": content}] if content else []
    else:
        for part in content:
            if part.get("type") == "refusal":
                continue
            if part.get("type") == "tool_use" and not isinstance(part.get("input"), dict):
                part = {**part, "input": {"arguments": part.get("input")}}
            blocks.append(part)
    if not any(part.get("type") == "tool_use" for part in blocks):
        blocks.extend({"type": "tool_use", "id": call_id, "name": name,
                       "input": arguments if isinstance(arguments, dict)
                       else {"arguments": arguments}}
                      for call_id, name, arguments, _ in _calls(message, meta))
    return blocks


def openai_tools(tools: Sequence[ToolDefinition]) -> list[dict[str, Any]]:
    """Tool definitions as Chat Completions' ``tools``."""
    return [{"type": "function", "function": {"name": tool.name,
                                              "description": tool.description,
                                              "parameters": tool.input_schema}}
            for tool in tools]


def anthropic_tools(tools: Sequence[ToolDefinition]) -> list[dict[str, Any]]:
    """Tool definitions as the Messages API's ``tools``."""
    return [{"name": tool.name, "description": tool.description,
             "input_schema": tool.input_schema} for tool in tools]

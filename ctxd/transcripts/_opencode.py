"""OpenCode's session export (``opencode export <id>``) as ctxd messages (docs/protocol.md,
"transcript.import").

The export is one JSON document ``{info, messages: [{info, parts}]}``. A tool call and its
result are one ``tool`` part (``callID``, ``tool``, ``state: {status, input, output | error,
time: {start, end, compacted?}}``): it becomes a ``tool_use`` part of the assistant message
and a ``tool`` message. ``state.time.compacted`` marks an output OpenCode no longer shows
the model; it is still in the export, so it is imported, with ``meta.compacted``. Parts that
are not conversation (step-start, step-finish, patch, snapshot, agent, subtask, compaction,
retry, file, reasoning) are kept in the message's ``meta.parts``; an unknown part type too.
Every message's ``meta.source.id`` is its OpenCode message id: a compaction part's
``tail_start_id`` names one (the fork pipeline keeps that tail, docs/protocol.md,
"context.fork").

The export is read as the importer reads any file, a chunk at a time: its top-level
members are cut out like an array's elements (`locate_messages` finds ``info`` and where
``messages`` starts), then each message by itself (`parse_message`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from ctxd.transcripts._claude_code import decode_record
from ctxd.transcripts._model import Entry, Usage, token_count, unreadable
from ctxd.transcripts._split import Piece
from ctxd.wire.types import MessageIn

META_PARTS = ("reasoning", "file", "step-start", "step-finish", "patch", "snapshot", "agent",
              "subtask", "compaction", "retry")
"""Part types kept as metadata of their message (not conversation text)."""

_PART_FIELDS = ("text", "mime", "filename", "url", "reason", "snapshot", "hash", "files",
                "name", "prompt", "description", "agent", "auto", "attempt", "error", "cost",
                "tokens", "synthetic", "overflow", "tail_start_id")


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _usage(info: dict[str, Any]) -> Usage | None:
    tokens = info.get("tokens")
    key = info.get("id")
    if not isinstance(tokens, dict) or not isinstance(key, str):
        return None
    cache = _dict(tokens.get("cache"))
    model = info.get("modelID")
    return Usage(key=key, model=model if isinstance(model, str) else None,
                 input_tokens=token_count(tokens.get("input")),
                 output_tokens=token_count(tokens.get("output")),
                 cache_read_tokens=token_count(cache.get("read")),
                 cache_write_tokens=token_count(cache.get("write")),
                 thinking_tokens=token_count(tokens.get("reasoning")))


def _kept(part: dict[str, Any]) -> dict[str, Any]:
    """A part as metadata: its type and its small fields."""
    kept: dict[str, Any] = {"type": part.get("type")}
    for field in _PART_FIELDS:
        if field in part:
            kept[field] = part[field]
    return kept


ROUTE_KEYS = ("ctxd/session_id", "ctxd/project")
"""What ctxd's OpenCode plugin adds to the ``_meta`` of a call of ctxd's MCP tools, which
OpenCode stores with the call (docs/decisions.md, "Agents end to end")."""


def _as_called(tool_input: Any) -> Any:
    """A call's input as the model made it: without the keys of `ROUTE_KEYS`."""
    meta = tool_input.get("_meta") if isinstance(tool_input, dict) else None
    if not isinstance(meta, dict) or not any(key in meta for key in ROUTE_KEYS):
        return tool_input
    rest = {key: value for key, value in meta.items() if key not in ROUTE_KEYS}
    called = {key: value for key, value in tool_input.items() if key != "_meta"}
    return {**called, "_meta": rest} if rest else called


def _tool(part: dict[str, Any], source: dict[str, Any]) -> tuple[dict[str, Any], MessageIn]:
    state = _dict(part.get("state"))
    call_id, name = str(part.get("callID") or part.get("id")), str(part.get("tool"))
    status = state.get("status")
    output = state.get("output") if status == "completed" else state.get("error")
    times = _dict(state.get("time"))
    meta: dict[str, Any] = {"source": source, "status": status}
    if status == "error":
        meta["is_error"] = True
    if times.get("compacted") is not None:
        meta["compacted"] = times["compacted"]
    for field in ("title", "metadata"):
        if state.get(field) is not None:
            meta[field] = state[field]
    text = output if isinstance(output, str) else (
        "" if output is None else json.dumps(output, ensure_ascii=False))
    call = {"type": "tool_use", "id": call_id, "name": name,
            "input": _as_called(state.get("input"))}
    return call, MessageIn(role="tool", content=text, tool_call_id=call_id[:256],
                           name=name[:256], meta=meta)


def _message(index: int, item: Any) -> Entry:
    if not isinstance(item, dict) or not isinstance(item.get("info"), dict):
        return Entry(line=index, end=index, kind="malformed",
                     error="a message must be an object with an `info` object")
    info = item["info"]
    role = info.get("role")
    if role not in ("user", "assistant"):
        return Entry(line=index, end=index, kind="unknown", unknown_type=f"role:{role}")
    parts: list[Any] = item["parts"] if isinstance(item.get("parts"), list) else []
    source: dict[str, Any] = {"format": "opencode", "id": info.get("id"), "index": index}
    entry = Entry(line=index, end=index, kind="message",
                  usage=_usage(info) if role == "assistant" else None)
    base: dict[str, Any] = {"source": source}
    for field in ("modelID", "providerID", "agent", "mode"):
        if info.get(field) is not None:
            base[field] = info[field]
    if info.get("summary") is True:
        base["summary"] = True
    pending: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    unknown: list[str] = []

    def flush() -> None:
        if pending or kept:
            meta = {**base, **({"parts": list(kept)} if kept else {})}
            entry.messages.append(MessageIn(role=role, content=list(pending) or "", meta=meta))
            pending.clear()
            kept.clear()

    for part in parts:
        if not isinstance(part, dict):
            continue
        part_type = part.get("type")
        if part_type == "text" and isinstance(part.get("text"), str):
            pending.append({"type": "text", "text": part["text"]})
        elif part_type == "tool" and role == "assistant":
            call, result = _tool(part, source)
            pending.append(call)
            flush()
            entry.messages.append(result)
        elif part_type in META_PARTS:
            kept.append(_kept(part))
        else:
            unknown.append(str(part_type))
            kept.append({**_kept(part), "unknown": True})
    flush()
    if unknown:
        entry.info["unknown_parts"] = unknown
    return entry


_MEMBER = re.compile(rb'[ \t\r\n]*+"((?:[^"\\]|\\.)*+)"[ \t\r\n]*+:[ \t\r\n]*+', re.DOTALL)
MEMBER_HEAD_BYTES = 4096
"""The first bytes of a top-level member that name it (its key, then its value's start)."""
NOT_AN_EXPORT = "an OpenCode export is an object {info, messages: [...]}"


def locate_messages(members: list[Piece], head: Callable[[int, int], bytes]
                    ) -> tuple[dict[str, Any], int]:
    """An export's session info and the byte offset of its ``messages`` array, from the
    members of its top-level object (`ArraySplitter` cuts an object's members as it cuts
    an array's elements); ``head(offset, length)`` gives the document's bytes there.

    Raises:
        ValueError: not ``{info, messages: [...]}``.
    """
    info: dict[str, Any] = {}
    found: int | None = None
    for member in members:
        start = member.end - member.size
        first = member.data[:MEMBER_HEAD_BYTES] if member.data is not None \
            else head(start, MEMBER_HEAD_BYTES)
        key = _MEMBER.match(first)
        if key is None:
            continue
        if key.group(1) == b"messages" and first[key.end():key.end() + 1] == b"[":
            found = start + key.end()
        elif key.group(1) == b"info" and member.data is not None:
            try:
                info = _dict(decode_record(member.data[key.end():]))
            except ValueError:
                info = {}
    if found is None:
        raise ValueError(NOT_AN_EXPORT)
    return info, found


def parse_message(piece: Piece, limit: int) -> Entry:
    """One element of an export's ``messages`` (its index the position) as its entry; one
    not JSON, nested too deep, or over ``limit`` bytes is malformed."""
    bad = unreadable(piece, limit, piece.line)
    if bad is not None:
        return bad
    try:
        return _message(piece.line, decode_record(piece.data or b""))
    except ValueError as exc:
        return Entry(line=piece.line, end=piece.line, kind="malformed", error=f"not JSON: {exc}")
    except RecursionError:
        return Entry(line=piece.line, end=piece.line, kind="malformed",
                     error="not JSON: nested too deep to read")

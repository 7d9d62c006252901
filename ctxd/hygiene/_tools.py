"""Tool deferral: the ``session_tools`` table (a session's registered tool definitions,
their exact tokens and last use), which of them a render leaves out, and `tools.search`'s
lexical ranking (docs/protocol.md, "Tool deferral")."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import apsw
import msgspec

from ctxd.errors import params_error
from ctxd.store import Transaction
from ctxd.wire.types import MessageIn, ToolDefinition, ToolSource

DEFERRAL_ORDER: tuple[ToolSource, ...] = ("mcp", "skill")
"""The sources deferred, in this order; built-in tools are never deferred."""
CALL_PART_TYPES = frozenset({"tool_use", "tool_call", "function_call"})
"""Content parts of an assistant message that call a tool by their ``name``."""
NAME_WEIGHT = 3.0
"""Score of a query word that is a whole word of a tool's name."""
NAME_PART_WEIGHT = 1.5
"""Score of a query word found inside a tool's name, not as a whole word."""
PART_MIN_CHARS = 3
"""Shorter query words score only as whole words ("a" is inside too many names)."""
DESCRIPTION_WEIGHT = 1.0
"""Score of a query word that is a word of a tool's description."""

_encode = msgspec.json.Encoder().encode
_decode_schema = msgspec.json.Decoder(dict[str, Any]).decode
_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class SessionTool:
    """A registered tool as the store holds it."""

    name: str
    description: str
    input_schema: dict[str, Any]
    source: ToolSource
    tokens: int
    last_used_seq: int
    """The seq of the last assistant message that called it (0: never)."""
    promoted: bool
    """Found by `tools.search` since the last assistant message: never deferred."""

    def definition(self) -> ToolDefinition:
        return ToolDefinition(name=self.name, description=self.description,
                              input_schema=self.input_schema, source=self.source)


def counted_form(tool: ToolDefinition) -> str:
    """What a tool's tokens are counted over: the compact JSON object of its ``name``,
    ``description`` and ``input_schema``, the definition a model is sent (``source`` is
    ctxd's own; docs/decisions.md, Hygiene)."""
    return _encode({"name": tool.name, "description": tool.description,
                    "input_schema": tool.input_schema}).decode()


def check_tools(tools: Sequence[ToolDefinition]) -> None:
    """What the types cannot say: each name once per request.

    Raises:
        CtxdError: -32602 naming the repeated tool.
    """
    seen: set[str] = set()
    for index, tool in enumerate(tools):
        if tool.name in seen:
            raise params_error(f"$.tools[{index}].name",
                               f"tool {tool.name!r} is given twice; give each name once")
        seen.add(tool.name)


def called_tools(message: MessageIn) -> list[str]:
    """The tools an assistant message calls: the ``name`` of its content parts of type
    ``tool_use`` (Anthropic), ``tool_call`` or ``function_call``, and of the entries of
    ``meta.tool_calls`` (OpenAI: ``{function: {name}}``, or ``{name}``)."""
    if message.role != "assistant":
        return []
    names: list[str] = []
    if not isinstance(message.content, str):
        names += [part["name"] for part in message.content
                  if part.get("type") in CALL_PART_TYPES and isinstance(part.get("name"), str)]
    calls = (message.meta or {}).get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            if not isinstance(call, dict):
                continue
            function = call.get("function")
            name = function.get("name") if isinstance(function, dict) else call.get("name")
            if isinstance(name, str):
                names.append(name)
    return names


def defer(tools: Sequence[SessionTool], threshold_tokens: int
          ) -> tuple[list[SessionTool], list[SessionTool]]:
    """The active and the deferred tools, each in registration order.

    Nothing is deferred while the tools' tokens are at most ``threshold_tokens``; past it,
    MCP tools then skill tools, least recently used first (never used: by name), until the
    rest fit or none of them is left. Built-in and promoted tools always stay.
    """
    total = sum(tool.tokens for tool in tools)
    if total <= threshold_tokens:
        return list(tools), []
    out: set[str] = set()
    for source in DEFERRAL_ORDER:
        candidates = sorted((t for t in tools if t.source == source and not t.promoted),
                            key=lambda t: (t.last_used_seq, t.name))
        for tool in candidates:
            if total <= threshold_tokens:
                break
            out.add(tool.name)
            total -= tool.tokens
    return ([t for t in tools if t.name not in out], [t for t in tools if t.name in out])


def deferred_note(count: int) -> str:
    return f"[{count} tools deferred to save context. Use tool_search to find them.]"


def rank(tools: Iterable[SessionTool], query: str) -> list[tuple[SessionTool, float]]:
    """The tools that match ``query``, best first (ties by name).

    Each lowercase word of the query scores `NAME_WEIGHT` when it is a word of the tool's
    name (``read_file`` has ``read`` and ``file``), else `NAME_PART_WEIGHT` when the name
    contains it (a word of `PART_MIN_CHARS` or more), plus `DESCRIPTION_WEIGHT` when it
    is a word of the description.
    """
    terms = list(dict.fromkeys(_WORD.findall(query.lower())))
    if not terms:
        raise params_error("$.query", "the query has no letters or digits to search for")
    scored = []
    for tool in tools:
        name = tool.name.lower()
        name_words = set(_WORD.findall(name))
        description_words = set(_WORD.findall(tool.description.lower()))
        score = 0.0
        for term in terms:
            if term in name_words:
                score += NAME_WEIGHT
            elif len(term) >= PART_MIN_CHARS and term in name:
                score += NAME_PART_WEIGHT
            if term in description_words:
                score += DESCRIPTION_WEIGHT
        if score > 0:
            scored.append((tool, score))
    scored.sort(key=lambda pair: (-pair[1], pair[0].name))
    return scored


# ---- the table (in the store's thread) ----------------------------------------------

def load_tools(conn: apsw.Connection, session_id: str) -> list[SessionTool]:
    """The session's tools in registration order (a re-registered tool keeps its place)."""
    return [SessionTool(name=row[0], description=row[1], input_schema=_decode_schema(row[2]),
                        source=row[3], tokens=row[4], last_used_seq=row[5],
                        promoted=bool(row[6]))
            for row in conn.execute(
                "SELECT name, description, input_schema, source, tokens, last_used_seq, "
                "promoted FROM session_tools WHERE session_id = ? ORDER BY rowid",
                (session_id,))]


def stage_register(transaction: Transaction, session_id: str,
                   tools: Sequence[tuple[ToolDefinition, int]], now: float) -> None:
    """Add the tools (each with its tokens) to a transaction; a registered name is
    replaced, keeping its place and its last use."""
    transaction.add(_upsert, session_id, list(tools), now)


def _upsert(conn: apsw.Connection, session_id: str,
            tools: Sequence[tuple[ToolDefinition, int]], now: float) -> None:
    conn.executemany(
        "INSERT INTO session_tools (session_id, name, description, input_schema, source, "
        "tokens, registered_at) VALUES (?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (session_id, name) DO UPDATE SET description = excluded.description, "
        "input_schema = excluded.input_schema, source = excluded.source, "
        "tokens = excluded.tokens, registered_at = excluded.registered_at",
        [(session_id, tool.name, tool.description, _encode(tool.input_schema).decode(),
          tool.source, tokens, now) for tool, tokens in tools])


def is_tool_search(name: str) -> bool:
    """Whether a tool is ctxd's ``tool_search`` as an agent names it (``tool_search``,
    ``mcp__ctxd__tool_search``, OpenCode's ``ctxd_tool_search``)."""
    return name.endswith("tool_search")


def ends_promotions(message: MessageIn) -> bool:
    """Whether an appended message is the model's turn after a promotion: an assistant
    message that does not call ``tool_search`` (the one that called it may be recorded
    after the search, by a hook or the gateway; the promoted tools are for its next one)."""
    return message.role == "assistant" and not any(
        is_tool_search(name) for name in called_tools(message))


def stage_use(transaction: Transaction, session_id: str, uses: Mapping[str, int],
              end_promotions: bool = True) -> None:
    """Add to a transaction what appended assistant messages did: the tools they called
    were used at their seq (``uses``), and (``end_promotions``: see `ends_promotions`) the
    tools promoted by `tools.search` before them go back to being ranked by use."""
    transaction.add(_use, session_id, dict(uses), end_promotions)


def _use(conn: apsw.Connection, session_id: str, uses: dict[str, int],
         end_promotions: bool) -> None:
    if end_promotions:
        conn.execute("UPDATE session_tools SET promoted = 0 "
                     "WHERE session_id = ? AND promoted = 1", (session_id,))
    if uses:  # most assistant messages call no tool
        conn.executemany("UPDATE session_tools SET last_used_seq = max(last_used_seq, ?) "
                         "WHERE session_id = ? AND name = ?",
                         [(seq, session_id, name) for name, seq in uses.items()])


def stage_promote(transaction: Transaction, session_id: str, names: Sequence[str]) -> None:
    transaction.add(_promote, session_id, list(names))


def _promote(conn: apsw.Connection, session_id: str, names: list[str]) -> None:
    conn.executemany("UPDATE session_tools SET promoted = 1 WHERE session_id = ? AND name = ?",
                     [(session_id, name) for name in names])

"""Reconcile, then substitute: a model request's history against the session's sent
ledger (``gateway_ledger``), one operation on the session's actor (docs/architecture.md,
Gateway; the rules in docs/decisions.md, Gateway).

The agent's messages are its truth. Those the ledger has not seen are recorded in the
session; where the history stops matching the ledger (the agent compacted, the user
rewound) a boundary is recorded and the ledger cut there. Each message is sent as the
ledger remembers it, so a substitution, once decided, gives every later request the same
bytes; the bytes before a message change only at a rewrite point (a fold, a compaction).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import math
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec
import trio

from ctxd.errors import internal_error, limit_reached
from ctxd.gateway import _anthropic, _openai
from ctxd.gateway._blocks import MARK, ToolResult, count_marks
from ctxd.gateway._identity import session_of
from ctxd.gateway._ledger import (
    LINES_KEPT,
    LedgerRow,
    chained,
    load_line,
    load_nodes,
    save_line,
)
from ctxd.hub import (
    ack_injection,
    finish_tool_calls,
    list_injections,
    provider_ratio,
    pull_injections,
    tool_states,
)
from ctxd.hygiene import (
    CALL_PART_TYPES,
    ToolResultBlob,
    blob_refs,
    clear_inputs,
    cleared_text,
    extract_summary,
    is_tool_search,
    offload_off_loop,
    ref_id_for,
    stage_blobs,
)
from ctxd.memory import PROMPT_HEADER, Injected, Memory, project_scope
from ctxd.scrub import scrub
from ctxd.sessions import append, offered_tools, open_session, render
from ctxd.store import Transaction
from ctxd.tokens import part_text
from ctxd.transcripts import PERSISTED_OUTPUT
from ctxd.wire.types import (
    INJECT_PRIORITIES,
    TERMINAL_TOOL_STATES,
    InjectionInfo,
    MessageAppendParams,
    MessageIn,
    RenderedMessage,
    RenderParams,
    SessionOpenParams,
    ToolCallState,
    ToolDefinition,
)

if TYPE_CHECKING:
    from ctxd.sessions import SessionActor, Supervisor
    from ctxd.tokens import TokenCounter

__all__ = ["Api", "Endpoint", "GatewayRequest", "Prepared", "prepare", "session_of"]

Api = Literal["anthropic", "openai"]
Endpoint = Literal["messages", "count_tokens", "chat_completions"]


class Shape(Protocol):
    """An API's pure functions over its messages (`_anthropic`, `_openai`)."""

    def messages_of(self, body: dict[str, Any]) -> list[dict[str, Any]]: ...
    def bare(self, message: dict[str, Any]) -> dict[str, Any]: ...
    def marked(self, sent: dict[str, Any], agent: dict[str, Any]) -> dict[str, Any]: ...
    def to_ctxd(self, messages: list[dict[str, Any]], start: int) -> list[list[MessageIn]]: ...
    def results(self, message: dict[str, Any]) -> list[ToolResult]: ...
    def cleared_inputs(self, message: dict[str, Any], ref_id: str, tools: frozenset[str],
                       stored: Callable[[str], str] | None
                       ) -> tuple[dict[str, Any], str] | None: ...
    def with_result(self, message: dict[str, Any], index: int, text: str
                    ) -> dict[str, Any]: ...
    def calls(self, message: dict[str, Any]) -> list[tuple[str, str]]: ...
    def result_end(self, messages: list[dict[str, Any]], position: int) -> int: ...
    def is_system(self, message: dict[str, Any]) -> bool: ...
    def summary_message(self, text: str) -> dict[str, Any]: ...
    def with_note(self, message: dict[str, Any], text: str) -> dict[str, Any] | None: ...
    def counted(self, message: dict[str, Any]) -> MessageIn: ...
    def system_and_tools(self, body: dict[str, Any]) -> tuple[MessageIn | None, list[str]]: ...
    def problems(self, messages: list[dict[str, Any]]) -> list[str]: ...
    def body_with(self, body: dict[str, Any],
                  messages: list[dict[str, Any]] | msgspec.Raw) -> bytes: ...


SHAPES: dict[str, Shape] = {"anthropic": _anthropic, "openai": _openai}
FIXED_COUNTS_KEPT = 256
"""System prompts and tool definitions whose counts are kept (an agent sends the same
ones with every request)."""
KEEP_RECENT = 6
"""Messages at the end of a request whose tool results automatic clearing never touches
(the last three turns)."""
MEMORY_SHARE = 0.02
"""Share of the effective window the memories a conversation starts with may take."""
MAX_RECORDED = 10_000
"""Messages one request may add to a session (message.append's limit)."""
SEEN_BY_THE_GATEWAY = "its result reached the model through the gateway"
"""The detail of a tool call's state the gateway reports (`_finish_tool_calls`)."""

LEDGERS_KEPT = 64
"""Threads whose lines (and last request's messages) are kept in memory, the last used
first (`_Ledgers`; SQLite holds them all and is read for the others)."""
LEDGER_BYTES_KEPT = 64 << 20
"""Bytes of the kept threads, at most (each line weighed as twice its rows' sent JSON:
that and the rows' messages; the last request's messages as once more its line's)."""

_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True)
class GatewayRequest:
    """A model request as the gateway's server parsed it."""

    api: Api
    endpoint: Endpoint
    session_header: str | None
    """The ``x-ctxd-session`` header's value, if any."""
    body: dict[str, Any]
    raw: bytes | None = None
    """The body as the agent sent it, ``body`` decoded from it (None: not known)."""


@dataclass(frozen=True)
class Prepared:
    """The request to send upstream and ctxd's count of it."""

    session_id: str
    body: bytes
    tokens: dict[str, int]
    """Exact tokens of the sent body by budget.measure component: ``system_prompt``,
    ``tool_descriptions``, ``conversation``."""
    removed_tokens: int
    model: str | None


@dataclass
class _Plan:
    """What one request changes, worked out before anything is written."""

    thread: bytes
    new_thread: bool
    """The thread had no line before this request (the conversation starts)."""
    line: int | None
    """The line whose rows the request matched longest (None: none matched)."""
    keep: int
    """Its rows kept as they were (the matched prefix)."""
    seen: int
    """Its rows before this request (more than ``keep``: the request leaves it)."""
    rows: dict[int, LedgerRow]
    """Every position's row."""
    points_of_history: list[tuple[str, int, int]]
    """The folds and compactions the request's history holds (`rewrite_points`)."""
    changed: set[int] = dataclasses.field(default_factory=set)
    recorded: list[MessageIn] = dataclasses.field(default_factory=list)
    blobs: list[ToolResultBlob] = dataclasses.field(default_factory=list)
    delivered: list[InjectionInfo] = dataclasses.field(default_factory=list)
    memories: Injected | None = None
    points: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The rewrite points decided now (the events that say so)."""
    written: int | None = None
    """The line the changes are written to (`_place`)."""
    fork: tuple[int, int] | None = None
    """A new line's start: the line and the count of its rows it begins with."""
    dropped: list[int] = dataclasses.field(default_factory=list)
    """The thread's least used lines, dropped for the new one (`LINES_KEPT`)."""
    finished: dict[str, tuple[str | None, ToolCallState]] = dataclasses.field(
        default_factory=dict)
    """The tool calls whose results the new messages carry: each call's name and terminal
    state (`_finish_tool_calls`)."""
    finished_from: dict[str, ToolCallState] = dataclasses.field(default_factory=dict)
    """The state each of them was in before (an unknown call is not here)."""


def digest_of(value: Any) -> bytes:
    """What a message of the agent (without its marks) is known by."""
    return hashlib.blake2b(_encode(value), digest_size=16).digest()


def thread_of(shape: Shape, body: dict[str, Any], bares: list[dict[str, Any]]) -> bytes:
    """The ledger a request's messages are matched against: a digest of its system
    prompt (without marks), so that an agent's side requests (a title, a sub-agent), with
    prompts of their own, keep ledgers of their own."""
    system = body.get("system")
    if isinstance(system, list):
        system = shape.bare({"content": system})["content"]
    return digest_of([system, list(itertools.takewhile(shape.is_system, bares))])


@dataclass
class _Thread:
    """A thread's lines as its last request left them, and that request's messages."""

    created_at: float
    """The session's (a session deleted and opened again is another)."""
    order: list[int]
    """Every line the thread has in SQLite, the least recently used first."""
    nodes: dict[int, list[bytes]]
    """Every line's nodes (what a request is matched against)."""
    lines: dict[int, list[LedgerRow]] = dataclasses.field(default_factory=dict)
    """The rows of some of the lines (read when matched)."""
    weights: dict[int, int] = dataclasses.field(default_factory=dict)
    """What each line of ``lines`` takes (`_weight`; rows two lines share, the prefix
    a new line began with, are counted in each)."""
    bares: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The last request's messages, their marks left out (`_Shape.bare`): what the
    digests are of."""
    digests: list[bytes] = dataclasses.field(default_factory=list)
    last_nodes: list[bytes] = dataclasses.field(default_factory=list)
    """The last request's nodes (`chained`)."""
    size: int = 0

    def weigh(self, current: int | None) -> None:
        """``size``: what the thread takes kept, after leaving out the rows of the least
        used lines (never ``current``'s) while it is over a kept thread's share."""
        share = LEDGER_BYTES_KEPT // 8
        for line, rows in self.lines.items():
            if line not in self.weights:
                self.weights[line] = _weight(rows)
        nodes = NODE_BYTES * sum(len(nodes) for nodes in self.nodes.values())
        last = self.weights.get(current, 0) // 2 if current is not None else 0
        for line in self.order:
            if nodes + sum(self.weights.values()) + last <= share:
                break
            if line != current and line in self.lines:
                del self.lines[line], self.weights[line]
        self.size = nodes + sum(self.weights.values()) + last


NODE_BYTES = 64
"""What one node takes kept: a 16-byte bytes object and its place in a list."""


class _Ledgers:
    """The threads used last (`LEDGERS_KEPT`, `LEDGER_BYTES_KEPT`), so that a request
    whose history a kept line holds reads no row from SQLite and digests only its new
    messages. SQLite stays the truth: an entry is taken out while its session's operation
    runs and put back only with what that operation committed (or left as it was), so a
    failure, an eviction or a restart reads the rows again."""

    def __init__(self) -> None:
        self._kept: OrderedDict[tuple[str, bytes], _Thread] = OrderedDict()
        self._size = 0

    def take(self, session_id: str, thread: bytes, created_at: float) -> _Thread | None:
        kept = self._kept.pop((session_id, thread), None)
        if kept is None:
            return None
        self._size -= kept.size
        return kept if kept.created_at == created_at else None

    def put(self, session_id: str, thread: bytes, kept: _Thread) -> None:
        if kept.size > LEDGER_BYTES_KEPT // 8:
            return  # a conversation this large is read from SQLite: the others stay
        self._kept[(session_id, thread)] = kept
        self._size += kept.size
        while len(self._kept) > LEDGERS_KEPT or self._size > LEDGER_BYTES_KEPT:
            _, evicted = self._kept.popitem(last=False)
            self._size -= evicted.size

    def clear(self) -> None:
        self._kept.clear()
        self._size = 0


_ledgers = _Ledgers()


def _weight(rows: list[LedgerRow]) -> int:
    """What a kept line takes: its rows' sent JSON and the decoded messages, about as
    large."""
    return 2 * sum(len(row.sent_json() or b"") for row in rows)


def _same(a: Any, b: Any) -> bool:
    """Whether two decoded JSON values encode to the same bytes: equal, of the same types,
    their objects' keys in the same order (what ``==`` does not see: ``1 == 1.0 == True``,
    ``{"a": 1, "b": 2} == {"b": 2, "a": 1}``, ``0.0 == -0.0``)."""
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is str:
        return bool(a == b)
    if kind is dict:
        return len(a) == len(b) and all(
            key == other and _same(value, value_b)
            for (key, value), (other, value_b) in zip(a.items(), b.items(), strict=True))
    if kind is list:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if kind is float:
        return bool(a == b and math.copysign(1.0, a) == math.copysign(1.0, b))
    return bool(a == b)  # int, bool, None


class _FixedCounts:
    """Token counts of the texts every request repeats (system prompt, tool definitions),
    the last `FIXED_COUNTS_KEPT` of them kept by digest."""

    def __init__(self) -> None:
        self._kept: OrderedDict[bytes, int] = OrderedDict()

    async def count(self, counter: TokenCounter, system: MessageIn | None,
                    tools: list[str]) -> tuple[int, int]:
        system_key = digest_of([counter.name, "system", system and system.content])
        system_tokens = self._kept.get(system_key)
        if system_tokens is None:
            system_tokens = 0 if system is None else (
                await counter.count_messages([system]))[0]
        tools_key = digest_of([counter.name, "tools", tools])
        tool_tokens = self._kept.get(tools_key)
        if tool_tokens is None:
            tool_tokens = sum(await counter.count_texts(tools))
        for key, tokens in ((system_key, system_tokens), (tools_key, tool_tokens)):
            self._kept[key] = tokens
            self._kept.move_to_end(key)
        while len(self._kept) > FIXED_COUNTS_KEPT:
            self._kept.popitem(last=False)
        return system_tokens, tool_tokens


_fixed_counts = _FixedCounts()


async def prepare(supervisor: Supervisor, request: GatewayRequest) -> Prepared:
    """The request as it is to be sent, with the session's substitutions, after recording
    what it holds that the session has not seen; the session is opened if it is not (a
    ``count_tokens`` request is rewritten the same way, but records nothing: no message,
    no ledger row, no delivery).

    Raises:
        CtxdError: -32602 when the body is not the API's shape; any error of the session's
            operation. The caller then sends the agent's body as it is.
    """
    shape = SHAPES[request.api]
    messages = shape.messages_of(request.body)
    session_id = session_of(request)
    recording = request.endpoint != "count_tokens"
    prepared: Prepared = await supervisor.call(
        session_id, lambda actor: _reconcile(actor, request, shape, messages, recording))
    return prepared


async def _reconcile(actor: SessionActor, request: GatewayRequest, shape: Shape,
                     messages: list[dict[str, Any]], recording: bool) -> Prepared:
    """The operation on the session's actor (see `prepare`)."""
    services = actor.services
    session_id = actor.session_id
    if actor.record is None or actor.record.state != "open":
        await open_session(actor, SessionOpenParams(session_id=session_id))
    bares = [shape.bare(message) for message in messages]
    thread = thread_of(shape, request.body, bares)
    record = actor.require()
    kept = _ledgers.take(session_id, thread, record.created_at)
    if kept is None:
        order, line_nodes = await services.store.read(load_nodes, session_id, thread)
        kept = _Thread(created_at=record.created_at, order=order, nodes=line_nodes)
    digests = [_digest(position, bares, kept) for position in range(len(messages))]
    nodes = _nodes(thread, digests, kept)
    line, keep = _longest_line(kept, nodes)
    if line is not None and line not in kept.lines:
        kept.lines[line] = await services.store.read(load_line, session_id, thread, line)
    ledger = [] if line is None else kept.lines[line]
    matched = {row.position: row for row in ledger[:keep]}
    plan = _Plan(thread=thread, new_thread=not kept.order, line=line, keep=keep,
                 seen=len(ledger), rows=matched,
                 points_of_history=_with_automatic(rewrite_points(shape, messages), matched))
    if len(messages) - keep > MAX_RECORDED:
        raise limit_reached("messages", MAX_RECORDED,
                            f"{len(messages) - keep} messages are new to the session",
                            "send the conversation in a new session")
    await _record_new(actor, shape, messages, bares, nodes, plan)
    if recording:
        await _finish_tool_calls(actor, shape, messages, bares, plan)
    await _decide_compactions(actor, shape, messages, plan)
    counter = services.counter
    sent_body = await _with_offered_tools(actor, request, shape, messages, recording)
    system_tokens, tool_tokens = await _fixed_counts.count(
        counter, *shape.system_and_tools(sent_body))
    model = request.body.get("model")
    ratio = await services.store.read(provider_ratio, model) if isinstance(model, str) else None
    await _clear_if_over(actor, shape, messages, plan, system_tokens + tool_tokens, ratio or 1.0)
    await _inject(actor, shape, messages, plan, system_tokens + tool_tokens,
                  _offers(sent_body, "compact_context"))  # after deferral: what the model gets
    view = shown(shape, messages, plan.rows, plan.points_of_history)
    plan.points.extend(point for point in view.points if point["end"] >= plan.keep)
    sent, marks_tokens = await _assemble(shape, messages, bares, plan, view, counter)
    body = shape.body_with(sent_body, _spliced(sent, plan.rows, view))
    if recording and plan.changed:
        _place(plan, kept.order)
        await _commit(actor, plan)
        assert plan.written is not None
        kept.lines[plan.written] = [plan.rows[p] for p in range(len(messages))]
        kept.nodes[plan.written] = nodes
        kept.weights.pop(plan.written, None)
        for gone in plan.dropped:
            for kept_by_line in (kept.lines, kept.nodes, kept.weights):
                kept_by_line.pop(gone, None)
        kept.order = [line for line in kept.order
                      if line != plan.written and line not in plan.dropped] + [plan.written]
    kept.bares, kept.digests, kept.last_nodes = bares, digests, nodes
    kept.weigh(plan.written if plan.written is not None else line)
    _ledgers.put(session_id, thread, kept)
    in_system = sum(tokens + marks_tokens.get(p, 0) for p, tokens in enumerate(view.tokens)
                    if view.messages[p] is not None and shape.is_system(messages[p]))
    return Prepared(
        session_id=session_id, body=body,
        tokens={"system_prompt": system_tokens + in_system, "tool_descriptions": tool_tokens,
                "conversation": sum(view.tokens) + sum(marks_tokens.values()) - in_system},
        removed_tokens=sum(max(0, plan.rows[p].agent_tokens - tokens)
                           for p, tokens in enumerate(view.tokens)),
        model=model if isinstance(model, str) else None)


async def _with_offered_tools(actor: SessionActor, request: GatewayRequest, shape: Shape,
                              messages: list[dict[str, Any]], recording: bool
                              ) -> dict[str, Any]:
    """The request's body with the tools the session defers left out of its ``tools``
    (docs/protocol.md, "Model gateway"), or the body as it is.

    Only an Anthropic request that offers ctxd's ``tool_search`` has tools deferred (its
    model can find them again; promoted ones are offered from the next call on), and only
    its MCP tools (``mcp__…``); ``tool_search`` itself, a tool the history calls, and a
    server tool (no ``input_schema``) always stay. The agent's cache mark on a tool left
    out moves to the last tool kept, so its tools stay cached as one prefix.
    """
    tools = request.body.get("tools")
    if request.api != "anthropic" or not isinstance(tools, list) or not any(
            isinstance(tool, dict) and isinstance(tool.get("name"), str)
            and is_tool_search(tool["name"]) for tool in tools):
        return request.body
    definitions: dict[str, ToolDefinition] = {}
    for tool in tools:
        name = tool.get("name") if isinstance(tool, dict) else None
        if not isinstance(name, str) or name in definitions \
                or not isinstance(tool.get("input_schema"), dict):
            continue
        try:
            definitions[name] = msgspec.convert({
                "name": name, "description": tool.get("description") or "",
                "input_schema": tool["input_schema"],
                "source": "mcp" if name.startswith("mcp__") and not is_tool_search(name)
                else "builtin"}, ToolDefinition)
        except msgspec.ValidationError:
            continue  # a tool ctxd cannot register stays offered
    deferred = await offered_tools(actor, list(definitions.values()), recording)
    deferred -= {name for message in messages for _, name in shape.calls(message)}
    if not deferred:
        return request.body
    kept = [tool for tool in tools if not (isinstance(tool, dict)
                                           and tool.get("name") in deferred)]
    marked = [tool for tool in tools if isinstance(tool, dict) and MARK in tool]
    if kept and marked and not any(isinstance(tool, dict) and MARK in tool for tool in kept) \
            and isinstance(kept[-1], dict):
        kept[-1] = {**kept[-1], MARK: marked[-1][MARK]}
    return {**request.body, "tools": kept}


def _digest(position: int, bares: list[dict[str, Any]], kept: _Thread) -> bytes:
    """The digest of the message at ``position``: the last request's when it encodes to
    the same bytes (`_same`: a walk of the decoded values, much cheaper than encoding and
    hashing them), else computed."""
    if position < len(kept.bares):
        try:
            if _same(bares[position], kept.bares[position]):
                return kept.digests[position]
        except RecursionError:
            pass  # nested too deep to walk: digested (or refused) as before
    return digest_of(bares[position])


def _nodes(thread: bytes, digests: list[bytes], kept: _Thread) -> list[bytes]:
    """The request's nodes (`chained` from the thread's digest): the last request's as
    far as its digests are the same objects (`_digest` gave them back), then computed."""
    same = 0
    while same < min(len(digests), len(kept.digests)) and digests[same] is kept.digests[same]:
        same += 1
    nodes = kept.last_nodes[:same]
    for digest in digests[same:]:
        nodes.append(chained(nodes[-1] if nodes else thread, digest))
    return nodes


def _held(line: list[bytes], nodes: list[bytes]) -> int:
    """How many of ``nodes`` a line (its nodes) holds: a node held means every one before
    it is, so it is found by halving."""
    low, high = 0, min(len(line), len(nodes))
    while low < high:
        middle = (low + high + 1) // 2
        if line[middle - 1] == nodes[middle - 1]:
            low = middle
        else:
            high = middle - 1
    return low


def _longest_line(kept: _Thread, nodes: list[bytes]) -> tuple[int | None, int]:
    """The line that holds the most of the request's nodes, of those the last used
    (None: no line holds its first), and how many: decided on every line's nodes, so the
    same whatever rows are kept in memory."""
    line, keep = None, 0
    for candidate in reversed(kept.order):
        held = _held(kept.nodes[candidate], nodes)
        if held > keep:
            line, keep = candidate, held
    return line, keep


def _place(plan: _Plan, order: list[int]) -> None:
    """Which line the plan's changes go to: the line it matched when they extend it (or
    change what it holds already), else a new line that starts with the matched rows
    (the request leaves its line: a rewind, an edit, or another conversation with the
    same start), the least used lines dropped beyond `LINES_KEPT`."""
    if plan.line is not None and plan.keep == plan.seen:
        plan.written = plan.line
        return
    plan.written = max(order, default=-1) + 1
    if plan.line is not None and plan.keep:
        plan.fork = (plan.line, plan.keep)
    plan.dropped = order[:max(0, len(order) + 1 - LINES_KEPT)]


def _spliced(sent: list[dict[str, Any]], rows: dict[int, LedgerRow], view: View
             ) -> msgspec.Raw:
    """The sent messages as one JSON array, each message sent as its row remembers it
    taken from the row's JSON (encoded once), the others encoded now: the same bytes as
    encoding ``sent``."""
    parts = [b"["]
    kept = (p for p, message in enumerate(view.messages) if message is not None)
    for position, message in zip(kept, sent, strict=True):
        row = rows[position]
        part = row.sent_json() if message is row.sent else None
        parts += (part if part is not None else _encode(message), b",")
    if len(parts) > 1:
        parts[-1] = b"]"  # in place of the last comma
    else:
        parts.append(b"]")
    return msgspec.Raw(b"".join(parts))  # one copy: a 10 MB body is not copied twice


async def _assemble(shape: Shape, messages: list[dict[str, Any]],
                    bares: list[dict[str, Any]], plan: _Plan, view: View,
                    counter: TokenCounter) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """The messages to send (the view's, the agent's marks put back), checked, and the
    tokens the marks add to each marked one (the ledger counts them unmarked).

    Raises:
        CtxdError: -32603 when the agent's request was valid and these are not, or they
            carry more breakpoints than the agent's.
    """
    kept = [(p, remembered) for p, remembered in enumerate(view.messages)
            if remembered is not None]
    sent = [remembered if bares[p] is messages[p] else shape.marked(remembered, messages[p])
            for p, remembered in kept]
    marked = [(p, message) for (p, remembered), message in zip(kept, sent, strict=True)
              if message is not remembered]
    with_marks = await counter.count_messages([shape.counted(m) for _, m in marked])
    marks_tokens = {position: tokens - view.tokens[position]
                    for (position, _), tokens in zip(marked, with_marks, strict=True)}
    if not shape.problems(messages):
        found = shape.problems(sent)
        if found:
            raise internal_error(f"the rewritten request would not be valid: {found[0]}",
                                 {"position": plan.keep})
    if count_marks([m for _, m in marked]) > count_marks(
            [m for m, unmarked in zip(messages, bares, strict=True) if m is not unmarked]):
        raise internal_error("the rewritten request has more cache breakpoints than the "
                             "agent's", {"position": plan.keep})
    return sent, marks_tokens


async def _record_new(actor: SessionActor, shape: Shape, messages: list[dict[str, Any]],
                      bares: list[dict[str, Any]], nodes: list[bytes], plan: _Plan) -> None:
    """The rows of the messages not seen: recorded as ctxd's messages, a large tool
    result as the stub of its blob (offload, decided here once)."""
    if plan.keep == len(messages):
        return
    config = actor.services.config
    threshold = config.hygiene.offload_threshold_bytes
    recorded_all = shape.to_ctxd(messages, plan.keep)
    record = actor.record
    next_seq = (0 if record is None else record.last_seq) + 1
    now = time.time()
    sent_now: list[dict[str, Any]] = []
    for position in range(plan.keep, len(messages)):
        recorded = list(recorded_all[position - plan.keep])
        sent = bares[position]
        for k, result in enumerate(shape.results(sent)):
            message = recorded[k] if k < len(recorded) else None
            if (result.text is None or message is None
                    or message.tool_call_id != result.call_id[:256]):
                continue
            text = result.text
            if text.startswith(PERSISTED_OUTPUT):  # Claude Code's preview of a saved output
                whole: str | None = await trio.to_thread.run_sync(
                    _anthropic.saved_output_of, text, actor.session_id)
                text = whole or text
            offloaded = await offload_off_loop(msgspec.structs.replace(message, content=text),
                                               threshold, actor.session_id, next_seq + k)
            if offloaded is None:
                continue
            stub, blob = offloaded
            if config.scrub_at_rest:
                blob = dataclasses.replace(blob, text=scrub(blob.text).text)
            recorded[k] = stub
            plan.blobs.append(blob.placed(next_seq + k, None, now))
            assert isinstance(stub.content, str)
            sent = shape.with_result(sent, result.index, stub.content)
        if config.hygiene.offload_inputs:
            sent = _offload_inputs(actor.session_id, shape, sent, recorded, next_seq, now,
                                   plan, config.scrub_at_rest)
        plan.rows[position] = LedgerRow(
            position=position, node=nodes[position], sent=sent, agent_tokens=0,
            sent_tokens=0, first_seq=next_seq if recorded else None)
        sent_now.append(sent)
        plan.changed.add(position)
        plan.recorded.extend(recorded)
        next_seq += len(recorded)
    new = range(plan.keep, len(messages))
    counts = await actor.services.counter.count_messages(
        [shape.counted(bares[p]) for p in new] + [shape.counted(m) for m in sent_now])
    for offset, position in enumerate(new):
        plan.rows[position].agent_tokens = counts[offset]
        plan.rows[position].sent_tokens = counts[len(new) + offset]


async def _finish_tool_calls(actor: SessionActor, shape: Shape,
                             messages: list[dict[str, Any]], bares: list[dict[str, Any]],
                             plan: _Plan) -> None:
    """The tool calls the new messages carry results of, to report as finished
    (``completed``, or ``failed`` for an error result) as tool.state would, with
    `SEEN_BY_THE_GATEWAY`: so an agent that reports no states (no hooks, no plugin) has its
    calls listed too. A call already in a terminal state (a hook reported it) is left as
    it is: its state is final."""
    results = [result for position in range(plan.keep, len(messages))
               for result in shape.results(bares[position])
               if result.call_id]  # none: no id to list it by (tool.state's: 1-256 characters)
    if not results:
        return  # most requests: no pass over the history for the calls' names
    names = {call_id: name for message in messages for call_id, name in shape.calls(message)}
    for result in results:
        state: ToolCallState = "failed" if result.is_error else "completed"
        plan.finished[result.call_id[:256]] = (names.get(result.call_id), state)
    plan.finished_from = await actor.services.store.read(tool_states, actor.session_id,
                                                         list(plan.finished))
    for tool_call_id, state in plan.finished_from.items():
        if state in TERMINAL_TOOL_STATES:
            del plan.finished[tool_call_id]


WRITES_FILES = frozenset({"Write", "Edit", "MultiEdit", "NotebookEdit", "write", "edit",
                          "multiedit", "patch", "apply_patch"})
"""The tools whose long arguments go out as markers from the first request (`offload
inputs`): those that write them to a file (Claude Code's, OpenCode's, Codex's), so the
model finds them on disk as well as in the blob. Another tool's arguments (a plan, a
sub-agent's task) stay whole until the compaction chain clears them."""


def _offload_inputs(session_id: str, shape: Shape, sent: dict[str, Any],
                    recorded: list[MessageIn], first_seq: int, now: float, plan: _Plan,
                    scrub_blobs: bool) -> dict[str, Any]:
    """An assistant message's large file-writing arguments offloaded as it is first seen
    (``[hygiene] offload_inputs``, the tools of `WRITES_FILES`): every string the
    compaction chain would clear later (`clear_inputs`: 1 KiB or more, not a command or a
    path) replaced by its marker, in what is sent and in ctxd's copy alike, and kept whole
    in a blob of the message (scrubbed with ``scrub_at_rest``, the markers counted in
    what it keeps), so ``result.read`` with the marker's offset and limit reads it back.
    The prefix never held the original: free for the prompt cache, as offloading a result
    is."""
    stored = (lambda value: scrub(value).text) if scrub_blobs else None
    for k, message in enumerate(recorded):
        if message.role != "assistant" or isinstance(message.content, str):
            continue
        ref_id = ref_id_for(session_id, first_seq + k)
        mine = clear_inputs(message.content, [
            index for index, part in enumerate(message.content)
            if part.get("type") in CALL_PART_TYPES and isinstance(part.get("input"), dict)
            and part.get("name") in WRITES_FILES], ref_id, stored)
        theirs = shape.cleared_inputs(sent, ref_id, WRITES_FILES, stored)
        if mine is None or theirs is None or mine[1] != theirs[1]:
            continue  # nothing to clear, or not the same arguments: sent whole
        content, text = mine
        recorded[k] = msgspec.structs.replace(message, content=content)
        name = next((call for _, call in shape.calls(sent) if call in WRITES_FILES), None)
        plan.blobs.append(ToolResultBlob(
            ref_id=ref_id, tool_name=name, size_bytes=len(text.encode()), text=text,
            parts=None, seq=first_seq + k, created_at=now))
        return theirs[0]
    return sent


def rewrite_points(shape: Shape, messages: list[dict[str, Any]]
                   ) -> list[tuple[str, int, int]]:
    """The folds and compactions the history holds, in order: ``("fold", first, end)``
    drops messages ``first`` to ``end - 1`` (those strictly between the message carrying
    ``context_branch``'s result and the assistant message calling ``context_return``,
    matched by a stack); ``("compaction", 0, end)``: the messages before ``end``, whose
    assistant message called ``compact_context``, stand as its summary. A call whose
    result is an error, or not there yet, is no point."""
    outcome: dict[str, bool] = {}
    for message in messages:
        for result in shape.results(message):
            outcome[result.call_id] = result.is_error
    branches: list[int] = []
    points = []
    for position, message in enumerate(messages):
        for call_id, name in shape.calls(message):
            if outcome.get(call_id, True):
                continue
            if name.endswith("context_branch"):
                branches.append(shape.result_end(messages, position) + 1)
            elif name.endswith("context_return") and branches:
                first = branches.pop()
                if first < position:
                    points.append(("fold", first, position))
            elif name.endswith("compact_context"):
                points.append(("compaction", 0, position))
    return points


@dataclass(frozen=True)
class View:
    """What a request sends for each of its messages (None: left out), after the folds and
    compactions its history holds, with the tokens of each, and those points."""

    messages: list[dict[str, Any] | None]
    tokens: list[int]
    points: list[dict[str, Any]]


def shown(shape: Shape, messages: list[dict[str, Any]], rows: dict[int, LedgerRow],
          points: list[tuple[str, int, int]] | None = None, before: int | None = None
          ) -> View:
    """The view of the ledger's rows: each message as its row sends it, then the rewrite
    points of the history applied in order (those whose end is before ``before``): a fold
    leaves its span out; a compaction whose summary its message holds puts that summary
    in place of the first message before it and leaves the others out (system messages
    stay). Folds are worked out from the history alone, so a rewind past a fold's end
    undoes it; a compaction's summary goes with the message that called it."""
    sent = [rows[p].sent for p in range(len(messages))]
    tokens = [rows[p].sent_tokens if sent[p] is not None else 0 for p in range(len(messages))]
    applied = []
    for kind, first, end in (rewrite_points(shape, messages) if points is None else points):
        if before is not None and end >= before:
            break
        summary = rows[end].compaction
        if kind == "fold":
            span = [p for p in range(first, end) if sent[p] is not None]
        elif summary is not None:
            span = [p for p in range(end) if sent[p] is not None
                    and not shape.is_system(messages[p])]
        else:
            continue
        if not span:
            continue
        removed = sum(tokens[p] for p in span)
        for position in span:
            sent[position], tokens[position] = None, 0
        if kind == "compaction":
            sent[span[0]], tokens[span[0]] = summary, rows[end].compaction_tokens
            removed -= rows[end].compaction_tokens
        applied.append({"kind": kind, "first": span[0], "end": end, "messages": len(span),
                        "tokens_removed": removed})
    return View(messages=sent, tokens=tokens, points=applied)


async def _decide_compactions(actor: SessionActor, shape: Shape,
                              messages: list[dict[str, Any]], plan: _Plan) -> None:
    """The summary of a ``compact_context`` call that is the first message new to the
    ledger (so ctxd recorded, and compacted, everything before it), kept on its row when
    it is smaller than what it stands for (else the cached prefix is worth more)."""
    for kind, _, end in plan.points_of_history:
        if kind != "compaction" or end != plan.keep or not end:
            continue

        async def summary_of(span: list[int], _: View) -> str:
            return await _compaction_summary(actor, len(span))

        await _place_summary(actor, shape, messages, plan, end, summary_of)


async def _place_summary(actor: SessionActor, shape: Shape, messages: list[dict[str, Any]],
                         plan: _Plan, end: int,
                         summary_of: Callable[[list[int], View], Awaitable[str]],
                         worth_it: bool = False) -> bool:
    """A compaction point at ``end``: ``summary_of`` the messages it stands for (their
    positions, and the view they are sent in) as one user message kept on the row at
    ``end``, when it is smaller than they are (else the cached prefix is worth more);
    ``worth_it``: only when it removes at least as many tokens as the request keeps from
    the summary on (which the provider writes to its cache again), so that the request
    at least halves and the next rewrite is as far off. Whether it was placed."""
    view = shown(shape, messages, plan.rows, plan.points_of_history, before=end)
    span = [p for p in range(end) if view.messages[p] is not None
            and not shape.is_system(messages[p])]
    if not span:
        return False
    summary = shape.summary_message(await summary_of(span, view))
    [tokens] = await actor.services.counter.count_messages([shape.counted(summary)])
    removed = sum(view.tokens[p] for p in span) - tokens
    if removed <= 0 or (worth_it and removed < tokens + sum(view.tokens[end:])):
        return False
    plan.rows[end].compaction, plan.rows[end].compaction_tokens = summary, tokens
    return True


async def _compaction_summary(actor: SessionActor, count: int) -> str:
    """The session's main thread as ctxd's compaction left it, as one text (its system
    messages left out: the request keeps its own)."""
    rendered = await render(actor, RenderParams(session_id=actor.session_id, branch_id=None))
    lines = [f"[ctxd compacted the {count} messages before this point; what follows is the "
             "context as ctxd keeps it (message.list keeps the originals).]"]
    for message in rendered.messages:
        if message.role == "system":
            continue  # the request's system messages stay in place (`shown`)
        content = message.content
        text = content if isinstance(content, str) else "\n".join(
            part_text(part) for part in content)
        lines.append(f"{message.role}: {text}")
    return "\n\n".join(lines)


async def _clear_if_over(actor: SessionActor, shape: Shape,
                         messages: list[dict[str, Any]], plan: _Plan, fixed: int,
                         ratio: float) -> None:
    """The automatic compaction point: when the request would pass the session's
    ``compact_trigger``, clear old tool results (oldest first, never an error, never in
    the last `KEEP_RECENT` messages) to a marker, down to ``[hygiene] compact_target``
    and at least ``[hygiene] clear_at_least`` tokens' worth in one step, or nothing.

    The window is the provider's, so ctxd's count is calibrated first: ``ratio`` is the
    provider's tokens per token ctxd counts for this model (`hub.provider_ratio`; 1.0
    before its first call is recorded)."""
    record = actor.record
    if record is None:
        return
    view = shown(shape, messages, plan.rows, plan.points_of_history)
    total = fixed + sum(view.tokens)
    if total * ratio / record.budget.effective_window < record.budget.compact_trigger:
        return
    candidates: list[tuple[int, int, int, str]] = []
    for position in range(len(messages) - KEEP_RECENT):
        row = plan.rows[position]
        if row.sent is None or view.messages[position] is not row.sent \
                or row.first_seq is None:
            continue  # left out, or a summary stands in its place
        given = shape.results(messages[position])
        for k, (result, original) in enumerate(zip(shape.results(row.sent), given,
                                                   strict=True)):
            if not result.text or result.is_error or result.text != original.text:
                continue  # not text, an error, or offloaded or cleared already
            candidates.append((position, result.index, row.first_seq + k, result.text))
    if not candidates:
        await _compact_over(actor, shape, messages, plan)
        return
    # What clearing one recovers: its text, less the marker that stands for it.
    *counts, marker = await actor.services.counter.count_texts(
        [text for *_, text in candidates] + [cleared_text(ref_id_for(actor.session_id, 0))])
    hygiene = actor.services.config.hygiene
    # Down to compact_target, as the compaction chain goes: the next point is then far off.
    goal = max(hygiene.clear_at_least,
               total - int(hygiene.compact_target * record.budget.effective_window / ratio))
    chosen, recovered = [], 0
    for candidate, tokens in zip(candidates, counts, strict=True):
        if recovered >= goal:
            break
        chosen.append(candidate)
        recovered += tokens - marker
    if recovered < goal:
        await _compact_over(actor, shape, messages, plan)
        return
    refs = await actor.services.store.read(blob_refs, actor.session_id,
                                           [seq for _, _, seq, _ in chosen])
    now = time.time()
    touched = set()
    for position, index, seq, text in chosen:
        if seq in refs:
            ref_id = refs[seq][0]
        else:
            ref_id = ref_id_for(actor.session_id, seq)
            plan.blobs.append(ToolResultBlob(
                ref_id=ref_id, tool_name=None, size_bytes=len(text.encode()),
                text=scrub(text).text if actor.services.config.scrub_at_rest else text,
                parts=None, seq=seq, created_at=now))
        if position not in touched:  # a copy: the kept ledger's row stays as committed
            plan.rows[position] = copy.copy(plan.rows[position])
        row = plan.rows[position]
        assert row.sent is not None
        row.sent = shape.with_result(row.sent, index, cleared_text(ref_id))
        touched.add(position)
    ordered = sorted(touched)
    counts = await actor.services.counter.count_messages(
        [shape.counted(row.sent) for p in ordered if (row := plan.rows[p]).sent is not None])
    before = sum(plan.rows[p].sent_tokens for p in ordered)
    for position, tokens in zip(ordered, counts, strict=True):
        plan.rows[position].sent_tokens = tokens
        plan.changed.add(position)
    plan.points.append({"kind": "clear", "first": ordered[0], "end": ordered[-1] + 1,
                        "messages": len(ordered), "tokens_removed": before - sum(counts)})


def _with_automatic(points: list[tuple[str, int, int]], rows: dict[int, LedgerRow]
                    ) -> list[tuple[str, int, int]]:
    """The history's rewrite points and the automatic compaction points the ledger
    holds (a row with a summary no ``compact_context`` call placed), in order of their
    end."""
    called = {end for kind, _, end in points if kind == "compaction"}
    automatic = [("compaction", 0, position) for position, row in rows.items()
                 if row.compaction is not None and position not in called]
    return sorted(points + automatic, key=lambda point: point[2]) if automatic else points


async def _compact_over(actor: SessionActor, shape: Shape, messages: list[dict[str, Any]],
                        plan: _Plan) -> None:
    """The automatic compaction point, when clearing old results cannot bring a request
    under the session's ``compact_trigger``: the messages before the first one new to the
    ledger become one user message, their extractive summary as sent (stubs and markers
    for what was offloaded; an earlier summary carried over; ``[hygiene]
    summary_max_tokens``), kept on that message's row so every later request sends the
    same bytes. message.list keeps the originals, result.read the offloaded.
    Only where the request stays valid (the first new message is the assistant's, so the
    summary is followed by it) and when the summary is smaller than what it stands for."""
    end = plan.keep
    if not actor.services.config.hygiene.auto_compact or not 0 < end < len(messages) \
            or messages[end].get("role") != "assistant" or shape.is_system(messages[end]):
        return

    async def summary_of(span: list[int], view: View) -> str:
        sent = [message for p in span if (message := view.messages[p]) is not None]
        thread = [RenderedMessage(role=m.role, content=m.content, name=m.name,
                                  tool_call_id=m.tool_call_id)
                  for recorded in shape.to_ctxd(sent, 0) for m in recorded]
        return extract_summary(thread, actor.services.config.hygiene.summary_max_tokens)

    if await _place_summary(actor, shape, messages, plan, end, summary_of, worth_it=True):
        plan.changed.add(end)
        plan.points_of_history = _with_automatic(
            [point for point in plan.points_of_history if point[2] != end], plan.rows)


async def _inject(actor: SessionActor, shape: Shape, messages: list[dict[str, Any]],
                  plan: _Plan, fixed: int, can_compact: bool) -> None:
    """On a conversation's first request the memories that fit its first user message,
    the session's pending injections, and the context note when this request's usage
    passes the session's ``warn`` or ``caution`` (``fixed``: the tokens of the system
    prompt and tools) and the model has ctxd's ``compact_context`` tool to act on it
    (``can_compact``; without it the note is noise, and the gateway compacts by itself at
    ``compact_trigger``), as a last text block of the request's last new user message
    (Claude Code may end a request with a system message): never in a message sent
    before, so the cached prefix holds; delivered there once, then part of that message's
    bytes."""
    if actor.record is None:
        return
    view = shown(shape, messages, plan.rows, plan.points_of_history)
    target = next((p for p in range(len(messages) - 1, plan.keep - 1, -1)
                   if view.messages[p] is not None and messages[p].get("role") == "user"),
                  None)
    if target is None:
        return
    pending, _ = await actor.services.store.read(list_injections, actor.session_id,
                                                 "pending", 1_000_000)
    pending.sort(key=lambda info: INJECT_PRIORITIES.index(info.priority))
    notes = [f"[ctxd injection{f' from {info.source}' if info.source else ''}] "
             f"{info.content}" for info in pending]
    memories = await _memories(actor, shape, messages) if plan.new_thread else None
    if memories is not None and memories.text is not None:
        notes.insert(0, memories.text)
    context_note = _context_note(actor, plan, view, fixed) if can_compact else None
    if context_note:
        notes.append(context_note)
    row = plan.rows[target]
    noted = None if not notes or row.sent is None else shape.with_note(row.sent,
                                                                       "\n\n".join(notes))
    if noted is None:
        return
    [row.sent_tokens] = await actor.services.counter.count_messages([shape.counted(noted)])
    row.sent = noted
    plan.delivered = pending
    plan.memories = memories


def _offers(body: dict[str, Any], suffix: str) -> bool:
    """Whether the request offers the model a tool whose name ends with ``suffix`` (an
    Anthropic tool's ``name``, an OpenAI tool's ``function.name``; an MCP server's tools
    come prefixed, ``mcp__ctxd__compact_context``)."""
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else (
            tool.get("name") if isinstance(tool, dict) else None)
        if isinstance(name, str) and name.endswith(suffix):
            return True
    return False


def _context_note(actor: SessionActor, plan: _Plan, view: View, fixed: int) -> str | None:
    """``[hygiene] context_note`` when this request's usage is past a threshold (``warn``,
    ``caution``) that the messages before its new ones were not: once per threshold
    crossed, not on every turn (docs/protocol.md, The context note)."""
    budget = actor.require().budget
    window = budget.effective_window
    before, now = fixed + sum(view.tokens[:plan.keep]), fixed + sum(view.tokens)

    def level(tokens: int) -> int:
        return sum(tokens / window >= threshold for threshold in (budget.warn, budget.caution))

    note = actor.services.config.hygiene.context_note
    if not note or level(now) <= level(before):
        return None
    return note.format(percent=round(now / window * 100))


AGENT_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)
"""What an agent adds to its user's first message (Claude Code: the project's CLAUDE.md,
the date, the tools' notes): not the user's words, so not what memories are found by; its
hundreds of words would let any memory share two of them (docs/protocol.md, Injection into
a new branch)."""


async def _memories(actor: SessionActor, shape: Shape,
                    messages: list[dict[str, Any]]) -> Injected | None:
    """The memories for a conversation that starts (None: no memory service, or no
    user text to look them up with), within `MEMORY_SHARE` of the effective window."""
    memory = actor.services.memory
    record = actor.require()
    first = next((message for message in messages if message.get("role") == "user"), None)
    query = None if first is None else AGENT_REMINDER.sub(
        " ", _text_of(first.get("content"))).strip()
    if memory is None or not query:
        return None
    cap = int(MEMORY_SHARE * record.budget.effective_window)
    return await memory.inject(query, project_scope(record.project), cap,
                               header=PROMPT_HEADER)


def _text_of(content: Any) -> str:
    """The text of a message's content (its text blocks)."""
    if isinstance(content, str):
        return content
    return "\n".join(block["text"] for block in content or ()
                     if block.get("type") == "text" and isinstance(block.get("text"), str))


def _stage(session_id: str, plan: _Plan, now: float,
           memory: Memory | None) -> Callable[[Transaction], None]:
    """The gateway's steps of the request's transaction: blobs, ledger, deliveries, the
    memories' use."""

    def stage(transaction: Transaction) -> None:
        stage_blobs(transaction, session_id, plan.blobs)
        assert plan.written is not None
        transaction.add(save_line, session_id, plan.thread, plan.written,
                        [plan.rows[p] for p in sorted(plan.changed)], plan.fork, plan.dropped)
        if plan.delivered:
            transaction.add(_deliver, session_id, [i.injection_id for i in plan.delivered],
                            now)
        if plan.memories is not None and memory is not None:
            memory.stage_use(transaction, plan.memories, session_id)
        if plan.finished:
            transaction.add(finish_tool_calls, session_id,
                            [(call_id, name, state)
                             for call_id, (name, state) in plan.finished.items()],
                            SEEN_BY_THE_GATEWAY, now)

    return stage


def _deliver(conn: Any, session_id: str, injection_ids: Sequence[str], now: float) -> None:
    """Mark the injections sent in a request delivered and accepted: the model has them."""
    pull_injections(conn, session_id, INJECT_PRIORITIES[-1], len(injection_ids), now, 0.0)
    for injection_id in injection_ids:
        ack_injection(conn, injection_id, True, "sent to the model by the gateway", now)


async def _commit(actor: SessionActor, plan: _Plan) -> None:
    """Write what the plan changed in one transaction (the recorded messages' append,
    when there are any), then publish its events: a new line of a thread that had lines
    is a boundary (the agent compacted, the user rewound, or another conversation of the
    session started)."""
    diverged = plan.written != plan.line and not plan.new_thread
    now = time.time()
    stage = _stage(actor.session_id, plan, now, actor.services.memory)
    tokens: dict[int, int] = {}
    if plan.recorded:
        expected = actor.require().last_seq + 1
        result = await append(actor, MessageAppendParams(
            session_id=actor.session_id, messages=plan.recorded, allow_over=True), stage)
        if result.appended[0].seq != expected:
            raise internal_error("the recorded messages were not numbered as planned",
                                 {"session_id": actor.session_id})
        tokens = {appended.seq: appended.tokens for appended in result.appended}
    else:
        transaction = Transaction()
        stage(transaction)
        await actor.services.store.commit(transaction)
    bus = actor.services.bus
    if diverged:
        bus.publish(actor.session_id, "gateway.boundary", {"position": plan.keep})
    for blob in plan.blobs:
        if blob.seq in tokens:  # offloaded as it was recorded (not cleared later)
            bus.publish(actor.session_id, "result.offloaded",
                        {"branch_id": None, "seq": blob.seq, "ref_id": blob.ref_id,
                         "tool_name": blob.tool_name, "size_bytes": blob.size_bytes,
                         "tokens": tokens[blob.seq]})
    for point in plan.points:
        bus.publish(actor.session_id, "gateway.rewrite_point", point)
    for tool_call_id, (name, state) in plan.finished.items():
        bus.publish(actor.session_id, "tool.state", {
            "tool_call_id": tool_call_id, "tool_name": name,
            "from": plan.finished_from.get(tool_call_id), "to": state,
            "detail": SEEN_BY_THE_GATEWAY, "terminal": True, "allowed_next": []})
    for info in plan.delivered:
        bus.publish(actor.session_id, "inject.delivered",
                    {"injection_id": info.injection_id, "priority": info.priority,
                     "deliveries": info.deliveries + 1})


"""The compaction chain's choices: which old tool results to clear, which oldest span to
summarise, which oldest messages to truncate (docs/protocol.md, "Compaction"). Pure
functions over a thread's kept messages; the session actor counts, summarises and writes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ctxd.hygiene._offload import is_error_result
from ctxd.wire.types import Component, Content, RenderedMessage, Role

CLEAR_MIN_BYTES = 1_024
"""A tool result smaller than this is not worth clearing (its marker takes a third of it)."""
COMPACTION_META = "compaction"
"""The ``meta`` key of a message compaction wrote: ``cleared``, ``summary`` or
``truncated``."""


def cleared_text(ref_id: str) -> str:
    """What a cleared tool result renders as: the MCP tool and the shell command that read
    it back (the stub's two ways, `stub_text`)."""
    return (f'[Old tool result content cleared — read it with read_result ref_id="{ref_id}" '
            f"or ctxctl result {ref_id}]")


def summary_text(count: int, summarizer: str, summary: str) -> str:
    """The message that stands for a summarised span."""
    return (f"[Summary of {count} earlier messages, written by the {summarizer} summarizer "
            f"when ctxd compacted the context; message.list keeps the originals.]\n\n{summary}")


def truncated_text(count: int) -> str:
    """The message that stands for truncated messages."""
    return (f"[{count} earlier messages were truncated to free context; message.list keeps "
            "them.]")


@dataclass(frozen=True)
class ThreadMessage:
    """A kept message of the thread being compacted, in thread order."""

    seq: int
    position: int
    """Where it sits in the thread (its seq, or for a message compaction wrote, the seq of
    the first message it stands for)."""
    role: Role
    content: Content
    tokens: int
    component: Component
    name: str | None = None
    tool_call_id: str | None = None
    meta: dict[str, Any] | None = None
    size_bytes: int = 0
    """A tool result's size as it was given (its blob's when it was offloaded)."""
    ref_id: str | None = None
    """The blob that holds it whole, when it has one."""
    pinned: bool = False
    """Never compacted: a system message, or a branch's opening."""

    def rendered(self) -> RenderedMessage:
        return RenderedMessage(role=self.role, content=self.content, name=self.name,
                               tool_call_id=self.tool_call_id)


def is_tool_result(message: ThreadMessage) -> bool:
    """A ``tool`` message, or a user message that carries ``tool_result`` parts (the shape
    of Anthropic's API): it belongs with the call before it."""
    if message.role == "tool":
        return True
    return (message.role == "user" and not isinstance(message.content, str)
            and any(part.get("type") == "tool_result" for part in message.content))


def _written_by_compaction(message: ThreadMessage) -> bool:
    return message.meta is not None and COMPACTION_META in message.meta


def _is_summary(message: ThreadMessage) -> bool:
    return message.meta is not None and message.meta.get(COMPACTION_META) == "summary"


def clear_candidates(messages: Sequence[ThreadMessage], keep: int) -> list[ThreadMessage]:
    """The tool results the first strategy may clear, oldest first: not among the newest
    ``keep`` tool results, not an error, of at least `CLEAR_MIN_BYTES`, not already a
    marker."""
    results = [m for m in messages if m.role == "tool" and not _written_by_compaction(m)]
    older = results[:max(0, len(results) - keep)]
    return [m for m in older if not m.pinned and not is_error_result(m)
            and m.size_bytes >= CLEAR_MIN_BYTES]


KEPT_INPUT_KEYS = frozenset({
    "command", "cmd", "script", "path", "file_path", "filepath", "filename", "file", "paths",
    "files", "notebook_path", "target_file", "source", "destination"})
"""Arguments of a tool call that clearing never touches: what was run and on which files."""
CALL_PART_TYPES = frozenset({"tool_use", "tool_call", "function_call"})


def cleared_input_text(ref_id: str, offset: int, chars: int) -> str:
    """What a cleared argument of an old tool call renders as: where its value is in the
    blob (``result.read`` with this offset and limit reads it back exactly)."""
    return (f'[Old tool input cleared — {chars:,} chars; read it with read_result '
            f'ref_id="{ref_id}" offset={offset} limit={chars} or ctxctl result {ref_id} '
            f"--offset {offset} --limit {chars}]")


def _calls(message: ThreadMessage) -> list[int]:
    """The indexes of an assistant message's tool-call parts whose input is an object."""
    if message.role != "assistant" or isinstance(message.content, str):
        return []
    return [index for index, part in enumerate(message.content)
            if part.get("type") in CALL_PART_TYPES and isinstance(part.get("input"), dict)]


def input_clear_candidates(messages: Sequence[ThreadMessage],
                           keep: int) -> list[tuple[ThreadMessage, list[int]]]:
    """The assistant messages whose tool calls' inputs the first strategy may clear, oldest
    first, each with the indexes of its call parts that are not among the newest ``keep``
    tool calls of the thread (messages compaction wrote count, and are not cleared
    again)."""
    calls = [(message, index) for message in messages for index in _calls(message)]
    older: dict[int, tuple[ThreadMessage, list[int]]] = {}
    for message, index in calls[:max(0, len(calls) - keep)]:
        if message.pinned or _written_by_compaction(message):
            continue
        older.setdefault(id(message), (message, []))[1].append(index)
    return list(older.values())


def clear_inputs(content: Sequence[dict[str, Any]], calls: Sequence[int], ref_id: str,
                 stored: Callable[[str], str] | None = None
                 ) -> tuple[list[dict[str, Any]], str] | None:
    """``content`` with every string of at least `CLEAR_MIN_BYTES` (UTF-8) in the inputs of
    its parts ``calls`` — at any depth, except under `KEPT_INPUT_KEYS` — replaced by
    `cleared_input_text`, and the blob text those values make, one after the other (the
    markers give each one's offset); None when there is none. The inputs keep their
    keys. ``stored``: what the blob keeps of each value (scrubbed, with ``scrub_at_rest``),
    the markers' offsets and lengths counted in it."""
    pieces: list[str] = []
    offset = 0

    def walk(value: Any, key: str | None) -> Any:
        nonlocal offset
        if isinstance(value, str):
            if key in KEPT_INPUT_KEYS or len(value) * 4 < CLEAR_MIN_BYTES \
                    or len(value.encode()) < CLEAR_MIN_BYTES:
                return value
            kept = value if stored is None else stored(value)
            pieces.append(kept)
            offset += len(kept)
            return cleared_input_text(ref_id, offset - len(kept), len(kept))
        if isinstance(value, dict):
            return {name: walk(item, name) for name, item in value.items()}
        if isinstance(value, list):
            return [walk(item, key) for item in value]
        return value

    chosen = set(calls)
    cleared = [{**part, "input": walk(part["input"], None)}
               if index in chosen and isinstance(part.get("input"), dict) else part
               for index, part in enumerate(content)]
    return (cleared, "".join(pieces)) if pieces else None


def latest_request(messages: Sequence[ThreadMessage]) -> int | None:
    """The index of the latest request the user wrote: it stays as it is."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role == "user" and not is_tool_result(message) \
                and not _written_by_compaction(message) and not message.pinned:
            return index
    return None


def newest_group(messages: Sequence[ThreadMessage]) -> int:
    """Where the newest message group starts (a message and the tool results that follow
    it): the work in hand, never summarised or truncated."""
    index = len(messages) - 1
    while index > 0 and is_tool_result(messages[index]):
        index -= 1
    return max(0, index)


def _boundary(messages: Sequence[ThreadMessage], end: int) -> bool:
    """Whether a span may end before ``messages[end]``: a tool call is never separated
    from its results."""
    return end >= len(messages) or not is_tool_result(messages[end])


def oldest_span(messages: Sequence[ThreadMessage], needed: int,
                skip_summary: bool = False) -> tuple[int, int]:
    """The oldest span ``[start, end)`` whose tokens reach ``needed`` (or as many as may
    go): it starts at the oldest message that is not pinned (``skip_summary``: nor a
    summary), and ends where no tool call is cut from its results, before the next pinned
    message, the latest user request and the newest message group. ``start == end``:
    nothing can go."""
    limit = newest_group(messages)
    request = latest_request(messages)
    start = 0
    while start < limit and (messages[start].pinned or start == request
                             or (skip_summary and _is_summary(messages[start]))):
        start += 1
    end = start
    best = start
    total = 0
    while end < limit and not messages[end].pinned and end != request:
        total += messages[end].tokens
        end += 1
        if _boundary(messages, end):
            best = end
            if total >= needed:
                break
    return start, best

"""The compaction chain's choices: which old tool results to clear, which oldest span to
summarise, which oldest messages to truncate (docs/protocol.md, "Compaction"). Pure
functions over a thread's kept messages; the session actor counts, summarises and writes.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    """What a cleared tool result renders as."""
    return f'[Old tool result content cleared — read it with read_result ref_id="{ref_id}"]'


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

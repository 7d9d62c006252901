"""The compaction chain of one thread: clear old tool results, summarise the oldest span,
truncate the oldest messages, until the thread is under its target (docs/protocol.md,
"Compaction"). It plans; the session actor writes the plan in one transaction."""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import apsw
import msgspec
import trio

from ctxd.config import HygieneConfig
from ctxd.hygiene import (
    COMPACTION_META,
    Summarizer,
    SummarizerError,
    ThreadMessage,
    ToolResultBlob,
    blob_refs,
    clear_candidates,
    clear_inputs,
    cleared_text,
    input_clear_candidates,
    offload,
    oldest_span,
    ref_id_for,
    result_size,
    summary_text,
    truncated_text,
)
from ctxd.scrub import ScrubError, scrub_value
from ctxd.sessions import _queries as q
from ctxd.tokens import TokenCounter
from ctxd.wire.types import (
    COMPONENTS,
    Compaction,
    Component,
    MessageIn,
    StoredMessage,
    Strategy,
)

log = logging.getLogger("ctxd.sessions")
STRATEGIES: tuple[Strategy, ...] = ("clear", "summarize", "truncate")


def thread_view(conn: apsw.Connection, session_id: str, thread: str | None,
                opening_meta: dict[str, Any]) -> list[ThreadMessage]:
    """The kept messages of a thread (a branch: its own), in thread order, as compaction
    reads them (in the store's thread)."""
    rows = q.thread_rows(conn, session_id, thread)
    refs = blob_refs(conn, session_id, [m.seq for m in rows if m.role == "tool"])
    view = []
    for m in rows:
        ref = refs.get(m.seq)
        view.append(ThreadMessage(
            seq=m.seq, position=m.seq if m.at_seq is None else m.at_seq, role=m.role,
            content=m.content, tokens=m.tokens, component=m.component, name=m.name,
            tool_call_id=m.tool_call_id, meta=m.meta,
            size_bytes=(ref[1] if ref else result_size(m.content)) if m.role == "tool" else 0,
            ref_id=ref[0] if ref else None,
            pinned=m.role == "system" or m.meta == opening_meta))
    return view


@dataclass
class Plan:
    """What a compaction writes: the messages that stand for others, the marks on those
    they replace, the blobs of cleared results that had none, and its figures."""

    session_id: str
    thread: str | None
    next_seq: int
    now: float
    used: int
    """The rendered thread's tokens, as the plan has it so far."""
    replacements: list[StoredMessage] = field(default_factory=list)
    marks: list[tuple[int, Compaction, int]] = field(default_factory=list)
    blobs: list[ToolResultBlob] = field(default_factory=list)
    removed: dict[Component, int] = field(default_factory=lambda: dict.fromkeys(COMPONENTS, 0))
    strategies_run: list[Strategy] = field(default_factory=list)
    counts: dict[Compaction, int] = field(
        default_factory=lambda: {"cleared": 0, "summarized": 0, "truncated": 0})
    summarizer: str | None = None
    summarizer_error: str | None = None

    @property
    def added(self) -> int:
        return sum(m.tokens for m in self.replacements)

    def replace(self, view: list[ThreadMessage], gone: Sequence[ThreadMessage],
                what: Compaction, message: MessageIn, tokens: int,
                meta: dict[str, Any]) -> list[ThreadMessage]:
        """Put ``message`` where ``gone`` (contiguous in ``view``, or one message) was."""
        seq = self.next_seq
        self.next_seq += 1
        position = gone[0].position
        self.replacements.append(StoredMessage(
            seq=seq, role=message.role, content=message.content, component="conversation",
            tokens=tokens, created_at=self.now, name=message.name,
            tool_call_id=message.tool_call_id, meta=meta, branch_id=self.thread,
            at_seq=position))
        for old in gone:
            self.marks.append((old.seq, what, seq))
            self.removed[old.component] += old.tokens
        self.counts[what] += len(gone)
        self.used += tokens - sum(old.tokens for old in gone)
        stand_in = ThreadMessage(seq=seq, position=position, role=message.role,
                                 content=message.content, tokens=tokens,
                                 component="conversation", name=message.name,
                                 tool_call_id=message.tool_call_id, meta=meta)
        first = _index_of(view, gone[0])
        return [*view[:first], stand_in, *view[first + len(gone):]]


def _index_of(view: list[ThreadMessage], message: ThreadMessage) -> int:
    """Where ``message`` (this very object) is in ``view``. By identity, found by its
    position (``view`` is in thread order): ``list.index`` compared the dataclasses field
    by field, 27 of the 30 ms that clearing 154 results of a 674-message thread took
    (docs/performance.md, "Context hygiene")."""
    at = bisect.bisect_left(view, message.position, key=attrgetter("position"))
    if at < len(view) and view[at] is message:
        return at
    return next(i for i, kept in enumerate(view) if kept is message)


class Compactor:
    """Plans one compaction of a thread with a session's settings."""

    def __init__(self, counter: TokenCounter, config: HygieneConfig, summarizer: Summarizer):
        self._counter = counter
        self._config = config
        self._summarizer = summarizer

    async def plan(self, view: list[ThreadMessage], plan: Plan, goal: int,
                   strategies: Sequence[Strategy]) -> list[ThreadMessage]:
        """Run the chain on ``view`` until ``plan.used`` is at most ``goal``; returns the
        thread as it would be."""
        for strategy in STRATEGIES:
            if plan.used <= goal:
                break
            if strategy not in strategies:
                continue
            plan.strategies_run.append(strategy)
            if strategy == "clear":
                view = await self._clear(view, plan, goal)
            elif strategy == "summarize":
                view = await self._summarize(view, plan, goal)
            else:
                view = await self._truncate(view, plan, goal)
        return view

    async def _clear(self, view: list[ThreadMessage], plan: Plan,
                     goal: int) -> list[ThreadMessage]:
        """Old tool results, and the large arguments of old tool calls, oldest first, each
        replaced by a marker naming the blob that keeps it (one is written for a result
        that was inline, and for the arguments a message's calls had)."""
        keep = self._config.keep_tool_results
        chosen: list[tuple[ThreadMessage, MessageIn, ToolResultBlob | None]] = []
        for old in clear_candidates(view, keep):
            blob = None
            ref_id = old.ref_id
            if ref_id is None:
                whole = offload(MessageIn(role="tool", content=old.content, name=old.name,
                                          tool_call_id=old.tool_call_id), 0,
                                plan.session_id, old.seq)
                if whole is None:
                    continue  # not text (an image): it has no blob to read it back from
                blob = whole[1].placed(old.seq, plan.thread, plan.now)
                ref_id = blob.ref_id
            chosen.append((old, MessageIn(role="tool", content=cleared_text(ref_id),
                                          name=old.name, tool_call_id=old.tool_call_id),
                           blob))
        for old, calls in input_clear_candidates(view, keep):
            if isinstance(old.content, str):
                continue  # never: a message with call parts has a list of them
            ref_id = ref_id_for(plan.session_id, old.seq)
            cleared = clear_inputs(old.content, calls, ref_id)
            if cleared is None:
                continue
            content, text = cleared
            name = old.content[calls[0]].get("name")
            blob = ToolResultBlob(ref_id=ref_id, tool_name=name if isinstance(name, str)
                                  else None, size_bytes=len(text.encode()), text=text,
                                  parts=None).placed(old.seq, plan.thread, plan.now)
            chosen.append((old, MessageIn(role=old.role, content=content, name=old.name,
                                          tool_call_id=old.tool_call_id), blob))
        chosen.sort(key=lambda choice: choice[0].position)
        tokens = await self._counter.count_messages([marker for _, marker, _ in chosen])
        for (old, marker, blob), marker_tokens in zip(chosen, tokens, strict=True):
            if plan.used <= goal:
                break
            if marker_tokens >= old.tokens:
                continue
            view = plan.replace(view, [old], "cleared", marker, marker_tokens,
                                {COMPACTION_META: "cleared", "seq": old.seq})
            if blob is not None:
                plan.blobs.append(blob)
        return view

    async def _summarize(self, view: list[ThreadMessage], plan: Plan,
                         goal: int) -> list[ThreadMessage]:
        """The oldest span that brings the thread under ``goal`` once its summary stands
        in for it (a summary takes up to ``summary_max_tokens``)."""
        limit = self._config.summary_max_tokens
        needed = plan.used - goal
        # The summary takes room of its own: the span covers that too (at most the limit).
        start, end = oldest_span(view, needed + min(limit, needed))
        span = view[start:end]
        if len(span) < 2:
            return view
        name = self._summarizer.name
        plan.summarizer = name
        try:
            with_timeout = self._config.summarizer_timeout_s
            summary = await _summarize_within(self._summarizer, span, limit, with_timeout)
        except SummarizerError as exc:
            plan.summarizer_error = str(exc)
            log.warning("the %s summarizer failed (compaction goes on to truncation): %s",
                        name, exc)
            return view
        tokens = await self._counter.encode_async(summary)
        if len(tokens) > limit:
            summary = self._counter.decode(tokens[:limit]) + " …[summary cut]"
        message = MessageIn(role="user", content=summary_text(len(span), name, summary))
        [message_tokens] = await self._counter.count_messages([message])
        if message_tokens >= sum(m.tokens for m in span):
            plan.summarizer_error = (f"the summary ({message_tokens} tokens) was not shorter "
                                     "than the span it was to replace")
            return view
        return plan.replace(view, span, "summarized", message, message_tokens,
                            {COMPACTION_META: "summary", "summarizer": name,
                             "first_seq": span[0].seq, "last_seq": span[-1].seq})

    async def _truncate(self, view: list[ThreadMessage], plan: Plan,
                        goal: int) -> list[ThreadMessage]:
        """The oldest messages after the summary, one marker standing for them."""
        start, end = oldest_span(view, plan.used - goal, skip_summary=True)
        span = view[start:end]
        if not span:
            return view
        message = MessageIn(role="user", content=truncated_text(len(span)))
        [message_tokens] = await self._counter.count_messages([message])
        if message_tokens >= sum(m.tokens for m in span):
            return view
        return plan.replace(view, span, "truncated", message, message_tokens,
                            {COMPACTION_META: "truncated", "first_seq": span[0].seq,
                             "last_seq": span[-1].seq})


async def _summarize_within(summarizer: Summarizer, span: Sequence[ThreadMessage],
                            max_tokens: int, timeout_s: float) -> str:
    """The summarizer's summary of ``span``, or `SummarizerError` (its own failures, an
    empty summary, an unexpected exception, or no answer within ``timeout_s``)."""
    rendered = [m.rendered() for m in span]
    if summarizer.name != "extractive":
        # The span leaves the daemon: scrubbed, fail closed (docs/security.md).
        try:
            rendered = [msgspec.structs.replace(m, content=scrub_value(m.content))
                        for m in rendered]
        except ScrubError as exc:
            raise SummarizerError(f"the span could not be checked for secrets ({exc}); it "
                                  "was not sent") from exc
    started = time.monotonic()
    with trio.move_on_after(timeout_s) as scope:
        try:
            summary = await summarizer.summarize(rendered, max_tokens)
        except SummarizerError:
            raise
        except Exception as exc:
            log.exception("the %s summarizer raised", summarizer.name)
            raise SummarizerError(f"{type(exc).__name__}: {exc}") from exc
    if scope.cancelled_caught:
        raise SummarizerError(f"no summary within {timeout_s:g} s "
                              f"(waited {time.monotonic() - started:.1f} s)")
    if not summary.strip():
        raise SummarizerError("the summary was empty")
    return summary.strip()

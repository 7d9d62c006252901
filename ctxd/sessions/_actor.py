"""SessionActor: owns one session's record and its branches, and runs that session's
requests one at a time; the only writer of both (docs/architecture.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import regex
import trio

from ctxd.errors import (
    CtxdError,
    ErrorCode,
    internal_error,
    invalid_state,
    not_found,
    params_error,
    scrub_failed,
    shutting_down,
)
from ctxd.folding import (
    OPENING_META,
    Branches,
    Discarded,
    Fold,
    Opening,
    branch_note,
    not_active,
    partial_result,
    rendered_tokens,
)
from ctxd.hygiene import (
    SessionTool,
    Snapshot,
    ToolResultBlob,
    called_tools,
    check_tools,
    compile_pattern,
    counted_form,
    defer,
    deferred_note,
    drop_snapshot_after,
    grep,
    load_blob,
    load_snapshot,
    load_tools,
    offload,
    originals,
    page,
    rank,
    save_snapshot,
    stage_blobs,
    stage_promote,
    stage_register,
    stage_use,
)
from ctxd.jobs import Request, Slot, cancellation_point, current_request, working_for
from ctxd.memory import INJECT_SHARE, Injected, Memory, MemoryCandidate, project_scope
from ctxd.scrub import ScrubError, scrub, scrub_value
from ctxd.sessions import _queries as q
from ctxd.sessions._compaction import STRATEGIES, Plan, thread_view
from ctxd.sessions._state import (
    COMPACT_BREAKER,
    SessionRecord,
    effective_window,
    health_of,
    resolve_budget,
    thread_tokens,
)
from ctxd.store import Transaction
from ctxd.tokens import REPLY_PRIMING
from ctxd.wire.types import (
    COMPONENTS,
    AppendedMessage,
    Branch,
    BranchCreateParams,
    BranchCreateResult,
    BranchListParams,
    BranchListResult,
    BranchReturnParams,
    BranchReturnResult,
    BranchRollbackParams,
    BranchRollbackResult,
    BranchStatusResult,
    BudgetMeasureParams,
    BudgetMeasureResult,
    CompactResult,
    Component,
    ContextCompactParams,
    ContextCompactResult,
    ContextState,
    FoldSummary,
    ForcedReturn,
    Injection,
    MessageAppendParams,
    MessageAppendResult,
    MessageIn,
    MessageListParams,
    MessageListResult,
    RegisteredTool,
    RenderParams,
    RenderResult,
    RenderStats,
    ResultReadParams,
    ResultReadResult,
    SessionDeleteResult,
    SessionOpenParams,
    SessionOpenResult,
    SessionResult,
    SessionResumeResult,
    StoredMessage,
    Strategy,
    ToolMatch,
    ToolsRegisterParams,
    ToolsRegisterResult,
    ToolsSearchParams,
    ToolsSearchResult,
)

if TYPE_CHECKING:
    from ctxd.sessions._fork import Seed
    from ctxd.sessions._supervisor import Supervisor

log = logging.getLogger("ctxd.sessions")
Op = Callable[["SessionActor"], Awaitable[Any]]
Queued = tuple[Op, Slot[Any], Request | None]
"""An operation in a mailbox, its caller's reply, and the request it works for."""

_encode = msgspec.json.Encoder().encode
MAILBOX_SIZE = 32
SEARCH_TIMEOUT_S = 5.0
"""How long `result.read`'s pattern search may run (10 MB take about 15 ms)."""
DEFAULT_PAGE_CHARS = 8_000
"""Characters `result.read` returns when it is given no ``limit``."""
UNSCRUBBABLE = "(the partial result was withheld: it could not be checked for secrets)"


@dataclass(frozen=True)
class Search:
    """`result.read`'s search of a blob, which its session's actor hands out: it runs off
    the mailbox, so that slow searches do not hold up the session's other requests (the
    blob's text, read under the actor, is a value: the search sees the blob as it was)."""

    shape: ResultReadResult
    """The result without its matches."""
    text: str
    pattern: regex.Pattern[str]
    max_matches: int

    async def run(self, limiter: trio.CapacityLimiter) -> ResultReadResult:
        """The result with its matches, searched in a worker thread of ``limiter``.

        Raises:
            CtxdError: -32602 when the search does not end within `SEARCH_TIMEOUT_S`.

        Cancellation: `request.cancel` stops the wait at once (-32006); a search already
        running ends in its thread within `SEARCH_TIMEOUT_S`, its result dropped.
        """
        try:
            with cancellation_point():
                matches, matched = await trio.to_thread.run_sync(
                    grep, self.text, self.pattern, self.max_matches, SEARCH_TIMEOUT_S,
                    limiter=limiter, abandon_on_cancel=True)
        except TimeoutError:
            raise params_error(
                "$.pattern", f"the search did not end within {SEARCH_TIMEOUT_S:g} s (a "
                             "pattern with nested repetition can backtrack without end); "
                             "simplify it, or pass literal=true") from None
        return msgspec.structs.replace(self.shape, matches=matches, matched_lines=matched,
                                       more_matches=matched - len(matches))


class ActorGone(Exception):
    """The actor retired before it took the request; the supervisor retries with a new one."""


def _check_parts(messages: list[MessageIn]) -> None:
    for i, message in enumerate(messages):
        if isinstance(message.content, str):
            continue
        for j, part in enumerate(message.content):
            kind = part.get("type")
            if not isinstance(kind, str):
                raise params_error(f"$.messages[{i}].content[{j}].type",
                                   "every content part needs a string `type`")
            if kind == "text" and not isinstance(part.get("text"), str):
                raise params_error(f"$.messages[{i}].content[{j}].text",
                                   "a text part needs a string `text`")


def _shown(title: str | None) -> str | None:
    """A session's title as its events show it to every subscriber: scrubbed, or left out
    when it cannot be (what leaves a session is scrubbed, fail closed: docs/security.md)."""
    if title is None:
        return None
    try:
        return scrub(title).text
    except ScrubError:
        log.exception("a session title could not be scrubbed; its event leaves it out")
        return None


@dataclass(frozen=True)
class _Shared:
    """An operation queued with a key (`SessionActor.submit_shared`) and its reply."""

    key: Hashable
    reply: Slot[Any]


@dataclass(frozen=True)
class _Return:
    """A branch to return: by the agent (``reason`` None, with its scrubbed message and
    the number of secrets scrubbed from it), or forced by ctxd for ``reason``."""

    branch: Branch
    reason: str | None
    message: tuple[str, int] | None = None
    extract_memory: bool = False


@dataclass(frozen=True)
class _Opened:
    """A branch planned by `SessionActor.create_branch` that commits with the first append
    to it: the session's record with its opening counted, and the steps that write it."""

    planned: Opening
    record: SessionRecord
    stage: Callable[[Transaction], None]


def _with_fold(record: SessionRecord, fold: Fold) -> SessionRecord:
    """The session's record once ``fold`` is written: its seq, its folded tokens, and the
    main thread's counters when the fold message goes there."""
    updated = dataclasses.replace(record, last_seq=fold.message.seq,
                                  updated_at=fold.message.created_at,
                                  folded_tokens=record.folded_tokens + fold.branch.budget_used,
                                  component_tokens=dict(record.component_tokens))
    if fold.message.branch_id is None:
        updated.message_count += 1
        updated.component_tokens["conversation"] += fold.message.tokens
    return updated


class SessionActor:
    """One per open session: a bounded mailbox, requests processed in arrival order.

    The actor loads its record (and its live branches) from the store on its first request
    (rehydration) and retires after ``session_idle_s`` without requests; the supervisor
    starts a new one on the next request.
    """

    def __init__(self, session_id: str, supervisor: Supervisor):
        self.session_id = session_id
        self.supervisor = supervisor
        self.record: SessionRecord | None = None
        self.branches = Branches(session_id, supervisor.store, supervisor.counter,
                                 supervisor.bus, supervisor.config, supervisor.registry,
                                 self._deadline_passed)
        self.arrived = 0.0
        """When the request being processed arrived (trio's clock)."""
        self._expiries_queued = 0
        """Deadline expiries waiting in the mailbox (see `expire`)."""
        self._stale = True
        self._deferred: tuple[str, ...] = ()
        """The tools deferred when `tools.deferred` was last published."""
        self._send, self._receive = trio.open_memory_channel[Queued](MAILBOX_SIZE)
        self._last: _Shared | None = None
        """The operation queued last, when requests with its key may share it."""

    async def submit(self, op: Op) -> Any:
        """Queue ``op`` and wait for its result. Raises `ActorGone` if the actor retired.

        Cancellation: the request it works for (`ctxd.jobs.current_request`) may be
        cancelled while ``op`` waits in the mailbox: its caller has -32006 at once and the
        actor skips it; once the actor runs it, see `_process`.
        """
        return await self._queue(op, None)

    async def submit_shared(self, key: Hashable | None, op: Op) -> tuple[Any, bool]:
        """`submit`, unless the operation queued last (waiting or running) was queued
        with the same ``key`` (not None) and nothing of the session was queued after it:
        then that one's result, and True (docs/decisions.md, "One session's storm").

        Cancellation: a request waiting for another's result stops at once (-32006);
        should the other be cancelled (nothing written), this one is queued after all.
        """
        if key is None:
            return await self._queue(op, None), False
        request = current_request()
        while True:
            last = self._last
            if last is None or last.key != key or last.reply.done:
                return await self._queue(op, key), False
            try:
                with cancellation_point():
                    return await last.reply.wait(), True
            except CtxdError as error:
                if error.code != ErrorCode.CANCELLED or (request is not None
                                                         and request.stopped):
                    raise

    async def _queue(self, op: Op, key: Hashable | None) -> Any:
        reply: Slot[Any] = Slot()
        request = current_request()
        if request is not None:
            request.queued(reply)
        # Before the send, which may wait for room: senders are queued in order.
        self._last = None if key is None else _Shared(key, reply)
        try:
            await self._send.send((op, reply, request))
        except BaseException as exc:
            # Not queued: the actor retired, or the caller was cancelled while the mailbox
            # was full (its connection dropped, the daemon stopping). Whoever shares this
            # reply queues its own (`Supervisor.call_shared` retries on ActorGone).
            if not reply.done:
                reply.fail(ActorGone())
            if self._last is not None and self._last.reply is reply:
                self._last = None
            if isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError):
                raise ActorGone from None
            raise
        return await reply.wait()

    async def _deadline_passed(self, branch_id: str) -> None:
        """A BranchActor's deadline passed: queue its forced return, in order with the
        session's other requests; a failure is logged, since nobody waits for it."""
        self._expiries_queued += 1
        try:
            with working_for(None):  # no request's: its task may have started this one
                await self.submit(lambda actor: actor.expire(branch_id))
        except ActorGone:
            pass  # shutting down: the branch is re-armed from the store on the next start
        except CtxdError as error:
            log.warning("session %s: %s", self.session_id, error.message)

    async def run(self) -> None:
        """The actor loop; returns when idle (and without live branches), when the session
        is gone, or when cancelled."""
        current: Slot[Any] | None = None
        try:
            async with trio.open_nursery() as nursery:
                self.branches.start(nursery)
                while True:
                    with trio.move_on_after(self.supervisor.config.session_idle_s):
                        op, current, request = await self._receive.receive()
                    if current is None:
                        if self._has_queued() or self.branches.live:
                            continue
                        break
                    await self._process(op, current, request)
                    current = None
                    if self.record is None and not self._stale and not self._has_queued():
                        break  # no such session (any more); keep serving what is queued
                nursery.cancel_scope.cancel()
        finally:
            if current is not None and not current.done:
                current.fail(shutting_down())
            self._retire()

    async def _process(self, op: Op, reply: Slot[Any], request: Request | None) -> None:
        """Run one queued operation and fulfil its reply.

        Cancellation (docs/protocol.md, "Cancellation"): an operation whose request was
        cancelled while queued is skipped (its caller has its -32006 already); one
        cancelled while running stops at its next cancellation point, or is refused at its
        first write, or, ending without having written, is answered -32006 all the same.
        Once it has written, it runs to its end and is answered as done.
        """
        if reply.done:
            return
        if request is not None:
            request.queued(None)
            request.actor_op = True
        self.arrived = reply.arrived
        try:
            with working_for(request):
                if self._stale:
                    self.record = await self._load()
                    self._stale = False
                result = await op(self)
            if request is not None and request.stopped and not request.committed:
                reply.fail(request.error())
            else:
                reply.set(result)
        except CtxdError as error:
            reply.fail(error)
        except Exception as exc:
            # Actor boundary: a failed request must not take the session down. Reload the
            # record from the store before the next request, in case it is now behind.
            self._stale = True
            log.exception("session %s: request failed", self.session_id)
            reply.fail(internal_error(f"internal error: {type(exc).__name__}: {exc}",
                                      {"session_id": self.session_id}))
        finally:
            if request is not None:
                request.actor_op = False

    async def _load(self) -> SessionRecord | None:
        """Read the session and its live branches (arming their deadlines)."""
        record = await self.supervisor.store.read(q.load_session, self.session_id)
        if record is not None:
            await self.branches.load()
        return record

    def _has_queued(self) -> bool:
        stats = self._receive.statistics()
        return bool(stats.current_buffer_used or stats.tasks_waiting_send)

    def _retire(self) -> None:
        # No await in here: nobody can queue between the drain and the close. Requests are
        # only left queued when the actor is cancelled (shutdown); their callers retry.
        self.supervisor.forget(self)
        while True:
            try:
                _, reply, _ = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            reply.fail(ActorGone())
        self._receive.close()

    # ---- helpers ---------------------------------------------------------------------

    def require(self) -> SessionRecord:
        if self.record is None:
            raise not_found("session", self.session_id, "open it first with session.open")
        return self.record

    def require_open(self) -> SessionRecord:
        record = self.require()
        if record.state != "open":
            raise invalid_state(f"session {self.session_id!r} is closed",
                                "reopen it with session.open or start a new session",
                                session_id=self.session_id, state=record.state)
        return record

    def context_state(self) -> ContextState:
        return self.require().context_state(self.branches)

    async def _save(self, record: SessionRecord) -> None:
        await self.supervisor.store.write(q.save_session, record)
        self.record = record

    def _over_hard_block(self, would_use: int, tokens_appended: int,
                         allow_over: bool = True, what: str = "appending") -> CtxdError:
        """-32001: the active thread would pass the hard block (``allow_over``: whether
        the method takes ``allow_over=true``; ``what``: the verb the message starts with)."""
        record = self.require()
        window = effective_window(record.budget)
        limit = int(window * record.budget.hard_block)
        return CtxdError(
            ErrorCode.CONTEXT_LIMIT_EXCEEDED,
            f"{what} {tokens_appended} tokens would bring the context to {would_use} "
            f"of {window} tokens, past the hard block at {limit}",
            {"session_id": self.session_id, "would_use": would_use,
             "hard_block_tokens": limit, "effective_window": window,
             "tokens_appended": tokens_appended,
             "suggestion": "compact the context (context.compact), fold finished sub-tasks "
                           "(branch.return), or go on in a new session (session.open) "
                           "with a larger context_window"
                           + ("; pass allow_over=true to append anyway" if allow_over
                              else "")})

    # ---- sessions ----------------------------------------------------------------------

    async def open(self, params: SessionOpenParams,
                   seed: Seed | None = None) -> SessionOpenResult:
        """session.open; ``seed``: the messages of a session forked from another, stored
        in the transaction that creates it (docs/protocol.md, "context.fork")."""
        now = time.time()
        sup = self.supervisor
        if self.record is not None and seed is not None:
            raise invalid_state(
                f"session {self.session_id} exists; fork_from seeds a new session",
                "leave session_id out (a new id is made) or give one not in use",
                session_id=self.session_id)
        if self.record is None:
            record = SessionRecord(
                session_id=self.session_id, project=params.project, title=params.title,
                state="open", budget=resolve_budget(params.budget, sup.config.budget),
                created_at=now, updated_at=now)
            with sup.open_slot():
                if seed is not None:
                    await self._create_seeded(record, seed)
                else:
                    await self._save(record)
            sup.sessions_total += 1
            sup.bus.publish(self.session_id, "session.opened",
                            {"project": record.project, "title": _shown(record.title),
                             "created": True})
            return SessionOpenResult(session=record.info(self.branches), created=True,
                                     context_state=self.context_state(),
                                     fork=msgspec.UNSET if seed is None else seed.info)
        record = dataclasses.replace(self.record)
        reopened = record.state != "open"
        if reopened:
            record.state, record.closed_at = "open", None
        if params.budget is not None:
            record.budget = resolve_budget(params.budget, record.budget)
        record.project = params.project if params.project is not None else record.project
        record.title = params.title if params.title is not None else record.title
        if record != self.record:
            record.updated_at = now
            if reopened:
                with sup.open_slot():
                    await self._save(record)
            else:
                await self._save(record)
        if reopened:
            sup.bus.publish(self.session_id, "session.opened",
                            {"project": record.project, "title": _shown(record.title),
                             "created": False})
        return SessionOpenResult(session=record.info(self.branches), created=False,
                                 context_state=self.context_state())

    async def _create_seeded(self, record: SessionRecord, seed: Seed) -> None:
        """Create the session with its first messages and their blobs, in one
        transaction."""
        stored = [StoredMessage(seq=seq, role=m.role, content=m.content,
                                component="system_prompt" if m.role == "system"
                                else "conversation", tokens=tokens,
                                created_at=record.created_at, name=m.name,
                                tool_call_id=m.tool_call_id, meta=m.meta)
                  for seq, (m, tokens) in enumerate(zip(seed.messages, seed.tokens,
                                                        strict=True), 1)]
        record.component_tokens = dict(record.component_tokens)
        for message in stored:
            record.component_tokens[message.component] += message.tokens
        record.last_seq = record.message_count = len(stored)
        transaction = Transaction()
        transaction.add(q.save_session, record)
        transaction.add(q.insert_messages, self.session_id, stored)
        stage_blobs(transaction, self.session_id,
                    [blob.placed(blob.seq, None, record.created_at) for blob in seed.blobs])
        await self.supervisor.store.commit(transaction)
        self.record = record

    async def get(self) -> SessionResult:
        record = self.require()
        return SessionResult(session=record.info(self.branches),
                             context_state=self.context_state())

    async def close(self) -> SessionResult:
        record = self.require()
        if record.state == "open":
            await self._return_all("session_closed")
            record = self.require()
            now = time.time()
            closed = dataclasses.replace(record, state="closed", closed_at=now, updated_at=now)
            await self._save(closed)
            record = closed
            self.supervisor.sessions_open -= 1
            self.supervisor.bus.publish(self.session_id, "session.closed",
                                        {"message_count": record.message_count,
                                         "total_tokens": self.context_state().total_tokens})
        return SessionResult(session=record.info(self.branches),
                             context_state=self.context_state())

    async def delete(self) -> SessionDeleteResult:
        record = self.require()
        if self.branches.live:
            await self._return_all("session_deleted")
        deleted = await self.supervisor.store.write(q.delete_session, self.session_id)
        self.supervisor.bus.forget(self.session_id)
        self.branches.deleted()
        if record.state == "open":
            self.supervisor.sessions_open -= 1
        self.supervisor.sessions_total -= 1
        self.record = None
        self.supervisor.bus.publish(self.session_id, "session.deleted",
                                    {"messages_deleted": deleted})
        return SessionDeleteResult(session_id=self.session_id, deleted=True,
                                   messages_deleted=deleted)

    # ---- messages ----------------------------------------------------------------------

    def _at_rest(self, messages: list[MessageIn], consequence: str) -> list[MessageIn]:
        """The messages as the session stores them: as given, or with ``scrub_at_rest``
        their text scrubbed (docs/security.md "What is stored as given")."""
        if not self.supervisor.config.scrub_at_rest:
            return messages
        try:
            return [msgspec.structs.replace(message, content=scrub_value(message.content))
                    for message in messages]
        except ScrubError as exc:
            raise scrub_failed("a message", exc, consequence) from exc

    def _text_at_rest(self, text: str, consequence: str) -> str:
        """A text of the session's own, as it is stored (see `_at_rest`)."""
        if not self.supervisor.config.scrub_at_rest:
            return text
        try:
            return scrub(text).text
        except ScrubError as exc:
            raise scrub_failed("a message", exc, consequence) from exc

    async def append(self, params: MessageAppendParams,
                     stage: Callable[[Transaction], None] | None = None) -> MessageAppendResult:
        """message.append; ``stage`` adds a caller's steps to the append's transaction (the
        importer's read position and usage: docs/protocol.md, "transcript.import")."""
        self.require_open()
        messages, offloads = self._prepared(params.messages, self.require().last_seq + 1,
                                            "nothing was appended")
        branch = None
        if params.branch_id is not None:
            branch = await self._live_branch(params.branch_id, for_append=True)
        return await self._append(params, branch, messages, offloads, [], stage)

    def _prepared(self, messages: list[MessageIn], first_seq: int, nothing: str
                  ) -> tuple[list[MessageIn], list[tuple[MessageIn, ToolResultBlob] | None]]:
        """``messages`` checked and as they are stored (`_at_rest`; ``nothing`` says what a
        failure left undone), with the offload of each, numbered from ``first_seq``."""
        _check_parts(messages)
        at_rest = self._at_rest(messages, nothing)
        threshold = self.supervisor.config.hygiene.offload_threshold_bytes
        return at_rest, [offload(message, threshold, self.session_id, first_seq + offset)
                         for offset, message in enumerate(at_rest)]

    async def _append(self, params: MessageAppendParams, branch: Branch | None,
                      messages: list[MessageIn],
                      offloads: list[tuple[MessageIn, ToolResultBlob] | None],
                      compactions: list[CompactResult],
                      stage: Callable[[Transaction], None] | None = None,
                      opened: _Opened | None = None) -> MessageAppendResult:
        """Store ``messages``, the large tool results among them as their stubs (``offloads``)
        with their blobs, in one transaction. Should that commit fail with blobs in it, the
        append is made again with every result inline (docs/decisions.md, Hygiene).

        An append that would pass the hard block first has the thread compacted (when
        ``auto_compact`` is on); one that brings it to the compact trigger is followed by a
        compaction (``compactions``: those run, docs/protocol.md, "Compaction").

        ``opened``: ``branch`` is new, created in the same transaction (``allow_over``)."""
        record = self.require() if opened is None else opened.record
        shown = [message if offloaded is None else offloaded[0]
                 for message, offloaded in zip(messages, offloads, strict=True)]
        counts = await self.supervisor.counter.count_messages(shown)
        tokens_appended = sum(counts)

        def would_use() -> int:
            thread_before = (self.require().main_message_tokens if branch is None
                             else rendered_tokens(branch))
            return thread_before + tokens_appended + REPLY_PRIMING

        window = effective_window(record.budget)
        if would_use() / window >= record.budget.hard_block and not params.allow_over:
            done = await self._auto_compact(branch, room=tokens_appended, before_append=True)
            if done is not None:
                compactions.append(done)
                record = self.require()
                if branch is not None:
                    branch = self.branches.live[branch.branch_id]
            if would_use() / window >= record.budget.hard_block:
                raise self._over_hard_block(would_use(), tokens_appended)
        health_before = self.require().health(self.branches)
        now = time.time()
        updated = record.appended(len(messages), now)
        stored: list[StoredMessage] = []
        blobs: list[ToolResultBlob] = []
        for offset, (message, offloaded, tokens) in enumerate(
                zip(shown, offloads, counts, strict=True)):
            component: Component = message.component or (
                "system_prompt" if message.role == "system" else "conversation")
            if branch is None:
                updated.component_tokens[component] += tokens
            seq = record.last_seq + offset + 1
            stored.append(StoredMessage(
                seq=seq, role=message.role, content=message.content,
                component=component, tokens=tokens, created_at=now, name=message.name,
                tool_call_id=message.tool_call_id, meta=message.meta,
                branch_id=params.branch_id))
            if offloaded is not None:
                blobs.append(offloaded[1].placed(seq, params.branch_id, now))
        transaction = Transaction()
        if opened is not None:
            opened.stage(transaction)
        transaction.add(q.insert_messages, self.session_id, stored)
        stage_blobs(transaction, self.session_id, blobs)
        if any(m.role == "assistant" for m in messages):
            stage_use(transaction, self.session_id,
                      {name: seq for seq, m in enumerate(messages, record.last_seq + 1)
                       for name in called_tools(m)})
        grown = None
        if branch is None:
            updated.message_count += len(messages)
        else:
            grown = self.branches.charge(branch, tokens_appended,
                                         sum(m.role == "assistant" for m in messages))
            self.branches.stage_meter(transaction, grown)
        transaction.add(q.save_counters, updated)
        if stage is not None:
            stage(transaction)
        bus = self.supervisor.bus
        events: list[tuple[str, dict[str, Any]]] = [
            ("result.offloaded",
             {"branch_id": blob.branch_id, "seq": blob.seq, "ref_id": blob.ref_id,
              "tool_name": blob.tool_name, "size_bytes": blob.size_bytes,
              "tokens": counts[blob.seq - stored[0].seq]}) for blob in blobs]
        events.append(("message.appended",
                       {"branch_id": params.branch_id, "first_seq": stored[0].seq,
                        "last_seq": stored[-1].seq, "count": len(stored),
                        "tokens": tokens_appended,
                        "main_thread_tokens": updated.main_thread_tokens}))
        # Written with the append (docs/decisions.md, Events), unless a branch's events
        # (created, budget warning) are to come first: they are published after the commit.
        staged = branch is None and opened is None
        if staged:
            bus.stage(transaction, self.session_id, events)
        try:
            with (contextlib.nullcontext() if opened is None
                  else self.branches.registry.slot()):
                await self.supervisor.store.commit(transaction)
        except Exception as exc:
            if not blobs or (isinstance(exc, CtxdError) and exc.code == ErrorCode.CANCELLED):
                raise  # a cancelled request writes nothing, inline or not
            log.warning("session %s: %d tool result(s) could not be offloaded, appended "
                        "inline instead: %s: %s", self.session_id, len(blobs),
                        type(exc).__name__, exc)
            bus.publish(self.session_id, "result.offload_failed",
                        {"branch_id": params.branch_id, "count": len(blobs),
                         "error": f"{type(exc).__name__}: {exc}"})
            return await self._append(params, branch, messages, [None] * len(messages),
                                      compactions, stage, opened)
        self.record = updated
        if opened is not None:
            self.branches.created(opened.planned)
        if branch is not None and grown is not None:
            self.branches.charged(branch, grown)
        state = self.context_state()
        if not staged:
            for kind, data in events:
                bus.publish(self.session_id, kind, data)
        if state.health != health_before:
            bus.publish(self.session_id, "context.health",
                        {"from": health_before, "to": state.health, "usage": state.usage})
        forced: list[ForcedReturn] = []
        if grown is not None:
            # The append has committed: a failure of the forced return is retried when the
            # branch is next touched, and does not turn this answer into an error.
            forced = await self._enforce(grown)
        thread = None if branch is None else self.branches.live.get(branch.branch_id)
        if branch is None or thread is not None:
            done = await self._auto_compact(thread)
            if done is not None:
                compactions.append(done)
        refs = {blob.seq: blob.ref_id for blob in blobs}
        return MessageAppendResult(
            appended=[AppendedMessage(seq=m.seq, tokens=m.tokens, component=m.component,
                                      ref_id=refs.get(m.seq),
                                      stub=m.content if m.seq in refs
                                      and isinstance(m.content, str) else None)
                      for m in stored],
            tokens_appended=tokens_appended, forced_returns=forced,
            # On the main thread, unchanged since `state` unless a compaction ran.
            context_state=state if branch is None and done is None and self.record is updated
            else self.context_state(), compactions=compactions)

    async def read_result(self, p: ResultReadParams) -> ResultReadResult | Search:
        """result.read: a page of an offloaded tool result of this session, or the search
        for its lines that match ``pattern``, to run off the mailbox (docs/protocol.md,
        "Offloaded tool results")."""
        self.require()
        pattern = None
        if p.pattern is not None:
            if p.offset is not msgspec.UNSET or p.limit is not msgspec.UNSET:
                raise params_error("$.offset" if p.offset is not msgspec.UNSET else "$.limit",
                                   "offset and limit page the text; a pattern searches all "
                                   "of it: leave them out (max_matches bounds the lines)")
            pattern = compile_pattern(p.pattern, p.literal)
        blob = await self.supervisor.store.read(load_blob, self.session_id, p.ref_id)
        if blob is None:
            raise not_found("ref", p.ref_id, "use a ref_id from a stub in this session's "
                                             "ctxd.render or message.list")
        shape = ResultReadResult(ref_id=p.ref_id, tool_name=blob.tool_name,
                                 size_bytes=blob.size_bytes, total_chars=len(blob.text),
                                 seq=blob.seq, branch_id=blob.branch_id)
        if pattern is None:
            offset = 0 if p.offset is msgspec.UNSET else p.offset
            limit = DEFAULT_PAGE_CHARS if p.limit is msgspec.UNSET else p.limit
            content, next_offset = page(blob.text, offset, limit)
            return msgspec.structs.replace(shape, offset=offset, content=content,
                                           next_offset=next_offset)
        return Search(shape, blob.text, pattern, p.max_matches)

    async def list_messages(self, params: MessageListParams) -> MessageListResult:
        self.require()
        if params.branch_id is not None:
            await self.branches.stored(params.branch_id)
        after = int(params.cursor) if params.cursor else 0
        messages = await self.supervisor.store.read(self._whole_messages, params.branch_id,
                                                    after, params.limit + 1)
        more = len(messages) > params.limit
        messages = messages[:params.limit]
        return MessageListResult(messages=messages,
                                 next_cursor=str(messages[-1].seq) if more else None,
                                 context_state=self.context_state())

    def _whole_messages(self, conn: Any, branch_id: str | None, after: int,
                        limit: int) -> list[StoredMessage]:
        """A page of the archive, each offloaded tool result whole with its ``ref_id``
        (in the store's thread)."""
        messages = q.list_messages(conn, self.session_id, branch_id, after, limit)
        whole = originals(conn, self.session_id,
                          [m.seq for m in messages if m.role == "tool"])
        return [m if m.seq not in whole else msgspec.structs.replace(
                    m, content=whole[m.seq][1], ref_id=whole[m.seq][0]) for m in messages]

    async def render(self, params: RenderParams) -> RenderResult:
        if params.branch_id is msgspec.UNSET:
            await self._enforce_all()
            active = self.branches.active
            branch_id = None if active is None else active.branch_id
        else:
            branch_id = params.branch_id
            if branch_id is not None:
                live = self.branches.live.get(branch_id)
                if live is not None:
                    await self._enforce(live)
                else:
                    await self.branches.stored(branch_id)
        record = self.require()
        messages, message_tokens = await self.supervisor.store.read(
            q.render_rows, self.session_id, branch_id)
        tokens = thread_tokens(message_tokens, len(messages))
        shown, deferred = await self._tool_view()
        usage = tokens / effective_window(record.budget)
        note = self.supervisor.config.hygiene.context_note
        return RenderResult(
            context_note=note.format(percent=round(usage * 100))
            if note and usage >= record.budget.warn else None,
            branch_id=branch_id, messages=messages, tokens=tokens,
            context_state=self.context_state(),
            stats=RenderStats(message_count=len(messages), stored_messages=record.last_seq,
                              message_tokens=message_tokens,
                              reply_priming_tokens=tokens - message_tokens),
            tools=[tool.definition() for tool in shown],
            tool_tokens=sum(tool.tokens for tool in shown),
            tools_note=deferred_note(len(deferred)) if deferred else None)

    # ---- compaction (docs/protocol.md, "Compaction") -----------------------------------

    def _thread_used(self, branch: Branch | None) -> int:
        """Rendered tokens of a thread: the main thread, or a branch with its prefix."""
        if branch is None:
            return self.require().main_thread_tokens
        return rendered_tokens(branch) + REPLY_PRIMING

    def _live_children(self, thread: str | None) -> list[str]:
        return [b.branch_id for b in self.branches.live.values()
                if b.parent_branch_id == thread]

    async def compact(self, p: ContextCompactParams) -> ContextCompactResult:
        """context.compact: run the chain on the main thread or on a live branch."""
        self.require_open()
        branch = None
        if p.branch_id is None:
            await self._enforce_all()
        else:
            branch = await self._live_branch(p.branch_id, for_append=False)
        children = self._live_children(p.branch_id)
        if children:
            raise invalid_state(
                f"the thread has live branches that started from its context "
                f"({', '.join(children)}); compacting it would change what they see",
                "return them first (branch.return), or compact one of them with its branch_id",
                session_id=self.session_id, branch_id=p.branch_id, live_branches=children)
        strategies = tuple(p.strategies) if p.strategies else STRATEGIES
        done = await self._compact(branch, strategies, automatic=False)
        return ContextCompactResult(**msgspec.structs.asdict(done),
                                    context_state=self.context_state())

    async def _auto_compact(self, branch: Branch | None, room: int = 0,
                            before_append: bool = False) -> CompactResult | None:
        """Compact a thread that reached the compact trigger (``before_append``: that an
        append of ``room`` tokens would bring past the hard block), when ``auto_compact``
        is on, the breaker has not tripped, and no live branch started from it. A storage
        failure is logged: the request that triggered it stands; but before an append, the
        append cannot fit without the compaction, so the failure is its answer (-32008
        with the cause, not -32001)."""
        record = self.require()
        if not self.supervisor.config.hygiene.auto_compact or record.auto_compact_paused \
                or record.state != "open":
            return None
        thread = None if branch is None else branch.branch_id
        if self._live_children(thread):
            return None
        limit = record.budget.hard_block if before_append else record.budget.compact_trigger
        if (self._thread_used(branch) + room) / effective_window(record.budget) < limit:
            return None
        try:
            return await self._compact(branch, STRATEGIES, automatic=True, room=room)
        except CtxdError as error:
            if error.code != ErrorCode.STORAGE_ERROR:
                raise
            if before_append:
                raise CtxdError(error.code, f"{error.message} (the automatic compaction this "
                                "append needed to fit could not be written)",
                                error.data) from error
            log.warning("session %s: automatic compaction not written: %s", self.session_id,
                        error.message)
            return None

    async def _compact(self, branch: Branch | None, strategies: tuple[Strategy, ...], *,
                       automatic: bool, room: int = 0) -> CompactResult:
        """Plan the chain on the thread, then write it in one transaction with the
        session's counters (or the branch's meter) and the breaker; then the snapshot."""
        sup = self.supervisor
        record = self.require()
        health_before = self.context_state().health
        thread = None if branch is None else branch.branch_id
        window = effective_window(record.budget)
        target = math.floor(window * min(sup.config.hygiene.compact_target,
                                         record.budget.compact_trigger))
        before = self._thread_used(branch)
        needed = before > target - room
        now = time.time()
        plan = Plan(session_id=self.session_id, thread=thread, next_seq=record.last_seq + 1,
                    now=now, used=before)
        if needed or branch is not None:
            view = await sup.store.read(thread_view, self.session_id, thread, OPENING_META)
            with cancellation_point():  # the summarizer may take long; nothing is written
                after = await sup.compactor.plan(view, plan, target - room, strategies)
            before_msgs, after_msgs = len(view), len(after)
        else:
            # Under its target the chain stops at once: the main thread is not read (its
            # kept messages are the record's count), so a storm of compactions of a thread
            # that needs none costs its session nothing (docs/decisions.md, "One session's
            # storm").
            before_msgs = after_msgs = record.message_count
        shrank = plan.used < before
        updated = dataclasses.replace(record, component_tokens=dict(record.component_tokens))
        transaction = Transaction()
        grown = None
        if shrank:
            updated.last_seq, updated.updated_at = plan.next_seq - 1, now
            updated.compact_failures = 0
            transaction.add(q.insert_messages, self.session_id, plan.replacements)
            transaction.add(q.mark_compacted, self.session_id, plan.marks)
            stage_blobs(transaction, self.session_id, plan.blobs)
            if branch is None:
                updated.compactions, updated.compacted_at = record.compactions + 1, now
                for component, tokens in plan.removed.items():
                    updated.component_tokens[component] -= tokens
                updated.component_tokens["conversation"] += plan.added
                updated.message_count += len(plan.replacements) - len(plan.marks)
            else:
                grown = self.branches.charge(branch, plan.used - before, 0)
                self.branches.stage_meter(transaction, grown)
        elif needed:
            updated.compact_failures += 1
        if updated != record:
            transaction.add(q.save_counters, updated)
            await sup.store.commit(transaction)
            self.record = updated
            if branch is not None and grown is not None:
                self.branches.charged(branch, grown)
        snapshot_saved = shrank and branch is None and await self._snapshot(updated)
        result = CompactResult(
            branch_id=thread, before_tokens=before, after_tokens=plan.used,
            tokens_recovered=before - plan.used, target_tokens=target - room,
            before_msgs=before_msgs, after_msgs=after_msgs, strategies_run=plan.strategies_run,
            cleared=plan.counts["cleared"], summarized=plan.counts["summarized"],
            truncated=plan.counts["truncated"], summarizer=plan.summarizer,
            summarizer_error=plan.summarizer_error, snapshot_saved=snapshot_saved,
            automatic=automatic)
        bus = sup.bus
        if needed or shrank:
            bus.publish(self.session_id, "context.compacted",
                        msgspec.structs.asdict(result) | {
                            "compact_failures": updated.compact_failures})
        if updated.compact_failures == COMPACT_BREAKER > record.compact_failures:
            log.warning("session %s: %d compactions in a row did not shrink the context; "
                        "automatic compaction is paused", self.session_id, COMPACT_BREAKER)
            bus.publish(self.session_id, "context.auto_compact_paused",
                        {"branch_id": thread, "compact_failures": updated.compact_failures})
        state = self.context_state()
        if state.health != health_before:
            bus.publish(self.session_id, "context.health",
                        {"from": health_before, "to": state.health, "usage": state.usage})
        return result

    async def _snapshot(self, record: SessionRecord) -> bool:
        """Save the compacted main thread as the session's snapshot. A failure is logged
        and published, and leaves `session.resume` on the thread itself (docs/decisions.md,
        Hygiene)."""
        store = self.supervisor.store
        try:
            messages, message_tokens = await store.read(q.render_rows, self.session_id, None)
            assert record.compacted_at is not None
            await store.write(save_snapshot, self.session_id, Snapshot(
                compaction=record.compactions, through_seq=record.last_seq,
                compacted_at=record.compacted_at, message_tokens=message_tokens,
                messages=messages))
        except Exception as exc:
            log.warning("session %s: the snapshot of its compaction could not be saved "
                        "(session.resume gives the thread instead): %s: %s", self.session_id,
                        type(exc).__name__, exc)
            self.supervisor.bus.publish(self.session_id, "snapshot.failed",
                                        {"error": f"{type(exc).__name__}: {exc}"})
            return False
        return True

    async def resume(self) -> SessionResumeResult:
        """session.resume: the latest snapshot and what came after it; the main thread
        when there is no current snapshot."""
        record = self.require()
        store = self.supervisor.store
        snapshot = await store.read(load_snapshot, self.session_id)
        if snapshot is not None and snapshot.compaction == record.compactions:
            later, later_tokens = await store.read(q.main_rows_after, self.session_id,
                                                   snapshot.through_seq)
            messages = snapshot.messages + later
            return SessionResumeResult(
                session_id=self.session_id, source="snapshot",
                compacted_at=snapshot.compacted_at, messages=messages,
                tokens=thread_tokens(snapshot.message_tokens + later_tokens, len(messages)),
                context_state=self.context_state())
        messages, message_tokens = await store.read(q.render_rows, self.session_id, None)
        return SessionResumeResult(
            session_id=self.session_id, source="thread", compacted_at=None, messages=messages,
            tokens=thread_tokens(message_tokens, len(messages)),
            context_state=self.context_state())

    # ---- tool deferral (docs/protocol.md, "Tool deferral") ------------------------------

    def _tool_threshold(self) -> int:
        return math.floor(self.supervisor.config.hygiene.tool_deferral_threshold
                          * effective_window(self.require().budget))

    async def _tool_view(self) -> tuple[list[SessionTool], list[SessionTool]]:
        """The session's active and deferred tools. Should the deferral fail, every tool is
        active: it costs context, never the request (docs/decisions.md, Hygiene)."""
        tools = await self.supervisor.store.read(load_tools, self.session_id)
        try:
            active, deferred = defer(tools, self._tool_threshold())
        except Exception as exc:
            log.exception("session %s: tool deferral failed; every tool is rendered",
                          self.session_id)
            self.supervisor.bus.publish(self.session_id, "tools.deferral_failed",
                                        {"tools": len(tools),
                                         "error": f"{type(exc).__name__}: {exc}"})
            return tools, []
        names = tuple(tool.name for tool in deferred)
        if names != self._deferred:
            self._deferred = names
            self.supervisor.bus.publish(self.session_id, "tools.deferred", {
                "count": len(names), "names": list(names),
                "active_tokens": sum(tool.tokens for tool in active),
                "deferred_tokens": sum(tool.tokens for tool in deferred),
                "threshold_tokens": self._tool_threshold()})
        return active, deferred

    async def register_tools(self, p: ToolsRegisterParams) -> ToolsRegisterResult:
        self.require_open()
        check_tools(p.tools)
        counts = await self.supervisor.counter.count_texts([counted_form(t) for t in p.tools])
        before = {tool.name for tool in
                  await self.supervisor.store.read(load_tools, self.session_id)}
        transaction = Transaction()
        stage_register(transaction, self.session_id, list(zip(p.tools, counts, strict=True)),
                       time.time())
        await self.supervisor.store.commit(transaction)
        active, deferred = await self._tool_view()
        return ToolsRegisterResult(
            registered=[RegisteredTool(name=tool.name, tokens=tokens,
                                       replaced=tool.name in before)
                        for tool, tokens in zip(p.tools, counts, strict=True)],
            total_tools=len(active) + len(deferred),
            total_tokens=sum(tool.tokens for tool in [*active, *deferred]),
            threshold_tokens=self._tool_threshold(),
            deferred=[tool.name for tool in deferred])

    async def search_tools(self, p: ToolsSearchParams) -> ToolsSearchResult:
        self.require()
        _, deferred = await self._tool_view()
        found = rank(deferred, p.query)[:p.limit]
        if found:
            transaction = Transaction()
            stage_promote(transaction, self.session_id, [tool.name for tool, _ in found])
            await self.supervisor.store.commit(transaction)
            # The promoted tools may push others out, to stay under the threshold.
            _, deferred = await self._tool_view()
        return ToolsSearchResult(
            matches=[ToolMatch(name=tool.name, source=tool.source,
                               description=tool.description, score=score, tokens=tool.tokens)
                     for tool, score in found],
            deferred=len(deferred))

    async def measure(self, params: BudgetMeasureParams) -> BudgetMeasureResult:
        record = self.require()
        counter = self.supervisor.counter
        extra: dict[Component, int] = dict.fromkeys(COMPONENTS, 0)
        if params.system_prompt is not None:
            # Counted as the system message it will be (the rule lives in TokenCounter).
            [extra["system_prompt"]] = await counter.count_messages(
                [MessageIn(role="system", content=params.system_prompt)])
        # One batch: its counting is bounded on the loop by total size, not item by item
        # (docs/performance.md, A request does not hold the loop).
        skills = list(params.skill_prompts or ())
        tools = [_encode(tool).decode() for tool in params.tool_definitions or ()]
        counts = await counter.count_texts(skills + tools)
        extra["skill_prompts"] += sum(counts[:len(skills)])
        extra["tool_descriptions"] += sum(counts[len(skills):])
        active, _ = await self._tool_view()
        extra["tool_descriptions"] += sum(tool.tokens for tool in active)
        parts = {c: record.component_tokens[c] + extra[c] for c in COMPONENTS}
        message_total = sum(parts.values())
        used = message_total + REPLY_PRIMING if message_total else 0
        window = effective_window(record.budget)
        usage = used / window
        return BudgetMeasureResult(
            total=record.budget.context_window, max_output_tokens=record.budget.max_output_tokens,
            effective_window=window, system_prompt=parts["system_prompt"],
            skill_prompts=parts["skill_prompts"], tool_descriptions=parts["tool_descriptions"],
            conversation=parts["conversation"], used=used, remaining=window - used,
            used_pct=round(usage * 100, 4),
            should_compact=usage >= record.budget.compact_trigger,
            is_blocked=health_of(usage, record.budget) == "blocked",
            context_state=self.context_state())

    # ---- branches: lookups and enforcement ---------------------------------------------

    async def _live_branch(self, branch_id: str, *, for_append: bool) -> Branch:
        """The live branch ``branch_id`` after its deadline and budget were enforced.

        Raises:
            CtxdError: -32004 unknown; -32002 / -32009 / -32003 when it is not active (or
                was force-returned just now because its deadline had passed).
        """
        branch = self.branches.live.get(branch_id)
        if branch is not None:
            await self._enforce(branch)
            branch = self.branches.live.get(branch_id)
        if branch is None:
            raise not_active(await self.branches.stored(branch_id), for_append)
        overdue = self.branches.overdue(branch, self.arrived)
        if overdue is not None:
            # Its forced return could not be written (the store failed); refuse all the same.
            raise not_active(msgspec.structs.replace(self.branches.shown(branch),
                                                     status=overdue), for_append)
        return branch

    async def _enforce(self, branch: Branch) -> list[ForcedReturn]:
        """`_enforce_all`, for one branch."""
        return await self._enforce_all([branch])

    async def _enforce_all(self, branches: list[Branch] | None = None) -> list[ForcedReturn]:
        """Force-return every branch (of ``branches``, else of the session) whose deadline
        had passed when the request arrived, or whose budget is spent: all in one
        transaction, and again for parents that their folds spent.

        A storage failure is logged, not raised: the branches stay live and their forced
        returns are tried again by the next request that touches them (and by their
        BranchActors).
        """
        forced: list[ForcedReturn] = []
        candidates = self.branches.oldest_first() if branches is None else branches
        while True:
            due = [_Return(b, reason) for b in candidates
                   if b.branch_id in self.branches.live
                   and (reason := self.branches.overdue(self.branches.live[b.branch_id],
                                                        self.arrived)) is not None]
            if not due:
                return forced
            try:
                folds, done = await self._return(due)
            except CtxdError as error:
                if error.code != ErrorCode.STORAGE_ERROR:
                    raise
                log.warning("session %s: forced return of %s not written: %s",
                            self.session_id, ", ".join(r.branch.branch_id for r in due),
                            error.message)
                return forced
            forced += done
            candidates = self._charge_parents(folds)

    def _charge_parents(self, folds: list[Fold]) -> list[Branch]:
        """The parents that folds grew: their budget warning goes out (once); they are the
        ones to enforce next."""
        parents: dict[str, Branch] = {}
        for fold in folds:
            parent = fold.parent
            if parent is None or parent.branch_id not in self.branches.live:
                continue
            if fold.parent_warned_now:
                self.branches.publish_budget_warning(parent)
            parents[parent.branch_id] = self.branches.live[parent.branch_id]
        return list(parents.values())

    async def expire(self, branch_id: str) -> None:
        """A BranchActor's deadline passed: force-return every branch of the session that
        is due (branches whose deadlines coincide return in one transaction).

        When nothing but other expiries waits in the mailbox, no request can have arrived
        before a deadline that has passed since, so "due" is judged now rather than when
        this expiry was queued: the branches whose deadlines passed meanwhile go in the
        same transaction, and their own expiries find nothing left to do.
        """
        self._expiries_queued -= 1
        stats = self._receive.statistics()
        if stats.current_buffer_used + stats.tasks_waiting_send == self._expiries_queued:
            self.arrived = trio.current_time()
        if branch_id in self.branches.live:
            await self._enforce_all()

    # ---- branches: returns and folds ---------------------------------------------------

    async def _return(self, targets: list[_Return]) -> tuple[list[Fold], list[ForcedReturn]]:
        """Return ``targets``, each after its live descendants (deepest first, force-returned
        as ``parent_returned``), in one transaction with the session's counters.

        The folds are planned on a copy of the live branches; the record and the branches
        change only once the transaction has committed.
        """
        plan: list[_Return] = []
        planned: set[str] = set()
        for target in targets:
            for item in [*(_Return(child, "parent_returned")
                           for child in self.branches.descendants(target.branch.branch_id)),
                         target]:
                if item.branch.branch_id not in planned:
                    plan.append(item)
                    planned.add(item.branch.branch_id)
        works = await self.supervisor.store.read(
            q.recent_works, [item.branch.branch_id for item in plan if item.reason is not None],
            OPENING_META)
        live = dict(self.branches.live)
        record = self.require()
        folded_into: dict[str, list[StoredMessage]] = {}
        folds: list[Fold] = []
        forced: list[ForcedReturn] = []
        transaction = Transaction()
        for item in plan:
            branch = live[item.branch.branch_id]
            if item.reason is None:
                assert item.message is not None
                result, scrubbed_count = item.message
            else:
                last, recent = works[branch.branch_id]
                # Its children folded into it on the way: their folds are its latest work.
                recent += [(m.role, m.content) for m in folded_into.get(branch.branch_id, [])]
                try:
                    scrubbed = scrub(partial_result(last, recent[-3:]))
                except ScrubError:
                    log.exception("branch %s: partial result could not be scrubbed",
                                  branch.branch_id)
                    scrubbed = scrub(UNSCRUBBABLE)
                result, scrubbed_count = scrubbed.text, scrubbed.total
            parent = live.get(branch.parent_branch_id) if branch.parent_branch_id else None
            fold = await self.branches.fold(branch, result, scrubbed_count, item.reason,
                                            record.last_seq + 1, parent)
            record = _with_fold(record, fold)
            del live[branch.branch_id]
            if fold.parent is not None:
                live[fold.parent.branch_id] = fold.parent
                folded_into.setdefault(fold.parent.branch_id, []).append(fold.message)
            transaction.add(q.insert_messages, self.session_id, [fold.message])
            self.branches.stage_fold(transaction, fold)
            if item.extract_memory:
                Memory.stage_candidate(transaction, MemoryCandidate(
                    session_id=self.session_id, branch_id=branch.branch_id,
                    title=branch.description, content=result, outcome="success",
                    created_at=fold.message.created_at, scope=project_scope(record.project)))
            folds.append(fold)
            if item.reason is not None:
                forced.append(ForcedReturn(branch_id=branch.branch_id, status=fold.status,
                                           reason=item.reason, result=result))
        transaction.add(q.save_counters, record)
        await self.supervisor.store.commit(transaction)
        self.record = record
        for fold in folds:
            self.branches.folded(fold)
        return folds, forced

    async def _return_all(self, reason: str) -> list[ForcedReturn]:
        """Force-return every live branch of a session that is being closed or deleted,
        deepest first, in one transaction."""
        _, forced = await self._return([_Return(branch, reason)
                                        for branch in self.branches.deepest_first()])
        return forced

    async def return_branch(self, p: BranchReturnParams) -> BranchReturnResult:
        """branch.return: children first, then the scrubbed fold into the parent, in one
        transaction; then the parent, grown by the fold, is enforced."""
        branch = await self._live_branch(p.branch_id, for_append=False)
        try:
            scrubbed = scrub(p.message)
        except ScrubError as exc:
            raise scrub_failed("the return message", exc, "nothing was folded",
                               {"branch_id": p.branch_id}) from exc
        folds, forced = await self._return([_Return(
            branch, None, (scrubbed.text, scrubbed.total), p.extract_memory)])
        fold = folds[-1]
        forced += await self._enforce_all(self._charge_parents([fold]))
        parent = fold.branch.parent_branch_id
        if parent is None or parent in self.branches.live:
            # The fold grew its parent thread (docs/protocol.md, "Compaction").
            await self._auto_compact(None if parent is None else self.branches.live[parent])
        return BranchReturnResult(
            success=True, branch_id=branch.branch_id, parent_branch_id=branch.parent_branch_id,
            folded_at=fold.message.created_at, fold_seq=fold.message.seq,
            tokens_used=fold.branch.budget_used,
            summary=FoldSummary(tokens_folded=fold.branch.budget_used,
                                tokens_saved=fold.tokens_saved,
                                operations_count=fold.branch.operations_count,
                                secrets_scrubbed=scrubbed.total,
                                summary_redacted=scrubbed.total > 0,
                                summary_truncated=fold.summary_truncated),
            memory_queued=p.extract_memory, forced_returns=forced,
            context_state=self.context_state())

    # ---- branches: create, status, list, rollback --------------------------------------

    async def create_branch(self, p: BranchCreateParams, first: list[MessageIn] | None = None,
                            stage: Callable[[Transaction, str], None] | None = None
                            ) -> BranchCreateResult:
        """branch.create: a new live branch under the active branch (or the given parent).

        Args:
            p: the branch.
            first: messages appended to the new branch in the transaction that creates it
                (as with ``allow_over``), so that no crash leaves the branch without them
                (transcript.import's sub-agents, docs/protocol.md, "transcript.import").
            stage: adds a caller's steps to that transaction; called with the branch's id.
        """
        sup = self.supervisor
        config = sup.config
        self.require_open()
        await self._enforce_all()
        active = self.branches.active
        parent_id = ((active.branch_id if active else None)
                     if p.parent_branch_id is msgspec.UNSET else p.parent_branch_id)
        parent: Branch | None = None
        if parent_id is not None:
            parent = await self._live_branch(parent_id, for_append=True)
        record = self.require()
        depth = self.branches.check_room(parent)
        budget = p.budget or config.branch_budget
        timeout_s = p.timeout_seconds or config.branch_timeout_s
        try:
            # Shown in the note and the fold message, and kept as a memory's title.
            description = scrub(p.description).text
        except ScrubError as exc:
            raise scrub_failed("the description", exc, "no branch was created") from exc
        note = branch_note(description, budget, timeout_s, depth, config.max_branch_depth)
        # The prompt is kept twice: the branch's opening message and its row.
        prompt = self._text_at_rest(p.prompt, "no branch was created")
        opening = [MessageIn(role="user", content=note), MessageIn(role="user", content=prompt)]
        counts = await sup.counter.count_messages(opening)
        if sum(counts) >= budget:
            raise params_error("$.budget",
                               f"the branch's opening (its note and prompt) takes {sum(counts)} "
                               f"tokens, so a budget of {budget} leaves nothing for its work; "
                               "give a larger budget or a shorter prompt")
        prefix_tokens = rendered_tokens(parent) if parent else record.main_message_tokens
        window = effective_window(record.budget)
        window_room = (math.ceil(window * record.budget.hard_block) - 1 - prefix_tokens
                       - sum(counts) - REPLY_PRIMING)
        injected = await self._inject(p, description, budget,
                                      min(budget - sum(counts) - 1, max(0, window_room)))
        if injected.text is not None:
            opening.insert(1, MessageIn(role="user", content=injected.text))
            counts.insert(1, injected.tokens)
        opening_tokens = sum(counts)
        would_use = prefix_tokens + opening_tokens + REPLY_PRIMING
        if would_use / window >= record.budget.hard_block:
            raise self._over_hard_block(would_use, opening_tokens, allow_over=False)
        planned = self.branches.opening(
            parent=parent, depth=depth, description=description, prompt=prompt,
            budget=budget, timeout_s=timeout_s, messages=opening, counts=counts,
            prefix_tokens=prefix_tokens, fork_seq=record.last_seq)
        branch = planned.branch
        updated = dataclasses.replace(record, last_seq=record.last_seq + len(opening),
                                      updated_at=branch.created_at)

        def stage_opening(transaction: Transaction) -> None:
            self.branches.stage_create(transaction, planned)
            transaction.add(q.insert_messages, self.session_id, planned.messages)
            if sup.memory is not None:
                # Their use, and the content tokens fitting counted, in the same commit.
                sup.memory.stage_use(transaction, injected, branch.branch_id)

        def stage_caller(transaction: Transaction) -> None:
            if stage is not None:
                stage(transaction, branch.branch_id)

        if first:
            try:
                at_rest, offloads = self._prepared(first, updated.last_seq + 1,
                                                   "no branch was created")
                await self._append(
                    MessageAppendParams(session_id=self.session_id, messages=first,
                                        branch_id=branch.branch_id, allow_over=True),
                    branch, at_rest, offloads, [], stage_caller,
                    _Opened(planned, updated, stage_opening))
            except BaseException:
                if self.require().last_seq == record.last_seq:
                    self.branches.abandoned(planned)  # nothing was committed
                raise
        else:
            transaction = Transaction()
            stage_opening(transaction)
            transaction.add(q.save_counters, updated)
            stage_caller(transaction)
            try:
                with self.branches.registry.slot():
                    await sup.store.commit(transaction)
            except BaseException:
                self.branches.abandoned(planned)
                raise
            self.record = updated
            self.branches.created(planned)
        parent_remaining = (parent.budget - parent.budget_used if parent
                            else window - record.main_thread_tokens)
        return BranchCreateResult(
            branch_id=branch.branch_id, parent_branch_id=parent_id, depth=depth,
            budget_allocated=budget, budget_used=opening_tokens,
            parent_budget_remaining=parent_remaining, timeout_seconds=timeout_s,
            deadline=branch.deadline, injected_context=injected.items,
            injection=injected.injection, created_at=branch.created_at,
            context_state=self.context_state())

    async def _inject(self, p: BranchCreateParams, description: str, budget: int,
                      room: int) -> Injected:
        """Memories for the new branch, within 20% of its budget (and the ``room`` its note
        and prompt leave in the budget and under the session's hard block)."""
        cap = min(int(INJECT_SHARE * budget), room)
        memory = self.supervisor.memory
        if not p.inject_memories or memory is None:
            reason = ("inject_memories is false" if not p.inject_memories
                      else "memory is not running in this daemon")
            return Injected(None, 0, [], Injection(status="disabled", reason=reason, tokens=0,
                                                   budget=cap))
        return await memory.inject(f"{description}\n{p.prompt}",
                                                   project_scope(self.require().project), cap)

    async def branch_status(self, branch_id: str) -> BranchStatusResult:
        """branch.status: the live record when the branch is active, else the stored one."""
        self.require()
        branch = self.branches.live.get(branch_id)
        if branch is not None:
            await self._enforce(branch)
            branch = self.branches.live.get(branch_id)
        shown = (self.branches.shown(branch) if branch
                 else await self.branches.stored(branch_id))
        return BranchStatusResult(branch=shown, context_state=self.context_state())

    async def list_branches(self, p: BranchListParams) -> BranchListResult:
        """branch.list: every branch of the session, live ones with their current meters."""
        await self._enforce_all()
        self.require()
        every = await self.branches.every()
        return BranchListResult(
            branches=[b for b in every if p.status is None or b.status == p.status],
            total=len(every), active=sum(b.status == "active" for b in every),
            folded=sum(b.fold_seq is not None and b.status != "discarded" for b in every),
            context_state=self.context_state())

    async def rollback(self, p: BranchRollbackParams) -> BranchRollbackResult:
        """branch.rollback: the branch's parent thread as it was when the branch was
        created."""
        self.require_open()
        info = await self.branches.stored(p.branch_id)
        if info.status == "discarded":
            raise invalid_state(f"branch {p.branch_id!r} was already discarded by a rollback",
                                "roll back to a branch that is not discarded; see branch.list",
                                branch_id=p.branch_id, status=info.status)
        thread = info.parent_branch_id
        if thread is not None:
            await self._live_branch(thread, for_append=False)
        await self._enforce_all()
        record = self.require()
        now = time.time()
        session_id = self.session_id

        def roll_back(conn: Any) -> tuple[Discarded, SessionRecord]:
            gone = self.branches.discard(
                conn, thread, info.fork_seq, now,
                lambda c, ids: q.discard_messages(c, session_id, thread, info.fork_seq, ids))
            updated = dataclasses.replace(record, updated_at=now,
                                          folded_tokens=gone.folded_tokens,
                                          component_tokens=dict(record.component_tokens))
            if thread is None:
                updated.message_count -= gone.thread_messages
                for component, tokens in gone.thread_tokens.items():
                    updated.component_tokens[component] -= tokens
            q.save_counters(conn, updated)
            if thread is None:
                # A snapshot with messages after the fork no longer is the thread's.
                drop_snapshot_after(conn, session_id, info.fork_seq)
            return gone, updated

        gone, updated = await self.supervisor.store.write(roll_back)
        self.record = updated
        self.branches.rolled_back(p.branch_id, info.fork_seq, gone)
        return BranchRollbackResult(
            rolled_back_to=info.fork_seq, thread=thread, branches_discarded=gone.branch_ids,
            messages_discarded=gone.messages, tokens_recovered=gone.tokens_recovered,
            context_state=self.context_state())

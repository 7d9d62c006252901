"""SessionActor: owns one session's record and runs that session's requests one at a time."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec
import trio

from ctxd.errors import CtxdError, ErrorCode, not_found
from ctxd.folding import _ops as branch_ops
from ctxd.folding import _queries as branch_queries
from ctxd.folding._actor import BranchActor
from ctxd.sessions import _queries as q
from ctxd.sessions._state import (
    SessionRecord,
    effective_window,
    health_of,
    resolve_budget,
    thread_tokens,
)
from ctxd.tokens import REPLY_PRIMING
from ctxd.wire import params_error
from ctxd.wire.types import (
    COMPONENTS,
    AppendedMessage,
    BudgetMeasureParams,
    BudgetMeasureResult,
    Component,
    ForcedReturn,
    MessageAppendParams,
    MessageAppendResult,
    MessageIn,
    MessageListParams,
    MessageListResult,
    RenderedMessage,
    RenderParams,
    RenderResult,
    RenderStats,
    SessionDeleteResult,
    SessionOpenParams,
    SessionOpenResult,
    SessionResult,
    StoredMessage,
)

if TYPE_CHECKING:
    from ctxd.sessions._supervisor import Supervisor

log = logging.getLogger("ctxd.sessions")
T = TypeVar("T")
Op = Callable[["SessionActor"], Awaitable[Any]]

_encode = msgspec.json.Encoder().encode
_decode_content = msgspec.json.Decoder(str | list[dict[str, Any]]).decode
_decode_meta = msgspec.json.Decoder(dict[str, Any]).decode
MAILBOX_SIZE = 32


class ActorGone(Exception):
    """The actor retired before it took the request; the supervisor retries with a new one."""


class Reply(Generic[T]):
    """A one-shot reply slot: the actor sets it once, the caller waits for it."""

    __slots__ = ("_error", "_event", "_value", "arrived")

    def __init__(self) -> None:
        self.arrived = trio.current_time()
        """When the request arrived: deadlines are judged against it, not against when
        the actor got to it."""
        self._event = trio.Event()
        self._value: T | None = None
        self._error: BaseException | None = None

    def set(self, value: T) -> None:
        self._value = value
        self._event.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._event.set()

    @property
    def done(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> T:
        await self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


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


class SessionActor:
    """One per open session: a bounded mailbox, requests processed in arrival order.

    The actor loads its record from the store on its first request (rehydration) and
    retires after ``session_idle_s`` without requests; the supervisor starts a new one
    on the next request.
    """

    def __init__(self, session_id: str, supervisor: Supervisor):
        self.session_id = session_id
        self.supervisor = supervisor
        self.record: SessionRecord | None = None
        self.branch_actors: dict[str, BranchActor] = {}
        self.arrived = 0.0
        """When the request being processed arrived (trio's clock)."""
        self._nursery: trio.Nursery | None = None
        self._stale = True
        self._send, self._receive = trio.open_memory_channel[tuple[Op, Reply[Any]]](MAILBOX_SIZE)

    @property
    def nursery(self) -> trio.Nursery:
        """Where the session's BranchActors run (DESIGN §2)."""
        if self._nursery is None:
            raise RuntimeError("the session actor is not running")
        return self._nursery

    async def submit(self, op: Op) -> Any:
        """Queue ``op`` and wait for its result. Raises `ActorGone` if the actor retired."""
        reply: Reply[Any] = Reply()
        try:
            await self._send.send((op, reply))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise ActorGone from None
        return await reply.wait()

    async def submit_internal(self, op: Op) -> None:
        """`submit` for the session's own tasks (a BranchActor's deadline); a failure is
        logged, since nobody waits for the answer."""
        try:
            await self.submit(op)
        except ActorGone:
            pass  # shutting down: the branch is re-armed from the store on the next start
        except CtxdError as error:
            log.warning("session %s: %s", self.session_id, error.message)

    async def run(self) -> None:
        """The actor loop; returns when idle (and without live branches), when the session
        is gone, or when cancelled."""
        current: Reply[Any] | None = None
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                while True:
                    with trio.move_on_after(self.supervisor.config.session_idle_s):
                        op, current = await self._receive.receive()
                    if current is None:
                        if self._has_queued() or (self.record and self.record.live):
                            continue
                        break
                    await self._process(op, current)
                    current = None
                    if self.record is None and not self._stale and not self._has_queued():
                        break  # no such session (any more); keep serving what is queued
                nursery.cancel_scope.cancel()
        finally:
            if current is not None and not current.done:
                current.fail(CtxdError(ErrorCode.OVERLOADED, "ctxd is shutting down; retry",
                                       {"fix": "retry once the daemon is back"}))
            self._retire()

    async def _process(self, op: Op, reply: Reply[Any]) -> None:
        self.arrived = reply.arrived
        try:
            if self._stale:
                self.record = await branch_ops.load(self)
                self._stale = False
            reply.set(await op(self))
        except CtxdError as error:
            reply.fail(error)
        except Exception as exc:
            # Actor boundary: a failed request must not take the session down. Reload the
            # record from the store before the next request, in case it is now behind.
            self._stale = True
            log.exception("session %s: request failed", self.session_id)
            reply.fail(CtxdError(ErrorCode.INTERNAL_ERROR,
                                 f"internal error: {type(exc).__name__}: {exc}",
                                 {"session_id": self.session_id}))

    def _has_queued(self) -> bool:
        stats = self._receive.statistics()
        return bool(stats.current_buffer_used or stats.tasks_waiting_send)

    def _retire(self) -> None:
        # No await in here: nobody can queue between the drain and the close. Requests are
        # only left queued when the actor is cancelled (shutdown); their callers retry.
        self.supervisor.forget(self)
        while True:
            try:
                _, reply = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            reply.fail(ActorGone())
        self._receive.close()

    # ---- helpers ---------------------------------------------------------------

    def require(self) -> SessionRecord:
        if self.record is None:
            raise not_found("session", self.session_id, "open it first with session.open")
        return self.record

    def require_open(self) -> SessionRecord:
        record = self.require()
        if record.state != "open":
            raise CtxdError(ErrorCode.INVALID_STATE,
                            f"session {self.session_id!r} is closed",
                            {"session_id": self.session_id, "state": record.state,
                             "fix": "reopen it with session.open or start a new session"})
        return record

    async def _save(self, record: SessionRecord) -> None:
        await self.supervisor.store.write(q.save_session, record)
        self.record = record

    # ---- operations ------------------------------------------------------------

    async def open(self, params: SessionOpenParams) -> SessionOpenResult:
        now = time.time()
        sup = self.supervisor
        if self.record is None:
            record = SessionRecord(
                session_id=self.session_id, project=params.project, title=params.title,
                state="open", budget=resolve_budget(params.budget, sup.config.budget),
                created_at=now, updated_at=now)
            with sup.open_slot():
                await self._save(record)
            sup.sessions_total += 1
            sup.bus.publish(self.session_id, "session.opened",
                            {"project": record.project, "title": record.title, "created": True})
            return SessionOpenResult(session=record.info(), created=True,
                                     context_state=record.context_state())
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
                            {"project": record.project, "title": record.title,
                             "created": False})
        return SessionOpenResult(session=record.info(), created=False,
                                 context_state=record.context_state())

    async def get(self) -> SessionResult:
        record = self.require()
        return SessionResult(session=record.info(), context_state=record.context_state())

    async def close(self) -> SessionResult:
        record = self.require()
        if record.state == "open":
            await branch_ops.close_all(self)
            record = self.require()
            now = time.time()
            closed = dataclasses.replace(record, state="closed", closed_at=now, updated_at=now)
            await self._save(closed)
            record = closed
            self.supervisor.sessions_open -= 1
            self.supervisor.bus.publish(self.session_id, "session.closed",
                                        {"message_count": record.message_count,
                                         "total_tokens": record.total_tokens})
        return SessionResult(session=record.info(), context_state=record.context_state())

    async def delete(self) -> SessionDeleteResult:
        record = self.require()
        if record.live:
            await branch_ops.close_all(self, "session_deleted")
            record = self.require()
        deleted = await self.supervisor.store.write(q.delete_session, self.session_id)
        if record.state == "open":
            self.supervisor.sessions_open -= 1
        self.supervisor.sessions_total -= 1
        self.record = None
        self.supervisor.bus.publish(self.session_id, "session.deleted",
                                    {"messages_deleted": deleted})
        return SessionDeleteResult(session_id=self.session_id, deleted=True,
                                   messages_deleted=deleted)

    def over_hard_block(self, would_use: int, tokens_appended: int,
                        allow_over: bool = True) -> CtxdError:
        """-32001: the active thread would pass the hard block (``allow_over``: whether
        the method takes ``allow_over=true``)."""
        record = self.require()
        window = effective_window(record.budget)
        limit = int(window * record.budget.hard_block)
        return CtxdError(
            ErrorCode.CONTEXT_LIMIT_EXCEEDED,
            f"appending {tokens_appended} tokens would bring the context to {would_use} "
            f"of {window} tokens, past the hard block at {limit}",
            {"session_id": self.session_id, "would_use": would_use,
             "hard_block_tokens": limit, "effective_window": window,
             "tokens_appended": tokens_appended,
             "suggestion": "fold finished sub-tasks (branch.return) or compact the "
                           "context (context.compact)"
                           + ("; pass allow_over=true to append anyway" if allow_over
                              else "")})

    async def append(self, params: MessageAppendParams) -> MessageAppendResult:
        self.require_open()
        _check_parts(params.messages)
        branch = None
        forced: list[ForcedReturn] = []
        if params.branch_id is not None:
            branch = await branch_ops.live_branch(self, params.branch_id, for_append=True)
        record = self.require()
        health_before = record.context_state().health
        counts = await self.supervisor.counter.count_messages(params.messages)
        tokens_appended = sum(counts)
        thread_before = record.main_message_tokens if branch is None else branch.rendered_tokens
        would_use = thread_before + tokens_appended + REPLY_PRIMING
        if would_use / effective_window(record.budget) >= record.budget.hard_block \
                and not params.allow_over:
            raise self.over_hard_block(would_use, tokens_appended)
        now = time.time()
        updated = dataclasses.replace(record, last_seq=record.last_seq + len(params.messages),
                                      updated_at=now,
                                      component_tokens=dict(record.component_tokens))
        rows: list[q.MessageRow] = []
        appended: list[AppendedMessage] = []
        for offset, (message, tokens) in enumerate(zip(params.messages, counts, strict=True)):
            component: Component = message.component or (
                "system_prompt" if message.role == "system" else "conversation")
            seq = record.last_seq + offset + 1
            if branch is None:
                updated.component_tokens[component] += tokens
            rows.append((self.session_id, seq, message.role, _encode(message.content),
                         message.name, message.tool_call_id, component,
                         None if message.meta is None else _encode(message.meta), tokens, now,
                         params.branch_id))
            appended.append(AppendedMessage(seq=seq, tokens=tokens, component=component))
        grown = None
        if branch is None:
            updated.message_count += len(params.messages)
            await self.supervisor.store.write(q.append_messages, updated, rows)
        else:
            grown = dataclasses.replace(
                branch, tokens_used=branch.tokens_used + tokens_appended,
                operations=branch.operations + sum(m.role == "assistant"
                                                   for m in params.messages))
            grown.warned = branch.warned or grown.past_warning
            await self.supervisor.store.write(branch_queries.append_to_branch, updated, grown,
                                              rows)
            updated.live[grown.branch_id] = grown
        self.record = updated
        state = updated.context_state()
        bus = self.supervisor.bus
        bus.publish(self.session_id, "message.appended",
                    {"branch_id": params.branch_id, "first_seq": appended[0].seq,
                     "last_seq": appended[-1].seq, "count": len(appended),
                     "tokens": tokens_appended, "main_thread_tokens": state.main_thread_tokens})
        if state.health != health_before:
            bus.publish(self.session_id, "context.health",
                        {"from": health_before, "to": state.health, "usage": state.usage})
        if grown is not None and branch is not None:
            if grown.warned and not branch.warned:
                branch_ops.publish_budget_warning(self, grown)
            # The append has committed: a failure of the forced return is retried when the
            # branch is next touched, and does not turn this answer into an error.
            forced += await branch_ops.enforce(self, grown)
            state = self.require().context_state()
        return MessageAppendResult(appended=appended, tokens_appended=tokens_appended,
                                   forced_returns=forced, context_state=state)

    async def list_messages(self, params: MessageListParams) -> MessageListResult:
        record = self.require()
        if params.branch_id is not None:
            await branch_ops.stored_branch(self, params.branch_id)
        after = int(params.cursor) if params.cursor else 0
        messages = await self.supervisor.store.read(_stored_messages, self.session_id,
                                                    params.branch_id, after, params.limit + 1)
        more = len(messages) > params.limit
        messages = messages[:params.limit]
        return MessageListResult(messages=messages,
                                 next_cursor=str(messages[-1].seq) if more else None,
                                 context_state=record.context_state())

    async def render(self, params: RenderParams) -> RenderResult:
        if params.branch_id is msgspec.UNSET:
            await branch_ops.enforce_all(self)
            active = self.require().active_branch
            branch_id = None if active is None else active.branch_id
        else:
            branch_id = params.branch_id
            if branch_id is not None:
                live = self.require().live.get(branch_id)
                if live is not None:
                    await branch_ops.enforce(self, live)
                else:
                    await branch_ops.stored_branch(self, branch_id)
        record = self.require()
        messages, message_tokens = await self.supervisor.store.read(
            _render_rows, self.session_id, branch_id)
        tokens = thread_tokens(message_tokens, len(messages))
        return RenderResult(
            branch_id=branch_id, messages=messages, tokens=tokens,
            context_state=record.context_state(),
            stats=RenderStats(message_count=len(messages), stored_messages=record.last_seq,
                              message_tokens=message_tokens,
                              reply_priming_tokens=tokens - message_tokens))

    async def measure(self, params: BudgetMeasureParams) -> BudgetMeasureResult:
        record = self.require()
        counter = self.supervisor.counter
        extra: dict[Component, int] = dict.fromkeys(COMPONENTS, 0)
        if params.system_prompt is not None:
            # Counted as the system message it will be (the rule lives in TokenCounter).
            [extra["system_prompt"]] = await counter.count_messages(
                [MessageIn(role="system", content=params.system_prompt)])
        for prompt in params.skill_prompts or ():
            extra["skill_prompts"] += await counter.count_async(prompt)
        for tool in params.tool_definitions or ():
            extra["tool_descriptions"] += await counter.count_async(_encode(tool).decode())
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
            context_state=record.context_state())


def _stored_messages(conn: Any, session_id: str, branch_id: str | None, after_seq: int,
                     limit: int) -> list[StoredMessage]:
    """A page of messages, decoded in the store's thread (pages can be large)."""
    return [StoredMessage(
        seq=seq, role=role, content=_decode_content(content), name=name,
        tool_call_id=tool_call_id, component=component,
        meta=None if meta is None else _decode_meta(meta), tokens=tokens,
        created_at=created_at, branch_id=branch, discarded=bool(discarded))
        for (seq, role, content, name, tool_call_id, component, meta, tokens, created_at, branch,
             discarded) in q.list_messages(conn, session_id, branch_id, after_seq, limit)]


def _render_rows(conn: Any, session_id: str,
                 branch_id: str | None) -> tuple[list[RenderedMessage], int]:
    """The messages to send for a thread, and the sum of their tokens."""
    rows = branch_queries.context_rows(conn, session_id, branch_id)
    return ([RenderedMessage(role=role, content=_decode_content(content), name=name,
                             tool_call_id=tool_call_id)
             for role, content, name, tool_call_id, _ in rows],
            sum(row[4] for row in rows))

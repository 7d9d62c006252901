"""SessionActor: owns one session's mailbox, its record and its branches, and runs that
session's operations one at a time; the only writer of both (docs/architecture.md).

The operations live by feature as functions of the actor (`_session_ops`, `_branch_ops`,
`_hygiene_ops`, `_returns`, and the hub's, import's and fork's modules): this module knows
none of them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

import trio

from ctxd.errors import (
    CtxdError,
    ErrorCode,
    internal_error,
    invalid_state,
    not_found,
    shutting_down,
)
from ctxd.folding import Branches
from ctxd.jobs import Request, Slot, cancellation_point, current_request, working_for
from ctxd.sessions import _queries as q
from ctxd.sessions._services import Services
from ctxd.sessions._state import SessionRecord
from ctxd.wire.types import ContextState

log = logging.getLogger("ctxd.sessions")
Op = Callable[["SessionActor"], Awaitable[Any]]
Queued = tuple[Op, Slot[Any], Request | None]
"""An operation in a mailbox, its caller's reply, and the request it works for."""

MAILBOX_SIZE = 32


async def _idle(actor: SessionActor) -> None:
    """Queued by the actor's idle watch when it waited ``session_idle_s`` for a request;
    the run loop takes it as the sign to retire, never runs it."""


class ActorGone(Exception):
    """The actor retired before it took the request; the supervisor retries with a new one."""


@dataclass(frozen=True)
class _Shared:
    """An operation queued with a key (`SessionActor.submit_shared`) and its reply."""

    key: Hashable
    reply: Slot[Any]


class SessionActor:
    """One per open session: a bounded mailbox, operations processed in arrival order.

    The actor loads its record (and its live branches) from the store on its first request
    (rehydration) and retires after ``session_idle_s`` without requests (and without live
    branches); the supervisor starts a new one on the next request.

    Args:
        session_id: the session.
        services: the daemon's parts the operations use (the Supervisor's, shared).
        expire: the operation queued when the earliest deadline of a live branch passes
            (`_returns.expire`: it force-returns every branch that is due).
    """

    def __init__(self, session_id: str, services: Services, expire: Op):
        self.session_id = session_id
        self.services = services
        self.record: SessionRecord | None = None
        self.branches = Branches(session_id, services.store, services.counter,
                                 services.bus, services.config, services.registry,
                                 self._deadline_passed)
        self.arrived = 0.0
        """When the request being processed arrived (trio's clock)."""
        self.tools_deferred: tuple[str, ...] = ()
        """The tools deferred when `tools.deferred` was last published."""
        self.tools_offered: bytes | None = None
        """The digest of the tool definitions a model request last registered
        (`_hygiene_ops.offered_tools`): the same ones are not registered again."""
        self._expire = expire
        self._stale = True
        self._send, self._receive = trio.open_memory_channel[Queued](MAILBOX_SIZE)
        self._last: _Shared | None = None
        """The operation queued last, when requests with its key may share it."""
        self._waiting_since: float | None = None
        """Since when the run loop waits for a request (trio's clock); None while it
        processes one."""

    # ---- the mailbox -------------------------------------------------------------------

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

    def has_queued(self) -> bool:
        """Whether an operation waits in the mailbox (or for room in it)."""
        stats = self._receive.statistics()
        return bool(stats.current_buffer_used or stats.tasks_waiting_send)

    async def _deadline_passed(self) -> None:
        """The earliest deadline of a live branch passed (the branches' timer calls this):
        queue the expiry, in order with the session's other requests, and wait for it; a
        failure is logged, since nobody else waits for it."""
        try:
            with working_for(None):  # no request's: its task may have started the timer
                await self.submit(self._expire)
        except ActorGone:
            pass  # shutting down: the branch is re-armed from the store on the next start
        except CtxdError as error:
            log.warning("session %s: %s", self.session_id, error.message)

    # ---- the run loop ------------------------------------------------------------------

    async def run(self) -> None:
        """The actor loop; returns when idle (and without live branches), when the session
        is gone, or when cancelled."""
        current: Slot[Any] | None = None
        try:
            async with trio.open_nursery() as nursery:
                self.branches.start(nursery)
                nursery.start_soon(self._watch_idle)
                idle_s = self.services.config.session_idle_s
                while True:
                    since = self._waiting_since = trio.current_time()
                    op, current, request = await self._receive.receive()
                    self._waiting_since = None
                    if op is _idle:
                        current = None
                        # Idle only if this receive waited the whole time: one queued
                        # behind requests is stale.
                        if (trio.current_time() < since + idle_s or self.has_queued()
                                or self.branches.live):
                            continue
                        break
                    await self._process(op, current, request)
                    current = None
                    if self.record is None and not self._stale and not self.has_queued():
                        break  # no such session (any more); keep serving what is queued
                nursery.cancel_scope.cancel()
        finally:
            if current is not None and not current.done:
                current.fail(shutting_down())
            self._retire()

    async def _watch_idle(self) -> None:
        """Queue `_idle` once the run loop has waited ``session_idle_s`` for a request.

        The idle timeout of the loop, without a cancel scope around every receive (a
        deadline registered and removed per request, docs/performance.md): this task
        wakes at most once per ``session_idle_s`` while requests come.
        """
        idle_s = self.services.config.session_idle_s
        while True:
            since = self._waiting_since
            if since is None:
                await trio.sleep(idle_s)  # processing: the next wait starts after now
            elif trio.current_time() < since + idle_s:
                await trio.sleep_until(since + idle_s)
            else:
                with contextlib.suppress(trio.WouldBlock):  # full: not idle
                    self._send.send_nowait((_idle, Slot(), None))
                await trio.sleep(idle_s)

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
        record = await self.services.store.read(q.load_session, self.session_id)
        if record is not None:
            await self.branches.load()
        return record

    def _retire(self) -> None:
        # No await in here, nor between here and the supervisor forgetting the actor (as
        # its task ends): nobody can queue between the drain and the close. Requests are
        # only left queued when the actor is cancelled (shutdown); their callers retry.
        while True:
            try:
                _, reply, _ = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            reply.fail(ActorGone())
        self._receive.close()

    # ---- the record --------------------------------------------------------------------

    def require(self) -> SessionRecord:
        """The session's record.

        Raises:
            CtxdError: -32004 when the session does not exist.
        """
        if self.record is None:
            raise not_found("session", self.session_id,
                            "check its id (session.list lists them), or open it with "
                            "session.open")
        return self.record

    def require_open(self) -> SessionRecord:
        """The record of an open session.

        Raises:
            CtxdError: -32004 as `require`; -32002 when the session is closed.
        """
        record = self.require()
        if record.state != "open":
            raise invalid_state(f"session {self.session_id!r} is closed",
                                "reopen it with session.open or start a new session",
                                session_id=self.session_id, state=record.state)
        return record

    def context_state(self) -> ContextState:
        return self.require().context_state(self.branches)

    async def save(self, record: SessionRecord) -> None:
        """Write the session's row and hold ``record`` once it has committed."""
        await self.services.store.write(q.save_session, record)
        self.record = record

    def over_hard_block(self, would_use: int, tokens_appended: int,
                        allow_over: bool = True, what: str = "appending") -> CtxdError:
        """-32001: the active thread would pass the hard block (``allow_over``: whether
        the method takes ``allow_over=true``; ``what``: the verb the message starts with)."""
        record = self.require()
        window = record.budget.effective_window
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

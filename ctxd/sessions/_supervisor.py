"""Supervisor: the registry of SessionActors; starts, looks up, idles out, expires sessions."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

import trio

from ctxd.config import Config
from ctxd.errors import CtxdError, shutting_down
from ctxd.folding import Registry
from ctxd.hub import EventBus
from ctxd.hygiene import make_summarizer
from ctxd.memory import Memory
from ctxd.sessions import _queries as q
from ctxd.sessions._actor import ActorGone, SessionActor
from ctxd.sessions._compaction import Compactor
from ctxd.sessions._returns import expire
from ctxd.sessions._services import Services, SessionCounts
from ctxd.sessions._session_ops import delete_session
from ctxd.sessions._state import SessionRecord
from ctxd.store import Store
from ctxd.tokens import TokenCounter
from ctxd.wire.types import SessionInfo

log = logging.getLogger("ctxd.sessions")
T = TypeVar("T")
REARM_CONCURRENCY = 32


class Supervisor:
    """Routes each session's requests to its actor, starting one when needed; builds the
    `Services` every actor shares, and owns the daemon's session counts and live-branch
    registry.

    Args:
        store: the database.
        counter: the token counter shared by every actor.
        bus: where session events are published.
        config: the daemon configuration (idle time, TTL, limits, default budget).
        memory: the memory service, for injection into new branches.
    """

    def __init__(self, store: Store, counter: TokenCounter, bus: EventBus, config: Config,
                 memory: Memory | None = None):
        self.store = store
        self.bus = bus
        self.config = config
        self.registry = Registry(store, config.max_live_branches)
        """Every live branch of the daemon, and the session that holds it."""
        self.sessions = SessionCounts(config.max_open_sessions)
        self.services = Services(
            store=store, counter=counter, bus=bus, config=config, memory=memory,
            compactor=Compactor(counter, config.hygiene, make_summarizer(config.hygiene)),
            registry=self.registry, sessions=self.sessions)
        """What every actor uses (built once: no actor reaches through the Supervisor)."""
        self.searches = trio.CapacityLimiter(max(1, os.cpu_count() or 1))
        """The worker threads of `result.read`'s searches, which run off the sessions'
        mailboxes: at most one a core, so that many slow ones cannot take every thread."""
        self._actors: dict[str, SessionActor] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Own the actors' nursery until cancelled."""
        self.sessions.loaded(*await self.store.read(q.count_sessions))
        await self.registry.load()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self.config.session_ttl_h > 0:
                    nursery.start_soon(self._expire_closed_sessions)
                nursery.start_soon(self._rearm_live_branches)
                task_status.started(self)
                await trio.sleep_forever()
        finally:
            self._nursery = None

    async def call(self, session_id: str, op: Callable[[SessionActor], Awaitable[T]]) -> T:
        """Run ``op`` on the session's actor, in order with that session's other requests.

        Raises:
            CtxdError: whatever the operation raises; -32007 while the daemon shuts down.
        """
        result, _ = await self.call_shared(session_id, None, op)
        return result

    async def call_shared(self, session_id: str, key: Hashable | None,
                          op: Callable[[SessionActor], Awaitable[T]]) -> tuple[T, bool]:
        """`call`, unless an operation of the session with the same ``key`` (not None) is
        queued last or running with nothing queued after it: then its result, and True
        (`SessionActor.submit_shared`).

        Raises:
            CtxdError: as `call`.
        """
        while True:
            try:
                shared: tuple[T, bool] = await self._actor(session_id).submit_shared(key, op)
            except ActorGone:
                continue
            return shared

    def _actor(self, session_id: str) -> SessionActor:
        """The session's actor, started if it has none."""
        actor = self._actors.get(session_id)
        if actor is None:
            if self._nursery is None:
                raise shutting_down()
            actor = SessionActor(session_id, self.services, expire)
            self._actors[session_id] = actor
            self._nursery.start_soon(self._serve, actor)
        return actor

    async def _serve(self, actor: SessionActor) -> None:
        """Run the actor until it retires; then no request finds it any more (no await
        between its last drain of the mailbox and this)."""
        try:
            await actor.run()
        finally:
            if self._actors.get(actor.session_id) is actor:
                del self._actors[actor.session_id]

    def info(self, stored: SessionRecord, live_branches: int) -> SessionInfo:
        """A session's info from its running actor (live branches and all), else from the
        store (with the stored count of its active branches)."""
        actor = self._actors.get(stored.session_id)
        if actor is not None and actor.record is not None:
            return actor.record.info(actor.branches)
        return stored.info(live_branches=live_branches)

    @property
    def sessions_open(self) -> int:
        return self.sessions.open

    @property
    def sessions_total(self) -> int:
        return self.sessions.total

    @property
    def actor_count(self) -> int:
        return len(self._actors)

    async def _expire_closed_sessions(self) -> None:
        ttl_s = self.config.session_ttl_h * 3600
        while True:
            try:
                expired = await self.store.read(q.expired_sessions, time.time() - ttl_s)
                for session_id in expired:
                    await self.call(session_id, _delete_if_still_expired(time.time() - ttl_s))
            except CtxdError as error:
                # A failing store must not take the daemon down; the next sweep retries.
                log.warning("expiring closed sessions failed: %s", error.message)
            await trio.sleep(min(3600.0, max(1.0, ttl_s / 10)))

    async def _rearm_live_branches(self) -> None:
        """After a restart, load every session with live branches, a few at a time, so
        that their deadlines are armed again (an expired one is force-returned at once)."""
        try:
            session_ids = await self.registry.sessions_with_live_branches()
        except CtxdError as error:
            log.error("re-arming live branches failed: %s", error.message)
            return
        limiter = trio.CapacityLimiter(REARM_CONCURRENCY)

        async def rearm(session_id: str) -> None:
            async with limiter:
                try:
                    await self.call(session_id, _loaded)
                except CtxdError as error:
                    log.error("session %s: re-arming its branches failed: %s", session_id,
                              error.message)

        async with trio.open_nursery() as nursery:
            for session_id in session_ids:
                nursery.start_soon(rearm, session_id)


async def _loaded(actor: SessionActor) -> None:
    """An operation that only makes the actor load its session (and arm its branches)."""


def _delete_if_still_expired(closed_before: float) -> Callable[[SessionActor], Awaitable[None]]:
    async def op(actor: SessionActor) -> Any:
        record = actor.record
        expired = record is not None and record.state == "closed" and (
            record.closed_at or 0) < closed_before
        if expired:
            await delete_session(actor)
            log.info("session %s expired and was deleted", actor.session_id)

    return op

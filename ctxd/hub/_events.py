"""The EventBus: the `events` table and the fan-out of events to subscribers.

`publish` never blocks: it queues the event. The bus's writer task (`EventBus.run`) takes
every queued event at once, numbers them (``seq`` continues from the table's high-water
mark, so it survives restarts), writes them in one transaction through the store's writer,
and only then fans them out. So every ``seq`` a subscriber sees is in the table, and the
table's seqs have no gap and no duplicate, even after a SIGKILL: an event still queued at
the kill never got a seq (docs/decisions.md, Events). `stage` publishes the events of a
request with the request's own transaction instead: numbered and written in it, sent once
it committed (the append path: no transaction of the writer's per request). Seqs are given
in the store's thread, where both kinds of write run one after the other, and events are
sent in seq order.

A subscription with ``since_seq`` first replays from the table, page by page, then turns
live in the same step that finds it has caught up with the last written seq, so there is
no gap and no duplicate at the seam. Events pruned (``events_keep``,
``events_retention_days``) before a subscriber read them, or lost because its buffer was
full, are announced by a ``dropped`` event that says how many and the seq of the last one.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import apsw
import msgspec
import trio

from ctxd.errors import CtxdError
from ctxd.store import Store, Transaction, scalar_int
from ctxd.wire.types import Event

log = logging.getLogger("ctxd.hub")

REPLAY_PAGE = 2_000
"""Events read from the table per store job while a subscription replays."""

MAX_QUEUED = 100_000
"""Events waiting for the writer beyond which `publish` drops them (the store is stuck)."""

RETENTION_CHECK_S = 60.0
"""How often the writer removes the events older than the retention."""

_decode_data = msgspec.json.Decoder(dict[str, Any]).decode
_encode = msgspec.json.Encoder().encode
_INSERT = "INSERT INTO events (seq, ts, session_id, type, data) VALUES (?, ?, ?, ?, ?)"


class BusStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What `EventBus.statistics` reports."""

    seq: int
    """The last event written (and sent to the live subscribers)."""
    subscribers: int
    queued: int
    """Events published and not yet written."""
    lost: int
    """Events the store could not write since the daemon started (logged)."""


class Subscription:
    """One subscriber's bounded view of the bus. Iterate it with `receive`."""

    def __init__(self, bus: EventBus, subscription_id: str, session_id: str | None,
                 types: Iterable[str] | None, buffer: int, replay_after: int | None):
        self._bus = bus
        self.subscription_id = subscription_id
        self.session_id = session_id
        self.types = frozenset(types) if types else None
        self.dropped = 0
        self._dropped_through = 0
        self._max_buffer = buffer
        self._send, self._receive = trio.open_memory_channel[Event](buffer)
        self.replay_after = replay_after
        """While replaying: the seq up to which the table has been read (None: live)."""
        self.published_before = 0
        """Events published before a subscription without ``since_seq`` began, still on
        their way to the table: not this subscriber's (it asked for what comes next)."""
        self._page: deque[Event] = deque()
        self._closed = False

    def wants(self, event: Event) -> bool:
        if self.session_id is not None and event.session_id != self.session_id:
            return False
        return self.types is None or event.type in self.types or event.type == "dropped"

    def lose(self, seq: int, count: int = 1) -> None:
        """Count events this subscriber will never see, the last of them ``seq``."""
        self.dropped += count
        self._dropped_through = seq

    def _marker(self) -> Event:
        marker = Event(seq=self._dropped_through, ts=time.time(), session_id=self.session_id,
                       type="dropped", data={"dropped": self.dropped})
        self.dropped = 0
        return marker

    def offer_nowait(self, event: Event) -> None:
        """Queue an event, or count it as dropped when the buffer is full."""
        try:
            if self.dropped:
                if self._send.statistics().current_buffer_used >= self._max_buffer - 1:
                    raise trio.WouldBlock
                self._send.send_nowait(self._marker())
            self._send.send_nowait(event)
        except trio.WouldBlock:
            self.lose(event.seq)
        except trio.ClosedResourceError:
            pass

    async def receive(self) -> Event:
        """The next event: replayed from the table first, then live (a ``dropped`` marker
        before events it will never see).

        Raises:
            trio.EndOfChannel: the subscription was closed.
        """
        while self.replay_after is not None:
            if self._closed:
                raise trio.EndOfChannel
            if self.dropped:
                return self._marker()
            if self._page:
                return self._page.popleft()
            await self._bus.replay_page(self)
        try:
            return self._receive.receive_nowait()
        except trio.WouldBlock:
            if self.dropped:
                await trio.lowlevel.checkpoint()
                return self._marker()
        return await self._receive.receive()

    def receive_nowait(self) -> Event | None:
        """The next event if one is waiting (None while a replay needs its next page, or
        once the subscription is closed)."""
        if self._closed:
            return None
        if self.replay_after is not None:
            if self.dropped:
                return self._marker()
            return self._page.popleft() if self._page else None
        try:
            return self._receive.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            return None

    def replayed(self, events: list[Event]) -> None:
        """Events read from the table, to be received before anything else."""
        self._page.extend(events)

    def close(self) -> None:
        self._closed = True
        self._send.close()


def _start(conn: apsw.Connection, retention_before: float) -> tuple[int, int]:
    """The high-water seq and the last seq pruned, after the retention's pruning."""
    _prune_by_age(conn, retention_before)
    # Seq never goes back: the newest row's, or the highest at the last deletion (migration
    # v0014).
    high = scalar_int(conn, "SELECT max(coalesce((SELECT max(seq) FROM events), 0), "
                            "coalesce((SELECT seq FROM events_high_water), 0))")
    oldest = conn.execute("SELECT min(seq) FROM events").fetchall()[0][0]
    return high, (high if oldest is None else int(oldest) - 1)


def _keep_high_water(conn: apsw.Connection) -> None:
    """Before events are deleted: remember the highest seq (the newest may go)."""
    conn.execute("INSERT INTO events_high_water (singleton, seq) "
                 "SELECT 1, coalesce(max(seq), 0) FROM events WHERE true "
                 "ON CONFLICT (singleton) DO UPDATE SET seq = max(seq, excluded.seq)")


def _prune_by_age(conn: apsw.Connection, before: float) -> None:
    # Seq order is time order: the scan stops at the first event young enough to keep.
    row = conn.execute("SELECT seq FROM events WHERE ts >= ? ORDER BY seq LIMIT 1",
                       (before,)).fetchone()
    if row is None:
        _keep_high_water(conn)  # (the newest is kept otherwise)
        conn.execute("DELETE FROM events")
    else:
        conn.execute("DELETE FROM events WHERE seq < ?", (row[0],))


def _write(conn: apsw.Connection, rows: list[tuple[int, float, str | None, str, bytes]],
           prune_through: int, retention_before: float | None,
           forgotten: list[tuple[str, int]]) -> None:
    conn.executemany(_INSERT, rows)
    if forgotten or prune_through:
        _keep_high_water(conn)
    conn.executemany("DELETE FROM events WHERE session_id = ? AND seq <= ?", forgotten)
    if prune_through:
        conn.execute("DELETE FROM events WHERE seq <= ?", (prune_through,))
    if retention_before is not None:
        _prune_by_age(conn, retention_before)


def _read_page(conn: apsw.Connection, after: int, upto: int, session_id: str | None,
               types: frozenset[str] | None, limit: int) -> tuple[int, list[Event]]:
    """The oldest seq kept (``upto + 1`` when none is) and the wanted events after
    ``after``, up to ``upto``, in seq order."""
    oldest = conn.execute("SELECT min(seq) FROM events").fetchall()[0][0]
    sql = "SELECT seq, ts, session_id, type, data FROM events WHERE seq > ? AND seq <= ?"
    bindings: list[Any] = [after, upto]
    if session_id is not None:
        sql += " AND session_id = ?"
        bindings.append(session_id)
    if types is not None:
        sql += f" AND type IN ({', '.join('?' * len(types))})"
        bindings.extend(sorted(types))
    bindings.append(limit)
    events = [Event(seq=seq, ts=ts, session_id=sid, type=type, data=_decode_data(data))
              for seq, ts, sid, type, data in conn.execute(sql + " ORDER BY seq LIMIT ?",
                                                           bindings)]
    return (upto + 1 if oldest is None else int(oldest)), events


class _Staged:
    """Events of one session staged in a request's transaction (`EventBus.stage`)."""

    __slots__ = ("events", "first", "session_id", "ts")

    def __init__(self, session_id: str | None, events: list[tuple[str, dict[str, Any]]]):
        self.session_id = session_id
        self.events = events
        self.ts = time.time()
        self.first = 0
        """The seq of the first, once numbered in the store's thread (0: not written)."""


class EventBus:
    """Publishes events to every matching subscription without ever waiting.

    Args:
        buffer: events queued per subscriber before it starts losing them.
        store: where the events are kept; without one (a test's supervisor) events are
            numbered and sent at once, kept nowhere, and `since_seq` replays nothing.
        keep: events kept in the table (it holds up to ``keep + keep // 100`` between
            two prunings, which come every ``keep // 100`` events).
        retention_days: events older than this are removed (at start-up, then every
            minute).
    """

    def __init__(self, buffer: int = 1024, store: Store | None = None, keep: int = 100_000,
                 retention_days: float = 7.0):
        self._buffer = buffer
        self._store = store
        self._keep = keep
        self._prune_step = max(1, keep // 100)
        self._retention_s = retention_days * 86_400
        self._subscriptions: dict[str, Subscription] = {}
        self._seq = 0
        self._written = 0
        """The newest seq in the table or in the transaction being written: read and
        advanced only in the store's thread, which numbers every event."""
        self._unsent: dict[int, tuple[Event, int]] = {}
        """Events written, each with its publish number, waiting for a lower seq still on
        its way back from the store's thread: events are sent in seq order."""
        self._running = False
        self._pruned_through = 0
        self._retention_checked = 0.0
        self._queued: list[tuple[int, float, str | None, str, dict[str, Any]]] = []
        self._published = 0
        """Events published so far (each one's number, in publish order)."""
        self._forgotten: list[tuple[str, int]] = []
        """Sessions whose events are to be deleted, each with the number of the last event
        published before."""
        self._wake = trio.Event()
        self._lost = 0
        self._ids = itertools.count(1)

    @property
    def seq(self) -> int:
        """The seq of the newest event written and sent (0 before the first)."""
        return self._seq

    def publish(self, session_id: str | None, type: str, data: dict[str, Any]) -> None:
        """Queue one event for the writer (or, without a store, send it); never blocks."""
        self._published += 1
        if self._store is None:
            self._seq += 1
            self._send(Event(seq=self._seq, ts=time.time(), session_id=session_id,
                             type=type, data=data), self._published)
            return
        if len(self._queued) >= MAX_QUEUED:
            self._lost += 1
            return
        self._queued.append((self._published, time.time(), session_id, type, data))
        self._wake.set()

    def stage(self, transaction: Transaction, session_id: str | None,
              events: list[tuple[str, dict[str, Any]]]) -> None:
        """Publish ``events`` (type and data, in order) of a session with ``transaction``,
        a request's write: numbered and written in it, sent once it committed, never when
        it rolled back (docs/decisions.md, Events).

        Should events published before still wait for the writer, these are published
        after the commit instead, like any other: the waiting ones keep the lower seqs.
        """
        if not events:
            return
        if self._store is None or self._queued or not self._running:
            def publish_committed() -> None:
                if transaction.committed:
                    for type, data in events:
                        self.publish(session_id, type, data)
            transaction.after(publish_committed)
            return
        staged = _Staged(session_id, events)
        transaction.add(self._insert_staged, staged)
        transaction.on_rollback(lambda: self._unnumber(staged.first))
        transaction.after(lambda: self._send_staged(transaction, staged))

    def _insert_staged(self, conn: apsw.Connection, staged: _Staged) -> None:
        # In the store's thread, inside the request's transaction.
        first = self._written + 1
        conn.executemany(_INSERT, [(first + n, staged.ts, staged.session_id, type, _encode(data))
                                   for n, (type, data) in enumerate(staged.events)])
        staged.first = first
        self._written = first + len(staged.events) - 1

    def _unnumber(self, first: int) -> None:
        # In the store's thread, right after a rollback: the seqs from ``first`` are free.
        if first:
            self._written = first - 1

    def _send_staged(self, transaction: Transaction, staged: _Staged) -> None:
        if not transaction.committed:
            return
        if staged.first == self._seq + 1 and not self._subscriptions:
            # In order, and nobody to send them to: only the counts move.
            self._seq += len(staged.events)
            self._published += len(staged.events)
        else:
            for n, (type, data) in enumerate(staged.events):
                self._published += 1
                self._unsent[staged.first + n] = (
                    Event(seq=staged.first + n, ts=staged.ts, session_id=staged.session_id,
                          type=type, data=data), self._published)
        self._send_written()
        if self._prune_due(staged.ts):
            self._wake.set()  # the writer prunes; the request's transaction did not

    def _send_written(self) -> None:
        """Send the events written, in seq order, up to the first one still on its way."""
        while (written := self._unsent.pop(self._seq + 1, None)) is not None:
            self._seq += 1
            self._send(*written)

    def _prune_due(self, now: float) -> bool:
        """Whether the writer has pruning to do: by count, or by age (once a minute)."""
        return ((self._seq - self._keep) // self._prune_step * self._prune_step
                > self._pruned_through or now - self._retention_checked >= RETENTION_CHECK_S)

    def forget(self, session_id: str) -> None:
        """Delete the kept events of a deleted session (its titles, descriptions and
        results: docs/security.md), those still queued included; events published after
        this call are kept."""
        if self._store is not None:
            self._forgotten.append((session_id, self._published))
            self._wake.set()

    def _send(self, event: Event, published: int) -> None:
        for subscription in self._subscriptions.values():
            if subscription.replay_after is None and published > subscription.published_before \
                    and subscription.wants(event):
                subscription.offer_nowait(event)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """The writer: prunes by age, learns the high-water seq, then writes what is
        published, one transaction per batch, for the daemon's lifetime.

        Cancellation: what is queued is written first (shielded), so a graceful stop
        loses no event.
        """
        if self._store is None:
            raise RuntimeError("an EventBus without a store has no writer")
        self._retention_checked = time.time()
        self._seq, self._pruned_through = await self._store.write(
            _start, self._retention_checked - self._retention_s)
        self._written = self._seq
        self._running = True
        task_status.started()
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                await self._flush(self._store)
        finally:
            with trio.CancelScope(shield=True):
                await self._flush(self._store)

    async def _flush(self, store: Store) -> None:
        batch, self._queued = self._queued, []
        forgotten, self._forgotten = self._forgotten, []
        now = time.time()
        if not batch and not forgotten and not self._prune_due(now):
            return
        retention_before = None
        if now - self._retention_checked >= RETENTION_CHECK_S:
            retention_before = now - self._retention_s
        pruned_through = self._pruned_through
        keep, step = self._keep, self._prune_step
        numbered: list[int] = []

        def write(conn: apsw.Connection) -> tuple[int, int]:
            # In the store's thread, where seqs are given (`stage` gives them there too).
            first = self._written + 1
            last = first + len(batch) - 1
            prune_through = (last - keep) // step * step
            if prune_through <= pruned_through:
                prune_through = 0
            # A session's events up to the last one published before it was forgotten.
            _write(conn, [(first + n, ts, session_id, type, _encode(data))
                          for n, (_, ts, session_id, type, data) in enumerate(batch)],
                   prune_through, retention_before,
                   [(session_id, first - 1 + sum(queued[0] <= published for queued in batch))
                    for session_id, published in forgotten])
            numbered.append(first)
            self._written = last
            return first, prune_through

        try:
            first, prune_through = await store.write(
                write, on_rollback=lambda: self._unnumber(numbered[0] if numbered else 0))
        except CtxdError as exc:
            # Nobody has seen these events and none got a seq: the stream has no gap.
            self._lost += len(batch)
            log.error("could not write %d events, they are lost: %s", len(batch), exc)
            return
        if prune_through:
            self._pruned_through = prune_through
        if retention_before is not None:
            self._retention_checked = now
        for n, (published, ts, session_id, type, data) in enumerate(batch):
            self._unsent[first + n] = (Event(seq=first + n, ts=ts, session_id=session_id,
                                             type=type, data=data), published)
        self._send_written()

    def subscribe(self, session_id: str | None = None, types: Iterable[str] | None = None,
                  since_seq: int | None = None) -> Subscription:
        """A new subscription; with ``since_seq`` (and a store) it first replays the
        kept events after ``since_seq``, starting with a ``dropped`` event counting
        those no longer kept."""
        replay = (self._store is not None and since_seq is not None
                  and since_seq < self._seq)
        subscription = Subscription(self, f"sub_{next(self._ids)}", session_id, types,
                                    self._buffer, since_seq if replay else None)
        if since_seq is None:
            subscription.published_before = self._published
        self._subscriptions[subscription.subscription_id] = subscription
        return subscription

    async def replay_page(self, subscription: Subscription) -> None:
        """Read the next page of ``subscription``'s replay, or turn it live when it has
        caught up with the last written seq (in one step with that check: no event
        written meanwhile can fall between the two)."""
        after = subscription.replay_after
        if after is None or self._store is None:
            return
        upto = self._seq
        if after >= upto:
            subscription.replay_after = None
            return
        oldest, events = await self._store.read(
            _read_page, after, upto, subscription.session_id, subscription.types,
            REPLAY_PAGE)
        if oldest > after + 1:
            subscription.lose(min(oldest, upto + 1) - 1, min(oldest, upto + 1) - 1 - after)
        subscription.replay_after = events[-1].seq if len(events) == REPLAY_PAGE else upto
        subscription.replayed(events)

    def unsubscribe(self, subscription_id: str) -> bool:
        subscription = self._subscriptions.pop(subscription_id, None)
        if subscription is None:
            return False
        subscription.close()
        return True

    def statistics(self) -> BusStatistics:
        return BusStatistics(seq=self._seq, subscribers=len(self._subscriptions),
                             queued=len(self._queued), lost=self._lost)

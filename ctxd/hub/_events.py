"""The EventBus: fan-out of session events to subscribers, lossy per subscriber, never blocking.

Every event gets a ``seq`` that grows by one per event for the daemon's lifetime; the last
``history`` events are kept so a subscriber can resume with ``since_seq``. A subscriber
whose buffer is full loses events; as soon as it can take one again (its buffer drained,
or the next event arrives) it receives a ``dropped`` event that says how many it lost and
the seq of the last one lost, so a client always knows.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import msgspec
import trio

from ctxd.wire.types import Event


class BusStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What `EventBus.statistics` reports."""

    seq: int
    """The last event's seq."""
    subscribers: int
    history: int
    """Events kept for ``since_seq``."""


class Subscription:
    """One subscriber's bounded view of the bus. Iterate it with `receive`."""

    def __init__(self, subscription_id: str, session_id: str | None,
                 types: Iterable[str] | None, buffer: int):
        self.subscription_id = subscription_id
        self.session_id = session_id
        self.types = frozenset(types) if types else None
        self.dropped = 0
        self._dropped_through = 0
        self._max_buffer = buffer
        self._send, self._receive = trio.open_memory_channel[Event](buffer)

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
        """The next event (a ``dropped`` marker once the backlog is drained after losses).

        Raises:
            trio.EndOfChannel: the subscription was closed.
        """
        try:
            return self._receive.receive_nowait()
        except trio.WouldBlock:
            if self.dropped:
                await trio.lowlevel.checkpoint()
                return self._marker()
        return await self._receive.receive()

    def close(self) -> None:
        self._send.close()


class EventBus:
    """Publishes events to every matching subscription without ever waiting.

    Args:
        buffer: events queued per subscriber before it starts losing them.
        history: events kept for `since_seq` resumption.
    """

    def __init__(self, buffer: int = 1024, history: int = 10_000):
        self._buffer = buffer
        self._history: deque[Event] = deque(maxlen=history)
        self._subscriptions: dict[str, Subscription] = {}
        self._seq = 0
        self._ids = itertools.count(1)

    @property
    def seq(self) -> int:
        """The seq of the newest event (0 before the first)."""
        return self._seq

    def publish(self, session_id: str | None, type: str, data: dict[str, Any]) -> Event:
        """Stamp and fan out one event; never blocks."""
        self._seq += 1
        event = Event(seq=self._seq, ts=time.time(), session_id=session_id, type=type, data=data)
        self._history.append(event)
        for subscription in self._subscriptions.values():
            if subscription.wants(event):
                subscription.offer_nowait(event)
        return event

    def subscribe(self, session_id: str | None = None, types: Iterable[str] | None = None,
                  since_seq: int | None = None) -> Subscription:
        """A new subscription, primed with the kept events after ``since_seq``.

        When events after ``since_seq`` have already left the history, the subscription
        starts with a ``dropped`` event counting them.
        """
        subscription = Subscription(f"sub_{next(self._ids)}", session_id, types, self._buffer)
        if since_seq is not None and since_seq < self._seq:
            oldest = self._history[0].seq if self._history else self._seq + 1
            if oldest - since_seq - 1 > 0:
                subscription.lose(oldest - 1, oldest - since_seq - 1)
            for event in self._history:
                if event.seq > since_seq and subscription.wants(event):
                    subscription.offer_nowait(event)
        self._subscriptions[subscription.subscription_id] = subscription
        return subscription

    def unsubscribe(self, subscription_id: str) -> bool:
        subscription = self._subscriptions.pop(subscription_id, None)
        if subscription is None:
            return False
        subscription.close()
        return True

    def statistics(self) -> BusStatistics:
        return BusStatistics(seq=self._seq, subscribers=len(self._subscriptions),
                             history=len(self._history))

"""DeadlineTimer: one session's live-branch deadlines and the one timer task that waits for
the earliest, in its session actor's nursery."""

from __future__ import annotations

import heapq
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

RETRY_S = 1.0
"""How soon a forced return that could not be written is tried again."""


@dataclass(frozen=True)
class TimerStatistics:
    """What `DeadlineTimer.statistics` reports."""

    armed: int
    """Live branches whose deadline is waited for."""
    earliest: float | None
    """The earliest of their deadlines (trio's clock)."""
    heap_entries: int
    """Entries of the heap, those of branches that ended before their deadline included
    (they are dropped once they outnumber the armed ones)."""
    timer_running: bool


class DeadlineTimer:
    """The deadlines of one session's live branches, on trio's clock, in a heap; one timer
    task sleeps until the earliest (a cancel scope whose deadline moves as branches are
    armed and end).

    When the earliest deadline passes, the timer awaits ``on_deadline`` once, however many
    deadlines passed together: the session actor queues one forced return of every branch
    that is due, in order with the session's other requests. Should a branch that was due
    then still be armed afterwards (its forced return could not be written), the timer
    calls again after `RETRY_S`. The timer runs only while a deadline is armed: a session
    without live branches holds no task.

    Args:
        on_deadline: awaited by the timer when the earliest deadline has passed.
    """

    def __init__(self, on_deadline: Callable[[], Awaitable[None]]):
        self._on_deadline = on_deadline
        self._armed: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []
        """(deadline, branch) of the armed branches, and stale entries of ended ones (an
        entry is current while ``_armed`` holds the same deadline for its branch)."""
        self._nursery: trio.Nursery | None = None
        self._running = False
        self._scope: trio.CancelScope | None = None
        """The timer's sleep (None while it awaits ``on_deadline``, or runs not)."""
        self._not_before = -math.inf
        """After a call that left a due branch armed: the retry (trio's clock)."""

    def start(self, nursery: trio.Nursery) -> None:
        """Where the timer runs: the session actor's nursery (it ends with it)."""
        self._nursery = nursery

    def arm(self, branch_id: str, deadline: float) -> None:
        """Wait for the branch's ``deadline`` too (a branch armed already keeps its own)."""
        if branch_id in self._armed:
            return
        if self._nursery is None:
            raise RuntimeError("the session actor is not running")
        self._armed[branch_id] = deadline
        heapq.heappush(self._heap, (deadline, branch_id))
        if not self._running:
            self._running = True
            self._nursery.start_soon(self._run)
        else:
            self._moved()

    def disarm(self, branch_id: str) -> None:
        """The branch ended: stop waiting for its deadline. (A branch ends once a commit
        went through: a retry that waits after a failed one is due at once.)"""
        if self._armed.pop(branch_id, None) is None:
            return
        self._not_before = -math.inf
        if len(self._heap) > 2 * len(self._armed) + 64:
            # Branches that return before their deadline leave stale entries behind.
            self._heap = [(at, armed) for at, armed in self._heap
                          if self._armed.get(armed) == at]
            heapq.heapify(self._heap)
        self._moved()

    def statistics(self) -> TimerStatistics:
        return TimerStatistics(armed=len(self._armed), earliest=self._earliest(),
                               heap_entries=len(self._heap), timer_running=self._running)

    def _earliest(self) -> float | None:
        heap = self._heap
        while heap and self._armed.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def _moved(self) -> None:
        """The earliest deadline may have changed: the sleeping timer wakes at the new one
        (or at once, to end, when none is left)."""
        if self._scope is None:
            return
        earliest = self._earliest()
        if earliest is None:
            self._scope.cancel()
        else:
            self._scope.deadline = max(earliest, self._not_before)

    async def _run(self) -> None:
        """Sleep until the earliest deadline, call, repeat; return when none is armed.

        Cancellation: cancelled with its session's nursery (shutdown); the branches stay
        active in the store and are armed again on the next start.
        """
        try:
            while (earliest := self._earliest()) is not None:
                wake = max(earliest, self._not_before)
                if trio.current_time() < wake:
                    with trio.CancelScope(deadline=wake) as self._scope:
                        await trio.sleep_forever()
                    self._scope = None
                    continue  # at the deadline, or the deadlines changed: judged again
                called = trio.current_time()
                await self._on_deadline()
                earliest = self._earliest()
                self._not_before = (called + RETRY_S if earliest is not None
                                    and earliest <= called else -math.inf)
        finally:
            self._running = False
            self._scope = None

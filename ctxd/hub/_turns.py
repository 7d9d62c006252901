"""An agent's turns (turn.*) with their cancellation: the registry of turns, in memory
(docs/protocol.md, "Cancellation"); no table."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import msgspec
import trio

from ctxd.errors import CtxdError, ErrorCode, invalid_state, limit_reached
from ctxd.hub._events import EventBus
from ctxd.wire.types import Turn

MAX_TURNS = 10_000
"""Turns kept: beyond it, the oldest ended turn is forgotten (docs/decisions.md)."""
CANCEL_TIMEOUT_S = 10.0

log = logging.getLogger("ctxd.hub")


class Turns:
    """The turns agents registered, by session and turn id, in start order; a cancel the
    agent does not answer within ``cancel_timeout_s`` terminates its turn (`run`).

    Args:
        terminated: called with the session's and the turn's id when a turn is
            terminated; it stops the session's requests in flight (the daemon: its model
            calls through the gateway) and says how many.
    """

    def __init__(self, bus: EventBus, max_turns: int = MAX_TURNS,
                 cancel_timeout_s: float = CANCEL_TIMEOUT_S,
                 terminated: Callable[[str, str], int] | None = None):
        self._bus = bus
        self._max = max_turns
        self._turns: dict[tuple[str, str], Turn] = {}
        self._timeout = cancel_timeout_s
        self._terminated = terminated
        self._due: dict[tuple[str, str], float] = {}
        """Turns whose cancel waits for the agent's answer: when (trio's clock) it ends."""
        self._changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Terminate each turn whose cancel was not answered in time, until cancelled."""
        task_status.started()
        while True:
            self._changed = trio.Event()
            with trio.move_on_at(min(self._due.values(), default=math.inf)):
                await self._changed.wait()
            now = trio.current_time()
            for key in [key for key, due in self._due.items() if due <= now]:
                self._terminate(key)

    def _terminate(self, key: tuple[str, str]) -> None:
        del self._due[key]
        turn = self._turns[key]
        stopped = self._terminated(*key) if self._terminated is not None else 0
        turn = msgspec.structs.replace(turn, state="ended", ended_at=time.time(),
                                       terminated=True)
        self._turns[key] = turn
        log.warning("turn %r of session %r: no turn.end within %g s of its cancel; "
                    "terminated (%d model call(s) in flight stopped)", turn.turn_id,
                    turn.session_id, self._timeout, stopped)
        self._bus.publish(turn.session_id, "turn.ended", {
            "turn_id": turn.turn_id, "cancelled": None, "cancel_requested": True,
            "terminated": True, "calls_stopped": stopped})

    def start(self, session_id: str, turn_id: str) -> Turn:
        key = (session_id, turn_id)
        if key in self._turns:
            raise invalid_state(f"turn {turn_id!r} of session {session_id!r} was already "
                                "started", "start each turn with a new turn_id",
                                session_id=session_id, turn_id=turn_id,
                                state=self._turns[key].state)
        if len(self._turns) >= self._max:
            ended = next((k for k, turn in self._turns.items() if turn.state == "ended"), None)
            if ended is None:
                raise limit_reached("max_turns", self._max,
                                    f"{self._max} turns are running, the most kept",
                                    "end turns with turn.end")
            del self._turns[ended]
        turn = Turn(session_id=session_id, turn_id=turn_id, state="running",
                    started_at=time.time(), cancel_requested_at=None, cancel_reason=None,
                    ended_at=None, cancelled=None)
        self._turns[key] = turn
        self._bus.publish(session_id, "turn.started", {"turn_id": turn_id})
        return turn

    def get(self, session_id: str, turn_id: str) -> Turn:
        turn = self._turns.get((session_id, turn_id))
        if turn is None:
            raise CtxdError(ErrorCode.NOT_FOUND,
                            f"unknown turn {turn_id!r} of session {session_id!r}",
                            {"session_id": session_id, "turn_id": turn_id,
                             "fix": "start it with turn.start (turns are kept in memory: a "
                                    "daemon restart forgets them)"})
        return turn

    def cancel(self, session_id: str, turn_id: str, reason: str | None) -> Turn:
        """Ask the agent to stop the turn: `turn.cancel_requested` goes to the session's
        subscribers, once; the agent answers with turn.end."""
        turn = self.get(session_id, turn_id)
        if turn.state == "ended":
            raise _ended(turn)
        if turn.state == "cancel_requested":
            return turn
        turn = msgspec.structs.replace(turn, state="cancel_requested",
                                       cancel_requested_at=time.time(), cancel_reason=reason)
        self._turns[(session_id, turn_id)] = turn
        self._due[(session_id, turn_id)] = trio.current_time() + self._timeout
        self._changed.set()
        self._bus.publish(session_id, "turn.cancel_requested",
                          {"turn_id": turn_id, "reason": reason,
                           "timeout_s": self._timeout})
        return turn

    def end(self, session_id: str, turn_id: str, cancelled: bool) -> Turn:
        turn = self.get(session_id, turn_id)
        if turn.state == "ended":
            raise _ended(turn)
        turn = msgspec.structs.replace(turn, state="ended", ended_at=time.time(),
                                       cancelled=cancelled)
        self._turns[(session_id, turn_id)] = turn
        if self._due.pop((session_id, turn_id), None) is not None:
            self._changed.set()
        self._bus.publish(session_id, "turn.ended",
                          {"turn_id": turn_id, "cancelled": cancelled,
                           "cancel_requested": turn.cancel_requested_at is not None,
                           "terminated": False})
        return turn

    def list(self, session_id: str) -> list[Turn]:
        return [turn for (owner, _), turn in self._turns.items() if owner == session_id]


def _ended(turn: Turn) -> CtxdError:
    return invalid_state(f"turn {turn.turn_id!r} has ended", "start a new turn",
                         session_id=turn.session_id, turn_id=turn.turn_id, state=turn.state,
                         cancelled=turn.cancelled)

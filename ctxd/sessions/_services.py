"""Services: what every session actor uses, built once by the Supervisor; and the daemon's
session counts, which the actors change through it (docs/architecture.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from ctxd.config import Config
from ctxd.errors import limit_reached
from ctxd.folding import Registry
from ctxd.hub import EventBus
from ctxd.memory import Memory
from ctxd.sessions._compaction import Compactor
from ctxd.store import Store
from ctxd.tokens import TokenCounter


class SessionCounts:
    """The daemon's open and stored sessions, for ``max_open_sessions`` and daemon.status.

    Args:
        maximum: ``max_open_sessions``.
    """

    def __init__(self, maximum: int):
        self.maximum = maximum
        self.open = 0
        self.total = 0

    def loaded(self, open_count: int, total: int) -> None:
        """The counts in the store (once, at start-up)."""
        self.open, self.total = open_count, total

    @contextlib.contextmanager
    def open_slot(self) -> Iterator[None]:
        """Count one more open session for the block; given back if the block fails.

        Taken before the block's first await, so concurrent opens of different sessions
        cannot all pass the check.

        Raises:
            CtxdError: -32005 when it would pass ``max_open_sessions``.
        """
        if self.open >= self.maximum:
            raise limit_reached("max_open_sessions", self.maximum,
                                f"{self.open} sessions are open, the maximum "
                                f"(max_open_sessions = {self.maximum})",
                                "close or delete sessions you no longer use")
        self.open += 1
        try:
            yield
        except BaseException:
            self.open -= 1
            raise

    def created(self) -> None:
        """A new session was stored (its open slot was taken by `open_slot`)."""
        self.total += 1

    def closed(self) -> None:
        """An open session was closed."""
        self.open -= 1

    def deleted(self, was_open: bool) -> None:
        """A session was deleted (``was_open``: it had not been closed)."""
        if was_open:
            self.open -= 1
        self.total -= 1


@dataclass(frozen=True)
class Services:
    """The daemon's parts that a session actor and its operations use: built once by the
    Supervisor and shared by every actor, so that no actor reaches through the Supervisor."""

    store: Store
    counter: TokenCounter
    """The token counter shared by every actor."""
    bus: EventBus
    config: Config
    memory: Memory | None
    """Where new branches get their injected memories (None: no injection)."""
    compactor: Compactor
    """Plans compactions with the configured summarizer (docs/protocol.md, "Compaction")."""
    registry: Registry
    """Every live branch of the daemon, and the session that holds it."""
    sessions: SessionCounts

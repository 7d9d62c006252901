"""BranchActor: owns one live branch's deadline, in its session's nursery."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

RETRY_S = 1.0
"""How soon a forced return that could not be written is tried again."""


class BranchActor:
    """Waits, in a cancel scope whose deadline is the branch's timeout, for its branch to end.

    The session actor ends it (`end`) when the branch returns or is discarded. When the
    deadline comes first, the actor calls ``on_deadline`` (which queues the forced return on
    the session actor, in order with the session's other requests).

    Args:
        branch_id: the branch.
        trio_deadline: when it times out, on trio's clock (the branch's ``deadline`` is
            wall-clock time).
        on_deadline: called when the deadline passes before the branch ended (again every
            `RETRY_S` while the branch stays live).
    """

    def __init__(self, branch_id: str, trio_deadline: float,
                 on_deadline: Callable[[str], Awaitable[None]]):
        self.branch_id = branch_id
        self.trio_deadline = trio_deadline
        self._on_deadline = on_deadline
        self._ended = trio.Event()

    def end(self) -> None:
        """The branch returned or was discarded: stop waiting for its deadline."""
        self._ended.set()

    @property
    def ended(self) -> bool:
        """Whether `end` was called."""
        return self._ended.is_set()

    async def run(self) -> None:
        """Wait for the end or the deadline.

        Cancellation: cancelled with its session's nursery (shutdown); the branch stays
        active in the store and is re-armed on the next start.
        """
        with trio.move_on_at(self.trio_deadline):
            await self._ended.wait()
        while not self._ended.is_set():
            await self._on_deadline(self.branch_id)
            # Still live: the forced return could not be written. Try again shortly.
            with trio.move_on_after(RETRY_S):
                await self._ended.wait()

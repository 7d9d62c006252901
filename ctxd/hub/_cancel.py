"""The requests in flight that `request.cancel` may stop, by the JSON-RPC id they were sent
with (docs/protocol.md, "Cancellation"); no table."""

from __future__ import annotations

import contextlib

from ctxd.jobs import Request


class Requests:
    """Every cancellable request in flight on any connection, by id (one id may be in
    flight on several connections at once)."""

    def __init__(self) -> None:
        self._by_id: dict[str | int, list[Request]] = {}

    def add(self, request: Request) -> None:
        self._by_id.setdefault(request.request_id, []).append(request)

    def discard(self, request: Request) -> None:
        """It was answered: it can no longer be cancelled."""
        request.finished = True
        key = request.request_id
        same = self._by_id.get(key)
        if same is None:
            return
        with contextlib.suppress(ValueError):  # discarded before
            same.remove(request)  # by identity: a Request has no __eq__
        if not same:
            del self._by_id[key]

    def cancel(self, request_id: str | int, reason: str | None) -> tuple[int, int] | None:
        """Cancel every request in flight with this id.

        Returns:
            How many were cancelled (they answer -32006; one cancelled before counts
            again) and how many could not be (they passed their commit point, or wait
            where they cannot stop: they are answered as done); None when no request
            with this id is in flight.
        """
        same = self._by_id.get(request_id)
        if not same:
            return None
        # One cancelled already counts again: it still answers -32006.
        cancelled = sum(request.cancel(reason) or request.stopped for request in list(same))
        return cancelled, len(same) - cancelled


"""The team link: one task that keeps a ctxd and its team database in step (docs/decisions
.md, "Team memory"). It drains the outbox (each entry applied at most once, by its key),
then reads the database's changes after the last one mirrored, page by page, into the
local store and indexes; it waits for a notification, a local write to share, or the poll
interval, and starts again. With the database unreachable it says so in its status and
tries again: the outbox keeps what was recorded meanwhile. psycopg is blocking: its calls
run in worker threads, one at a time."""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING, Any

import trio

from ctxd.config import TeamConfig
from ctxd.team._postgres import (
    Delete,
    Listener,
    Operation,
    Record,
    Signal,
    apply,
    changes_since,
    connect,
    last_change,
    migrate,
)
from ctxd.wire.types import TeamLinkStatus

if TYPE_CHECKING:
    from ctxd.memory import Memory

log = logging.getLogger("ctxd.team")

PAGE = 1_000
"""Outbox entries sent, and changes read, in one transaction."""
WAIT_SLICE_S = 0.2
"""How long one wait for a notification blocks its thread before the link looks whether
a local write is waiting to be shared."""
RETRY_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
"""The pauses between attempts to reach an unreachable database."""
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")
_KEY_PASSWORD = re.compile(r"(password\s*=\s*)('[^']*'|\S+)", re.I)


def redacted(text: str) -> str:
    """An error or a database URL without its password (a log line, a status)."""
    return _KEY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))


class TeamLink:
    """The link of ``config``'s team, to the database at ``conninfo``."""

    def __init__(self, memory: Memory, config: TeamConfig, conninfo: str) -> None:
        self.memory = memory
        self.config = config
        self.conninfo = conninfo
        self.scopes = [f"team:{config.name}"]
        self.connected = False
        self.error: str | None = None
        self.remote_last = 0
        self.attempts = 0
        """Failed attempts to reach the database since it was last reached."""

    def status(self) -> TeamLinkStatus:
        """As of the link's last round (it refreshes the counts at each)."""
        memory = self.memory
        return TeamLinkStatus(name=self.config.name, connected=self.connected,
                              outbox_depth=memory.outbox_depth,
                              last_change=memory.last_change,
                              lag_changes=max(0, self.remote_last - memory.last_change)
                              if self.connected else None, error=self.error)

    async def run(self, *, task_status: trio.TaskStatus[TeamLink] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        import psycopg  # here: a daemon without a team never loads it (see _postgres)

        await self.memory.team_state()
        task_status.started(self)
        while True:
            try:
                await self._connected()
            except (psycopg.Error, OSError) as exc:
                self.connected = False
                self.error = redacted(str(exc).strip().splitlines()[0] if str(exc).strip()
                                      else type(exc).__name__)
                log.warning("team %s: the database is unreachable (%s); retrying",
                            self.config.name, self.error)
            await trio.sleep(RETRY_S[min(self.attempts, len(RETRY_S) - 1)])
            self.attempts += 1

    async def _connected(self) -> None:
        conn: Any = await trio.to_thread.run_sync(connect, self.conninfo)
        listener: Listener | None = None
        try:
            await trio.to_thread.run_sync(migrate, conn)
            listener = await trio.to_thread.run_sync(Listener.open, self.conninfo)
            self.connected, self.error, self.attempts = True, None, 0
            log.info("team %s: linked", self.config.name)
            while True:
                await self._drain(conn)
                await self._pull(conn)
                await self._wait(listener)
        finally:
            self.connected = False
            for closing in (conn, listener):
                if closing is not None:
                    await trio.to_thread.run_sync(closing.close)

    async def _drain(self, conn: Any) -> None:
        """Send the outbox, oldest first, a page a transaction. A signal or a deletion of a
        memory whose record is in the same page waits for the next page (the record's
        shared id is known once it is applied)."""
        while True:
            self.memory.shared_written = trio.Event()
            pending = await self.memory.outgoing(PAGE)
            if not pending:
                return
            operations, entries, dropped = [], [], []
            recorded_now = set()
            for entry in pending:
                waiting = entry.operation.get("kind") != "record" and entry.remote_id is None \
                    and entry.memory is not None and entry.memory.id in recorded_now
                if waiting:
                    break
                operation = _operation(entry)
                if operation is None:
                    dropped.append((entry.outbox_id, None, None))
                    continue
                if entry.operation.get("kind") == "record" and entry.memory is not None:
                    recorded_now.add(entry.memory.id)
                operations.append(operation)
                entries.append(entry)
            applied = await trio.to_thread.run_sync(apply, conn, operations) \
                if operations else []
            await self.memory.sent(dropped + [
                (entry.outbox_id, entry.memory.id if entry.memory else None, done.memory_id)
                for entry, done in zip(entries, applied, strict=True)])

    async def _pull(self, conn: Any) -> None:
        self.remote_last = await trio.to_thread.run_sync(last_change, conn)
        _, seq = await self.memory.team_state()
        while True:
            changes = await trio.to_thread.run_sync(changes_since, conn, seq, self.scopes,
                                                    PAGE)
            if not changes:
                return
            seq = changes[-1].seq
            await self.memory.mirror(changes, seq)

    async def _wait(self, listener: Listener) -> None:
        """Until a notification, a write to share (a record says so at once; a signal or a
        deletion in another transaction is found in the outbox at the next slice), or the
        poll interval."""
        deadline = time.monotonic() + self.config.poll_interval_s
        while time.monotonic() < deadline and not self.memory.shared_written.is_set():
            notified = await trio.to_thread.run_sync(listener.wait, WAIT_SLICE_S)
            depth, _ = await self.memory.team_state()
            if notified is not None or depth:
                return


def _operation(entry: Any) -> Operation | None:
    """The outbox entry as the database's operation; None when there is nothing to send
    (its memory was deleted before it left, or a signal's memory never reached the
    database)."""
    kind = entry.operation.get("kind")
    memory = entry.memory
    if kind == "record" and memory is not None:
        return Operation(entry.key, Record(
            scope=memory.scope, title=memory.title, description=memory.description,
            content=memory.content, outcome=memory.outcome, tags=list(memory.tags),
            alpha=entry.operation.get("alpha", 4.0), beta=entry.operation.get("beta", 1.0),
            recorded_by=entry.operation.get("recorded_by"), created_at=memory.created_at))
    if kind == "signal" and entry.remote_id is not None:
        return Operation(entry.key, Signal(entry.remote_id,
                                           alpha=entry.operation.get("alpha", 0.0),
                                           beta=entry.operation.get("beta", 0.0),
                                           uses=entry.operation.get("uses", 0)))
    if kind == "delete" and isinstance(entry.operation.get("remote_id"), int):
        return Operation(entry.key, Delete(entry.operation["remote_id"]))
    return None


__all__ = ["TeamLink", "redacted"]

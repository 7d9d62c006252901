"""The injection queue: the ``injections`` table, its SQL and its state changes
(docs/protocol.md, "Injection"). Every function runs in the store's thread; the session
actor calls them in order with the session's other requests."""

from __future__ import annotations

import heapq
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import apsw
import msgspec

from ctxd.store import scalar_int
from ctxd.wire.types import INJECT_PRIORITIES, InjectionInfo, InjectPriority, InjectState

_COLUMNS = ("injection_id, session_id, priority, content, source, tokens, state, "
            "created_at, deliveries, delivered_at, acked_at, reason")
_NAMES = [name.strip() for name in _COLUMNS.split(",")]
STATES: tuple[InjectState, ...] = ("pending", "delivered", "accepted", "rejected")


def new_injection_id() -> str:
    return "inj_" + secrets.token_hex(8)


def _info(row: Sequence[Any]) -> InjectionInfo:
    """An injection from a row of ``_COLUMNS``, by name."""
    fields = dict(zip(_NAMES, row, strict=True))
    return InjectionInfo(**fields | {"priority": INJECT_PRIORITIES[fields["priority"]]})


@dataclass(frozen=True)
class NewInjection:
    """What inject.push stores: the scrubbed content and its exact tokens."""

    session_id: str
    priority: InjectPriority
    content: str
    source: str | None
    idempotency_key: str | None
    tokens: int
    secrets_scrubbed: int
    created_at: float


def find_by_key(conn: apsw.Connection, session_id: str,
                key: str) -> tuple[InjectionInfo, int] | None:
    """The injection a push with this idempotency key made, with its secrets scrubbed."""
    for row in conn.execute(f"SELECT {_COLUMNS}, secrets_scrubbed FROM injections "
                            "WHERE session_id = ? AND idempotency_key = ?", (session_id, key)):
        return _info(row[:-1]), int(row[-1])
    return None


def insert_injection(conn: apsw.Connection, new: NewInjection) -> InjectionInfo:
    """Queue one injection (pending)."""
    injection_id = new_injection_id()
    conn.execute(
        "INSERT INTO injections (injection_id, session_id, priority, content, source, "
        "idempotency_key, tokens, secrets_scrubbed, state, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?)",
        (injection_id, new.session_id, INJECT_PRIORITIES.index(new.priority), new.content,
         new.source, new.idempotency_key, new.tokens, new.secrets_scrubbed, new.created_at))
    return InjectionInfo(injection_id=injection_id, session_id=new.session_id,
                         priority=new.priority, content=new.content, source=new.source,
                         tokens=new.tokens, state="pending", created_at=new.created_at,
                         deliveries=0, delivered_at=None, acked_at=None, reason=None)


def pull_injections(conn: apsw.Connection, session_id: str, max_priority: InjectPriority,
                    limit: int, now: float, redeliver_before: float
                    ) -> tuple[list[InjectionInfo], int]:
    """Hand out the pending injections, and those delivered before ``redeliver_before`` and
    still not acknowledged, most urgent first then oldest first; mark them delivered.

    Returns:
        The injections as delivered now, and how many of the session's are still waiting.
    """
    rank = INJECT_PRIORITIES.index(max_priority)
    pending = conn.execute(
        f"SELECT {_COLUMNS}, id FROM injections WHERE session_id = ? AND state = 'pending' "
        "AND priority <= ? ORDER BY priority, id LIMIT ?", (session_id, rank, limit))
    overdue = conn.execute(
        f"SELECT {_COLUMNS}, id FROM injections WHERE session_id = ? AND state = 'delivered' "
        "AND delivered_at <= ? AND priority <= ? ORDER BY priority, id LIMIT ?",
        (session_id, redeliver_before, rank, limit))
    # Both are in (priority, arrival) order: merged, the first ``limit`` of either.
    rows = [row[:-1] for row in heapq.merge(pending, overdue,
                                             key=lambda row: (row[2], row[-1]))][:limit]
    ids = [row[0] for row in rows]
    conn.executemany("UPDATE injections SET state = 'delivered', deliveries = deliveries + 1, "
                     "delivered_at = ? WHERE injection_id = ?", [(now, i) for i in ids])
    # The states are literals, so that each count reads its partial index.
    waiting = scalar_int(
        conn, "SELECT (SELECT count(*) FROM injections WHERE session_id = ?1 "
              "AND state = 'pending') + (SELECT count(*) FROM injections "
              "WHERE session_id = ?1 AND state = 'delivered')", (session_id,))
    return [msgspec.structs.replace(_info(row), state="delivered",
                                    deliveries=row[8] + 1, delivered_at=now)
            for row in rows], waiting


def load_injection(conn: apsw.Connection, injection_id: str) -> InjectionInfo | None:
    for row in conn.execute(f"SELECT {_COLUMNS} FROM injections WHERE injection_id = ?",
                            (injection_id,)):
        return _info(row)
    return None


def ack_injection(conn: apsw.Connection, injection_id: str, accepted: bool,
                  reason: str | None, now: float) -> InjectionInfo:
    """Record the agent's answer to a delivered injection."""
    conn.execute("UPDATE injections SET state = ?, acked_at = ?, reason = ? "
                 "WHERE injection_id = ? AND state = 'delivered'",
                 ("accepted" if accepted else "rejected", now, reason, injection_id))
    info = load_injection(conn, injection_id)
    assert info is not None
    return info


def list_injections(conn: apsw.Connection, session_id: str, state: InjectState | None,
                    limit: int) -> tuple[list[InjectionInfo], dict[str, int]]:
    """A session's injections, oldest first, and its counts by state."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM injections WHERE session_id = ?1 "
        "AND (?2 IS NULL OR state = ?2) ORDER BY id LIMIT ?3", (session_id, state, limit))
    injections = [_info(row) for row in rows]
    counts: dict[str, int] = dict.fromkeys(STATES, 0)
    counts.update(conn.execute(
        "SELECT state, count(*) FROM injections WHERE session_id = ? GROUP BY state",
        (session_id,)))
    return injections, counts


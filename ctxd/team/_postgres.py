"""The team database: PostgreSQL, the source of truth for shared scopes (``team:<name>``,
``org:<name>``). Its schema and migrations (versioned like the SQLite ones), and the
operations a ctxd applies to it, each in one transaction: record a memory (the same
scope and normalised content is one row), add signals (increments that commute), delete;
every operation carries an idempotency key, applied at most once however often an outbox
drain retries it. Each change takes the next value of one sequence, under a transaction
lock, so that the sequence's order is the commit order and a mirror that follows it by
"changes after N" never skips one; a commit notifies ``ctxd_team``.

Blocking (psycopg's connection): the daemon calls it in worker threads."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:  # imported by the first connection: a daemon without a team never
    # loads it (0.1 s of every start; docs/decisions.md, Team memory)
    import psycopg

CHANNEL = "ctxd_team"
"""What a commit notifies (its payload: the last change's sequence number)."""
COMMIT_LOCK = 0x63747864
"""The advisory lock every write holds to its commit ("ctxd"): one writer at a time, so
the change sequence is taken in commit order."""

Connection: TypeAlias = "psycopg.Connection[Any]"


def connect(conninfo: str, autocommit: bool = False) -> Connection:
    """A connection to the team database (psycopg imported here, by the first one)."""
    import psycopg

    return psycopg.connect(conninfo, autocommit=autocommit)


def _v1(conn: Connection) -> None:
    conn.execute("CREATE SEQUENCE ctxd_team_changes")
    conn.execute(
        "CREATE TABLE ctxd_team_memories ("
        " id bigserial PRIMARY KEY,"
        " scope text NOT NULL,"
        " content_key bytea NOT NULL,"
        " title text NOT NULL,"
        " description text NOT NULL,"
        " content text NOT NULL,"
        " outcome text NOT NULL,"
        " tags jsonb NOT NULL,"
        " alpha double precision NOT NULL,"
        " beta double precision NOT NULL,"
        " usage_count bigint NOT NULL DEFAULT 0,"
        " recorded_by jsonb,"
        " created_at double precision NOT NULL,"
        " updated_at double precision NOT NULL,"
        " deleted boolean NOT NULL DEFAULT false,"
        " change_seq bigint NOT NULL,"
        " UNIQUE (scope, content_key))")
    conn.execute("CREATE INDEX ctxd_team_memories_changes ON ctxd_team_memories (change_seq)")
    conn.execute("CREATE TABLE ctxd_team_applied (key text PRIMARY KEY,"
                 " memory_id bigint, applied_at double precision NOT NULL)")


MIGRATIONS: tuple[Callable[[Connection], None], ...] = (_v1,)
"""The schema, one function per version (``ctxd_team_schema.version`` is how many ran)."""


def migrate(conn: Connection) -> int:
    """Bring the database's schema up to date, in one transaction (two ctxds starting at
    once: the second waits for the first's, then finds nothing to do). Its version."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (COMMIT_LOCK,))
        conn.execute("CREATE TABLE IF NOT EXISTS ctxd_team_schema (version integer NOT NULL)")
        row = conn.execute("SELECT version FROM ctxd_team_schema").fetchone()
        version = 0 if row is None else int(row[0])
        if version > len(MIGRATIONS):
            raise RuntimeError(f"the team database's schema is version {version}, newer than "
                               f"this ctxd's ({len(MIGRATIONS)}): upgrade ctxd")
        for step in MIGRATIONS[version:]:
            step(conn)
        if row is None:
            conn.execute("INSERT INTO ctxd_team_schema VALUES (%s)", (len(MIGRATIONS),))
        else:
            conn.execute("UPDATE ctxd_team_schema SET version = %s", (len(MIGRATIONS),))
    return len(MIGRATIONS)


_BLANKS = re.compile(r"\s+")


def content_key(content: str) -> bytes:
    """What makes two memories of a scope the same one: their content, its blanks
    collapsed and its case folded."""
    return hashlib.sha256(_BLANKS.sub(" ", content).strip().casefold().encode()).digest()


@dataclass(frozen=True)
class Record:
    """A memory recorded in a shared scope."""

    scope: str
    title: str
    description: str
    content: str
    outcome: str
    tags: list[str]
    alpha: float
    beta: float
    recorded_by: dict[str, str] | None
    """``{machine, user}``, or None when the recorder opted out."""
    created_at: float


@dataclass(frozen=True)
class Signal:
    """Increments to a shared memory's counts: they commute, so concurrent uses on many
    machines add up."""

    memory_id: int
    alpha: float = 0.0
    beta: float = 0.0
    uses: int = 0


@dataclass(frozen=True)
class Delete:
    memory_id: int


@dataclass(frozen=True)
class Operation:
    """One write of a ctxd's outbox: its idempotency key (unique across ctxds) and what
    it does."""

    key: str
    change: Record | Signal | Delete


@dataclass(frozen=True)
class Applied:
    """What an operation did: the memory it touched (a record's row, new or the same
    content's), and whether it was applied now (False: an earlier drain did)."""

    memory_id: int | None
    now: bool


@dataclass(frozen=True)
class Change:
    """A shared memory as it is after a change, for the mirrors."""

    seq: int
    memory_id: int
    scope: str
    title: str
    description: str
    content: str
    outcome: str
    tags: list[str]
    alpha: float
    beta: float
    usage_count: int
    recorded_by: dict[str, str] | None
    created_at: float
    updated_at: float
    deleted: bool


def apply(conn: Connection, operations: Sequence[Operation]) -> list[Applied]:
    """Apply ``operations`` in one transaction, each at most once (its key), and notify
    the mirrors. Raises psycopg's errors as they come (the outbox keeps them, to retry)."""
    done: list[Applied] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (COMMIT_LOCK,))
        for operation in operations:
            done.append(_apply_one(conn, operation))
        if any(applied.now for applied in done):
            conn.execute("SELECT pg_notify(%s, currval('ctxd_team_changes')::text)",
                         (CHANNEL,))
    return done


def _apply_one(conn: Connection, operation: Operation) -> Applied:
    earlier = conn.execute(
        "INSERT INTO ctxd_team_applied (key, applied_at) VALUES (%s, %s) "
        "ON CONFLICT (key) DO NOTHING RETURNING key", (operation.key, time.time())).fetchone()
    change = operation.change
    if earlier is None:  # applied by an earlier drain: what it touched
        row = conn.execute("SELECT memory_id FROM ctxd_team_applied WHERE key = %s",
                           (operation.key,)).fetchone()
        return Applied(None if row is None else row[0], now=False)
    now = time.time()
    if isinstance(change, Record):
        row = conn.execute(
            "INSERT INTO ctxd_team_memories (scope, content_key, title, description, "
            "content, outcome, tags, alpha, beta, recorded_by, created_at, updated_at, "
            "change_seq) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
            "nextval('ctxd_team_changes')) ON CONFLICT (scope, content_key) DO NOTHING "
            "RETURNING id",
            (change.scope, content_key(change.content), change.title, change.description,
             change.content, change.outcome, json.dumps(change.tags), change.alpha,
             change.beta, None if change.recorded_by is None else json.dumps(
                 change.recorded_by), change.created_at, now)).fetchone()
        if row is None:  # the same content in the scope: that row
            row = conn.execute(
                "SELECT id FROM ctxd_team_memories WHERE scope = %s AND content_key = %s",
                (change.scope, content_key(change.content))).fetchone()
        memory_id = int(row[0]) if row is not None else None
    elif isinstance(change, Signal):
        row = conn.execute(
            "UPDATE ctxd_team_memories SET alpha = alpha + %s, beta = beta + %s, "
            "usage_count = usage_count + %s, updated_at = %s, "
            "change_seq = nextval('ctxd_team_changes') WHERE id = %s AND NOT deleted "
            "RETURNING id", (change.alpha, change.beta, change.uses, now,
                             change.memory_id)).fetchone()
        memory_id = None if row is None else int(row[0])
    else:
        row = conn.execute(
            "UPDATE ctxd_team_memories SET deleted = true, updated_at = %s, "
            "change_seq = nextval('ctxd_team_changes') WHERE id = %s AND NOT deleted "
            "RETURNING id", (now, change.memory_id)).fetchone()
        memory_id = None if row is None else int(row[0])
    conn.execute("UPDATE ctxd_team_applied SET memory_id = %s WHERE key = %s",
                 (memory_id, operation.key))
    return Applied(memory_id, now=True)


def changes_since(conn: Connection, seq: int, scopes: Sequence[str],
                  limit: int = 1_000) -> list[Change]:
    """The shared memories of ``scopes`` changed after change ``seq``, in change order, at
    most ``limit`` (a mirror catches up page by page, from 0 on a new machine)."""
    rows = conn.execute(
        "SELECT change_seq, id, scope, title, description, content, outcome, tags, alpha, "
        "beta, usage_count, recorded_by, created_at, updated_at, deleted "
        "FROM ctxd_team_memories WHERE change_seq > %s AND scope = ANY(%s) "
        "ORDER BY change_seq LIMIT %s", (seq, list(scopes), limit)).fetchall()
    conn.commit()  # no transaction left open between polls
    return [Change(int(r[0]), int(r[1]), r[2], r[3], r[4], r[5], r[6], list(r[7]),
                   float(r[8]), float(r[9]), int(r[10]), r[11], float(r[12]), float(r[13]),
                   bool(r[14])) for r in rows]


def last_change(conn: Connection) -> int:
    """The latest change's sequence number (0: none), for a mirror's lag."""
    row = conn.execute("SELECT coalesce(max(change_seq), 0) FROM ctxd_team_memories"
                       ).fetchone()
    conn.commit()
    return int(row[0]) if row is not None else 0


@dataclass
class Listener:
    """A connection that listens on `CHANNEL`: `wait` returns when a commit notified, or
    after ``timeout`` seconds (the mirror then polls anyway)."""

    conn: Connection
    seen: list[int] = field(default_factory=list)

    @classmethod
    def open(cls, conninfo: str) -> Listener:
        conn = connect(conninfo, autocommit=True)
        conn.execute(f"LISTEN {CHANNEL}")
        return cls(conn)

    def wait(self, timeout: float) -> int | None:
        """The highest sequence number notified within ``timeout``, or None."""
        latest: int | None = None
        for notify in self.conn.notifies(timeout=timeout, stop_after=1):
            if notify.payload.isdigit():
                latest = max(latest or 0, int(notify.payload))
        return latest

    def close(self) -> None:
        self.conn.close()


__all__ = ["CHANNEL", "Applied", "Change", "Delete", "Listener", "Operation", "Record",
           "Signal", "apply", "changes_since", "content_key", "last_change", "migrate"]

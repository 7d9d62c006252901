"""Memories of shared scopes, the local side (docs/decisions.md, "Team memory"): the
outbox of writes the team database has not applied yet, committed with the local write
they stand for, and the mirror of the database's memories (``team_mirror``: which local
memory is which shared one; ``team_link``: the last change read). The team link
(``ctxd.team``) drains the one and feeds the other through the memory service."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import apsw

from ctxd.memory._lexical import LexicalIndex
from ctxd.memory._queries import (
    NewMemory,
    _bump_generation,
    confidence,
    get,
    insert,
    stage_outbox,
)
from ctxd.wire.types import SHARED_SCOPES, MemoryItem


def is_shared(scope: str) -> bool:
    return scope.startswith(SHARED_SCOPES)


def stage_record(conn: apsw.Connection, memory_id: int, recorded_by: dict[str, str] | None,
                 now: float) -> None:
    """The outbox entry of a memory recorded in a shared scope, in the caller's
    transaction (the record's own)."""
    stage_outbox(conn, {"kind": "record", "recorded_by": recorded_by}, memory_id, now)


def share(conn: apsw.Connection, lexical: LexicalIndex, memory_id: int, scope: str,
          recorded_by: dict[str, str] | None, now: float) -> MemoryItem | None:
    """A memory of this store moved to a shared scope, and its record in the outbox (one
    transaction); None when it is unknown. A memory already shared is refused by the
    caller (`memory.share`)."""
    lexical.removing(conn, memory_id)
    conn.execute("UPDATE memories SET scope = ?, updated_at = ? WHERE id = ?",
                 (scope, now, memory_id))
    if conn.changes() == 0:
        return None
    lexical.added(conn, memory_id)
    stage_record(conn, memory_id, recorded_by, now)
    return get(conn, memory_id)


@dataclass(frozen=True)
class Outgoing:
    """An outbox entry with what it sends: a record's memory as it is now."""

    outbox_id: int
    key: str
    """Unique across ctxds: this store's id and the entry's."""
    operation: dict[str, Any]
    memory: MemoryItem | None
    """None: the memory was deleted before it was sent (nothing to send)."""
    remote_id: int | None
    """The shared memory it is in the team database, once known."""


def outgoing(conn: apsw.Connection, limit: int) -> list[Outgoing]:
    """The oldest outbox entries, at most ``limit``."""
    [(store_id,)] = conn.execute("SELECT store_id FROM team_link").fetchall()
    rows: list[Any] = conn.execute(
        "SELECT o.id, o.operation, o.memory_id, m.remote_id FROM team_outbox o "
        "LEFT JOIN team_mirror m ON m.memory_id = o.memory_id ORDER BY o.id LIMIT ?",
        (limit,)).fetchall()
    return [Outgoing(outbox_id, f"{store_id}:{outbox_id}", json.loads(operation),
                     None if memory_id is None else get(conn, memory_id), remote_id)
            for outbox_id, operation, memory_id, remote_id in rows]


def sent(conn: apsw.Connection, lexical: LexicalIndex,
         done: list[tuple[int, int | None, int | None]]) -> list[tuple[int, int]]:
    """Entries the team database applied: (outbox id, local memory, shared memory) each,
    out of the outbox, the local memory mapped to the shared one. A local memory the
    database found to be one it had already (the same content, recorded by a teammate and
    mirrored here) is deleted: the mirrored copy stands for both. Those deleted, with the
    index generation of each deletion."""
    duplicates: list[tuple[int, int]] = []
    for outbox_id, memory_id, remote_id in done:
        conn.execute("DELETE FROM team_outbox WHERE id = ?", (outbox_id,))
        if memory_id is None or remote_id is None:
            continue
        mapped: list[Any] = conn.execute(
            "SELECT memory_id FROM team_mirror WHERE remote_id = ?", (remote_id,)).fetchall()
        if not mapped:
            conn.execute("INSERT OR IGNORE INTO team_mirror (memory_id, remote_id) "
                         "VALUES (?, ?)", (memory_id, remote_id))
        elif int(mapped[0][0]) != memory_id:
            lexical.removing(conn, memory_id)
            conn.execute("DELETE FROM memories WHERE id = ?", (memory_id,))
            if conn.changes():
                duplicates.append((memory_id, _bump_generation(conn)))
    return duplicates


def outbox_depth(conn: apsw.Connection) -> int:
    rows: list[Any] = conn.execute("SELECT count(*) FROM team_outbox").fetchall()
    return int(rows[0][0])


def last_change(conn: apsw.Connection) -> int:
    rows: list[Any] = conn.execute("SELECT last_change FROM team_link").fetchall()
    return int(rows[0][0])


@dataclass(frozen=True)
class Mirrored:
    """What a page of changes did locally: memories to index (id, generation) and to
    take out of the index."""

    added: list[tuple[MemoryItem, int]]
    removed: list[tuple[int, int]]


def mirror(conn: apsw.Connection, lexical: LexicalIndex, changes: list[Any], seq: int
           ) -> Mirrored:
    """Apply a page of the team database's changes (``ctxd.team.Change``) to the local
    store in one transaction, up to change ``seq``: a new shared memory is inserted and
    mapped, a known one takes the database's counts, a deleted one goes."""
    added: list[tuple[MemoryItem, int]] = []
    removed: list[tuple[int, int]] = []
    now = time.time()
    for change in changes:
        rows: list[Any] = conn.execute("SELECT memory_id FROM team_mirror WHERE remote_id = ?",
                                       (change.memory_id,)).fetchall()
        local = int(rows[0][0]) if rows else None
        if change.deleted:
            if local is not None:
                lexical.removing(conn, local)
                conn.execute("DELETE FROM memories WHERE id = ?", (local,))
                removed.append((local, _bump_generation(conn)))
            continue
        if local is not None:
            conn.execute("UPDATE memories SET alpha = ?, beta = ?, usage_count = ?, "
                         "updated_at = ? WHERE id = ?", (change.alpha, change.beta,
                                                         change.usage_count, now, local))
            lexical.rated(local, confidence(change.alpha, change.beta))
            continue
        by = change.recorded_by
        source = f"{by.get('user', '?')}@{by.get('machine', '?')}" if by else None
        item, generation = insert(conn, lexical, NewMemory(
            scope=change.scope, title=change.title, description=change.description,
            content=change.content, outcome=change.outcome, tags=" ".join(change.tags),
            prior=(change.alpha, change.beta), source=source, created_at=change.created_at))
        conn.execute("INSERT INTO team_mirror (memory_id, remote_id) VALUES (?, ?)",
                     (item.id, change.memory_id))
        added.append((item, generation))
    conn.execute("UPDATE team_link SET last_change = ?", (seq,))
    return Mirrored(added, removed)


__all__ = [
    "Mirrored",
    "Outgoing",
    "is_shared",
    "last_change",
    "mirror",
    "outbox_depth",
    "outgoing",
    "sent",
    "share",
    "stage_record",
]

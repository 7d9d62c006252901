"""Recovery: what SQLite can still read of a corrupt database, copied row by row into a new
one, the corrupt file kept aside (``ctxd --recover``; docs/security.md, Corruption and
recovery).

SQLite's own ``.recover`` (the sqlite3_recover extension) is neither in apsw nor in the
library it bundles, so this reads each of ctxd's tables in rowid order and steps over the
ranges that cannot be read: a row that SQLite cannot read is lost, every other one is kept.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import apsw
import msgspec

from ctxd.store._store import DatabaseError, integrity_problems, migrate, schema_version
from ctxd.store.migrations import load_all

log = logging.getLogger("ctxd.store")
BATCH = 256
MAX_ROWID = (1 << 63) - 1
_UNREADABLE = (apsw.CorruptError, apsw.NotADBError, apsw.IOError, apsw.SQLError)


class Recovery(msgspec.Struct, frozen=True, kw_only=True):
    """What `recover` did."""

    aside: str
    """Where the corrupt file is now."""
    rows: dict[str, int]
    """Table → rows copied into the new database."""
    unreadable: dict[str, int]
    """Table → ranges of rows that could not be read (or the whole table: -1)."""
    orphans: int
    """Rows dropped because what they belonged to was lost (a message whose session was)."""


def recover(path: Path) -> Recovery:
    """Salvage the database at ``path`` into a new file at the same path; blocking. The
    caller holds the data directory's lock (no daemon runs on it).

    The corrupt file and its WAL are renamed ``<name>.corrupt-<UTC time>`` first; the new
    database is written beside them and renamed into place only once complete, so an
    interrupted recovery leaves the corrupt file aside and no database (run it again on the
    aside file by moving it back).

    Raises:
        DatabaseError: there is no database at ``path``, or the new one cannot be written.
    """
    if not path.exists():
        raise DatabaseError(f"there is no database at {path} to recover", corrupt=False)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        if os.path.lexists(str(path) + suffix):
            os.rename(str(path) + suffix, str(aside) + suffix)
    fresh = path.with_name(path.name + ".recovering")
    for suffix in ("", "-journal"):
        if os.path.lexists(str(fresh) + suffix):
            os.unlink(str(fresh) + suffix)
    old = apsw.Connection(str(aside), flags=apsw.SQLITE_OPEN_READONLY)
    new = apsw.Connection(str(fresh))
    try:
        try:
            version = schema_version(old)
        except _UNREADABLE as exc:
            version = len(load_all())
            log.warning("recover: the schema version is unreadable (%s); assuming %d",
                        exc, version)
        migrate(new, target=version)
        rows: dict[str, int] = {}
        unreadable: dict[str, int] = {}
        with new:
            for table in _tables(new):
                rows[table], unreadable[table] = _copy_table(old, new, table)
            _copy_sequences(old, new)
            orphans = _drop_orphans(new)
            if "memory_index_state" in rows:
                # The memory index file no longer matches: make it rebuild.
                new.execute("INSERT OR IGNORE INTO memory_index_state (singleton, generation) "
                            "VALUES (1, 0)")
                new.execute("UPDATE memory_index_state SET generation = generation + 1")
        migrate(new)
    finally:
        old.close()
        new.close()
    problems = integrity_problems(fresh)
    if problems:
        raise DatabaseError(f"the recovered database {fresh} is not sound either "
                            f"({problems[0]}); the corrupt one is at {aside}", corrupt=True)
    os.chmod(fresh, 0o600)
    os.rename(fresh, path)
    return Recovery(aside=str(aside), rows=rows,
                    unreadable={table: n for table, n in unreadable.items() if n},
                    orphans=orphans)


def _tables(conn: apsw.Connection) -> list[str]:
    """ctxd's own tables, not SQLite's nor an FTS index's (the triggers refill those)."""
    schema = conn.execute("SELECT name, sql FROM sqlite_schema WHERE type = 'table' "
                          "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY rootpage"
                          ).fetchall()
    virtual = [str(name) for name, sql in schema if str(sql).upper().startswith("CREATE VIRTUAL")]
    return [str(name) for name, _ in schema if name not in virtual
            and not any(str(name).startswith(v + "_") for v in virtual)]


def _copy_sequences(old: apsw.Connection, new: apsw.Connection) -> None:
    """The highest id ever given by each ``AUTOINCREMENT`` table (a deleted memory's id is
    never given again, even after a recovery), where the old file still reads it."""
    try:
        sequences = old.execute("SELECT name, seq FROM sqlite_sequence").fetchall()
        autoincrement = {str(row[0]) for row in new.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND sql LIKE '%AUTOINCREMENT%'")}
    except _UNREADABLE:  # unreadable, or no such table (SQLError): none to keep
        return
    for name, seq in sequences:
        if name not in autoincrement:
            continue
        if new.execute("SELECT 1 FROM sqlite_sequence WHERE name = ?", (name,)).fetchall():
            new.execute("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?",
                        (seq, name))
        else:
            new.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (name, seq))


def _columns(conn: apsw.Connection, table: str) -> list[str]:
    return [str(row[1]) for row in conn.execute(f'PRAGMA table_info("{table}")')]


def _copy_table(old: apsw.Connection, new: apsw.Connection, table: str) -> tuple[int, int]:
    """(rows copied, unreadable ranges stepped over; -1 when the table is unreadable)."""
    try:
        present = set(_columns(old, table))
    except _UNREADABLE:
        return 0, -1
    columns = [name for name in _columns(new, table) if name in present]
    if not columns:
        return 0, -1
    listed = ", ".join(f'"{name}"' for name in columns)
    select = f'SELECT rowid, {listed} FROM "{table}" WHERE rowid > ? ORDER BY rowid LIMIT {BATCH:d}'
    insert = (f'INSERT OR REPLACE INTO "{table}" ({listed}) '
              f'VALUES ({", ".join("?" * len(columns))})')
    copied = gaps = 0
    after = -MAX_ROWID - 1
    while True:
        got_any = False
        try:
            for row in _rows(old, select, after):
                got_any = True
                after = int(row[0])  # type: ignore[call-overload]
                try:
                    new.execute(insert, row[1:])
                    copied += 1
                except apsw.ConstraintError:
                    pass  # a damaged value that breaks the schema: the row is lost
            if not got_any:
                return copied, gaps
        except _UNREADABLE:
            gaps += 1
            resumed = _next_readable(old, select, after)
            if resumed is None:
                return copied, gaps
            after = resumed


def _rows(conn: apsw.Connection, select: str, after: int) -> Iterator[tuple[object, ...]]:
    yield from conn.execute(select, (after,))


def _readable_from(conn: apsw.Connection, select: str, after: int) -> bool:
    """Whether the first row past ``after`` reads whole (so reading from there progresses)."""
    try:
        next(_rows(conn, select, after), None)
    except _UNREADABLE:
        return False
    return True


def _next_readable(conn: apsw.Connection, select: str, after: int) -> int | None:
    """The smallest ``r`` past ``after`` from which the table reads again, found by
    doubling the step and then halving back (a corrupt page hides a range of rowids);
    None when nothing past ``after`` reads."""
    step = 1
    while not _readable_from(conn, select, after + step):
        if after + step >= MAX_ROWID:
            return None
        step = min(step * 2, MAX_ROWID - after)
    low, high = after, after + step  # unreadable from low, readable from high
    while high - low > 1:
        middle = (low + high) // 2
        if _readable_from(conn, select, middle):
            high = middle
        else:
            low = middle
    return high


def _drop_orphans(conn: apsw.Connection) -> int:
    """Delete the rows whose parent row was lost, until none are left (a lost branch's
    messages, then theirs)."""
    dropped = 0
    while True:
        orphans = conn.execute("PRAGMA foreign_key_check").fetchall()
        if not orphans:
            return dropped
        for table, rowid, _parent, _key in orphans:
            conn.execute(f'DELETE FROM "{table}" WHERE rowid = ?', (rowid,))
            dropped += 1

"""SQL of the ``sessions`` and ``messages`` tables; every function runs in the store thread."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apsw

from ctxd.sessions._state import SessionRecord
from ctxd.store import scalar_int
from ctxd.wire.types import COMPONENTS, Budget

_SESSION_COLUMNS = (
    "id, project, title, state, context_window, max_output_tokens, compact_trigger, "
    "hard_block, warn, caution, message_count, tokens_system_prompt, tokens_skill_prompts, "
    "tokens_tool_descriptions, tokens_conversation, created_at, updated_at, closed_at, last_seq, "
    "folded_tokens")

MessageRow = tuple[str, int, str, bytes, str | None, str | None, str, bytes | None, int, float,
                   str | None]
"""session_id, seq, role, content, name, tool_call_id, component, meta, tokens, created_at,
branch_id (None: the main thread)."""


def scalar_rowid(value: object) -> int:
    assert isinstance(value, int)
    return value


def _record(row: Sequence[Any]) -> SessionRecord:
    budget = Budget(context_window=row[4], max_output_tokens=row[5], compact_trigger=row[6],
                    hard_block=row[7], warn=row[8], caution=row[9])
    return SessionRecord(
        session_id=row[0], project=row[1], title=row[2], state=row[3], budget=budget,
        message_count=row[10], component_tokens=dict(zip(COMPONENTS, row[11:15], strict=True)),
        created_at=row[15], updated_at=row[16], closed_at=row[17], last_seq=row[18],
        folded_tokens=row[19])


def load_session(conn: apsw.Connection, session_id: str) -> SessionRecord | None:
    rows = conn.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?",
                        (session_id,)).fetchall()
    return _record(rows[0]) if rows else None


_UPDATED_COLUMNS = ", ".join(f"{column} = excluded.{column}"
                            for column in _SESSION_COLUMNS.split(", ")[1:])


def save_session(conn: apsw.Connection, record: SessionRecord) -> None:
    """Insert the session row, or update it in place (counters included).

    Never ``INSERT OR REPLACE``: SQLite replaces by deleting the row, and the delete
    would cascade to every message of the session (and give the row a new rowid).
    """
    b = record.budget
    conn.execute(
        f"INSERT INTO sessions ({_SESSION_COLUMNS}) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
        f"ON CONFLICT (id) DO UPDATE SET {_UPDATED_COLUMNS}",
        (record.session_id, record.project, record.title, record.state, b.context_window,
         b.max_output_tokens, b.compact_trigger, b.hard_block, b.warn, b.caution,
         record.message_count, *(record.component_tokens[c] for c in COMPONENTS),
         record.created_at, record.updated_at, record.closed_at, record.last_seq,
         record.folded_tokens))


def insert_messages(conn: apsw.Connection, rows: Sequence[MessageRow]) -> None:
    """Insert messages (of any thread); the caller's transaction."""
    conn.executemany(
        "INSERT INTO messages (session_id, seq, role, content, name, tool_call_id, component, "
        "meta, tokens, created_at, branch_id) VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)


def save_counters(conn: apsw.Connection, record: SessionRecord) -> None:
    """Write the session's counters (main thread, seq, folded tokens); the caller's
    transaction."""
    conn.execute(
        "UPDATE sessions SET message_count = ?, tokens_system_prompt = ?, "
        "tokens_skill_prompts = ?, tokens_tool_descriptions = ?, tokens_conversation = ?, "
        "last_seq = ?, folded_tokens = ?, updated_at = ? WHERE id = ?",
        (record.message_count, *(record.component_tokens[c] for c in COMPONENTS),
         record.last_seq, record.folded_tokens, record.updated_at, record.session_id))


def append_messages(conn: apsw.Connection, record: SessionRecord,
                    rows: Sequence[MessageRow]) -> None:
    """Insert messages and update the session's counters; the caller's transaction."""
    insert_messages(conn, rows)
    save_counters(conn, record)


_MESSAGE_COLUMNS = ("seq, role, content, name, tool_call_id, component, meta, tokens, "
                    "created_at, branch_id, discarded")


def list_messages(conn: apsw.Connection, session_id: str, branch_id: str | None,
                  after_seq: int, limit: int) -> list[tuple[Any, ...]]:
    """A page of the archive: every message of the session, or of one branch."""
    if branch_id is None:
        return conn.execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ? AND seq > ? "
            "ORDER BY seq LIMIT ?", (session_id, after_seq, limit)).fetchall()
    return conn.execute(
        f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE branch_id = ? AND seq > ? "
        "ORDER BY seq LIMIT ?", (branch_id, after_seq, limit)).fetchall()


def thread_messages(conn: apsw.Connection, session_id: str, branch_id: str | None,
                    through_seq: int) -> list[tuple[Any, ...]]:
    """Role, content, name, tool_call_id, tokens of one thread's kept messages up to a seq,
    in order (for render). ``branch_id`` None is the main thread."""
    return conn.execute(
        "SELECT role, content, name, tool_call_id, tokens FROM messages "
        "WHERE session_id = ? AND branch_id IS ? AND discarded = 0 AND seq <= ? ORDER BY seq",
        (session_id, branch_id, through_seq)).fetchall()


def delete_session(conn: apsw.Connection, session_id: str) -> int:
    """Delete a session and (by cascade) its messages; returns the messages deleted."""
    count = scalar_int(conn, "SELECT count(*) FROM messages WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
    return count


def list_sessions(conn: apsw.Connection, project: str | None, state: str | None,
                  after_rowid: int, limit: int) -> list[tuple[int, SessionRecord, int]]:
    """Sessions in creation order after a rowid cursor, filtered, each with its number of
    active branches."""
    rows = conn.execute(
        f"SELECT rowid, {_SESSION_COLUMNS}, (SELECT count(*) FROM branches b "
        "WHERE b.session_id = sessions.id AND b.status = 'active') FROM sessions "
        "WHERE rowid > ? AND (? IS NULL OR project = ?) AND (? IS NULL OR state = ?) "
        "ORDER BY rowid LIMIT ?",
        (after_rowid, project, project, state, state, limit)).fetchall()
    return [(scalar_rowid(row[0]), _record(row[1:-1]), scalar_rowid(row[-1])) for row in rows]


def count_sessions(conn: apsw.Connection) -> tuple[int, int]:
    """(open sessions, all sessions)."""
    open_count = scalar_int(conn, "SELECT count(*) FROM sessions WHERE state = 'open'")
    return open_count, scalar_int(conn, "SELECT count(*) FROM sessions")


def expired_sessions(conn: apsw.Connection, closed_before: float) -> list[str]:
    return [row[0] for row in conn.execute(
        "SELECT id FROM sessions WHERE state = 'closed' AND closed_at < ?", (closed_before,))]

"""SQL of the ``sessions`` and ``messages`` tables; every function runs in the store thread."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apsw
import msgspec

from ctxd.folding import MessagesDiscarded, chunks, live_branch_counts, thread_chain
from ctxd.sessions._state import SessionRecord
from ctxd.store import scalar_int
from ctxd.wire.types import COMPONENTS, Budget, Component, Content, RenderedMessage, StoredMessage

_SESSION_COLUMNS = (
    "id", "project", "title", "state", *Budget.__struct_fields__, "message_count",
    *(f"tokens_{component}" for component in COMPONENTS), "created_at", "updated_at",
    "closed_at", "last_seq", "folded_tokens", "compactions", "compact_failures", "compacted_at")
_encode = msgspec.json.Encoder().encode
_decode_content = msgspec.json.Decoder(Content).decode
decode_meta = msgspec.json.Decoder(dict[str, Any]).decode


def _text(value: object) -> bytes | str:
    assert isinstance(value, bytes | str)
    return value


def scalar_rowid(value: object) -> int:
    assert isinstance(value, int)
    return value


def _record(row: Sequence[Any]) -> SessionRecord:
    """A row of the `_SESSION_COLUMNS`, read by name."""
    values = dict(zip(_SESSION_COLUMNS, row, strict=True))
    return SessionRecord(
        session_id=values["id"], project=values["project"], title=values["title"],
        state=values["state"],
        budget=Budget(**{name: values[name] for name in Budget.__struct_fields__}),
        message_count=values["message_count"],
        component_tokens={c: values[f"tokens_{c}"] for c in COMPONENTS},
        created_at=values["created_at"], updated_at=values["updated_at"],
        closed_at=values["closed_at"], last_seq=values["last_seq"],
        folded_tokens=values["folded_tokens"], compactions=values["compactions"],
        compact_failures=values["compact_failures"], compacted_at=values["compacted_at"])


def load_session(conn: apsw.Connection, session_id: str) -> SessionRecord | None:
    rows = conn.execute(f"SELECT {', '.join(_SESSION_COLUMNS)} FROM sessions WHERE id = ?",
                        (session_id,)).fetchall()
    return _record(rows[0]) if rows else None


_UPDATED_COLUMNS = ", ".join(f"{column} = excluded.{column}" for column in _SESSION_COLUMNS[1:])


def save_session(conn: apsw.Connection, record: SessionRecord) -> None:
    """Insert the session row, or update it in place (counters included).

    Never ``INSERT OR REPLACE``: SQLite replaces by deleting the row, and the delete
    would cascade to every message of the session (and give the row a new rowid).
    """
    b = record.budget
    conn.execute(
        f"INSERT INTO sessions ({', '.join(_SESSION_COLUMNS)}) "
        f"VALUES ({', '.join('?' * len(_SESSION_COLUMNS))}) "
        f"ON CONFLICT (id) DO UPDATE SET {_UPDATED_COLUMNS}",
        (record.session_id, record.project, record.title, record.state,
         *(getattr(b, name) for name in Budget.__struct_fields__), record.message_count,
         *(record.component_tokens[c] for c in COMPONENTS),
         record.created_at, record.updated_at, record.closed_at, record.last_seq,
         record.folded_tokens, record.compactions, record.compact_failures,
         record.compacted_at))


_MESSAGE_COLUMNS = ("seq", "role", "content", "name", "tool_call_id", "component", "meta",
                    "tokens", "created_at", "branch_id", "discarded", "compaction",
                    "replaced_by", "at_seq")


def insert_messages(conn: apsw.Connection, session_id: str,
                    messages: Sequence[StoredMessage]) -> None:
    """Insert messages (of any thread of the session); the caller's transaction."""
    conn.executemany(
        f"INSERT INTO messages (session_id, {', '.join(_MESSAGE_COLUMNS)}) "
        f"VALUES (?, {', '.join('?' * len(_MESSAGE_COLUMNS))})",
        [(session_id, m.seq, m.role, _encode(m.content), m.name, m.tool_call_id, m.component,
          None if m.meta is None else _encode(m.meta), m.tokens, m.created_at, m.branch_id,
          int(m.discarded), m.compaction, m.replaced_by, m.at_seq) for m in messages])


def _stored(row: Sequence[Any]) -> StoredMessage:
    """A row of the `_MESSAGE_COLUMNS`, read by name and decoded."""
    values = dict(zip(_MESSAGE_COLUMNS, row, strict=True))
    values["content"] = _decode_content(values["content"])
    if values["meta"] is not None:
        values["meta"] = decode_meta(values["meta"])
    values["discarded"] = bool(values["discarded"])
    return StoredMessage(**values)


def save_counters(conn: apsw.Connection, record: SessionRecord) -> None:
    """Write the session's counters (main thread, seq, folded tokens); the caller's
    transaction."""
    conn.execute(
        "UPDATE sessions SET message_count = ?, tokens_system_prompt = ?, "
        "tokens_skill_prompts = ?, tokens_tool_descriptions = ?, tokens_conversation = ?, "
        "last_seq = ?, folded_tokens = ?, updated_at = ?, compactions = ?, "
        "compact_failures = ?, compacted_at = ? WHERE id = ?",
        (record.message_count, *(record.component_tokens[c] for c in COMPONENTS),
         record.last_seq, record.folded_tokens, record.updated_at, record.compactions,
         record.compact_failures, record.compacted_at, record.session_id))


def list_messages(conn: apsw.Connection, session_id: str, branch_id: str | None,
                  after_seq: int, limit: int) -> list[StoredMessage]:
    """A page of the archive: every message of the session, or of one branch (decoded
    here, in the store's thread: pages can be large)."""
    columns = ", ".join(_MESSAGE_COLUMNS)
    if branch_id is None:
        rows = conn.execute(
            f"SELECT {columns} FROM messages WHERE session_id = ? AND seq > ? "
            "ORDER BY seq LIMIT ?", (session_id, after_seq, limit))
    else:
        rows = conn.execute(
            f"SELECT {columns} FROM messages WHERE branch_id = ? AND seq > ? "
            "ORDER BY seq LIMIT ?", (branch_id, after_seq, limit))
    return [_stored(row) for row in rows]


KEPT = "discarded = 0 AND compaction IS NULL"
"""The messages of a thread that it renders: neither rolled back nor compacted away."""
POSITION = "coalesce(at_seq, seq)"
"""Where a message sits in its thread (docs/protocol.md, "Compaction")."""


def render_rows(conn: apsw.Connection, session_id: str, branch_id: str | None,
                metas: list[dict[str, Any] | None] | None = None
                ) -> tuple[list[RenderedMessage], int]:
    """The messages ``ctxd.render`` sends for a thread, and the sum of their tokens: for
    the main thread its kept messages; for a branch, its parent's rendered prefix (up to
    the branch's fork) and then the branch's own messages, up to the main thread.
    ``metas``, when given, gets each message's ``meta`` (a provider's shape renders
    from it)."""
    messages: list[RenderedMessage] = []
    tokens = 0
    meta_column = "meta" if metas is not None else "NULL"
    for thread, through in thread_chain(conn, branch_id):
        for role, content, name, tool_call_id, count, meta in conn.execute(
                f"SELECT role, content, name, tool_call_id, tokens, {meta_column} "
                f"FROM messages WHERE session_id = ? AND branch_id IS ? AND {KEPT} "
                f"AND {POSITION} <= ? ORDER BY {POSITION}, seq",
                (session_id, thread, through)):
            messages.append(RenderedMessage(role=role, content=_decode_content(content),
                                            name=name, tool_call_id=tool_call_id))
            tokens += count
            if metas is not None:
                metas.append(None if meta is None else decode_meta(meta))
    return messages, tokens


def thread_rows(conn: apsw.Connection, session_id: str,
                thread: str | None) -> list[StoredMessage]:
    """The kept messages of one thread (a branch: its own), in thread order."""
    return [_stored(row) for row in conn.execute(
        f"SELECT {', '.join(_MESSAGE_COLUMNS)} FROM messages WHERE session_id = ? "
        f"AND branch_id IS ? AND {KEPT} ORDER BY {POSITION}, seq", (session_id, thread))]


def mark_compacted(conn: apsw.Connection, session_id: str,
                   marks: Sequence[tuple[int, str, int]]) -> None:
    """Take messages out of their thread: (seq, what compaction did, the seq of the
    message that stands for it); the caller's transaction."""
    conn.executemany("UPDATE messages SET compaction = ?, replaced_by = ? "
                     "WHERE session_id = ? AND seq = ?",
                     [(what, by, session_id, seq) for seq, what, by in marks])


def main_rows_after(conn: apsw.Connection, session_id: str,
                    after_seq: int) -> tuple[list[RenderedMessage], int]:
    """The main thread's kept messages that sit after ``after_seq``, and their tokens."""
    messages: list[RenderedMessage] = []
    tokens = 0
    for role, content, name, tool_call_id, count in conn.execute(
            f"SELECT role, content, name, tool_call_id, tokens FROM messages "
            f"WHERE session_id = ? AND branch_id IS NULL AND {KEPT} AND {POSITION} > ? "
            f"ORDER BY {POSITION}, seq", (session_id, after_seq)):
        messages.append(RenderedMessage(role=role, content=_decode_content(content),
                                        name=name, tool_call_id=tool_call_id))
        tokens += count
    return messages, tokens


def recent_work(conn: apsw.Connection, branch_id: str, opening_meta: dict[str, Any],
                recent: int = 3) -> tuple[Content | None, list[tuple[str, Content]]]:
    """A branch's last assistant message, and its last ``recent`` messages appended by the
    client (oldest first; not those with ``opening_meta``): what a forced return builds its
    partial result from."""
    last = conn.execute(
        f"SELECT content FROM messages WHERE branch_id = ? AND role = 'assistant' "
        f"AND {KEPT} ORDER BY {POSITION} DESC, seq DESC LIMIT 1", (branch_id,)).fetchall()
    rows = conn.execute(
        f"SELECT role, content FROM messages WHERE branch_id = ? AND {KEPT} "
        f"AND meta IS NOT ? ORDER BY {POSITION} DESC, seq DESC LIMIT ?",
        (branch_id, _encode(opening_meta), recent)).fetchall()
    return (_decode_content(_text(last[0][0])) if last else None,
            [(role, _decode_content(content)) for role, content in reversed(rows)])


def recent_works(conn: apsw.Connection, branch_ids: Sequence[str],
                 opening_meta: dict[str, Any]
                 ) -> dict[str, tuple[Content | None, list[tuple[str, Content]]]]:
    """`recent_work` of several branches, in one store job."""
    return {branch_id: recent_work(conn, branch_id, opening_meta) for branch_id in branch_ids}


def discard_messages(conn: apsw.Connection, session_id: str, thread: str | None,
                     fork_seq: int, branch_ids: Sequence[str]) -> MessagesDiscarded:
    """Mark discarded a thread's messages after ``fork_seq`` and every message of the
    given branches (kept in the archive), and bring back the thread's messages that a
    compaction after ``fork_seq`` had taken out; the caller's transaction. The thread's
    figures are net: discarded minus brought back."""
    by_component: dict[Component, int] = dict.fromkeys(COMPONENTS, 0)
    thread_messages = thread_operations = 0
    for component, role, tokens in conn.execute(
            f"SELECT component, role, tokens FROM messages WHERE session_id = ? "
            f"AND branch_id IS ? AND seq > ? AND {KEPT}", (session_id, thread, fork_seq)):
        by_component[component] += tokens
        thread_messages += 1
        thread_operations += role == "assistant"
    restore = ("FROM messages WHERE session_id = ? AND branch_id IS ? AND seq <= ? "
               "AND discarded = 0 AND replaced_by > ?")
    for component, tokens in conn.execute(f"SELECT component, tokens {restore}",
                                          (session_id, thread, fork_seq, fork_seq)):
        by_component[component] -= tokens
        thread_messages -= 1
    conn.execute(f"UPDATE messages SET compaction = NULL, replaced_by = NULL "
                 f"WHERE rowid IN (SELECT rowid {restore})",
                 (session_id, thread, fork_seq, fork_seq))
    branch_tokens: dict[str, int] = {}
    branch_messages: dict[str, int] = {}
    for chunk in chunks(branch_ids):
        marks = ",".join("?" * len(chunk))
        for branch_id, count, tokens in conn.execute(
                f"SELECT branch_id, count(*), coalesce(sum(tokens), 0) FROM messages "
                f"WHERE {KEPT} AND branch_id IN ({marks}) GROUP BY branch_id", chunk):
            branch_messages[branch_id], branch_tokens[branch_id] = count, tokens
        conn.execute(f"UPDATE messages SET discarded = 1 WHERE branch_id IN ({marks})", chunk)
    conn.execute("UPDATE messages SET discarded = 1 WHERE session_id = ? AND branch_id IS ? "
                 "AND seq > ?", (session_id, thread, fork_seq))
    return MessagesDiscarded(thread_tokens=by_component, thread_messages=thread_messages,
                             thread_operations=thread_operations, branch_tokens=branch_tokens,
                             branch_messages=branch_messages)


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
        f"SELECT rowid, {', '.join(_SESSION_COLUMNS)} FROM sessions "
        "WHERE rowid > ? AND (? IS NULL OR project = ?) AND (? IS NULL OR state = ?) "
        "ORDER BY rowid LIMIT ?",
        (after_rowid, project, project, state, state, limit)).fetchall()
    records = [(scalar_rowid(row[0]), _record(row[1:])) for row in rows]
    live = live_branch_counts(conn, [record.session_id for _, record in records])
    return [(rowid, record, live.get(record.session_id, 0)) for rowid, record in records]


def count_sessions(conn: apsw.Connection) -> tuple[int, int]:
    """(open sessions, all sessions)."""
    open_count = scalar_int(conn, "SELECT count(*) FROM sessions WHERE state = 'open'")
    return open_count, scalar_int(conn, "SELECT count(*) FROM sessions")


def expired_sessions(conn: apsw.Connection, closed_before: float) -> list[str]:
    return [row[0] for row in conn.execute(
        "SELECT id FROM sessions WHERE state = 'closed' AND closed_at < ?", (closed_before,))]

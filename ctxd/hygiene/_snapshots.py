"""Snapshots: the ``session_snapshots`` table, a session's main thread as its latest
compaction left it, which `session.resume` starts from (docs/protocol.md, "Compaction")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import apsw
import msgspec

from ctxd.wire.types import RenderedMessage

_encode = msgspec.json.Encoder().encode
_decode_messages = msgspec.json.Decoder(list[RenderedMessage]).decode


@dataclass(frozen=True)
class Snapshot:
    compaction: int
    """The session's count of compactions when it was taken: it is current while no
    compaction has shrunk the session since."""
    through_seq: int
    """The session's last seq when it was taken: later messages come after it."""
    compacted_at: float
    message_tokens: int
    messages: list[RenderedMessage]


def save_snapshot(conn: apsw.Connection, session_id: str, snapshot: Snapshot) -> None:
    """Keep ``snapshot`` as the session's latest (it replaces the one before)."""
    conn.execute(
        "INSERT INTO session_snapshots (session_id, compaction, through_seq, compacted_at, "
        "message_tokens, messages) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session_id) DO "
        "UPDATE SET compaction = excluded.compaction, through_seq = excluded.through_seq, "
        "compacted_at = excluded.compacted_at, message_tokens = excluded.message_tokens, "
        "messages = excluded.messages",
        (session_id, snapshot.compaction, snapshot.through_seq, snapshot.compacted_at,
         snapshot.message_tokens, _encode(snapshot.messages)))


def load_snapshot(conn: apsw.Connection, session_id: str) -> Snapshot | None:
    rows: list[Any] = conn.execute(
        "SELECT compaction, through_seq, compacted_at, message_tokens, messages "
        "FROM session_snapshots WHERE session_id = ?", (session_id,)).fetchall()
    if not rows:
        return None
    compaction, through_seq, compacted_at, message_tokens, messages = rows[0]
    assert isinstance(messages, bytes)
    return Snapshot(compaction=compaction, through_seq=through_seq, compacted_at=compacted_at,
                    message_tokens=message_tokens, messages=_decode_messages(messages))


def drop_snapshot_after(conn: apsw.Connection, session_id: str, seq: int) -> None:
    """Forget the session's snapshot if it holds messages after ``seq`` (a rollback took
    them out); the caller's transaction."""
    conn.execute("DELETE FROM session_snapshots WHERE session_id = ? AND through_seq > ?",
                 (session_id, seq))

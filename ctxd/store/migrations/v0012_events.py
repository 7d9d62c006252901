"""Version 12: the persisted event stream (docs/protocol.md, "Events").

``seq`` is the event's number on the wire; AUTOINCREMENT keeps its high-water mark in
``sqlite_sequence`` even when pruning removed every row, so ``seq`` never goes back. The
index on ``(session_id, seq)`` serves a replay filtered by session.
"""

SQL = """
CREATE TABLE events (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    ts          REAL NOT NULL,
    session_id  TEXT,
    type        TEXT NOT NULL,
    data        BLOB NOT NULL
) STRICT;
CREATE INDEX events_by_session ON events (session_id, seq);
"""

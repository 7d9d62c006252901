"""Version 16: the memories given to each session (docs/protocol.md, "Claude Code hooks").

One row per memory that ``memory.context`` put in a session's context, so that it is not
given again while that context holds it; the session's agent compacting its context
clears the session's rows. Rows go with their session and with their memory.
"""

SQL = """
CREATE TABLE memory_deliveries (
    session_id   TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    memory_id    INTEGER NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    delivered_at REAL NOT NULL,
    PRIMARY KEY (session_id, memory_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX memory_deliveries_by_memory ON memory_deliveries (memory_id);
"""

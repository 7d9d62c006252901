"""Version 7: offloaded tool results, stored whole beside the stub their message carries
(docs/protocol.md, "Offloaded tool results")."""

SQL = """
CREATE TABLE tool_result_blobs (
    ref_id      TEXT PRIMARY KEY,
    session_id  TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    branch_id   TEXT,
    tool_name   TEXT,
    size_bytes  INTEGER NOT NULL,
    text        TEXT NOT NULL,
    parts       BLOB,
    created_at  REAL NOT NULL,
    UNIQUE (session_id, seq),
    FOREIGN KEY (session_id, seq) REFERENCES messages (session_id, seq) ON DELETE CASCADE
) STRICT;
"""

"""Version 13: what transcript.import has read of each (session, file) (docs/protocol.md,
"transcript.import").

``offset`` is where the next import resumes: the bytes consumed (Claude Code JSONL: up to
the last complete line) or the messages imported (an OpenCode export); ``lines`` numbers the
next line; ``head_hash`` (SHA-256 of the file's first bytes, up to ``head_bytes``) and
``size`` tell a grown file from a replaced or truncated one.
"""

SQL = """
CREATE TABLE transcript_imports (
    session_id   TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    path         TEXT NOT NULL,
    format       TEXT NOT NULL CHECK (format IN ('claude-code', 'opencode')),
    offset       INTEGER NOT NULL,
    lines        INTEGER NOT NULL,
    size         INTEGER NOT NULL,
    head_bytes   INTEGER NOT NULL,
    head_hash    TEXT NOT NULL,
    imported_at  REAL NOT NULL,
    PRIMARY KEY (session_id, path)
) STRICT;
"""

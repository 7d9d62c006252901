"""Version 8: the tool definitions registered per session, with their exact tokens and
their last use, from which tool deferral picks what a render leaves out (docs/protocol.md,
"Tool deferral")."""

SQL = """
CREATE TABLE session_tools (
    session_id     TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    name           TEXT NOT NULL,
    description    TEXT NOT NULL,
    input_schema   TEXT NOT NULL,
    source         TEXT NOT NULL CHECK (source IN ('builtin', 'mcp', 'skill')),
    tokens         INTEGER NOT NULL,
    registered_at  REAL NOT NULL,
    last_used_seq  INTEGER NOT NULL DEFAULT 0,
    promoted       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session_id, name)
) STRICT;
"""

"""Version 1: sessions and their messages."""

SQL = """
CREATE TABLE sessions (
    id                      TEXT PRIMARY KEY,
    project                 TEXT,
    title                   TEXT,
    state                   TEXT NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'closed')),
    context_window          INTEGER NOT NULL,
    max_output_tokens       INTEGER NOT NULL,
    compact_trigger         REAL NOT NULL,
    hard_block              REAL NOT NULL,
    warn                    REAL NOT NULL,
    caution                 REAL NOT NULL,
    message_count           INTEGER NOT NULL DEFAULT 0,
    tokens_system_prompt    INTEGER NOT NULL DEFAULT 0,
    tokens_skill_prompts    INTEGER NOT NULL DEFAULT 0,
    tokens_tool_descriptions INTEGER NOT NULL DEFAULT 0,
    tokens_conversation     INTEGER NOT NULL DEFAULT 0,
    created_at              REAL NOT NULL,
    updated_at              REAL NOT NULL,
    closed_at               REAL
) STRICT;
CREATE INDEX sessions_by_project ON sessions (project, state);
CREATE INDEX sessions_closed ON sessions (closed_at) WHERE state = 'closed';

CREATE TABLE messages (
    id           INTEGER PRIMARY KEY,
    session_id   TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq          INTEGER NOT NULL,
    role         TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
    content      BLOB NOT NULL,
    name         TEXT,
    tool_call_id TEXT,
    component    TEXT NOT NULL,
    meta         BLOB,
    tokens       INTEGER NOT NULL,
    created_at   REAL NOT NULL,
    UNIQUE (session_id, seq)
) STRICT;
"""

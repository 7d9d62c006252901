"""Version 10: the usage ledger and the tool-call lifecycle (docs/protocol.md, "Usage" and
"Tool states").

Each reported LLM call is one row of ``usage_records``, with ctxd's own count of the
thread's input tokens when it was recorded (calibration); a retried ``idempotency_key``
finds its first row. Each tool call has one row in ``tool_calls`` (its current state) and
one row per state it entered in ``tool_call_states`` (its history).
"""

SQL = """
CREATE TABLE usage_records (
    usage_id           INTEGER PRIMARY KEY,
    session_id         TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    branch_id          TEXT,
    request_id         TEXT,
    model              TEXT,
    idempotency_key    TEXT,
    input_tokens       INTEGER NOT NULL,
    output_tokens      INTEGER NOT NULL,
    cache_read_tokens  INTEGER NOT NULL,
    cache_write_tokens INTEGER NOT NULL,
    thinking_tokens    INTEGER NOT NULL,
    local_input_tokens INTEGER NOT NULL,
    recorded_at        REAL NOT NULL,
    UNIQUE (session_id, idempotency_key)
) STRICT;
CREATE INDEX usage_records_by_session ON usage_records (session_id, usage_id);

CREATE TABLE tool_calls (
    session_id    TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    tool_call_id  TEXT NOT NULL,
    tool_name     TEXT,
    state         TEXT NOT NULL,
    created_at    REAL NOT NULL,
    updated_at    REAL NOT NULL,
    PRIMARY KEY (session_id, tool_call_id)
) STRICT;
CREATE INDEX tool_calls_by_state ON tool_calls (session_id, state);

CREATE TABLE tool_call_states (
    session_id    TEXT NOT NULL,
    tool_call_id  TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    state         TEXT NOT NULL,
    detail        TEXT,
    entered_at    REAL NOT NULL,
    PRIMARY KEY (session_id, tool_call_id, seq),
    FOREIGN KEY (session_id, tool_call_id) REFERENCES tool_calls (session_id, tool_call_id)
        ON DELETE CASCADE
) STRICT;
"""

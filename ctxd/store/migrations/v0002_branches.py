"""Version 2: context folding — branches, thread membership of messages, memory candidates."""

SQL = """
ALTER TABLE sessions ADD COLUMN last_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN folded_tokens INTEGER NOT NULL DEFAULT 0;
UPDATE sessions SET last_seq = message_count;

CREATE TABLE branches (
    id               TEXT PRIMARY KEY,
    session_id       TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    parent_id        TEXT REFERENCES branches (id) ON DELETE CASCADE,
    depth            INTEGER NOT NULL CHECK (depth BETWEEN 1 AND 16),
    description      TEXT NOT NULL,
    prompt           TEXT NOT NULL,
    status           TEXT NOT NULL DEFAULT 'active' CHECK (status IN
                     ('active', 'completed', 'budget_exhausted', 'timeout', 'failed',
                      'discarded')),
    return_reason    TEXT,
    budget           INTEGER NOT NULL,
    tokens_used      INTEGER NOT NULL,
    operations       INTEGER NOT NULL DEFAULT 0,
    warned           INTEGER NOT NULL DEFAULT 0,
    timeout_s        REAL NOT NULL,
    created_at       REAL NOT NULL,
    deadline_at      REAL NOT NULL,
    fork_seq         INTEGER NOT NULL,
    prefix_tokens    INTEGER NOT NULL,
    returned_at      REAL,
    result           TEXT,
    fold_seq         INTEGER,
    tokens_folded    INTEGER,
    tokens_saved     INTEGER,
    secrets_scrubbed INTEGER
) STRICT;
CREATE INDEX branches_by_session ON branches (session_id, fork_seq);
CREATE INDEX branches_live ON branches (status) WHERE status = 'active';

ALTER TABLE messages ADD COLUMN branch_id TEXT REFERENCES branches (id) ON DELETE CASCADE;
ALTER TABLE messages ADD COLUMN discarded INTEGER NOT NULL DEFAULT 0;
CREATE INDEX messages_by_thread ON messages (session_id, branch_id, seq);
CREATE INDEX messages_by_branch ON messages (branch_id, seq) WHERE branch_id IS NOT NULL;

CREATE TABLE memory_candidates (
    id          INTEGER PRIMARY KEY,
    session_id  TEXT NOT NULL,
    branch_id   TEXT NOT NULL,
    title       TEXT NOT NULL,
    content     TEXT NOT NULL,
    outcome     TEXT NOT NULL CHECK (outcome IN ('success', 'failure')),
    created_at  REAL NOT NULL
) STRICT;
"""

"""Version 17: a memory's id is never given to another memory (``AUTOINCREMENT``).

With a plain integer key, SQLite gives a new row the highest id plus one, so after
``memory.delete`` of the newest memory the next one got its id: a user's notes, a log or
an agent's context that named ``memory 3`` then meant another memory. ``sqlite_sequence``
now keeps the highest id ever given. Memories are recorded one at a time, rarely: the
sequence's page rewritten at each insert costs nothing that shows (unlike ``events``,
version 14).

The table is rebuilt with its rows and ids as they are. Foreign keys are off for the step
(`FOREIGN_KEYS_OFF`): dropping the old table must not delete ``memory_signals``' rows by
their cascade; the runner checks the keys before it commits. The full-text index keeps its
rows (keyed by the same ids); its triggers, dropped with the old table, are made again.
Ids deleted before this version above the highest kept one cannot be known and may be
given once more.
"""

FOREIGN_KEYS_OFF = True

SQL = """
CREATE TABLE memories_v17 (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    scope           TEXT NOT NULL,
    title           TEXT NOT NULL,
    description     TEXT NOT NULL DEFAULT '',
    content         TEXT NOT NULL,
    outcome         TEXT NOT NULL CHECK (outcome IN ('success', 'failure')),
    tags            TEXT NOT NULL DEFAULT '',
    alpha           REAL NOT NULL CHECK (alpha > 0),
    beta            REAL NOT NULL CHECK (beta > 0),
    usage_count     INTEGER NOT NULL DEFAULT 0,
    source          TEXT,
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL,
    content_tokens  INTEGER
) STRICT;
INSERT INTO memories_v17 (id, scope, title, description, content, outcome, tags, alpha, beta,
                          usage_count, source, created_at, updated_at, content_tokens)
    SELECT id, scope, title, description, content, outcome, tags, alpha, beta, usage_count,
           source, created_at, updated_at, content_tokens FROM memories ORDER BY id;
DROP TABLE memories;
ALTER TABLE memories_v17 RENAME TO memories;
CREATE INDEX memories_by_scope ON memories (scope);

CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories BEGIN
    INSERT INTO memories_fts (rowid, title, description, content, tags)
    VALUES (new.id, new.title, new.description, new.content, new.tags);
END;
CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories BEGIN
    INSERT INTO memories_fts (memories_fts, rowid, title, description, content, tags)
    VALUES ('delete', old.id, old.title, old.description, old.content, old.tags);
END;
CREATE TRIGGER memories_fts_update AFTER UPDATE OF title, description, content, tags
    ON memories BEGIN
    INSERT INTO memories_fts (memories_fts, rowid, title, description, content, tags)
    VALUES ('delete', old.id, old.title, old.description, old.content, old.tags);
    INSERT INTO memories_fts (rowid, title, description, content, tags)
    VALUES (new.id, new.title, new.description, new.content, new.tags);
END;
"""

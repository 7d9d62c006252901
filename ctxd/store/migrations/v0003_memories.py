"""Version 3: memory — ReasoningBank items, their FTS5 index and their signals; the scope a
memory candidate is promoted into."""

SQL = """
CREATE TABLE memories (
    id           INTEGER PRIMARY KEY,
    scope        TEXT NOT NULL,
    title        TEXT NOT NULL,
    description  TEXT NOT NULL DEFAULT '',
    content      TEXT NOT NULL,
    outcome      TEXT NOT NULL CHECK (outcome IN ('success', 'failure')),
    tags         TEXT NOT NULL DEFAULT '',
    alpha        REAL NOT NULL CHECK (alpha > 0),
    beta         REAL NOT NULL CHECK (beta > 0),
    usage_count  INTEGER NOT NULL DEFAULT 0,
    source       TEXT,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL
) STRICT;
CREATE INDEX memories_by_scope ON memories (scope);

CREATE VIRTUAL TABLE memories_fts USING fts5 (
    title, description, content, tags,
    content = 'memories', content_rowid = 'id', tokenize = 'porter unicode61'
);
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

CREATE TABLE memory_signals (
    id          INTEGER PRIMARY KEY,
    memory_id   INTEGER NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    kind        TEXT NOT NULL CHECK (kind IN ('feedback', 'outcome', 'use')),
    positive    INTEGER NOT NULL CHECK (positive IN (0, 1)),
    weight      REAL NOT NULL,
    source      TEXT,
    created_at  REAL NOT NULL
) STRICT;
CREATE INDEX memory_signals_by_memory ON memory_signals (memory_id);

CREATE TABLE memory_index_state (
    singleton   INTEGER PRIMARY KEY CHECK (singleton = 1),
    generation  INTEGER NOT NULL
) STRICT;
INSERT INTO memory_index_state (singleton, generation) VALUES (1, 0);

ALTER TABLE memory_candidates ADD COLUMN scope TEXT;
"""

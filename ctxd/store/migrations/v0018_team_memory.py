"""Version 18: team memory's local side (docs/decisions.md, "Team memory").

``team_outbox``: the writes to shared scopes not yet applied to the team database, each
committed with the local write it stands for and keyed for at most once (its ``key``:
this store's id and the row's). ``team_mirror``: which local memory is which shared one.
``team_link``: how far the mirror has read the database's changes, and this store's id.
"""

SQL = """
CREATE TABLE team_outbox (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    operation   TEXT NOT NULL,
    memory_id   INTEGER REFERENCES memories (id) ON DELETE SET NULL,
    created_at  REAL NOT NULL
) STRICT;
CREATE TABLE team_mirror (
    memory_id   INTEGER PRIMARY KEY REFERENCES memories (id) ON DELETE CASCADE,
    remote_id   INTEGER NOT NULL UNIQUE
) STRICT;
CREATE TABLE team_link (
    store_id    TEXT NOT NULL,
    last_change INTEGER NOT NULL DEFAULT 0
) STRICT;
INSERT INTO team_link (store_id) VALUES (lower(hex(randomblob(8))));
"""

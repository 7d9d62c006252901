"""Version 14: the events' high-water seq kept where rows are deleted, not on every insert.

With ``AUTOINCREMENT`` every append's commit also rewrote ``sqlite_sequence``'s page (one
WAL page more per append, docs/performance.md). ``events.seq`` is now a plain integer
primary key (the bus numbers every event itself), and ``events_high_water`` holds the
highest seq at the last deletion of events (pruning, a deleted session's): the seq to
continue from is the greater of it and the newest row's, so seq never goes back.
"""

SQL = """
CREATE TABLE events_high_water (
    singleton  INTEGER PRIMARY KEY CHECK (singleton = 1),
    seq        INTEGER NOT NULL
) STRICT;
INSERT INTO events_high_water (singleton, seq)
    SELECT 1, seq FROM sqlite_sequence WHERE name = 'events';
CREATE TABLE events_v14 (
    seq         INTEGER PRIMARY KEY,
    ts          REAL NOT NULL,
    session_id  TEXT,
    type        TEXT NOT NULL,
    data        BLOB NOT NULL
) STRICT;
INSERT INTO events_v14 (seq, ts, session_id, type, data)
    SELECT seq, ts, session_id, type, data FROM events ORDER BY seq;
DROP TABLE events;
ALTER TABLE events_v14 RENAME TO events;
CREATE INDEX events_by_session ON events (session_id, seq);
"""

"""Version 9: the compaction chain and snapshots (docs/protocol.md, "Compaction").

A message that compaction took out of its thread stays in the archive, marked ``cleared``,
``summarized`` or ``truncated`` in ``compaction`` with the seq of the message that stands
for it in ``replaced_by``; that message sits at ``at_seq`` in the thread (the seq of the
first message it replaces). A session counts its compactions that shrank the context and
the compactions in a row that did not (the circuit breaker); its latest snapshot is the
compacted main thread.
"""

SQL = """
ALTER TABLE messages ADD COLUMN compaction TEXT
    CHECK (compaction IN ('cleared', 'summarized', 'truncated'));
ALTER TABLE messages ADD COLUMN replaced_by INTEGER;
ALTER TABLE messages ADD COLUMN at_seq INTEGER;
ALTER TABLE sessions ADD COLUMN compactions INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN compact_failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN compacted_at REAL;

CREATE TABLE session_snapshots (
    session_id    TEXT PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
    compaction    INTEGER NOT NULL,
    through_seq   INTEGER NOT NULL,
    compacted_at  REAL NOT NULL,
    message_tokens INTEGER NOT NULL,
    messages      BLOB NOT NULL
) STRICT;
"""

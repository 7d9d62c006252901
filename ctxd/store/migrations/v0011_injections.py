"""Version 11: the injection queue (docs/protocol.md, "Injection").

One row per injection pushed into a session, in arrival order (``id``). ``state`` goes
``pending`` → ``delivered`` (handed out by inject.pull; ``deliveries`` counts the times) →
``accepted`` or ``rejected`` (inject.ack). ``priority`` is stored as its rank (0 immediate,
1 normal, 2 deferred) so that the queue is read in one index order. A retried push is
found by its ``idempotency_key``, unique within the session. Two partial indexes keep
inject.pull's reads short however many injections wait unanswered: the pending ones in the
order they are handed out, the delivered ones by when.
"""

SQL = """
CREATE TABLE injections (
    id              INTEGER PRIMARY KEY,
    injection_id    TEXT NOT NULL UNIQUE,
    session_id      TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    priority        INTEGER NOT NULL CHECK (priority IN (0, 1, 2)),
    content         TEXT NOT NULL,
    source          TEXT,
    idempotency_key TEXT,
    tokens          INTEGER NOT NULL,
    secrets_scrubbed INTEGER NOT NULL,
    state           TEXT NOT NULL
        CHECK (state IN ('pending', 'delivered', 'accepted', 'rejected')),
    created_at      REAL NOT NULL,
    deliveries      INTEGER NOT NULL DEFAULT 0,
    delivered_at    REAL,
    acked_at        REAL,
    reason          TEXT,
    UNIQUE (session_id, idempotency_key)
) STRICT;

CREATE INDEX injections_pending ON injections (session_id, priority, id)
    WHERE state = 'pending';
CREATE INDEX injections_delivered ON injections (session_id, delivered_at)
    WHERE state = 'delivered';
"""

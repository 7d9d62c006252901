"""Version 19: the gateway's ledger by conversation line (docs/decisions.md, Gateway: "The
ledger keeps a line per conversation").

A thread's ledger held one line and was cut where a request diverged from it, so two
conversations sharing a session and a system prompt (parallel sub-agents, two runs of one
scripted task) cut each other's at every turn. Now each row belongs to a ``line`` of its
thread, and names its message by ``node``: a digest of the message and of every message
before it (the thread's own digest at the root), so a line holding a request's node holds
its whole history up to there. ``gateway_lines`` orders a thread's lines by their last
use (``used``, counting up per thread), so the least used are dropped first.

The rows of version 15 become line 0 of their thread, each node computed from the
message digests before it; the step does it in Python (`migrate`), SQLite having no hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import apsw

SQL = """
CREATE TABLE gateway_ledger_lines (
    session_id   TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    thread       BLOB NOT NULL,
    line         INTEGER NOT NULL,
    position     INTEGER NOT NULL,
    node         BLOB NOT NULL,
    sent         BLOB,
    agent_tokens INTEGER NOT NULL,
    sent_tokens  INTEGER NOT NULL,
    first_seq    INTEGER,
    compaction   BLOB,
    compaction_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session_id, thread, line, position)
) STRICT, WITHOUT ROWID;
CREATE TABLE gateway_lines (
    session_id   TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    thread       BLOB NOT NULL,
    line         INTEGER NOT NULL,
    used         INTEGER NOT NULL,
    PRIMARY KEY (session_id, thread, line)
) STRICT, WITHOUT ROWID;
"""

_AFTER = """
DROP TABLE gateway_ledger;
ALTER TABLE gateway_ledger_lines RENAME TO gateway_ledger;
"""


def _node(parent: bytes, digest: bytes) -> bytes:
    """A row's node as version 19 defines it (kept here as it was: a migration does not
    follow later code)."""
    return hashlib.blake2b(parent + digest, digest_size=16).digest()


def migrate(conn: apsw.Connection) -> None:
    """Version 15's rows into line 0 of their thread, with their nodes (a row at a time:
    the sent JSON of a whole database is not held at once)."""
    threads: list[tuple[str, bytes]] = []

    def rows() -> Iterator[tuple[Any, ...]]:
        node = b""
        for (session_id, thread, position, digest, *rest) in conn.execute(
                "SELECT session_id, thread, position, digest, sent, agent_tokens, "
                "sent_tokens, first_seq, compaction, compaction_tokens FROM gateway_ledger "
                "ORDER BY session_id, thread, position"):
            if not threads or threads[-1] != (session_id, thread):
                threads.append((session_id, thread))
                node = thread
            node = _node(node, digest)
            yield (session_id, thread, position, node, *rest)

    # Another cursor than the SELECT's: the rows go into a table it does not read.
    conn.cursor().executemany(
        "INSERT INTO gateway_ledger_lines (session_id, thread, line, position, node, sent, "
        "agent_tokens, sent_tokens, first_seq, compaction, compaction_tokens) "
        "VALUES (?, ?, 0, ?, ?, ?, ?, ?, ?, ?, ?)", rows())
    conn.executemany("INSERT INTO gateway_lines (session_id, thread, line, used) "
                     "VALUES (?, ?, 0, 1)", threads)
    conn.execute(_AFTER)

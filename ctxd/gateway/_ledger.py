"""The sent ledger: the ``gateway_ledger`` table, one row per message position of a
conversation line as the gateway last sent it, and ``gateway_lines``, the lines of each
thread (a session's requests with one system prompt) by their last use (docs/decisions.md,
Gateway: "The ledger keeps a line per conversation")."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import apsw
import msgspec

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.decode

LINES_KEPT = 16
"""Lines a thread keeps; the least used are dropped beyond (a rewound conversation's old
line is never used again; parallel sub-agents of one kind are each a line)."""


def chained(parent: bytes, digest: bytes) -> bytes:
    """The node of a message: a digest of its own digest and of its parent's node (the
    thread's digest for the first message), so equal nodes mean equal histories up to
    them."""
    return hashlib.blake2b(parent + digest, digest_size=16).digest()


@dataclass
class LedgerRow:
    """What the agent sent at ``position`` (its node) and what ctxd sent for it."""

    position: int
    node: bytes
    sent: dict[str, Any] | None
    """The message as ctxd sends it, without the agent's ``cache_control`` marks (its own
    substitutions: a stub, a marker, a note); a fold or compaction may leave it out."""
    agent_tokens: int
    sent_tokens: int
    first_seq: int | None
    """The seq of the first ctxd message it was recorded as (None: nothing recorded)."""
    compaction: dict[str, Any] | None = None
    """On a message that called ``compact_context``: the summary message that stands for
    the messages before it (None: no compaction point here)."""
    compaction_tokens: int = 0
    _json: tuple[dict[str, Any], bytes] | None = field(default=None, repr=False,
                                                       compare=False)
    """``sent`` as JSON, with the object it was encoded from (stale once ``sent`` is
    another object)."""

    def sent_json(self) -> bytes | None:
        """``sent`` as JSON (encoded once per object: the sent body is spliced from it)."""
        if self.sent is None:
            return None
        if self._json is None or self._json[0] is not self.sent:
            self._json = (self.sent, _encode(self.sent))
        return self._json[1]


def _row(position: int, node: bytes, sent: bytes | None, agent_tokens: int,
         sent_tokens: int, first_seq: int | None, compaction: bytes | None,
         compaction_tokens: int) -> LedgerRow:
    decoded = None if sent is None else _decode(sent)
    return LedgerRow(position=position, node=node, sent=decoded,
                     agent_tokens=agent_tokens, sent_tokens=sent_tokens, first_seq=first_seq,
                     compaction=None if compaction is None else _decode(compaction),
                     compaction_tokens=compaction_tokens,
                     _json=None if decoded is None or sent is None else (decoded, sent))


def load_lines(conn: apsw.Connection, session_id: str, thread: bytes) -> list[int]:
    """The thread's lines, the least recently used first."""
    return [line for (line,) in conn.execute(
        "SELECT line FROM gateway_lines WHERE session_id = ? AND thread = ? ORDER BY used",
        (session_id, thread))]


def load_line(conn: apsw.Connection, session_id: str, thread: bytes, line: int
              ) -> list[LedgerRow]:
    """The rows of a line, in position order."""
    return [_row(*row) for row in conn.execute(
        "SELECT position, node, sent, agent_tokens, sent_tokens, first_seq, compaction, "
        "compaction_tokens FROM gateway_ledger WHERE session_id = ? AND thread = ? "
        "AND line = ? ORDER BY position", (session_id, thread, line))]


def load_nodes(conn: apsw.Connection, session_id: str, thread: bytes
               ) -> tuple[list[int], dict[int, list[bytes]]]:
    """The thread's lines, the least recently used first, and each line's nodes in
    position order (what a request is matched against without reading the rows)."""
    nodes: dict[int, list[bytes]] = {}
    for line, node in conn.execute(
            "SELECT line, node FROM gateway_ledger WHERE session_id = ? AND thread = ? "
            "ORDER BY line, position", (session_id, thread)):
        nodes.setdefault(line, []).append(node)
    order = load_lines(conn, session_id, thread)
    return order, {line: nodes.get(line, []) for line in order}


def save_line(conn: apsw.Connection, session_id: str, thread: bytes, line: int,
              rows: Sequence[LedgerRow], fork: tuple[int, int] | None,
              dropped: Sequence[int]) -> None:
    """Write ``rows`` into ``line``, after the first ``fork[1]`` rows of line ``fork[0]``
    when it starts from another line's prefix; mark it the thread's last used; drop the
    ``dropped`` lines."""
    if fork is not None:
        conn.execute(
            "INSERT INTO gateway_ledger (session_id, thread, line, position, node, sent, "
            "agent_tokens, sent_tokens, first_seq, compaction, compaction_tokens) "
            "SELECT session_id, thread, ?, position, node, sent, agent_tokens, sent_tokens, "
            "first_seq, compaction, compaction_tokens FROM gateway_ledger "
            "WHERE session_id = ? AND thread = ? AND line = ? AND position < ?",
            (line, session_id, thread, *fork))
    conn.executemany(
        "INSERT OR REPLACE INTO gateway_ledger (session_id, thread, line, position, node, "
        "sent, agent_tokens, sent_tokens, first_seq, compaction, compaction_tokens) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(session_id, thread, line, row.position, row.node, row.sent_json(),
          row.agent_tokens, row.sent_tokens, row.first_seq,
          None if row.compaction is None else _encode(row.compaction),
          row.compaction_tokens) for row in rows])
    conn.execute(
        "INSERT OR REPLACE INTO gateway_lines (session_id, thread, line, used) VALUES "
        "(?, ?, ?, (SELECT coalesce(max(used), 0) + 1 FROM gateway_lines "
        "WHERE session_id = ? AND thread = ?))", (session_id, thread, line, session_id, thread))
    for gone in dropped:
        conn.execute("DELETE FROM gateway_ledger WHERE session_id = ? AND thread = ? "
                     "AND line = ?", (session_id, thread, gone))
        conn.execute("DELETE FROM gateway_lines WHERE session_id = ? AND thread = ? "
                     "AND line = ?", (session_id, thread, gone))

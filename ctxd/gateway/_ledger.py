"""The sent ledger: the ``gateway_ledger`` table, one row per message position of a
session's conversation (by thread: its system prompt) as the gateway last saw it
(docs/decisions.md, Gateway)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import apsw
import msgspec

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.decode


@dataclass
class LedgerRow:
    """What the agent sent at ``position`` (its digest) and what ctxd sent for it."""

    position: int
    digest: bytes
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


def _row(position: int, digest: bytes, sent: bytes | None, agent_tokens: int,
         sent_tokens: int, first_seq: int | None, compaction: bytes | None,
         compaction_tokens: int) -> LedgerRow:
    decoded = None if sent is None else _decode(sent)
    return LedgerRow(position=position, digest=digest, sent=decoded,
                     agent_tokens=agent_tokens, sent_tokens=sent_tokens, first_seq=first_seq,
                     compaction=None if compaction is None else _decode(compaction),
                     compaction_tokens=compaction_tokens,
                     _json=None if decoded is None or sent is None else (decoded, sent))


def load_ledger(conn: apsw.Connection, session_id: str, thread: bytes) -> list[LedgerRow]:
    """The rows of a thread of the session, in position order."""
    return [_row(*row) for row in conn.execute(
                "SELECT position, digest, sent, agent_tokens, sent_tokens, first_seq, "
                "compaction, compaction_tokens FROM gateway_ledger "
                "WHERE session_id = ? AND thread = ? ORDER BY position", (session_id, thread))]


def save_ledger(conn: apsw.Connection, session_id: str, thread: bytes, keep: int,
                rows: Sequence[LedgerRow]) -> None:
    """Drop the thread's rows from position ``keep`` on (a divergence), then write
    ``rows``."""
    conn.execute("DELETE FROM gateway_ledger WHERE session_id = ? AND thread = ? "
                 "AND position >= ?", (session_id, thread, keep))
    conn.executemany(
        "INSERT OR REPLACE INTO gateway_ledger (session_id, thread, position, digest, sent, "
        "agent_tokens, sent_tokens, first_seq, compaction, compaction_tokens) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(session_id, thread, row.position, row.digest, row.sent_json(), row.agent_tokens,
          row.sent_tokens, row.first_seq,
          None if row.compaction is None else _encode(row.compaction),
          row.compaction_tokens) for row in rows])

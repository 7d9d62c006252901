"""SQL of the ``branches`` table; every function runs in the store thread."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import apsw

from ctxd.store import scalar_int
from ctxd.wire.types import Branch, Component

_STORED = tuple(name for name in Branch.__struct_fields__
                if name not in ("budget_remaining", "time_left_s"))
"""The columns of ``branches`` that a `Branch` holds, by name (the rest are derived)."""
_COLUMNS = ", ".join(_STORED)
_INSERTED = tuple(name for name in _STORED if name not in (
    "status", "return_reason", "returned_at", "result", "fold_seq", "tokens_folded",
    "tokens_saved", "secrets_scrubbed"))


def _branch(row: Sequence[Any]) -> Branch:
    """A row of the `_STORED` columns, read by name."""
    values = dict(zip(_STORED, row, strict=True))
    values["budget_warned"] = bool(values["budget_warned"])
    return Branch(budget_remaining=max(0, values["budget"] - values["budget_used"]), **values)


def insert_branch(conn: apsw.Connection, branch: Branch, prompt: str) -> None:
    """A new branch row (its opening messages are the session's); the caller's
    transaction."""
    conn.execute(f"INSERT INTO branches ({', '.join(_INSERTED)}, prompt) "
                 f"VALUES ({', '.join('?' * (len(_INSERTED) + 1))})",
                 (*(getattr(branch, name) for name in _INSERTED), prompt))


def save_meter(conn: apsw.Connection, branch: Branch) -> None:
    """A live branch's budget meter; the caller's transaction."""
    save_meters(conn, [branch])


def save_meters(conn: apsw.Connection, branches: Sequence[Branch]) -> None:
    """Live branches' budget meters; the caller's transaction."""
    conn.executemany("UPDATE branches SET budget_used = ?, operations_count = ?, "
                     "budget_warned = ? WHERE branch_id = ?",
                     [(branch.budget_used, branch.operations_count, int(branch.budget_warned),
                       branch.branch_id) for branch in branches])


def live_branches(conn: apsw.Connection, session_id: str) -> list[Branch]:
    """The session's active branches, oldest first."""
    return [_branch(row) for row in conn.execute(
        f"SELECT {_COLUMNS} FROM branches WHERE session_id = ? AND status = 'active' "
        "ORDER BY fork_seq", (session_id,))]


def sessions_with_live_branches(conn: apsw.Connection) -> list[str]:
    return [row[0] for row in conn.execute(
        "SELECT DISTINCT session_id FROM branches WHERE status = 'active'")]


def count_live_branches(conn: apsw.Connection) -> int:
    return scalar_int(conn, "SELECT count(*) FROM branches WHERE status = 'active'")


def live_branch_counts(conn: apsw.Connection, session_ids: Sequence[str]) -> dict[str, int]:
    """Active branches of each of these sessions (those without any are left out)."""
    counts: dict[str, int] = {}
    for chunk in chunks(session_ids):
        counts.update((session_id, count) for session_id, count in conn.execute(
            f"SELECT session_id, count(*) FROM branches WHERE status = 'active' AND "
            f"session_id IN ({','.join('?' * len(chunk))}) GROUP BY session_id", chunk))
    return counts


def session_of(conn: apsw.Connection, branch_id: str) -> str | None:
    rows = conn.execute("SELECT session_id FROM branches WHERE branch_id = ?",
                        (branch_id,)).fetchall()
    return str(rows[0][0]) if rows else None


def branch_info(conn: apsw.Connection, branch_id: str) -> Branch | None:
    rows = conn.execute(f"SELECT {_COLUMNS} FROM branches WHERE branch_id = ?",
                        (branch_id,)).fetchall()
    return _branch(rows[0]) if rows else None


def list_branches(conn: apsw.Connection, session_id: str) -> list[Branch]:
    """Every branch of a session, in creation order."""
    return [_branch(row) for row in conn.execute(
        f"SELECT {_COLUMNS} FROM branches WHERE session_id = ? ORDER BY fork_seq",
        (session_id,))]


@dataclass(frozen=True)
class Closed:
    """How a branch ended: what its fold writes to its row."""

    branch_id: str
    status: str
    return_reason: str | None
    returned_at: float
    result: str
    fold_seq: int
    tokens_folded: int
    tokens_saved: int
    secrets_scrubbed: int


def close_branches(conn: apsw.Connection, closed: Sequence[Closed]) -> None:
    """Mark branches returned; the caller's transaction (with their fold messages)."""
    conn.executemany(
        "UPDATE branches SET status = ?, return_reason = ?, returned_at = ?, result = ?, "
        "fold_seq = ?, tokens_folded = ?, tokens_saved = ?, secrets_scrubbed = ? "
        "WHERE branch_id = ?",
        [(c.status, c.return_reason, c.returned_at, c.result, c.fold_seq, c.tokens_folded,
          c.tokens_saved, c.secrets_scrubbed, c.branch_id) for c in closed])


@dataclass(frozen=True)
class MessagesDiscarded:
    """What a rollback took from the messages (the session's table): the rolled-back
    thread's later messages, and those of every discarded branch."""

    thread_tokens: dict[Component, int]
    thread_messages: int
    thread_operations: int
    branch_tokens: dict[str, int]
    """Tokens of each discarded branch's kept messages."""
    branch_messages: dict[str, int]


def chunks(ids: Sequence[str], size: int = 500) -> list[tuple[str, ...]]:
    """Ids in groups small enough to bind (SQLite limits the variables of a statement)."""
    return [tuple(ids[i:i + size]) for i in range(0, len(ids), size)]


def discard_later_branches(conn: apsw.Connection, session_id: str, thread: str | None,
                           fork_seq: int, now: float) -> tuple[list[str], list[str]]:
    """Mark discarded every branch grown from ``thread`` at or after ``fork_seq`` (or
    folded into it after that point), with all their descendants (a branch of the thread
    that is kept keeps its children, however late); the caller's transaction.

    Returns:
        The ids discarded (in creation order), and those of them that were active.
    """
    later = [(row[0], row[1]) for row in conn.execute(
        "WITH RECURSIVE grown (branch_id, status, fork_seq) AS ("
        "  SELECT branch_id, status, fork_seq FROM branches WHERE session_id = ? "
        "  AND parent_branch_id IS ? AND (fork_seq >= ? OR fold_seq > ?)"
        "  UNION ALL SELECT b.branch_id, b.status, b.fork_seq FROM branches b "
        "  JOIN grown ON b.parent_branch_id = grown.branch_id) "
        "SELECT branch_id, status FROM grown WHERE status != 'discarded' ORDER BY fork_seq",
        (session_id, thread, fork_seq, fork_seq))]
    ids = [branch_id for branch_id, _ in later]
    for chunk in chunks(ids):
        conn.execute(
            f"UPDATE branches SET status = 'discarded', return_reason = 'rolled_back', "
            f"returned_at = coalesce(returned_at, ?) "
            f"WHERE branch_id IN ({','.join('?' * len(chunk))})", (now, *chunk))
    return ids, [branch_id for branch_id, status in later if status == "active"]


def folded_tokens(conn: apsw.Connection, session_id: str) -> int:
    """Tokens of every branch of the session that folded and was not rolled back."""
    return scalar_int(conn, "SELECT coalesce(sum(tokens_folded), 0) FROM branches "
                      "WHERE session_id = ? AND status != 'discarded' "
                      "AND fold_seq IS NOT NULL", (session_id,))


def thread_chain(conn: apsw.Connection, branch_id: str | None) -> list[tuple[str | None, int]]:
    """The threads a branch's rendered context is made of, outermost first: each with the
    seq it is read up to (its child's fork), ending with the branch itself (read whole).
    ``branch_id`` None is the main thread alone."""
    chain: list[tuple[str | None, int]] = []
    upto = 1 << 62
    current = branch_id
    while current is not None:
        parent: Any
        fork_seq: Any
        parent, fork_seq = conn.execute(
            "SELECT parent_branch_id, fork_seq FROM branches WHERE branch_id = ?",
            (current,)).fetchall()[0]
        chain.append((current, upto))
        current, upto = parent, fork_seq
    chain.append((None, upto))
    return chain[::-1]

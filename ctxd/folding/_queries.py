"""SQL of the ``branches`` and ``memory_candidates`` tables; every function runs in the store
thread."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import apsw
import msgspec

from ctxd.folding._state import BranchRecord
from ctxd.sessions import _queries as session_queries
from ctxd.sessions._state import SessionRecord
from ctxd.store import scalar_int
from ctxd.wire.types import COMPONENTS, BranchInfo, Component, Content

_decode_content = msgspec.json.Decoder(Content).decode

_LIVE_COLUMNS = ("id, session_id, parent_id, depth, description, budget, tokens_used, "
                 "operations, warned, timeout_s, created_at, deadline_at, fork_seq, "
                 "prefix_tokens")
_INFO_COLUMNS = (_LIVE_COLUMNS + ", status, return_reason, returned_at, result, fold_seq, "
                 "tokens_folded, tokens_saved, secrets_scrubbed")


def insert_branch(conn: apsw.Connection, branch: BranchRecord, prompt: str,
                  session: SessionRecord,
                  opening: Sequence[session_queries.MessageRow]) -> None:
    """A new branch row, its opening messages, the session's counters."""
    conn.execute(
        "INSERT INTO branches (id, session_id, parent_id, depth, description, prompt, budget, "
        "tokens_used, operations, warned, timeout_s, created_at, deadline_at, fork_seq, "
        "prefix_tokens) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (branch.branch_id, branch.session_id, branch.parent_id, branch.depth,
         branch.description, prompt, branch.budget, branch.tokens_used, branch.operations,
         int(branch.warned), branch.timeout_s, branch.created_at, branch.deadline_at,
         branch.fork_seq, branch.prefix_tokens))
    session_queries.insert_messages(conn, opening)
    session_queries.save_counters(conn, session)


def save_meter(conn: apsw.Connection, branch: BranchRecord) -> None:
    """A live branch's budget meter; the caller's transaction."""
    conn.execute("UPDATE branches SET tokens_used = ?, operations = ?, warned = ? WHERE id = ?",
                 (branch.tokens_used, branch.operations, int(branch.warned), branch.branch_id))


def append_to_branch(conn: apsw.Connection, session: SessionRecord, branch: BranchRecord,
                     rows: Sequence[session_queries.MessageRow]) -> None:
    """Messages appended to a branch: the rows, the branch's meter, the session's seq."""
    session_queries.insert_messages(conn, rows)
    save_meter(conn, branch)
    session_queries.save_counters(conn, session)


def _blob(value: object) -> bytes:
    assert isinstance(value, bytes)
    return value


def _live(row: Sequence[Any], deadline: float) -> BranchRecord:
    return BranchRecord(
        branch_id=row[0], session_id=row[1], parent_id=row[2], depth=row[3],
        description=row[4], budget=row[5], tokens_used=row[6], operations=row[7],
        warned=bool(row[8]), timeout_s=row[9], created_at=row[10], deadline_at=row[11],
        deadline=deadline, fork_seq=row[12], prefix_tokens=row[13])


def live_branches(conn: apsw.Connection, session_id: str) -> list[BranchRecord]:
    """The session's active branches, oldest first; ``deadline`` is left at 0 for the caller
    to put on trio's clock."""
    rows = conn.execute(f"SELECT {_LIVE_COLUMNS} FROM branches WHERE session_id = ? "
                        "AND status = 'active' ORDER BY fork_seq", (session_id,)).fetchall()
    return [_live(row, 0.0) for row in rows]


def sessions_with_live_branches(conn: apsw.Connection) -> list[str]:
    return [row[0] for row in conn.execute(
        "SELECT DISTINCT session_id FROM branches WHERE status = 'active'")]


def count_live_branches(conn: apsw.Connection) -> int:
    return scalar_int(conn, "SELECT count(*) FROM branches WHERE status = 'active'")


def session_of(conn: apsw.Connection, branch_id: str) -> str | None:
    rows = conn.execute("SELECT session_id FROM branches WHERE id = ?", (branch_id,)).fetchall()
    return str(rows[0][0]) if rows else None


def _info(row: Sequence[Any]) -> BranchInfo:
    live = _live(row, 0.0)
    (status, return_reason, returned_at, result, fold_seq, tokens_folded, tokens_saved,
     secrets_scrubbed) = row[14:]
    return BranchInfo(
        branch_id=live.branch_id, session_id=live.session_id, parent_branch_id=live.parent_id,
        depth=live.depth, description=live.description, status=status,
        return_reason=return_reason, budget=live.budget, budget_used=live.tokens_used,
        budget_remaining=max(0, live.budget - live.tokens_used),
        operations_count=live.operations, timeout_seconds=live.timeout_s,
        created_at=live.created_at, deadline=live.deadline_at, time_left_s=None,
        fork_seq=live.fork_seq, returned_at=returned_at, result=result, fold_seq=fold_seq,
        tokens_folded=tokens_folded, tokens_saved=tokens_saved,
        secrets_scrubbed=secrets_scrubbed)


def branch_info(conn: apsw.Connection, branch_id: str) -> BranchInfo | None:
    rows = conn.execute(f"SELECT {_INFO_COLUMNS} FROM branches WHERE id = ?",
                        (branch_id,)).fetchall()
    return _info(rows[0]) if rows else None


def list_branches(conn: apsw.Connection, session_id: str) -> list[BranchInfo]:
    """Every branch of a session, in creation order."""
    return [_info(row) for row in conn.execute(
        f"SELECT {_INFO_COLUMNS} FROM branches WHERE session_id = ? ORDER BY fork_seq",
        (session_id,))]


def recent_work(conn: apsw.Connection, branch_id: str, recent: int = 3
                ) -> tuple[Content | None, list[tuple[str, Content]]]:
    """A branch's last assistant message, and its last ``recent`` messages appended by the
    client (oldest first): what a forced return builds its partial result from."""
    last = conn.execute(
        "SELECT content FROM messages WHERE branch_id = ? AND role = 'assistant' "
        "AND discarded = 0 ORDER BY seq DESC LIMIT 1", (branch_id,)).fetchall()
    rows = conn.execute(
        "SELECT role, content FROM messages WHERE branch_id = ? AND discarded = 0 "
        "AND meta IS NOT ? ORDER BY seq DESC LIMIT ?",
        (branch_id, OPENING_META, recent)).fetchall()
    return (_decode_content(_blob(last[0][0])) if last else None,
            [(role, _decode_content(content)) for role, content in reversed(rows)])


OPENING_META = msgspec.json.encode({"ctxd": "branch_opening"})
"""The ``meta`` of the note and prompt that open a branch."""


@dataclass(frozen=True)
class Fold:
    """Everything one fold writes."""

    branch_id: str
    status: str
    return_reason: str | None
    returned_at: float
    result: str
    fold_seq: int
    tokens_folded: int
    tokens_saved: int
    secrets_scrubbed: int
    fold_row: session_queries.MessageRow
    memory_candidate: tuple[str, str, str, str, str, float, str] | None


def fold(conn: apsw.Connection, done: Fold, session: SessionRecord,
         parent: BranchRecord | None) -> None:
    """Close a branch and give its parent the fold message, in one transaction."""
    conn.execute(
        "UPDATE branches SET status = ?, return_reason = ?, returned_at = ?, result = ?, "
        "fold_seq = ?, tokens_folded = ?, tokens_saved = ?, secrets_scrubbed = ? WHERE id = ?",
        (done.status, done.return_reason, done.returned_at, done.result, done.fold_seq,
         done.tokens_folded, done.tokens_saved, done.secrets_scrubbed, done.branch_id))
    session_queries.insert_messages(conn, [done.fold_row])
    if parent is not None:
        save_meter(conn, parent)
    session_queries.save_counters(conn, session)
    if done.memory_candidate is not None:
        conn.execute("INSERT INTO memory_candidates (session_id, branch_id, title, content, "
                     "outcome, created_at, scope) VALUES (?,?,?,?,?,?,?)",
                     done.memory_candidate)


@dataclass(frozen=True)
class Discarded:
    """What a rollback marked as discarded."""

    branch_ids: list[str]
    messages: int
    tokens_recovered: int
    thread_tokens: dict[Component, int]
    thread_messages: int
    thread_operations: int
    folded_tokens: int


def _chunks(ids: Sequence[str], size: int = 500) -> list[tuple[str, ...]]:
    """Ids in groups small enough to bind (SQLite limits the variables of a statement)."""
    return [tuple(ids[i:i + size]) for i in range(0, len(ids), size)]


def _sum_over(conn: apsw.Connection, sql: str, ids: Sequence[str]) -> int:
    """``sql`` (one integer, with ``{}`` for the id list) summed over groups of ids."""
    return sum(scalar_int(conn, sql.format(",".join("?" * len(chunk))), chunk)
               for chunk in _chunks(ids))


def rollback(conn: apsw.Connection, session_id: str, thread: str | None, fork_seq: int,
             now: float) -> Discarded:
    """Discard what came after ``fork_seq`` in a thread: its later messages, and every later
    branch grown from it (with all their messages). Kept in the archive, marked
    ``discarded``; the caller's transaction.

    Returns:
        What was discarded, and what it took from live threads (the thread's own messages
        and those of branches that were still active).
    """
    # The thread's branches forked at or after the point, or folded into it after the point
    # (their fold is discarded with the thread's later messages), and all their
    # descendants (a branch of the thread that is kept keeps its children, however late).
    later = [(row[0], row[1]) for row in conn.execute(
        "WITH RECURSIVE grown (id, status, fork_seq) AS ("
        "  SELECT id, status, fork_seq FROM branches WHERE session_id = ? AND parent_id IS ?"
        "  AND (fork_seq >= ? OR fold_seq > ?)"
        "  UNION ALL SELECT b.id, b.status, b.fork_seq FROM branches b "
        "  JOIN grown ON b.parent_id = grown.id) "
        "SELECT id, status FROM grown WHERE status != 'discarded' ORDER BY fork_seq",
        (session_id, thread, fork_seq, fork_seq))]
    ids = [branch_id for branch_id, _ in later]
    active = [branch_id for branch_id, status in later if status == "active"]
    by_component: dict[Component, int] = dict.fromkeys(COMPONENTS, 0)
    thread_messages = thread_operations = 0
    for component, role, tokens in conn.execute(
            "SELECT component, role, tokens FROM messages WHERE session_id = ? "
            "AND branch_id IS ? AND seq > ? AND discarded = 0", (session_id, thread, fork_seq)):
        by_component[component] += tokens
        thread_messages += 1
        thread_operations += role == "assistant"
    recovered = sum(by_component.values()) + _sum_over(
        conn, "SELECT coalesce(sum(tokens), 0) FROM messages WHERE discarded = 0 AND "
        "branch_id IN ({})", active)
    discarded = thread_messages + _sum_over(
        conn, "SELECT count(*) FROM messages WHERE discarded = 0 AND branch_id IN ({})", ids)
    for chunk in _chunks(ids):
        marks = ",".join("?" * len(chunk))
        conn.execute(f"UPDATE messages SET discarded = 1 WHERE branch_id IN ({marks})", chunk)
        conn.execute(
            f"UPDATE branches SET status = 'discarded', return_reason = 'rolled_back', "
            f"returned_at = coalesce(returned_at, ?) WHERE id IN ({marks})", (now, *chunk))
    conn.execute("UPDATE messages SET discarded = 1 WHERE session_id = ? AND branch_id IS ? "
                 "AND seq > ?", (session_id, thread, fork_seq))
    folded = scalar_int(conn, "SELECT coalesce(sum(tokens_folded), 0) FROM branches "
                        "WHERE session_id = ? AND status != 'discarded' "
                        "AND fold_seq IS NOT NULL", (session_id,))
    return Discarded(branch_ids=ids, messages=discarded, tokens_recovered=recovered,
                     thread_tokens=by_component, thread_messages=thread_messages,
                     thread_operations=thread_operations, folded_tokens=folded)


def context_rows(conn: apsw.Connection, session_id: str,
                 branch_id: str | None) -> list[tuple[Any, ...]]:
    """The rows ``ctxd.render`` sends for a thread: for the main thread its kept messages;
    for a branch, its parent's rendered prefix (up to the branch's fork) and then the
    branch's own messages — recursively up to the main thread."""
    chain: list[tuple[str | None, int]] = []
    upto = 1 << 62
    current = branch_id
    while current is not None:
        parent: Any
        fork_seq: Any
        parent, fork_seq = conn.execute("SELECT parent_id, fork_seq FROM branches WHERE id = ?",
                                        (current,)).fetchall()[0]
        chain.append((current, upto))
        current, upto = parent, fork_seq
    chain.append((None, upto))
    rows: list[tuple[Any, ...]] = []
    for thread, through in reversed(chain):
        rows.extend(session_queries.thread_messages(conn, session_id, thread, through))
    return rows

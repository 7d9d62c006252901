"""SQL of ``memories``, ``memories_fts``, ``memory_signals``, ``memory_index_state`` and
``memory_candidates`` (lessons queued by returned branches); every function runs in the
store thread."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import apsw

from ctxd.memory._lexical import LexicalHits, LexicalIndex
from ctxd.store import scalar_int
from ctxd.wire.types import SHARED_SCOPES, MemoryItem

PRIOR_RECORDED = (4.0, 1.0)
"""Beta(alpha, beta) of a recorded memory: confidence 0.8, worth five signals."""
PRIOR_DISTILLED = (3.0, 2.0)
"""Beta(alpha, beta) of a memory extracted from a branch: confidence 0.6."""
SIGNAL_WEIGHTS = {"feedback": 1.0, "outcome": 1.0, "use": 0.1}
"""How much one signal moves alpha (positive) or beta (negative)."""

_COLUMNS = ("id, scope, title, description, content, outcome, tags, alpha, beta, "
            "usage_count, source, created_at, updated_at")


def confidence(alpha: float, beta: float) -> float:
    """The mean of Beta(alpha, beta)."""
    return alpha / (alpha + beta)


def embedding_text(title: str, description: str, content: str, tags: str) -> str:
    """What is embedded (and searched) for a memory."""
    return "\n".join(part for part in (title, description, content, tags) if part)


def _item(row: Sequence[Any]) -> MemoryItem:
    (memory_id, scope, title, description, content, outcome, tags, alpha, beta, usage_count,
     source, created_at, updated_at) = row
    return MemoryItem(
        id=memory_id, scope=scope, title=title, description=description, content=content,
        outcome=outcome, tags=tags.split() if tags else [],
        confidence=round(confidence(alpha, beta), 6), usage_count=usage_count, source=source,
        created_at=created_at, updated_at=updated_at)


def _bump_generation(conn: apsw.Connection) -> int:
    conn.execute("UPDATE memory_index_state SET generation = generation + 1")
    return scalar_int(conn, "SELECT generation FROM memory_index_state")


def index_generation(conn: apsw.Connection) -> tuple[int, int]:
    """(generation, number of memories): what the FAISS index must match."""
    return (scalar_int(conn, "SELECT generation FROM memory_index_state"),
            scalar_int(conn, "SELECT count(*) FROM memories"))


def last_memory_id(conn: apsw.Connection) -> int:
    """The highest memory id now (0: none)."""
    return scalar_int(conn, "SELECT coalesce(max(id), 0) FROM memories")


def texts_after(conn: apsw.Connection, after_id: int, limit: int, until_id: int
                ) -> list[tuple[int, str]]:
    """(id, embedding text) of memories after an id and up to ``until_id``, in id order
    (for a rebuild)."""
    return [(row[0], embedding_text(row[1], row[2], row[3], row[4])) for row in conn.execute(
        "SELECT id, title, description, content, tags FROM memories WHERE id > ? AND id <= ? "
        "ORDER BY id LIMIT ?", (after_id, until_id, limit))]


@dataclass(frozen=True)
class NewMemory:
    scope: str
    title: str
    description: str
    content: str
    outcome: str
    tags: str
    prior: tuple[float, float]
    source: str | None
    created_at: float
    content_tokens: int | None = None
    """The content's tokens as injection shows them (None: counted when first injected)."""


def insert(conn: apsw.Connection, mirror: LexicalIndex, memory: NewMemory
           ) -> tuple[MemoryItem, int]:
    """A new memory; returns it and the new index generation."""
    conn.execute(
        "INSERT INTO memories (scope, title, description, content, outcome, tags, alpha, beta, "
        "source, created_at, updated_at, content_tokens) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
        (memory.scope, memory.title, memory.description, memory.content, memory.outcome,
         memory.tags, *memory.prior, memory.source, memory.created_at, memory.created_at,
         memory.content_tokens))
    item = get(conn, conn.last_insert_rowid())
    assert item is not None
    mirror.added(conn, item.id)
    return item, _bump_generation(conn)


def get(conn: apsw.Connection, memory_id: int) -> MemoryItem | None:
    rows = conn.execute(f"SELECT {_COLUMNS} FROM memories WHERE id = ?",
                        (memory_id,)).fetchall()
    return _item(rows[0]) if rows else None


def by_ids(conn: apsw.Connection, memory_ids: Sequence[int], scope: str | None = None,
           min_confidence: float = 0.0) -> dict[int, tuple[MemoryItem, int | None]]:
    """The memories among ``memory_ids`` that pass the scope and confidence filters: what
    SQLite says, whatever the lexical mirror or a selection said; each with its content's
    tokens as injection shows them (None: not counted yet)."""
    clause, bindings = _scope_clause(scope, by_id=True)
    found: dict[int, tuple[MemoryItem, int | None]] = {}
    for start in range(0, len(memory_ids), 500):
        chunk = tuple(memory_ids[start:start + 500])
        for row in conn.execute(
                f"SELECT {_COLUMNS}, content_tokens FROM memories m WHERE m.id IN "
                f"({','.join('?' * len(chunk))}){clause} "
                "AND m.alpha / (m.alpha + m.beta) >= ? - 1e-9",
                (*chunk, *bindings, min_confidence)):
            found[row[0]] = (_item(row[:-1]), row[-1])
    return found


def keep_content_tokens(conn: apsw.Connection, counted: dict[int, tuple[int, str]]) -> None:
    """Keep the content tokens that injection counted (memory id: (tokens, the content
    they are of)), where SQLite has none: for the same content, as a reused id may not."""
    for memory_id, (tokens, content) in counted.items():
        conn.execute("UPDATE memories SET content_tokens = ? WHERE id = ? AND content = ? "
                     "AND content_tokens IS NULL", (tokens, memory_id, content))


def tokens_encoding(conn: apsw.Connection) -> str | None:
    """The encoding the kept content tokens were counted with (None: none yet)."""
    kept: list[Any] = conn.execute("SELECT tokens_encoding FROM memory_index_state").fetchall()
    return kept[0][0] if kept else None


def count_tokens_with(conn: apsw.Connection, encoding: str) -> None:
    """Make the kept content tokens those of ``encoding``: when they were counted with
    another, forget them (injection counts them again, once each)."""
    if tokens_encoding(conn) == encoding:
        return
    conn.execute("UPDATE memories SET content_tokens = NULL WHERE content_tokens IS NOT NULL")
    conn.execute("UPDATE memory_index_state SET tokens_encoding = ?", (encoding,))


def delete(conn: apsw.Connection, mirror: LexicalIndex, memory_id: int) -> int | None:
    """Delete a memory (its signals cascade); the new generation, or None if unknown. A
    shared memory's deletion goes to the team outbox (one not yet in the team database
    only loses its pending record)."""
    shared: list[Any] = conn.execute(
        "SELECT remote_id FROM team_mirror WHERE memory_id = ?", (memory_id,)).fetchall()
    if shared:
        stage_outbox(conn, {"kind": "delete", "remote_id": shared[0][0]}, None, time.time())
    mirror.removing(conn, memory_id)
    conn.execute("DELETE FROM memories WHERE id = ?", (memory_id,))
    if conn.changes() == 0:
        return None
    return _bump_generation(conn)


def record_use(conn: apsw.Connection, mirror: LexicalIndex, used: dict[int, str],
               source: str, now: float) -> None:
    """A use signal for each memory injected into a branch (memory id: the content it
    showed), in the caller's transaction; only where the memory still holds that content,
    as a memory deleted since may have left its id to a new one."""
    for memory_id, content in used.items():
        _move(conn, mirror, memory_id, "use", True, source, now, content)


def signal(conn: apsw.Connection, mirror: LexicalIndex, memory_id: int, kind: str,
           positive: bool, source: str | None, now: float) -> MemoryItem | None:
    """Record a signal and move the memory's Beta(alpha, beta); the memory after it, or
    None if the memory is unknown."""
    if not _move(conn, mirror, memory_id, kind, positive, source, now):
        return None
    return get(conn, memory_id)


def _move(conn: apsw.Connection, mirror: LexicalIndex, memory_id: int, kind: str,
          positive: bool, source: str | None, now: float, content: str | None = None
          ) -> bool:
    """Record a signal and move the memory's Beta(alpha, beta), in SQLite and in the
    mirror; False if the memory is unknown (or, given ``content``, holds another)."""
    weight = SIGNAL_WEIGHTS[kind]
    same, bindings = ("", ()) if content is None else (" AND content = ?", (content,))
    alpha, beta, uses = weight if positive else 0.0, 0.0 if positive else weight, int(
        kind == "use")
    moved: list[Any] = conn.execute(
        "UPDATE memories SET alpha = alpha + ?, beta = beta + ?, "
        f"usage_count = usage_count + ?, updated_at = ? WHERE id = ?{same} "
        "RETURNING alpha, beta, scope", (alpha, beta, uses, now, memory_id, *bindings)
    ).fetchall()
    if not moved:
        return False
    conn.execute("INSERT INTO memory_signals (memory_id, kind, positive, weight, source, "
                 "created_at) VALUES (?,?,?,?,?,?)",
                 (memory_id, kind, int(positive), weight, source, now))
    if moved[0][2].startswith(SHARED_SCOPES):  # the team database adds it up too
        stage_outbox(conn, {"kind": "signal", "alpha": alpha, "beta": beta, "uses": uses},
                     memory_id, now)
    mirror.rated(memory_id, confidence(*moved[0][:2]))
    return True


def stage_outbox(conn: apsw.Connection, operation: dict[str, Any], memory_id: int | None,
                 now: float) -> None:
    """An entry of the team outbox (docs/decisions.md, "Team memory"), in the caller's
    transaction: the write to a shared scope it stands for commits with it."""
    conn.execute("INSERT INTO team_outbox (operation, memory_id, created_at) VALUES (?, ?, ?)",
                 (json.dumps(operation), memory_id, now))


GLOBAL = "global"




# Confidence filters allow for rounding: sums of 0.1 (use signals) are not exact.
def _scope_clause(scope: str | None, by_id: bool = False) -> tuple[str, tuple[Any, ...]]:
    """A project scope sees its own memories, the shared ones (team and org: a store
    mirrors only its team's) and the global ones; a shared scope itself and the global
    ones; "global" only its own. ``by_id``: the query reads listed ids, so the scope is
    tested on each row found by its rowid (``+``: not through ``memories_by_scope``,
    which SQLite would otherwise probe once per id and scope, 25% slower for an
    injection's 26 ids)."""
    column = "+m.scope" if by_id else "m.scope"
    if scope is None:
        return "", ()
    if scope == "global":
        return f" AND {column} = 'global'", ()
    if scope.startswith(SHARED_SCOPES):
        return f" AND {column} IN (?, 'global')", (scope,)
    shared = " OR ".join(f"({column} >= '{prefix}' AND {column} < '{prefix[:-1]};')"
                         for prefix in SHARED_SCOPES)
    return f" AND ({column} IN (?, 'global') OR {shared})", (scope,)


def list_memories(conn: apsw.Connection, scope: str | None, after_id: int,
                  limit: int) -> list[MemoryItem]:
    clause, bindings = _scope_clause(scope)
    return [_item(row) for row in conn.execute(
        f"SELECT {_COLUMNS} FROM memories m WHERE m.id > ?{clause} ORDER BY m.id LIMIT ?",
        (after_id, *bindings, limit))]


_FTS_WORD = re.compile(r"[^\W_]+", re.UNICODE)
STOPWORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further
had has have having he her here hers herself him himself his how i if in into is it its
itself just me more most my myself no nor not now of off on once only or other our ours
ourselves out over own same she should so some such than that the their theirs them
themselves then there these they this those through to too under until up very was we were
what when where which while who whom why will with would you your yours yourself yourselves
""".split())
"""Words too common to say which memory is meant (they only add noise to an OR query)."""


def query_words(text: str) -> list[str]:
    """The words of free text a lexical query ORs (at most 64), without stop words unless
    the text has nothing else."""
    words = list(dict.fromkeys(word.lower() for word in _FTS_WORD.findall(text)))
    return ([word for word in words if word not in STOPWORDS] or words)[:64]


def fts_query(words: Sequence[str]) -> str:
    """Words as an FTS5 OR query (each quoted: no operator can slip in)."""
    return " OR ".join(f'"{word}"' for word in words)


def lexical(conn: apsw.Connection, mirror: LexicalIndex, query: str, scope: str | None,
            min_confidence: float, limit: int) -> LexicalHits:
    """The best lexical matches by BM25, filtered: from the in-memory mirror of the FTS5
    index once it is loaded, else from FTS5 (the same scores)."""
    words = query_words(query)
    if not words:
        return LexicalHits([], 0)
    if mirror.ready and (terms := mirror.terms(conn, words)) is not None:
        return mirror.search(terms, scope, min_confidence, limit)
    clause, bindings = _scope_clause(scope)
    return LexicalHits([(row[0], -row[1]) for row in conn.execute(
        "SELECT m.id, bm25(memories_fts) AS rank FROM memories_fts "
        "JOIN memories m ON m.id = memories_fts.rowid "
        f"WHERE memories_fts MATCH ?{clause} AND m.alpha / (m.alpha + m.beta) >= ? - 1e-9 "
        "ORDER BY rank LIMIT ?", (fts_query(words), *bindings, min_confidence, limit))], 0)


def allowed(conn: apsw.Connection, memory_ids: Sequence[int], scope: str | None,
            min_confidence: float) -> set[int]:
    """The ids among ``memory_ids`` that pass the scope and confidence filters."""
    clause, bindings = _scope_clause(scope, by_id=True)
    kept: set[int] = set()
    for start in range(0, len(memory_ids), 500):
        chunk = tuple(memory_ids[start:start + 500])
        kept.update(row[0] for row in conn.execute(
            f"SELECT m.id FROM memories m WHERE m.id IN ({','.join('?' * len(chunk))})"
            f"{clause} AND m.alpha / (m.alpha + m.beta) >= ? - 1e-9",
            (*chunk, *bindings, min_confidence)))
    return kept


@dataclass(frozen=True)
class MemoryCandidate:
    """A lesson from a returned branch, queued for `promote_candidates`."""

    session_id: str
    branch_id: str
    title: str
    content: str
    outcome: str
    created_at: float
    scope: str


def queue_candidate(conn: apsw.Connection, candidate: MemoryCandidate) -> None:
    """Queue a memory candidate; the caller's transaction."""
    conn.execute("INSERT INTO memory_candidates (session_id, branch_id, title, content, "
                 "outcome, created_at, scope) VALUES (?,?,?,?,?,?,?)",
                 (candidate.session_id, candidate.branch_id, candidate.title,
                  candidate.content, candidate.outcome, candidate.created_at, candidate.scope))


def promote_candidates(conn: apsw.Connection, mirror: LexicalIndex, limit: int = 100
                       ) -> list[tuple[MemoryItem, int, str]]:
    """Turn queued memory candidates into memories (confidence 0.6), in the scope their
    session's project had when the branch returned; returns each with the generation after
    it and the session its branch was in."""
    made = []
    rows: list[Any] = conn.execute(
        "SELECT id, title, content, outcome, created_at, branch_id, scope, session_id "
        "FROM memory_candidates ORDER BY id LIMIT ?", (limit,)).fetchall()
    for (candidate_id, title, content, outcome, created_at, branch_id, scope,
         session_id) in rows:
        item, generation = insert(conn, mirror, NewMemory(
            scope=scope or GLOBAL, title=title, description="", content=content,
            outcome=outcome, tags="", prior=PRIOR_DISTILLED, source=branch_id,
            created_at=created_at))
        made.append((item, generation, session_id))
        conn.execute("DELETE FROM memory_candidates WHERE id = ?", (candidate_id,))
    return made


def delivered(conn: apsw.Connection, session_id: str) -> set[int]:
    """The memories given to a session whose context still holds them."""
    return {row[0] for row in conn.execute(
        "SELECT memory_id FROM memory_deliveries WHERE session_id = ?", (session_id,))}


def forget_delivered(conn: apsw.Connection, session_id: str) -> None:
    """The session's context was compacted: what it was given may be given again."""
    conn.execute("DELETE FROM memory_deliveries WHERE session_id = ?", (session_id,))


def record_delivered(conn: apsw.Connection, session_id: str, memory_ids: list[int],
                     now: float) -> None:
    """Remember the memories given to a session (in the caller's transaction)."""
    conn.executemany(
        "INSERT INTO memory_deliveries (session_id, memory_id, delivered_at) VALUES (?, ?, ?) "
        "ON CONFLICT (session_id, memory_id) DO UPDATE SET delivered_at = excluded.delivered_at",
        [(session_id, memory_id, now) for memory_id in memory_ids])

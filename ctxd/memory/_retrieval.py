"""Hybrid retrieval: FTS5 BM25 and FAISS, fused by weighted reciprocal rank."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import apsw
import trio

from ctxd.config import MemoryConfig
from ctxd.jobs import Slot
from ctxd.memory import _queries as q
from ctxd.memory._index import MemoryIndex
from ctxd.memory._lexical import LexicalHits, LexicalIndex, Selection
from ctxd.memory._search import DenseUnavailable, Found
from ctxd.store import Store
from ctxd.wire.types import Leg, MemoryItem, SearchMode

MIN_CANDIDATES = 50
"""Each leg proposes at least this many candidates to the fusion."""


@dataclass(frozen=True)
class Ranked:
    """One fused result."""

    item: MemoryItem
    score: float
    legs: list[Leg]
    content_tokens: int | None
    """The content's tokens as injection shows them (None: not counted yet)."""


@dataclass(frozen=True)
class Retrieved:
    ranked: list[Ranked]
    legs_used: list[Leg]
    note: str | None


def fuse(legs: dict[Leg, Sequence[int]], weights: dict[Leg, float], rrf_k: int
         ) -> list[tuple[int, float, list[Leg]]]:
    """Weighted reciprocal rank fusion: score = Σ weight / (rrf_k + rank), rank from 1.

    Returns:
        (id, score, legs that found it), best first; ties broken by id.
    """
    scores: dict[int, float] = {}
    found: dict[int, list[Leg]] = {}
    for leg, ids in legs.items():
        for rank, memory_id in enumerate(ids, start=1):
            scores[memory_id] = scores.get(memory_id, 0.0) + weights[leg] / (rrf_k + rank)
            found.setdefault(memory_id, []).append(leg)
    return sorted(((i, s, found[i]) for i, s in scores.items()), key=lambda t: (-t[1], t[0]))


async def _dense(store: Store, index: MemoryIndex, query: str, selection: Selection | None,
                 scope: str | None, min_confidence: float, wanted: int, min_score: float
                 ) -> list[int]:
    """The dense leg's ids that pass the filters (and ``min_score``).

    FAISS searches within the selection of the memories that pass; without one (the
    lexical mirror is loading), it is asked for 16 times as many and SQLite's filter keeps
    those that pass."""
    if selection is not None:
        found = await index.search(query, wanted, selection)
        return [memory_id for memory_id, score in found if score >= min_score]
    found = await index.search(query, 16 * wanted)
    ids = [memory_id for memory_id, score in found if score >= min_score]
    kept = await store.read(q.allowed, ids, scope, min_confidence)
    return [memory_id for memory_id in ids if memory_id in kept][:wanted]


def reachable(k: int, weights: dict[Leg, float], rrf_k: int, ranked: int) -> int:
    """How many of the lexical leg's ``ranked`` best memories can be among the ``k`` best
    fused: one at lexical rank r scores at most w_l / (rrf_k + r) + w_d / (rrf_k + 1), and
    each of the lexical leg's k best at least w_l / (rrf_k + k)."""
    lexical, dense = weights["lexical"], weights["dense"]
    if lexical <= 0.0:
        return 0
    short = lexical / (rrf_k + k) - dense / (rrf_k + 1)
    if short <= 0.0:
        return ranked  # the dense leg alone can lift any of them
    # w_l / (rrf_k + r) >= short  <=>  r <= w_l / short - rrf_k
    return min(ranked, max(k, int(lexical / short - rrf_k + 1e-9)))


async def retrieve(store: Store, mirror: LexicalIndex, index: MemoryIndex,
                   config: MemoryConfig, query: str, *, scope: str | None, k: int,
                   min_confidence: float, mode: SearchMode) -> Retrieved:
    """The best ``k`` memories for ``query`` by the mode's legs, filtered by scope and
    confidence. When the dense leg is not available, the lexical leg answers alone and the
    note says why."""
    wanted = max(MIN_CANDIDATES, 4 * k)
    found: dict[Leg, Sequence[int]] = {}
    notes: dict[Leg, str] = {}
    selection: Selection | None = None
    weights: dict[Leg, float] = {"lexical": config.lexical_weight,
                                 "dense": config.dense_weight}
    # The memories the lexical leg's store job reads back at once: those its ranking can
    # bring into the k best, so that reading the results seldom takes a store job of its
    # own. Each is read with the scope and confidence filters, as any result is.
    prefetch = reachable(k, weights, config.rrf_k, wanted)
    read: dict[int, tuple[MemoryItem, int | None]] = {}
    tried: set[int] = set()
    if mode != "lexical":
        # On the loop: the store's thread is about to be busy with the lexical leg.
        selection = mirror.selection(scope, min_confidence)
    # A query embedded with the GIL held (hashing) is embedded in the lexical leg's store
    # job, which starts FAISS in the index's thread and ranks while it searches. Embedded
    # in a worker thread beside the ranking, the embedding and the ranking took turns
    # with the GIL: at p50 the embedding did not start before the ranking was over, and
    # FAISS then ran alone after both (see docs/performance.md).
    beside: tuple[Slot[Found], Selection] | None = None
    if (mode == "hybrid" and selection is not None and index.embedder.gil_bound
            and index.state == "ready"):
        beside = (Slot(), selection)

    def lexical_and_items(conn: apsw.Connection) -> LexicalHits:
        if beside is not None:
            index.search_beside(beside[0], query, wanted, beside[1])
        hits = q.lexical(conn, mirror, query, scope, min_confidence, wanted)
        ids = [memory_id for memory_id, _ in hits.hits[:prefetch]]
        read.update(q.by_ids(conn, ids, scope, min_confidence))
        tried.update(ids)
        return hits

    async def dense_leg() -> None:
        try:
            if beside is not None:  # started by the lexical leg's job
                found["dense"] = [memory_id for memory_id, score in await beside[0].wait()
                                  if score >= config.dense_min_score]
            else:
                found["dense"] = await _dense(store, index, query, selection, scope,
                                              min_confidence, wanted, config.dense_min_score)
        except DenseUnavailable as exc:
            notes["dense"] = f"dense leg unavailable ({exc}); lexical results only"

    async def lexical_leg() -> None:
        lexical = await store.read(lexical_and_items)
        found["lexical"] = [memory_id for memory_id, _ in lexical.hits]
        if lexical.words_left_out:
            notes["lexical"] = (f"the lexical ranking left out the query's "
                                f"{lexical.words_left_out} commonest words (a long query: "
                                "their postings are too many)")

    if beside is not None:
        await lexical_leg()
        await dense_leg()
    elif mode != "lexical":
        # The dense leg (the query's embedding and FAISS, in one worker thread) beside
        # the lexical leg (in the store's thread).
        failures: list[Exception] = []

        async def catching(leg: Callable[[], Awaitable[None]]) -> None:
            try:
                await leg()
            except Exception as exc:  # raised below as itself, not in an ExceptionGroup
                failures.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(catching, dense_leg)
            if mode == "hybrid":
                nursery.start_soon(catching, lexical_leg)
        if failures:
            raise failures[0]
    if (mode != "dense" and "lexical" not in found) or not found:
        await lexical_leg()
    legs = {leg: found[leg] for leg in ("dense", "lexical") if leg in found}
    note = "; ".join(notes[leg] for leg in ("dense", "lexical") if leg in notes) or None
    if len(legs) == 1:
        weights = {leg: 1.0 for leg in legs}
    fused = fuse(legs, weights, config.rrf_k)[:k]
    items = {memory_id: read[memory_id] for memory_id, _, _ in fused if memory_id in read}
    if missing := [memory_id for memory_id, _, _ in fused if memory_id not in tried]:
        items.update(await store.read(q.by_ids, missing, scope, min_confidence))
    return Retrieved(ranked=preferred([
        Ranked(items[memory_id][0], round(score, 8), found, items[memory_id][1])
        for memory_id, score, found in fused if memory_id in items]),
        legs_used=list(legs), note=note)


SCOPE_PREFERENCE = {"project": 0, "team": 1, "org": 2, "global": 3}
"""Which of two memories of equal score comes first: the nearer scope's."""


def preferred(ranked: list[Ranked]) -> list[Ranked]:
    """Best first; of equal scores the nearer scope first (project, team, org, global),
    then as they came (docs/protocol.md, Scopes)."""
    return sorted(ranked, key=lambda r: (-r.score,
                                         SCOPE_PREFERENCE.get(r.item.scope.split(":")[0], 4)))

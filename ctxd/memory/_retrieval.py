"""Hybrid retrieval: FTS5 BM25 and FAISS, fused by weighted reciprocal rank (DESIGN §9)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ctxd.config import MemoryConfig
from ctxd.memory import _queries as q
from ctxd.memory._index import DenseUnavailable, MemoryIndex
from ctxd.memory._lexical import LexicalIndex
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


async def _dense(store: Store, mirror: LexicalIndex, index: MemoryIndex, query: str,
                 scope: str | None, min_confidence: float, wanted: int, min_score: float
                 ) -> list[int]:
    """The dense leg's ids that pass the filters (and ``min_score``).

    FAISS searches within the mirror's selection of the memories that pass; while the
    mirror is loading, it is asked for more until SQLite's filter keeps enough."""
    vector = await index.embed_query(query)
    selection = await store.read(lambda _: mirror.selection(scope, min_confidence))
    if selection is not None:
        found = await index.search(vector, wanted, selection)
        return [memory_id for memory_id, score in found if score >= min_score]
    asked = wanted
    while True:
        found = await index.search(vector, asked)
        ids = [memory_id for memory_id, score in found if score >= min_score]
        kept = await store.read(q.allowed, ids, scope, min_confidence)
        ranked = [memory_id for memory_id in ids if memory_id in kept]
        if (len(ranked) >= wanted or len(found) < asked or len(ids) < len(found)
                or asked >= 16 * wanted):
            return ranked[:wanted]
        asked *= 4


async def retrieve(store: Store, mirror: LexicalIndex, index: MemoryIndex,
                   config: MemoryConfig, query: str, *, scope: str | None, k: int,
                   min_confidence: float, mode: SearchMode) -> Retrieved:
    """The best ``k`` memories for ``query`` by the mode's legs, filtered by scope and
    confidence. When the dense leg is not available, the lexical leg answers alone and the
    note says why."""
    wanted = max(MIN_CANDIDATES, 4 * k)
    legs: dict[Leg, Sequence[int]] = {}
    notes = []
    if mode in ("hybrid", "dense"):
        try:
            legs["dense"] = await _dense(store, mirror, index, query, scope, min_confidence,
                                         wanted, config.dense_min_score)
        except DenseUnavailable as exc:
            notes.append(f"dense leg unavailable ({exc}); lexical results only")
    if mode in ("hybrid", "lexical") or "dense" not in legs:
        lexical = await store.read(q.lexical, mirror, query, scope, min_confidence, wanted)
        legs["lexical"] = [memory_id for memory_id, _ in lexical.hits]
        if lexical.words_left_out:
            notes.append(f"the lexical ranking left out the query's {lexical.words_left_out} "
                         "commonest words (a long query: their postings are too many)")
    note = "; ".join(notes) or None
    weights: dict[Leg, float] = {"lexical": config.lexical_weight,
                                 "dense": config.dense_weight}
    if len(legs) == 1:
        weights = {leg: 1.0 for leg in legs}
    fused = fuse(legs, weights, config.rrf_k)[:k]
    items = await store.read(q.by_ids, [memory_id for memory_id, _, _ in fused])
    return Retrieved(
        ranked=[Ranked(items[memory_id], round(score, 8), found)
                for memory_id, score, found in fused if memory_id in items],
        legs_used=list(legs), note=note)

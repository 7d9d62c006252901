"""Fusion by weighted reciprocal rank, and which lexical results can reach the fused best."""

import random

from ctxd.memory._retrieval import Ranked, fuse, preferred, reachable
from ctxd.wire.types import MemoryItem


def test_fusion_adds_weighted_reciprocal_ranks_and_breaks_ties_by_id() -> None:
    fused = fuse({"lexical": [7, 3, 9], "dense": [3, 5]}, {"lexical": 1.0, "dense": 0.25}, 10)
    assert fused == [(3, 1 / 12 + 0.25 / 11, ["lexical", "dense"]),
                     (7, 1 / 11, ["lexical"]), (9, 1 / 13, ["lexical"]),
                     (5, 0.25 / 12, ["dense"])]
    tied = fuse({"lexical": [4], "dense": [2]}, {"lexical": 1.0, "dense": 1.0}, 10)
    assert [memory_id for memory_id, _, _ in tied] == [2, 4]


def test_only_the_reachable_lexical_results_make_the_fused_best() -> None:
    assert reachable(10, {"lexical": 1.0, "dense": 0.25}, 10, 50) == 26
    assert reachable(5, {"lexical": 1.0, "dense": 0.25}, 10, 50) == 12
    assert reachable(5, {"lexical": 1.0, "dense": 0.25}, 10, 8) == 8
    assert reachable(5, {"lexical": 0.0, "dense": 1.0}, 10, 50) == 0
    assert reachable(5, {"lexical": 1.0, "dense": 1.0}, 10, 50) == 50  # any, with dense help
    rng = random.Random(3)
    for _ in range(3000):
        k = rng.choice([1, 5, 10])
        weights = {"lexical": 1.0, "dense": rng.choice([0.1, 0.25, 0.5, 1.0])}
        rrf_k = rng.choice([1, 10, 60])
        lexical = rng.sample(range(1000), 50)
        dense = rng.sample(lexical[:rng.randint(0, 50)] + list(range(1000, 1050)), 50)
        best = [memory_id for memory_id, _, _ in fuse(
            {"lexical": lexical, "dense": dense}, weights, rrf_k)[:k]]
        ranks = [lexical.index(memory_id) + 1 for memory_id in best if memory_id in lexical]
        limit = reachable(k, weights, rrf_k, len(lexical))
        if limit < len(lexical):  # no dense find alone can make the best k
            assert all(memory_id in lexical for memory_id in best)
        assert max(ranks, default=0) <= limit


def test_of_equal_scores_the_nearer_scope_comes_first() -> None:
    def ranked(memory_id: int, scope: str, score: float) -> Ranked:
        return Ranked(MemoryItem(id=memory_id, scope=scope, title="t", description="",
                                 content="c", outcome="success", tags=[], confidence=0.8,
                                 usage_count=0, source=None, created_at=0.0, updated_at=0.0),
                      score, ["lexical"], None)

    found = [ranked(1, "global", 0.5), ranked(2, "org:acme", 0.5), ranked(3, "team:pay", 0.5),
             ranked(4, "project:app", 0.5), ranked(5, "global", 0.9), ranked(6, "team:pay", 0.5)]
    assert [r.item.id for r in preferred(found)] == [5, 4, 3, 6, 2, 1]

"""The approximate index's codes: a byte a dimension on the fixed range of unit vectors, so
that no component is clipped, whatever the vectors it was trained on."""

from pathlib import Path

import numpy as np
import pytest

from ctxd.memory import CODES, HashingEmbedder, _build
from ctxd.memory._build import Builder, NextIndex, train_sample
from ctxd.memory._embedders import normalise
from ctxd.memory._faiss import faiss


def _spread(count: int, dim: int) -> np.ndarray:
    """Unit vectors whose components are all small (about 1/√dim), as long memories'."""
    return normalise(np.random.default_rng(7).normal(size=(count, dim)).astype(np.float32))


def test_a_component_beyond_the_training_vectors_is_not_clipped() -> None:
    dim = 64
    builder = Builder(Path("unused.faiss"), HashingEmbedder(dim), None,  # type: ignore[arg-type]
                      ann_threshold=10, nprobe=4)
    sample = _spread(400, dim)
    assert float(np.abs(sample).max()) < 0.6
    index = builder.trained(sample, 4)
    assert index.sq.qtype == CODES
    assert index.code_size == dim  # a byte a dimension
    one_word = np.zeros((2, dim), np.float32)  # a memory of one feature: a component of ±1
    one_word[0, 5], one_word[1, 9] = 1.0, -1.0
    index.add_with_ids(np.concatenate([sample, one_word]), np.arange(402, dtype=np.int64))
    scores, ids = index.search(one_word, 1)
    assert ids[:, 0].tolist() == [400, 401]
    assert scores[:, 0] == pytest.approx([1.0, 1.0], abs=2 / 255)
    # A range learnt from the sample, as faiss makes it, would have clipped them.
    learnt = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(dim), dim, 4, CODES,
                                           faiss.METRIC_INNER_PRODUCT)
    learnt.train(sample)
    learnt.add_with_ids(one_word, np.arange(2, dtype=np.int64))
    learnt.nprobe = 4
    clipped, _ = learnt.search(one_word, 1)
    assert float(clipped.max()) < 0.8  # clipped to the top of the learnt range


@pytest.mark.parametrize(("count", "sample"), [
    (5_000, 5_000), (100_000, 100_000), (200_000, 100_000), (1_000_000, 156_000)])
def test_an_ivf_learns_its_lists_from_a_bounded_sample(count: int, sample: int) -> None:
    # All of them up to 100,000; past that 100,000, or 39 for each of its lists (4·√n).
    assert train_sample(count) == sample


def test_a_next_index_takes_over_what_changed_meanwhile_in_batches(
        monkeypatch: pytest.MonkeyPatch) -> None:
    dim = 64
    monkeypatch.setattr(_build, "CATCH_UP_BATCH", 3)
    builder = Builder(Path("unused.faiss"), HashingEmbedder(dim), None,  # type: ignore[arg-type]
                      ann_threshold=10, nprobe=4)
    vectors = _spread(60, dim)
    index = builder.trained(vectors, 4)
    index.add_with_ids(vectors[:40], np.arange(1, 41, dtype=np.int64))  # built: ids 1-40
    changed = NextIndex()
    changed.indexed(list(range(41, 51)), vectors[40:50])  # recorded meanwhile
    changed.indexed([7], vectors[55:56])  # 7's text changed
    changed.dropped([12, 45])
    assert {v.dtype for v in changed.added.values()} == {np.dtype(np.float16)}
    assert changed.catch_up(index, 40) == 50
    assert index.ntotal == 40 + 10 - 2  # 7 replaced, 12 and 45 gone
    index.nprobe = 4  # every list: the search is exhaustive
    for memory_id, vector in [(46, vectors[45]), (7, vectors[55]), (40, vectors[39])]:
        scores, ids = index.search(vector[None, :], 1)
        assert (int(ids[0, 0]), round(float(scores[0, 0]), 2)) == (memory_id, 1.0)
    _, ids = index.search(vectors[11][None, :], 60)
    assert {12, 45} & set(ids[0].tolist()) == set()

"""The approximate index's codes: a byte a dimension on the fixed range of unit vectors, so
that no component is clipped, whatever the vectors it was trained on."""

from pathlib import Path

import numpy as np
import pytest

from ctxd.memory import CODES, HashingEmbedder
from ctxd.memory._build import Builder, train_sample
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

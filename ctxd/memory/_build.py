"""Making the memory index: its kind (exact, or IVF past ``ann_threshold``) and lists, a build
from SQLite, the next index made while the one in place answers, and the index file.

The file is saved atomically (temp file + rename) with the store's memory *generation*, the
embedder's signature and the file's SHA-256 beside it, in a ``.json``; at start a file whose
generation, signature, checksum or size does not match is not loaded (the owner rebuilds it:
faiss reads a file with damaged vectors without complaint, and searches with them). An
approximate index is an IVF that keeps the ids in its inverted lists and its vectors in a
byte per dimension.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import trio

from ctxd.memory import _queries as q
from ctxd.memory._embedders import Embedder, Vectors
from ctxd.memory._faiss import faiss
from ctxd.store import Store

log = logging.getLogger("ctxd.memory")
REBUILD_BATCH = 512
REGROW = 1.5
"""An approximate index is rebuilt, while it keeps answering, once its memories call for
this many times the lists it was built with (`lists_for`): when they have grown 2.25
times (1.5 times while the lists are bound by 39 memories each). Its lists were learnt
from the memories it was built with; grown tenfold past them, its lists held ten times
the memories and a search took five times as long."""
CODES = faiss.ScalarQuantizer.QT_8bit_uniform
"""How the approximate index keeps its vectors: a byte per dimension, on one range for all
of them, fixed at [-1, 1] (`CODE_RANGE`; see docs/decisions.md): 1 GB at a million
memories of 1,024 dimensions, where 16-bit floats took 2 GB."""
CODE_RANGE = (-1.0, 2.0)
"""(lowest value, width): every embedder's vectors have unit length, so no component lies
outside [-1, 1], and none is ever clipped, whatever the memories the index was trained
on (a range learnt from them clipped those recorded later)."""


def fix_code_range(index: Any) -> None:
    """Set an approximate index's code range to `CODE_RANGE` (after its training, before
    any vector is added)."""
    faiss.copy_array_to_vector(np.asarray(CODE_RANGE, np.float32), index.sq.trained)


TRAIN_MAX = 100_000
"""An approximate index's lists are learnt from at most this many memories (or 39 a list,
what faiss asks, if more), spread over the ids: up to 100,000 from all of them, as
before; at a million, training on all of them (k-means of 4,000 lists over 1,000,000
vectors of 1,024 dimensions) would take hours on two cores."""


def train_sample(count: int) -> int:
    """How many of ``count`` memories an approximate index is trained on."""
    return min(count, max(TRAIN_MAX, 39 * lists_for(count)))


def lists_for(count: int) -> int:
    """The inverted lists of an approximate index of ``count`` memories: about 4·√n, each
    trained with at least 39 points (what faiss asks), at least one."""
    return max(1, min(int(4 * math.sqrt(count)), count // 39))


def file_digest(path: Path) -> str:
    """The SHA-256 of a file, in hex (blocking)."""
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def describe(index: Any) -> str:
    """The index's kind, for the log."""
    return f"{index.nlist} lists" if isinstance(index, faiss.IndexIVF) else "exact"


def _current_kind(index: Any) -> bool:
    """Whether an approximate index keeps its vectors as `Builder.build` makes it now."""
    return (isinstance(index, faiss.IndexIVFScalarQuantizer) and index.sq.qtype == CODES
            and tuple(faiss.vector_to_array(index.sq.trained).tolist()) == CODE_RANGE)


CATCH_UP_BATCH = 4_096
"""Vectors a next index takes over in one add (`NextIndex.catch_up`)."""


class NextIndex:
    """What the owner changed in the index in place while the next one was being made from
    SQLite, for the next one to take over.

    The vectors are kept in 16 bits (2 KB each at 1,024 dimensions, not 4): a team's
    catch-up mirrors thousands of memories a second while a next index of half a million
    is being built, and all of them wait here. 16-bit floats hold a unit vector's
    components to about 1e-4, far finer than the byte a dimension of the approximate
    index they go into (and than a cosine's ranking needs, should deletions have made
    the next index exact).
    """

    def __init__(self) -> None:
        self.added: dict[int, npt.NDArray[np.float16]] = {}
        """Memory id → vector of those the owner indexed meanwhile."""
        self.removed: set[int] = set()
        """Those the owner removed meanwhile."""

    def indexed(self, ids: Sequence[int], vectors: Vectors) -> None:
        for memory_id, vector in zip(ids, vectors.astype(np.float16), strict=True):
            self.added[memory_id] = vector
            self.removed.discard(memory_id)

    def dropped(self, ids: Sequence[int]) -> None:
        for memory_id in ids:
            self.added.pop(memory_id, None)
            self.removed.add(memory_id)

    def catch_up(self, index: Any, max_id: int) -> int:
        """Bring the next ``index`` (whose highest id is ``max_id``) up to date with what
        changed (blocking); returns its highest id now."""
        if self.removed:
            index.remove_ids(np.asarray(sorted(self.removed), np.int64))
        if self.added:
            ids = np.asarray(list(self.added), np.int64)
            if int(ids.min()) <= max_id:  # read from SQLite too (changed since)
                index.remove_ids(ids[ids <= max_id])
            vectors = list(self.added.values())
            for start in range(0, len(ids), CATCH_UP_BATCH):  # no copy of them all at once
                index.add_with_ids(
                    np.stack(vectors[start:start + CATCH_UP_BATCH]).astype(np.float32),
                    ids[start:start + CATCH_UP_BATCH])
            max_id = max(max_id, int(ids.max()))
        return max_id


class Builder:
    """Makes the index and keeps its file.

    Args:
        path: the index file (a ``.json`` beside it holds its generation and signature).
        embedder: turns texts into vectors.
        store: the database, to build from.
        ann_threshold: above this many vectors a build makes an approximate index.
        nprobe: inverted lists searched by the approximate index.
    """

    def __init__(self, path: Path, embedder: Embedder, store: Store, ann_threshold: int,
                 nprobe: int):
        self.path = path
        self._embedder = embedder
        self._store = store
        self._ann_threshold = ann_threshold
        self._nprobe = nprobe

    async def embed(self, texts: Sequence[str]) -> Vectors:
        """The texts' vectors, embedded in a worker thread.

        Raises:
            EmbedderError: the embedder failed.

        Cancellation: the thread is abandoned (it changes nothing), so an endpoint that
        holds its answer or a model that takes long does not hold up a shutdown.
        """
        return await trio.to_thread.run_sync(self._embedder.embed_sync, texts,
                                             abandon_on_cancel=True)

    def outgrown(self, index: Any) -> bool:
        """An exact index that has grown past ``ann_threshold``, or an approximate one past
        `REGROW` times its lists: its next should be approximate, with lists for its
        memories now."""
        count = int(index.ntotal)
        if isinstance(index, faiss.IndexIVF):
            return lists_for(count) >= REGROW * index.nlist
        return count > self._ann_threshold

    async def from_store(self, abandon_on_cancel: bool = False) -> tuple[int, int, int, Any]:
        """(generation, memories, highest id, index): a new index of every memory in
        SQLite when it starts, read and embedded in batches that are added as they come,
        so that only the index is held, not every vector beside it (at a million
        memories, 4 GB of 32-bit vectors, and as much again to join them, with the
        index's 2 GB). An approximate index is first trained on a sample
        (`train_sample`). Memories recorded once it started are not read: its caller
        keeps them meanwhile (`MemoryIndex`'s pending ones, or a `NextIndex`), where
        reading them too embedded each twice and, in a team's catch-up that records
        thousands a second, chased them for as long. Faiss's work runs in worker threads,
        left to finish alone when cancelled with ``abandon_on_cancel`` (the daemon need
        not wait for it to stop).

        Raises:
            EmbedderError: the embedder failed.
            CtxdError: the store failed.
            RuntimeError: faiss failed.
        """
        generation, count, last_id = await self._store.read(
            lambda conn: (*q.index_generation(conn), q.last_memory_id(conn)))
        max_id = 0
        if count > self._ann_threshold:
            ids, sample, every = await self._sample(count, train_sample(count), last_id)
            index = await trio.to_thread.run_sync(self.trained, sample, lists_for(count),
                                                  abandon_on_cancel=abandon_on_cancel)
            if every == 1 and len(ids):  # the sample is every memory: embedded once
                await trio.to_thread.run_sync(index.add_with_ids, sample, ids,
                                              abandon_on_cancel=abandon_on_cancel)
                max_id = int(ids[-1])
            del sample
        else:
            index = faiss.IndexIDMap2(faiss.IndexFlatIP(self._embedder.dim))
        while True:
            rows = await self._store.read(q.texts_after, max_id, REBUILD_BATCH, last_id)
            if not rows:
                break
            vectors = await self.embed([text for _, text in rows])
            ids = np.fromiter((row_id for row_id, _ in rows), np.int64, len(rows))
            await trio.to_thread.run_sync(index.add_with_ids, vectors, ids,
                                          abandon_on_cancel=abandon_on_cancel)
            max_id = rows[-1][0]
        return generation, count, max_id, index

    async def _sample(self, count: int, wanted: int, last_id: int
                      ) -> tuple[npt.NDArray[np.int64], Vectors, int]:
        """(ids, vectors, k): ``wanted`` memories spread evenly over the ids up to
        ``last_id`` (every k-th; with k 1, every memory)."""
        every = max(1, count // wanted)
        ids: list[int] = []
        parts: list[Vectors] = []
        after = 0
        while True:
            rows = await self._store.read(q.texts_after, after, REBUILD_BATCH * every,
                                          last_id)
            if not rows:
                break
            taken = rows[::every]
            ids.extend(row_id for row_id, _ in taken)
            parts.append(await self.embed([text for _, text in taken]))
            after = rows[-1][0]
        return (np.asarray(ids, np.int64),
                np.concatenate(parts) if parts
                else np.zeros((0, self._embedder.dim), np.float32), every)

    def trained(self, sample: Vectors, lists: int) -> Any:
        """An empty approximate index of ``lists`` inverted lists learnt from ``sample``
        (blocking)."""
        dim = self._embedder.dim
        # IVF keeps the ids itself. Wrapped in an IndexIDMap2 its deletes would go wrong:
        # the map compacts its positions, the inverted lists do not.
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFScalarQuantizer(quantizer, dim, lists, CODES,
                                              faiss.METRIC_INNER_PRODUCT)
        index.train(sample)
        fix_code_range(index)
        index.nprobe = self._nprobe
        quantizer.this.disown()  # type: ignore[attr-defined]
        index.own_fields = True
        return index

    def load(self, generation: int, count: int) -> tuple[Any, int] | None:
        """(index, its highest id) from the file (blocking), or None when there is none or
        it is not the index of the store's ``generation`` and ``count`` memories by this
        embedder (or of an older kind)."""
        meta_path = self.path.with_suffix(".json")
        try:
            meta = json.loads(meta_path.read_text())
            if not isinstance(meta, dict):
                raise ValueError(f"{meta_path} does not hold an object")
            if (meta.get("generation"), meta.get("signature")) != (
                    generation, self._embedder.signature):
                log.info("memory index file is stale; rebuilding")
                return None
            digest = file_digest(self.path)
            if digest != meta.get("sha256"):
                log.warning("memory index file %s is corrupt (its checksum is %s, %s says "
                            "%s); rebuilding", self.path, digest[:16], meta_path.name,
                            str(meta.get("sha256"))[:16])
                return None
            index = faiss.read_index(str(self.path))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("memory index file unreadable (%s); rebuilding", exc)
            return None
        if isinstance(index, faiss.IndexIVF) and not _current_kind(index):
            log.info("memory index file is an IVF of an older kind; rebuilding")
            return None
        if index.ntotal != count or index.d != self._embedder.dim:
            log.warning("memory index file holds %d vectors for %d memories; rebuilding",
                        index.ntotal, count)
            return None
        if isinstance(index, faiss.IndexIVF):
            index.nprobe = self._nprobe
        return index, int(meta.get("max_id", 1 << 62))  # unknown: remove before each add

    def save(self, index: Any, generation: int, max_id: int) -> None:
        """Write the index and its meta, each atomically (blocking).

        Raises:
            OSError: the file could not be written.
            RuntimeError: faiss failed.
        """
        temporary = self.path.with_suffix(".tmp")
        faiss.write_index(index, str(temporary))
        digest = file_digest(temporary)
        os.replace(temporary, self.path)
        meta = self.path.with_suffix(".json")
        meta_temporary = meta.with_suffix(".json.tmp")
        meta_temporary.write_text(json.dumps({"generation": generation,
                                              "signature": self._embedder.signature,
                                              "count": int(index.ntotal),
                                              "max_id": max_id,
                                              "sha256": digest}))
        os.replace(meta_temporary, meta)

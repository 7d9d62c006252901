"""MemoryIndex: the FAISS index of memory vectors, owned by one task (DESIGN §2, §9).

The owner task loads, rebuilds, changes and saves the index, one job at a time, its
blocking work in worker threads. Searches do not queue behind those jobs: each embeds its
query and searches FAISS in a worker thread of its own (or, for a `gil_bound` embedder,
embeds it in the store's thread and searches in the index's search thread: see
`search_beside`), under a lock that the owner's changes (adds, removals) take too.

SQLite is the truth; this index is a cache of it. Ids are the memories' rowids, vectors are
normalised, so inner product is cosine similarity. The index is saved atomically (temp
file + rename) with the store's memory *generation* (bumped by every write that changes
what is indexed) and the embedder's signature; at start a file whose generation, signature
or size does not match the store is rebuilt from SQLite while the daemon keeps serving
(searches are lexical-only meanwhile, and say so). Past ``ann_threshold`` vectors the index
is rebuilt approximate (IVF, ``nprobe`` lists searched, ids kept in its inverted lists,
vectors as 16-bit floats).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import trio

# FAISS's OpenMP threads spin for a while after each parallel region by default, taking a
# core from the store's thread and the event loop (p99 of a 10k-memory search 13.5 ms
# instead of 2.6 ms on two cores). Read once, when libgomp loads with faiss.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import faiss

from ctxd.errors import CtxdError, ErrorCode
from ctxd.jobs import JobQueue, Slot
from ctxd.memory import _queries as q
from ctxd.memory._embedders import Embedder, EmbedderError, Vectors
from ctxd.memory._lexical import Selection
from ctxd.store import Store, WorkerThread

log = logging.getLogger("ctxd.memory")
IndexState = Literal["loading", "rebuilding", "ready", "unavailable"]
REBUILD_BATCH = 512
TICK_S = 5.0
"""How often the owner saves a changed index when idle."""
RETRY_S = 30.0
"""How soon an unavailable index (embedder or rebuild failed) is rebuilt again."""


REGROW = 1.5
"""An approximate index is rebuilt, while it keeps answering, once its memories call for
this many times the lists it was built with (`lists_for`): when they have grown 2.25
times (1.5 times while the lists are bound by 39 memories each). Its lists were learnt
from the memories it was built with; grown tenfold past them, its lists held ten times
the memories and a search took five times as long."""
BESIDE_START_S = 0.002
"""How long `search_beside` waits for FAISS to start before its caller goes on anyway."""
CODES = faiss.ScalarQuantizer.QT_fp16
"""How the approximate index keeps its vectors: 16-bit floats (half the memory of 32-bit
ones; see docs/decisions.md)."""


def lists_for(count: int) -> int:
    """The inverted lists of an approximate index of ``count`` memories: about 4·√n, each
    trained with at least 39 points (what faiss asks), at least one."""
    return max(1, min(int(4 * math.sqrt(count)), count // 39))


def _lists(index: Any) -> str:
    return f"{index.nlist} lists" if isinstance(index, faiss.IndexIVF) else "exact"


def _current_kind(index: Any) -> bool:
    """Whether an approximate index keeps its vectors as `_build` makes it now."""
    return (isinstance(index, faiss.IndexIVFScalarQuantizer)
            and index.sq.qtype == CODES)


def _stopping() -> CtxdError:
    return CtxdError(ErrorCode.OVERLOADED, "the memory index is stopping; retry",
                     {"fix": "retry once the daemon is back"})


class DenseUnavailable(Exception):
    """The dense leg cannot answer; the message says why."""


class MemoryIndex:
    """The dense leg of memory retrieval.

    Args:
        path: the index file (a ``.json`` beside it holds its generation and signature).
        embedder: turns texts into vectors.
        store: the database, to rebuild from.
        ann_threshold: above this many vectors a rebuild makes an approximate index.
        nprobe: inverted lists searched by the approximate index.
    """

    def __init__(self, path: Path, embedder: Embedder, store: Store, ann_threshold: int,
                 nprobe: int):
        self.path = path
        self.embedder = embedder
        self._store = store
        self._ann_threshold = ann_threshold
        self._nprobe = nprobe
        self._index: Any = None
        self._lock = threading.Lock()
        """Held by a search's FAISS call and by a change to the index (FAISS may not
        search an index while it changes)."""
        self.state: IndexState = "loading"
        self.reason: str | None = "the index is loading"
        self.generation = -1
        self._dirty = False
        self._pending: dict[int, tuple[str, int]] = {}
        self._embedder_loaded = False
        self._retry_at = 0.0
        self._max_id = 0
        """The highest id ever put in the index (an id above it is not there)."""
        self._regrowing = False
        """The next index is being made while this one answers (see `_regrow`)."""
        self._added_meanwhile: dict[int, Vectors] = {}
        """Memory id → vector of those the owner indexed meanwhile, for the next index."""
        self._removed_meanwhile: set[int] = set()
        """Those the owner removed meanwhile, for the next index."""
        self._regrow_after = 0.0
        self._rebuilds = 0
        """Rebuilds so far: a next index made before the last of them is not used."""
        self._searcher: WorkerThread | None = None
        """The thread of `search_beside` (started with its first search)."""
        self._jobs = JobQueue(64, _stopping)

    # ---- the owner task ------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[MemoryIndex] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Own the index: load (or rebuild) it, then serve jobs one at a time, saving it
        when it changed. Returns only when cancelled (after a last save)."""
        task_status.started(self)
        try:
            async with trio.open_nursery() as nursery:  # the next index's build (`_regrow`)
                await self._open()
                while True:
                    job = None
                    # Only the wait is timed: a job (a rebuild) may take as long as it needs.
                    with trio.move_on_after(TICK_S):
                        job = await self._jobs.receive()
                    if job is None:
                        await self._save_if_dirty()
                        if (self.state == "unavailable"
                                and trio.current_time() >= self._retry_at):
                            await self._rebuild()
                    else:
                        await job.run()
                    if self._outgrown():
                        self._regrowing = True
                        nursery.start_soon(self._regrow)
        finally:
            self._jobs.close()
            with trio.move_on_after(10, shield=True):
                await self._save_if_dirty()

    # ---- opening, rebuilding, saving ------------------------------------------------

    async def _load_embedder(self) -> bool:
        if self._embedder_loaded:
            return True
        try:
            await self.embedder.load()
        except EmbedderError as exc:
            self._unavailable(f"the embedder is unavailable: {exc}")
            return False
        self._embedder_loaded = True
        return True

    def _unavailable(self, reason: str) -> None:
        """Lexical-only until the rebuild that is retried every `RETRY_S` succeeds."""
        self.state, self.reason = "unavailable", reason
        self._pending.clear()  # the rebuild reads every memory from SQLite
        self._retry_at = trio.current_time() + RETRY_S
        log.error("memory: %s; searches are lexical only (retrying in %g s)", reason,
                  RETRY_S)

    async def _open(self) -> None:
        if not await self._load_embedder():
            return
        generation, count = await self._store.read(q.index_generation)
        loaded = await trio.to_thread.run_sync(self._load_file, generation, count)
        if loaded:
            self.generation, self.state, self.reason = generation, "ready", None
            log.info("memory index loaded: %d vectors", count)
            await self._apply_pending()
            return
        await self._rebuild()

    def _load_file(self, generation: int, count: int) -> bool:
        meta_path = self.path.with_suffix(".json")
        try:
            meta = json.loads(meta_path.read_text())
            if not isinstance(meta, dict):
                raise ValueError(f"{meta_path} does not hold an object")
            if (meta.get("generation"), meta.get("signature")) != (
                    generation, self.embedder.signature):
                log.info("memory index file is stale; rebuilding")
                return False
            index = faiss.read_index(str(self.path))
        except FileNotFoundError:
            return False
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("memory index file unreadable (%s); rebuilding", exc)
            return False
        if isinstance(index, faiss.IndexIVF) and not _current_kind(index):
            log.info("memory index file is an IVF of an older kind; rebuilding")
            return False
        if index.ntotal != count or index.d != self.embedder.dim:
            log.warning("memory index file holds %d vectors for %d memories; rebuilding",
                        index.ntotal, count)
            return False
        self._set_nprobe(index)
        self._index = index
        self._max_id = int(meta.get("max_id", 1 << 62))  # unknown: remove before each add
        return True

    def _outgrown(self) -> bool:
        """An exact index that has grown past ``ann_threshold``, or an approximate one past
        `REGROW` times its lists: rebuild it (approximate)."""
        if (self.state != "ready" or self._index is None or self._regrowing
                or trio.current_time() < self._regrow_after):
            return False
        count = int(self._index.ntotal)
        if isinstance(self._index, faiss.IndexIVF):
            return lists_for(count) >= REGROW * self._index.nlist
        return count > self._ann_threshold

    def _set_nprobe(self, index: Any) -> None:
        if isinstance(index, faiss.IndexIVF):
            index.nprobe = self._nprobe

    async def _rebuild(self) -> None:
        """Build a new index from SQLite, in batches; searches are lexical meanwhile.

        Any failure leaves the index unavailable (lexical-only) with the reason, and the
        rebuild is tried again later: the index is a cache, its failure never stops the
        daemon.
        """
        if not await self._load_embedder():
            return
        self.state, self.reason = "rebuilding", "the dense index is being rebuilt"
        self._rebuilds += 1
        try:
            generation, count, ids, index = await self._build_from_store()
        except (EmbedderError, CtxdError, RuntimeError, ValueError) as exc:
            # RuntimeError is how faiss reports its failures.
            self._unavailable(f"rebuilding the dense index failed: {exc}")
            return
        self._index = index
        self._max_id = max(ids, default=0)
        self.generation = generation
        self._dirty = True
        # Memories recorded while it was being built go in before it is called ready.
        while self._pending and self.state == "rebuilding":
            await self._apply_pending()
        if self.state != "rebuilding":
            return  # the pending ones could not be embedded: unavailable, retried later
        self.state, self.reason = "ready", None
        await self._save_if_dirty()
        log.info("memory index rebuilt: %d vectors (%d memories when it started)",
                 len(ids), count)

    async def _regrow(self) -> None:
        """Build the next index from SQLite while this one keeps answering, then put it in
        its place: the index has outgrown its kind or its lists (`_outgrown`).

        A task of its own: the owner goes on serving jobs meanwhile, so a memory recorded
        is indexed at once and a memory deleted removed at once, and it remembers them
        for the next index (`_added_meanwhile`, `_removed_meanwhile`), which takes them
        in the owner's job that puts it in place. Should the build fail, this index goes
        on answering and the build is tried again in `RETRY_S`.
        """
        rebuilds, before = self._rebuilds, _lists(self._index)
        try:
            _, count, ids, index = await self._build_from_store(abandon_on_cancel=True)
        except (EmbedderError, CtxdError, RuntimeError, ValueError) as exc:
            self._end_regrow()
            self._regrow_after = trio.current_time() + RETRY_S
            log.warning("rebuilding the grown memory index failed (%s); the current one "
                        "answers, retrying in %g s", exc, RETRY_S)
            return

        async def put_in_place() -> None:
            if self._rebuilds != rebuilds or self.state != "ready":
                self._end_regrow()  # a rebuild has made an index of its own since
                return
            added, removed = self._added_meanwhile, self._removed_meanwhile
            self._end_regrow()
            await trio.to_thread.run_sync(self._take_over, index, max(ids, default=0),
                                          added, removed)
            self._dirty = True
            log.info("memory index rebuilt as it grew: %d vectors, %s (was %s; %d memories "
                     "when it started)", index.ntotal, _lists(index), before, count)

        try:
            await self._jobs.submit(put_in_place)
        except CtxdError:
            self._end_regrow()  # the daemon is stopping

    def _take_over(self, index: Any, max_id: int, added: dict[int, Vectors],
                   removed: set[int]) -> None:
        """Bring the next index up to date with what changed while it was being made, and
        put it in place of this one."""
        if removed:
            index.remove_ids(np.asarray(sorted(removed), np.int64))
        if added:
            ids = np.asarray(list(added), np.int64)
            if int(ids.min()) <= max_id:  # read from SQLite too
                index.remove_ids(ids)
            index.add_with_ids(np.stack(list(added.values())), ids)
            max_id = max(max_id, int(ids.max()))
        with self._lock:
            self._index = index
            self._max_id = max_id

    def _end_regrow(self) -> None:
        self._regrowing = False
        self._added_meanwhile, self._removed_meanwhile = {}, set()

    async def _build_from_store(self, abandon_on_cancel: bool = False
                                ) -> tuple[int, int, list[int], Any]:
        """(generation, memories, ids, index): a new index of every memory in SQLite, read
        and embedded in batches, built in a worker thread (left to finish alone when
        cancelled, with ``abandon_on_cancel``: the daemon need not wait for it to stop)."""
        generation, count = await self._store.read(q.index_generation)
        ids: list[int] = []
        parts: list[Vectors] = []
        after = 0
        while True:
            rows = await self._store.read(q.texts_after, after, REBUILD_BATCH)
            if not rows:
                break
            ids.extend(row_id for row_id, _ in rows)
            parts.append(await self._embed([text for _, text in rows]))
            after = rows[-1][0]
        vectors = (np.concatenate(parts) if parts
                   else np.zeros((0, self.embedder.dim), np.float32))
        index = await trio.to_thread.run_sync(self._build, ids, vectors,
                                              abandon_on_cancel=abandon_on_cancel)
        return generation, count, ids, index

    def _build(self, ids: Sequence[int], vectors: Vectors) -> Any:
        dim = self.embedder.dim
        index: Any
        if len(ids) > self._ann_threshold:
            # IVF keeps the ids itself. Wrapped in an IndexIDMap2 its deletes would go
            # wrong: the map compacts its positions, the inverted lists do not.
            lists = lists_for(len(ids))
            quantizer = faiss.IndexFlatIP(dim)
            index = faiss.IndexIVFScalarQuantizer(quantizer, dim, lists, CODES,
                                                  faiss.METRIC_INNER_PRODUCT)
            index.train(vectors)
            index.nprobe = self._nprobe
            quantizer.this.disown()  # type: ignore[attr-defined]
            index.own_fields = True
        else:
            index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        if len(ids):
            index.add_with_ids(vectors, np.asarray(ids, dtype=np.int64))
        return index

    async def _save_if_dirty(self) -> None:
        if not self._dirty or self._index is None or self.state != "ready":
            return
        self._dirty = False
        try:
            await trio.to_thread.run_sync(self._save, self._index, self.generation)
        except (OSError, RuntimeError) as exc:
            # The file is a cache: a failed save costs a rebuild at the next start.
            log.warning("memory index not saved: %s", exc)
            self._dirty = True

    def _save(self, index: Any, generation: int) -> None:
        temporary = self.path.with_suffix(".tmp")
        faiss.write_index(index, str(temporary))
        os.replace(temporary, self.path)
        meta = self.path.with_suffix(".json")
        meta_temporary = meta.with_suffix(".json.tmp")
        meta_temporary.write_text(json.dumps({"generation": generation,
                                              "signature": self.embedder.signature,
                                              "count": int(index.ntotal),
                                              "max_id": self._max_id}))
        os.replace(meta_temporary, meta)

    # ---- jobs -----------------------------------------------------------------------

    async def add(self, memory_id: int, text: str, generation: int) -> None:
        """Index one memory whose row has committed (again, if its text changed).

        Waits until it is indexed when the index is ready; while it is being rebuilt the
        memory is queued and indexed right after the rebuild.
        """
        if self.state == "unavailable":
            return  # the next rebuild reads it from SQLite
        self._pending[memory_id] = (text, generation)
        if self.state == "ready":
            await self._jobs.submit(self._apply_pending)

    async def _apply_pending(self) -> None:
        if self.state not in ("ready", "rebuilding") or self._index is None or not self._pending:
            return
        pending, self._pending = self._pending, {}
        ids = list(pending)
        try:
            vectors = await self._embed([pending[i][0] for i in ids])
        except EmbedderError as exc:
            self._unavailable(f"{len(ids)} memories could not be embedded: {exc}")
            return
        await trio.to_thread.run_sync(self._replace, np.asarray(ids, dtype=np.int64),
                                      vectors)
        if self._regrowing:  # for the next index too
            for memory_id, vector in zip(ids, vectors, strict=True):
                self._added_meanwhile[memory_id] = vector
                self._removed_meanwhile.discard(memory_id)
        self._advance(max(generation for _, generation in pending.values()))

    def _replace(self, ids: Any, vectors: Vectors) -> None:
        with self._lock:
            # Removing costs a scan of the index; only ids it may hold already need it.
            if int(ids.min()) <= self._max_id:
                self._index.remove_ids(ids)
            self._index.add_with_ids(vectors, ids)
            self._max_id = max(self._max_id, int(ids.max()))

    def _remove(self, ids: Any) -> None:
        with self._lock:
            self._index.remove_ids(ids)

    async def remove(self, memory_ids: Sequence[int], generation: int) -> None:
        """Drop deleted memories from the index (one deleted during a rebuild may stay in
        it until the next: search results are always read back from SQLite)."""
        for memory_id in memory_ids:
            self._pending.pop(memory_id, None)
        if self.state != "ready":
            return

        async def job() -> None:
            if self.state != "ready":
                return
            ids = np.asarray(memory_ids, dtype=np.int64)
            await trio.to_thread.run_sync(self._remove, ids)
            if self._regrowing:  # for the next index too
                for memory_id in memory_ids:
                    self._added_meanwhile.pop(memory_id, None)
                    self._removed_meanwhile.add(memory_id)
            self._advance(generation)

        await self._jobs.submit(job)

    def _advance(self, generation: int) -> None:
        self.generation = max(self.generation, generation)
        self._dirty = True

    async def _embed(self, texts: Sequence[str]) -> Vectors:
        return await trio.to_thread.run_sync(self.embedder.embed_sync, texts)

    async def search(self, query: str, k: int, selection: Selection | None = None
                     ) -> list[tuple[int, float]]:
        """The ``k`` nearest memories to a query text as (id, cosine); with a selection,
        the ``k`` nearest among the ids it holds (FAISS skips the others). The query is
        embedded in the search's own worker thread, outside the lock: one hop, not two
        (0.4 ms less for a branch's injection at 100k memories), and a slow embedder
        does not hold up other searches.

        Raises:
            DenseUnavailable: the dense leg cannot answer now (and why).
        """
        index = self._ready()
        if index.ntotal == 0:
            return []

        def run() -> list[tuple[int, float]]:
            return self._search(index, self._embed_query(query), k, selection)

        return await trio.to_thread.run_sync(run)

    def search_beside(self, search: Slot[list[tuple[int, float]]], query: str, k: int,
                      selection: Selection) -> None:
        """Embed the query here and start its search (as `search`) in the index's search
        thread; return once FAISS is searching, which it does without the GIL, so that
        the caller's work goes on beside it. Only for a `gil_bound` embedder, whose
        embedding is quick: the caller is the store's thread (see _retrieval). The answer
        comes to ``search``.
        """
        try:
            index = self._ready()
            vector = self._embed_query(query)
        except DenseUnavailable as exc:
            search.fail(exc)
            return
        searching = threading.Event()

        def run() -> None:
            try:
                search.set(self._search(index, vector, k, selection, searching))
            except Exception as exc:  # handed to the task awaiting it
                search.fail(exc)
            finally:
                searching.set()

        if self._searcher is None:
            self._searcher = WorkerThread("ctxd-faiss")
        self._searcher.submit(run)
        # Not for long: an earlier search may still hold the search thread.
        searching.wait(BESIDE_START_S)

    def _ready(self) -> Any:
        """The index to search (a rebuild may replace it meanwhile: this one stays whole).

        Raises:
            DenseUnavailable: it is not ready (and why).
        """
        if self.state != "ready" or self._index is None:
            raise DenseUnavailable(self.reason or self.state)
        return self._index

    def _embed_query(self, query: str) -> Any:
        """The query's vector (blocking).

        Raises:
            DenseUnavailable: the embedder failed.
        """
        try:
            return self.embedder.embed_sync([query])[0]
        except EmbedderError as exc:
            raise DenseUnavailable(f"the query could not be embedded: {exc}") from exc

    def _search(self, index: Any, vector: Any, k: int, selection: Selection | None,
                searching: threading.Event | None = None) -> list[tuple[int, float]]:
        """One FAISS search, under the lock; ``searching`` is set once nothing but FAISS
        (or the lock) is left to wait for."""
        if index.ntotal == 0:
            return []
        parameters: Any = None
        selector: Any = None
        if selection is not None:
            if isinstance(index, faiss.IndexIVF):
                parameters = faiss.SearchParametersIVF()
                parameters.nprobe = self._nprobe
            else:
                parameters = faiss.SearchParameters()
            # Its length is in bytes. The bitmap (the caller's) and the selector (a local)
            # stay referenced until the search is over.
            selector = faiss.IDSelectorBitmap(len(selection), faiss.swig_ptr(selection))
            parameters.sel = selector
        query = vector[None, :]
        wanted = min(k, int(index.ntotal))
        if searching is None:
            self._lock.acquire()
        elif not self._lock.acquire(blocking=False):
            searching.set()  # an add or a removal holds it: the caller goes on meanwhile
            self._lock.acquire()
        try:
            if searching is not None:
                searching.set()  # FAISS lets the GIL go as it starts
            scores, ids = index.search(query, wanted, params=parameters)
        finally:
            self._lock.release()
        del selector
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0]

    async def rebuild(self) -> None:
        """Rebuild from SQLite now (memory.reindex, or after a failed add)."""
        await self._jobs.submit(self._rebuild)

    def statistics(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason,
                "vectors": 0 if self._index is None else int(self._index.ntotal),
                "generation": self.generation, "signature": self.embedder.signature}

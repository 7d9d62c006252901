"""MemoryIndex: the dense leg's FAISS index of memory vectors, owned by one task that loads,
rebuilds, changes and saves it, one job at a time.

The owner's blocking work runs in worker threads: building (and the index file) is
_build's, searching _search's. Searches do not queue behind the owner's jobs; they take
the lock that the owner's changes (adds, removals, a new index put in place) take too.

SQLite is the truth; this index is a cache of it. Ids are the memories' rowids, vectors are
normalised, so inner product is cosine similarity. The index is saved with the store's
memory *generation* (bumped by every write that changes what is indexed); at start a file
that does not match the store is rebuilt from SQLite while the daemon keeps serving
(searches are lexical-only meanwhile, and say so). Past ``ann_threshold`` vectors the index
is rebuilt approximate, and rebuilt again as it grows, while it answers (`_regrow`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec
import numpy as np
import trio

from ctxd.errors import CtxdError, shutting_down
from ctxd.jobs import JobQueue, Slot
from ctxd.memory import _queries as q
from ctxd.memory._build import Builder, NextIndex, describe
from ctxd.memory._embedders import Embedder, EmbedderError, Vectors
from ctxd.memory._heap import give_back_freed_memory
from ctxd.memory._lexical import Selection
from ctxd.memory._search import DenseUnavailable, Found, Searcher
from ctxd.store import Store

log = logging.getLogger("ctxd.memory")
IndexState = Literal["loading", "rebuilding", "ready", "unavailable"]
TICK_S = 5.0
"""How often the owner saves a changed index when idle."""
RETRY_S = 30.0
"""How soon an unavailable index (embedder or rebuild failed) is rebuilt again."""


def _stopping() -> CtxdError:
    return shutting_down("the memory index")


class IndexStatistics(msgspec.Struct, frozen=True):
    """What the index is doing, for daemon.status and memory.reindex."""

    state: IndexState
    reason: str | None
    """Why it is not ready, when it is not."""
    vectors: int
    generation: int
    """The memories' generation it holds (see `index_generation`)."""
    signature: str
    """The embedder's: a file made by another embedder is rebuilt."""


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
        self._builder = Builder(path, embedder, store, ann_threshold, nprobe)
        self._index: Any = None
        self._lock = threading.Lock()
        """Held by a search's FAISS call and by a change to the index (FAISS may not
        search an index while it changes)."""
        self._searcher = Searcher(embedder, nprobe, self._lock)
        self.state: IndexState = "loading"
        self.reason: str | None = "the index is loading"
        self.generation = -1
        self._dirty = False
        self._pending: dict[int, tuple[str, int]] = {}
        self._embedder_loaded = False
        self._retry_at = 0.0
        self._max_id = 0
        """The highest id ever put in the index (an id above it is not there)."""
        self._next: NextIndex | None = None
        """While the next index is being made (see `_regrow`): what changed meanwhile."""
        self._regrow_after = 0.0
        self._rebuilds = 0
        """Rebuilds so far: a next index made before the last of them is not used."""
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
                        self._next = NextIndex()
                        nursery.start_soon(self._regrow, self._next)
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
        loaded = await trio.to_thread.run_sync(self._builder.load, generation, count,
                                               abandon_on_cancel=True)
        if loaded is not None:
            self._index, self._max_id = loaded
            self.generation, self.state, self.reason = generation, "ready", None
            log.info("memory index loaded: %d vectors", count)
            await self._apply_pending()
            return
        await self._rebuild()

    def _outgrown(self) -> bool:
        """The index in place has outgrown its kind or its lists (`Builder.outgrown`) and
        no next index is being made: make one beside it."""
        return (self.state == "ready" and self._index is not None and self._next is None
                and trio.current_time() >= self._regrow_after
                and self._builder.outgrown(self._index))

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
        # Not searched while it is rebuilt (searches are lexical): let it go now, not
        # beside the new one (1 GB at a million memories). A search already running
        # holds its own reference.
        self._index = None
        try:
            generation, count, max_id, index = await self._builder.from_store()
        except (EmbedderError, CtxdError, RuntimeError, ValueError) as exc:
            # RuntimeError is how faiss reports its failures.
            self._unavailable(f"rebuilding the dense index failed: {exc}")
            return
        self._index = index
        self._max_id = max_id
        self.generation = generation
        self._dirty = True
        # Memories recorded while it was being built go in before it is called ready.
        while self._pending and self.state == "rebuilding":
            await self._apply_pending()
        if self.state != "rebuilding":
            return  # the pending ones could not be embedded: unavailable, retried later
        self.state, self.reason = "ready", None
        # Logged as it becomes ready, not after the save: whoever sees it ready (a test
        # reading the log) finds the line.
        log.info("memory index rebuilt: %d vectors (%d memories when it started)",
                 index.ntotal, count)
        await self._save_if_dirty()
        await trio.to_thread.run_sync(give_back_freed_memory)  # after: the file comes first

    async def _regrow(self, changed: NextIndex) -> None:
        """Build the next index from SQLite while this one keeps answering, then put it in
        its place: the index has outgrown its kind or its lists (`_outgrown`).

        A task of its own: the owner goes on serving jobs meanwhile, so a memory recorded
        is indexed at once and a memory deleted removed at once, and it remembers them
        for the next index (in ``changed``), which takes them in the owner's job that puts
        it in place. Should the build fail, this index goes on answering and the build is
        tried again in `RETRY_S`.
        """
        rebuilds, before = self._rebuilds, describe(self._index)
        try:
            _, count, max_id, index = await self._builder.from_store(abandon_on_cancel=True)
        except (EmbedderError, CtxdError, RuntimeError, ValueError) as exc:
            self._next = None
            self._regrow_after = trio.current_time() + RETRY_S
            log.warning("rebuilding the grown memory index failed (%s); the current one "
                        "answers, retrying in %g s", exc, RETRY_S)
            return

        async def put_in_place() -> None:
            self._next = None
            if self._rebuilds != rebuilds or self.state != "ready":
                return  # a rebuild has made an index of its own since
            await trio.to_thread.run_sync(self._take_over, index, max_id, changed)
            self._dirty = True
            log.info("memory index rebuilt as it grew: %d vectors, %s (was %s; %d memories "
                     "when it started)", index.ntotal, describe(index), before, count)
            await trio.to_thread.run_sync(give_back_freed_memory)

        try:
            await self._jobs.submit(put_in_place)
        except CtxdError:
            self._next = None  # the daemon is stopping

    def _take_over(self, index: Any, max_id: int, changed: NextIndex) -> None:
        """Bring the next index up to date with what changed while it was being made, and
        put it in place of this one."""
        max_id = changed.catch_up(index, max_id)
        with self._lock:
            self._index = index
            self._max_id = max_id

    async def _save_if_dirty(self) -> None:
        if not self._dirty or self._index is None or self.state != "ready":
            return
        self._dirty = False
        try:
            await trio.to_thread.run_sync(self._builder.save, self._index, self.generation,
                                          self._max_id)
        except (OSError, RuntimeError) as exc:
            # The file is a cache: a failed save costs a rebuild at the next start.
            log.warning("memory index not saved: %s", exc)
            self._dirty = True

    # ---- jobs -----------------------------------------------------------------------

    async def add(self, memory_id: int, text: str, generation: int) -> None:
        """Index one memory whose row has committed (again, if its text changed).

        Waits until it is indexed when the index is ready; while it is being rebuilt the
        memory is queued and indexed right after the rebuild.
        """
        await self.add_many([(memory_id, text)], generation)

    async def add_many(self, memories: Sequence[tuple[int, str]], generation: int) -> None:
        """`add` for several memories committed together: embedded and added in one job
        (a page of the team's memories mirrored at once)."""
        if self.state == "unavailable" or not memories:
            return  # the next rebuild reads them from SQLite
        for memory_id, text in memories:
            self._pending[memory_id] = (text, generation)
        if self.state == "ready":
            await self._jobs.submit(self._apply_pending)

    async def _apply_pending(self) -> None:
        if self.state not in ("ready", "rebuilding") or self._index is None or not self._pending:
            return
        pending, self._pending = self._pending, {}
        ids = list(pending)
        try:
            vectors = await self._builder.embed([pending[i][0] for i in ids])
        except EmbedderError as exc:
            self._unavailable(f"{len(ids)} memories could not be embedded: {exc}")
            return
        await trio.to_thread.run_sync(self._replace, np.asarray(ids, dtype=np.int64),
                                      vectors)
        if self._next is not None:  # for the next index too
            self._next.indexed(ids, vectors)
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
            if self._next is not None:  # for the next index too
                self._next.dropped(memory_ids)
            self._advance(generation)

        await self._jobs.submit(job)

    def _advance(self, generation: int) -> None:
        self.generation = max(self.generation, generation)
        self._dirty = True

    async def rebuild(self) -> None:
        """Rebuild from SQLite now (memory.reindex, or after a failed add)."""
        await self._jobs.submit(self._rebuild)

    # ---- searches (not jobs: see _search) -------------------------------------------

    async def search(self, query: str, k: int, selection: Selection | None = None
                     ) -> Found:
        """The ``k`` nearest memories to a query text as (id, cosine); with a selection,
        the ``k`` nearest among the ids it holds (`Searcher.search`).

        Raises:
            DenseUnavailable: the dense leg cannot answer now (and why).
        """
        return await self._searcher.search(self._ready(), query, k, selection)

    def search_beside(self, search: Slot[Found], query: str, k: int,
                      selection: Selection) -> None:
        """Embed the query here and start its search in the index's search thread
        (`Searcher.beside`); return once FAISS is searching. Only for a `gil_bound`
        embedder: the caller is the store's thread (see _retrieval). The answer, or
        `DenseUnavailable`, comes to ``search``.
        """
        try:
            index = self._ready()
        except DenseUnavailable as exc:
            search.fail(exc)
            return
        self._searcher.beside(search, index, query, k, selection)

    def _ready(self) -> Any:
        """The index to search (a rebuild may replace it meanwhile: this one stays whole).

        Raises:
            DenseUnavailable: it is not ready (and why).
        """
        if self.state != "ready" or self._index is None:
            raise DenseUnavailable(self.reason or self.state)
        return self._index

    def statistics(self) -> IndexStatistics:
        return IndexStatistics(state=self.state, reason=self.reason,
                               vectors=0 if self._index is None else int(self._index.ntotal),
                               generation=self.generation, signature=self.embedder.signature)

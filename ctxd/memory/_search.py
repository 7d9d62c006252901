"""Searching the memory index: a query's FAISS search, within a selection of ids, in a worker
thread of its own or in the index's search thread beside the store's job, under the lock
that the owner's changes to the index take too.

Searches do not queue behind the owner's jobs. A query is embedded in its search's own
worker thread; a `gil_bound` embedder's query is embedded in the store's thread, which
then starts its FAISS search in the index's search thread and ranks the lexical leg while
it runs (`Searcher.beside`; see _retrieval).
"""

from __future__ import annotations

import threading
from typing import Any

import trio

from ctxd.jobs import Slot
from ctxd.memory._embedders import Embedder, EmbedderError
from ctxd.memory._faiss import faiss
from ctxd.memory._lexical import Selection
from ctxd.store import WorkerThread

BESIDE_START_S = 0.002
"""How long `Searcher.beside` waits for FAISS to start before its caller goes on anyway."""

Found = list[tuple[int, float]]
"""(memory id, cosine), nearest first."""


class DenseUnavailable(Exception):
    """The dense leg cannot answer; the message says why."""


class Searcher:
    """Searches of the index in place.

    Args:
        embedder: embeds the queries.
        nprobe: inverted lists searched by the approximate index.
        lock: held by a search's FAISS call and by the owner's changes to the index
            (FAISS may not search an index while it changes).
    """

    def __init__(self, embedder: Embedder, nprobe: int, lock: threading.Lock):
        self._embedder = embedder
        self._nprobe = nprobe
        self._lock = lock
        self._thread: WorkerThread | None = None
        """The thread of `beside` (started with its first search)."""

    async def search(self, index: Any, query: str, k: int, selection: Selection | None
                     ) -> Found:
        """The ``k`` nearest memories in ``index`` to a query text; with a selection, the
        ``k`` nearest among the ids it holds (FAISS skips the others). The query is
        embedded in the search's own worker thread, outside the lock: one hop, not two
        (0.4 ms less for a branch's injection at 100k memories), and a slow embedder does
        not hold up other searches.

        Raises:
            DenseUnavailable: the query could not be embedded.
        """
        if index.ntotal == 0:
            return []

        def run() -> Found:
            return self._search(index, self._embed_query(query), k, selection)

        return await trio.to_thread.run_sync(run, abandon_on_cancel=True)

    def beside(self, found: Slot[Found], index: Any, query: str, k: int,
               selection: Selection) -> None:
        """Embed the query here and start its search (as `search`) in the index's search
        thread; return once FAISS is searching, which it does without the GIL, so that the
        caller's work goes on beside it. Only for a `gil_bound` embedder, whose embedding
        is quick: the caller is the store's thread. The answer, or `DenseUnavailable`,
        comes to ``found``.
        """
        try:
            vector = self._embed_query(query)
        except DenseUnavailable as exc:
            found.fail(exc)
            return
        searching = threading.Event()

        def run() -> None:
            try:
                found.set(self._search(index, vector, k, selection, searching))
            except Exception as exc:  # handed to the task awaiting it
                found.fail(exc)
            finally:
                searching.set()

        if self._thread is None:
            self._thread = WorkerThread("ctxd-faiss")
        self._thread.submit(run)
        # Not for long: an earlier search may still hold the search thread.
        searching.wait(BESIDE_START_S)

    def _embed_query(self, query: str) -> Any:
        """The query's vector (blocking).

        Raises:
            DenseUnavailable: the embedder failed.
        """
        try:
            return self._embedder.embed_sync([query])[0]
        except EmbedderError as exc:
            raise DenseUnavailable(f"the query could not be embedded: {exc}") from exc

    def _search(self, index: Any, vector: Any, k: int, selection: Selection | None,
                searching: threading.Event | None = None) -> Found:
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

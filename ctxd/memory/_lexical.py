"""LexicalIndex: FTS5's BM25 ranking of the memories, computed in memory (DESIGN §9).

``memories_fts`` is the lexical index and the truth. Ranking an OR query with FTS5's
``bm25()`` visits every row that holds any of the query's words: when they are common words
in 100,000 memories that is tens of thousands of rows, 40 ms and more. This mirror holds
the same postings — FTS5's own tokenizer (``porter unicode61``, called through the store's
connection) over the same four columns — and computes the same formula as ``bm25()`` (k1
1.2, b 0.75, IDF ``ln((N - n + 0.5) / (n + 0.5))`` floored at 1e-6, one term per query
phrase) with numpy, so its scores are FTS5's and the ranking is FTS5's, in about 2 ms.

It lives in the store's thread: every method takes the store's connection and runs in its
thread, between the store's other jobs, so it needs no lock and sees exactly the committed
memories. The write functions of ``_queries`` keep it in step inside their transactions;
when one that changed it rolls back, the store calls `rolled_back` in the same job, the
mirror forgets everything and is loaded again from SQLite, a chunk per store job, while
FTS5 answers lexical queries itself.

Long queries (a branch's description and prompt) can hold dozens of common words: past
`MAX_POSTINGS` postings the commonest words are left out, rarest first kept (their IDF is
the lowest, so they move a score least), and the result says it is approximate.

Knowing every memory's scope and confidence, the mirror also gives the dense leg its
`selection`: the ids FAISS may return for a query.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import apsw
import numpy as np
import numpy.typing as npt

K1 = 1.2
B = 0.75
TOKENIZER = ("porter", ["unicode61"])
"""memories_fts's ``tokenize = 'porter unicode61'`` (migration v0003)."""
MAX_POSTINGS = 200_000
"""A query scores at most this many postings of the scopes it sees (about 4 ms on the
development machine); see the module's note."""
LOAD_CHUNK = 100
"""Memories loaded per store job (about 8 ms of tokenizing: other requests wait no longer
than that behind one)."""
MAX_TF = 65_535
Ids = npt.NDArray[np.int32]
Frequencies = npt.NDArray[np.uint16]
"""Term frequencies are stored in 16 bits: a memory's texts (at most about 70,000
characters) cannot hold a word more often."""
Selection = npt.NDArray[np.uint8]


@dataclass(frozen=True)
class LexicalHits:
    hits: list[tuple[int, float]]
    """(memory id, BM25 score, higher is better), best first, ties by id."""
    words_left_out: int
    """Query words not scored (the commonest, past `MAX_POSTINGS`); 0 = exact."""


class LexicalIndex:
    """BM25 over the memories' postings, mirrored from ``memories_fts``."""

    def __init__(self) -> None:
        self._tokenizer: apsw.FTS5Tokenizer | None = None
        self.reset()

    def reset(self) -> None:
        """Forget everything; `load_more` loads it again (FTS5 answers meanwhile)."""
        self.ready = False  # first: `selection` may run on another thread meanwhile
        self.touched = False
        """Whether the current transaction changed the mirror (see `rolled_back`)."""
        self._postings: dict[tuple[int, str], tuple[Ids, Frequencies]] = {}
        """(scope code, term) → (memory ids, term frequencies), numpy arrays with room to
        grow (`_sizes` says how much is used): a query reads only the postings of the
        scopes it sees. Numpy arrays, unlike ``array.array``, are not tracked by the
        garbage collector: a dict per term of ``array.array`` pairs made 470,000 tracked
        objects at 100,000 memories, and every full collection took 115 ms with the GIL
        held."""
        self._sizes: dict[tuple[int, str], int] = {}
        self._df: dict[str, int] = {}
        self._length = np.zeros(1024, np.float64)
        self._scope = np.zeros(1024, np.int32)  # 0: no such memory
        self._confidence = np.zeros(1024, np.float64)
        self._scope_codes: dict[str, int] = {}
        self._rows = 0
        self._tokens = 0
        self._loaded_to = 0
        """Every memory up to this id is in the mirror; the loader reads those above it."""
        self.ready = False

    # ---- keeping in step (the store's thread, inside the writing transaction) ----------

    def _tokens_of(self, conn: apsw.Connection, text: str, flags: int) -> list[str]:
        if self._tokenizer is None:
            self._tokenizer = conn.fts5_tokenizer(*TOKENIZER)
        tokens: Any = self._tokenizer(text.encode(), flags, None, include_offsets=False,
                                      include_colocated=False)
        return list(tokens)

    def _document(self, conn: apsw.Connection, columns: Sequence[str]) -> list[str]:
        # FTS5 tokenizes each column apart; a newline splits tokens just as well.
        return self._tokens_of(conn, "\n".join(columns), apsw.FTS5_TOKENIZE_DOCUMENT)

    def _grow(self, memory_id: int) -> None:
        if memory_id < len(self._scope):
            return
        size = max(memory_id + 1, 2 * len(self._scope))
        self._length, self._scope, self._confidence = (
            np.concatenate([a, np.zeros(size - len(a), a.dtype)])
            for a in (self._length, self._scope, self._confidence))

    def _add(self, conn: apsw.Connection, row: tuple[Any, ...]) -> None:
        memory_id, scope, title, description, content, tags, alpha, beta = row
        tokens = self._document(conn, [title, description, content, tags])
        self._grow(memory_id)
        code = self._scope_codes.setdefault(scope, len(self._scope_codes) + 1)
        for term, count in Counter(tokens).items():
            key = (code, term)
            size = self._sizes.get(key, 0)
            arrays = self._postings.get(key)
            if arrays is None or size == len(arrays[0]):
                grown = (np.zeros(max(4, 2 * size), np.int32),
                         np.zeros(max(4, 2 * size), np.uint16))
                if arrays is not None:
                    grown[0][:size], grown[1][:size] = arrays
                arrays = self._postings[key] = grown
            arrays[0][size] = memory_id
            arrays[1][size] = min(count, MAX_TF)
            self._sizes[key] = size + 1
            self._df[term] = self._df.get(term, 0) + 1
        self._length[memory_id] = len(tokens)
        self._scope[memory_id] = code
        self.touched = True
        self._confidence[memory_id] = alpha / (alpha + beta)
        self._rows += 1
        self._tokens += len(tokens)

    _ROW = "SELECT id, scope, title, description, content, tags, alpha, beta FROM memories"

    def rolled_back(self) -> None:
        """The store's transaction rolled back: forget everything if it changed us."""
        if self.touched:
            self.reset()

    def added(self, conn: apsw.Connection, memory_id: int) -> None:
        """A memory was inserted (in the current transaction)."""
        if memory_id > self._loaded_to:
            return  # the loader has not got there yet: it will read it
        for row in conn.execute(f"{self._ROW} WHERE id = ?", (memory_id,)):
            self._add(conn, row)

    def removing(self, conn: apsw.Connection, memory_id: int) -> None:
        """A memory is about to be deleted (in the current transaction): drop its postings."""
        if memory_id > self._loaded_to or memory_id >= len(self._scope) \
                or not self._scope[memory_id]:
            return
        rows: list[Any] = conn.execute("SELECT title, description, content, tags FROM "
                                       "memories WHERE id = ?", (memory_id,)).fetchall()
        if not rows:
            return
        tokens = self._document(conn, rows[0])
        code = int(self._scope[memory_id])
        self.touched = True
        for term in set(tokens):
            key = (code, term)
            docs, frequencies = self._postings[key]
            size = self._sizes[key]
            at = int(np.flatnonzero(docs[:size] == memory_id)[0])
            docs[at:size - 1] = docs[at + 1:size]
            frequencies[at:size - 1] = frequencies[at + 1:size]
            if size == 1:
                del self._postings[key], self._sizes[key]
            else:
                self._sizes[key] = size - 1
            self._df[term] -= 1
            if not self._df[term]:
                del self._df[term]
        self._scope[memory_id] = 0
        self._rows -= 1
        self._tokens -= len(tokens)

    def rated(self, conn: apsw.Connection, memory_ids: Sequence[int]) -> None:
        """These memories' confidence changed (in the current transaction)."""
        for memory_id in memory_ids:
            if memory_id > self._loaded_to:
                continue
            for alpha, beta in conn.execute("SELECT alpha, beta FROM memories WHERE id = ?",
                                            (memory_id,)):
                self._confidence[memory_id] = alpha / (alpha + beta)
                self.touched = True

    def load_more(self, conn: apsw.Connection, limit: int = LOAD_CHUNK) -> bool:
        """Load the next ``limit`` memories; True once every memory is in the mirror."""
        if self.ready:
            return True
        rows: list[Any] = conn.execute(f"{self._ROW} WHERE id > ? ORDER BY id LIMIT ?",
                                       (self._loaded_to, limit)).fetchall()
        for row in rows:
            self._loaded_to = row[0]
            self._add(conn, row)
        if len(rows) < limit:
            self._loaded_to = 1 << 62
            self.ready = True
        return self.ready

    # ---- ranking (the store's thread) ------------------------------------------------

    def terms(self, conn: apsw.Connection, words: Sequence[str]) -> list[str] | None:
        """The term of each query word (a word is one FTS5 phrase), or None when a word is
        more than one token (a phrase query: FTS5 answers it)."""
        terms = []
        for word in words:
            tokens = self._tokens_of(conn, word, apsw.FTS5_TOKENIZE_QUERY)
            if len(tokens) > 1:
                return None
            terms.extend(tokens)
        return terms

    def search(self, terms: Sequence[str], scope: str | None, min_confidence: float,
               limit: int) -> LexicalHits:
        """The ``limit`` best memories for the query terms by FTS5's BM25, in ``scope``
        (a project's scope sees its own and the global memories) with at least
        ``min_confidence``."""
        if self._rows == 0 or not terms:
            return LexicalHits([], 0)
        if scope is None:
            codes = list(self._scope_codes.values())
        else:
            codes = [self._scope_codes[name] for name in {scope, "global"}
                     if name in self._scope_codes]
        # Rarest first: a duplicate term is scored twice, as FTS5 scores each phrase.
        ranked = sorted((self._df[term], term) for term in terms if term in self._df)
        if not ranked:
            return LexicalHits([], 0)
        # The length part of BM25's denominator, per memory.
        norms = K1 * (1.0 - B + B * self._length * (self._rows / self._tokens))
        scores = np.zeros(len(self._scope), np.float64)
        scored = 0
        used = 0
        for df, term in ranked:
            postings = []
            for code in codes:
                if (code, term) in self._postings:
                    docs, frequencies = self._postings[code, term]
                    used_size = self._sizes[code, term]
                    postings.append((docs[:used_size], frequencies[:used_size]))
            size = sum(len(docs) for docs, _ in postings)
            if used and scored + size > MAX_POSTINGS:
                break
            idf = math.log((self._rows - df + 0.5) / (df + 0.5))
            if idf <= 0.0:
                idf = 1e-6
            for docs, frequencies in postings:
                frequency = frequencies.astype(np.float64)
                # idf · f · (k1 + 1) / (f + k1 · (1 - b + b · length / average length))
                part = np.take(norms, docs)
                part += frequency
                np.divide(frequency, part, out=part)
                part *= idf * (K1 + 1.0)
                np.add.at(scores, docs, part)  # twice as fast as scores[docs] += part
            scored += size
            used += 1
        left_out = len(ranked) - used
        candidates = np.flatnonzero(scores)
        if min_confidence > 0:
            candidates = candidates[self._confidence[candidates] >= min_confidence - 1e-9]
        if len(candidates) > limit:
            best = np.argpartition(-scores[candidates], limit - 1)[:limit]
            candidates = candidates[best]
        order = np.lexsort((candidates, -scores[candidates]))
        return LexicalHits([(int(i), float(scores[i])) for i in candidates[order]],
                           left_out)

    def selection(self, scope: str | None, min_confidence: float) -> Selection | None:
        """A bitmap of the memory ids in ``scope`` with at least ``min_confidence`` (bit
        ``id`` of the little-endian bit string), for the dense leg to search within; None
        while the mirror is loading.

        The one method that may run outside the store's thread (the dense leg calls it on
        the event loop while the lexical leg ranks in the store's thread): it only reads
        `ready`, the scope codes and two arrays, which the store's thread may replace
        meanwhile (hence the common length), and a selection a moment stale, or showing
        a transaction that is then rolled back, is harmless: results are read back from
        SQLite with the scope and confidence filters.
        """
        if not self.ready:
            return None
        codes, confidence = self._scope, self._confidence
        size = min(len(codes), len(confidence))
        codes, confidence = codes[:size], confidence[:size]
        if scope is None:
            wanted = codes > 0
        else:
            wanted = np.zeros(size, np.bool_)
            for name in {scope, "global"}:
                code = self._scope_codes.get(name)
                if code is not None:
                    wanted |= codes == code
        if min_confidence > 0:
            wanted &= confidence >= min_confidence - 1e-9
        return np.packbits(wanted, bitorder="little")

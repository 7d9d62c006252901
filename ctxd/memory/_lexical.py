"""LexicalIndex: FTS5's BM25 ranking of the memories, computed in memory (docs/protocol.md, Memory).

``memories_fts`` is the lexical index and the truth. Ranking an OR query with FTS5's
``bm25()`` visits every row that holds any of the query's words: when they are common words
in 100,000 memories that is tens of thousands of rows, 40 ms and more. This mirror holds
the same postings — FTS5's own tokenizer (``porter unicode61``, called through the store's
connection) over the same four columns — and computes the same formula as ``bm25()`` (k1
1.2, b 0.75, IDF ``ln((N - n + 0.5) / (n + 0.5))`` floored at 1e-6, one term per query
phrase) with numpy, so its scores are FTS5's and the ranking is FTS5's: 0.3 ms for a short
query, 2 ms for a branch's description and prompt, at 100,000 memories.

The postings are kept per scope (a `_Shard`), over the scope's own slots: a query adds up
its postings, in one pass, into arrays the size of the scopes it sees.

It lives in the store's thread: every method takes the store's connection and runs in its
thread, between the store's other jobs, so it needs no lock and sees exactly the committed
memories. The write functions of ``_queries`` keep it in step inside their transactions;
when one that changed it rolls back, the store calls `rolled_back` in the same job, the
mirror forgets everything and is loaded again, while FTS5 answers lexical queries itself.
It loads from its file (`_mirror_file`, checked against SQLite by `restore`), then what
the file lacks from SQLite, a chunk per store job (`load_more`).

A term's postings' BM25 parts (everything but the sum) depend on the memories' lengths,
the average length and the term's IDF, which change only when a memory is added or
removed: the first query that scores a term in a shard keeps its parts, and later queries
only add them up (a branch's description and prompt at 100,000 memories: 1.0 ms instead
of 1.6, and 1.85 ms for the query that computes them), until the next memory is added or
removed (`CACHED_POSTINGS` bounds them).

Long queries (a branch's description and prompt) can hold dozens of common words: past
`MAX_POSTINGS` postings the commonest words are left out, rarest first kept (their IDF is
the lowest, so they move a score least), and the result says it is approximate.

Knowing every memory's scope and confidence, the mirror also gives the dense leg its
`selection`: the ids FAISS may return for a query. It keeps the selections it made until
a memory is added or removed, and sets or clears a memory's bit in them when its
confidence moves (every injection moves its memories').
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import apsw
import numpy as np
import numpy.typing as npt

from ctxd.memory import _mirror_file
from ctxd.memory._mirror_file import Capture, MirrorImage
from ctxd.wire.types import SHARED_SCOPES

K1 = 1.2
B = 0.75
TOKENIZER = ("porter", ["unicode61"])
"""memories_fts's ``tokenize = 'porter unicode61'`` (migration v0003)."""
MAX_POSTINGS = 200_000
"""A query scores at most this many postings of the scopes it sees (1 to 2 ms on the
development machine), and its rarest word whatever its count; see the module's note."""
CACHED_POSTINGS = 4_000_000
"""Postings whose BM25 parts are kept between queries (32 MB): the first query past it
drops them all first (one query adds at most its own, about `MAX_POSTINGS`)."""
KEPT_SELECTIONS = 64
"""Selections (by scope and minimum confidence) kept between queries."""
KEPT_QUERY_WORDS = 65_536
"""Query words whose tokens are kept (emptied when full): a branch's prompt is about 60
words, and tokenizing each through SQLite took a tenth of its ranking."""
KEPT_WORD_CHARS = 64
"""Longer query words (an identifier, a hash, a blob) are tokenized every time: they rarely
come again, and kept they could make the kept words large."""
LOAD_CHUNK = 100
"""Memories loaded per store job (about 8 ms of tokenizing: other requests wait no longer
than that behind one)."""
MAX_TF = 65_535
Slots = npt.NDArray[np.int32]
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


def _grown(array: npt.NDArray[Any], size: int) -> npt.NDArray[Any]:
    bigger = np.zeros(size, array.dtype)
    bigger[:len(array)] = array
    return bigger


class _Shard:
    """One scope's memories, numbered by slot (0, 1, … in the order they came), with their
    postings by term over those slots: a query scores into arrays the size of the scopes
    it sees, not of every memory (at 100,000 memories in 21 scopes, a project's query
    sees a quarter of them; a long query ranks 30% faster, a short one 2.5 times). A
    deleted memory's slot stays empty until the mirror is next loaded.

    The postings of all its terms live in two pooled arrays (slots and frequencies), a
    term's in one region of them (a row: where it starts, how many, how many fit), not in
    two arrays per term: at a million memories, most of whose 1.2 million terms are one
    memory's identifier, two numpy arrays and two dict entries per term took about 1 GB.
    A region is never changed under what it holds: postings are appended past its size,
    and a region that is full, or loses a posting, is copied to the pool's end (the old
    one is left as it was, for an image being written: `LexicalIndex.capture`); the pool
    is compacted into new arrays once most of it is left behind.
    """

    __slots__ = ("confidence", "count", "frequencies", "ids", "left", "length", "parts",
                 "room", "rows", "size", "slots", "start", "terms", "used")

    def __init__(self) -> None:
        self.ids = np.zeros(64, np.int32)
        """Slot → memory id; -1: deleted."""
        self.length = np.zeros(64, np.float64)
        self.confidence = np.zeros(64, np.float64)
        self.count = 0
        self.rows: dict[str, int] = {}
        """Term → its row (a term whose postings all went has none)."""
        self.terms: list[str] = []
        """Row → term."""
        self.start = np.zeros(64, np.int64)
        self.size = np.zeros(64, np.int32)
        """Row → its postings in the pool, or 0 for a term whose postings all went."""
        self.room = np.zeros(64, np.int32)
        self.slots: Slots = np.zeros(1024, np.int32)
        """The pool: each row's slots ascending in its region."""
        self.frequencies: Frequencies = np.zeros(1024, np.uint16)
        self.used = 0
        """The pool's end: regions are added past it."""
        self.left = 0
        """Pool entries in regions left behind (copied elsewhere or emptied)."""
        self.parts: dict[str, npt.NDArray[np.float64]] = {}
        """Term → its postings' BM25 parts, as the mirror's `LexicalIndex.version` was
        when a query computed them (see `LexicalIndex._keep_parts`)."""

    def size_of(self, term: str) -> int:
        row = self.rows.get(term)
        return 0 if row is None else int(self.size[row])

    def postings(self, term: str) -> tuple[Slots, Frequencies]:
        """A term's (slots, frequencies): views of the pool (the term must be here)."""
        row = self.rows[term]
        start = int(self.start[row])
        end = start + int(self.size[row])
        return self.slots[start:end], self.frequencies[start:end]

    def add(self, memory_id: int, tokens: list[str], confidence: float) -> int:
        """A memory's slot and postings; returns the slot."""
        slot = self.count
        if slot == len(self.ids):
            # confidence last: `selection` may read the arrays meanwhile (see there).
            self.ids, self.length, self.confidence = (
                _grown(a, 2 * slot) for a in (self.ids, self.length, self.confidence))
        self.ids[slot] = memory_id
        self.length[slot] = len(tokens)
        self.confidence[slot] = confidence
        self.count += 1
        rows = self.rows
        for term, count in Counter(tokens).items():
            row = rows.get(term)
            if row is None:
                row = rows[term] = self._new_row(term)
                size = 0
            else:
                size = int(self.size[row])
                if size == self.room[row]:
                    self._move(row, size, max(4, 2 * size))
            at = int(self.start[row]) + size
            self.slots[at] = slot
            self.frequencies[at] = min(count, MAX_TF)
            self.size[row] = size + 1
        return slot

    def remove(self, slot: int, terms: set[str]) -> None:
        for term in terms:
            row = self.rows[term]
            held, frequencies = self.postings(term)
            size = len(held)
            if size == 1:
                del self.rows[term]
                self.left += int(self.room[row])
                self.size[row] = self.room[row] = 0
                continue
            at = int(np.searchsorted(held, slot))
            kept = np.delete(held, at), np.delete(frequencies, at)
            start = self._reserve_pool(size - 1)
            self.left += int(self.room[row])  # after: a compaction may have moved it
            self.slots[start:start + size - 1] = kept[0]
            self.frequencies[start:start + size - 1] = kept[1]
            self.start[row], self.size[row], self.room[row] = start, size - 1, size - 1
        self.ids[slot] = -1
        self.length[slot] = 0.0
        self.confidence[slot] = 0.0
        if len(self.terms) - len(self.rows) > max(1024, len(self.terms) // 2):
            self._drop_empty_rows()

    def _drop_empty_rows(self) -> None:
        """Renumber the rows without those of terms whose postings all went (memories
        deleted and recorded over and over would otherwise add rows without end)."""
        rows = len(self.terms)
        kept = self.size[:rows] > 0
        self.terms = [term for term, keep in zip(self.terms, kept.tolist(), strict=True)
                      if keep]
        self.rows = dict(zip(self.terms, range(len(self.terms)), strict=True))
        self.start, self.size, self.room = (
            _grown(a[:rows][kept], max(64, len(self.terms)))
            for a in (self.start, self.size, self.room))

    def _new_row(self, term: str) -> int:
        row = len(self.terms)
        self.terms.append(term)
        if row == len(self.start):
            self.start, self.size, self.room = (
                _grown(a, 2 * row) for a in (self.start, self.size, self.room))
        self.start[row] = self._reserve_pool(4)
        self.room[row] = 4
        return row

    def _move(self, row: int, size: int, room: int) -> None:
        """Copy a row's region to a new one of ``room`` at the pool's end."""
        start = self._reserve_pool(room)
        was = int(self.start[row])  # read after: a compaction may have moved it
        self.left += int(self.room[row])
        self.slots[start:start + size] = self.slots[was:was + size]
        self.frequencies[start:start + size] = self.frequencies[was:was + size]
        self.start[row], self.room[row] = start, room

    def _reserve_pool(self, room: int) -> int:
        """Where a region of ``room`` starts at the pool's end (the pool compacted or grown
        into new arrays when it is full)."""
        if self.used + room > len(self.slots):
            if self.left > self.used // 2:
                self.compact()
            if self.used + room > len(self.slots):
                size = max(len(self.slots) * 3 // 2, self.used + room)
                self.slots, self.frequencies = (_grown(a, size)
                                                for a in (self.slots, self.frequencies))
        start = self.used
        self.used += room
        return start

    def compact(self) -> None:
        """New pool arrays of the rows' postings only, each region with as much room as
        it holds (the old arrays are left as they were)."""
        rows = len(self.terms)
        sizes = self.size[:rows].astype(np.int64)
        total = int(sizes.sum())
        taken = _mirror_file.gathered(self.start[:rows], sizes)
        capacity = max(1024, total + total // 8)
        slots = np.zeros(capacity, np.int32)
        frequencies = np.zeros(capacity, np.uint16)
        slots[:total] = self.slots[taken]
        frequencies[:total] = self.frequencies[taken]
        self.slots, self.frequencies = slots, frequencies
        self.start[:rows] = _mirror_file.starts_of(sizes)
        self.room[:rows] = self.size[:rows]
        self.used, self.left = total, 0

    def load(self, terms: list[str], sizes: npt.NDArray[np.int64], slots: Slots,
             frequencies: Frequencies) -> None:
        """Take a file's postings (terms with none left out) as the pool, as they are."""
        kept = sizes > 0
        if not kept.all():
            terms = [term for term, keep in zip(terms, kept.tolist(), strict=True) if keep]
            sizes = sizes[kept]
        rows = len(terms)
        self.terms = terms
        self.rows = dict(zip(terms, range(rows), strict=True))
        self.size = sizes.astype(np.int32)
        self.room = self.size.copy()
        self.start = _mirror_file.starts_of(sizes)
        if rows == 0:  # room for the first rows
            self.start, self.size, self.room = (np.zeros(64, a.dtype)
                                                for a in (self.start, self.size, self.room))
        self.slots, self.frequencies = slots, frequencies
        self.used, self.left = len(slots), 0


def _column_pair(conn: apsw.Connection, sql: str, bindings: tuple[Any, ...]
                 ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """The two columns (an id, a number) of a query's rows, as arrays."""
    rows: list[Any] = conn.execute(sql, bindings).fetchall()
    return (np.fromiter((row[0] for row in rows), np.int64, len(rows)),
            np.fromiter((row[1] for row in rows), np.float64, len(rows)))


def _restore_shard(shard: _Shard, saved: _mirror_file.ShardImage,
                   live: npt.NDArray[np.bool_], confidence: npt.NDArray[np.float64]) -> None:
    """Fill an empty shard with a saved one's ``live`` slots, renumbered in order."""
    count = len(confidence)
    slots, frequencies, sizes = saved.slots, saved.frequencies, saved.sizes
    if count < len(live):
        renumbered = np.cumsum(live, dtype=np.int32) - 1
        kept = live[slots]
        slots, frequencies = renumbered[slots[kept]], frequencies[kept]
        sizes = np.bincount(np.repeat(np.arange(len(saved.terms)), saved.sizes)[kept],
                            minlength=len(saved.terms))
    shard.ids = saved.ids[live].astype(np.int32)
    shard.length = saved.length[live].astype(np.float64)
    shard.confidence = confidence.astype(np.float64)
    shard.count = count
    shard.load(list(saved.terms), sizes.astype(np.int64), slots.astype(np.int32, copy=False),
               frequencies.astype(np.uint16, copy=False))


class LexicalIndex:
    """BM25 over the memories' postings, mirrored from ``memories_fts``."""

    def __init__(self) -> None:
        self._tokenizer: apsw.FTS5Tokenizer | None = None
        self._scratch_slots: npt.NDArray[np.intp] = np.empty(0, np.intp)
        self._scratch_values: npt.NDArray[np.float64] = np.empty((3, 0), np.float64)
        """A query's postings' slots and BM25 parts, one after another (`_scores`: row 0),
        and the frequencies and weights of those whose parts it computes (`_keep_parts`:
        rows 1 and 2)."""
        self._query_words: dict[str, list[str]] = {}
        """Query word → its tokens (the tokenizer's answer never changes)."""
        self._selections_lock = threading.Lock()
        """Taken by `selection` (on the event loop) and `rated` (in the store's thread)
        around the kept selections, so that none misses a change of confidence."""
        self.version = 0
        """Goes up with every memory added or removed and every reset: the shards' BM25
        parts and the kept selections are valid for one version."""
        self.reset()

    def reset(self) -> None:
        """Forget everything; `load_more` loads it again (FTS5 answers meanwhile)."""
        self.ready = False  # first: `selection` may run on another thread meanwhile
        self.touched = False
        """Whether the current transaction changed the mirror (see `rolled_back`)."""
        self._shards: dict[str, _Shard] = {}
        """Scope → its memories and postings."""
        self._scopes: list[str] = []
        """Shard number → its scope."""
        self._numbers: dict[str, int] = {}
        self._shard_of = np.full(1024, -1, np.int32)
        """Memory id → the number of its scope's shard; -1: not in the mirror."""
        self._slot = np.zeros(1024, np.int32)
        """Memory id → its slot in its scope's shard."""
        self._df: dict[str, int] = {}
        self._rows = 0
        self._tokens = 0
        self._loaded_to = 0
        """Every memory up to this id is in the mirror but `_pending`; the loader reads
        those above it."""
        self._pending: npt.NDArray[np.int64] = np.zeros(0, np.int64)
        """Ids up to `_loaded_to` the loader tokenizes first (see `restore`)."""
        self.max_id = 0
        """The highest memory id added so far."""
        self.version += 1
        self._parts_version = 0
        self._parts_size = 0
        """Postings whose BM25 parts the shards keep."""
        self._selections: dict[str | None, dict[float, tuple[int, Selection]]] = {}
        """Scope → minimum confidence → (version, selection): see `selection`."""
        self.ready = False

    @property
    def rows(self) -> int:
        """Memories in the mirror."""
        return self._rows

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

    def _add(self, conn: apsw.Connection, row: tuple[Any, ...]) -> None:
        memory_id, scope, title, description, content, tags, alpha, beta = row
        if self._scope_of(memory_id) is not None:
            return  # already here (one of `restore`'s pending ones, added since)
        tokens = self._document(conn, [title, description, content, tags])
        shard = self._shard(scope)
        self._room_for(memory_id)
        self.touched = True
        self._slot[memory_id] = shard.add(memory_id, tokens, alpha / (alpha + beta))
        self._shard_of[memory_id] = self._numbers[scope]
        for term in set(tokens):
            self._df[term] = self._df.get(term, 0) + 1
        self._rows += 1
        self._tokens += len(tokens)
        self.max_id = max(self.max_id, memory_id)
        self.version += 1

    _ROW = "SELECT id, scope, title, description, content, tags, alpha, beta FROM memories"

    def _shard(self, scope: str) -> _Shard:
        """The scope's shard, made when it has none."""
        shard = self._shards.get(scope)
        if shard is None:
            shard = self._shards[scope] = _Shard()
            self._numbers[scope] = len(self._scopes)
            self._scopes.append(scope)
        return shard

    def _room_for(self, memory_id: int) -> None:
        if memory_id >= len(self._slot):
            size = max(memory_id + 1, 2 * len(self._slot))
            self._slot = _grown(self._slot, size)
            grown = np.full(size, -1, np.int32)
            grown[:len(self._shard_of)] = self._shard_of
            self._shard_of = grown

    def _scope_of(self, memory_id: int) -> str | None:
        """The scope of a memory in the mirror, else None."""
        if memory_id >= len(self._shard_of):
            return None
        number = int(self._shard_of[memory_id])
        return self._scopes[number] if number >= 0 else None

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
        scope = self._scope_of(memory_id)
        if scope is None:
            return  # not loaded yet (the loader will not find it)
        rows: list[Any] = conn.execute("SELECT title, description, content, tags FROM "
                                       "memories WHERE id = ?", (memory_id,)).fetchall()
        if not rows:
            return
        tokens = self._document(conn, rows[0])
        terms = set(tokens)
        self.touched = True
        self._shards[scope].remove(int(self._slot[memory_id]), terms)
        self._shard_of[memory_id] = -1
        for term in terms:
            self._df[term] -= 1
            if not self._df[term]:
                del self._df[term]
        self._rows -= 1
        self._tokens -= len(tokens)
        self.version += 1

    def rated(self, memory_id: int, confidence: float) -> None:
        """This memory's confidence changed (in the current transaction) to ``confidence``."""
        scope = self._scope_of(memory_id)
        if scope is None:
            return
        shard, slot = self._shards[scope], self._slot[memory_id]
        was = float(shard.confidence[slot])
        shard.confidence[slot] = confidence
        self.touched = True
        self._reselect(memory_id, scope, was, confidence)

    def _reselect(self, memory_id: int, scope: str, was: float, confidence: float) -> None:
        """Set or clear a memory's bit in the kept selections that see its scope, as its
        new confidence says (only those whose minimum lies between ``was`` and it: a
        selection's bit agrees with whichever of the two it was made from, as a change
        sets the confidence before it takes the lock). A selection handed out is never
        changed: FAISS may be reading it in another thread; its copy replaces it."""
        low, high = min(was, confidence), max(was, confidence)
        byte, bit = divmod(memory_id, 8)
        with self._selections_lock:
            # A project's memory is seen from its project and from every scope; a global
            # or shared (team, org) memory from all of them (a selection of another team's
            # scope keeps a bit it does not need: results are read back with the filters).
            seeing = (list(self._selections.values())
                      if scope == "global" or scope.startswith(SHARED_SCOPES) else
                      [seen for seen_from in (scope, None)
                       if (seen := self._selections.get(seen_from)) is not None])
            for by_confidence in seeing:
                for min_confidence, (version, kept) in by_confidence.items():
                    if (not low < min_confidence - 1e-9 <= high or version != self.version
                            or byte >= len(kept)):
                        continue
                    wanted = confidence >= min_confidence - 1e-9
                    if bool(kept[byte] >> bit & 1) != wanted:
                        changed = kept.copy()
                        changed[byte] ^= 1 << bit
                        by_confidence[min_confidence] = (version, changed)

    def load_more(self, conn: apsw.Connection, limit: int = LOAD_CHUNK) -> bool:
        """Load the next ``limit`` memories; True once every memory is in the mirror."""
        if self.ready:
            return True
        if len(self._pending):
            pending, self._pending = self._pending[:limit], self._pending[limit:]
            for memory_id in pending.tolist():
                for row in conn.execute(f"{self._ROW} WHERE id = ?", (memory_id,)):
                    self._add(conn, row)
            return False
        rows: list[Any] = conn.execute(f"{self._ROW} WHERE id > ? ORDER BY id LIMIT ?",
                                       (self._loaded_to, limit)).fetchall()
        for row in rows:
            self._loaded_to = row[0]
            self._add(conn, row)
        if len(rows) < limit:
            self._loaded_to = 1 << 62
            for shard in self._shards.values():
                if shard.left:
                    # Loading left regions behind as they grew: a million memories'
                    # pool held twice its postings.
                    shard.compact()
            self.ready = True
        return self.ready

    # ---- the file (docs/decisions.md, Memory: the mirror's file) ------------------------

    def capture(self) -> tuple[int, list[Capture]] | None:
        """What `_mirror_file.write` saves (in another thread), taken quickly in the
        store's thread: None while the mirror is not whole."""
        if not self.ready:
            return None
        captures = []
        for scope, shard in self._shards.items():
            rows = len(shard.terms)
            captures.append(Capture(
                scope, shard.ids[:shard.count].copy(), shard.length[:shard.count].copy(),
                list(shard.terms), shard.start[:rows].copy(), shard.size[:rows].copy(),
                shard.slots, shard.frequencies))
        return self.max_id, captures

    def restore(self, conn: apsw.Connection, image: MirrorImage) -> int:
        """Load the mirror from a saved ``image`` instead of tokenizing (the store's
        thread, on a mirror just reset): its memories that SQLite still holds in the same
        scope keep their postings (their slots renumbered), with SQLite's confidence;
        `load_more` tokenizes SQLite's others up to the image's highest id, then reads
        those above it. Returns how many memories it took from the image."""
        self.reset()
        self._room_for(image.max_id)
        taken = np.zeros(image.max_id + 1, np.bool_)
        for saved in image.shards:
            if saved.scope in self._shards:
                continue
            held_ids, held_confidence = _column_pair(
                conn, "SELECT id, alpha / (alpha + beta) FROM memories WHERE scope = ? AND "
                "id <= ? ORDER BY id", (saved.scope, image.max_id))
            if not len(held_ids):
                continue
            at = np.minimum(np.searchsorted(held_ids, saved.ids), len(held_ids) - 1)
            live = (saved.ids >= 0) & (held_ids[at] == saved.ids)
            count = int(live.sum())
            if not count:
                continue
            shard = self._shard(saved.scope)
            _restore_shard(shard, saved, live, held_confidence[at[live]])
            ids = shard.ids
            self._slot[ids] = np.arange(count, dtype=np.int32)
            self._shard_of[ids] = self._numbers[saved.scope]
            taken[ids] = True
            self._rows += count
            self._tokens += int(shard.length.sum())
            self.max_id = max(self.max_id, int(ids.max()))
        df = self._df
        for shard in self._shards.values():
            for term, size in zip(shard.terms, shard.size[:len(shard.terms)].tolist(),
                                  strict=True):
                df[term] = df.get(term, 0) + size
        self._loaded_to = image.max_id
        self.version += 1
        # Recorded, or moved to another scope, after the image was taken: `load_more`
        # tokenizes them first, a chunk per store job.
        every = np.fromiter(itertools.chain.from_iterable(conn.execute(
            "SELECT id FROM memories WHERE id <= ? ORDER BY id", (image.max_id,))), np.int64)
        self._pending = every[~taken[every]]
        return int(taken.sum())

    # ---- ranking (the store's thread) ------------------------------------------------

    def terms(self, conn: apsw.Connection, words: Sequence[str]) -> list[str] | None:
        """The term of each query word (a word is one FTS5 phrase), or None when a word is
        more than one token (a phrase query: FTS5 answers it)."""
        terms = []
        known = self._query_words
        for word in words:
            tokens = known.get(word)
            if tokens is None:
                tokens = self._tokens_of(conn, word, apsw.FTS5_TOKENIZE_QUERY)
                if len(word) <= KEPT_WORD_CHARS:
                    if len(known) >= KEPT_QUERY_WORDS:
                        known.clear()
                    known[word] = tokens
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
        shards = self._shards_of(scope)
        # Rarest first: a duplicate term is scored twice, as FTS5 scores each phrase.
        df = self._df
        ranked = sorted((df[term], term) for term in terms if term in df)
        if not shards or not ranked:
            return LexicalHits([], 0)
        if self._parts_version != self.version or self._parts_size > CACHED_POSTINGS:
            for shard in self._shards.values():
                shard.parts.clear()
            self._parts_version, self._parts_size = self.version, 0
        sizes = [[shard.size_of(term) for _, term in ranked] for shard in shards]
        totals = [sum(column) for column in zip(*sizes, strict=True)]
        used = len(ranked)  # the terms scored: the rarest, while within MAX_POSTINGS
        for at, scored in enumerate(itertools.accumulate(totals)):
            if scored > MAX_POSTINGS:
                used = max(at, 1)
                break
        rows = self._rows
        weights = []
        for n, _ in ranked[:used]:
            idf = math.log((rows - n + 0.5) / (n + 0.5))
            weights.append((idf if idf > 0.0 else 1e-6) * (K1 + 1.0))
        taken = [[(term, weight) for (_, term), weight, size
                  in zip(ranked[:used], weights, shard_sizes[:used], strict=True) if size]
                 for shard_sizes in sizes]
        found_ids = []
        found_scores = []
        for shard, postings in zip(shards, taken, strict=True):
            if not postings:
                continue
            shard_scores = self._scores(shard, postings)
            matched = shard_scores > 0.0
            if min_confidence > 0:
                matched &= shard.confidence[:shard.count] >= min_confidence - 1e-9
            matched_slots = np.flatnonzero(matched)
            found_ids.append(shard.ids[matched_slots])
            found_scores.append(shard_scores[matched_slots])
        # Left out: the words past the cut that the query's scopes hold.
        left_out = sum(1 for total in totals[used:] if total)
        if not found_ids:
            return LexicalHits([], left_out)
        candidates, found = np.concatenate(found_ids), np.concatenate(found_scores)
        if len(candidates) > limit:
            # The best `limit` and every memory tied with the last of them: ties go by id.
            last = np.partition(found, len(found) - limit)[len(found) - limit]
            kept = found >= last
            candidates, found = candidates[kept], found[kept]
        order = np.lexsort((candidates, -found))[:limit]
        return LexicalHits([(int(i), float(score)) for i, score
                            in zip(candidates[order], found[order], strict=True)],
                           left_out)

    def _scores(self, shard: _Shard, terms: list[tuple[str, float]]
                ) -> npt.NDArray[np.float64]:
        """Each slot's BM25 for these (term, IDF · (k1 + 1)), added up in their order: for
        a slot, the same additions as one term after another (one pass over all the
        postings is twice as fast)."""
        missing = {term: weight for term, weight in terms if term not in shard.parts}
        if missing:
            self._keep_parts(shard, missing)
        parts = [shard.parts[term] for term, _ in terms]
        size = sum(len(p) for p in parts)
        self._reserve(size)
        slots, summed = self._scratch_slots[:size], self._scratch_values[0, :size]
        np.concatenate([shard.postings(term)[0] for term, _ in terms], out=slots,
                       casting="same_kind")
        np.concatenate(parts, out=summed)
        return np.bincount(slots, summed, minlength=shard.count).astype(np.float64, copy=False)

    def _keep_parts(self, shard: _Shard, weights: dict[str, float]) -> None:
        """Compute and keep these terms' postings' BM25 parts in this shard, all in one
        pass: idf · (k1 + 1) · f / (f + k1 · (1 - b + b · length / average length)).
        Each term keeps a view of the one new array."""
        sizes = [shard.size_of(term) for term in weights]
        size = sum(sizes)
        self._reserve(size)
        slots = self._scratch_slots[:size]
        frequency, weight = self._scratch_values[1:, :size]
        taken = list(zip(weights, sizes, strict=True))
        held = [shard.postings(term) for term, _ in taken]
        np.concatenate([term_slots for term_slots, _ in held], out=slots,
                       casting="same_kind")
        np.concatenate([term_frequencies for _, term_frequencies in held], out=frequency,
                       casting="same_kind")
        start = 0
        for term, n in taken:
            weight[start:start + n] = weights[term]
            start += n
        norms = K1 * (1.0 - B + B * shard.length[:shard.count] * (self._rows / self._tokens))
        parts = np.take(norms, slots)
        parts += frequency
        np.divide(frequency, parts, out=parts)
        parts *= weight
        start = 0
        for term, n in taken:
            shard.parts[term] = parts[start:start + n]
            start += n
        self._parts_size += size

    def _reserve(self, size: int) -> None:
        """Scratch buffers for ``size`` postings, kept between queries: megabytes allocated
        afresh would be fresh pages from the kernel, and their page faults cost more than
        the arithmetic."""
        if size > len(self._scratch_slots):
            self._scratch_slots = np.empty(2 * size, np.intp)
            self._scratch_values = np.empty((3, 2 * size), np.float64)

    def _shards_of(self, scope: str | None) -> list[_Shard]:
        """The shards a query in ``scope`` sees (a project's: its own, the shared ones and
        the global one; a shared scope's: its own and the global one), read from the
        shards' dict once (see `selection`)."""
        shards = self._shards
        if scope is None:
            return list(shards.values())
        names = {scope, "global"}
        if not scope.startswith(SHARED_SCOPES) and scope != "global":
            names.update(name for name in list(shards) if name.startswith(SHARED_SCOPES))
        return [shard for name in sorted(names) if (shard := shards.get(name)) is not None]

    def selection(self, scope: str | None, min_confidence: float) -> Selection | None:
        """A bitmap of the memory ids in ``scope`` with at least ``min_confidence`` (bit
        ``id`` of the little-endian bit string), for the dense leg to search within; None
        while the mirror is loading.

        The one method that may run outside the store's thread (the dense leg calls it on
        the event loop while the lexical leg ranks in the store's thread): it only reads
        `ready`, the shards (from one read of their dict: a reset may replace it) and
        their arrays, which the store's thread may replace meanwhile (hence the common
        length) or change (hence the copy of the ids, tested as they are used), and a
        selection a moment stale, or showing a transaction that is then rolled back, is
        harmless: results are read back from SQLite with the scope and confidence
        filters. The selections it keeps are shared with `rated` under a lock.
        """
        if not self.ready:
            return None
        with self._selections_lock:
            version = self.version  # before: a memory added meanwhile makes it stale
            by_confidence = self._selections.get(scope)
            kept = by_confidence.get(min_confidence) if by_confidence is not None else None
            if kept is not None and kept[0] == version:
                return kept[1]
            selection = self._select(scope, min_confidence)
            if sum(len(d) for d in self._selections.values()) >= KEPT_SELECTIONS:
                self._selections.clear()
            self._selections.setdefault(scope, {})[min_confidence] = (version, selection)
            return selection

    def _select(self, scope: str | None, min_confidence: float) -> Selection:
        wanted = np.zeros(len(self._slot), np.bool_)
        for shard in self._shards_of(scope):
            ids, confidence = shard.ids, shard.confidence
            size = min(shard.count, len(ids), len(confidence))
            ids, confidence = ids[:size].copy(), confidence[:size]
            kept = (ids >= 0) & (ids < len(wanted))
            if min_confidence > 0:
                kept &= confidence >= min_confidence - 1e-9
            wanted[ids[kept]] = True
        return np.packbits(wanted, bitorder="little")

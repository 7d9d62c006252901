"""The lexical mirror against FTS5 itself: the same BM25 scores and ranking, on a real
SQLite file, through the memory write functions (inserts, deletes, a reused rowid,
signals), in every scope and confidence filter; its cut of a long query; and its reload
after a write that failed."""

import random
from pathlib import Path

import apsw
import numpy as np
import pytest
import trio

from ctxd.config import MemoryConfig
from ctxd.errors import CtxdError, ErrorCode
from ctxd.hub import EventBus
from ctxd.memory import HashingEmbedder, Memory, _lexical, _mirror_file
from ctxd.memory import _queries as q
from ctxd.memory._lexical import LexicalIndex
from ctxd.memory._shared import share
from ctxd.store import Store, migrate
from ctxd.tokens import TokenCounter
from ctxd.wire.types import MemoryRecordParams

SCOPES = ["global", "project:a", "project:b"]


def _words(rng: random.Random, count: int) -> str:
    # Zipf-like: a few words in most memories, most words in a few.
    return " ".join(f"w{int(rng.paretovariate(0.8)) % 400}" for _ in range(count))


def _memory(rng: random.Random) -> q.NewMemory:
    return q.NewMemory(
        scope=rng.choice(SCOPES), title=_words(rng, rng.randint(2, 6)),
        description=_words(rng, rng.randint(0, 8)),
        content=_words(rng, rng.randint(5, 40)) + " running runs ran tests tested",
        outcome="success", tags=_words(rng, rng.randint(0, 2)), prior=q.PRIOR_RECORDED,
        source=None, created_at=0.0)


def _open(tmp_path: Path) -> apsw.Connection:
    conn = apsw.Connection(str(tmp_path / "ctxd.db"))
    migrate(conn)
    return conn


def _loaded(conn: apsw.Connection) -> LexicalIndex:
    mirror = LexicalIndex()
    while not mirror.load_more(conn, 64):
        pass
    return mirror


def _check_same_as_fts5(conn: apsw.Connection, mirror: LexicalIndex, query: str,
                        scope: str | None, min_confidence: float) -> int:
    """The mirror's hits are FTS5's: the same scores (to rounding) and the same ranking
    (ties in any order); returns how many hits there were."""
    limit = 20
    fts5 = q.lexical(conn, LexicalIndex(), query, scope, min_confidence, 1000)
    ours = q.lexical(conn, mirror, query, scope, min_confidence, limit)
    assert ours.words_left_out == 0
    expected = dict(fts5.hits)
    assert len(ours.hits) == min(limit, len(fts5.hits))
    for memory_id, score in ours.hits:
        assert score == pytest.approx(expected[memory_id], rel=1e-12)
    if len(fts5.hits) > limit:  # nothing left out scores better than the last kept
        assert sorted(expected.values(), reverse=True)[limit] <= ours.hits[-1][1] + 1e-9
    scores = [score for _, score in ours.hits]
    assert scores == sorted(scores, reverse=True)
    return len(ours.hits)


def test_scores_and_ranks_as_fts5_through_inserts_deletes_and_signals(tmp_path: Path) -> None:
    rng = random.Random(5)
    conn = _open(tmp_path)
    mirror = LexicalIndex()
    with conn:  # half recorded before the mirror is loaded, half while it is loading
        for _ in range(150):
            q.insert(conn, mirror, _memory(rng))
    mirror.load_more(conn, 100)
    assert not mirror.ready
    with conn:
        for _ in range(150):
            q.insert(conn, mirror, _memory(rng))
    while not mirror.load_more(conn, 64):
        pass
    with conn:
        for memory_id in rng.sample(range(1, 301), 60):
            assert q.delete(conn, mirror, memory_id) is not None
        for memory_id in rng.sample(sorted(r[0] for r in conn.execute(
                "SELECT id FROM memories")), 40):
            q.signal(conn, mirror, memory_id, "feedback", False, None, 0.0)
        # The highest id deleted, then a memory inserted: it gets an id never given
        # before (AUTOINCREMENT), not the deleted one's.
        top = conn.execute("SELECT max(id) FROM memories").fetchall()[0][0]
        q.delete(conn, mirror, top)
        fresh, _ = q.insert(conn, mirror, _memory(rng))
        assert fresh.id == 301
    queries = [_words(rng, rng.randint(1, 12)) for _ in range(60)]
    queries += ["tests", "running w1", "the of and"]  # stems; stop words alone
    hits = 0
    for query in queries:
        for scope in (None, "global", "project:a"):
            for min_confidence in (0.0, 0.7):
                hits += _check_same_as_fts5(conn, mirror, query, scope, min_confidence)
    assert hits > 1000  # the queries do find memories
    fresh = _loaded(conn)  # and a mirror loaded from scratch agrees with the one kept in step
    for query in queries[:20]:
        assert (q.lexical(conn, fresh, query, None, 0.0, 50)
                == q.lexical(conn, mirror, query, None, 0.0, 50))


def test_scores_stay_fts5s_when_memories_change_between_queries(tmp_path: Path) -> None:
    # Queries keep their words' BM25 parts; every added or removed memory must drop them,
    # even one that leaves the count of memories, of tokens and of a word's postings as
    # they were (a swap).
    rng = random.Random(11)
    conn = _open(tmp_path)
    mirror = _loaded(conn)

    def record(title: str, content: str) -> int:
        item, _ = q.insert(conn, mirror, q.NewMemory(
            scope="global", title=title, description="", content=content,
            outcome="success", tags="", prior=q.PRIOR_RECORDED, source=None, created_at=0.0))
        return item.id

    with conn:
        for _ in range(60):
            q.insert(conn, mirror, _memory(rng))
        record("first", "zqt")  # zqt's postings: this one, the swapped one, the last one
        swapped = record("swap", "zqt zqt zqa")
        record("last", "zqt zqo zqo zqo zqo")
    queries = [_words(rng, rng.randint(1, 8)) for _ in range(10)] + ["zqt", "zqt zqa zqb"]

    def check_all() -> None:
        for query in queries:
            for scope in (None, "project:a"):
                for min_confidence in (0.0, 0.7):
                    _check_same_as_fts5(conn, mirror, query, scope, min_confidence)

    check_all()
    counts = (mirror._rows, mirror._tokens, mirror._df["zqt"])
    with conn:  # as many memories, tokens and postings of zqt; its parts all move
        q.delete(conn, mirror, swapped)
        record("swap", "zqt zqb zqb")
    assert (mirror._rows, mirror._tokens, mirror._df["zqt"]) == counts
    check_all()
    for change in (
            lambda: [q.insert(conn, mirror, _memory(rng)) for _ in range(5)],
            lambda: [q.delete(conn, mirror, memory_id) for memory_id in (4, 9, 30)],
            lambda: [q.signal(conn, mirror, memory_id, "feedback", False, None, 0.0)
                     for memory_id in (5, 6)]):
        with conn:
            change()
        check_all()


def test_kept_selections_follow_confidence_adds_and_deletes(tmp_path: Path) -> None:
    rng = random.Random(10)
    conn = _open(tmp_path)
    mirror = _loaded(conn)
    with conn:
        for _ in range(40):
            q.insert(conn, mirror, _memory(rng))
    keys = [(scope, min_confidence) for scope in (None, "global", "project:a", "project:b")
            for min_confidence in (0.0, 0.7)]

    def check() -> None:
        for scope, min_confidence in keys:
            selection = mirror.selection(scope, min_confidence)
            assert selection is not None
            bits = np.unpackbits(selection, bitorder="little")
            assert set(np.flatnonzero(bits)) == q.allowed(
                conn, list(range(1, 50)), scope, min_confidence)

    check()
    handed_out = {key: mirror.selection(*key) for key in keys}
    as_handed_out = {key: selection.copy() for key, selection in handed_out.items()
                     if selection is not None}
    with conn:  # Beta(4, 2): 0.667, below 0.7
        for memory_id in (3, 5, 8, 21):
            q.signal(conn, mirror, memory_id, "feedback", False, None, 0.0)
    check()
    with conn:  # Beta(5, 2): 0.714, back above
        q.signal(conn, mirror, 5, "feedback", True, None, 0.0)
        q.signal(conn, mirror, 21, "outcome", True, None, 0.0)
    check()
    for key, selection in handed_out.items():  # FAISS may still be reading those
        assert selection is not None
        assert np.array_equal(selection, as_handed_out[key])
    with conn:
        q.delete(conn, mirror, 10)
        q.insert(conn, mirror, _memory(rng))
        q.signal(conn, mirror, 41, "feedback", False, None, 0.0)
    check()


def test_a_signal_moves_a_memory_across_the_confidence_filter(tmp_path: Path) -> None:
    conn = _open(tmp_path)
    mirror = _loaded(conn)
    with conn:
        item, _ = q.insert(conn, mirror, q.NewMemory(
            scope="global", title="flaky sleep", description="", content="avoid sleeps",
            outcome="success", tags="", prior=q.PRIOR_RECORDED, source=None, created_at=0.0))
    assert [i for i, _ in q.lexical(conn, mirror, "sleep", None, 0.75, 5).hits] == [item.id]
    with conn:  # Beta(4, 2): 0.667
        q.signal(conn, mirror, item.id, "outcome", False, None, 0.0)
    assert q.lexical(conn, mirror, "sleep", None, 0.75, 5).hits == []
    assert [i for i, _ in q.lexical(conn, mirror, "sleep", None, 0.6, 5).hits] == [item.id]
    # What SQLite says decides, whatever a leg proposed: results are read back filtered.
    assert q.by_ids(conn, [item.id], None, 0.75) == {}
    assert list(q.by_ids(conn, [item.id], "project:other", 0.6)) == [item.id]


def test_reads_by_id_look_each_row_up_by_rowid_in_every_scope(tmp_path: Path) -> None:
    conn = _open(tmp_path)
    mirror = _loaded(conn)
    with conn:
        for _ in range(40):
            q.insert(conn, mirror, _memory(random.Random(3)))
    executed: list[tuple[str, tuple[object, ...]]] = []

    def trace(cursor: apsw.Cursor, sql: str, bindings: tuple[object, ...] | None) -> bool:
        executed.append((sql, bindings or ()))
        return True

    ids = list(range(1, 27))
    for scope in (None, "global", "project:a"):
        conn.exec_trace = trace
        found = q.by_ids(conn, ids, scope, 0.5)
        kept = q.allowed(conn, ids, scope, 0.5)
        conn.exec_trace = None
        assert set(found) == kept
        assert kept
        for sql, bindings in executed:
            plan = " ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", bindings))
            assert "USING INTEGER PRIMARY KEY" in plan, (scope, plan)
            assert "memories_by_scope" not in plan, (scope, plan)
        executed.clear()


def test_a_long_query_keeps_its_rarest_words_within_the_postings_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = _open(tmp_path)
    mirror = _loaded(conn)
    with conn:  # "common" in all 30 memories, "middling" in 10, "rare" in 1
        for n in range(30):
            words = ["common"] + (["middling"] if n % 3 == 0 else []) + (
                ["rare"] if n == 7 else [])
            q.insert(conn, mirror, q.NewMemory(
                scope="global", title=f"memory {n}", description="",
                content=" ".join(words), outcome="success", tags="", prior=q.PRIOR_RECORDED,
                source=None, created_at=0.0))
    monkeypatch.setattr(_lexical, "MAX_POSTINGS", 12)
    cut = q.lexical(conn, mirror, "common middling rare", None, 0.0, 50)
    # rare (1 posting) and middling (10) fit in 12; common (30 more) is left out.
    assert cut.words_left_out == 1
    expected = q.lexical(conn, LexicalIndex(), "middling rare", None, 0.0, 50)
    assert [i for i, _ in cut.hits] == [i for i, _ in expected.hits]
    assert (cut.hits[0][0], len(cut.hits)) == (8, 11)
    # The rarest word is always scored, even when it alone is over the budget.
    monkeypatch.setattr(_lexical, "MAX_POSTINGS", 0)
    only = q.lexical(conn, mirror, "common middling", None, 0.0, 50)
    assert (only.words_left_out, len(only.hits)) == (1, 10)
    monkeypatch.setattr(_lexical, "MAX_POSTINGS", 41)
    whole = q.lexical(conn, mirror, "common middling rare", None, 0.0, 50)
    fts5 = q.lexical(conn, LexicalIndex(), "common middling rare", None, 0.0, 50)
    assert (whole.words_left_out, len(whole.hits)) == (0, 30)
    assert [i for i, _ in whole.hits] == [i for i, _ in fts5.hits]


def test_query_words_keep_their_tokens_unless_long(tmp_path: Path) -> None:
    conn = _open(tmp_path)
    mirror = _loaded(conn)
    blob = "a1" * 40  # an identifier or a hash: rarely asked again
    assert mirror.terms(conn, ["running", blob, "tests"]) == ["run", blob, "test"]
    assert mirror.terms(conn, ["tests", "running"]) == ["test", "run"]
    assert sorted(mirror._query_words) == ["running", "tests"]
    assert mirror.terms(conn, ["run-away"]) is None  # two tokens: FTS5 answers the phrase


def test_memories_tied_at_the_limit_are_kept_by_id(tmp_path: Path) -> None:
    conn = _open(tmp_path)
    mirror = _loaded(conn)
    with conn:  # 40 memories alike, every other one global: all tie for "alpha"
        for n in range(40):
            q.insert(conn, mirror, q.NewMemory(
                scope=["global", "project:a"][n % 2], title="alpha", description="",
                content="beta gamma", outcome="success", tags="", prior=q.PRIOR_RECORDED,
                source=None, created_at=0.0))
    ours = q.lexical(conn, mirror, "alpha", "project:a", 0.0, 3)
    assert [i for i, _ in ours.hits] == [1, 2, 3]
    assert ours.hits == q.lexical(conn, LexicalIndex(), "alpha", "project:a", 0.0, 3).hits


def test_words_left_out_are_only_those_the_scopes_hold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = _open(tmp_path)
    mirror = _loaded(conn)
    with conn:  # "middling" in 10 global memories, "common" in 30; "elsewhere" in 40 of b
        for n in range(30):
            words = "common middling" if n < 10 else "common"
            for scope, content in (("global", words), ("project:b", "elsewhere")):
                q.insert(conn, mirror, q.NewMemory(
                    scope=scope, title=f"memory {n}", description="", content=content,
                    outcome="success", tags="", prior=q.PRIOR_RECORDED, source=None,
                    created_at=0.0))
        for _ in range(10):
            q.insert(conn, mirror, q.NewMemory(
                scope="project:b", title="more", description="", content="elsewhere",
                outcome="success", tags="", prior=q.PRIOR_RECORDED, source=None,
                created_at=0.0))
    monkeypatch.setattr(_lexical, "MAX_POSTINGS", 12)
    cut = q.lexical(conn, mirror, "common middling elsewhere", "project:a", 0.0, 50)
    # middling is scored, common is past the budget; elsewhere is past it too, but no
    # memory project:a sees holds it: only common is a word left out.
    assert (cut.words_left_out, len(cut.hits)) == (1, 10)


async def test_a_write_that_fails_after_touching_the_mirror_reloads_it(tmp_path: Path) -> None:
    store = Store(tmp_path / "ctxd.db")
    store.open()
    memory = Memory(store, HashingEmbedder(64), tmp_path / "memory.faiss", MemoryConfig(),
                    EventBus(), TokenCounter())
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(memory.run)
            for n in range(3):
                await memory.record(MemoryRecordParams(title=f"kept {n}", content="kept"))

            await memory.wait_lexical_loaded()

            def fail(conn: apsw.Connection, mirror: LexicalIndex) -> None:
                raise apsw.FullError("database or disk is full")

            with pytest.raises(CtxdError):
                await memory._write(fail)
            assert memory.lexical.ready  # it changed nothing: nothing to load again

            def insert_then_fail(conn: apsw.Connection, mirror: LexicalIndex) -> None:
                q.insert(conn, mirror, q.NewMemory(
                    scope="global", title="phantom", description="", content="phantom",
                    outcome="success", tags="", prior=q.PRIOR_RECORDED, source=None,
                    created_at=0.0))
                raise apsw.FullError("database or disk is full")

            with pytest.raises(CtxdError) as failed:
                await memory._write(insert_then_fail)
            assert failed.value.code == ErrorCode.STORAGE_ERROR
            assert not memory.lexical.ready  # reset in the failed write's own store job
            await memory.wait_lexical_loaded()
            assert memory.lexical._rows == 3
            assert (await store.read(q.lexical, memory.lexical, "phantom", None, 0.0, 5)
                    ).hits == []
            kept = await store.read(q.lexical, memory.lexical, "kept", None, 0.0, 5)
            assert sorted(i for i, _ in kept.hits) == [1, 2, 3]
            nursery.cancel_scope.cancel()
    finally:
        store.close()


async def test_while_the_mirror_loads_the_dense_leg_filters_with_sqlite(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "ctxd.db")
    store.open()
    memory = Memory(store, HashingEmbedder(64), tmp_path / "memory.faiss", MemoryConfig(),
                    EventBus(), TokenCounter())
    query = "deploy the staging cluster with helm"
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(memory.run)
            for _ in range(1000):  # the empty index is made at start
                if memory.index.state == "ready":
                    break
                await trio.sleep(0.01)
            for n in range(30):  # nearer, but in another project
                await memory.record(MemoryRecordParams(title=f"b {n}", content=query,
                                                       scope="project:b"))
            ours = [(await memory.record(MemoryRecordParams(
                title=title, content=content, scope="project:a"))).memory.id
                for title, content in (("helm", "deploy staging with helm charts"),
                                       ("staging", "helm deploy to staging"))]
            await memory.wait_lexical_loaded()
            await store.read(lambda _: memory.lexical.reset())  # as after a rollback
            assert memory.lexical.selection("project:a", 0.0) is None
            found = await memory.retrieve(query, scope="project:a", k=5, min_confidence=0.0,
                                          mode="dense")
            assert (sorted(r.item.id for r in found.ranked), found.legs_used) == (
                sorted(ours), ["dense"])
            nursery.cancel_scope.cancel()
    finally:
        store.close()


def test_the_selection_holds_the_ids_in_scope_with_the_confidence(tmp_path: Path) -> None:
    rng = random.Random(9)
    conn = _open(tmp_path)
    mirror = LexicalIndex()
    assert mirror.selection(None, 0.0) is None  # loading: the dense leg filters with SQLite
    mirror = _loaded(conn)
    with conn:
        for _ in range(40):
            q.insert(conn, mirror, _memory(rng))
        for memory_id in (3, 5, 8):
            q.signal(conn, mirror, memory_id, "feedback", False, None, 0.0)  # 4/6: 0.667
        q.delete(conn, mirror, 10)
    for scope in (None, "global", "project:a", "project:unknown"):
        for min_confidence in (0.0, 0.7):
            selection = mirror.selection(scope, min_confidence)
            assert selection is not None
            bits = np.unpackbits(selection, bitorder="little")
            assert set(np.flatnonzero(bits)) == q.allowed(
                conn, list(range(1, 41)), scope, min_confidence)


def _same_mirrors(conn: apsw.Connection, ours: LexicalIndex, loaded: LexicalIndex,
                  queries: list[str]) -> int:
    """Two mirrors rank every query in every scope alike, scores to the bit, select the
    same ids, and agree with FTS5; returns the hits seen."""
    hits = 0
    for query in queries:
        for scope in (None, "global", "project:a", "team:x", "team:y"):
            for min_confidence in (0.0, 0.7):
                a = q.lexical(conn, ours, query, scope, min_confidence, 50)
                assert a == q.lexical(conn, loaded, query, scope, min_confidence, 50)
                hits += len(a.hits)
                if query == queries[0]:
                    assert np.array_equal(ours.selection(scope, min_confidence),
                                          loaded.selection(scope, min_confidence))
        hits += _check_same_as_fts5(conn, ours, query, "project:a", 0.0)
    return hits


def test_a_mirror_restored_from_its_file_is_the_one_sqlite_gives(tmp_path: Path) -> None:
    # The file is taken, then memories are deleted, signalled, moved to another scope and
    # recorded: the mirror restored from the (now old) file and SQLite is, to the bit, the
    # mirror loaded by tokenizing SQLite's memories.
    rng = random.Random(17)
    conn = _open(tmp_path)
    mirror = _loaded(conn)
    with conn:
        for _ in range(300):
            q.insert(conn, mirror, _memory(rng))
        for memory_id in (3, 40, 41):  # deleted before the file: empty slots in it
            q.delete(conn, mirror, memory_id)
    captured = mirror.capture()
    assert captured is not None
    path = tmp_path / "mirror.npz"
    _mirror_file.write(path, *captured)
    with conn:
        for memory_id in rng.sample(range(50, 301), 40):
            q.delete(conn, mirror, memory_id)
        alive = [r[0] for r in conn.execute("SELECT id FROM memories")]
        for memory_id in rng.sample(alive, 30):
            q.signal(conn, mirror, memory_id, "feedback", rng.random() < 0.5, None, 0.0)
        moved = alive[:3]
        for memory_id in moved:
            assert share(conn, mirror, memory_id, "team:x", None, 0.0) is not None
        for _ in range(25):
            q.insert(conn, mirror, _memory(rng))
    image = _mirror_file.read(path)
    assert image is not None
    assert image.max_id == 300
    restored = LexicalIndex()
    taken = restored.restore(conn, image)
    assert taken == 300 - 3 - 40 - 3  # the moved ones wait to be tokenized again
    assert not restored.ready
    with conn:  # and, while they wait, one moves again and one is deleted
        assert share(conn, restored, moved[1], "team:y", None, 0.0) is not None
        assert q.delete(conn, restored, moved[2]) is not None
    while not restored.load_more(conn, 2):
        pass
    assert restored.rows == _loaded(conn).rows == 300 - 3 - 40 + 25 - 1
    queries = [_words(rng, rng.randint(1, 12)) for _ in range(40)] + ["tests", "running w1"]
    assert _same_mirrors(conn, restored, _loaded(conn), queries) > 1000
    with conn:  # and it keeps in step afterwards, as one loaded from SQLite does
        for memory_id in (moved[0], moved[1], 299, 300):
            q.delete(conn, restored, memory_id)
        for _ in range(10):
            q.insert(conn, restored, _memory(rng))
    assert _same_mirrors(conn, restored, _loaded(conn), queries[:10]) > 100


@pytest.mark.parametrize("damage", ["truncated", "flipped", "format", "inconsistent",
                                    "repeated id", "id past the highest"])
def test_a_damaged_mirror_file_is_refused(tmp_path: Path, damage: str) -> None:
    rng = random.Random(3)
    conn = _open(tmp_path)
    mirror = _loaded(conn)
    with conn:
        for _ in range(50):
            q.insert(conn, mirror, _memory(rng))
    path = tmp_path / "mirror.npz"
    captured = mirror.capture()
    assert captured is not None
    max_id, captures = captured
    if damage == "inconsistent":  # a slot past the shard's memories
        captures[0].ids = captures[0].ids[:1]
        captures[0].length = captures[0].length[:1]
    elif damage == "repeated id":
        captures[0].ids = captures[0].ids.copy()
        captures[0].ids[1] = captures[0].ids[0]
    elif damage == "id past the highest":
        max_id -= 1
    _mirror_file.write(path, max_id, captures)
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        path.write_bytes(bytes(data[:len(data) // 2]))
    elif damage == "flipped":  # a byte of the last array's data: its CRC no longer holds
        at = data.rindex(b"PK\x01\x02") - 40
        data[at] ^= 0xFF
        path.write_bytes(bytes(data))
    elif damage == "format":
        monkey = _mirror_file.FORMAT
        try:
            _mirror_file.FORMAT = monkey + 1
            with pytest.raises(_mirror_file.Unreadable, match="format"):
                _mirror_file.read(path)
        finally:
            _mirror_file.FORMAT = monkey
        return
    with pytest.raises(_mirror_file.Unreadable):
        _mirror_file.read(path)
    assert _mirror_file.read(tmp_path / "absent.npz") is None


def test_no_capture_while_the_mirror_loads(tmp_path: Path) -> None:
    conn = _open(tmp_path)
    rng = random.Random(4)
    with conn:
        for _ in range(10):
            q.insert(conn, LexicalIndex(), _memory(rng))
    mirror = LexicalIndex()
    mirror.load_more(conn, 5)
    assert mirror.capture() is None
    mirror.load_more(conn, 64)
    captured = mirror.capture()
    assert captured is not None
    assert captured[0] == 10


def test_pooled_postings_hold_what_was_added_through_moves_removals_and_compactions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A shard's postings share two pooled arrays: regions grow by moving to the pool's
    # end, a removal moves a region too, and the pool is compacted once most of it is
    # left behind. Against a plain dict of what was added and removed.
    compactions = []
    compact = _lexical._Shard.compact
    monkeypatch.setattr(_lexical._Shard, "compact",
                        lambda shard: compactions.append(shard.used) or compact(shard))
    rng = random.Random(2)
    shard = _lexical._Shard()
    expected: dict[str, dict[int, int]] = {}
    live: list[int] = []
    for memory_id in range(1, 3000):
        tokens = [f"w{int(rng.paretovariate(0.8)) % 300}" for _ in range(rng.randint(1, 30))]
        slot = shard.add(memory_id, tokens, 0.8)
        live.append(slot)
        for term in set(tokens):
            expected.setdefault(term, {})[slot] = tokens.count(term)
        if rng.random() < 0.4:
            gone = live.pop(rng.randrange(len(live)))
            terms = {term for term, held in expected.items() if gone in held}
            shard.remove(gone, terms)
            for term in terms:
                del expected[term][gone]
                if not expected[term]:
                    del expected[term]
    assert compactions  # the pool was compacted (at least once) along the way
    assert set(shard.rows) == set(expected)
    for term, held in expected.items():
        slots, frequencies = shard.postings(term)
        assert slots.tolist() == sorted(held)
        assert frequencies.tolist() == [held[slot] for slot in sorted(held)]
        assert shard.size_of(term) == len(held)
    assert shard.size_of("absent") == 0
    assert shard.ids[:shard.count][live].tolist() == [slot + 1 for slot in live]


def test_memories_recorded_and_deleted_over_and_over_leave_no_rows_behind() -> None:
    # Each memory holds a word of its own (an identifier): deleted, its row empties; the
    # shard drops empty rows once they are most of them, keeping the others' postings.
    shard = _lexical._Shard()
    kept = shard.add(1, ["common", "kept"], 0.8)
    for memory_id in range(2, 20_000):
        slot = shard.add(memory_id, ["common", f"id{memory_id}"], 0.8)
        shard.remove(slot, {"common", f"id{memory_id}"})
    assert len(shard.terms) <= 2 * 1024 + 2
    assert set(shard.rows) == {"common", "kept"}
    for term in ("common", "kept"):
        slots, frequencies = shard.postings(term)
        assert (slots.tolist(), frequencies.tolist()) == ([kept], [1])

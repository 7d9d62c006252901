"""Migrations by user_version, pragmas, and storage failures as -32008."""

import logging
from pathlib import Path

import apsw
import pytest
import trio

from ctxd.errors import CtxdError, ErrorCode
from ctxd.store import (
    DatabaseError,
    Store,
    Transaction,
    migrate,
    recover,
    scalar_int,
    schema_version,
)
from ctxd.store.migrations import load_all

LATEST = len(load_all())


def test_migrates_an_empty_database_to_the_latest_version(tmp_path: Path) -> None:
    conn = apsw.Connection(str(tmp_path / "db"))
    assert schema_version(conn) == 0
    assert migrate(conn) == LATEST
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_schema WHERE type='table'")}
    assert {"sessions", "messages", "branches", "memory_candidates"} <= tables


@pytest.mark.parametrize("start", range(LATEST))
def test_migrates_from_every_older_version(tmp_path: Path, start: int) -> None:
    conn = apsw.Connection(str(tmp_path / "db"))
    assert migrate(conn, target=start) == start
    assert migrate(conn) == LATEST
    assert migrate(conn) == LATEST  # idempotent


def test_version_2_keeps_version_1_sessions_and_messages(tmp_path: Path) -> None:
    conn = apsw.Connection(str(tmp_path / "db"))
    conn.execute("PRAGMA foreign_keys = ON")
    [(_, first)] = load_all()[:1]
    with conn:
        conn.execute(first.SQL)
        conn.execute("PRAGMA user_version = 1")
        conn.execute("INSERT INTO sessions (id, context_window, max_output_tokens, "
                     "compact_trigger, hard_block, warn, caution, message_count, "
                     "tokens_conversation, created_at, updated_at) "
                     "VALUES ('s1', 200000, 8192, 0.95, 0.98, 0.7, 0.8, 2, 12, 1.0, 1.0)")
        conn.executemany("INSERT INTO messages (session_id, seq, role, content, component, "
                         "tokens, created_at) VALUES ('s1', ?, 'user', X'226869', "
                         "'conversation', 6, 1.0)", [(1,), (2,)])
    assert migrate(conn) == LATEST
    assert conn.execute("SELECT message_count, last_seq, folded_tokens FROM sessions"
                        ).fetchall() == [(2, 2, 0)]
    assert conn.execute("SELECT seq, branch_id, discarded FROM messages ORDER BY seq"
                        ).fetchall() == [(1, None, 0), (2, None, 0)]
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []


def test_version_14_keeps_the_events_and_their_high_water_seq(tmp_path: Path) -> None:
    conn = apsw.Connection(str(tmp_path / "db"))
    with conn:
        for _, module in load_all()[:13]:
            conn.execute(module.SQL)
        conn.execute("PRAGMA user_version = 13")
        conn.executemany("INSERT INTO events (seq, ts, session_id, type, data) "
                         "VALUES (?, 1.0, 's1', 'tick', X'7B7D')", [(1,), (2,), (3,)])
        conn.execute("DELETE FROM events WHERE seq = 3")
    assert migrate(conn) == LATEST
    assert conn.execute("SELECT seq FROM events ORDER BY seq").fetchall() == [(1,), (2,)]
    assert conn.execute("SELECT seq FROM events_high_water").fetchall() == [(3,)]
    assert conn.execute("SELECT name FROM sqlite_sequence WHERE name = 'events'"
                        ).fetchall() == []


def test_version_17_keeps_memories_their_signals_and_index_and_never_reuses_an_id(
        tmp_path: Path) -> None:
    conn = apsw.Connection(str(tmp_path / "db"))
    conn.execute("PRAGMA foreign_keys = ON")
    with conn:
        for _, module in load_all()[:16]:
            conn.execute(module.SQL)
        conn.execute("PRAGMA user_version = 16")
        conn.executemany(
            "INSERT INTO memories (scope, title, content, outcome, alpha, beta, created_at, "
            "updated_at, content_tokens) VALUES ('global', ?, ?, 'success', 1, 1, 1.0, 1.0, 3)",
            [("one", "alpha words"), ("two", "bravo words"), ("three", "charlie words")])
        conn.execute("INSERT INTO memory_signals (memory_id, kind, positive, weight, "
                     "created_at) VALUES (2, 'feedback', 1, 1.0, 1.0)")
    assert migrate(conn) == LATEST
    assert conn.execute("PRAGMA foreign_keys").fetchall() == [(1,)]
    assert conn.execute("SELECT id, title, content_tokens FROM memories ORDER BY id"
                        ).fetchall() == [(1, "one", 3), (2, "two", 3), (3, "three", 3)]
    assert conn.execute("SELECT memory_id FROM memory_signals").fetchall() == [(2,)]
    assert conn.execute("SELECT rowid FROM memories_fts WHERE memories_fts MATCH 'bravo'"
                        ).fetchall() == [(2,)]
    with conn:  # the newest removed, the next memory gets an id never given before
        conn.execute("DELETE FROM memories WHERE id IN (2, 3)")
        assert conn.execute("SELECT count(*) FROM memory_signals").fetchall() == [(0,)]
        conn.execute("INSERT INTO memories (scope, title, content, outcome, alpha, beta, "
                     "created_at, updated_at) VALUES ('global', 'four', 'delta words', "
                     "'success', 1, 1, 1.0, 1.0)")
    assert conn.execute("SELECT id FROM memories ORDER BY id").fetchall() == [(1,), (4,)]
    assert conn.execute("SELECT rowid FROM memories_fts WHERE memories_fts MATCH 'delta'"
                        ).fetchall() == [(4,)]
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []


def test_a_recovery_keeps_the_highest_memory_id_ever_given(tmp_path: Path) -> None:
    path = tmp_path / "ctxd.db"
    conn = apsw.Connection(str(path))
    migrate(conn)
    with conn:
        conn.executemany("INSERT INTO memories (scope, title, content, outcome, alpha, beta, "
                         "created_at, updated_at) VALUES ('global', ?, 'c', 'success', 1, 1, "
                         "1.0, 1.0)", [("one",), ("two",), ("three",)])
        conn.execute("DELETE FROM memories WHERE id > 1")
    conn.close()
    assert recover(path).rows["memories"] == 1
    recovered = apsw.Connection(str(path))
    with recovered:
        recovered.execute("INSERT INTO memories (scope, title, content, outcome, alpha, beta, "
                          "created_at, updated_at) VALUES ('global', 'four', 'c', 'success', "
                          "1, 1, 1.0, 1.0)")
    assert recovered.execute("SELECT id, title FROM memories ORDER BY id").fetchall() == [
        (1, "one"), (4, "four")]


def test_refuses_a_newer_database(tmp_path: Path) -> None:
    conn = apsw.Connection(str(tmp_path / "db"))
    conn.execute(f"PRAGMA user_version = {LATEST + 1}")
    with pytest.raises(RuntimeError, match="newer than this ctxd"):
        migrate(conn)


def test_open_sets_wal_foreign_keys_secure_delete_and_private_mode(tmp_path: Path) -> None:
    store = Store(tmp_path / "data" / "ctxd.db")
    store.open()
    conn = store.connection
    assert conn.execute("PRAGMA journal_mode").fetchall()[0][0] == "wal"
    assert scalar_int(conn, "PRAGMA foreign_keys") == 1
    assert scalar_int(conn, "PRAGMA secure_delete") == 1
    assert conn.execute("SELECT v FROM memories_fts_config WHERE k = 'secure-delete'"
                        ).fetchall() == [(1,)]
    assert scalar_int(conn, "PRAGMA synchronous") == 1  # NORMAL
    assert (tmp_path / "data").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "data" / "ctxd.db").stat().st_mode & 0o777 == 0o600
    store.close()


def test_full_durability_syncs_every_commit(tmp_path: Path) -> None:
    store = Store(tmp_path / "ctxd.db", durability="full")
    store.open()
    assert scalar_int(store.connection, "PRAGMA synchronous") == 2  # FULL
    store.close()


async def test_a_full_database_is_a_storage_error_and_rolls_back(tmp_path: Path) -> None:
    store = Store(tmp_path / "ctxd.db", max_db_bytes=256 * 1024)
    store.open()

    def fill(conn: apsw.Connection) -> None:
        conn.execute("INSERT INTO sessions (id, state, context_window, max_output_tokens, "
                     "compact_trigger, hard_block, warn, caution, created_at, updated_at) "
                     "VALUES ('s', 'open', 1000, 10, .95, .98, .7, .8, 0, 0)")
        for seq in range(1, 1000):
            conn.execute("INSERT INTO messages (session_id, seq, role, content, component, "
                         "tokens, created_at) VALUES ('s', ?, 'user', ?, 'conversation', 1, 0)",
                         (seq, b"x" * 1000))

    with pytest.raises(CtxdError) as caught:
        await store.write(fill)
    assert caught.value.code == ErrorCode.STORAGE_ERROR
    assert caught.value.data is not None
    assert caught.value.data["sqlite_error"] == "FullError"
    # Nothing of the failed transaction is left behind.
    assert await store.read(scalar_int, "SELECT count(*) FROM sessions") == 0
    assert await store.read(scalar_int, "SELECT count(*) FROM messages") == 0
    store.close()


async def test_a_transaction_s_after_steps_learn_whether_it_committed(tmp_path: Path) -> None:
    store = Store(tmp_path / "ctxd.db")
    store.open()
    seen: list[bool] = []

    def insert(conn: apsw.Connection, session_id: str) -> None:
        conn.execute("INSERT INTO sessions (id, state, context_window, max_output_tokens, "
                     "compact_trigger, hard_block, warn, caution, created_at, updated_at) "
                     "VALUES (?, 'open', 1000, 10, .95, .98, .7, .8, 0, 0)", (session_id,))

    committed = Transaction()
    committed.add(insert, "a")
    committed.after(lambda: seen.append(committed.committed))
    await store.commit(committed)

    rolled_back = Transaction()
    rolled_back.add(insert, "b")
    rolled_back.add(insert, "a")  # the primary key: the whole transaction rolls back
    rolled_back.after(lambda: seen.append(rolled_back.committed))
    with pytest.raises(apsw.ConstraintError):
        await store.commit(rolled_back)
    assert seen == [True, False]
    assert await store.read(scalar_int, "SELECT count(*) FROM sessions") == 1
    store.close()


SESSION_ROW = ("INSERT OR IGNORE INTO sessions (id, state, context_window, max_output_tokens, "
               "compact_trigger, hard_block, warn, caution, created_at, updated_at) "
               "VALUES ('s', 'open', 1000, 10, .95, .98, .7, .8, 0, 0)")


class Rows:
    """Messages of 4,000 bytes (about a page each) appended to session 's'."""

    def __init__(self) -> None:
        self.seq = 0

    def write(self, conn: apsw.Connection, rows: int) -> None:
        conn.execute(SESSION_ROW)
        for _ in range(rows):
            self.seq += 1
            conn.execute("INSERT INTO messages (session_id, seq, role, content, component, "
                         "tokens, created_at) VALUES ('s', ?, 'user', ?, 'conversation', 1, 0)",
                         (self.seq, b"x" * 4000))


async def advance(clock: trio.testing.MockClock, store: Store, seconds: float) -> None:
    """Move trio's (virtual) clock on and let `Store.keep_wal_small` act on it: its tick
    runs, and a checkpoint it starts finishes (in its thread) before this returns, so what
    the test writes next never races it."""
    clock.jump(seconds)
    await trio.testing.wait_all_tasks_blocked()
    while store.statistics().checkpointing:
        await trio.lowlevel.checkpoint()  # lets the thread's answer in (no time passes)
    await trio.testing.wait_all_tasks_blocked()


async def test_wal_is_checkpointed_off_the_writer(tmp_path: Path,
                                                  mock_clock: trio.testing.MockClock) -> None:
    store = Store(tmp_path / "ctxd.db")
    store.open()
    rows = Rows()
    for _ in range(4):
        await store.write(rows.write, 50)
    assert store._wal_pages > 20  # the WAL hook saw the commits; nothing checkpointed them
    assert store._pages_written == store._wal_pages
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.keep_wal_small, 20, 0.01, 0.05)
        await advance(mock_clock, store, 0.04)  # the store is quiet, but not for 0.05 s yet
        assert store.statistics().checkpoints == 0
        await advance(mock_clock, store, 0.02)
        assert store.statistics().checkpoints == 1
        nursery.cancel_scope.cancel()
    assert store._pages_checkpointed == store._pages_written
    # Everything was copied back, so the next commit starts the WAL from its beginning.
    await store.write(lambda conn: conn.execute("UPDATE sessions SET title = 't'"))
    assert 0 < store._wal_pages <= 3
    assert await store.read(scalar_int, "SELECT count(*) FROM messages") == 200
    store.close()


async def test_a_busy_store_checkpoints_at_a_quiet_moment_or_once_the_wal_grows_long(
        tmp_path: Path, mock_clock: trio.testing.MockClock) -> None:
    store = Store(tmp_path / "ctxd.db")
    store.open()
    rows = Rows()
    # Past 20 pages a checkpoint waits for 0.5 s without a store job: a write every 10 ms
    # for 2 s never gives it one; once they stop, it comes.
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.keep_wal_small, 20, 0.01, 0.5, 1_000_000)
        for _ in range(200):
            await store.write(rows.write, 1)
            await advance(mock_clock, store, 0.01)
        assert store._pages_written > 100
        assert store.statistics().checkpoints == 0
        await advance(mock_clock, store, 0.45)
        assert store.statistics().checkpoints == 0
        await advance(mock_clock, store, 0.1)
        assert store.statistics().checkpoints == 1
        nursery.cancel_scope.cancel()
    assert store._pages_checkpointed == store._pages_written
    await store.write(rows.write, 1)
    assert store._wal_pages < 10  # copied back whole: the WAL started again (was > 100)

    # Under sustained load (five commits between two ticks) a checkpoint comes every 200
    # pages, and the WAL starts again from its beginning instead of growing for as long as
    # it lasts.
    restarts, longest, most_per_tick = 0, 0, 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.keep_wal_small, 20, 0.01, 0.5, 200)
        for _ in range(200):
            written = store._pages_written
            for _ in range(5):
                before = store._wal_pages
                await store.write(rows.write, 3)
                restarts += store._wal_pages < before
                longest = max(longest, store._wal_pages)
            most_per_tick = max(most_per_tick, store._pages_written - written)
            await advance(mock_clock, store, 0.01)  # one tick
        nursery.cancel_scope.cancel()
    before = store._wal_pages
    await store.write(rows.write, 1)  # after the last tick's checkpoint, if it made one
    restarts += store._wal_pages < before
    assert store._pages_written > 1000
    checkpoints = store.statistics().checkpoints - 1
    assert checkpoints >= store._pages_written // (200 + most_per_tick)
    assert restarts == checkpoints
    # A tick that finds more than 200 pages checkpoints them all; the WAL holds at most
    # what was written up to the tick after the one that found 200 or fewer.
    assert longest <= 200 + most_per_tick
    store.close()


async def test_a_checkpoint_overtaken_by_commits_is_finished_in_restart_mode(
        tmp_path: Path, mock_clock: trio.testing.MockClock) -> None:
    """Under load a checkpoint cannot copy back what was committed after it began: until
    one copies the whole WAL back, the WAL cannot start again. A reader holding an old
    snapshot stops a checkpoint at the same place, deterministically."""
    store = Store(tmp_path / "ctxd.db")
    store.open()
    rows = Rows()
    await store.write(rows.write, 10)
    reader = apsw.Connection(str(tmp_path / "ctxd.db"))
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM messages").fetchall() == [(10,)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.keep_wal_small, 20, 0.01, 0.5, 200)
        for _ in range(100):  # 300 pages or more: past 200, whatever a row takes
            await store.write(rows.write, 3)
            await advance(mock_clock, store, 0.01)
            if store.statistics().checkpoints:
                break
        assert store.statistics().checkpoints == 1
        grown = store._wal_pages
        await store.write(rows.write, 1)
        assert store._wal_pages > grown  # the WAL could not start again: it grows on
        reader.execute("COMMIT")  # the old snapshot goes; the next tick copies the rest
        await advance(mock_clock, store, 0.01)
        assert store.statistics().checkpoints == 2
        nursery.cancel_scope.cancel()
    await store.write(rows.write, 1)
    assert store._wal_pages < 10  # copied back whole: the WAL started again
    reader.close()
    store.close()


def sessions_database(path: Path, sessions: int = 300) -> None:
    """A database with enough sessions that their table has leaf pages under its root."""
    store = Store(path)
    store.open()
    with store.connection as conn:
        for n in range(sessions):
            conn.execute("INSERT INTO sessions (id, context_window, max_output_tokens, "
                         "compact_trigger, hard_block, warn, caution, created_at, updated_at) "
                         "VALUES (?, 1000, 10, .95, .98, .7, .8, 0, 0)", (f"session {n}",))
    store.close()


def zero_page_of(path: Path, table: str, kind: str) -> None:
    conn = apsw.Connection(str(path))
    page = conn.execute("SELECT pageno FROM dbstat WHERE name = ? AND pagetype = ? "
                        "ORDER BY pageno", (table, kind)).fetchall()[-1][0]
    conn.close()
    with path.open("r+b") as file:
        file.seek((page - 1) * 4096)
        file.write(bytes(4096))


def test_a_large_database_after_a_clean_stop_reads_only_each_table_s_first_page(
        tmp_path: Path) -> None:
    path = tmp_path / "ctxd.db"
    sessions_database(path)
    zero_page_of(path, "sessions", "leaf")  # the last leaf: not on the first page's path
    # As if the file were larger than the threshold: no quick_check, so the start goes on.
    store = Store(path, quick_check_up_to_bytes=0)
    store.open()
    store.close()
    # Small enough for the threshold: quick_check finds it.
    with pytest.raises(DatabaseError) as caught:
        Store(path).open()
    assert caught.value.corrupt
    # After an unclean shutdown (the WAL left behind), quick_check runs at any size.
    Path(f"{path}-wal").touch()
    with pytest.raises(DatabaseError) as caught:
        Store(path, quick_check_up_to_bytes=0).open()
    assert str(caught.value).startswith(f"the database {path} is corrupt (")


def test_a_damaged_root_page_stops_even_a_large_database(tmp_path: Path) -> None:
    path = tmp_path / "ctxd.db"
    sessions_database(path)
    zero_page_of(path, "sessions", "internal")  # its root
    with pytest.raises(DatabaseError) as caught:
        Store(path, quick_check_up_to_bytes=0).open()
    assert (caught.value.corrupt, str(caught.value)) == (True, (
        f"the database {path} is corrupt (database disk image is malformed); run "
        "`ctxd --recover` to salvage what can be read into a new file (the corrupt one is "
        "kept aside)"))


def test_a_new_database_logs_one_line_an_upgrade_one_a_step(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ctxd.store")
    migrate(apsw.Connection(str(tmp_path / "new")))
    assert [r.getMessage() for r in caplog.records] == [
        f"database created at schema version {LATEST}"]
    caplog.clear()
    older = apsw.Connection(str(tmp_path / "older"))
    migrate(older, target=LATEST - 2)
    caplog.clear()
    migrate(older)
    assert [r.getMessage() for r in caplog.records] == [
        f"database migrated to schema version {LATEST - 1}",
        f"database migrated to schema version {LATEST}"]

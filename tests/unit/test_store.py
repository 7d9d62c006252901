"""Migrations by user_version, pragmas, and storage failures as -32008."""

from pathlib import Path

import apsw
import pytest
import trio

from ctxd.errors import CtxdError, ErrorCode
from ctxd.store import DatabaseError, Store, Transaction, migrate, scalar_int, schema_version
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
    for version, module in load_all()[:start]:
        with conn:
            conn.execute(module.SQL)
            conn.execute(f"PRAGMA user_version = {version}")
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


async def test_wal_is_checkpointed_off_the_writer(tmp_path: Path) -> None:
    store = Store(tmp_path / "ctxd.db")
    store.open()

    def write_rows(conn: apsw.Connection, start: int) -> None:
        conn.execute("INSERT OR IGNORE INTO sessions (id, state, context_window, "
                     "max_output_tokens, compact_trigger, hard_block, warn, caution, "
                     "created_at, updated_at) VALUES ('s', 'open', 1000, 10, .95, .98, .7, "
                     ".8, 0, 0)")
        for seq in range(start, start + 50):
            conn.execute("INSERT INTO messages (session_id, seq, role, content, component, "
                         "tokens, created_at) VALUES ('s', ?, 'user', ?, 'conversation', 1, 0)",
                         (seq, b"x" * 4000))

    for batch in range(4):
        await store.write(write_rows, batch * 50 + 1)
    assert store._wal_pages > 20  # the WAL hook saw the commits; nothing checkpointed them
    assert store._pages_written == store._wal_pages
    async with trio.open_nursery() as nursery:  # the store is quiet: a checkpoint soon
        nursery.start_soon(store.keep_wal_small, 20, 0.01, 0.05)
        for _ in range(1000):  # up to ~10 s of real time: the checkpoint runs in a thread
            if store._pages_checkpointed:
                break
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert store._pages_checkpointed == store._pages_written
    # Everything was copied back, so the next commit starts the WAL from its beginning.
    await store.write(lambda conn: conn.execute("UPDATE sessions SET title = 't'"))
    assert 0 < store._wal_pages <= 3
    assert await store.read(scalar_int, "SELECT count(*) FROM messages") == 200
    store.close()


async def test_a_busy_store_checkpoints_at_a_quiet_moment_or_once_the_wal_grows_long(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "ctxd.db")
    store.open()
    await store.write(lambda conn: conn.execute(
        "INSERT INTO sessions (id, state, context_window, max_output_tokens, "
        "compact_trigger, hard_block, warn, caution, created_at, updated_at) "
        "VALUES ('s', 'open', 1000, 10, .95, .98, .7, .8, 0, 0)"))
    seq = 0

    def write_rows(conn: apsw.Connection, rows: int) -> None:
        nonlocal seq
        for _ in range(rows):
            seq += 1
            conn.execute("INSERT INTO messages (session_id, seq, role, content, component, "
                         "tokens, created_at) VALUES ('s', ?, 'user', ?, 'conversation', 1, 0)",
                         (seq, b"x" * 4000))

    # Past 20 pages a checkpoint waits for 0.5 s without a store job: a write every 10 ms
    # for 2 s never gives it one; once they stop, it comes.
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.keep_wal_small, 20, 0.01, 0.5, 1_000_000)
        busy_until = trio.current_time() + 2.0
        while trio.current_time() < busy_until:
            await store.write(write_rows, 1)
            await trio.sleep(0.01)
        assert store._pages_written > 100
        assert store._pages_checkpointed == 0
        for _ in range(1000):
            if store._pages_checkpointed:
                break
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert store._pages_checkpointed == store._pages_written
    await store.write(write_rows, 1)
    assert store._wal_pages < 10  # copied back whole: the WAL started again (was > 100)

    # Under sustained load (a commit every 2 ms) a checkpoint comes every 200 pages, and
    # the WAL starts again from its beginning instead of growing for as long as it lasts.
    restarts, longest = 0, 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.keep_wal_small, 20, 0.01, 0.5, 200)
        busy_until = trio.current_time() + 2.0
        while trio.current_time() < busy_until:
            before = store._wal_pages
            await store.write(write_rows, 3)
            restarts += store._wal_pages < before
            longest = max(longest, store._wal_pages)
            await trio.sleep(0.002)
        nursery.cancel_scope.cancel()
    assert store._pages_written > 1000
    assert restarts >= 2
    assert longest < 800
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

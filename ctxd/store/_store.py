"""The Store: owner of the one apsw writer connection; every call runs in its worker thread."""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import apsw
import msgspec
import outcome
import trio

from ctxd.errors import CtxdError, ErrorCode
from ctxd.jobs import commit_point
from ctxd.store import migrations

log = logging.getLogger("ctxd.store")
T = TypeVar("T")

CACHE_KIB = 65_536
"""SQLite's page cache (``PRAGMA cache_size``), filled only as pages are read. At the
default 2 MB, reading an injection's memories back from a 94 MB database of 100,000
memories took 0.33 ms at p50, mostly re-reading pages from the OS; at 64 MB, 0.18 ms."""

_STORAGE_FAILURES = (apsw.FullError, apsw.ReadOnlyError, apsw.IOError, apsw.CantOpenError,
                     apsw.CorruptError, apsw.NotADBError, apsw.BusyError)
_CORRUPTION = (apsw.CorruptError, apsw.NotADBError)
_UNREACHABLE = (apsw.CantOpenError, apsw.ReadOnlyError, apsw.IOError, apsw.PermissionsError,
                apsw.AuthError, apsw.BusyError, apsw.FullError)

QUICK_CHECK_UP_TO_BYTES = 128 << 20
"""A database up to this size gets a full ``PRAGMA quick_check`` at every start; a larger
one only after an unclean shutdown (docs/decisions.md, Process: at 1 GiB it took 0.9 s from
the OS cache and 19 s from disk)."""

MARKER = "ctxd.created"
"""The file ctxd writes beside a database it creates: a database missing where this marker
is was lost, not never made (docs/decisions.md, Process)."""


class DatabaseError(Exception):
    """The database cannot be used; the message names the file and says what to do.

    Attributes:
        corrupt: SQLite cannot read it as a database (``ctxd --recover`` may salvage it);
            otherwise it could not be reached (permissions, a read-only file system).
    """

    def __init__(self, message: str, corrupt: bool):
        super().__init__(message)
        self.corrupt = corrupt


def corrupt_message(path: Path, detail: str, running: bool = False) -> str:
    """One sentence for a corrupt database: what is wrong and what to do (``running``: said
    by a daemon that serves on it)."""
    return (f"the database {path} is corrupt ({detail}); {'stop ctxd and ' if running else ''}"
            "run `ctxd --recover` to salvage what can be read into a new file (the corrupt "
            "one is kept aside)")


def scalar_int(conn: apsw.Connection, sql: str, bindings: tuple[Any, ...] = ()) -> int:
    """The integer in the first column of the first row of a query."""
    value = conn.execute(sql, bindings).fetchall()[0][0]
    if not isinstance(value, int):
        raise TypeError(f"{sql!r} returned {value!r}, not an integer")
    return value


def _storage_error(exc: Exception, path: Path) -> CtxdError:
    if isinstance(exc, _CORRUPTION):
        return CtxdError(ErrorCode.STORAGE_ERROR, corrupt_message(path, str(exc), running=True),
                         {"sqlite_error": type(exc).__name__, "corrupt": True,
                          "fix": "stop ctxd, run `ctxd --recover`, start ctxd again"})
    if isinstance(exc, apsw.FullError):
        reason = "the disk or the configured max_db_bytes (the database and its WAL) is full"
    elif isinstance(exc, apsw.ReadOnlyError):
        reason = "the database is read-only"
    else:
        reason = str(exc)
    return CtxdError(ErrorCode.STORAGE_ERROR,
                     f"storage error: {reason}; nothing was written",
                     {"sqlite_error": type(exc).__name__,
                      "fix": "free disk space or raise max_db_bytes, then retry"})


def schema_version(conn: apsw.Connection) -> int:
    """The database's ``PRAGMA user_version``."""
    return scalar_int(conn, "PRAGMA user_version")


def migrate(conn: apsw.Connection, target: int | None = None) -> int:
    """Bring the schema to the newest version (or to ``target``), each step in its own
    transaction.

    Returns:
        The version the database is at afterwards.

    Raises:
        RuntimeError: the database is newer than this ctxd.
    """
    steps = migrations.load_all()
    current = schema_version(conn)
    if current > len(steps):
        raise RuntimeError(f"database schema version {current} is newer than this ctxd "
                           f"({len(steps)}); upgrade ctxd")
    for version, module in steps[current:target]:
        if getattr(module, "FOREIGN_KEYS_OFF", False):
            _migrate_without_foreign_keys(conn, version, module)
        else:
            with conn:
                migrations.apply(conn, module)
                conn.execute(f"PRAGMA user_version = {version:d}")
        if current:  # an upgrade: each step said (a new database: one line, below)
            log.info("database migrated to schema version %d", version)
    reached = schema_version(conn)
    if not current and reached:
        log.info("database created at schema version %d", reached)
    return reached


def _migrate_without_foreign_keys(conn: apsw.Connection, version: int,
                                  module: ModuleType) -> None:
    """A step that rebuilds a table others reference (its module sets
    ``FOREIGN_KEYS_OFF``), as SQLite's documentation says to: foreign keys off outside the
    transaction (dropping the old table would run its cascades), checked before commit,
    then as they were.

    Raises:
        RuntimeError: the step left a row whose key points nowhere (nothing is committed).
    """
    enforced = scalar_int(conn, "PRAGMA foreign_keys")
    conn.execute("PRAGMA foreign_keys = OFF")
    try:
        with conn:
            migrations.apply(conn, module)
            broken = conn.execute("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise RuntimeError(f"migration to schema version {version} would leave rows "
                                   f"whose foreign key points nowhere: {broken[:5]}")
            conn.execute(f"PRAGMA user_version = {version:d}")
    finally:
        conn.execute(f"PRAGMA foreign_keys = {enforced:d}")


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def quick_check(conn: apsw.Connection) -> list[str]:
    """What ``PRAGMA quick_check`` finds wrong (nothing: an empty list)."""
    found = [str(row[0]) for row in conn.execute("PRAGMA quick_check")]
    return [] if found == ["ok"] else found


def integrity_problems(path: Path) -> list[str]:
    """What ``PRAGMA integrity_check`` finds wrong in the database at ``path``, read-only
    (nothing: an empty list); blocking, safe beside a running daemon.

    Raises:
        DatabaseError: there is no database at ``path``, or it cannot be read.
    """
    if not path.exists():
        raise DatabaseError(f"there is no database at {path}", corrupt=False)
    try:
        conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    except _UNREACHABLE as exc:
        raise DatabaseError(f"cannot read the database {path} ({exc})", corrupt=False) from None
    try:
        found = [str(row[0]) for row in conn.execute("PRAGMA integrity_check")]
    except _CORRUPTION as exc:
        return [str(exc)]
    except _UNREACHABLE as exc:
        raise DatabaseError(f"cannot read the database {path} ({exc})", corrupt=False) from None
    finally:
        conn.close()
    return [] if found == ["ok"] else found


def _checkpoint(conn: apsw.Connection, mode: int) -> int:
    """A checkpoint in this mode; returns how far it copied the WAL back, in pages."""
    _, copied = conn.wal_checkpoint(mode=mode)
    return int(copied)


class WorkerThread:
    """One long-lived thread that runs jobs in submission order.

    Cheaper per call than ``trio.to_thread.run_sync`` (no limiter, no thread-cache
    hand-off), and it makes "one connection, one thread" literal.
    """

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` in the thread and return its result (or raise its exception).

        Cancellation: not abandoned; a cancelled caller waits for ``fn`` to finish, so a
        transaction is either committed and answered or rolled back, never left running.
        """
        token = trio.lowlevel.current_trio_token()
        task = trio.lowlevel.current_task()

        def job() -> None:
            result = outcome.capture(fn)
            token.run_sync_soon(trio.lowlevel.reschedule, task, result)

        self.submit(job)
        value: T = await trio.lowlevel.wait_task_rescheduled(
            lambda _: trio.lowlevel.Abort.FAILED)
        return value

    def submit(self, job: Callable[[], None]) -> None:
        """Queue ``job`` and return at once (from any thread); it must not raise."""
        self._jobs.put(job)

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join()


class StoreStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What `Store.statistics` reports."""

    commits: int
    """Transactions committed since the store was opened."""
    jobs_running: int
    """Jobs submitted and not finished (queued or running in the store's thread)."""
    checkpoints: int
    """Checkpoints `Store.keep_wal_small` has finished (copied back what it could)."""
    checkpointing: bool
    """Whether one is running now."""


class Transaction:
    """Writes that commit together, each added by the package that owns its tables.

    A session actor composes one: the session's rows, its branches' rows and the memory
    signals of one request, so that no package passes SQL through another
    (docs/architecture.md). Steps run in the order they were added.
    """

    def __init__(self) -> None:
        self._steps: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self._on_rollback: list[Callable[[], None]] = []
        self._after: list[Callable[[], None]] = []
        self.committed = False
        """Set by `Store.commit` once the transaction committed (before the `after` steps
        run, so they can tell a commit from a rollback)."""

    def add(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(conn, *args)`` in the transaction (in the store's thread)."""
        self._steps.append((fn, args))

    def on_rollback(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` in the store's thread right after a rollback, before any other
        job (to undo what a step did outside SQLite)."""
        self._on_rollback.append(fn)

    def after(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on the event loop once the transaction committed or rolled back
        (`committed` says which)."""
        self._after.append(fn)

    def run(self, conn: apsw.Connection) -> None:
        for fn, args in self._steps:
            fn(conn, *args)

    def rolled_back(self) -> None:
        for fn in self._on_rollback:
            fn()

    def finished(self) -> None:
        for fn in self._after:
            fn()


class Store:
    """The database: one connection, one thread at a time, WAL.

    Args:
        path: the database file (its folder is created 0700).
        durability: ``normal`` (survives a killed daemon) or ``full`` (fsync each commit).
        max_db_bytes: writes that would grow the file and its WAL past this fail with -32008
            (0 = no cap).
        quick_check_up_to_bytes: a database up to this size gets ``PRAGMA quick_check`` at
            every `open`, a larger one only after an unclean shutdown.
    """

    def __init__(self, path: Path, durability: str = "normal", max_db_bytes: int = 0,
                 quick_check_up_to_bytes: int = QUICK_CHECK_UP_TO_BYTES):
        self.path = path
        self._quick_check_up_to_bytes = quick_check_up_to_bytes
        self._durability = durability
        self._max_db_bytes = max_db_bytes
        self._conn: apsw.Connection | None = None
        self._worker: WorkerThread | None = None
        self._wal_pages = 0
        """The WAL's length in pages after the last commit (it starts again from 0 once a
        checkpoint has copied it all back)."""
        self._pages_written = 0
        """Pages the commits have written to the WAL (the store's thread counts them)."""
        self._pages_checkpointed = 0
        """`_pages_written` when the last checkpoint started."""
        self._commits = 0
        """Transactions committed (the store's thread counts them)."""
        self._page_size = 4096
        self._corruption_logged = False
        self._jobs_running = 0
        self._last_job_at = 0.0
        """When the last job was submitted or finished (trio's clock)."""
        self._checkpoints = 0
        self._checkpointing = False

    def open(self, check: bool = True) -> None:
        """Open (creating if needed), check and migrate; blocking, called once at start-up.

        Args:
            check: run ``PRAGMA quick_check`` first (docs/decisions.md, Process).

        Raises:
            DatabaseError: the database is corrupt (SQLite cannot read it, or the check
                finds a problem), or it cannot be opened or written.
        """
        conn: apsw.Connection | None = None
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._warn_if_lost()
            # SQLite removes the WAL when the last connection closes cleanly.
            unclean = os.path.exists(str(self.path) + "-wal")
            conn = apsw.Connection(str(self.path))
            self._configure(conn)
            if check:
                self._check(conn, unclean)
            migrate(conn)
            os.chmod(self.path, 0o600)
            self._write_marker()
        except _CORRUPTION as exc:
            if conn is not None:
                conn.close()
            raise DatabaseError(corrupt_message(self.path, str(exc)), corrupt=True) from None
        except (*_UNREACHABLE, OSError) as exc:
            if conn is not None:
                conn.close()
            detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise DatabaseError(
                f"cannot open the database {self.path} for writing ({detail}); ctxd needs a "
                "data directory it can write (check its permissions, and that its file "
                "system is not mounted read-only), or choose another --data-dir",
                corrupt=False) from None
        self._conn = conn
        self._worker = WorkerThread("ctxd-store")

    def _configure(self, conn: apsw.Connection) -> None:
        conn.set_busy_timeout(5000)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA foreign_keys = ON")
        # What a delete removes is overwritten with zeros, not left in free space (the
        # deleted-data promise of docs/security.md).
        conn.execute("PRAGMA secure_delete = ON")
        conn.execute(f"PRAGMA cache_size = -{CACHE_KIB:d}")
        conn.execute("PRAGMA synchronous = " + ("FULL" if self._durability == "full" else "NORMAL"))
        if self._max_db_bytes:
            self._page_size = scalar_int(conn, "PRAGMA page_size")
            self._leave_room_for_the_wal(conn)
        # Checkpoints run in `keep_wal_small`, between requests, not inside their commits:
        # this hook replaces SQLite's auto-checkpoint and only records the WAL's length.
        conn.set_wal_hook(self._on_commit)

    def _check(self, conn: apsw.Connection, unclean: bool) -> None:
        """The first page of every table (milliseconds), then the whole file with
        ``PRAGMA quick_check`` when it is small or the last run did not stop cleanly.

        Raises:
            apsw.CorruptError: what is wrong.
        """
        names = [str(row[0]) for row in conn.execute(
            "SELECT tbl_name FROM sqlite_schema WHERE type = 'table' AND rootpage > 0")]
        for name in names:
            # Every column: `SELECT 1` may read a covering index instead of the table.
            conn.execute(f'SELECT * FROM "{name}" LIMIT 1').fetchall()
        size = os.stat(self.path).st_size
        if not unclean and size > self._quick_check_up_to_bytes:
            return
        started = time.perf_counter()
        problems = quick_check(conn)
        if problems:
            raise apsw.CorruptError(problems[0])
        log.info("database checked (quick_check%s): ok in %.2f s",
                 ", after an unclean shutdown" if unclean else "",
                 time.perf_counter() - started)

    def _warn_if_lost(self) -> None:
        """Say so, loudly, when the database is missing or empty where ctxd made one."""
        marker = self.path.with_name(MARKER)
        try:
            created = marker.read_text().strip()
        except FileNotFoundError:
            return
        try:
            if os.stat(self.path).st_size:
                return
            what = "is empty (0 bytes)"
        except FileNotFoundError:
            what = "is missing"
        log.error("the database %s %s, but ctxd created one there (%s, says %s): every "
                  "session and memory it held is gone; starting with an empty database. To "
                  "restore a backup instead, stop ctxd and put it at %s", self.path, what,
                  created, marker, self.path)

    def _write_marker(self) -> None:
        marker = self.path.with_name(MARKER)
        if not marker.exists():
            marker.write_text(f"created {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
            os.chmod(marker, 0o600)

    def close(self) -> None:
        """Checkpoint and close; blocking."""
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
        if self._conn is not None:
            try:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except apsw.Error as exc:
                log.warning("checkpoint at close failed: %s", exc)
            self._conn.close()
            self._conn = None

    @property
    def connection(self) -> apsw.Connection:
        if self._conn is None:
            raise RuntimeError("store is not open")
        return self._conn

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` in the store's thread.

        Cancellation: the call is not abandoned; a cancelled caller waits for it to finish.
        """
        return await self._submit(fn, args, False)

    async def write(self, fn: Callable[..., T], *args: Any,
                    on_rollback: Callable[[], None] | None = None) -> T:
        """Run ``fn(conn, *args)`` in one transaction in the store's thread.

        The transaction has committed when this returns, so the caller may acknowledge.
        Should it roll back instead, ``on_rollback()`` runs right after, in the same
        thread, before any other job (to undo what ``fn`` did outside SQLite).

        Raises:
            CtxdError: -32008 when SQLite could not commit; the transaction rolled back.
                -32006 when the request it writes for was cancelled: nothing was written.

        Cancellation: the write is the request's commit point (docs/protocol.md,
        "Cancellation"); once it starts it finishes, and the request is answered as done.
        """
        commit_point()
        return await self._submit(fn, args, True, on_rollback)

    async def commit(self, transaction: Transaction) -> None:
        """Run a `Transaction`'s steps in one transaction, like `write`.

        Raises:
            CtxdError: -32008 when SQLite could not commit; nothing was written.
        """
        try:
            await self.write(transaction.run, on_rollback=transaction.rolled_back)
            transaction.committed = True
        finally:
            transaction.finished()

    async def _submit(self, fn: Callable[..., T], args: tuple[Any, ...], transaction: bool,
                      on_rollback: Callable[[], None] | None = None) -> T:
        if self._worker is None:
            raise RuntimeError("store is not open")
        self._jobs_running += 1
        self._last_job_at = trio.current_time()
        try:
            return await self._worker.run(lambda: self._run(fn, args, transaction, on_rollback))
        finally:
            self._jobs_running -= 1
            self._last_job_at = trio.current_time()

    def _on_commit(self, conn: apsw.Connection, database: str, wal_pages: int) -> int:
        grown = wal_pages - self._wal_pages
        self._pages_written += grown if grown >= 0 else wal_pages
        self._wal_pages = wal_pages
        return apsw.SQLITE_OK

    async def keep_wal_small(self, max_wal_pages: int = 2000, every_s: float = 0.1,
                             quiet_s: float = 0.25, most_wal_pages: int = 16_000) -> None:
        """Checkpoint once the commits have written more than ``max_wal_pages`` pages to
        the WAL since the last checkpoint and the store has run no job for ``quiet_s``;
        past ``most_wal_pages`` at once, busy or not.

        Runs for the daemon's lifetime. SQLite's own auto-checkpoint would run inside some
        request's commit and put its milliseconds on that request's latency. A checkpoint
        beside the writer still slows the commits that run while it copies and syncs
        (they wait for the file system's journal: 5 to 20 ms on the development machine,
        once every 80 branch creations at 2,000 pages), hence a quiet moment when there is
        one; under sustained load one checkpoint per ``most_wal_pages`` (64 MB). Such a
        checkpoint is overtaken by the commits that come while it runs, and until one
        copies the whole WAL back the WAL cannot start again from its beginning: it would
        only grow. So the next tick copies what is left in RESTART mode, which holds the
        next commit back while it does (only what came meanwhile: milliseconds).

        Cancellation: a checkpoint in progress finishes first (it is not abandoned).
        """
        # Its own connection, in its own thread: a PASSIVE checkpoint copies pages back
        # while the writer goes on committing, instead of holding the writer's thread.
        checkpointer = apsw.Connection(str(self.path))
        checkpointer.set_busy_timeout(5000)
        # A connection learns that the database is in WAL mode when it first reads it;
        # until then its checkpoints do nothing (and say so with (-1, -1)).
        checkpointer.execute("PRAGMA journal_mode").fetchall()
        overtaken = False
        try:
            while True:
                await trio.sleep(every_s)
                quiet = (not self._jobs_running
                         and trio.current_time() - self._last_job_at >= quiet_s)
                pending = self._pages_written - self._pages_checkpointed
                if overtaken:
                    mode = apsw.SQLITE_CHECKPOINT_RESTART
                elif (pending > max_wal_pages and quiet) or pending > most_wal_pages:
                    mode = apsw.SQLITE_CHECKPOINT_PASSIVE
                else:
                    continue
                self._pages_checkpointed = self._pages_written
                self._checkpointing = True
                try:
                    copied = await trio.to_thread.run_sync(_checkpoint, checkpointer, mode)
                except apsw.BusyError:
                    continue  # the writer kept the lock past the busy timeout: next tick
                finally:
                    self._checkpointing = False
                self._checkpoints += 1
                overtaken = not quiet and copied < self._wal_pages
        finally:
            checkpointer.close()

    def _run(self, fn: Callable[..., T], args: tuple[Any, ...], transaction: bool,
             on_rollback: Callable[[], None] | None = None) -> T:
        conn = self.connection
        try:
            if not transaction:
                return fn(conn, *args)
            if self._max_db_bytes:
                self._leave_room_for_the_wal(conn)
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn, *args)
                conn.execute("COMMIT")
                self._commits += 1
            except BaseException:
                # SQLite may already have rolled back by itself (SQLITE_FULL, for one).
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if on_rollback is not None:
                    on_rollback()
                raise
            return result
        except _STORAGE_FAILURES as exc:
            if isinstance(exc, _CORRUPTION) and not self._corruption_logged:
                self._corruption_logged = True  # once: every later request would repeat it
                log.error("%s", corrupt_message(self.path, str(exc), running=True))
            raise _storage_error(exc, self.path) from exc

    def _leave_room_for_the_wal(self, conn: apsw.Connection) -> None:
        """``max_db_bytes`` counts the WAL too: the database may grow only into the room
        the WAL leaves under the cap (a write may pass it by its own pages in the WAL;
        docs/decisions.md, Process). A WAL past a quarter of the cap is copied back and
        truncated first, here, in the writer's thread: `keep_wal_small` waits for 2,000
        pages, which would leave a small cap no room at all."""
        wal = str(self.path) + "-wal"
        wal_bytes = _size(wal)
        if wal_bytes > self._max_db_bytes // 4:
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            except apsw.BusyError:
                pass  # a reader holds the WAL: what it leaves counts
            wal_bytes = _size(wal)
            if not wal_bytes:
                self._wal_pages = 0  # the WAL starts again from its beginning
        pages = max(1, (self._max_db_bytes - wal_bytes) // self._page_size)
        conn.execute(f"PRAGMA max_page_count = {pages:d}")

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(commits=self._commits, jobs_running=self._jobs_running,
                               checkpoints=self._checkpoints,
                               checkpointing=self._checkpointing)

    def size_bytes(self) -> int:
        """The database file plus its WAL, in bytes."""
        total = 0
        for suffix in ("", "-wal"):
            try:
                total += os.stat(str(self.path) + suffix).st_size
            except FileNotFoundError:
                pass
        return total

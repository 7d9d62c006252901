"""The team database on a real PostgreSQL (tests/postgres.py): its schema, a memory
recorded once per scope and content, signals that add up across connections, operations
applied at most once whatever retries them (the server killed mid-transaction, or after
its commit but before the answer), changes in commit order, and notifications."""

from __future__ import annotations

import threading

import psycopg
import pytest
from postgres import Postgres

from ctxd.team import (
    Delete,
    Listener,
    Operation,
    Record,
    Signal,
    apply,
    changes_since,
    last_change,
    migrate,
)
from ctxd.team._postgres import _apply_one


@pytest.fixture
def conninfo(postgres: Postgres) -> str:
    """A fresh database of the module's server, migrated."""
    info = postgres.database()
    with psycopg.connect(info) as conn:
        migrate(conn)
    return info


def record(content: str, scope: str = "team:payments", title: str = "Tests") -> Record:
    return Record(scope=scope, title=title, description="", content=content,
                  outcome="success", tags=["ci"], alpha=4.0, beta=1.0,
                  recorded_by={"machine": "box-a", "user": "ana"}, created_at=1.0)


def test_migrating_again_finds_nothing_to_do(conninfo: str) -> None:
    with psycopg.connect(conninfo) as conn:
        assert migrate(conn) == 1
        assert conn.execute("SELECT version FROM ctxd_team_schema").fetchall() == [(1,)]


def test_the_same_memory_recorded_twice_is_one_row(conninfo: str) -> None:
    with psycopg.connect(conninfo) as conn:
        [first] = apply(conn, [Operation("a:1", record("Run  the tests with .venv/bin/pytest"))])
        [again] = apply(conn, [Operation("b:1", record("run the tests with\n.venv/bin/pytest"))])
        [other] = apply(conn, [Operation("b:2", record("run the tests with .venv/bin/pytest",
                                                        scope="team:web"))])
        assert first.now
        assert again.now
        assert other.now
        assert first.memory_id == again.memory_id != other.memory_id
        assert conn.execute("SELECT count(*) FROM ctxd_team_memories").fetchone() == (2,)


def test_an_operation_is_applied_once_however_often_it_is_sent(conninfo: str) -> None:
    with psycopg.connect(conninfo) as conn:
        [made] = apply(conn, [Operation("a:1", record("Pin TZ=UTC in conftest.py"))])
        assert made.memory_id is not None
        signal = Operation("a:2", Signal(made.memory_id, alpha=1.0, uses=1))
        [applied] = apply(conn, [signal])
        assert (applied.memory_id, applied.now) == (made.memory_id, True)
        [retried] = apply(conn, [signal])
        assert (retried.memory_id, retried.now) == (made.memory_id, False)
        assert conn.execute("SELECT alpha, usage_count FROM ctxd_team_memories").fetchone() == (
            5.0, 1)


def test_signals_from_many_connections_add_up_exactly(conninfo: str) -> None:
    with psycopg.connect(conninfo) as conn:
        [made] = apply(conn, [Operation("a:1", record("Deploys go through CI"))])
    assert made.memory_id is not None
    memory_id = made.memory_id

    def machine(name: str) -> None:
        with psycopg.connect(conninfo) as own:
            for n in range(40):
                apply(own, [Operation(f"{name}:{n}", Signal(memory_id, alpha=1.0, beta=0.5,
                                                            uses=1))])

    threads = [threading.Thread(target=machine, args=(f"m{k}",)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with psycopg.connect(conninfo) as conn:
        assert conn.execute("SELECT alpha, beta, usage_count FROM ctxd_team_memories"
                            ).fetchone() == (4.0 + 120, 1.0 + 60, 120)


def test_changes_come_in_commit_order_page_by_page_and_by_scope(conninfo: str) -> None:
    with psycopg.connect(conninfo) as conn:
        made = apply(conn, [Operation(f"a:{n}", record(f"lesson {n}", scope)) for n, scope in
                            enumerate(["team:payments", "team:web", "team:payments"])])
        first, _, third = (applied.memory_id for applied in made)
        assert first is not None
        assert third is not None
        apply(conn, [Operation("a:9", Signal(first, alpha=1.0))])
        apply(conn, [Operation("a:10", Delete(third))])
        seen, seq = [], 0
        while page := changes_since(conn, seq, ["team:payments"], limit=1):
            seen.append((page[0].memory_id, page[0].alpha, page[0].deleted))
            seq = page[0].seq
        # Each memory as it is now, at its latest change: the deleted one last.
        assert seen == [(first, 5.0, False), (third, 4.0, True)]
        assert seq == last_change(conn)
        assert [c.memory_id for c in changes_since(conn, 0, ["team:web"])] == [made[1].memory_id]
        assert changes_since(conn, seq, ["team:payments"]) == []


def test_a_commit_notifies_the_listeners(conninfo: str) -> None:
    listener = Listener.open(conninfo)
    try:
        assert listener.wait(0.01) is None
        with psycopg.connect(conninfo) as conn:
            apply(conn, [Operation("a:1", record("Use ruff, not flake8"))])
            latest = last_change(conn)
        assert listener.wait(30) == latest
    finally:
        listener.close()


def test_a_server_killed_mid_transaction_loses_it_and_the_retry_applies_once(
        postgres: Postgres, conninfo: str) -> None:
    operations = [Operation("a:1", record("Cache pip downloads in CI")),
                  Operation("a:2", record("Never push to main"))]
    conn = psycopg.connect(conninfo)

    def die_before_the_commit() -> None:
        with conn.transaction():
            for operation in operations:  # apply's steps, uncommitted when the server dies
                _apply_one(conn, operation)
            postgres.kill()

    with pytest.raises(psycopg.OperationalError):
        die_before_the_commit()
    conn.close()
    postgres.start()
    with psycopg.connect(conninfo) as again:
        assert [applied.now for applied in apply(again, operations)] == [True, True]
        # Killed after the commit, before the drain saw the answer: the retry is a no-op.
        postgres.kill()
    postgres.start()
    with psycopg.connect(conninfo) as after:
        assert [applied.now for applied in apply(after, operations)] == [False, False]
        assert after.execute("SELECT count(*) FROM ctxd_team_memories").fetchone() == (2,)

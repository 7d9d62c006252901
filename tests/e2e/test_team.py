"""Team memory end to end (docs/decisions.md, "Team memory"): two daemons on their own data
directories share one team database on a real PostgreSQL (tests/postgres.py). A memory
recorded on one is found on the other; the recording daemon's writes wait in its outbox
while the database is down and land exactly once when it is back; a new daemon catches up
from nothing. Waits are for a condition (a notification usually ends them in well under a
second), never assertions on time."""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import kill_leftovers, short_root
from daemon_process import DaemonProcess
from postgres import Postgres

from ctxclient import RpcError

WAIT_S = 60.0


@pytest.fixture
def conninfo(postgres: Postgres) -> str:
    return postgres.database()


@pytest.fixture
def root() -> Iterator[Path]:
    folder = short_root()
    yield folder
    kill_leftovers(folder)


def teammate(root: Path, name: str, conninfo: str) -> DaemonProcess:
    """A daemon of team ``payments`` (its own data directory), the database's URL in
    its environment."""
    config = root / f"{name}.toml"
    config.write_text('[memory.team]\nname = "payments"\npoll_interval_s = 0.5\n')
    return DaemonProcess(root, name=name, data=root / f"{name}-data",
                         extra_args=["--config", str(config)],
                         env={"TEAM_MEMORY_DATABASE_URL": conninfo}).start()


def wait_for(what: Callable[[], Any]) -> Any:
    """``what()`` once it is truthy; fails after `WAIT_S`."""
    deadline = time.monotonic() + WAIT_S
    while not (found := what()):
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.05)
    return found


def ctxctl(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ctxclient.cli", "--socket",
                           str(daemon.socket), *args], capture_output=True, text=True,
                          timeout=60, check=False, env={**os.environ, "NO_COLOR": "1"})


def search(daemon: DaemonProcess, query: str, scope: str = "team:payments",
           mode: str = "lexical") -> list[dict[str, Any]]:
    with daemon.client() as client:
        return client.call("memory.search", {"query": query, "scope": scope,
                                             "mode": mode})["results"]


def status(daemon: DaemonProcess) -> dict[str, Any]:
    with daemon.client() as client:
        return client.call("daemon.status")["team"]


LESSON = {"title": "Tests need the venv",
          "content": "Run the tests with .venv/bin/pytest -q; the system python lacks the "
                     "extras.", "scope": "team:payments"}


def test_a_memory_recorded_on_one_teammate_is_found_on_the_other(root: Path,
                                                                 conninfo: str) -> None:
    ana, ben = teammate(root, "ana", conninfo), teammate(root, "ben", conninfo)
    try:
        wait_for(lambda: status(ana)["connected"] and status(ben)["connected"])
        with ana.client() as client:
            client.call("memory.record", LESSON)
        [found] = wait_for(lambda: search(ben, "system python extras"))
        assert (found["title"], found["content"], found["scope"]) == (
            LESSON["title"], LESSON["content"], "team:payments")
        # A session of a project sees its team's memories beside its own, by both legs;
        # another team's scope does not.
        for mode in ("lexical", "dense", "hybrid"):
            assert [hit["id"] for hit in search(ben, "system python extras", "project:app",
                                                mode)] == [found["id"]], mode
        assert search(ben, "system python extras", "team:web") == []
        with ben.client() as client:
            item = client.call("memory.get", {"id": found["id"]})["memory"]
        # Who recorded it: the user and machine of ana's daemon (this machine here).
        assert item["source"] == f"{getpass.getuser()}@{socket.gethostname()}"
        assert wait_for(lambda: status(ana)["outbox_depth"] == 0)
        # Recorded again in other case on ben: the same shared memory, not a second, and
        # ben keeps the one copy it mirrored.
        with ben.client() as client:
            again = client.call("memory.record", {**LESSON,
                                                  "content": LESSON["content"].upper()})
        wait_for(lambda: status(ben)["outbox_depth"] == 0)
        with psycopg.connect(conninfo) as conn:
            assert conn.execute("SELECT count(*) FROM ctxd_team_memories").fetchone() == (1,)
        assert [hit["id"] for hit in search(ben, "system python extras")] == [found["id"]]
        with ben.client() as client, pytest.raises(RpcError, match="unknown memory"):
            client.call("memory.get", {"id": again["memory"]["id"]})
    finally:
        ana.stop()
        ben.stop()


def test_writes_wait_for_the_database_and_land_once(root: Path, postgres: Postgres,
                                                    conninfo: str) -> None:
    ana = teammate(root, "ana", conninfo)
    try:
        wait_for(lambda: status(ana)["connected"])
        postgres.kill()
        wait_for(lambda: not status(ana)["connected"])
        with ana.client() as client:
            for n in range(3):
                client.call("memory.record", {**LESSON, "title": f"Lesson {n}",
                                              "content": f"lesson number {n}"})
        assert status(ana)["outbox_depth"] == 3
        down = ctxctl(ana, "team", "status")
        assert down.returncode == 1
        assert down.stdout.startswith("team payments: not connected (")
        assert down.stdout.endswith("  outbox 3\n")
        assert "ctxctl: the team database is unreachable" in down.stderr
        assert ctxctl(ana, "doctor").returncode == 1
        postgres.start()
        wait_for(lambda: status(ana)["connected"] and status(ana)["outbox_depth"] == 0)
        with psycopg.connect(conninfo) as conn:
            assert conn.execute("SELECT count(*) FROM ctxd_team_memories").fetchone() == (3,)
        # A teammate who joins now catches up from nothing.
        cid = teammate(root, "cid", conninfo)
        try:
            found = wait_for(lambda: len(search(cid, "lesson number")) == 3
                             and search(cid, "lesson number"))
            assert sorted(hit["title"] for hit in found) == ["Lesson 0", "Lesson 1",
                                                             "Lesson 2"]
            assert status(cid)["lag_changes"] == 0
        finally:
            cid.stop()
    finally:
        ana.stop()


def test_signals_from_both_teammates_add_up_and_a_deletion_reaches_both(
        root: Path, conninfo: str) -> None:
    ana, ben = teammate(root, "ana", conninfo), teammate(root, "ben", conninfo)
    try:
        wait_for(lambda: status(ana)["connected"] and status(ben)["connected"])
        with ana.client() as client:
            mine = client.call("memory.record", LESSON)["memory"]["id"]
            # Before it has left the outbox: the record goes first, then the signal.
            client.call("memory.feedback", {"id": mine, "helpful": True})
        [theirs] = wait_for(lambda: search(ben, "system python extras"))
        with ben.client() as client:
            for _ in range(3):
                client.call("memory.outcome", {"id": theirs["id"], "succeeded": True})
            client.call("memory.feedback", {"id": theirs["id"], "helpful": False})

        def counts() -> tuple[float, float]:
            with psycopg.connect(conninfo) as conn:
                row = conn.execute("SELECT alpha, beta FROM ctxd_team_memories").fetchone()
                assert row is not None
                return float(row[0]), float(row[1])

        # Beta(4, 1) recorded; +1 (ana), +3 and a negative one (ben), each applied once.
        wait_for(lambda: counts() == (8.0, 2.0))
        wait_for(lambda: status(ana)["outbox_depth"] == status(ben)["outbox_depth"] == 0)
        assert counts() == (8.0, 2.0)

        def confidence(daemon: DaemonProcess, memory_id: int) -> float:
            with daemon.client() as client:
                return float(client.call("memory.get", {"id": memory_id})["memory"][
                    "confidence"])

        assert wait_for(lambda: confidence(ana, mine) == 0.8 and confidence(ben, theirs["id"])
                        == 0.8)
        with ana.client() as client:
            client.call("memory.delete", {"id": mine})
        wait_for(lambda: search(ben, "system python extras") == [])
        with psycopg.connect(conninfo) as conn:
            assert conn.execute("SELECT deleted FROM ctxd_team_memories").fetchone() == (True,)
    finally:
        ana.stop()
        ben.stop()


def test_a_local_memory_shared_reaches_the_team_and_ctxctl_says_so(
        root: Path, conninfo: str) -> None:
    ana, ben = teammate(root, "ana", conninfo), teammate(root, "ben", conninfo)
    try:
        with ana.client() as client:
            mine = client.call("memory.record", {**LESSON, "scope": "project:app"})
        memory_id = mine["memory"]["id"]
        assert search(ben, "system python extras", "project:app") == []
        done = ctxctl(ana, "memory", "share", str(memory_id), "--team", "payments")
        assert (done.returncode, done.stdout) == (
            0, f"memory {memory_id} shared with team:payments (it leaves through the outbox: "
               "ctxctl status shows the team link)\n")
        wait_for(lambda: search(ben, "system python extras"))
        again = ctxctl(ana, "memory", "share", str(memory_id), "--team", "payments")
        assert again.returncode == 1
        assert f"memory {memory_id} is shared already (team:payments)" in again.stderr
        wait_for(lambda: status(ana)["outbox_depth"] == 0)
        linked = ctxctl(ana, "team", "status")
        assert (linked.returncode, linked.stdout) == (
            0, "team payments: connected  lag 0 changes  outbox 0\n")
        assert "team payments: connected" in ctxctl(ana, "status", "--format", "plain").stdout
        # Removing it removes it for the team: not without --yes (no terminal to ask at).
        kept = ctxctl(ana, "memory", "rm", str(memory_id))
        assert (kept.returncode, kept.stdout, kept.stderr) == (
            2, "", f"ctxctl: memory {memory_id} is shared with team:payments: removing it "
                   "removes it for everyone there; to do so, run `ctxctl memory rm "
                   f"{memory_id} --yes`\n")
        assert search(ben, "system python extras")
        gone = ctxctl(ana, "memory", "rm", str(memory_id), "--yes")
        assert (gone.returncode, gone.stdout) == (0, f"memory {memory_id} deleted\n")
        wait_for(lambda: search(ben, "system python extras") == [])
    finally:
        ana.stop()
        ben.stop()


def test_the_database_killed_during_a_drain_loses_and_doubles_nothing(
        root: Path, postgres: Postgres, conninfo: str) -> None:
    """Two hundred records, and the server SIGKILLed as the link drains them: whatever it
    was doing (between pages, mid-transaction, committed before the answer came), after
    its restart the database holds each memory once and every entry was applied once."""
    ana = teammate(root, "ana", conninfo)
    try:
        wait_for(lambda: status(ana)["connected"])
        with ana.client() as client:
            for n in range(200):
                client.call("memory.record", {**LESSON, "title": f"Lesson {n}",
                                              "content": f"drained lesson {n}"})
        postgres.kill()  # the link drains them as they come: killed wherever it is
        postgres.start()
        wait_for(lambda: status(ana)["connected"] and status(ana)["outbox_depth"] == 0)
        with psycopg.connect(conninfo) as conn:
            assert conn.execute("SELECT count(*), count(DISTINCT content) FROM "
                                "ctxd_team_memories").fetchone() == (200, 200)
            assert conn.execute("SELECT count(*) FROM ctxd_team_applied").fetchone() == (200,)
    finally:
        ana.stop()

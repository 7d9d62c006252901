"""Team memory (docs/performance.md, "Team memory"): on a real PostgreSQL started here
(tests/postgres.py), ten daemons of one team record memories at once; the lag of each
record is the time from its `memory.record` call on its daemon to the `memory.recorded`
event of its mirrored copy on an observer daemon (one machine: one clock). Then a new
daemon joins and catches up on everything the team recorded, timed until its mirror has
read the database's last change, against a `memory.reindex` of as many memories on
another daemon in the same run (the baseline: the local rebuild of a dense index).

    .venv/bin/python bench/team.py [--daemons 10] [--each 100] [--catch-up 10000]

Then search latency (`--search`, default 100,000 memories): `memory.search` in a
project's scope on a daemon whose memories are all local, against one where half are the
team's (a project's query sees its own and all the team's), the same queries, with
`daemon.ping` on each as the floor.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import apsw
import psycopg
from _common import REPO_ROOT, DaemonProcess, percentile
from folding import mb, vm_bytes

sys.path.append(str(REPO_ROOT / "tests"))
from postgres import Postgres

from ctxd.team import content_key, migrate


def teammate(root: Path, name: str, conninfo: str) -> DaemonProcess:
    config = root / f"{name}.toml"
    config.write_text('[memory.team]\nname = "bench"\npoll_interval_s = 1.0\n')
    return DaemonProcess(root, name=name, data=root / f"{name}-data",
                         extra_args=["--config", str(config)], code=REPO_ROOT,
                         env={"TEAM_MEMORY_DATABASE_URL": conninfo}).start()


def events(daemon: DaemonProcess, seen: dict[str, float], stop: threading.Event) -> None:
    """Record when each mirrored memory's ``memory.recorded`` event reaches ``daemon``."""
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(str(daemon.socket))
    sock.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "events.subscribe",
                             "params": {"types": ["memory.recorded"]}}).encode() + b"\n")
    sock.settimeout(0.2)
    buffer = b""
    with contextlib.closing(sock):
        while not stop.is_set():
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                return
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                message = json.loads(line)
                data = (message.get("params") or {}).get("data") or {}
                if data.get("scope") == "team:bench" and data.get("source"):
                    seen.setdefault(str(data["id"]), time.monotonic())


def lag(root: Path, conninfo: str, daemons: int, each: int) -> list[float]:
    """Seconds from each record to its mirrored copy's event on the observer."""
    observer = teammate(root, "observer", conninfo)
    recorders = [teammate(root, f"r{k}", conninfo) for k in range(daemons)]
    seen: dict[str, float] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=events, args=(observer, seen, stop), daemon=True)
    watcher.start()
    time.sleep(1.0)  # the links connect and the subscription is in place
    started: dict[str, float] = {}
    lock = threading.Lock()

    def record(k: int, daemon: DaemonProcess) -> None:
        with daemon.client() as client:
            for n in range(each):
                title = f"lesson {k}-{n}"
                at = time.monotonic()
                client.call("memory.record", {"title": title, "scope": "team:bench",
                                              "content": f"bench lesson {k} {n} content"})
                with lock:
                    started[title] = at

    threads = [threading.Thread(target=record, args=(k, d)) for k, d in enumerate(recorders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    deadline = time.monotonic() + 120
    while len(seen) < daemons * each and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    with observer.client() as client:
        titles = {}
        cursor = None
        while True:
            page = client.call("memory.list", {"scope": "team:bench", "limit": 1000,
                                               **({"cursor": cursor} if cursor else {})})
            titles.update({str(m["id"]): m["title"] for m in page["memories"]})
            cursor = page["next_cursor"]
            if not cursor:
                break
    for daemon in [observer, *recorders]:
        daemon.stop()
    return [seen[memory_id] - started[title] for memory_id, title in titles.items()
            if memory_id in seen and title in started]


def catch_up(root: Path, conninfo: str, count: int
             ) -> tuple[float, float, int | None, int | None]:
    """(seconds a new daemon takes to mirror ``count`` shared memories, seconds a
    ``memory.reindex`` of ``count`` memories takes on the same daemon, its peak RSS once
    its memory is whole after the catch-up, and after the reindex)."""
    with psycopg.connect(conninfo) as conn:
        migrate(conn)
        # Seeded with COPY (the outbox's path, a page of 1,000 a transaction, runs at about
        # a thousand a second here: a million would take longer than what it measures).
        with conn.cursor().copy(
                "COPY ctxd_team_memories (scope, content_key, title, description, content, "
                "outcome, tags, alpha, beta, created_at, updated_at, change_seq) FROM STDIN"
        ) as copy:
            for n in range(count):
                content = f"seeded lesson number {n} about the build"
                copy.write_row(("team:bench", content_key(content), f"seeded {n}", "",
                                content, "success", "[]", 4.0, 1.0, 1.0, 1.0, n + 1))
        conn.execute("SELECT setval('ctxd_team_changes', %s)", (count,))
        conn.commit()
        last = count
    began = time.monotonic()
    joiner = teammate(root, "joiner", conninfo)
    with joiner.client() as client:
        while (client.call("daemon.status")["team"] or {}).get("last_change", 0) < last:
            time.sleep(0.05)
        joined = time.monotonic() - began
        while not client.call("daemon.status")["memory_index"]["whole"]:
            time.sleep(0.05)  # an index that regrew meanwhile takes over what it missed
        assert joiner.proc is not None
        peak_joined = vm_bytes(joiner.proc.pid, "VmHWM")
        client.timeout = None
        began = time.monotonic()
        client.call("memory.reindex")
        rebuilt = time.monotonic() - began
        peak_rebuilt = vm_bytes(joiner.proc.pid, "VmHWM")
    joiner.stop()
    return joined, rebuilt, peak_joined, peak_rebuilt


WORDS = sorted({word.strip(".,:;()`*[]\"'").lower()
                for path in (REPO_ROOT / "docs").glob("*.md")
                for word in path.read_text().split() if word.isascii()} - {""})
"""The vocabulary of the synthetic memories and queries: the project's documentation."""


def seed(daemon: DaemonProcess, rows: list[tuple[str, str, str]]) -> None:
    """``rows`` (scope, title, content) written into the daemon's store while it is
    stopped (the mirror's rows are plain memory rows; its start indexes them)."""
    daemon.start()
    daemon.stop()
    conn = apsw.Connection(str(daemon.data_dir / "ctxd.db"))
    with conn:
        conn.executemany(
            "INSERT INTO memories (scope, title, description, content, outcome, tags, alpha, "
            "beta, created_at, updated_at) VALUES (?, ?, '', ?, 'success', '', 4.0, 1.0, 1.0, "
            "1.0)", rows)
    conn.close()


def search_latency(root: Path, count: int, queries: int = 300) -> dict[str, list[float]]:
    """memory.search (hybrid, k 5, a project's scope) on ``count`` memories all local
    (20 projects and global) against half of them shared (the team's scope: a project's
    query sees them all), the same queries; daemon.ping on each as the floor."""
    rng = random.Random(29)

    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    memories = [(text(6), text(40)) for _ in range(count)]
    projects = [f"project:p{k}" for k in range(20)]
    local = [(projects[n % 20] if n % 5 else "global", *memories[n]) for n in range(count)]
    half = [(("team:bench" if n % 2 else projects[n % 20]), *memories[n])
            for n in range(count)]
    asked = [(rng.choice(projects), " ".join(
        [*rng.sample(memories[rng.randrange(count)][1].split(), 4), text(3)]))
        for _ in range(queries)]
    timings: dict[str, list[float]] = {}
    for name, rows in (("all local", local), ("half shared", half)):
        daemon = DaemonProcess(root, name=name.replace(" ", "-"), code=REPO_ROOT,
                               data=root / f"{name.replace(' ', '-')}-data")
        seed(daemon, rows)
        daemon.start()
        try:
            with daemon.client(timeout=600) as client:
                while client.call("daemon.status")["memory_index"]["state"] != "ready":
                    time.sleep(0.1)
                client.call("memory.search", {"query": "warm up", "scope": projects[0]})
                pings, searches = [], []
                for scope, query in asked:
                    began = time.perf_counter()
                    client.call("daemon.ping")
                    pings.append(time.perf_counter() - began)
                    began = time.perf_counter()
                    client.call("memory.search", {"query": query, "scope": scope, "k": 5})
                    searches.append(time.perf_counter() - began)
            timings[f"{name}: ping"] = pings
            timings[f"{name}: search"] = searches
        finally:
            daemon.stop()
    return timings


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--daemons", type=int, default=10)
    cli.add_argument("--each", type=int, default=100, help="memories each daemon records")
    cli.add_argument("--catch-up", type=int, default=10_000, dest="catch_up",
                     help="shared memories a new daemon catches up on")
    cli.add_argument("--search", type=int, default=100_000,
                     help="memories of the search latency comparison (0: skip it)")
    args = cli.parse_args()
    server = Postgres()
    try:
        with tempfile.TemporaryDirectory(prefix="ctxd-team-") as folder:
            root = Path(folder)
            with psycopg.connect(server.conninfo, autocommit=True) as admin:
                admin.execute("CREATE DATABASE lag")
                admin.execute("CREATE DATABASE catchup")
            samples = lag(root, server.conninfo.replace("dbname=postgres", "dbname=lag"),
                          args.daemons, args.each)
            total = args.daemons * args.each
            print(f"sync lag, {args.daemons} daemons recording {args.each} each at once: "
                  f"{len(samples)} of {total} seen; p50 {percentile(samples, 0.5) * 1000:.0f} "
                  f"ms, p99 {percentile(samples, 0.99) * 1000:.0f} ms, max "
                  f"{max(samples) * 1000:.0f} ms, mean {statistics.mean(samples) * 1000:.0f} ms")
            joined, rebuilt, peak_joined, peak_rebuilt = catch_up(
                root, server.conninfo.replace("dbname=postgres", "dbname=catchup"),
                args.catch_up)
            print(f"catch-up of a new daemon on {args.catch_up:,} shared memories: "
                  f"{joined:.1f} s (start included); memory.reindex of as many: "
                  f"{rebuilt:.1f} s; ratio {joined / rebuilt:.2f}")
            print(f"the new daemon's peak RSS (VmHWM): {mb(peak_joined)} by its "
                  f"memory whole after the catch-up, {mb(peak_rebuilt)} after the "
                  "reindex")
            if args.search:
                timings = search_latency(root, args.search)
                for name, timed in timings.items():
                    print(f"{name} at {args.search:,} memories: p50 "
                          f"{percentile(timed, 0.5) * 1000:.2f} ms, p99 "
                          f"{percentile(timed, 0.99) * 1000:.2f} ms")
                ratio = percentile(timings["half shared: search"], 0.99) / percentile(
                    timings["all local: search"], 0.99)
                print(f"search p99, half shared / all local: {ratio:.2f}")
            return 0 if len(samples) == total else 1
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())

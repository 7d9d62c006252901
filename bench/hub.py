"""Hub benchmarks (docs/performance.md, the hub's sections), each against a baseline
measured in the same run.

Event replay: 100,000 events persisted in a daemon's ``events`` table (written into the
stopped daemon's database, each the data of a real ``message.appended``), then one
subscriber with ``events.subscribe {since_seq: 0}`` on a raw socket, timed from the
request to the 100,000th event's line; every seq is checked, in order, none missing. The
baseline: the same rows read and JSON-decoded straight from SQLite in this process (what
the daemon's replay cannot beat). Target: at least 50,000 events/s.

Request path: ``message.append`` of 1 KB (each publishes ``message.appended``, now
written to the table) p50/p99 on a daemon of a baseline revision (``--baseline``, default
``main``: where events are kept in memory) and one of this tree.

Run: ``python bench/hub.py [--events N] [--baseline REV] [--skip-append]``.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import apsw
import msgspec

sys.path.append(str(Path(__file__).resolve().parent))
from _common import Connection, request_line, start_daemons
from daemon_process import DaemonProcess

APPENDED = {"branch_id": None, "first_seq": 41, "last_seq": 41, "count": 1, "tokens": 260,
            "main_thread_tokens": 10_614}


def fill_events(database: Path, count: int) -> None:
    conn = apsw.Connection(str(database))
    now = time.time() - count / 1000
    data = msgspec.json.encode(APPENDED)
    with conn:
        conn.executemany("INSERT INTO events (seq, ts, session_id, type, data) "
                         "VALUES (?, ?, ?, ?, ?)",
                         ((seq, now + seq / 1000, "bench", "message.appended", data)
                          for seq in range(1, count + 1)))
    conn.close()


def read_directly(database: Path) -> float:
    """Events/s of one SELECT over the table, each row's data JSON-decoded."""
    conn = apsw.Connection(str(database), flags=apsw.SQLITE_OPEN_READONLY)
    decode = msgspec.json.Decoder(dict[str, object]).decode
    started = time.perf_counter()
    count = sum(1 for _, _, _, _, data in conn.execute(
        "SELECT seq, ts, session_id, type, data FROM events ORDER BY seq") if decode(data))
    elapsed = time.perf_counter() - started
    conn.close()
    return count / elapsed


def replay_rate(path: Path, count: int) -> float:
    """Events/s from ``events.subscribe {since_seq: 0}`` to the last event's line."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    started = time.perf_counter()
    sock.sendall(request_line("events.subscribe", {"since_seq": 0}))
    buffer = b""
    expected = 1
    answered = False
    decode = msgspec.json.decode
    while expected <= count:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("the daemon closed the connection")
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            message = decode(line)
            if not answered:
                answered = "result" in message
                continue
            seq = message["params"]["seq"]
            if seq != expected:
                raise AssertionError(f"expected seq {expected}, got {seq}")
            expected += 1
    elapsed = time.perf_counter() - started
    sock.close()
    return count / elapsed


def event_replay(count: int) -> None:
    print(f"## Event replay of {count:,} persisted events, one subscriber")
    with tempfile.TemporaryDirectory(prefix="ctxd-bench-") as folder:
        daemon = DaemonProcess(Path(folder)).start()
        daemon.stop()
        database = daemon.data_dir / "ctxd.db"
        fill_events(database, count)
        baseline = min(read_directly(database) for _ in range(3))
        daemon.start()
        try:
            rates = [replay_rate(daemon.socket, count) for _ in range(3)]
        finally:
            daemon.stop()
    rate = statistics.median(rates)
    print(f"baseline (SELECT + JSON decode in this process): {baseline:,.0f} events/s")
    print(f"replay over the socket: {rate:,.0f} events/s (median of 3: "
          f"{', '.join(f'{r:,.0f}' for r in rates)}); {rate / baseline:.2f}x the baseline; "
          f"target >= 50,000: {'met' if rate >= 50_000 else 'NOT met'}")


def append_latency(baseline: str, appends: int) -> None:
    print(f"\n## message.append of 1 KB, {appends} in a row, events written to the table")
    content = ("lorem ipsum dolor sit amet " * 40)[:1024]
    with contextlib.ExitStack() as stack:
        daemons = start_daemons(stack, baseline, {})
        figures = {}
        for label, daemon in daemons.items():
            connection = Connection(daemon.socket)
            connection.call("session.open", {"session_id": "bench", "budget": {
                "context_window": 10_000_000}})
            line = request_line("message.append", {"session_id": "bench", "messages": [
                {"role": "user", "content": content}]})
            latencies = []
            for _ in range(appends):
                started = time.perf_counter()
                connection.call_line(line)
                latencies.append(time.perf_counter() - started)
            connection.close()
            latencies.sort()
            figures[label] = (latencies[len(latencies) // 2],
                              latencies[int(len(latencies) * 0.99)])
            print(f"{label}: p50 {figures[label][0] * 1e3:.3f} ms, "
                  f"p99 {figures[label][1] * 1e3:.3f} ms")
        (base50, base99), (this50, this99) = figures[baseline], figures["this tree"]
        print(f"this tree / {baseline}: p50 {this50 / base50:.2f}x, p99 {this99 / base99:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--baseline", default="main")
    parser.add_argument("--appends", type=int, default=2_000)
    parser.add_argument("--skip-append", action="store_true")
    args = parser.parse_args()
    event_replay(args.events)
    if not args.skip_append:
        append_latency(args.baseline, args.appends)
    return 0


if __name__ == "__main__":
    sys.exit(main())

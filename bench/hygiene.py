"""Hygiene benchmark: offloaded tool results, each figure against a baseline measured in
the same run.

1. Appending a 1 MB tool result (offloaded: stored in ``tool_result_blobs``, rendered as
   its stub) against appending a 1 KB one (inline), alternated on one daemon, one
   ``message.append`` at a time: p50 and p99 of each, and their ratio (target: p99 within
   10x). The blob's write is the floor of the offloaded path: its MB/s (1 MB over the
   append's p50) is set against a raw SQLite insert of the same 1 MB text in its own
   transaction, with the daemon's pragmas (WAL, synchronous NORMAL), in a file beside
   the daemon's database.
2. ``result.read`` with a pattern over a 10 MB blob (about 165,000 lines of a test log, one in
   1,000 matching): MB/s at p50 (target: at least 100), against the same search
   (``ctxd.hygiene.grep``) run in this process on the same text: the floor, without the
   blob's read from SQLite and the round trip.

Run: ``python bench/hygiene.py`` (about a minute).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

import apsw

sys.path.append(str(Path(__file__).resolve().parent))
from _common import Connection, request_line
from daemon_process import DaemonProcess

from ctxd.hygiene import compile_pattern, grep

MB = 1_000_000


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def log_text(size: int, every: int = 1000) -> str:
    """A test run's output of ``size`` characters (ASCII), a failure every ``every`` lines."""
    lines = []
    total = 0
    i = 0
    while total < size:
        i += 1
        line = (f"tests/unit/test_module_{i % 97}.py::test_case_{i} "
                f"{'FAILED assert 1 == 2' if i % every == 0 else 'PASSED'} [{i % 100:3d}%]\n")
        lines.append(line)
        total += len(line)
    return "".join(lines)[:size]


def timed(conn: Connection, line: bytes) -> float:
    start = time.perf_counter()
    answer = conn.call_line(line)
    elapsed = time.perf_counter() - start
    if b'"error"' in answer[:200]:
        raise RuntimeError(answer[:500].decode())
    return elapsed


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f} ms"


def raw_sqlite_inserts(folder: Path, text: str, runs: int) -> list[float]:
    """A 1 MB TEXT inserted by apsw in its own transaction, with the daemon's pragmas."""
    conn = apsw.Connection(str(folder / "raw.db"))
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE blobs (id INTEGER PRIMARY KEY, text TEXT NOT NULL)")
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO blobs (text) VALUES (?)", (text,))
        conn.execute("COMMIT")
        samples.append(time.perf_counter() - start)
    conn.close()
    return samples


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_argument("--runs", type=int, default=200, help="appends of each size")
    options.add_argument("--reads", type=int, default=20, help="searches of the 10 MB blob")
    args = options.parse_args()
    with tempfile.TemporaryDirectory(prefix="ctxd-bh-") as folder, contextlib.ExitStack() as stack:
        root = Path(folder)
        daemon = DaemonProcess(root, extra_args=["--max-request-bytes", str(64 << 20)])
        stack.enter_context(daemon.running())
        conn = Connection(daemon.socket)
        stack.callback(conn.close)
        big, small = log_text(MB), log_text(1_000)
        for sid in ("big", "small", "search"):
            conn.call("session.open", {"session_id": sid,
                                       "budget": {"context_window": 10_000_000}})
        lines = {sid: request_line("message.append", {"session_id": sid, "messages": [
            {"role": "tool", "name": "bash", "tool_call_id": "c1", "content": text}]})
                 for sid, text in (("big", big), ("small", small))}
        for sid in ("big", "small"):  # warm up
            for _ in range(5):
                timed(conn, lines[sid])
        samples: dict[str, list[float]] = {"big": [], "small": []}
        for _ in range(args.runs):
            for sid in ("big", "small"):
                samples[sid].append(timed(conn, lines[sid]))
        raw = raw_sqlite_inserts(root, big, args.runs)
        print(f"appends, {args.runs} of each, alternated: p50 / p99")
        for sid, what in (("small", "1 KB tool result (inline)  "),
                          ("big", "1 MB tool result (offloaded)")):
            print(f"  {what} {ms(percentile(samples[sid], 0.5))} / "
                  f"{ms(percentile(samples[sid], 0.99))}")
        ratio50 = percentile(samples["big"], 0.5) / percentile(samples["small"], 0.5)
        ratio99 = percentile(samples["big"], 0.99) / percentile(samples["small"], 0.99)
        print(f"  ratio 1 MB / 1 KB: p50 {ratio50:.1f}x, p99 {ratio99:.1f}x (target p99 <= 10x)")
        blob_rate = 1 / percentile(samples["big"], 0.5)
        raw_rate = 1 / percentile(raw, 0.5)
        print(f"  blob path {blob_rate:,.0f} MB/s (1 MB / append p50); raw SQLite insert "
              f"{raw_rate:,.0f} MB/s (p50 {ms(percentile(raw, 0.5))}); "
              f"{blob_rate / raw_rate:.2f}x of raw")

        ten = log_text(10 * MB)
        conn.call("message.append", {"session_id": "search", "messages": [
            {"role": "tool", "name": "bash", "tool_call_id": "c1", "content": ten}]})
        [message] = conn.call("message.list", {"session_id": "search"})["messages"]  # type: ignore[index]
        ref_id = message["ref_id"]
        pattern = r"FAILED assert \d+ == \d+"
        read = request_line("result.read", {"session_id": "search", "ref_id": ref_id,
                                            "pattern": pattern, "max_matches": 100})
        answer = conn.call("result.read", {"session_id": "search", "ref_id": ref_id,
                                           "pattern": pattern, "max_matches": 100})
        reads = [timed(conn, read) for _ in range(args.reads)]
        compiled = compile_pattern(pattern, literal=False)
        local = []
        for _ in range(args.reads):
            start = time.perf_counter()
            _, found = grep(ten, compiled, 100, 60.0)
            local.append(time.perf_counter() - start)
        assert found == answer["matched_lines"], (found, answer["matched_lines"])
        print(f"result.read with a pattern over 10 MB ({answer['matched_lines']:,} matching "
              f"lines, {len(answer['matches']):,} returned), {args.reads} runs:")
        daemon_rate = 10 / percentile(reads, 0.5)
        local_rate = 10 / percentile(local, 0.5)
        print(f"  daemon p50 {ms(percentile(reads, 0.5))}, p99 {ms(percentile(reads, 0.99))}: "
              f"{daemon_rate:,.0f} MB/s (target >= 100)")
        print(f"  the same search in this process (hygiene.grep) p50 {ms(percentile(local, 0.5))}: "
              f"{local_rate:,.0f} MB/s; daemon at {daemon_rate / local_rate:.2f}x of it")
    return 0


if __name__ == "__main__":
    sys.exit(main())

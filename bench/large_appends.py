"""Large-append benchmark: the daemon's peak RSS while it counts and stores one large
message, per byte of the request, for a daemon of a baseline revision (``--baseline``,
default ``main``) and one of this tree, in the same run.

Each append is one ``message.append`` of one message (``allow_over``, a fresh session),
of 1, 4 and 16 MiB, one at a time, then four of 16 MiB at once (four connections, four
sessions). Two kinds of content:

* ``prose``: English prose, about 0.23 tokens per byte;
* ``letters``: one run of random lowercase letters with no space, which tiktoken's
  pre-split leaves as one piece, so its BPE merges run over the whole text (the worst
  case for the tokenizer's memory: docs/performance.md, Large appends).

Before each measurement the daemon's high-water mark is reset (``/proc/PID/clear_refs``),
so the figure is its peak RSS during the request(s) (``VmHWM``) less its RSS just before,
over the request bytes. Each answer is checked (no error, one message counted). The
script reports; it exits 0 once the daemons have started.

Run: ``python bench/large_appends.py`` (about five minutes: 16 MiB of letters takes
main's tokenizer about 30 s).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

sys.path.append(str(Path(__file__).resolve().parent))
from _common import Connection, request_line, start_daemons
from daemon_process import DaemonProcess

MIB = 1024 * 1024
PROSE = ("The daemon keeps each transcript, counts every message with the real tokenizer "
         "and decides what goes into the next prompt; a fold keeps the lesson. ")
MAX_REQUEST_BYTES = 80 * MIB
RUNS = [(1, 1), (4, 1), (16, 1), (16, 4)]
"""(MiB per append, appends at once)."""


def content(kind: str, size: int) -> str:
    if kind == "prose":
        return (PROSE * (size // len(PROSE) + 1))[:size]
    return "".join(random.Random(size).choices("abcdefghijklmnopqrstuvwxyz", k=size))


def memory_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


@dataclass(frozen=True)
class Figures:
    rss_before_mib: float
    peak_mib: float
    request_bytes: int
    seconds: float

    @property
    def ratio(self) -> float:
        return (self.peak_mib - self.rss_before_mib) * MIB / self.request_bytes


def measure(daemon: DaemonProcess, kind: str, mib: int, at_once: int, tag: str) -> Figures:
    assert daemon.proc is not None
    pid = daemon.proc.pid
    text = content(kind, mib * MIB)
    connections, lines = [], []
    for index in range(at_once):
        conn = Connection(daemon.socket)
        sid = f"large_{tag}_{index}"
        conn.call("session.open", {"session_id": sid,
                                   "budget": {"context_window": 10_000_000}})
        connections.append(conn)
        lines.append(request_line("message.append", {
            "session_id": sid, "allow_over": True,
            "messages": [{"role": "user", "content": text}]}))
    del text
    failures: list[str] = []

    def send(conn: Connection, line: bytes) -> None:
        answer = msgspec.json.decode(conn.call_line(line))
        if "error" in answer or len(answer["result"]["appended"]) != 1:
            failures.append(str(answer.get("error")))

    with open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM to the current RSS
    before = memory_kib(pid, "VmRSS")
    start = time.perf_counter()
    senders = [threading.Thread(target=send, args=pair)
               for pair in zip(connections, lines, strict=True)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    seconds = time.perf_counter() - start
    peak = memory_kib(pid, "VmHWM")
    for conn in connections:
        conn.close()
    if failures:
        raise RuntimeError(f"append failed: {failures[0]}")
    return Figures(before / 1024, peak / 1024, sum(len(line) for line in lines), seconds)


def main(argv: Sequence[str] | None = None) -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    cli.add_argument("--baseline", default="main", help="git revision to compare against")
    cli.add_argument("--kinds", nargs="+", default=["prose", "letters"],
                     choices=["prose", "letters"])
    args = cli.parse_args(argv)
    rows = []
    with contextlib.ExitStack() as stack:
        daemons = start_daemons(stack, args.baseline,
                                {"CTXD_MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES)})
        for kind in args.kinds:
            for mib, at_once in RUNS:
                for label, daemon in daemons.items():
                    figures = measure(daemon, kind, mib, at_once, f"{kind}_{mib}_{at_once}")
                    rows.append((kind, mib, at_once, label, figures))
                    print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    print("peak RSS during the append(s), less RSS before, per request byte")
    print(f"{'content':8} {'append':>14} {'daemon':10} {'RSS before':>11} {'peak':>9} "
          f"{'peak/bytes':>10} {'time':>7}")
    for kind, mib, at_once, label, f in rows:
        what = f"{mib} MiB" + (f" x{at_once} at once" if at_once > 1 else "")
        print(f"{kind:8} {what:>14} {label:10} {f.rss_before_mib:8.0f} MiB "
              f"{f.peak_mib:5.0f} MiB {f.ratio:9.1f}x {f.seconds:6.1f}s")


if __name__ == "__main__":
    main()

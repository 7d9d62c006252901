"""Hub benchmarks (docs/performance.md), each against a baseline measured in the same run on
the same daemon.

Injection:

* ``inject.push`` → a subscriber's ``inject.pushed`` event: the time from sending the push
  to the event line arriving on another connection subscribed to the session, p50/p99
  (target: p99 ≤ 2 ms). Baseline: a 1 KB ``message.append`` → its ``message.appended``
  event, the same path (count, commit, publish) with a message instead of an injection.
* ``inject.pull`` of 100 pending injections, p50/p99 (target ≤ 2 ms). Baseline:
  ``message.list`` of 100 messages of the same size (a read of as many rows, no write).

Run: ``python bench/hub.py`` (about 20 s).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import msgspec
from _common import Connection, DaemonProcess, request_line


def _next_line(connection: Connection) -> bytes:
    while b"\n" not in connection.buffer:
        data = connection.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("the daemon closed the connection")
        connection.buffer += data
    line, _, connection.buffer = connection.buffer.partition(b"\n")
    return line


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return (statistics.median(ordered) * 1e3,
            ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3)


def _to_event(sender: Connection, watcher: Connection, line: bytes, event_type: bytes
              ) -> float:
    """Seconds from sending ``line`` to ``event_type``'s event on ``watcher``."""
    started = time.perf_counter()
    sender.sock.sendall(line)
    while event_type not in _next_line(watcher):
        pass
    elapsed = time.perf_counter() - started
    answer = msgspec.json.decode(_next_line(sender))
    if "error" in answer:
        raise RuntimeError(answer["error"])
    return elapsed


def _text(index: int) -> str:
    return (f"note {index}: the build on branch main failed in test_store; rerun it with "
            "the project's venv before pushing. " * 9)[:1024]


def bench_injection(daemon: DaemonProcess, rounds: int) -> None:
    """inject.push → event and inject.pull of 100, against append → event and list of 100."""
    sender, watcher = Connection(daemon.socket), Connection(daemon.socket)
    sid = "bench-inject"
    sender.call("session.open", {"session_id": sid,
                                 "budget": {"context_window": 10_000_000}})
    watcher.call("events.subscribe", {"session_id": sid,
                                      "types": ["inject.pushed", "message.appended"]})
    push_s: list[float] = []
    append_s: list[float] = []
    for index in range(rounds):
        append_s.append(_to_event(sender, watcher, request_line("message.append", {
            "session_id": sid, "messages": [{"role": "user", "content": _text(index)}]}),
            b'"message.appended"'))
        push_s.append(_to_event(sender, watcher, request_line("inject.push", {
            "session_id": sid, "content": _text(index), "priority": "normal"}),
            b'"inject.pushed"'))
    pull_s: list[float] = []
    list_s: list[float] = []
    pull_line = request_line("inject.pull", {"session_id": sid, "limit": 100})
    list_line = request_line("message.list", {"session_id": sid, "limit": 100})
    quiet = Connection(daemon.socket)  # no subscription: the pulls' events go nowhere
    while quiet.call("inject.pull", {"session_id": sid, "limit": 1000})["injections"]:
        pass  # the pushes above, delivered and left unanswered (they must not slow a pull)
    for round_ in range(max(20, rounds // 50)):
        for index in range(100):
            quiet.call("inject.push", {"session_id": sid, "content": _text(index),
                                       "priority": ("immediate", "normal", "deferred")[
                                           index % 3]})
        started = time.perf_counter()
        pulled = msgspec.json.decode(quiet.call_line(pull_line))
        pull_s.append(time.perf_counter() - started)
        if len(pulled["result"]["injections"]) != 100:
            raise RuntimeError(f"round {round_}: pulled {pulled}")
        started = time.perf_counter()
        listed = msgspec.json.decode(quiet.call_line(list_line))
        list_s.append(time.perf_counter() - started)
        if len(listed["result"]["messages"]) != 100:
            raise RuntimeError(f"round {round_}: listed {listed}")
    for connection in (sender, watcher, quiet):
        connection.close()
    print("## Injection")
    for name, samples, baseline_name, baseline, target in (
            ("inject.push → event", push_s, "1 KB message.append → event", append_s, 2.0),
            ("inject.pull of 100", pull_s, "message.list of 100", list_s, 2.0)):
        p50, p99 = _percentiles(samples)
        b50, b99 = _percentiles(baseline)
        print(f"{name:24} p50 {p50:6.3f} ms  p99 {p99:6.3f} ms  (target p99 ≤ {target} ms: "
              f"{'met' if p99 <= target else 'NOT met'}; n={len(samples)})")
        print(f"{baseline_name:24} p50 {b50:6.3f} ms  p99 {b99:6.3f} ms  (baseline)")
        print(f"{'ratio':24} p50 {p50 / b50:6.2f}x     p99 {p99 / b99:6.2f}x")


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--rounds", type=int, default=2_000,
                     help="pushes (and appends) timed to their event (default 2000)")
    args = cli.parse_args()
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ctxd-b")))
        daemon = stack.enter_context(DaemonProcess(root).running())
        bench_injection(daemon, args.rounds)


if __name__ == "__main__":
    main()

"""Stall benchmark: does one large request hold the event loop? ``daemon.ping`` latency of
a second client while another sends a request of many medium texts, against the same
client's latency on the idle daemon, measured in the same run for a daemon of a baseline
revision (``--baseline``, default ``main``) and one of this tree.

The requests (each phase on a fresh session):

* ``budget.measure`` with 240 skill prompts of 64 KiB of English prose;
* ``budget.measure`` with 80 skill prompts of 64 KiB of CJK text;
* ``message.append`` of 240 messages of 64 KiB of English prose (``allow_over``).

The pinging client sends one ping at a time (send, wait for the answer) from just before
the large request is sent until its answer has come; the idle figures are ``--idle-pings``
pings just before. Both clients are raw blocking sockets in this process, their request
lines encoded beforehand; the large request's answer is checked (no error). The target
(docs/performance.md, A request does not hold the loop): ping p99 at most 20 ms during the
request. The script reports; it exits 0 once the daemons have started.

Run: ``python bench/stall.py`` (about a minute).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

sys.path.append(str(Path(__file__).resolve().parent))
from _common import Connection, percentile, request_line, start_daemons
from daemon_process import DaemonProcess

PROMPT_CHARS = 64 * 1024
TARGET_P99_MS = 20.0
PROSE = ("The daemon keeps each transcript, counts every message with the real tokenizer "
         "and decides what goes into the next prompt; a fold keeps the lesson. ")
CJK = "上下文守护进程为每个会话保存完整的对话记录\uff0c并决定下一个提示中包含哪些内容\u3002"
MAX_REQUEST_BYTES = 64 * 1024 * 1024


def texts(count: int, base: str) -> list[str]:
    """``count`` different texts of `PROMPT_CHARS` characters."""
    return [(f"{i}: " + base * (PROMPT_CHARS // len(base) + 1))[:PROMPT_CHARS]
            for i in range(count)]


@dataclass(frozen=True)
class Phase:
    name: str
    request: Callable[[str], tuple[str, dict[str, object]]]
    """The method and params of the large request, for a session id."""


PHASES = [
    Phase("budget.measure, 240 x 64 KiB prompts", lambda sid: ("budget.measure", {
        "session_id": sid, "skill_prompts": texts(240, PROSE)})),
    Phase("budget.measure, 80 x 64 KiB CJK", lambda sid: ("budget.measure", {
        "session_id": sid, "skill_prompts": texts(80, CJK)})),
    Phase("message.append, 240 x 64 KiB", lambda sid: ("message.append", {
        "session_id": sid, "allow_over": True,
        "messages": [{"role": "user", "content": t} for t in texts(240, PROSE)]})),
]


PING = request_line("daemon.ping")


def ping_until(conn: Connection, done: Callable[[], bool], at_least: int = 0) -> list[float]:
    """Ping one at a time until ``done()`` (and at least ``at_least`` times): latencies, ms."""
    latencies: list[float] = []
    while len(latencies) < at_least or not done():
        start = time.perf_counter()
        conn.call_line(PING)
        latencies.append((time.perf_counter() - start) * 1000)
    return latencies


@dataclass(frozen=True)
class Figures:
    idle: list[float]
    during: list[float]
    request_s: float


def measure(daemon: DaemonProcess, phase: Phase, sid: str, idle_pings: int) -> Figures:
    setup = Connection(daemon.socket)
    setup.call("session.open", {"session_id": sid, "budget": {"context_window": 10_000_000}})
    method, params = phase.request(sid)
    line = request_line(method, params)
    pinger = Connection(daemon.socket)
    idle = ping_until(pinger, lambda: True, idle_pings)
    finished = threading.Event()
    failure: list[BaseException] = []
    took: list[float] = []

    def send() -> None:
        start = time.perf_counter()
        try:
            answer = msgspec.json.decode(setup.call_line(line))
            if "error" in answer:
                raise RuntimeError(f"{method}: {answer['error']}")
        except BaseException as exc:
            failure.append(exc)
        finally:
            took.append(time.perf_counter() - start)
            finished.set()

    sender = threading.Thread(target=send)
    sender.start()
    during = ping_until(pinger, finished.is_set)
    sender.join()
    setup.close()
    pinger.close()
    if failure:
        raise failure[0]
    return Figures(idle, during, took[0])


def summary(values: Sequence[float]) -> str:
    return (f"{percentile(values, 0.5):7.2f} {percentile(values, 0.99):8.2f} "
            f"{max(values):8.1f}")


def main(argv: Sequence[str] | None = None) -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    cli.add_argument("--baseline", default="main", help="git revision to compare against")
    cli.add_argument("--idle-pings", type=int, default=500)
    cli.add_argument("--rounds", type=int, default=2,
                     help="rounds, alternating the daemons (default 2); the best is shown")
    args = cli.parse_args(argv)
    results: dict[tuple[str, str], list[Figures]] = {}
    with contextlib.ExitStack() as stack:
        daemons = start_daemons(stack, args.baseline,
                                {"CTXD_MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES)})
        for round_number in range(args.rounds):
            for index, phase in enumerate(PHASES):
                for label, daemon in daemons.items():
                    figures = measure(daemon, phase, f"stall_{round_number}_{index}",
                                      args.idle_pings)
                    results.setdefault((phase.name, label), []).append(figures)
    print(f"ping latency of a second client, ms (p50 p99 max); target p99 <= "
          f"{TARGET_P99_MS:.0f} ms during the request; best of {args.rounds} rounds by p99")
    print(f"{'request':40} {'daemon':10} {'idle':>25}  {'during the request':>25}  "
          f"{'request':>8}  pings")
    for (name, label), rounds in results.items():
        best = min(rounds, key=lambda f: percentile(f.during, 0.99))
        worst_max = max(max(f.during) for f in rounds)
        print(f"{name:40} {label:10} {summary(best.idle):>25}  {summary(best.during):>25}  "
              f"{best.request_s:7.2f}s  {len(best.during):5d}  (max over rounds "
              f"{worst_max:.1f})")


if __name__ == "__main__":
    main()

"""Hub benchmarks (docs/performance.md, "Hub"): each part of the hub against a baseline
measured in the same run, on one daemon of this tree.

* Usage ledger and tool states: ``usage.record`` and ``tool.state`` p50/p99 latency, one
  request at a time on one connection, against ``message.append`` of one 1 KB message (each
  one different, counted and committed) on the same connection and session. The passes are
  interleaved over ``--rounds`` rounds (machines are shared and noisy); each figure is the
  best round's, the range of all rounds beside it. Target: ratio ≤ 1.0.

Run: ``python bench/hub.py`` (about 20 s). It reports; it exits 0 once the daemon started.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import random
import string
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from _common import Connection, DaemonProcess


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def timed(call: Callable[[], object], count: int) -> list[float]:
    """Milliseconds of each of ``count`` calls, one at a time."""
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def kilobyte_messages(seed: int = 16) -> Iterator[str]:
    """Endless 1 KB user messages of words, no two the same."""
    rng = random.Random(seed)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9)))
             for _ in range(2_000)]
    for i in itertools.count():
        text = f"message {i}:"
        while len(text) < 1_024:
            text += " " + rng.choice(words)
        yield text[:1_024]


# ---- usage.record and tool.state against message.append --------------------------------

def bench_usage_and_tool_state(connection: Connection, requests: int, rounds: int
                               ) -> list[tuple[str, str, str, str]]:
    """p50/p99 of usage.record and tool.state against a 1 KB message.append."""
    session = "bench_hub_usage"
    connection.call("session.open", {"session_id": session, "budget": {
        "context_window": 10_000_000, "max_output_tokens": 8_192}})
    messages = kilobyte_messages()
    keys = itertools.count()
    calls = itertools.count()
    states = itertools.cycle(["pending", "running", "completed"])

    def append() -> object:
        return connection.call("message.append", {"session_id": session, "messages": [
            {"role": "user", "content": next(messages)}]})

    def usage() -> object:
        return connection.call("usage.record", {
            "session_id": session, "model": "m", "input_tokens": 12_000,
            "output_tokens": 800, "cache_read_tokens": 9_000,
            "idempotency_key": f"k{next(keys)}"})

    def tool_state() -> object:
        state = next(states)
        tool_call = next(calls) // 3
        return connection.call("tool.state", {"session_id": session,
                                              "tool_call_id": f"call_{tool_call}",
                                              "state": state, "tool_name": "bash"})

    passes = {"message.append 1 KB": append, "usage.record": usage, "tool.state": tool_state}
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in passes}
    for _ in range(rounds):
        for name, call in passes.items():
            timed(call, requests // 10)  # warm-up
            samples = timed(call, requests)
            figures[name].append((percentile(samples, 0.5), percentile(samples, 0.99)))
    best = {name: (min(p50 for p50, _ in runs), min(p99 for _, p99 in runs))
            for name, runs in figures.items()}
    base_p50, base_p99 = best["message.append 1 KB"]
    rows = []
    for name, runs in figures.items():
        p50, p99 = best[name]
        spread = (f"p50 {min(r[0] for r in runs):.3f}-{max(r[0] for r in runs):.3f}, "
                  f"p99 {min(r[1] for r in runs):.3f}-{max(r[1] for r in runs):.3f}")
        rows.append((name, f"{p50:.3f} / {p99:.3f}",
                     f"{p50 / base_p50:.2f} / {p99 / base_p99:.2f}", spread))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2_000,
                        help="requests per pass and round (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ctxd-b")))
        daemon = DaemonProcess(root).start()
        stack.callback(daemon.stop)
        connection = Connection(daemon.socket)
        stack.callback(connection.close)

        print("## usage.record and tool.state against a 1 KB message.append "
              f"({args.requests} requests a pass, {args.rounds} rounds, best round)")
        print(f"{'method':<22} {'p50 / p99 ms':>18} {'ratio p50 / p99':>16}  range (ms)")
        for name, figures, ratio, spread in bench_usage_and_tool_state(
                connection, args.requests, args.rounds):
            print(f"{name:<22} {figures:>18} {ratio:>16}  {spread}")


if __name__ == "__main__":
    main()

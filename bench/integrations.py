"""Integration benchmarks (docs/performance.md, "Claude Code hooks"), one function per
integration; ``--only NAME`` runs one.

``bench_hooks``: the wall time of ``ctxctl hook`` (a new process each time, Python's
start-up included, as Claude Code runs it) for PostToolUse with a 100 KB Bash output
(offloaded, answered with the stub) and for UserPromptSubmit with 10,000 memories in the
daemon, p50/p95 over ``--runs`` runs each, against ``python -c pass`` measured in the same
run (the floor of any Python hook). Target: p95 ≤ 50 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from _common import REPO_ROOT, DaemonProcess

CTXCTL = Path(sys.executable).with_name("ctxctl")


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _run_ms(argv: list[str], stdin: bytes) -> float:
    started = time.perf_counter()
    subprocess.run(argv, input=stdin, capture_output=True, check=True)
    return (time.perf_counter() - started) * 1000


def bench_hooks(runs: int) -> None:
    from ctxclient import Client

    with tempfile.TemporaryDirectory(prefix="ctxd-b") as root, \
            contextlib.ExitStack() as stack:
        daemon = DaemonProcess(Path(root)).start()
        stack.callback(daemon.stop)
        hook = [str(CTXCTL), "hook", "--socket", str(daemon.socket)]
        session_id = str(uuid.uuid4())
        cwd = str(REPO_ROOT)
        with Client(daemon.socket, timeout=None) as client:
            client.call("session.open", {"session_id": session_id, "project": cwd})
            for start in range(0, 10_000, 500):
                for i in range(start, start + 500):
                    client.call("memory.record", {
                        "title": f"lesson {i} about module {i % 97}",
                        "content": f"When the build of part {i} fails, rerun step {i % 13}."})
        output = "".join(f"{i:06d} " + "x" * 93 + "\n" for i in range(1_000))  # 100 KB
        post = json.dumps({
            "session_id": session_id, "transcript_path": "/dev/null", "cwd": cwd,
            "hook_event_name": "PostToolUse", "tool_name": "Bash",
            "tool_input": {"command": "cat log"}, "tool_use_id": "toolu_1",
            "tool_response": {"stdout": output, "stderr": "", "interrupted": False,
                              "isImage": False}}).encode()
        prompt = json.dumps({
            "session_id": session_id, "transcript_path": "/dev/null", "cwd": cwd,
            "hook_event_name": "UserPromptSubmit",
            "prompt": "why does the build of part 4242 fail in module 71?"}).encode()
        cases: dict[str, Callable[[], float]] = {
            "python -c pass": lambda: _run_ms([sys.executable, "-c", "pass"], b""),
            "hook PostToolUse 100 KB": lambda: _run_ms(hook, post),
            "hook UserPromptSubmit, 10,000 memories": lambda: _run_ms(hook, prompt),
        }
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(runs):  # interleaved: a shared machine's noise hits all alike
            for name, case in cases.items():
                samples[name].append(case())
        floor = percentile(samples["python -c pass"], 0.95)
        print(f"{'case':42} {'p50 ms':>8} {'p95 ms':>8} {'p95/floor':>10}")
        for name, taken in samples.items():
            p95 = percentile(taken, 0.95)
            print(f"{name:42} {percentile(taken, 0.5):8.1f} {p95:8.1f} {p95 / floor:10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["hooks"], help="run one benchmark")
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    if args.only in (None, "hooks"):
        bench_hooks(args.runs)


if __name__ == "__main__":
    main()

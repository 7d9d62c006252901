"""Hub benchmark: the hub's methods (docs/protocol.md), each figure against a baseline
measured in the same run.

Cancellation: ``request.cancel`` of a ``context.compact`` blocked in its summarizer (a
command that waits until it is killed), sent on a second connection: the time from
sending the cancel until the compaction's caller has its -32006 (target: within 50 ms),
against a ``daemon.ping`` round trip on the same daemon. Each run compacts a fresh session
of 10 messages of 450 tokens; and the cancel of an append queued behind that compaction in
the session's mailbox.

Run: ``python bench/hub.py`` (about half a minute).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

import msgspec

sys.path.append(str(Path(__file__).resolve().parent))
from _common import Connection, request_line
from daemon_process import DaemonProcess

SUMMARIZER = """
import pathlib, sys, time
root = pathlib.Path(sys.argv[1])
sys.stdin.buffer.read()
(root / "started").touch()
while True:
    time.sleep(1)
"""
"""A summarizer command that says when it runs, then waits until it is killed."""


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def line(method: str, params: dict[str, object], request_id: str) -> bytes:
    return msgspec.json.encode({"jsonrpc": "2.0", "id": request_id, "method": method,
                                "params": params}) + b"\n"


def wait_for(path: Path) -> None:
    for _ in range(10_000):
        if path.exists():
            return
        time.sleep(0.001)
    raise RuntimeError(f"{path} never appeared: the summarizer did not start")


def bench_cancel(root: Path, runs: int, pings: int) -> None:
    """request.cancel of a compaction blocked in its summarizer, against a ping."""
    script = root / "summarizer.py"
    script.write_text(SUMMARIZER)
    started = root / "started"
    daemon = DaemonProcess(root, extra_args=[
        "--hygiene-auto-compact", "false", "--hygiene-summarizer", "command",
        "--hygiene-summarizer-command", f"{sys.executable} {script} {root}"])
    with daemon.running():
        caller, canceller = Connection(daemon.socket), Connection(daemon.socket)
        queued = Connection(daemon.socket)
        ping = request_line("daemon.ping", {})
        for _ in range(20):
            canceller.call_line(ping)
        baseline = []
        for _ in range(pings):
            start = time.perf_counter()
            canceller.call_line(ping)
            baseline.append(time.perf_counter() - start)
        hello = " ".join(["hello"] * 450)
        chat = [{"role": "user" if i % 2 == 0 else "assistant", "content": hello}
                for i in range(10)]
        samples, queued_samples = [], []
        for run in range(runs):
            sid = f"bench-cancel-{run}"
            caller.call("session.open", {"session_id": sid, "budget": {
                "context_window": 6000, "max_output_tokens": 0}})
            caller.call("message.append", {"session_id": sid, "messages": chat})
            started.unlink(missing_ok=True)
            request_id = str(uuid.uuid4())
            caller.sock.sendall(line("context.compact", {
                "session_id": sid, "strategies": ["summarize"]}, request_id))
            wait_for(started)
            queued_id = str(uuid.uuid4())
            queued.sock.sendall(line("message.append", {
                "session_id": sid, "messages": chat[:1]}, queued_id))
            while True:  # until the daemon has read it (then it waits in the mailbox)
                start = time.perf_counter()
                answer = msgspec.json.decode(canceller.call_line(line(
                    "request.cancel", {"request_id": queued_id}, str(uuid.uuid4()))))
                if "result" in answer:
                    break
            refused = msgspec.json.decode(queued.call_line(b""))
            queued_samples.append(time.perf_counter() - start)
            assert refused["error"]["code"] == -32006, refused
            start = time.perf_counter()
            answer = msgspec.json.decode(canceller.call_line(line(
                "request.cancel", {"request_id": request_id, "reason": "bench"},
                str(uuid.uuid4()))))
            cancelled = msgspec.json.decode(caller.call_line(b""))  # the compaction's answer
            samples.append(time.perf_counter() - start)
            assert answer["result"]["cancelled"] == 1, answer
            assert cancelled["error"]["code"] == -32006, cancelled
        for connection in (caller, canceller, queued):
            connection.close()
    p50, p99 = percentile(samples, 0.5), percentile(samples, 0.99)
    base50, base99 = percentile(baseline, 0.5), percentile(baseline, 0.99)
    print(f"request.cancel of a compaction blocked in its summarizer, {runs} runs: the "
          "caller's -32006 after the cancel was sent")
    print(f"  p50 {ms(p50)}, p99 {ms(p99)}, max {ms(max(samples))} (target: within 50 ms)")
    q50, q99 = percentile(queued_samples, 0.5), percentile(queued_samples, 0.99)
    print(f"  of an append queued behind it in the session's mailbox: p50 {ms(q50)}, "
          f"p99 {ms(q99)}")
    print(f"  baseline daemon.ping round trip, {pings} runs: p50 {ms(base50)}, "
          f"p99 {ms(base99)}")
    print(f"  ratio cancel / ping: p50 {p50 / base50:.1f}x, p99 {p99 / base99:.1f}x "
          f"(queued: p50 {q50 / base50:.1f}x, p99 {q99 / base99:.1f}x)")


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_argument("--cancel-runs", type=int, default=30,
                         help="compactions cancelled")
    options.add_argument("--pings", type=int, default=500, help="pings of the baseline")
    args = options.parse_args()
    with tempfile.TemporaryDirectory(prefix="ctxd-bh-") as folder:
        bench_cancel(Path(folder), args.cancel_runs, args.pings)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Integration benchmarks (docs/performance.md): what the agents' integrations add to a
call, each against a baseline measured in the same run.

MCP (``bench_mcp``): a ``read_result`` tool call (a 200-character page of an offloaded
result) through ``ctxctl mcp`` — a plain line client on the pump's stdin and stdout — p50
and p99 of the round trip, one call at a time; against the direct socket call of the same
native method (``result.read`` of the same page) on the same daemon; and, between the two,
the same ``tools/call`` sent straight to the socket (what MCP costs in the daemon, without
the pump). The passes are interleaved over ``--rounds`` rounds; each figure is the best
round's. Run: ``python bench/integrations.py [--only mcp]``.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
from _common import Connection, DaemonProcess, request_line

CTXCTL = str(Path(sys.executable).parent / "ctxctl")
OUTPUT = "\n".join(f"line {i}" for i in range(2_000))
"""A tool output well over the offload threshold."""


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


class PumpClient:
    """``ctxctl mcp`` on a daemon's socket, driven by lines on its stdio."""

    def __init__(self, socket: Path, session_id: str):
        self.process = subprocess.Popen([CTXCTL, "mcp", "--socket", str(socket),
                                         "--session", session_id],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.stdin, self.stdout = self.process.stdin, self.process.stdout

    def call_line(self, line: bytes) -> bytes:
        self.stdin.write(line)
        self.stdin.flush()
        return self.stdout.readline()

    def close(self) -> None:
        self.stdin.close()
        self.process.wait(30)
        self.stdout.close()


def _checked(answer: bytes) -> bytes:
    decoded = msgspec.json.decode(answer)
    if "error" in decoded or decoded["result"].get("isError"):
        raise RuntimeError(f"the call failed: {answer[:300]!r}")
    return answer


def bench_mcp(calls: int, rounds: int) -> None:
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ctxd-bi")))
        daemon = stack.enter_context(DaemonProcess(root).running())
        direct = Connection(daemon.socket)
        stack.callback(direct.close)
        session_id = "bench-mcp"
        direct.call("session.open", {"session_id": session_id})
        direct.call("message.append", {"session_id": session_id, "messages": [
            {"role": "tool", "name": "bash", "tool_call_id": "c1", "content": OUTPUT}]})
        listed = direct.call("message.list", {"session_id": session_id})
        [ref_id] = [m["ref_id"] for m in listed["messages"]  # type: ignore[attr-defined]
                    if m.get("ref_id")]
        native = request_line("result.read", {"session_id": session_id, "ref_id": ref_id,
                                              "limit": 200})
        tool_call = request_line("tools/call", {"name": "read_result", "arguments": {
            "ref_id": ref_id, "limit": 200}})
        initialize = request_line("initialize", {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"}})
        on_socket = Connection(daemon.socket)
        stack.callback(on_socket.close)
        _checked(on_socket.call_line(request_line("mcp.bind", {"session_id": session_id})))
        _checked(on_socket.call_line(initialize))
        pump = PumpClient(daemon.socket, session_id)
        stack.callback(pump.close)
        _checked(pump.call_line(initialize))
        passes: dict[str, Callable[[], object]] = {
            "result.read, direct": lambda: _checked(direct.call_line(native)),
            "tools/call on the socket": lambda: _checked(on_socket.call_line(tool_call)),
            "tools/call via ctxctl mcp": lambda: _checked(pump.call_line(tool_call)),
        }
        for call in passes.values():
            timed(call, 200)  # warm up
        best: dict[str, tuple[float, float]] = {}
        for _ in range(rounds):
            for name, call in passes.items():
                samples = timed(call, calls)
                figures = (percentile(samples, 0.5), percentile(samples, 0.99))
                if name not in best or figures[0] < best[name][0]:
                    best[name] = figures
    base50, base99 = best["result.read, direct"]
    print(f"## MCP read_result round trip ({calls} calls a pass, {rounds} rounds, best round)")
    print(f"{'path':<28} {'p50 / p99 ms':>16} {'ratio p50 / p99':>17}")
    for name, (p50, p99) in best.items():
        print(f"{name:<28} {p50:>7.3f} / {p99:<7.3f} {p50 / base50:>7.2f} / "
              f"{p99 / base99:<7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("mcp",), help="run only this part (default: all)")
    parser.add_argument("--calls", type=int, default=2_000,
                        help="mcp: calls per pass and round (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="mcp: rounds (default 3)")
    args = parser.parse_args()
    if args.only in (None, "mcp"):
        bench_mcp(args.calls, args.rounds)


if __name__ == "__main__":
    main()

"""Gateway benchmark: what going through ctxd's model gateway adds to a model call.

One local scripted model server (a threaded HTTP/1.1 server in this process, the stand-in
for the provider) answers ``POST /v1/messages`` at once, as JSON or as a short SSE stream,
each answer with an id of its own (so ctxd records every call's usage once). One real ctxd
(``python -P -m ctxd`` on a temporary socket, data directory and an ephemeral gateway port)
forwards to it. The load generator is this process: one keep-alive connection to the
model server directly (the baseline) and one to the gateway, the same request body sent
to each in turn, one request at a time, interleaved, so that both see the same moments of
the shared machine.

* ``large``: a request of about ``--tokens`` tokens (default 150,000: a system prompt and a
  conversation of text turns), sent ``--count`` times to each. ctxd records the
  conversation the first time (not timed: a warm-up) and recognises it after. Figures:
  p50 and p99 of each path and what the gateway adds (the difference of the same
  percentile). Targets: added p50 <= 3 ms, p99 <= 15 ms.
* ``first-byte``: the same body with ``"stream": true``; time from the request's last byte
  to the response's first body byte. Target: added p50 <= 2 ms.
* ``--floor``: a third path, interleaved with the two others: the same gateway server
  with an identity rewrite (bench/_gateway_floor.py, a process of its own), what the HTTP
  relay alone adds.
* ``memory``: the daemon's RSS (``daemon.status``) before and after ``--big-count``
  requests of ``--big-mb`` MB (default 10) each: bounded when it does not grow with the
  count (reported: the growth from the first big request to the last).

Reports and exits 0 once the daemon started; exits 1 when a figure could not be measured.
Run: ``python bench/gateway.py`` (about a minute), ``--quick`` (fewer samples).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import itertools
import json
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from _common import DaemonProcess, percentile

from ctxd.tokens import TokenCounter

WORDS = ("the function returns a list of values that the caller keeps in its cache while "
         "tests run against each branch of the parser and every module logs what it reads "
         "from the socket before the daemon answers with its own measured result").split()


class ModelServer:
    """The provider's stand-in: answers every ``/v1/messages`` at once; ``calls`` counts
    the requests it received; with ``keep``, ``received`` holds their bodies."""

    def __init__(self, keep: bool = False) -> None:
        self.calls = itertools.count(1)
        self.received: list[bytes] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # Headers and body leave in two writes: without this each answer would
                # wait for a delayed ACK (40 ms).
                self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = json.loads(raw)
                number = next(server.calls)
                if keep:
                    server.received.append(raw)
                usage = {"input_tokens": 1000, "output_tokens": 3,
                         "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}
                message = {"id": f"msg_bench{number:08d}", "type": "message",
                           "role": "assistant", "model": body.get("model", "m"),
                           "content": [{"type": "text", "text": "ok"}],
                           "stop_reason": "end_turn", "stop_sequence": None, "usage": usage}
                if body.get("stream"):
                    start = {**message, "content": [], "stop_reason": None}
                    events = [
                        ("message_start", {"type": "message_start", "message": start}),
                        ("content_block_start", {"type": "content_block_start", "index": 0,
                                                 "content_block": {"type": "text", "text": ""}}),
                        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                 "delta": {"type": "text_delta", "text": "ok"}}),
                        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                        ("message_delta", {"type": "message_delta",
                                           "delta": {"stop_reason": "end_turn"},
                                           "usage": {"output_tokens": 3}}),
                        ("message_stop", {"type": "message_stop"})]
                    payload = b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
                                       for name, data in events)
                    content_type = "text/event-stream"
                else:
                    payload = json.dumps(message).encode()
                    content_type = "application/json"
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.thread = threading.Thread(target=self.http.serve_forever, args=(0.01,),
                                       daemon=True)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}"

    def __enter__(self) -> ModelServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.shutdown()
        self.http.server_close()


class Endpoint:
    """One keep-alive HTTP connection to a base URL (the model server, or the gateway)."""

    def __init__(self, base_url: str) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self.prefix = parts.path.rstrip("/")
        self.conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port,
                                               timeout=120)
        self.conn.connect()
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def post(self, body: bytes, headers: tuple[tuple[str, str], ...] = ()
             ) -> tuple[float, float]:
        """Milliseconds until the first body byte and until the whole answer."""
        self.conn.putrequest("POST", self.prefix + "/v1/messages",
                             skip_accept_encoding=True)
        for name, value in (("content-type", "application/json"),
                            ("x-api-key", "bench-key"), ("anthropic-version", "2023-06-01"),
                            ("content-length", str(len(body))), *headers):
            self.conn.putheader(name, value)
        self.conn.endheaders()
        self.conn.send(body)
        started = time.perf_counter()
        response = self.conn.getresponse()
        first = response.read(1)
        first_at = time.perf_counter()
        rest = response.read()
        done = time.perf_counter()
        if response.status != 200 or not first:
            raise RuntimeError(f"answer {response.status}: {(first + rest)[:300]!r}")
        return (first_at - started) * 1000, (done - started) * 1000

    def close(self) -> None:
        self.conn.close()


def conversation(tokens: int, counter: TokenCounter, seed: int) -> dict[str, Any]:
    """A request body of about ``tokens`` tokens: a system prompt and text turns."""
    rng = random.Random(seed)

    def text(words: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(words))

    system = text(2_000)
    messages: list[dict[str, Any]] = []
    total = counter.count(system)
    while total < tokens:
        role = "user" if len(messages) % 2 == 0 else "assistant"
        content = text(1_500)
        messages.append({"role": role, "content": content})
        total += counter.count(content) + 4
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": "go on"})
    return {"model": "claude-bench", "max_tokens": 16, "system": system,
            "messages": messages}


def interleaved(paths: list[Endpoint], body: bytes, count: int
                ) -> list[list[tuple[float, float]]]:
    """``count`` requests to each path, alternating which goes first."""
    times: list[list[tuple[float, float]]] = [[] for _ in paths]
    for index in range(count):
        order = list(zip(paths, times, strict=True))
        for path, kept in order if index % 2 == 0 else reversed(order):
            kept.append(path.post(body))
    return times


def report(name: str, direct: list[float], gateway: list[float], target_p50: float | None,
           target_p99: float | None) -> bool:
    """One table row per percentile; whether the targets were met."""
    met = True
    for label, fraction, target in (("p50", 0.5, target_p50), ("p99", 0.99, target_p99)):
        base, through = percentile(direct, fraction), percentile(gateway, fraction)
        added = through - base
        verdict = "info" if target is None else ("ok" if added <= target else "MISS")
        met = met and verdict != "MISS"
        ratio = through / base if base else float("inf")
        print(f"  {name + ' ' + label:<28} {base:>10.2f} ms {through:>10.2f} ms "
              f"{added:>+9.2f} ms {ratio:>7.2f}x  "
              f"{'-' if target is None else f'<= {target:g} ms':>10}  {verdict}")
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=150_000)
    parser.add_argument("--count", type=int, default=60,
                        help="requests to each path per phase (default 60)")
    parser.add_argument("--big-mb", type=int, default=10)
    parser.add_argument("--big-count", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="20 requests per phase, 3 big")
    parser.add_argument("--keep-logs", type=Path, default=None)
    parser.add_argument("--floor", action="store_true",
                        help="also measure the gateway with an identity rewrite")
    parser.add_argument("--profile", type=Path, default=None,
                        help="write the daemon's cProfile profile here (slows it down)")
    args = parser.parse_args()
    if args.quick:
        args.count, args.big_count = 20, 3
    counter = TokenCounter()
    body = conversation(args.tokens, counter, seed=1)
    encoded = json.dumps(body).encode()
    streamed = json.dumps({**body, "stream": True}).encode()
    with contextlib.ExitStack() as stack:
        model = stack.enter_context(ModelServer())
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ctxd-gw-")))
        config = root / "config" / "ctxd" / "config.toml"
        config.parent.mkdir(parents=True)
        config.write_text(f'[gateway]\nlisten = "127.0.0.1:0"\n'
                          f'max_body_bytes = {(args.big_mb + 4) << 20}\n')
        daemon = stack.enter_context(DaemonProcess(root, profile=args.profile, env={
            "CTXD_GATEWAY_ANTHROPIC_UPSTREAM": model.origin}).running())
        client = stack.enter_context(daemon.client())
        status = client.call("daemon.status")
        gateway_info = status.get("gateway")
        if not gateway_info:
            print("the daemon has no gateway (daemon.status gateway is null)")
            return 1
        direct, gateway = Endpoint(model.origin), Endpoint(gateway_info["base_url"])
        stack.callback(direct.close)
        stack.callback(gateway.close)
        paths = [direct, gateway]
        if args.floor:
            server = stack.enter_context(subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("_gateway_floor.py")),
                 model.origin], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            assert server.stdout is not None
            assert server.stdin is not None
            stack.callback(server.stdin.close)
            floor = Endpoint(server.stdout.readline().strip())
            stack.callback(floor.close)
            paths.append(floor)
            floor.post(encoded)
        tokens = counter.count(encoded.decode())
        print(f"ctxd gateway benchmark: CPython {platform.python_version()}, "
              f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"request: {len(encoded):,} bytes, {len(body['messages'])} messages, "
              f"about {tokens:,} tokens; {args.count} requests to each path per phase, "
              "interleaved\n")
        gateway.post(encoded)  # recorded by ctxd the first time: not timed
        direct.post(encoded)
        large = interleaved(paths, encoded, args.count)
        gateway.post(streamed)
        first = interleaved(paths, streamed, args.count)
        print(f"  {'measurement':<28} {'direct':>13} {'gateway':>13} {'added':>12} "
              f"{'ratio':>8}  {'target':>10}  result")
        met = report("whole answer, 150k", [t for _, t in large[0]],
                     [t for _, t in large[1]], 3, 15)
        met &= report("first streamed byte", [f for f, _ in first[0]],
                      [f for f, _ in first[1]], 2, None)
        if args.floor:
            report("floor: whole answer", [t for _, t in large[0]],
                   [t for _, t in large[2]], None, None)
            report("floor: first byte", [f for f, _ in first[0]],
                   [f for f, _ in first[2]], None, None)
        session_id = client.call("daemon.status")["gateway"]["sessions"][0]["session_id"]
        usage = client.call("usage.get", {"session_id": session_id})
        print(f"\n  calls the model server answered: {next(model.calls) - 1}, "
              f"{2 * args.count + 2} of them through the gateway"
              + (f", {2 * args.count + 1} through the floor" if args.floor else "")
              + f"; calls in the session's usage ledger: {usage['totals']['calls']}")
        rss = [client.call("daemon.status")["rss_bytes"]]
        big = json.dumps({"model": "claude-bench", "max_tokens": 16, "messages": [
            {"role": "user", "content": "x " * (args.big_mb << 19)}]}).encode()
        for index in range(args.big_count):
            big_body = big.replace(b'"x x', f'"{index} x'.encode(), 1)
            gateway.post(big_body)
            rss.append(client.call("daemon.status")["rss_bytes"])
        mb = [r / (1 << 20) for r in rss]
        print(f"  RSS: {mb[0]:.0f} MB before, after each {args.big_mb} MB request: "
              + ", ".join(f"{m:.0f}" for m in mb[1:])
              + f" MB (highest {max(mb):.0f} MB)")
        if args.keep_logs is not None:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            (args.keep_logs / "ctxd.log").write_text(daemon.log())
        print(f"\n{'all targets met' if met else 'targets missed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""RPC benchmark: ctxd's request path against a bare trio NDJSON echo server, in one run.

What it measures, all over one Unix-socket connection per pass, with one load generator (a
raw blocking socket client in this process that pre-encodes its request lines):

* ``daemon.ping`` throughput (requests/s), pipelined: ``--window`` requests in flight, a new
  request sent for each response read (responses read in chunks, their new requests sent in
  one write), after a short warm-up. Measured against the baseline, a bare trio server in
  its own process that reads NDJSON lines and answers each with a tiny JSON-RPC result
  carrying the same id (one write per read, as ctxd's writer coalesces its replies too),
  and against a real ctxd (``python -m ctxd``) on a temporary socket and data directory,
  also in its own process. The figure is ctxd/baseline. Beside it, from /proc, the server's
  CPU time per request (all threads) and how busy the server and the load generator were:
  a server near 100% is the bottleneck; one well below it is waiting on round trips.
* ``daemon.ping`` latency, p50/p99 of one request at a time (send, wait for the answer).
* ``message.append`` with 1 KB messages (English prose and code, each one different),
  counted (tokens) and committed (the reply comes after the SQLite commit): messages/s of
  one request at a time, (a) one message per request, (b) 100 messages per request. The
  session's budget is large enough never to reach the hard block; the client checks each
  reply (no error, one ``appended`` entry per message, tokens counted) and afterwards that
  the session's ``message_count`` equals what it sent. Beside (a), in the same rounds, the
  echo baseline and ctxd's ``daemon.ping`` one request at a time: the daemon's CPU time per
  append (all threads, read from /proc: CPU time, not wall time, so other work on the
  machine counts little) over the echo server's CPU time per request, and over ctxd's own
  per ping. ``--baseline REV`` runs the append passes against a daemon of that revision
  too (``git archive`` of it, this interpreter), in lockstep (one request to each daemon
  in turn, each one's CPU time read over the same window, so both see the same machine):
  the same figures for both and this tree's over the revision's.

Machines are shared and noisy, so the passes are interleaved over ``--rounds`` rounds and
each figure is the best round, with the range of all rounds beside it. The script reports;
it always exits 0 once the servers have started. ``--profile-ctxd FILE`` runs the daemon
under cProfile (figures are then slower and only good for finding hot spots) and
``--only`` picks passes, e.g. ``--only single --profile-ctxd /tmp/single.prof``.

Run: ``python bench/rpc.py`` (about 30 s); ``python bench/rpc.py --only single --rounds 5
--baseline 6ea803f`` for the append path against that revision.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgspec
import trio

# The daemon starter of the end-to-end tests, shared with them (tests/daemon_process.py).
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))
from _common import checkout, percentile
from daemon_process import DaemonFailed, DaemonProcess

REPO_ROOT = Path(__file__).resolve().parents[1]
RECV_CHUNK = 1024 * 1024
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
MESSAGE_BYTES = 1024
BATCH_SIZE = 100
CORPUS_SIZE = 2048
PING_TARGET_RATIO = 0.5
SINGLE_TARGET = 3_000.0
BATCHED_TARGET = 30_000.0
BUDGET = {"context_window": 10_000_000, "max_output_tokens": 8192}
# A fresh session well before the hard block (98% of the window less the output tokens).
SESSION_TOKEN_LIMIT = 5_000_000


class BenchError(Exception):
    """A reply was wrong (an error, a wrong id, a short count): the figures would lie."""


# ---- the baseline: a bare trio NDJSON echo server ------------------------------------

class _IdOnly(msgspec.Struct):
    id: int | str | None = None


_decode_id = msgspec.json.Decoder(_IdOnly).decode
_encode = msgspec.json.Encoder().encode


async def _echo_connection(stream: trio.SocketStream) -> None:
    pending = bytearray()
    async with stream:
        while True:
            data = await stream.receive_some(RECV_CHUNK)
            if not data:
                return
            pending += data
            end = pending.rfind(b"\n")
            if end < 0:
                continue
            lines = bytes(pending[:end]).split(b"\n")
            del pending[:end + 1]
            replies = [b'{"jsonrpc":"2.0","id":' + _encode(_decode_id(line).id)
                       + b',"result":{"pong":true}}\n' for line in lines if line.strip()]
            await stream.send_all(b"".join(replies))


async def serve_echo(path: str) -> None:
    """Answer every NDJSON line on ``path`` with ``{"result":{"pong":true}}`` and its id."""
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(128)
    await trio.serve_listeners(_echo_connection, [trio.SocketListener(sock)])


# ---- the servers under test, each in its own process ---------------------------------

@dataclass
class ServerProcess:
    """The echo baseline's subprocess with its socket and log; stopped with SIGTERM, then
    SIGKILL. (ctxd is a `DaemonProcess`.)"""

    name: str
    socket_path: Path
    log_path: Path
    proc: subprocess.Popen[bytes]

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with contextlib.closing(RawClient(self.socket_path)) as client:
                    client.call(ping_line(0))
                    return
            except OSError:
                time.sleep(0.05)
        raise BenchError(f"{self.name} did not answer within {START_TIMEOUT_S}s:\n{self.log()}")

    def log(self) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_echo(stack: contextlib.ExitStack, root: Path) -> ServerProcess:
    socket_path, log_path = root / "echo.sock", root / "echo.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()),
                                 "--echo-server", str(socket_path)],
                                stdout=log, stderr=log, cwd=REPO_ROOT, stdin=subprocess.DEVNULL)
    server = ServerProcess("echo baseline", socket_path, log_path, proc)
    stack.callback(server.stop)
    server.wait_ready()
    return server


# ---- the load generator ----------------------------------------------------------------

class _Reply(msgspec.Struct):
    id: int | str | None = None
    result: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    error: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


class _Appended(msgspec.Struct):
    seq: int
    tokens: int


class _ContextState(msgspec.Struct):
    total_tokens: int


class _AppendResult(msgspec.Struct):
    appended: list[_Appended]
    tokens_appended: int
    context_state: _ContextState


class _AppendReply(msgspec.Struct):
    id: int | str | None = None
    result: _AppendResult | msgspec.UnsetType = msgspec.UNSET
    error: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


_decode_reply = msgspec.json.Decoder(_Reply).decode
_decode_append_reply = msgspec.json.Decoder(_AppendReply).decode
_decode_any = msgspec.json.Decoder().decode


def ping_line(request_id: int) -> bytes:
    return b'{"jsonrpc":"2.0","id":%d,"method":"daemon.ping"}\n' % request_id


def request_line(request_id: int, method: str, params: dict[str, Any]) -> bytes:
    return _encode({"jsonrpc": "2.0", "id": request_id, "method": method,
                    "params": params}) + b"\n"


def check_reply(line: bytes) -> int:
    """The id of a success reply; raises `BenchError` on an error reply."""
    reply = _decode_reply(line)
    if reply.error is not msgspec.UNSET or reply.result is msgspec.UNSET:
        raise BenchError(f"error reply: {line[:500]!r}")
    if not isinstance(reply.id, int):
        raise BenchError(f"reply without an integer id: {line[:500]!r}")
    return reply.id


class RawClient:
    """One blocking Unix-socket connection that writes request lines and reads reply lines."""

    def __init__(self, path: Path):
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(str(path))
        except OSError:
            self._sock.close()
            raise
        self._buffer = bytearray()

    def close(self) -> None:
        self._sock.close()

    def send(self, data: bytes) -> None:
        self._sock.sendall(data)

    def read_lines(self) -> list[bytes]:
        """Every complete reply line received so far (waits for at least one)."""
        while True:
            end = self._buffer.rfind(b"\n")
            if end >= 0:
                lines = bytes(self._buffer[:end]).split(b"\n")
                del self._buffer[:end + 1]
                return lines
            chunk = self._sock.recv(RECV_CHUNK)
            if not chunk:
                raise BenchError("the server closed the connection")
            self._buffer += chunk

    def call(self, line: bytes) -> bytes:
        """Send one request and return its reply line (nothing else may be in flight)."""
        self._sock.sendall(line)
        lines = self.read_lines()
        if len(lines) != 1:
            raise BenchError(f"expected one reply, got {len(lines)}")
        return lines[0]

    def call_json(self, request_id: int, method: str, params: dict[str, Any]) -> Any:
        reply = _decode_any(self.call(request_line(request_id, method, params)))
        if "error" in reply:
            raise BenchError(f"{method} failed: {reply['error']}")
        return reply["result"]


def pipelined_rate(client: RawClient, make_line: Callable[[int], bytes], seconds: float,
                   window: int, warmup: float) -> tuple[float, int]:
    """Requests/s with ``window`` requests in flight, measured after ``warmup`` seconds.

    Returns:
        The rate, and how many requests were answered in all (warm-up included).
    """
    next_id = 1
    outstanding: set[int] = set()

    def send_more(count: int) -> None:
        nonlocal next_id
        ids = range(next_id, next_id + count)
        outstanding.update(ids)
        client.send(b"".join(make_line(i) for i in ids))
        next_id += count

    send_more(window)
    begin = time.perf_counter()
    measure_from, stop_at = begin + warmup, begin + warmup + seconds
    done = 0
    first: tuple[float, int] | None = None
    last: tuple[float, int] | None = None
    while outstanding:
        lines = client.read_lines()
        for line in lines:
            request_id = check_reply(line)
            if request_id not in outstanding:
                raise BenchError(f"reply to an unknown id {request_id}")
            outstanding.discard(request_id)
        done += len(lines)
        now = time.perf_counter()
        if first is None and now >= measure_from:
            first = (now, done)
        if last is None and now >= stop_at:
            last = (now, done)
        if last is None:
            send_more(len(lines))
    if first is None or last is None or last[0] <= first[0]:
        raise BenchError("the pipelined pass ended before its measured interval")
    return (last[1] - first[1]) / (last[0] - first[0]), done


def sequential_latencies(client: RawClient, make_line: Callable[[int], bytes], count: int,
                         max_seconds: float) -> list[float]:
    """Round-trip seconds of up to ``count`` requests sent one at a time."""
    samples: list[float] = []
    give_up = time.perf_counter() + max_seconds
    for request_id in range(1, count + 1):
        line = make_line(request_id)
        started = time.perf_counter()
        reply = client.call(line)
        samples.append(time.perf_counter() - started)
        if check_reply(reply) != request_id:
            raise BenchError(f"reply to the wrong request: {reply[:200]!r}")
        if time.perf_counter() > give_up:
            break
    return samples


def sequential_round(client: RawClient, pid: int, make_line: Callable[[int], bytes],
                     seconds: float) -> tuple[float, Usage]:
    """Requests/s of one request at a time for ``seconds``, and what the server used."""
    for request_id in range(1, 101):  # warm-up
        check_reply(client.call(make_line(request_id)))
    answered = 0
    probe = UsageProbe(pid)
    started = time.perf_counter()
    now = started
    while now < started + seconds:
        answered += 1
        if check_reply(client.call(make_line(answered))) != answered:
            raise BenchError("reply to the wrong request")
        now = time.perf_counter()
    return answered / (now - started), probe.stop(answered)


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process, all its threads (None where /proc is absent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # fields from the 3rd (state) on
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Usage:
    """CPU used by a server and by the load generator over measured passes."""

    server_s: float | None = 0.0
    client_s: float = 0.0
    wall_s: float = 0.0
    units: int = 0

    def add(self, other: Usage) -> None:
        self.server_s = (None if self.server_s is None or other.server_s is None
                         else self.server_s + other.server_s)
        self.client_s += other.client_s
        self.wall_s += other.wall_s
        self.units += other.units

    def server_us_per_unit(self) -> float | None:
        if self.server_s is None or not self.units:
            return None
        return self.server_s / self.units * 1e6

    def busy(self) -> str:
        if not self.wall_s:
            return "n/a"
        server = "n/a" if self.server_s is None else f"{self.server_s / self.wall_s:.0%}"
        return f"{server} / {self.client_s / self.wall_s:.0%}"


class UsageProbe:
    """Started before a pass; `stop` returns what the pass used."""

    def __init__(self, pid: int):
        self.pid = pid
        self._server = process_cpu_seconds(pid)
        self._client = time.process_time()
        self._wall = time.perf_counter()

    def stop(self, units: int) -> Usage:
        server = process_cpu_seconds(self.pid)
        return Usage(server_s=None if server is None or self._server is None
                     else server - self._server,
                     client_s=time.process_time() - self._client,
                     wall_s=time.perf_counter() - self._wall, units=units)


# ---- 1 KB messages ---------------------------------------------------------------------

_WORDS = (
    "the context window budget session branch fold token model agent request reply tool "
    "result memory compaction daemon socket client summary message thread render usage "
    "history prompt system user assistant cache limit health state store commit write read "
    "query index search retrieval answer question plan step test build error warning file "
    "path line function module package version update change review merge deploy config "
    "value default option flag argument return raise await nursery channel actor deadline "
    "because however therefore although meanwhile instead otherwise finally first next then "
    "quickly carefully probably exactly simply usually clearly large small new old fast slow "
    "important different possible available necessary current previous recent private public"
).split()

_CODE_LINES = (
    "def {name}(self, {arg}: int) -> list[str]:",
    "    return [item.{attr} for item in self.{attr}s if item.{arg} > {num}]",
    "for {arg} in range({num}):\n    total += {name}({arg})",
    'raise ValueError(f"{name}: {{{arg}!r}} is not a valid {attr}")',
    "async with trio.open_nursery() as nursery:\n    nursery.start_soon({name}, {arg})",
    'conn.execute("SELECT {attr} FROM {name} WHERE id = ?", ({arg},))',
    "if {arg} is None:\n    {arg} = {num}  # fall back to the default",
    "{attr}_{name} = {{\"{arg}\": {num}, \"{attr}\": \"{name}\"}}",
    "assert result == expected, f\"{name} returned {{result}}\"",
    "    self.{attr} = {name}.{attr}.copy()\t# keep a private copy",
)

_IDENTIFIERS = ("count", "session", "tokens", "branch", "window", "offset", "limit", "reply",
                "record", "message", "budget", "cursor", "encoder", "payload", "chunk")


def _sentence(rng: random.Random) -> str:
    words = rng.choices(_WORDS, k=rng.randint(6, 18))
    return words[0].capitalize() + " " + " ".join(words[1:]) + rng.choice(".!?.;.") + " "


def _code(rng: random.Random) -> str:
    template = rng.choice(_CODE_LINES)
    return "\n" + template.format(name=rng.choice(_IDENTIFIERS), arg=rng.choice(_IDENTIFIERS),
                                  attr=rng.choice(_IDENTIFIERS),
                                  num=rng.randint(0, 99999)) + "\n"


def message_bodies(count: int, length: int, seed: int = 20240917) -> list[bytes]:
    """``count`` different texts of ``length`` characters, JSON-escaped without quotes."""
    rng = random.Random(seed)
    bodies: list[bytes] = []
    for _ in range(count):
        parts: list[str] = []
        size = 0
        while size < length:
            part = _code(rng) if rng.random() < 0.3 else _sentence(rng)
            parts.append(part)
            size += len(part)
        bodies.append(_encode("".join(parts)[:length])[1:-1])
    return bodies


class MessageSource:
    """Endless 1 KB chat messages, pre-encoded as JSON objects; no two are the same.

    Each is a fixed-width turn number (unique in the run) followed by a body from a pool
    of different texts, so the content is exactly ``MESSAGE_BYTES`` characters.
    """

    PREFIX = "[turn %07d] "

    def __init__(self, pool_size: int = CORPUS_SIZE):
        prefix_length = len(self.PREFIX % 0)
        self._bodies = message_bodies(pool_size, MESSAGE_BYTES - prefix_length)
        self._turn = 0

    def take(self, count: int) -> bytes:
        """``count`` messages joined by commas (the inside of a JSON array)."""
        out: list[bytes] = []
        for _ in range(count):
            self._turn += 1
            role = b"user" if self._turn % 2 else b"assistant"
            out.append(b'{"role":"' + role + b'","content":"'
                       + (self.PREFIX % self._turn).encode()
                       + self._bodies[self._turn % len(self._bodies)] + b'"}')
        return b",".join(out)


# ---- the passes ------------------------------------------------------------------------

@dataclass
class Rounds:
    """The figure of each round of one measurement."""

    values: list[float] = field(default_factory=list)

    @property
    def best(self) -> float:
        return max(self.values)

    def spread(self) -> str:
        if len(self.values) < 2:
            return ""
        return f"{min(self.values):,.0f}-{max(self.values):,.0f}"


@dataclass
class SequentialRun:
    """Requests one at a time over all rounds: their rate and what the server used."""

    rate: Rounds = field(default_factory=Rounds)
    usage: Usage = field(default_factory=Usage)

    def add(self, measured: tuple[float, Usage]) -> None:
        self.rate.values.append(measured[0])
        self.usage.add(measured[1])


@dataclass
class AppendRun:
    """The figures of one kind of append over all rounds."""

    rate: Rounds = field(default_factory=Rounds)
    usage: Usage = field(default_factory=Usage)
    latencies: list[float] = field(default_factory=list)
    messages: int = 0
    tokens: int = 0


class AppendSession:
    """A ctxd session for appends; a new one is opened before the hard block is near."""

    def __init__(self, client: RawClient, tag: str):
        self.client = client
        self.tag = tag
        self.number = 0
        self.ids = iter(range(1_000_000, 2**62))
        self.session_id = ""
        self.sent = 0
        self.tokens = 0
        self.renew()

    def renew(self) -> None:
        if self.session_id:
            self.verify_and_delete()
        self.number += 1
        self.session_id = f"bench-{self.tag}-{os.getpid()}-{self.number}"
        self.client.call_json(next(self.ids), "session.open",
                              {"session_id": self.session_id, "budget": BUDGET})
        self.sent = 0
        self.tokens = 0

    def append(self, messages: bytes, count: int) -> None:
        line = (b'{"jsonrpc":"2.0","id":%d,"method":"message.append","params":'
                b'{"session_id":"%s","messages":[%s]}}\n'
                % (next(self.ids), self.session_id.encode(), messages))
        reply = _decode_append_reply(self.client.call(line))
        if reply.error is not msgspec.UNSET or reply.result is msgspec.UNSET:
            raise BenchError(f"message.append failed: {reply.error}")
        result = reply.result
        if len(result.appended) != count or result.tokens_appended <= count:
            raise BenchError(f"message.append answered {len(result.appended)} entries and "
                             f"{result.tokens_appended} tokens for {count} messages")
        self.sent += count
        self.tokens = result.context_state.total_tokens
        if self.tokens > SESSION_TOKEN_LIMIT:
            self.renew()

    def verify_and_delete(self) -> None:
        """Check that every message sent was stored, then drop the session (untimed)."""
        session = self.client.call_json(next(self.ids), "session.get",
                                        {"session_id": self.session_id})["session"]
        if session["message_count"] != self.sent:
            raise BenchError(f"session {self.session_id} holds {session['message_count']} "
                             f"messages, {self.sent} were appended")
        self.client.call_json(next(self.ids), "session.delete",
                              {"session_id": self.session_id})
        self.session_id = ""


def append_round(targets: Sequence[tuple[RawClient, int, AppendRun]], source: MessageSource,
                 batch: int, seconds: float, tag: str) -> None:
    """Append for ``seconds`` to each target (a daemon's connection, its pid, its figures)
    in turn, one request each, so that several daemons are measured over the same moments
    of a noisy machine: each one's CPU time is read over the same window, its rate is its
    messages over the time its own requests took (over the whole window with one target).
    """
    sessions = [AppendSession(client, f"{tag}-{n}") for n, (client, _, _) in enumerate(targets)]
    for session in sessions:
        for _ in range(3):  # warm-up: the actor starts and loads its record
            session.append(source.take(batch), batch)
    tokens_before = [session.tokens for session in sessions]
    busy = [0.0] * len(targets)
    messages = 0
    probes = [UsageProbe(pid) for _, pid, _ in targets]
    started = time.perf_counter()
    now = started
    while now < started + seconds:
        for n, (session, (_, _, run)) in enumerate(zip(sessions, targets, strict=True)):
            payload = source.take(batch)
            sent_at = time.perf_counter()
            session.append(payload, batch)
            now = time.perf_counter()
            run.latencies.append(now - sent_at)
            busy[n] += now - sent_at
        messages += batch
    for n, (session, probe, (_, _, run)) in enumerate(zip(sessions, probes, targets,
                                                          strict=True)):
        run.rate.values.append(messages / (now - started if len(targets) == 1 else busy[n]))
        run.usage.add(probe.stop(messages))
        run.messages += messages
        run.tokens += max(0, session.tokens - tokens_before[n])
        session.verify_and_delete()


# ---- the report ------------------------------------------------------------------------

def verdict(met: bool) -> str:
    return "PASS" if met else "MISS"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms"


def print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for index, row in enumerate(rows):
        print("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if index == 0:
            print("  " + "  ".join("-" * width for width in widths))


@dataclass
class Report:
    """Everything measured, filled pass by pass (so a failed run still shows what it got)."""

    args: argparse.Namespace
    echo_rate: Rounds = field(default_factory=Rounds)
    ctxd_rate: Rounds = field(default_factory=Rounds)
    echo_usage: Usage = field(default_factory=Usage)
    ctxd_usage: Usage = field(default_factory=Usage)
    echo_latency: list[float] = field(default_factory=list)
    ctxd_latency: list[float] = field(default_factory=list)
    single: AppendRun = field(default_factory=AppendRun)
    batched: AppendRun = field(default_factory=AppendRun)
    echo_sequential: SequentialRun = field(default_factory=SequentialRun)
    ping_sequential: SequentialRun = field(default_factory=SequentialRun)
    base_single: AppendRun = field(default_factory=AppendRun)
    base_batched: AppendRun = field(default_factory=AppendRun)

    def print(self) -> None:
        args = self.args
        print()
        print(machine_line("ctxd RPC benchmark", bool(args.profile_ctxd)))
        print("load generator: one blocking Unix-socket connection in this process, "
              "requests pre-encoded; servers in their own processes")
        print(f"figures: best of {args.rounds} interleaved rounds (range of all rounds)")
        print()
        rows: list[tuple[str, ...]] = [("measurement", "echo baseline", "ctxd", "ratio",
                                        "target", "result", "rounds (ctxd)")]
        if self.ctxd_rate.values:
            ratio = self.ctxd_rate.best / self.echo_rate.best
            rows.append((f"daemon.ping req/s, pipelined window {args.window}, "
                         f"{args.seconds:g} s",
                         f"{self.echo_rate.best:,.0f}", f"{self.ctxd_rate.best:,.0f}",
                         f"{ratio:.2f}x", f">= {PING_TARGET_RATIO}x",
                         verdict(ratio >= PING_TARGET_RATIO), self.ctxd_rate.spread()))
            echo_cpu = self.echo_usage.server_us_per_unit()
            ctxd_cpu = self.ctxd_usage.server_us_per_unit()
            if echo_cpu is not None and ctxd_cpu is not None:
                rows.append(("  server CPU per ping (pipelined)", f"{echo_cpu:.1f} us",
                             f"{ctxd_cpu:.1f} us", f"{ctxd_cpu / echo_cpu:.2f}x", "-", "info",
                             ""))
            rows.append(("  CPU busy, server / load generator", self.echo_usage.busy(),
                         self.ctxd_usage.busy(), "-", "-", "info", ""))
        if self.ctxd_latency:
            for label, fraction in (("p50", 0.50), ("p99", 0.99)):
                echo = percentile(self.echo_latency, fraction)
                ctxd = percentile(self.ctxd_latency, fraction)
                rows.append((f"daemon.ping latency {label}, one at a time "
                             f"({len(self.ctxd_latency)} req)", ms(echo), ms(ctxd),
                             f"{ctxd / echo:.2f}x", "-", "info", ""))
        for run, base, name, target in (
                (self.single, self.base_single, "1 msg/request", SINGLE_TARGET),
                (self.batched, self.base_batched, f"{BATCH_SIZE} msgs/request",
                 BATCHED_TARGET)):
            if not run.rate.values:
                continue
            echo = self.echo_sequential if run is self.single else SequentialRun()
            rows.append((f"message.append msgs/s, 1 KB, {name}, sequential",
                         f"{echo.rate.best:,.0f} req/s" if echo.rate.values else "-",
                         f"{run.rate.best:,.0f}",
                         f"{run.rate.best / echo.rate.best:.2f}x" if echo.rate.values else "-",
                         f">= {target:,.0f}", verdict(run.rate.best >= target),
                         run.rate.spread()))
            rows.append((f"  request latency p50 / p99 ({name})", "-",
                         f"{ms(percentile(run.latencies, 0.5))} / "
                         f"{ms(percentile(run.latencies, 0.99))}", "-", "-", "info", ""))
            per_message = run.usage.server_us_per_unit()
            echo_cpu = echo.usage.server_us_per_unit()
            if per_message is not None:
                rows.append((f"  daemon CPU per message, all threads ({name})",
                             "-" if echo_cpu is None else f"{echo_cpu:.1f} us",
                             f"{per_message:.1f} us",
                             "-" if echo_cpu is None else f"{per_message / echo_cpu:.1f}x",
                             "-", "info", ""))
            ping_cpu = self.ping_sequential.usage.server_us_per_unit()
            if run is self.single and per_message is not None and ping_cpu is not None:
                rows.append(("  ctxd CPU per daemon.ping, one at a time",
                             "-" if echo_cpu is None else f"{echo_cpu:.1f} us",
                             f"{ping_cpu:.1f} us",
                             f"append {per_message / ping_cpu:.1f}x", "-", "info", ""))
            rows.append((f"  CPU busy, ctxd / load generator ({name})", "-",
                         run.usage.busy(), "-", "-", "info", ""))
            base_cpu = base.usage.server_us_per_unit()
            if base.rate.values and base_cpu is not None and per_message is not None:
                label = args.baseline
                rows.append((f"  {label}: msgs/s ({name})", "-", f"{base.rate.best:,.0f}",
                             f"this tree {run.rate.best / base.rate.best:.2f}x", "-", "info",
                             base.rate.spread()))
                rows.append((f"  {label}: daemon CPU per message ({name})", "-",
                             f"{base_cpu:.1f} us", f"this tree {per_message / base_cpu:.2f}x",
                             "-", "info", ""))
        print_table(rows)
        appended = self.single.messages + self.batched.messages
        if appended:
            tokens = self.single.tokens + self.batched.tokens
            print(f"\nappends checked: {appended:,} messages ({tokens:,} tokens, about "
                  f"{tokens / appended:.0f} tokens per 1 KB message) counted and committed; "
                  "each session's message_count matched")
        print()


def run_benchmark(report: Report) -> None:
    """Start the servers, run the passes into ``report``, stop the servers."""
    args = report.args
    passes = set(args.only)
    root = Path(tempfile.mkdtemp(prefix="ctxd-b"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, root, ignore_errors=True)
        if args.keep_logs:
            stack.callback(copy_logs, root, Path(args.keep_logs))
        print(f"starting the echo baseline and ctxd in {root} ...", flush=True)
        echo = start_echo(stack, root) if passes & {"ping", "latency", "single"} else None
        ctxd = stack.enter_context(DaemonProcess(
            root, profile=Path(args.profile_ctxd) if args.profile_ctxd else None).running())
        ctxd_client = stack.enter_context(contextlib.closing(RawClient(ctxd.socket)))
        echo_client = (stack.enter_context(contextlib.closing(RawClient(echo.socket_path)))
                       if echo is not None else None)
        base: DaemonProcess | None = None
        base_client: RawClient | None = None
        if args.baseline:
            base = DaemonProcess(root, name="baseline", data=root / "baseline-data",
                                 code=stack.enter_context(checkout(args.baseline)))
            base.start()
            stack.callback(base.stop)
            base_client = stack.enter_context(contextlib.closing(RawClient(base.socket)))
        source = MessageSource()
        for round_number in range(1, args.rounds + 1):
            print(f"round {round_number}/{args.rounds}: " + ", ".join(sorted(passes)),
                  flush=True)
            if "ping" in passes and echo is not None and echo_client is not None:
                for server, client, rate, usage in (
                        (echo, echo_client, report.echo_rate, report.echo_usage),
                        (ctxd, ctxd_client, report.ctxd_rate, report.ctxd_usage)):
                    probe = UsageProbe(server.proc.pid)
                    value, answered = pipelined_rate(client, ping_line, args.seconds,
                                                     args.window, args.warmup)
                    rate.values.append(value)
                    usage.add(probe.stop(answered))
            if "latency" in passes and echo_client is not None:
                report.echo_latency += sequential_latencies(
                    echo_client, ping_line, args.latency_count, args.seconds)
                report.ctxd_latency += sequential_latencies(
                    ctxd_client, ping_line, args.latency_count, args.seconds)
            if "single" in passes and echo is not None and echo_client is not None:
                report.echo_sequential.add(sequential_round(
                    echo_client, echo.proc.pid, ping_line, args.append_seconds))
                report.ping_sequential.add(sequential_round(
                    ctxd_client, ctxd.proc.pid, ping_line, args.append_seconds))
            for kind, batch, run, base_run in (
                    ("single", 1, report.single, report.base_single),
                    ("batched", BATCH_SIZE, report.batched, report.base_batched)):
                if kind not in passes:
                    continue
                targets = [(ctxd_client, ctxd.proc.pid, run)]
                if base is not None and base_client is not None and base.proc is not None:
                    targets.append((base_client, base.proc.pid, base_run))  # in lockstep
                append_round(targets, source, batch, args.append_seconds,
                             f"{kind}-r{round_number}")
        try:
            code = ctxd.stop()
        except DaemonFailed:  # it ignored SIGTERM and was killed
            code = ctxd.proc.returncode if ctxd.proc is not None else None
        if code != 0:
            print(f"note: ctxd exited with {code}:\n{ctxd.log()[-4000:]}")


def machine_line(title: str, profiled: bool = False) -> str:
    """The first line of a benchmark's report: what it ran on, and how loaded that was."""
    return (f"{title}: {platform.python_implementation()} {platform.python_version()}, "
            f"{os.cpu_count()} CPUs, load average "
            f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
            + (", ctxd under cProfile (figures not comparable)" if profiled else ""))


def copy_logs(root: Path, destination: Path) -> None:
    """Keep the daemons' logs (``*.log`` in ``root``) in ``destination``."""
    destination.mkdir(parents=True, exist_ok=True)
    for log in root.glob("*.log"):
        shutil.copy(log, destination / log.name)


@contextlib.contextmanager
def scratch_root(prefix: str, keep_logs: str | None) -> Iterator[Path]:
    """A temporary folder for the daemons, removed afterwards (their logs copied to
    ``keep_logs`` first, when given)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield root
    finally:
        if keep_logs:
            copy_logs(root, Path(keep_logs))
        shutil.rmtree(root, ignore_errors=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    cli.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    cli.add_argument("--seconds", type=float, default=1.0,
                     help="measured seconds of each pipelined ping pass (default 1)")
    cli.add_argument("--warmup", type=float, default=0.2,
                     help="seconds of each pipelined pass not measured (default 0.2)")
    cli.add_argument("--window", type=int, default=32,
                     help="pipelined requests in flight (default 32; ctxd allows 64)")
    cli.add_argument("--latency-count", type=int, default=2000,
                     help="one-at-a-time pings per target per round (default 2000)")
    cli.add_argument("--append-seconds", type=float, default=1.5,
                     help="seconds of each append pass (default 1.5)")
    cli.add_argument("--only", type=lambda text: text.split(","),
                     default=["ping", "latency", "single", "batched"],
                     help="comma-separated passes: ping,latency,single,batched")
    cli.add_argument("--baseline", metavar="REV",
                     help="run the append passes against a daemon of this revision too")
    cli.add_argument("--profile-ctxd", metavar="FILE",
                     help="run ctxd under cProfile and write its profile to FILE")
    cli.add_argument("--keep-logs", metavar="DIR", help="copy the servers' logs to DIR")
    cli.add_argument("--echo-server", metavar="SOCKET", help=argparse.SUPPRESS)
    args = cli.parse_args(argv)
    unknown = set(args.only) - {"ping", "latency", "single", "batched"}
    if unknown:
        cli.error(f"unknown passes: {', '.join(sorted(unknown))}")
    if args.window < 1 or args.rounds < 1:
        cli.error("--window and --rounds must be at least 1")
    return args


def _exit_on_signal(signum: int, frame: object) -> None:
    sys.exit(128 + signum)


class Printable(Protocol):
    def print(self) -> None: ...


ReportT = TypeVar("ReportT", bound=Printable)


def run_and_report(report: ReportT, benchmark: Callable[[ReportT], None]) -> None:
    """Run a benchmark and print its report (also what was measured before a failure).

    SIGTERM unwinds like Ctrl-C, so daemons are stopped and temp dirs removed. Exits 1
    when the figures could not be measured at all; a missed target exits 0.
    """
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        benchmark(report)
    except (BenchError, DaemonFailed, OSError) as exc:
        report.print()
        print(f"benchmark could not finish: {exc}", file=sys.stderr)
        sys.exit(1)
    report.print()


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.echo_server:
        with contextlib.suppress(KeyboardInterrupt):
            trio.run(serve_echo, args.echo_server)
        return
    run_and_report(Report(args), run_benchmark)


if __name__ == "__main__":
    main()

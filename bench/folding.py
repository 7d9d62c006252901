"""Folding benchmark: branch.create, branch.return and the deadlines of 10,000 live branches.

Everything runs against real daemons (``python -m ctxd`` on a temporary socket and data
directory), each figure beside a baseline measured in the same run. The load generator is
this process: blocking Unix-socket clients from ``bench/rpc.py``, requests encoded before
their timer starts. Machines are shared and noisy: the client and the daemon share the
same cores, and the figures say so.

Phase ``latency`` (one daemon), interleaved over ``--rounds`` rounds, one request at a
time; percentiles pool every round:

* baselines: ``daemon.ping`` (the floor of a round trip) and ``message.append`` of one
  1 KB message to a session's main thread (tokenized and committed).
* ``branch.create`` with a 1 KB prompt (ctxd counts its note and the prompt and commits
  the branch with both): p50/p99 and its ratio to the 1 KB append. Target p99 <= 5 ms.
  Every tenth create, the session's ten live branches are returned (an empty branch with
  a 1 KB return message: shown for reference).
* ``branch.return`` with a 1 KB return message from a branch holding about 32k tokens
  (budget 32768; the opening note and prompt count toward it; the rest is appended,
  untimed, in 1 KB messages until less than one message's worth is left, so the branch is
  never force-returned). Target p99 <= 20 ms.
* ``branch.create`` throughput, pipelined (``--window`` in flight over sessions), which
  also sizes the lead time of the next phases.

Phases ``spread`` and ``burst`` (a fresh daemon each): live branches in sessions of 10
(the per-session default), created pipelined with timeouts chosen so that every deadline
falls a planned time after creation ends. ``spread``: ``--branches`` of them (default
10,000: 1,000 sessions, the per-daemon default) spread uniformly over ``--spread``
(default 5-15 s); target: every one force-returned within 100 ms of its deadline.
``burst``: for each of ``--bursts`` (default 1,000 and 10,000), that many all on one
instant (``--burst-after``, default 5 s), first on a daemon of a baseline revision
(``--baseline``, default ``main``; ``none``: no baseline), then on one of this tree, each
figure beside the baseline's and the ratio of the two; target: every one within 100 µs
per branch of the burst (1,000 within 100 ms, 10,000 within 1 s), and at least 100 ms.
A second connection subscribed to ``branch.forced_return`` records every event (the
daemons' ``event_buffer`` holds a whole burst, so that none is dropped); lateness is the
event's ``ts`` minus its ``data.deadline`` (both the daemon's wall clock). Beside it:
``returned_at`` of every branch from ``branch.list`` (stamped before the fold is written,
so it is never later than the event), the status of every branch (all must be
``timeout``), ``daemon.ping`` round trips every 50 ms while the deadlines pass (how long
the event loop is unavailable), the daemon's CPU in that time, and its memory:
``daemon.status`` ``rss_bytes`` once all branches are live and the peak (``VmHWM``) after
they have all been force-returned, against the idle daemon's RSS. Target <= 500 MB.

The script reports and exits 0 once the daemons have started; it exits 1 only when a
figure could not be measured (an error reply, a daemon that died). ``--quick`` is a short
run (2,000 branches spread, bursts of 1,000 and 2,000, smaller samples);
``--profile-ctxd FILE`` runs each daemon under cProfile (``FILE.<phase>``; figures are then
slower); ``--keep-logs DIR`` keeps the daemons' logs.

Run: ``python bench/folding.py`` (about two minutes), ``python bench/folding.py --quick``
(about 40 s), ``python bench/folding.py --only burst`` (the bursts alone).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import select
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from _common import checkout
from rpc import (
    RECV_CHUNK,
    BenchError,
    DaemonFailed,
    DaemonProcess,
    MessageSource,
    RawClient,
    machine_line,
    message_bodies,
    ms,
    percentile,
    ping_line,
    print_table,
    process_cpu_seconds,
    request_line,
    run_and_report,
    verdict,
)

TEXT_BYTES = 1024
FULL_BUDGET = 32_768
LONG_TIMEOUT_S = 600.0
FILL_BATCH = 100
FIRST_GUESS = 400  # tokens of a 1 KB message before any was counted (generous)
FILL_SLACK = 32  # a message never seen may be a little larger than the largest seen
CREATE_P99_TARGET_S = 0.005
RETURN_P99_TARGET_S = 0.020
LATENESS_TARGET_S = 0.100
BURST_TARGET_PER_BRANCH_S = 0.000_1
"""A burst of n coincident deadlines: every branch returned within n x 100 µs (1,000 in
100 ms, 10,000 in 1 s), and within `LATENESS_TARGET_S` at least."""
EVENT_BUFFER_SPARE = 1_000
RSS_TARGET_BYTES = 500 * 1000 * 1000
PING_EVERY_S = 0.05
SUBSCRIBE_TIMEOUT_S = 5.0
GRACE_S = 30.0
BIG_BUDGET = {"context_window": 10_000_000, "max_output_tokens": 8192}
# Deadlines are planned from when creation is expected to end: LEAD_BASE_S plus
# LEAD_FACTOR times the creation time at the rate measured in the latency phase (or at
# DEFAULT_CREATE_RATE without it). Creation that runs late shrinks the planned gap; the
# report gives the gap that really was.
DEFAULT_CREATE_RATE = 1000.0
LEAD_BASE_S = 0.5
LEAD_FACTOR = 1.6

_decode = msgspec.json.Decoder().decode


# ---- talking to the daemon ------------------------------------------------------------

class Caller:
    """A `RawClient` with its own request ids: one request at a time, or pipelined."""

    def __init__(self, client: RawClient):
        self.client = client
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        return next(self._ids)

    def line(self, method: str, params: dict[str, Any]) -> tuple[int, bytes]:
        request_id = next(self._ids)
        return request_id, request_line(request_id, method, params)

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        return self.client.call_json(next(self._ids), method, params or {})

    def timed(self, method: str, params: dict[str, Any]) -> tuple[float, Any]:
        """Round-trip seconds of one request (encoded before the clock starts), and its result."""
        request_id, line = self.line(method, params)
        started = time.perf_counter()
        raw = self.client.call(line)
        elapsed = time.perf_counter() - started
        reply = _decode(raw)
        if "error" in reply or reply.get("id") != request_id:
            raise BenchError(f"{method} failed: {raw[:500]!r}")
        return elapsed, reply["result"]

    def ping_seconds(self) -> float:
        request_id = next(self._ids)
        line = ping_line(request_id)
        started = time.perf_counter()
        raw = self.client.call(line)
        elapsed = time.perf_counter() - started
        if _decode(raw).get("id") != request_id:
            raise BenchError(f"daemon.ping failed: {raw[:500]!r}")
        return elapsed

    def pipelined(self, method: str, params: Iterable[Callable[[], dict[str, Any]]],
                  window: int) -> list[Any]:
        """Send requests with ``window`` in flight, each request's params built just before
        it is sent, and return the results in request order."""
        pending = iter(params)
        index_of: dict[int, int] = {}
        results: dict[int, Any] = {}
        sent = 0

        def send(count: int) -> None:
            nonlocal sent
            lines: list[bytes] = []
            for make in itertools.islice(pending, count):
                request_id, line = self.line(method, make())
                index_of[request_id] = sent
                sent += 1
                lines.append(line)
            if lines:
                self.client.send(b"".join(lines))

        send(window)
        while index_of:
            lines = self.client.read_lines()
            for raw in lines:
                reply = _decode(raw)
                index = index_of.pop(reply.get("id"), None)
                if index is None or "error" in reply:
                    raise BenchError(f"{method} failed: {raw[:500]!r}")
                results[index] = reply["result"]
            send(len(lines))
        return [results[index] for index in range(sent)]


class EventStream:
    """A connection subscribed to ``branch.forced_return``; read when the caller polls."""

    def __init__(self, path: Path):
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(str(path))
        self._buffer = bytearray()
        self.late: dict[str, float] = {}
        """branch_id -> event ts - deadline (seconds)."""
        self.received_late: dict[str, float] = {}
        """branch_id -> when this process read the event - deadline (seconds)."""
        self.dropped = 0
        self._sock.sendall(request_line(1, "events.subscribe",
                                        {"types": ["branch.forced_return"]}))
        self._subscribed = False
        give_up = time.monotonic() + SUBSCRIBE_TIMEOUT_S
        while not self._subscribed:
            if time.monotonic() > give_up:
                raise BenchError("events.subscribe got no answer")
            self.poll(SUBSCRIBE_TIMEOUT_S)

    def close(self) -> None:
        self._sock.close()

    def poll(self, timeout: float) -> int:
        """Read what has arrived within ``timeout`` seconds; return how many events."""
        readable, _, _ = select.select([self._sock], [], [], max(0.0, timeout))
        if not readable:
            return 0
        chunk = self._sock.recv(RECV_CHUNK)
        if not chunk:
            raise BenchError("the daemon closed the event connection")
        now = time.time()
        self._buffer += chunk
        end = self._buffer.rfind(b"\n")
        if end < 0:
            return 0
        lines = bytes(self._buffer[:end]).split(b"\n")
        del self._buffer[:end + 1]
        count = 0
        for raw in lines:
            message = _decode(raw)
            if message.get("method") != "event":
                if "error" in message:
                    raise BenchError(f"events.subscribe failed: {raw[:500]!r}")
                self._subscribed = True
                continue
            event = message["params"]
            if event["type"] == "dropped":
                self.dropped += event["data"]["dropped"]
                continue
            data = event["data"]
            branch_id = data["branch_id"]
            self.late[branch_id] = event["ts"] - data["deadline"]
            self.received_late[branch_id] = now - data["deadline"]
            count += 1
        return count


def vm_bytes(pid: int, key: str) -> int | None:
    """``VmRSS`` / ``VmHWM`` of a process from /proc, in bytes (None where it is absent)."""
    try:
        for row in Path(f"/proc/{pid}/status").read_text().splitlines():
            if row.startswith(key + ":"):
                return int(row.split()[1]) * 1024
    except OSError:
        pass
    return None


def mb(size: float | None) -> str:
    return "n/a" if size is None else f"{size / 1e6:,.0f} MB"


class Texts:
    """Different 1 KB texts (prose and code), each numbered so that no two are the same."""

    PREFIX = "[task %07d] "

    def __init__(self, pool: int = 512):
        body = TEXT_BYTES - len(self.PREFIX % 0)
        self._bodies = [msgspec.json.decode(b'"' + raw + b'"')
                        for raw in message_bodies(pool, body, seed=20250101)]
        self._number = 0

    def take(self) -> str:
        self._number += 1
        return self.PREFIX % self._number + self._bodies[self._number % len(self._bodies)]


def open_session(caller: Caller, name: str, budget: dict[str, int] | None = None) -> str:
    session_id = f"bench-fold-{os.getpid()}-{name}"
    params: dict[str, Any] = {"session_id": session_id}
    if budget is not None:
        params["budget"] = budget
    caller.call("session.open", params)
    return session_id


def create_params(session_id: str, number: int, prompt: str, timeout_s: float,
                  budget: int | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {
        "session_id": session_id, "description": f"sub-task {number}: check one module",
        "prompt": prompt, "timeout_seconds": round(timeout_s, 3), "parent_branch_id": None}
    if budget is not None:
        params["budget"] = budget
    return params


# ---- phase 1: latency -------------------------------------------------------------------

@dataclass
class Latency:
    """One-at-a-time figures of the latency phase, pooled over rounds."""

    ping: list[float] = field(default_factory=list)
    append: list[float] = field(default_factory=list)
    create: list[float] = field(default_factory=list)
    return_empty: list[float] = field(default_factory=list)
    return_full: list[float] = field(default_factory=list)
    opening_tokens: list[int] = field(default_factory=list)
    full_tokens: list[int] = field(default_factory=list)
    create_rates: list[float] = field(default_factory=list)
    create_cpu_us: list[float] = field(default_factory=list)


def latency_round(caller: Caller, texts: Texts, args: argparse.Namespace, round_number: int,
                  result: Latency, pid: int) -> None:
    tag = f"r{round_number}"
    for _ in range(args.pings):
        result.ping.append(caller.ping_seconds())

    session_id = open_session(caller, f"append-{tag}", BIG_BUDGET)
    for _ in range(args.appends):
        seconds, _reply = caller.timed("message.append", {
            "session_id": session_id, "messages": [{"role": "user", "content": texts.take()}]})
        result.append.append(seconds)

    session_id = open_session(caller, f"create-{tag}", BIG_BUDGET)
    live: list[str] = []
    for number in range(args.creates):
        if len(live) == args.per_session:
            for branch_id in live:
                seconds, _reply = caller.timed("branch.return", {
                    "branch_id": branch_id, "message": texts.take()})
                result.return_empty.append(seconds)
            live.clear()
        seconds, created = caller.timed("branch.create", create_params(
            session_id, number, texts.take(), LONG_TIMEOUT_S))
        result.create.append(seconds)
        result.opening_tokens.append(created["budget_used"])
        live.append(created["branch_id"])
    for branch_id in live:
        caller.call("branch.return", {"branch_id": branch_id, "message": texts.take()})

    session_id = open_session(caller, f"return-{tag}", BIG_BUDGET)
    source = MessageSource()
    for number in range(args.returns):
        created = caller.call("branch.create", create_params(
            session_id, number, texts.take(), LONG_TIMEOUT_S, FULL_BUDGET))
        branch_id = created["branch_id"]
        used = fill_branch(caller, session_id, branch_id, created["budget_used"], source)
        seconds, returned = caller.timed("branch.return", {
            "branch_id": branch_id, "message": texts.take()})
        if returned["tokens_used"] != used or returned["forced_returns"]:
            raise BenchError(f"branch.return of {branch_id}: tokens_used "
                             f"{returned['tokens_used']}, expected {used}; forced returns "
                             f"{returned['forced_returns']}")
        result.return_full.append(seconds)
        result.full_tokens.append(used)

    # Pipelined creates: the throughput of the next phases' creation, and their lead time.
    sessions = [open_session(caller, f"rate-{tag}-{i}", BIG_BUDGET)
                for i in range(max(1, args.rate_creates // args.per_session))]
    count = len(sessions) * args.per_session
    cpu_before = process_cpu_seconds(pid)
    started = time.perf_counter()
    created_all = caller.pipelined("branch.create", (
        (lambda i=i: create_params(sessions[i % len(sessions)], i, texts.take(),
                                   LONG_TIMEOUT_S)) for i in range(count)), args.window)
    elapsed = time.perf_counter() - started
    cpu_after = process_cpu_seconds(pid)
    result.create_rates.append(count / elapsed)
    if cpu_before is not None and cpu_after is not None:
        result.create_cpu_us.append((cpu_after - cpu_before) / count * 1e6)
    caller.pipelined("branch.return", (
        (lambda c=c: {"branch_id": c["branch_id"], "message": "done"}) for c in created_all),
        args.window)


def fill_branch(caller: Caller, session_id: str, branch_id: str, used: int,
                source: MessageSource) -> int:
    """Append 1 KB messages to a branch until less than one message's worth of its
    `FULL_BUDGET` is left; return the tokens it then holds (opening included)."""
    largest = 0  # tokens of the largest 1 KB message appended so far
    while True:
        step = largest + FILL_SLACK if largest else FIRST_GUESS
        count = min(FILL_BATCH, (FULL_BUDGET - 1 - used) // step)
        if count < 1:
            return used
        line = (b'{"jsonrpc":"2.0","id":%d,"method":"message.append","params":'
                b'{"session_id":"%s","branch_id":"%s","messages":[%s]}}\n'
                % (caller.next_id(), session_id.encode(), branch_id.encode(),
                   source.take(count)))
        reply = _decode(caller.client.call(line))
        result = reply.get("result")
        if result is None or result["forced_returns"]:
            raise BenchError(f"filling {branch_id}: {str(reply)[:500]}")
        used += result["tokens_appended"]
        largest = max(largest, *(entry["tokens"] for entry in result["appended"]))


# ---- phases 2 and 3: many live branches and their deadlines ----------------------------

@dataclass
class Expiry:
    """The figures of one many-branches variant."""

    name: str
    plan: str
    branches: int = 0
    sessions: int = 0
    create_seconds: float = 0.0
    deadline_window: tuple[float, float] = (0.0, 0.0)
    idle_rss: int | None = None
    live_rss: int | None = None
    live_branches_reported: int = 0
    peak_rss: int | None = None
    late: list[float] = field(default_factory=list)
    received_late: list[float] = field(default_factory=list)
    returned_late: list[float] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    dropped: int = 0
    pings: list[float] = field(default_factory=list)
    cpu_seconds: float | None = None
    expiry_seconds: float = 0.0
    log_problems: list[str] = field(default_factory=list)
    exit_code: int | None = None
    revision: str = "this tree"
    """The code the daemon ran: this tree, or the baseline revision."""

    @property
    def target_s(self) -> float:
        """Every branch's lateness must be at most this."""
        if self.name == "burst":
            return max(LATENESS_TARGET_S, self.branches * BURST_TARGET_PER_BRANCH_S)
        return LATENESS_TARGET_S

    @property
    def met(self) -> bool:
        return (bool(self.late) and len(self.late) == self.branches
                and max(self.late) <= self.target_s)


def plan_offsets(args: argparse.Namespace, variant: str, count: int) -> list[float]:
    """Seconds after the planned end of creation at which each branch's deadline falls."""
    if variant == "burst":
        return [args.burst_after] * count
    low, high = args.spread
    rng = random.Random(20250917)
    # Evenly spaced over the window, in random order: a uniform spread without clumps.
    offsets = [low + (high - low) * (i + 0.5) / count for i in range(count)]
    rng.shuffle(offsets)
    return offsets


def run_expiry(server: DaemonProcess, args: argparse.Namespace, variant: str, count: int,
               create_rate: float, texts: Texts, revision: str = "this tree") -> Expiry:
    assert server.proc is not None
    pid = server.proc.pid
    sessions_count = -(-count // args.per_session)
    lead = LEAD_BASE_S + LEAD_FACTOR * count / create_rate
    offsets = plan_offsets(args, variant, count)
    plan = (f"deadlines {args.spread[0]:g}-{args.spread[1]:g} s" if variant == "spread"
            else f"deadlines all at {args.burst_after:g} s")
    result = Expiry(variant, plan + " after the planned end of creation", branches=count,
                    sessions=sessions_count, revision=revision)
    result.idle_rss = vm_bytes(pid, "VmRSS")
    with contextlib.ExitStack() as stack:
        caller = Caller(stack.enter_context(contextlib.closing(RawClient(server.socket))))
        events = EventStream(server.socket)
        stack.callback(events.close)
        sessions = caller.pipelined("session.open", (
            (lambda i=i: {"session_id": f"bench-fold-{variant}-{i}"})
            for i in range(sessions_count)), args.window)
        session_ids = [s["session"]["session_id"] for s in sessions]
        prompts = [texts.take() for _ in range(count)]
        planned_end = time.time() + lead
        started = time.perf_counter()
        created = caller.pipelined("branch.create", (
            (lambda i=i: create_params(session_ids[i % sessions_count], i, prompts[i],
                                       min(LONG_TIMEOUT_S, max(
                                           0.001, planned_end + offsets[i] - time.time()))))
            for i in range(count)), args.window)
        result.create_seconds = time.perf_counter() - started
        created_end = time.time()
        deadlines = {c["branch_id"]: c["deadline"] for c in created}
        result.deadline_window = (min(deadlines.values()) - created_end,
                                  max(deadlines.values()) - created_end)
        status = caller.call("daemon.status")
        result.live_rss = status["rss_bytes"]
        result.live_branches_reported = status["live_branches"]
        print(f"  {variant}: {count:,} branches created in {result.create_seconds:.1f} s; "
              f"{status['live_branches']:,} live; RSS {mb(result.live_rss)}; deadlines "
              f"{result.deadline_window[0]:.1f}-{result.deadline_window[1]:.1f} s from now",
              flush=True)

        cpu_before = process_cpu_seconds(pid)
        expiry_started = time.perf_counter()
        give_up = max(deadlines.values()) + GRACE_S
        next_ping = time.perf_counter()
        while len(events.late) < count and time.time() < give_up:
            events.poll(max(0.0, next_ping - time.perf_counter()))
            if time.perf_counter() >= next_ping:
                result.pings.append(caller.ping_seconds())
                next_ping = time.perf_counter() + PING_EVERY_S
        result.expiry_seconds = time.perf_counter() - expiry_started
        cpu_after = process_cpu_seconds(pid)
        if cpu_before is not None and cpu_after is not None:
            result.cpu_seconds = cpu_after - cpu_before
        result.peak_rss = vm_bytes(pid, "VmHWM")
        result.late = list(events.late.values())
        result.received_late = list(events.received_late.values())
        result.dropped = events.dropped

        listed = caller.pipelined("branch.list", (
            (lambda s=s: {"session_id": s}) for s in session_ids), args.window)
        for page in listed:
            for branch in page["branches"]:
                result.statuses[branch["status"]] = result.statuses.get(branch["status"], 0) + 1
                if branch["returned_at"] is not None:
                    result.returned_late.append(branch["returned_at"] - branch["deadline"])
        unknown = set(events.late) - set(deadlines)
        if unknown:
            raise BenchError(f"forced returns of branches never created: {sorted(unknown)[:5]}")
    with contextlib.suppress(DaemonFailed):  # it ignored SIGTERM and was killed
        server.stop()
    result.exit_code = server.proc.returncode
    result.log_problems = [row for row in server.log_path.read_text(errors="replace").splitlines()
                           if " WARNING " in row or " ERROR " in row or "Traceback" in row]
    return result


# ---- the report ------------------------------------------------------------------------

def triple(samples: Sequence[float]) -> str:
    """max / p99 / p50 in milliseconds."""
    if not samples:
        return "n/a"
    return (f"{max(samples) * 1000:,.1f} / {percentile(samples, 0.99) * 1000:,.1f} / "
            f"{percentile(samples, 0.5) * 1000:,.1f} ms")


@dataclass
class Report:
    """Everything measured, filled phase by phase (a failed run still shows what it got)."""

    args: argparse.Namespace
    latency: Latency = field(default_factory=Latency)
    expiries: list[Expiry] = field(default_factory=list)

    def print(self) -> None:
        args = self.args
        print()
        print(machine_line("ctxd folding benchmark", bool(args.profile_ctxd)))
        print("load generator: blocking Unix-socket clients in this process (sharing the "
              "CPUs with the daemon); a fresh daemon per phase")
        print()
        rows: list[tuple[str, ...]] = [("measurement", "baseline", "ctxd", "ratio", "target",
                                        "result")]
        self._latency_rows(rows)
        baselines = {(e.name, e.branches): e for e in self.expiries
                     if e.revision != "this tree"}
        for expiry in self.expiries:
            if expiry.revision == "this tree":
                self._expiry_rows(rows, expiry, baselines.get((expiry.name, expiry.branches)))
        if baselines:
            rows.append((f"baseline: a daemon of {self.args.baseline}, the same burst just "
                         "before", "", "", "", "", ""))
        print_table(rows)
        self._notes()
        print()

    def _latency_rows(self, rows: list[tuple[str, ...]]) -> None:
        lat = self.latency
        if not lat.append:
            return
        rows.append((f"daemon.ping p50 / p99 ({len(lat.ping)} req)", "-",
                     f"{ms(percentile(lat.ping, 0.5))} / {ms(percentile(lat.ping, 0.99))}",
                     "-", "-", "info"))
        rows.append((f"message.append 1 KB, main thread, p50 / p99 ({len(lat.append)} req)",
                     "-", f"{ms(percentile(lat.append, 0.5))} / "
                          f"{ms(percentile(lat.append, 0.99))}", "-", "-", "baseline"))
        for samples, label, target in (
                (lat.create, "branch.create, 1 KB prompt", CREATE_P99_TARGET_S),
                (lat.return_full, "branch.return, ~32k-token branch", RETURN_P99_TARGET_S),
                (lat.return_empty, "branch.return, empty branch", None)):
            if not samples:
                continue
            for name, fraction in (("p50", 0.5), ("p99", 0.99)):
                base = percentile(lat.append, fraction)
                value = percentile(samples, fraction)
                judged = target is not None and name == "p99"
                rows.append((f"{label} {name} ({len(samples)} req)", ms(base), ms(value),
                             f"{value / base:.2f}x",
                             f"<= {target * 1000:g} ms" if judged and target else "-",
                             verdict(value <= target) if judged and target else "info"))
        if lat.create_rates:
            cpu = (f", {min(lat.create_cpu_us):,.0f} us daemon CPU each"
                   if lat.create_cpu_us else "")
            rows.append((f"branch.create pipelined ({self.args.window} in flight), best round",
                         "-", f"{max(lat.create_rates):,.0f}/s{cpu}", "-", "-", "info"))

    def _expiry_rows(self, rows: list[tuple[str, ...]], e: Expiry,
                     base: Expiry | None = None) -> None:
        """The rows of one many-branches run, beside the baseline revision's run of the
        same burst (``base``) when there is one."""
        tag = f"[{e.name}]" if e.name == "spread" else f"[{e.name} {e.branches:,}]"

        def beside(figure: Callable[[Expiry], str]) -> str:
            return "-" if base is None else figure(base)

        def ratio(value: Callable[[Expiry], float | None]) -> str:
            if base is None:
                return "-"
            mine, theirs = value(e), value(base)
            return f"{mine / theirs:.2f}x" if mine is not None and theirs else "-"

        def creation(x: Expiry) -> str:
            return f"{x.create_seconds:.1f} s ({x.branches / x.create_seconds:,.0f}/s)"

        def received(x: Expiry) -> str:
            within = sum(value <= x.target_s for value in x.late)
            return f"{len(x.late):,} / {within:,} of {x.branches:,}"

        def cpu(x: Expiry) -> str:
            if x.cpu_seconds is None or not x.expiry_seconds:
                return "n/a"
            return (f"{x.cpu_seconds:.1f} s in {x.expiry_seconds:.1f} s "
                    f"({x.cpu_seconds / x.branches * 1e6:,.0f} us per branch)")

        rows.append((f"{tag} {e.branches:,} branches in {e.sessions:,} sessions: create",
                     beside(creation), creation(e), "-", "-", "info"))
        rows.append((f"{tag} forced-return lateness max / p99 / p50 (event ts - deadline)",
                     beside(lambda x: triple(x.late)), triple(e.late),
                     ratio(lambda x: max(x.late, default=None)),
                     f"max <= {e.target_s * 1000:,.0f} ms", verdict(e.met)))
        rows.append((f"{tag}   events received / within {e.target_s * 1000:,.0f} ms",
                     beside(received), received(e), "-", "-", "info"))
        if e.name == "burst" and e.late and max(e.late) > 0:
            rows.append((f"{tag}   drain rate (events / latest lateness)",
                         beside(lambda x: f"{len(x.late) / max(x.late):,.0f}/s"
                                if x.late and max(x.late) > 0 else "-"),
                         f"{len(e.late) / max(e.late):,.0f}/s", "-", "-", "info"))
        rows.append((f"{tag}   returned_at - deadline, every branch (branch.list)",
                     beside(lambda x: triple(x.returned_late)), triple(e.returned_late),
                     ratio(lambda x: max(x.returned_late, default=None)), "-", "info"))
        rows.append((f"{tag}   event read by the client - deadline",
                     beside(lambda x: triple(x.received_late)), triple(e.received_late),
                     ratio(lambda x: max(x.received_late, default=None)), "-", "info"))
        rows.append((f"{tag}   daemon.ping while deadlines pass, max / p99 / p50 "
                     f"({len(e.pings)} req)", beside(lambda x: triple(x.pings)),
                     triple(e.pings), ratio(lambda x: max(x.pings, default=None)), "-",
                     "info"))
        rows.append((f"{tag}   daemon CPU while deadlines pass", beside(cpu), cpu(e),
                     ratio(lambda x: x.cpu_seconds), "-", "info"))
        live_ratio = (f"{e.live_rss / e.idle_rss:.2f}x"
                      if e.live_rss and e.idle_rss else "-")
        rows.append((f"{tag} RSS with {e.live_branches_reported:,} live (daemon.status)",
                     f"{mb(e.idle_rss)} idle", mb(e.live_rss), live_ratio, "-", "info"))
        if e.live_rss and e.idle_rss:
            rows.append((f"{tag}   memory per live branch (live - idle) / branches",
                         beside(lambda x: f"{(x.live_rss - x.idle_rss) / x.branches / 1000:,.1f}"
                                f" KB" if x.live_rss and x.idle_rss else "-"),
                         f"{(e.live_rss - e.idle_rss) / e.branches / 1000:,.1f} KB", "-", "-",
                         "info"))
        peak_met = e.peak_rss is not None and e.peak_rss <= RSS_TARGET_BYTES
        rows.append((f"{tag} peak RSS (VmHWM)", f"{mb(e.idle_rss)} idle", mb(e.peak_rss),
                     f"{e.peak_rss / e.idle_rss:.2f}x" if e.peak_rss and e.idle_rss else "-",
                     f"<= {RSS_TARGET_BYTES / 1e6:g} MB", verdict(peak_met)))

    def _notes(self) -> None:
        lat = self.latency
        if lat.opening_tokens:
            print(f"\nbranch opening (note + 1 KB prompt): {min(lat.opening_tokens)}-"
                  f"{max(lat.opening_tokens)} tokens, charged to the branch's budget")
        if lat.full_tokens:
            print(f"full branches at return: {min(lat.full_tokens):,}-{max(lat.full_tokens):,}"
                  f" of {FULL_BUDGET:,} tokens (opening included); none force-returned")
        for e in self.expiries:
            tag = (f"[{e.name}]" if e.name == "spread" else f"[{e.name} {e.branches:,}]") + (
                "" if e.revision == "this tree" else f" ({e.revision})")
            print(f"{tag} {e.plan}: after creation ended, deadlines fell "
                  f"{e.deadline_window[0]:.1f}-{e.deadline_window[1]:.1f} s later; branch "
                  f"statuses {e.statuses}; events dropped by the daemon: {e.dropped}; daemon "
                  f"exit code {e.exit_code}")
            missing = e.branches - len(e.late)
            if missing:
                print(f"{tag} {missing:,} forced-return events never arrived")
            for row in e.log_problems[:5]:
                print(f"{tag} daemon log: {row}")
            if len(e.log_problems) > 5:
                print(f"{tag} ... {len(e.log_problems) - 5} more warnings/errors in the log")


# ---- the run ---------------------------------------------------------------------------

def _daemon(stack: contextlib.ExitStack, root: Path, phase: str, args: argparse.Namespace,
            tree: Path | None = None, env: dict[str, str] | None = None) -> DaemonProcess:
    """A fresh daemon for ``phase``, of this tree or of the baseline's ``tree``."""
    home = root / phase
    home.mkdir()
    if args.keep_logs:
        stack.callback(_copy_log, home / "ctxd.log", Path(args.keep_logs) / f"ctxd-{phase}.log")
    profile = Path(f"{args.profile_ctxd}.{phase}") if args.profile_ctxd else None
    server = DaemonProcess(home, profile=profile, env=env or {}, code=tree)
    if tree is None:
        return stack.enter_context(server.running())
    stack.callback(server.stop)
    return server.start()


def _copy_log(log: Path, destination: Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    if log.exists():
        shutil.copy(log, destination)


def run_benchmark(report: Report) -> None:
    args = report.args
    root = Path(tempfile.mkdtemp(prefix="ctxd-f"))
    texts = Texts()
    create_rate = DEFAULT_CREATE_RATE
    with contextlib.ExitStack() as outer:
        outer.callback(shutil.rmtree, root, ignore_errors=True)
        if "latency" in args.only:
            with contextlib.ExitStack() as stack:
                print(f"latency: starting ctxd in {root} ...", flush=True)
                server = _daemon(stack, root, "latency", args)
                caller = Caller(stack.enter_context(
                    contextlib.closing(RawClient(server.socket))))
                for round_number in range(1, args.rounds + 1):
                    print(f"  round {round_number}/{args.rounds}", flush=True)
                    latency_round(caller, texts, args, round_number, report.latency,
                                  server.proc.pid)
                create_rate = max(report.latency.create_rates)
        if "spread" in args.only:
            with contextlib.ExitStack() as stack:
                print("spread: starting ctxd ...", flush=True)
                server = _daemon(stack, root, "spread", args)
                report.expiries.append(run_expiry(server, args, "spread", args.branches,
                                                  create_rate, texts))
        if "burst" not in args.only:
            return
        revisions: list[tuple[str, Path | None]] = [("this tree", None)]
        if args.baseline != "none":
            print(f"burst: the baseline is {args.baseline}", flush=True)
            revisions.insert(0, (args.baseline, outer.enter_context(checkout(args.baseline))))
        for count in args.bursts:
            # Every event of the burst fits in the subscriber's buffer: none is dropped.
            env = {"CTXD_EVENT_BUFFER": str(count + EVENT_BUFFER_SPARE)}
            for revision, tree in revisions:
                with contextlib.ExitStack() as stack:
                    print(f"burst of {count:,}: starting ctxd ({revision}) ...", flush=True)
                    phase = f"burst-{count}-{'this' if tree is None else 'baseline'}"
                    server = _daemon(stack, root, phase, args, tree, env)
                    report.expiries.append(run_expiry(server, args, "burst", count,
                                                      create_rate, texts, revision))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    cli.add_argument("--quick", action="store_true",
                     help="a short run: 1 round, 2,000 branches, smaller samples, spread "
                          "3-8 s, bursts of 1,000 and 2,000 at 3 s (explicit options still "
                          "win)")
    cli.add_argument("--rounds", type=int, help="interleaved latency rounds (default 3)")
    cli.add_argument("--pings", type=int, help="daemon.ping per round (default 1000)")
    cli.add_argument("--appends", type=int, help="baseline appends per round (default 500)")
    cli.add_argument("--creates", type=int, help="timed branch.create per round (default 500)")
    cli.add_argument("--returns", type=int,
                     help="timed returns of ~32k-token branches per round (default 100)")
    cli.add_argument("--rate-creates", type=int,
                     help="pipelined creates per round for the throughput (default 1000)")
    cli.add_argument("--branches", type=int,
                     help="live branches in the spread phase (default 10000)")
    cli.add_argument("--bursts", type=lambda text: [int(x) for x in text.split(",")],
                     help="comma-separated sizes of the bursts of coincident deadlines "
                          "(default 1000,10000)")
    cli.add_argument("--baseline", default="main",
                     help="the git revision whose daemon runs each burst first, as the "
                          "baseline (default main; none: no baseline)")
    cli.add_argument("--per-session", type=int, default=10,
                     help="branches per session (default 10, the daemon's limit)")
    cli.add_argument("--spread", type=lambda text: tuple(float(x) for x in text.split(",")),
                     help="LOW,HIGH seconds after creation over which the spread phase's "
                          "deadlines fall (default 5,15)")
    cli.add_argument("--burst-after", type=float,
                     help="seconds after creation at which every burst deadline falls "
                          "(default 5)")
    cli.add_argument("--window", type=int, default=32,
                     help="pipelined requests in flight (default 32; ctxd allows 64)")
    cli.add_argument("--only", type=lambda text: text.split(","),
                     default=["latency", "spread", "burst"],
                     help="comma-separated phases: latency,spread,burst")
    cli.add_argument("--profile-ctxd", metavar="FILE",
                     help="run each daemon under cProfile, writing FILE.<phase>")
    cli.add_argument("--keep-logs", metavar="DIR", help="copy the daemons' logs to DIR")
    args = cli.parse_args(argv)
    defaults = ({"rounds": 1, "pings": 300, "appends": 200, "creates": 200, "returns": 30,
                 "rate_creates": 300, "branches": 2000, "bursts": [1000, 2000],
                 "spread": (3.0, 8.0), "burst_after": 3.0} if args.quick else
                {"rounds": 3, "pings": 1000, "appends": 500, "creates": 500, "returns": 100,
                 "rate_creates": 1000, "branches": 10_000, "bursts": [1000, 10_000],
                 "spread": (5.0, 15.0), "burst_after": 5.0})
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    unknown = set(args.only) - {"latency", "spread", "burst"}
    if unknown:
        cli.error(f"unknown phases: {', '.join(sorted(unknown))}")
    if len(args.spread) != 2 or not 0 < args.spread[0] <= args.spread[1]:
        cli.error("--spread takes LOW,HIGH with 0 < LOW <= HIGH")
    if min(args.rounds, args.window, args.per_session, args.branches, args.creates,
           args.returns, args.appends, args.pings, args.rate_creates, *args.bursts) < 1:
        cli.error("counts must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    run_and_report(Report(parse_args(argv)), run_benchmark)


if __name__ == "__main__":
    main()

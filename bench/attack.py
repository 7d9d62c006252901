"""Attack benchmark: a hostile or careless local client against ctxd, and what it costs.

Each attack runs against a fresh ``python -m ctxd`` on a temporary Unix socket and data
directory (tests/daemon_process.py), in bounded loops, and reports:

* the daemon's peak RSS during the attack (VmHWM from /proc, reset after the set-up with
  ``/proc/PID/clear_refs``), and for the appends its growth per request byte;
* ``daemon.ping`` p50/p99/max measured by a separate client (its own connection, one ping
  every 5 ms) while the attack runs, and how many of its pings failed;
* whether the daemon survived, and what the attack itself saw.

The first row is a baseline: the same daemon with no attack, in the same run. With
``--against PATH`` every attack also runs against the ctxd of another checkout (e.g. a
``git worktree`` of main), so before and after come from one run on one machine.

Attacks (docs/security.md, "Resource limits"):

* ``fds``: the daemon under an open-files limit of 256 (soft and hard), 600 connections.
* ``render``: a 15 MiB session; two connections each pipeline 64 ``ctxd.render`` and read
  nothing for 8 s.
* ``partial``: 100 connections each hold a 15 MiB line without its newline for 3 s.
* ``append-1``, ``append-4``, ``append-16``: one append of a message of 1, 4, 16 MiB
  without a space (one word, the tokenizer's costliest input); ``append-16x4``: four
  16 MiB appends at once, on four connections.
* ``measure``: ``budget.measure`` with 240 skill prompts of 64 KiB of prose;
  ``measure-cjk``: 80 of 64 KiB of CJK text.
* ``braces``: 300 connections each send ``{`` and stop; then 5 newcomers ping.
* ``surrogates``: 16 connections, each appending for 5 s, one after the other, a message
  of 3,000 lone surrogate escapes (about 64 KiB of JSON, what JavaScript writes for emoji
  cut in half) to a session of its own: each is read with U+FFFD (docs/protocol.md,
  "Framing"), so the decode's fallback runs on every line.
* ``compact-storm``: a session of 2,000 messages; 8 connections keep 16
  ``context.compact`` each in flight on it for 6 s while another appends to it one message
  at a time: the appends' p50/p99/max, and how many compactions were answered (how many of
  them shared another's run).
* ``search-storm``: 20 slow ``result.read`` pattern searches of one session (about 0.1 s
  a line of 300 ``a``, four of them), one a connection, then a ``ctxd.render`` of that
  session: how long the render took.
* ``import-array``: ``transcript.import`` of a JSON array of 247 MB of tiny records (under
  the 256 MB an export may have); ``import-record``: a JSONL transcript whose one record
  is 160 MiB; ``import-tail``: three re-imports of a transcript whose unterminated last
  line is 200 MiB (imported once before the measure); ``import-bad``: a line holding a
  lone surrogate, one nested 100,000 deep, then 500 good records (docs/protocol.md,
  "transcript.import"). ``--import-scale`` shrinks the files for a quick run.

Run: ``python bench/attack.py [--against ../main] [--only render partial]`` (a few
minutes; more against a daemon without the limits).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import random
import resource
import selectors
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The daemon starter of the end-to-end tests, shared with them (tests/daemon_process.py).
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))
from _common import percentile
from daemon_process import REPO_ROOT, DaemonFailed, DaemonProcess

MIB = 1024 * 1024
PING_EVERY_S = 0.005
PING_TIMEOUT_S = 10.0
MAX_REQUEST_BYTES = 20 * MIB
"""The daemons get --max-request-bytes 20 MiB: a 16 MiB append is 16 MiB of text plus JSON."""
NOFILE = 256
BIG_BUDGET = {"context_window": 10_000_000, "max_output_tokens": 8192}
PING = b'{"jsonrpc":"2.0","id":0,"method":"daemon.ping"}\n'


# ---- measuring ------------------------------------------------------------------------

def peak_rss(pid: int) -> int:
    """VmHWM of ``pid`` in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return 0


def rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize()
    except FileNotFoundError:
        return 0


def reset_peak(pid: int) -> None:
    """Start VmHWM again from the current RSS (Linux: ``5`` to clear_refs)."""
    with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as clear_refs:
        clear_refs.write("5")


class Pinger:
    """Pings on a connection of its own, one at a time, every PING_EVERY_S."""

    def __init__(self, path: Path):
        self.path = path
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Pinger:
        # Connected (and answered) before the attack begins, as a client already there.
        self._conn = socket.socket(socket.AF_UNIX)
        self._conn.settimeout(PING_TIMEOUT_S)
        self._conn.connect(str(self.path))
        self._conn.sendall(PING)
        read_line(self._conn)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        conn: socket.socket | None = self._conn
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = socket.socket(socket.AF_UNIX)
                    conn.settimeout(PING_TIMEOUT_S)
                    conn.connect(str(self.path))
                started = time.perf_counter()
                conn.sendall(PING)
                if not read_line(conn).startswith(b'{"jsonrpc":"2.0","id":0,"result"'):
                    raise OSError("not a pong")
                self.latencies.append(time.perf_counter() - started)
            except OSError:
                self.failures += 1
                if conn is not None:
                    conn.close()
                conn = None
            self._stop.wait(PING_EVERY_S)
        if conn is not None:
            conn.close()


def read_line(conn: socket.socket) -> bytes:
    """One line (small answers only: reads a byte at a time past the first chunk)."""
    data = conn.recv(65536)
    while data and not data.endswith(b"\n"):
        more = conn.recv(65536)
        if not more:
            break
        data += more
    return data


# ---- clients --------------------------------------------------------------------------

def line(method: str, params: dict[str, Any] | None = None, request_id: int = 1) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def call(path: Path, method: str, params: dict[str, Any] | None = None,
         timeout: float = 300.0) -> Any:
    """One request on a fresh connection; the result (an error raises RuntimeError)."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(timeout)
        conn.connect(str(path))
        conn.sendall(line(method, params))
        buffer = bytearray()
        while not buffer.endswith(b"\n"):
            chunk = conn.recv(MIB)
            if not chunk:
                raise RuntimeError(f"{method}: connection closed")
            buffer += chunk
    reply = json.loads(buffer)
    if "error" in reply:
        raise RuntimeError(f"{method}: {reply['error']['message']}")
    return reply["result"]


def prose(size: int, seed: int) -> str:
    """About ``size`` bytes of English-like words, different for each seed."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("etaoinshrdlucmfwyp") for _ in range(rng.randint(2, 9)))
             for _ in range(2000)]
    out: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(words)
        out.append(word)
        length += len(word) + 1
    return " ".join(out)[:size]


def cjk(size: int, seed: int) -> str:
    """``size`` bytes of UTF-8 CJK ideographs (3 bytes each)."""
    rng = random.Random(seed)
    return "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(size // 3))


@contextlib.contextmanager
def connections(path: Path, count: int, timeout: float = 5.0) -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    try:
        for _ in range(count):
            conn = socket.socket(socket.AF_UNIX)
            conn.settimeout(timeout)
            try:
                conn.connect(str(path))
            except OSError:
                conn.close()
                break
            opened.append(conn)
        yield opened
    finally:
        for conn in opened:
            conn.close()


def first_lines(conns: list[socket.socket], within: float) -> dict[str, int]:
    """What each connection answered first, within ``within`` s: counts by kind."""
    counts = {"pong": 0, "refused": 0, "closed": 0, "silent": 0}
    selector = selectors.DefaultSelector()
    for conn in conns:
        conn.setblocking(False)
        selector.register(conn, selectors.EVENT_READ)
    deadline = time.monotonic() + within
    waiting = len(conns)
    while waiting and time.monotonic() < deadline:
        for key, _ in selector.select(max(0.0, deadline - time.monotonic())):
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            kind = ("pong" if b'"result"' in data else "refused" if b"-32007" in data
                    else "closed")
            counts[kind] += 1
            selector.unregister(sock)
            waiting -= 1
    counts["silent"] = waiting
    selector.close()
    for conn in conns:
        conn.setblocking(True)
    return counts


# ---- attacks --------------------------------------------------------------------------

@dataclass
class Target:
    """The daemon under attack."""

    daemon: DaemonProcess

    @property
    def socket(self) -> Path:
        return self.daemon.socket

    @property
    def pid(self) -> int:
        assert self.daemon.proc is not None
        return self.daemon.proc.pid


@dataclass
class Attack:
    name: str
    run: Callable[[Target], str]
    """Runs the attack (bounded); what it saw, in a few words."""
    setup: Callable[[Target], None] = lambda target: None
    nofile: int | None = None
    request_bytes: int = 0
    """For the appends: the bytes sent, to report RSS growth per request byte."""


def baseline(target: Target) -> str:
    time.sleep(2)
    return "no attack"


def exhaust_descriptors(target: Target) -> str:
    with connections(target.socket, 600, timeout=2.0) as conns:
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.sendall(PING)
        counts = first_lines(conns, within=5.0)
    served = newcomer_served(target)
    return (f"{len(conns)} connected: {counts['pong']} served, {counts['refused']} refused, "
            f"{counts['closed']} closed, {counts['silent']} waiting; after: "
            f"{'served' if served else 'NOT served'}")


def newcomer_served(target: Target) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            call(target.socket, "daemon.ping", timeout=2)
            return True
        except (OSError, RuntimeError):
            time.sleep(0.1)
    return False


def big_session(target: Target) -> None:
    call(target.socket, "session.open", {"session_id": "amp", "budget": BIG_BUDGET})
    for i in range(15):
        call(target.socket, "message.append", {"session_id": "amp", "messages": [
            {"role": "user", "content": prose(MIB, i)}]})


def render_amplification(target: Target) -> str:
    renders = b"".join(line("ctxd.render", {"session_id": "amp"}, i) for i in range(64))
    held = 0
    with connections(target.socket, 2) as conns:
        for conn in conns:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            conn.sendall(renders)
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, RuntimeError):
                held = max(held, call(target.socket, "daemon.status", timeout=5).get(
                    "bytes_inflight", -1))
            time.sleep(0.25)
    return f"2 x 64 renders unread; bytes_inflight max {held / MIB:.0f} MiB" if held >= 0 \
        else "2 x 64 renders unread"


def partial_lines(target: Target) -> str:
    body = b'{"jsonrpc":"2.0","id":1,"method":"daemon.ping","params":{"x":"' + \
        b"a" * (15 * MIB)
    with connections(target.socket, 100, timeout=30.0) as conns:
        refused = 0
        for conn in conns:
            try:
                conn.sendall(body)
            except OSError:
                refused += 1
        time.sleep(3)
        answered = first_lines(conns, within=1.0)
    return (f"{len(conns)} x 15 MiB unfinished lines: {answered['refused']} refused "
            f"(-32007), {refused} send failures")


def append_attack(size: int, parallel: int) -> Callable[[Target], str]:
    # One word as long as the message: the tokenizer's costliest input.
    texts = [chr(ord("a") + i) * size for i in range(parallel)]

    def run(target: Target) -> str:
        errors: list[str] = []
        started = time.perf_counter()

        def one(i: int) -> None:
            try:
                call(target.socket, "message.append", {"session_id": f"a{i}", "messages": [
                    {"role": "user", "content": texts[i]}]}, timeout=600)
            except (OSError, RuntimeError) as exc:
                errors.append(str(exc))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(parallel)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        took = time.perf_counter() - started
        return f"{parallel} x {size // MIB} MiB appended in {took:.1f} s" + (
            f"; errors: {errors[0]}" if errors else "")

    return run


def append_sessions(parallel: int) -> Callable[[Target], None]:
    def setup(target: Target) -> None:
        for i in range(parallel):
            call(target.socket, "session.open", {"session_id": f"a{i}", "budget": BIG_BUDGET})
    return setup


def measure_attack(count: int, make: Callable[[int, int], str]) -> Callable[[Target], str]:
    prompts = [make(64 * 1024, 1000 + i) for i in range(count)]

    def run(target: Target) -> str:
        started = time.perf_counter()
        result = call(target.socket, "budget.measure", {"session_id": "m",
                                                         "skill_prompts": prompts})
        return (f"{count} x 64 KiB measured ({result['skill_prompts']} tokens) in "
                f"{time.perf_counter() - started:.2f} s")

    return run


def measure_session(target: Target) -> None:
    call(target.socket, "session.open", {"session_id": "m", "budget": BIG_BUDGET})


def braces(target: Target) -> str:
    with connections(target.socket, 300) as conns:
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.sendall(b"{")
        time.sleep(1)
        served = sum(newcomer_served(target) for _ in range(5))
    return f"{len(conns)} connections sent '{{'; newcomers served: {served}/5"


SURROGATE_CONNECTIONS = 16
SURROGATE_S = 5.0
SURROGATE_TEXT = "half an emoji: \ud83d, " * 3000


def surrogate_sessions(target: Target) -> None:
    for i in range(SURROGATE_CONNECTIONS):
        call(target.socket, "session.open", {"session_id": f"s{i}", "budget": BIG_BUDGET})


def surrogates(target: Target) -> str:
    # ensure_ascii (json's default) writes each lone surrogate as its escape, as
    # JSON.stringify does; UTF-8 could not encode it.
    lines = [json.dumps({"jsonrpc": "2.0", "id": 1, "method": "message.append", "params": {
        "session_id": f"s{i}", "messages": [{"role": "user", "content": SURROGATE_TEXT}]}},
        separators=(",", ":")).encode() + b"\n" for i in range(SURROGATE_CONNECTIONS)]
    answers: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    deadline = time.monotonic() + SURROGATE_S

    def one(request: bytes) -> None:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(60)
            conn.connect(str(target.socket))
            while time.monotonic() < deadline:
                conn.sendall(request)
                reply = read_line(conn)
                kind = ("appended" if b'"result"' in reply else "-32700" if b"-32700" in reply
                        else "other")
                with lock:
                    answers[kind] += 1

    threads = [threading.Thread(target=one, args=(request,)) for request in lines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stored = call(target.socket, "message.list", {"session_id": "s0", "limit": 1})["messages"]
    kept = "U+FFFD stored" if stored and "\ufffd" in stored[0]["content"] else "nothing stored"
    return (f"{sum(answers.values())} appends of {len(lines[0]) // 1024} KiB with 3,000 lone "
            f"surrogates: {answers['appended']} appended, {answers['-32700']} parse errors, "
            f"{answers['other']} other; {kept}")


STORM_SESSION = "storm"
STORM_S = 6.0
STORM_CONNECTIONS = 8
STORM_INFLIGHT = 16
STORM_MESSAGES = 2_000
STORM_BUDGET = {"context_window": 400_000, "max_output_tokens": 8192}
"""The storm's thread (about 280,000 tokens) is between its compaction target (235,000) and
trigger: the storm's first compaction brings it under the target, the others find nothing
to do (one per append queued in between at least, or every one of them without sharing)."""
SEARCHES = 20
SLOW_LINE = "a" * 300
"""A line that ``(a+)+b`` backtracks over for about 0.1 s (cubic in its length)."""


def storm_session(target: Target) -> None:
    call(target.socket, "session.open", {"session_id": STORM_SESSION,
                                         "budget": STORM_BUDGET})
    for batch in range(STORM_MESSAGES // 100):
        call(target.socket, "message.append", {"session_id": STORM_SESSION, "messages": [
            {"role": "user" if i % 2 == 0 else "assistant", "content": prose(300, batch * 100 + i)}
            for i in range(100)]})


def pipelined(path: Path, requests: Callable[[int], bytes], inflight: int, until: float,
              answers: list[bytes]) -> None:
    """Keep ``inflight`` requests (the i-th is ``requests(i)``) in flight on one
    connection until ``until`` (time.monotonic), then read the last answers."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(300)
        conn.connect(str(path))
        sent = 0
        for _ in range(inflight):
            conn.sendall(requests(sent))
            sent += 1
        with conn.makefile("rb") as reader:
            while len(answers) < sent:
                answer = reader.readline()
                if not answer:
                    raise RuntimeError("connection closed")
                answers.append(answer)
                if time.monotonic() < until:
                    conn.sendall(requests(sent))
                    sent += 1


def compact_storm(target: Target) -> str:
    until = time.monotonic() + STORM_S
    compact = line("context.compact", {"session_id": STORM_SESSION})
    answers: list[list[bytes]] = [[] for _ in range(STORM_CONNECTIONS)]
    storm = [threading.Thread(target=pipelined, args=(
        target.socket, lambda i: compact, STORM_INFLIGHT, until, mine))
        for mine in answers]
    for thread in storm:
        thread.start()
    latencies: list[float] = []
    errors = 0
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(300)
        conn.connect(str(target.socket))
        step = 0
        while time.monotonic() < until:
            step += 1
            started = time.perf_counter()
            conn.sendall(line("message.append", {"session_id": STORM_SESSION, "messages": [
                {"role": "user", "content": f"step {step}: go on"}]}))
            if b'"result"' not in read_line(conn):
                errors += 1
            latencies.append(time.perf_counter() - started)
            time.sleep(0.01)
    for thread in storm:
        thread.join()
    replies = [json.loads(answer) for mine in answers for answer in mine]
    failed = sum("error" in reply for reply in replies)
    shared = sum(reply.get("result", {}).get("coalesced") is True for reply in replies)
    return (f"append p50 {percentile(latencies, 0.5) * 1000:.1f} p99 "
            f"{percentile(latencies, 0.99) * 1000:.1f} max {max(latencies) * 1000:.1f} ms "
            f"({len(latencies)} appends, {errors} failed); {len(replies)} compactions "
            f"answered, {shared} shared a run, {failed} failed")


def search_session(target: Target) -> None:
    call(target.socket, "session.open", {"session_id": STORM_SESSION})
    text = "\n".join([SLOW_LINE] * 4 + [prose(200, i) for i in range(20)])
    appended = call(target.socket, "message.append", {"session_id": STORM_SESSION, "messages": [
        {"role": "tool", "content": text, "name": "bash", "tool_call_id": "call_1"}]})
    ref_id = appended["appended"][0]["ref_id"]
    started = time.perf_counter()
    call(target.socket, "result.read", {"session_id": STORM_SESSION, "ref_id": ref_id,
                                        "pattern": "(a+)+b"})
    SEARCH_TAKES[target.socket] = (ref_id, time.perf_counter() - started)


SEARCH_TAKES: dict[Path, tuple[str, float]] = {}
"""Per daemon: the slow blob's ref_id and how long one search of it took alone."""


def search_storm(target: Target) -> str:
    ref_id, alone = SEARCH_TAKES[target.socket]
    search = line("result.read", {"session_id": STORM_SESSION, "ref_id": ref_id,
                                  "pattern": "(a+)+b"})
    # One connection each: a connection starts only a few requests before it is read from.
    with connections(target.socket, SEARCHES, timeout=300) as conns:
        for conn in conns:
            conn.sendall(search)
        started = time.perf_counter()
        call(target.socket, "ctxd.render", {"session_id": STORM_SESSION})
        render = time.perf_counter() - started
        answered = sum(b'"result"' in read_line(conn) for conn in conns)
        searched = time.perf_counter() - started
    return (f"render {render * 1000:.0f} ms behind {len(conns)} searches of {alone:.2f} s "
            f"each; they ended in {searched:.1f} s ({answered} answered)")


# The import attacks' files, written once per run into the daemon's folder; their sizes
# are scaled by --import-scale (1: the sizes named in this module's docstring).
IMPORT_ARRAY_BYTES = 247 * 1000 * 1000
IMPORT_RECORD_BYTES = 160 * MIB
IMPORT_TAIL_BYTES = 200 * MIB
IMPORT_SESSION = "imp"
import_scale = 1.0


def import_file(target: Target, name: str) -> Path:
    return target.daemon.root / name


def transcript_import(target: Target, path: Path) -> tuple[float, dict[str, Any] | str]:
    """One import into IMPORT_SESSION: its time and result (or the error's message)."""
    started = time.perf_counter()
    try:
        result: dict[str, Any] | str = call(target.socket, "transcript.import", {
            "format": "claude-code", "path": str(path), "session_id": IMPORT_SESSION},
            timeout=1800)
    except (OSError, RuntimeError) as exc:
        result = f"error: {exc}"
    return time.perf_counter() - started, result


def imported(result: dict[str, Any] | str) -> str:
    if isinstance(result, str):
        return result
    return (f"{result['messages_added']} messages, {len(result['malformed'])} malformed, "
            f"{sum(result['unknown_kept'].values())} kept, {result['lines_read']} read")


def write_array(target: Target) -> None:
    """Tiny records (a type the parser keeps by name), a user message every 10,000."""
    size = int(IMPORT_ARRAY_BYTES * import_scale)
    with import_file(target, "array.json").open("w", encoding="utf-8") as file:
        file.write("[")
        written, number = 1, 0
        while written < size:
            record = (f'{{"type":"user","uuid":"u{number}","message":{{"role":"user",'
                      f'"content":"request {number}"}}}}' if number % 10_000 == 0
                      else f'{{"type":"progress","n":{number}}}')
            text = ("," if number else "") + record
            file.write(text)
            written += len(text)
            number += 1
        file.write("]")


def write_record(target: Target) -> None:
    """One user record whose content is words, as long as IMPORT_RECORD_BYTES."""
    size = int(IMPORT_RECORD_BYTES * import_scale)
    with import_file(target, "record.jsonl").open("w", encoding="utf-8") as file:
        file.write('{"type":"user","uuid":"u1","message":{"role":"user","content":"')
        words = prose(MIB, 7)
        for _ in range(size // MIB):
            file.write(words)
        file.write('"}}\n{"type":"user","uuid":"u2","message":{"role":"user",'
                   '"content":"after"}}\n')


def write_tail(target: Target) -> None:
    """Good lines, then IMPORT_TAIL_BYTES of one line with no newline; imported once."""
    size = int(IMPORT_TAIL_BYTES * import_scale)
    path = import_file(target, "tail.jsonl")
    with path.open("w", encoding="utf-8") as file:
        for number in range(10):
            file.write(f'{{"type":"user","uuid":"u{number}","message":{{"role":"user",'
                       f'"content":"request {number}"}}}}\n')
        file.write('{"type":"user","uuid":"tail","message":{"role":"user","content":"')
        chunk = "x" * MIB
        for _ in range(size // MIB):
            file.write(chunk)
    transcript_import(target, path)


def write_bad(target: Target) -> None:
    good = "".join(f'{{"type":"user","uuid":"u{n}","message":{{"role":"user",'
                   f'"content":"request {n}"}}}}\n' for n in range(500))
    import_file(target, "bad.jsonl").write_text(
        '{"type":"user","uuid":"half","message":{"role":"user","content":"cut \\ud83d"}}\n'
        '{"type":"user","message":' + "[" * 100_000 + "]" * 100_000 + "}\n" + good)


def import_once(name: str) -> Callable[[Target], str]:
    def run(target: Target) -> str:
        took, result = transcript_import(target, import_file(target, name))
        return f"{imported(result)} in {took:.1f} s"
    return run


def import_tail(target: Target) -> str:
    path = import_file(target, "tail.jsonl")
    times = []
    for _ in range(3):
        took, result = transcript_import(target, path)
        if isinstance(result, str):
            return result
        times.append(took)
    return "3 re-imports: " + ", ".join(f"{took:.2f}" for took in times) + " s"


def import_bad(target: Target) -> str:
    outcomes = []
    for _ in range(3):  # what a client retrying sees
        _, result = transcript_import(target, import_file(target, "bad.jsonl"))
        outcomes.append(imported(result))
    return "; ".join(outcomes)


ATTACKS = [
    Attack("baseline", baseline),
    Attack("fds", exhaust_descriptors, nofile=NOFILE),
    Attack("render", render_amplification, setup=big_session),
    Attack("partial", partial_lines),
    Attack("append-1", append_attack(MIB, 1), append_sessions(1), request_bytes=MIB),
    Attack("append-4", append_attack(4 * MIB, 1), append_sessions(1), request_bytes=4 * MIB),
    Attack("append-16", append_attack(16 * MIB, 1), append_sessions(1),
           request_bytes=16 * MIB),
    Attack("append-16x4", append_attack(16 * MIB, 4), append_sessions(4),
           request_bytes=64 * MIB),
    Attack("measure", measure_attack(240, prose), measure_session),
    Attack("measure-cjk", measure_attack(80, cjk), measure_session),
    Attack("braces", braces),
    Attack("surrogates", surrogates, surrogate_sessions),
    Attack("compact-storm", compact_storm, storm_session),
    Attack("search-storm", search_storm, search_session),
    Attack("import-array", import_once("array.json"), write_array),
    Attack("import-record", import_once("record.jsonl"), write_record),
    Attack("import-tail", import_tail, write_tail),
    Attack("import-bad", import_bad, write_bad),
]


# ---- running --------------------------------------------------------------------------

@dataclass
class Outcome:
    peak_rss: int
    rss_before: int
    pings: list[float] = field(default_factory=list)
    ping_failures: int = 0
    survived: bool = True
    saw: str = ""


def run_attack(attack: Attack, checkout: Path, root: Path) -> Outcome:
    def low_nofile() -> None:
        assert attack.nofile is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (attack.nofile, attack.nofile))

    daemon = DaemonProcess(root / attack.name, name="ctxd", code=checkout,
                           extra_args=["--max-request-bytes", str(MAX_REQUEST_BYTES)])
    (root / attack.name).mkdir(parents=True)
    daemon.start(before_exec=low_nofile if attack.nofile is not None else None)
    target = Target(daemon)
    try:
        attack.setup(target)
        reset_peak(target.pid)
        before = rss(target.pid)
        with Pinger(target.socket) as pinger:
            try:
                saw = attack.run(target)
            except (OSError, RuntimeError) as exc:
                saw = f"attack failed: {exc}"
        assert daemon.proc is not None
        return Outcome(peak_rss=peak_rss(target.pid), rss_before=before,
                       pings=pinger.latencies, ping_failures=pinger.failures,
                       survived=daemon.proc.poll() is None, saw=saw)
    finally:
        with contextlib.suppress(DaemonFailed):
            daemon.stop()


def report_row(name: str, attack: Attack, outcome: Outcome, baseline_rss: int) -> str:
    pings = outcome.pings
    growth = ""
    if attack.request_bytes:
        growth = (f" ({(outcome.peak_rss - outcome.rss_before) / attack.request_bytes:.1f}"
                  " x request)")
    ratio = f"{outcome.peak_rss / baseline_rss:.1f}x" if baseline_rss else "-"
    return (f"{name:<8} {attack.name:<12} {outcome.peak_rss / MIB:>7.0f} MiB {ratio:>6}"
            f"{growth}  ping p50 {percentile(pings, 0.5) * 1000:6.1f} "
            f"p99 {percentile(pings, 0.99) * 1000:7.1f} max {max(pings, default=0) * 1000:7.1f}"
            f" ms ({len(pings)} ok, {outcome.ping_failures} failed)"
            f"  {'alive' if outcome.survived else 'DIED'}; {outcome.saw}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    parser.add_argument("--against", type=Path, default=None, metavar="PATH",
                        help="another checkout whose ctxd gets the same attacks")
    parser.add_argument("--only", nargs="+", default=None,
                        choices=[attack.name for attack in ATTACKS],
                        help="run only these attacks (the baseline always runs)")
    parser.add_argument("--import-scale", type=float, default=1.0, metavar="FACTOR",
                        help="the import attacks' file sizes times FACTOR (default 1)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    global import_scale
    args = parse_args(argv)
    import_scale = args.import_scale
    attacks = [attack for attack in ATTACKS if attack.name == "baseline" or
               args.only is None or attack.name in args.only]
    targets = [("this", REPO_ROOT)]
    if args.against is not None:
        targets.append(("against", args.against.resolve()))
    for name, checkout in targets:
        print(f"{name}: ctxd from {checkout}")
    root = Path(tempfile.mkdtemp(prefix="ctxd-a"))
    try:
        baselines: dict[str, int] = {}
        for attack in attacks:
            for name, checkout in targets:
                outcome = run_attack(attack, checkout, root / name)
                if attack.name == "baseline":
                    baselines[name] = outcome.peak_rss
                print(report_row(name, attack, outcome, baselines.get(name, 0)), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

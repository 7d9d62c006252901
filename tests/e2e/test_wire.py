"""Wire-level robustness: framing, lines the daemon cannot parse, half-closed and
pipelined connections, limits, fuzzing.

Every test talks to a real ``python -m ctxd`` over its Unix socket. Raw sockets are used
wherever the test is about bytes; ctxclient only where the bytes do not matter. Replies
are read with socket timeouts (bounded waits), never with sleeps. The answers of the
dispatcher itself (each JSON-RPC error, batches, notifications, ids) are tested in-process
against the route table: tests/unit/test_routes.py.
"""

from __future__ import annotations

import itertools
import json
import shutil
import socket
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonProcess, short_root
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jsonrpc import (
    NOT_FOUND_FIX,
    assert_parse_error,
    assert_pong,
    encode,
    error,
    invalid_params,
    notification,
    request,
    same_id,
)

from ctxclient import Client, RpcError
from ctxd.errors import ErrorCode

READ_TIMEOUT_S = 10.0
"""How long a test waits for any one line from the daemon before it fails."""

SMALL_LIMIT = 4096
"""``--max-request-bytes`` of the daemons that test oversized lines."""

CORE_METHODS = frozenset({
    "daemon.ping", "daemon.hello", "daemon.status", "daemon.shutdown",
    "session.open", "session.get", "session.close", "session.delete", "session.list",
    "message.append", "message.list", "ctxd.render", "budget.measure",
    "events.subscribe", "events.unsubscribe",
})
"""Methods the fuzzer's requests name (besides unknown ones)."""

OVERLOAD_FIX = "retry after a moment with fewer requests"


# ---- helpers ------------------------------------------------------------------------

def too_large(limit: int) -> dict[str, Any]:
    return error(None, ErrorCode.INVALID_REQUEST,
                 f"invalid request: line longer than max_request_bytes ({limit}); "
                 "it was discarded",
                 {"max_request_bytes": limit,
                  "fix": "send smaller requests (split a large append into batches)"})


def overloaded(request_id: Any, why: str, limit: str, maximum: int) -> dict[str, Any]:
    return error(request_id, ErrorCode.OVERLOADED, f"overloaded: {why}; retry later",
                 {"limit": limit, "max": maximum, "fix": OVERLOAD_FIX})


def is_event(message: Any) -> bool:
    return isinstance(message, dict) and message.get("method") == "event" and "id" not in message


def check_response(item: Any) -> None:
    """A well-formed JSON-RPC 2.0 response whose error (if any) is a ctxd error code."""
    assert isinstance(item, dict), item
    assert item.get("jsonrpc") == "2.0", item
    assert set(item) in ({"jsonrpc", "id", "result"}, {"jsonrpc", "id", "error"}), item
    assert item["id"] is None or type(item["id"]) in (int, str), item
    if "error" in item:
        body = item["error"]
        assert set(body) <= {"code", "message", "data"}, item
        assert body["code"] in {int(code) for code in ErrorCode}, item
        assert body["code"] != ErrorCode.INTERNAL_ERROR, item
        assert isinstance(body["message"], str), item
        assert body["message"], item


def check_message(message: Any) -> None:
    """Anything the daemon may send: a response, a batch of them, or an event."""
    if is_event(message):
        return
    if isinstance(message, list):
        assert message, "an empty batch reply is never sent"
        for item in message:
            check_response(item)
    else:
        check_response(message)


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``predicate`` (short naps, bounded) until it holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.01)


def log_tail(daemon: DaemonProcess) -> str:
    return daemon.log()[-4000:]


def exit_code(daemon: DaemonProcess, within: float) -> int | None:
    """The daemon's exit code if it exits within ``within`` seconds, else None."""
    assert daemon.proc is not None
    try:
        return daemon.proc.wait(within)
    except subprocess.TimeoutExpired:
        return None


def answers_ping(daemon: DaemonProcess) -> bool:
    try:
        with Wire(daemon.socket, timeout=2.0) as wire:
            wire.ping()
    except (OSError, AssertionError):
        return False
    return True


@contextmanager
def crash_reported(daemon: DaemonProcess) -> Iterator[None]:
    """A failure because the daemon died says so, with the daemon's log."""
    try:
        yield
    except Exception as exc:
        # A ping first: waiting for an exit that does not come would slow down shrinking.
        if not answers_ping(daemon) and (code := exit_code(daemon, within=5.0)) is not None:
            raise AssertionError(f"ctxd died (exit code {code}):\n{log_tail(daemon)}") from exc
        raise


def assert_alive(daemon: DaemonProcess) -> None:
    assert daemon.proc is not None
    code = daemon.proc.poll()
    assert code is None, f"ctxd exited with {code}:\n{log_tail(daemon)}"


class Wire:
    """One raw connection: bytes out, one decoded JSON value per line in."""

    def __init__(self, path: Path, timeout: float = READ_TIMEOUT_S) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(str(path))
        except OSError:
            self.sock.close()
            raise
        self.sock.settimeout(timeout)
        self._buffer = bytearray()
        self._pings = itertools.count(1)

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_json(self, *messages: Any) -> None:
        """Send messages as lines, all in one write."""
        self.send(b"".join(encode(message) + b"\n" for message in messages))

    def read_line(self) -> bytes | None:
        """The next line without its newline; None at end of stream."""
        while (newline := self._buffer.find(b"\n")) < 0:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                assert not self._buffer, f"the stream ended mid-line: {bytes(self._buffer)!r}"
                return None
            self._buffer += chunk
        line = bytes(self._buffer[:newline])
        del self._buffer[:newline + 1]
        return line

    def read(self) -> Any:
        line = self.read_line()
        assert line is not None, "the daemon closed the connection instead of answering"
        return json.loads(line)

    def read_until_eof(self) -> list[Any]:
        messages = []
        while (line := self.read_line()) is not None:
            messages.append(json.loads(line))
        return messages

    def finish(self) -> list[Any]:
        """Half-close; the daemon answers everything sent so far, then hangs up."""
        self.sock.shutdown(socket.SHUT_WR)
        return self.read_until_eof()

    def call(self, message: dict[str, Any]) -> Any:
        """Send one request on an otherwise idle connection and return the reply line."""
        self.send_json(message)
        return self.read()

    def exchange(self, payload: bytes, others: int = 0) -> list[Any]:
        """Send ``payload`` then a ping in one write; return what came besides the pong.

        Reading stops once the pong and at least ``others`` other lines have arrived.
        """
        ping_id = f"ping-{next(self._pings)}"
        self.send(payload + encode(request("daemon.ping", None, ping_id)) + b"\n")
        pong = None
        received = []
        while pong is None or len(received) < others:
            message = self.read()
            if isinstance(message, dict) and same_id(message.get("id"), ping_id):
                assert pong is None, f"two answers to {ping_id}"
                pong = message
            else:
                received.append(message)
        assert_pong(pong, ping_id)
        return received

    def ping(self) -> list[Any]:
        return self.exchange(b"")


def status(wire: Wire) -> dict[str, Any]:
    reply = wire.call(request("daemon.status", None, "status"))
    assert "result" in reply, reply
    result: dict[str, Any] = reply["result"]
    return result


def wait_for_connections(wire: Wire, count: int) -> None:
    """Wait until the daemon counts ``count`` connections (closed ones are cleaned up)."""
    wait_until(lambda: status(wire)["connections"] == count)


@contextmanager
def running_daemon(*extra_args: str) -> Iterator[DaemonProcess]:
    root = short_root()
    process = DaemonProcess(root, extra_args=list(extra_args)).start()
    try:
        yield process
    finally:
        process.stop()
        shutil.rmtree(root, ignore_errors=True)


def new_session(daemon: DaemonProcess) -> str:
    session_id = "w_" + uuid.uuid4().hex[:12]
    with daemon.client(timeout=READ_TIMEOUT_S) as client:
        client.call("session.open", {"session_id": session_id})
    return session_id


def message_count(daemon: DaemonProcess, session_id: str) -> int:
    with daemon.client(timeout=READ_TIMEOUT_S) as client:
        count: int = client.call("session.get", {"session_id": session_id})["session"][
            "message_count"]
    return count


@pytest.fixture(scope="module")
def wire_daemon() -> Iterator[DaemonProcess]:
    """One daemon for the tests that do not kill it: small lines, deep pipelines."""
    with running_daemon("--max-request-bytes", str(SMALL_LIMIT),
                        "--max-inflight-per-connection", "1024") as process:
        yield process


@pytest.fixture
def wire(wire_daemon: DaemonProcess) -> Iterator[Wire]:
    with Wire(wire_daemon.socket) as connection:
        yield connection


# ---- -32700: lines that are not UTF-8 JSON, or nest too deeply ----------------------

INVALID_UTF8_LINES = {
    "utf16-bom": b'\xff\xfe{"a":1}',
    "in-method": b'{"jsonrpc":"2.0","id":3,"method":"daemon.pin\xff"}',
    "in-id": b'{"jsonrpc":"2.0","id":"\xff","method":"daemon.ping"}',
    "in-jsonrpc": b'{"jsonrpc":"2.0\xff","id":3,"method":"daemon.ping"}',
    "overlong-in-method": b'{"jsonrpc":"2.0","id":3,"method":"daemon.ping\xc0\xaf"}',
    "in-params": b'{"jsonrpc":"2.0","id":3,"method":"daemon.hello","params":{"client":"\xff"}}',
    "surrogate-in-content": b'{"jsonrpc":"2.0","id":3,"method":"message.append","params":'
                            b'{"session_id":"s","messages":[{"role":"user","content":"\xed\xa0\x80"}]}}',
    "in-meta": b'{"jsonrpc":"2.0","id":3,"method":"message.append","params":{"session_id":"s",'
               b'"messages":[{"role":"user","content":"x","meta":{"k":"\xfe"}}]}}',
    "in-ignored-field": b'{"jsonrpc":"2.0","id":3,"method":"daemon.ping","x":"\xff"}',
    "in-params-of-unknown-method": b'{"jsonrpc":"2.0","id":3,"method":"nope","params":"\xff"}',
    "in-top-level-string": b'"\xff"',
    "in-batch-item": b'[{"jsonrpc":"2.0","id":3,"method":"daemon.pin\x80"}]',
}


DEEP = 100_000
DEEPLY_NESTED_LINES = {
    "batch": b"[" * DEEP + b"]" * DEEP,
    "params": b'{"jsonrpc":"2.0","id":4,"method":"daemon.ping","params":'
              + b"[" * DEEP + b"]" * DEEP + b"}",
    "ignored-field": b'{"jsonrpc":"2.0","id":4,"method":"daemon.ping","x":'
                     + b"[" * DEEP + b"]" * DEEP + b"}",
    "meta-1000": b'{"jsonrpc":"2.0","id":4,"method":"message.append","params":{"session_id":"s",'
                 b'"messages":[{"role":"user","content":"x","meta":{"k":'
                 + b"[" * 1000 + b"]" * 1000 + b"}}]}}",
}


UNPARSABLE_LINES = {**{f"utf8-{name}": line for name, line in INVALID_UTF8_LINES.items()},
                    **{f"deep-{name}": line for name, line in DEEPLY_NESTED_LINES.items()}}


@pytest.fixture(scope="module")
def parse_daemon() -> Iterator[DaemonProcess]:
    """One daemon with the default limits for the unparsable lines: each case checks it is
    still alive after its line, so a line that takes it down fails its own case, with the
    daemon's log."""
    with running_daemon() as process:
        yield process


@pytest.mark.parametrize("line", UNPARSABLE_LINES.values(), ids=UNPARSABLE_LINES.keys())
def test_unparsable_lines_are_parse_errors(parse_daemon: DaemonProcess, line: bytes) -> None:
    """-32700, never a crash: invalid UTF-8 anywhere in the line (not JSON text, RFC 8259
    §8.1) and nesting deeper than the decoder follows. These once took the daemon down."""
    with crash_reported(parse_daemon), Wire(parse_daemon.socket) as wire:
        wire.send(line + b"\n")
        assert_parse_error(wire.read())
        assert wire.ping() == []
        assert wire.finish() == []
    assert_alive(parse_daemon)


# ---- notifications ------------------------------------------------------------------

def test_notifications_and_blank_lines_get_no_response(wire_daemon: DaemonProcess,
                                                      wire: Wire) -> None:
    """Nothing is written back for notifications (answered on the reader or in a task of
    their own) or blank lines sent in one write; which requests are notifications:
    tests/unit/test_routes.py."""
    session_id = new_session(wire_daemon)
    wire.send_json(
        notification("daemon.ping"),
        notification("nope"),
        notification("message.append", {"session_id": session_id,
                                        "messages": [{"role": "user", "content": "hi"}]}),
    )
    wire.send(b"\n   \n\r\n")  # blank lines are not requests either
    assert wire.ping() == []
    # Half-closed, the daemon answers everything it was sent before hanging up: nothing more.
    assert wire.finish() == []
    assert message_count(wire_daemon, session_id) == 1  # the notification did run


# ---- end of stream ------------------------------------------------------------------

HALF_CLOSE_ROUNDS = 20
"""Fresh connections per case: the answer must never be lost, not just usually arrive."""


@pytest.mark.parametrize(("line", "expected"), [
    (encode(request("session.get", {"session_id": "w_missing"}, 1)),
     [error(1, ErrorCode.NOT_FOUND, "unknown session 'w_missing'",
            {"session_id": "w_missing", "fix": NOT_FOUND_FIX})]),
    (encode([request("session.get", {"session_id": "w_missing"}, 2)]),
     [[error(2, ErrorCode.NOT_FOUND, "unknown session 'w_missing'",
             {"session_id": "w_missing", "fix": NOT_FOUND_FIX})]]),
    (b"[]", [error(None, ErrorCode.INVALID_REQUEST, "invalid request: empty batch",
                   {"fix": "send at least one request in a batch"})]),
    (encode(request("message.append", {"session_id": "s", "messages": []}, 4)),
     [invalid_params(4, "$.messages", "Expected `array` of length >= 1")]),
], ids=["actor-request", "batch", "empty-batch", "invalid-params"])
def test_half_closed_connection_gets_its_answer(wire_daemon: DaemonProcess, line: bytes,
                                                expected: list[Any]) -> None:
    """``printf '...' | nc -U`` sends, shuts its side, reads: the answer must come first."""
    for _ in range(HALF_CLOSE_ROUNDS):
        with Wire(wire_daemon.socket) as wire:
            wire.send(line + b"\n")
            assert wire.finish() == expected


def test_half_closed_connection_gets_a_large_answer_in_full(daemon: DaemonProcess) -> None:
    """An answer bigger than the socket buffer is still sent whole before the hang-up."""
    session_id = new_session(daemon)
    content = "word " * 20_000
    with daemon.client(timeout=READ_TIMEOUT_S) as client:
        client.call("message.append", {"session_id": session_id,
                                       "messages": [{"role": "user", "content": content}] * 5})
    for _ in range(3):
        with Wire(daemon.socket) as wire:
            wire.send_json(request("message.list", {"session_id": session_id}, "big"))
            (reply,) = wire.finish()
        assert reply["id"] == "big"
        assert [m["content"] for m in reply["result"]["messages"]] == [content] * 5


# ---- batches ------------------------------------------------------------------------

def test_batch_with_ctxclient(wire_daemon: DaemonProcess) -> None:
    with wire_daemon.client(timeout=READ_TIMEOUT_S) as client:
        pong, unknown, missing = client.batch([
            ("daemon.ping", None), ("nope", None), ("session.get", {"session_id": "w_missing"})])
        assert pong.result(READ_TIMEOUT_S)["pong"] is True
        with pytest.raises(RpcError) as unknown_error:
            unknown.result(READ_TIMEOUT_S)
        assert unknown_error.value.code == ErrorCode.METHOD_NOT_FOUND
        with pytest.raises(RpcError) as missing_error:
            missing.result(READ_TIMEOUT_S)
        assert (missing_error.value.code, missing_error.value.data) == (
            ErrorCode.NOT_FOUND,
            {"session_id": "w_missing", "fix": NOT_FOUND_FIX})


# ---- oversized lines ----------------------------------------------------------------

def padded_ping(request_id: str, size: int) -> bytes:
    """A daemon.ping line of exactly ``size`` bytes (spaces are JSON whitespace)."""
    head = encode(request("daemon.ping", None, request_id))[:-1]
    assert len(head) + 1 <= size
    return head + b" " * (size - len(head) - 1) + b"}"


def test_oversized_line_is_rejected_and_the_connection_stays_usable(wire: Wire) -> None:
    wire.send(b"x" * 10_240 + b"\n")
    assert wire.read() == too_large(SMALL_LIMIT)
    assert wire.ping() == []
    assert wire.finish() == []


def test_line_of_exactly_the_limit_is_accepted(wire: Wire) -> None:
    wire.send(padded_ping("edge", SMALL_LIMIT) + b"\n")
    assert_pong(wire.read(), "edge")
    wire.send(padded_ping("over", SMALL_LIMIT + 1) + b"\n")
    assert wire.read() == too_large(SMALL_LIMIT)
    assert wire.ping() == []


@pytest.mark.parametrize("chunk", [1, 7, 100, SMALL_LIMIT - 1, SMALL_LIMIT + 1])
def test_oversized_line_in_small_chunks(wire_daemon: DaemonProcess, wire: Wire,
                                        chunk: int) -> None:
    session_id = new_session(wire_daemon)
    # A real request: had any of it been taken for a line, the append would have run.
    big = encode(request("message.append", {
        "session_id": session_id, "messages": [{"role": "user", "content": "a" * 10_000}]},
        "big"))
    stream = big + b"\n" + encode(request("daemon.ping", None, "after")) + b"\n"
    for start in range(0, len(stream), chunk):
        wire.send(stream[start:start + chunk])
    replies = [wire.read(), wire.read()]
    assert replies[0] == too_large(SMALL_LIMIT)
    assert_pong(replies[1], "after")
    assert wire.finish() == []
    assert message_count(wire_daemon, session_id) == 0


def test_oversized_line_followed_by_requests_in_the_same_write(wire: Wire) -> None:
    wire.send(b"y" * 10_240 + b"\n" + encode(request("daemon.ping", None, "p1")) + b"\n")
    replies = [wire.read(), wire.read()]
    assert replies[0] == too_large(SMALL_LIMIT)  # sent before the next line is even read
    assert_pong(replies[1], "p1")
    # Two oversized lines in a row, between two requests: two rejections, two answers.
    wire.send(encode(request("daemon.ping", None, "p2")) + b"\n" + b"[" * 5000 + b"\n"
              + b"z" * 9000 + b"\n" + encode(request("daemon.ping", None, "p3")) + b"\n")
    replies = [wire.read() for _ in range(4)]
    rejections = [reply for reply in replies if reply["id"] is None]
    assert rejections == [too_large(SMALL_LIMIT)] * 2
    pongs = {reply["id"]: reply for reply in replies if reply["id"] is not None}
    assert set(pongs) == {"p2", "p3"}
    for request_id, reply in pongs.items():
        assert_pong(reply, request_id)
    assert wire.finish() == []


# ---- pipelining ---------------------------------------------------------------------

PIPELINE_ROUNDS = 4
"""Each round is one write of 200 requests; several rounds, because a scheduler that
happens to start the tasks of one read in order could hide an ordering bug once."""


def test_pipelined_requests_are_each_answered_once(wire_daemon: DaemonProcess,
                                                   wire: Wire) -> None:
    for _ in range(PIPELINE_ROUNDS):
        sessions = [new_session(wire_daemon) for _ in range(3)]
        messages = []
        order: dict[str, list[int]] = {session_id: [] for session_id in sessions}
        for i in range(200):
            if i % 3 == 0:
                messages.append(request("daemon.ping", None, i))
            else:
                session_id = sessions[i % len(sessions)]
                order[session_id].append(i)
                messages.append(request("message.append", {
                    "session_id": session_id,
                    "messages": [{"role": "user", "content": f"message {i}"}]}, i))
        wire.send_json(*messages)
        replies = [wire.read() for _ in range(200)]
        assert sorted(reply["id"] for reply in replies) == list(range(200))
        by_id = {reply["id"]: reply for reply in replies}
        for i in range(0, 200, 3):
            assert_pong(by_id[i], i)
        for session_id, sent in order.items():
            seqs = [by_id[i]["result"]["appended"][0]["seq"] for i in sent]
            assert seqs == list(range(1, len(sent) + 1)), (
                f"appends to {session_id} were stored out of send order: {seqs}")
    assert wire.finish() == []


# ---- limits -------------------------------------------------------------------------

def subscribe(wire: Wire) -> None:
    """Make ``wire`` a subscriber (a connection that is never dropped for being idle)."""
    reply = wire.call(request("events.subscribe", {"session_id": "nobody"}, "sub"))
    assert "result" in reply, reply


def test_connections_over_the_limit_are_refused(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root, extra_args=["--max-connections", "3"]).start()
    try:
        with Wire(process.socket) as first:
            wait_for_connections(first, 1)  # the start-up probe's connection is gone
            subscribe(first)
            with Wire(process.socket) as second, Wire(process.socket) as third:
                subscribe(second)
                subscribe(third)
                # None of the three is idle: the fourth is refused.
                with Wire(process.socket) as fourth:
                    assert fourth.read_until_eof() == [overloaded(
                        None, "too many connections", "max_connections", 3)]
                for wire in (first, second, third):
                    assert wire.ping() == []

            def a_new_connection_is_served() -> bool:
                # The slot of a closed connection is freed once the daemon notices the EOF.
                with Wire(process.socket) as newcomer:
                    try:
                        newcomer.send_json(request("daemon.ping", None, "n"))
                    except OSError:
                        return False  # refused and already closed
                    try:
                        return "result" in newcomer.read()
                    except OSError:
                        return False

            wait_until(a_new_connection_is_served)
        assert_alive(process)
    finally:
        process.stop()


def test_the_oldest_idle_connection_makes_room(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root, extra_args=["--max-connections", "3"]).start()
    try:
        with Wire(process.socket) as subscriber:
            wait_for_connections(subscriber, 1)
            subscribe(subscriber)
            with Wire(process.socket) as older, Wire(process.socket) as newer:
                assert older.ping() == []
                assert newer.ping() == []
                # Idle with half a line: droppable as well, and half a line is no
                # activity: older stays the one idle for longest.
                older.send(b"{")
                with Wire(process.socket) as newcomer:
                    assert newcomer.ping() == []
                    assert older.read_until_eof() == []  # dropped: the oldest idle one
                    assert newer.ping() == []
                    assert subscriber.ping() == []
                    assert status(newcomer)["connections"] == 3
        assert_alive(process)
    finally:
        process.stop()


IDLE_CLIENTS = 8


def test_connections_that_send_half_a_line_do_not_lock_others_out(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root, extra_args=[
        "--max-connections", str(IDLE_CLIENTS)]).start()
    try:
        stuck = [Wire(process.socket) for _ in range(IDLE_CLIENTS * 2)]
        try:
            for wire in stuck:
                wire.send(b"{")
            for _ in range(3):
                with Wire(process.socket) as newcomer:
                    assert newcomer.ping() == []
            with Wire(process.socket) as probe:
                assert status(probe)["connections"] <= IDLE_CLIENTS
        finally:
            for wire in stuck:
                wire.close()
        assert_alive(process)
    finally:
        process.stop()


def test_idle_and_partial_line_timeouts(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root, extra_args=[
        "--idle-timeout-s", "0.5", "--partial-line-timeout-s", "0.5"]).start()
    try:
        with Wire(process.socket) as idle, Wire(process.socket) as subscriber, \
                Wire(process.socket) as partial:
            subscribe(subscriber)
            assert idle.ping() == []
            partial.send(b'{"jsonrpc":"2.0","id":1,')
            assert idle.read_until_eof() == []  # closed after 0.5 s of silence
            assert partial.read_until_eof() == []  # its line took too long
            # The subscriber stayed longer than the idle timeout and is still served.
            assert subscriber.ping() == []
            assert status(subscriber)["connections"] == 1
        assert_alive(process)
    finally:
        process.stop()


def test_inflight_limit_per_connection(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root,
                            extra_args=["--max-inflight-per-connection", "2"]).start()
    try:
        session_id = new_session(process)
        batch = [{"role": "user", "content": "word " * 50}] * 200
        count = 20
        with Wire(process.socket) as wire:
            # One write: the reader takes the lines faster than the appends complete.
            wire.send_json(*[request("message.append", {"session_id": session_id,
                                                         "messages": batch}, i)
                             for i in range(count)])
            replies = [wire.read() for _ in range(count)]
            assert wire.finish() == []
        assert sorted(reply["id"] for reply in replies) == list(range(count))
        refused = [reply for reply in replies if "error" in reply]
        appended = [reply for reply in replies if "result" in reply]
        assert refused, "no request was refused although 20 were sent at once with a limit of 2"
        for reply in refused:
            assert reply == overloaded(reply["id"], "too many requests in flight on this "
                                       "connection", "max_inflight_per_connection", 2)
        assert len(appended) >= 2
        # A refused append wrote nothing.
        assert message_count(process, session_id) == 200 * len(appended)
        assert_alive(process)
    finally:
        process.stop()


BUDGET = 4 * 1024 * 1024
"""``--max-inflight-bytes`` of the daemon that tests the daemon-wide byte budget."""
HELD_LINE = 1_000_000


def held_line(request_id: str) -> bytes:
    """A daemon.ping of HELD_LINE bytes, without its closing brace and newline."""
    return padded_ping(request_id, HELD_LINE + 1)[:-1]


def test_partial_lines_count_against_the_byte_budget(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root, extra_args=[
        "--max-inflight-bytes", str(BUDGET)]).start()
    try:
        holders = [Wire(process.socket) for _ in range(4)]
        try:
            with Wire(process.socket) as probe:
                for i, holder in enumerate(holders):
                    holder.send(held_line(f"h{i}"))
                wait_until(lambda: status(probe)["bytes_inflight"] == 4 * HELD_LINE)
                # One more large line does not fit: refused, discarded up to its newline.
                with Wire(process.socket) as late:
                    late.send(held_line("late"))
                    assert late.read() == overloaded(
                        None, "too many bytes in flight; the line was discarded",
                        "max_inflight_bytes", BUDGET)
                    late.send(b"}\n")
                    assert late.ping() == []
                assert probe.ping() == []
                wait_until(lambda: status(probe)["bytes_inflight"] == 4 * HELD_LINE)
                # A holder finishes its line: it is answered, its bytes are free again.
                holders[0].send(b"}\n")
                assert_pong(holders[0].read(), "h0")
                # (its pong leaves the count once the daemon sees it sent)
                wait_until(lambda: status(probe)["bytes_inflight"] == 3 * HELD_LINE)
                with Wire(process.socket) as again:
                    again.send(held_line("again") + b"}\n")
                    assert_pong(again.read(), "again")
        finally:
            for holder in holders:
                holder.close()
        with Wire(process.socket) as probe:
            wait_until(lambda: status(probe)["bytes_inflight"] == 0)
        assert_alive(process)
    finally:
        process.stop()


PIPELINED_RENDERS = 32


def test_pipelined_renders_without_reading_hold_few_answers(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        client.call("session.open", {"session_id": "amp", "budget": {
            "context_window": 10_000_000}})
        client.call("message.append", {"session_id": "amp", "messages": [
            {"role": "user", "content": "x " * 1_000_000}]})
    lines = [encode(request("ctxd.render", {"session_id": "amp"}, 10 + i))
             for i in range(PIPELINED_RENDERS)]
    with Wire(daemon.socket) as one:
        one.send(lines[0] + b"\n")
        answer_bytes = len(one.read_line() or b"") + 1  # every answer is as long
    assert answer_bytes > 1024 * 1024  # over the outbox limit: one fills it
    with socket.socket(socket.AF_UNIX) as raw, Wire(daemon.socket) as probe:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.connect(str(daemon.socket))
        raw.sendall(b"".join(line + b"\n" for line in lines))
        held_requests = sum(len(line) for line in lines)

        def answers_held() -> int | None:
            """Whole answers held (None while another client's answer is also counted)."""
            held = status(probe)["bytes_inflight"] - held_requests
            return held // answer_bytes if held % answer_bytes == 0 else None

        def settled() -> int | None:
            """Answers held once every render started has been through the session (a
            request queued at it after them is answered after them)."""
            with daemon.client() as client:
                assert client.call("session.get", {"session_id": "amp"})["session"][
                    "message_count"] == 1
            wait_until(lambda: answers_held() is not None)
            return answers_held()

        wait_until(lambda: status(probe)["requests_inflight"] == PIPELINED_RENDERS
                   and (answers_held() or 0) >= 1)
        held = settled()
        assert held is not None
        assert 1 <= held <= 4
        assert settled() == held  # and no more start while the client reads nothing
        assert probe.ping() == []
    with Wire(daemon.socket) as probe:
        wait_until(lambda: status(probe)["bytes_inflight"] == 0
                   and status(probe)["requests_inflight"] == 0)
    assert_alive(daemon)


def test_context_window_has_a_maximum(daemon: DaemonProcess) -> None:
    with Wire(daemon.socket) as wire:
        reply = wire.call(request("session.open", {"session_id": "huge", "budget": {
            "context_window": 10_000_001}}, "huge"))
        assert reply == invalid_params("huge", "$.budget.context_window",
                                       "Expected `int` <= 10000000")
        reply = wire.call(request("session.open", {"session_id": "largest", "budget": {
            "context_window": 10_000_000}}, "largest"))
        assert reply["result"]["session"]["budget"]["context_window"] == 10_000_000


# ---- misbehaving clients do not affect others ---------------------------------------

def test_connections_closed_mid_request_do_not_affect_others(daemon: DaemonProcess) -> None:
    session_id = new_session(daemon)
    with Wire(daemon.socket, timeout=5.0) as other:
        wait_for_connections(other, 1)
        # Half a line, then gone.
        with Wire(daemon.socket) as quitter:
            quitter.send(b'{"jsonrpc":"2.0","id":1,"method":"daemon.pi')
        # A slow request, gone before its answer.
        with Wire(daemon.socket) as quitter:
            quitter.send_json(request("message.append", {"session_id": session_id, "messages": [
                {"role": "user", "content": "word " * 50}] * 500}))
        # Many requests, gone with their answers unread.
        with Wire(daemon.socket) as quitter:
            quitter.send(b"".join(encode(request("daemon.status", None, i)) + b"\n"
                                  for i in range(200)))
        assert other.ping() == []
        wait_for_connections(other, 1)
        assert other.ping() == []
    assert_alive(daemon)


def test_client_that_never_reads_does_not_block_others(daemon: DaemonProcess) -> None:
    session_id = new_session(daemon)
    with Wire(daemon.socket) as flooder, Wire(daemon.socket, timeout=5.0) as other:
        flooder.sock.setblocking(False)
        burst = b"".join(encode(request("daemon.status", None, i)) + b"\n" for i in range(500))
        sent = 0
        pushed_back = False
        while sent < 16 * 1024 * 1024:
            try:
                sent += flooder.sock.send(burst)
            except BlockingIOError:
                pushed_back = True
                break
        assert pushed_back, f"the daemon took {sent} bytes from a client that never reads"
        # Others are served while the flooder is stuck (a read timeout would fail these).
        assert other.ping() == []
        with Client(daemon.socket, timeout=5.0) as client:
            client.call("message.append", {"session_id": session_id,
                                           "messages": [{"role": "user", "content": "hi"}]})
            assert client.call("ctxd.render", {"session_id": session_id})["messages"] == [
                {"role": "user", "content": "hi"}]
    with Wire(daemon.socket) as probe:
        wait_for_connections(probe, 1)
    assert_alive(daemon)


# ---- fuzzing ------------------------------------------------------------------------

FUZZ_SETTINGS = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                         suppress_health_check=[HealthCheck.too_slow,
                                                HealthCheck.data_too_large])
FUZZ_METHODS = sorted(CORE_METHODS - {"daemon.shutdown"})
FUZZ_SESSIONS = ["fz-1", "fz-2"]
PROTOCOL_CODES = {ErrorCode.PARSE_ERROR, ErrorCode.INVALID_REQUEST, ErrorCode.METHOD_NOT_FOUND,
                  ErrorCode.INTERNAL_ERROR}
ANY_OUTCOME = 0
"""An expected code meaning: a result, or an error the method itself chose."""


MAX_FAILURES = 25
"""Failing examples a fuzz test shrinks through before it stops (a crash costs a daemon
start, a lost answer a read timeout); it then reports the shortest failing input."""
FUZZ_TIMEOUT_S = 5.0


class FailureBudgetSpent(BaseException):
    """Stops a Hypothesis run; a BaseException, so that Hypothesis does not shrink it."""


class FuzzTarget:
    """The daemon a fuzz test sends all its examples to.

    An example that kills the daemon fails with the daemon's log, and the next example gets
    a new daemon, so that Hypothesis can shrink the crash to a smaller input. After
    `MAX_FAILURES` failing examples the run stops with the shortest failing input.
    """

    def __init__(self, *extra_args: str) -> None:
        self.extra_args = list(extra_args)
        self.daemon: DaemonProcess | None = None
        self.starts = 0
        self.failures: list[tuple[bytes, str]] = []
        self._roots: list[Path] = []
        self._wire: Wire | None = None

    def current(self) -> DaemonProcess:
        """The daemon, started (again) if there is none or it died."""
        if self.daemon is None or self.daemon.proc is None or self.daemon.proc.poll() is not None:
            self._drop_wire()
            root = short_root()
            self._roots.append(root)
            self.daemon = DaemonProcess(root, extra_args=self.extra_args).start()
            self.starts += 1
            with Client(self.daemon.socket, timeout=READ_TIMEOUT_S) as client:
                for session_id in FUZZ_SESSIONS:
                    client.call("session.open", {"session_id": session_id})
        return self.daemon

    def connection(self) -> Wire:
        """The connection every example of the test shares."""
        daemon = self.current()
        if self._wire is None:
            self._wire = Wire(daemon.socket, timeout=FUZZ_TIMEOUT_S)
        return self._wire

    def _drop_wire(self) -> None:
        if self._wire is not None:
            self._wire.close()
            self._wire = None

    @contextmanager
    def example(self, sent: bytes) -> Iterator[None]:
        """Run one example that sends ``sent``; a failure drops the shared connection."""
        if len(self.failures) >= MAX_FAILURES:
            raise FailureBudgetSpent
        daemon = self.current()
        try:
            with crash_reported(daemon):
                yield
        except Exception as exc:
            self._drop_wire()
            self.failures.append((sent, f"{type(exc).__name__}: {exc}"))
            raise

    def run(self, examples: Callable[[], None]) -> None:
        """Run a ``@given`` function, then check the daemon still serves."""
        try:
            examples()
        except FailureBudgetSpent:
            sent, why = min(self.failures, key=lambda failure: len(failure[0]))
            raise AssertionError(f"{len(self.failures)} inputs failed; the shortest:\n"
                                 f"{sent!r}\n{why}") from None
        self.assert_serving()

    def assert_serving(self) -> None:
        """After all examples: one daemon, alive, answering on old and new connections."""
        daemon = self.current()
        assert self.starts == 1
        if self._wire is not None:
            # Late answers to the last example may still come: they must be well formed.
            for message in [*self._wire.ping(), *self._wire.finish()]:
                check_message(message)
            self._drop_wire()
        with Wire(daemon.socket) as fresh:
            assert fresh.ping() == []
        assert_alive(daemon)

    def close(self) -> None:
        self._drop_wire()
        if self.daemon is not None:
            self.daemon.stop()
        for root in self._roots:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def fuzz_target() -> Iterator[FuzzTarget]:
    target = FuzzTarget("--max-request-bytes", str(SMALL_LIMIT))
    try:
        yield target
    finally:
        target.close()


json_scalars = (st.none() | st.booleans() | st.integers()
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)
valid_ids = st.integers() | st.text(max_size=10) | st.none()
message_shaped = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "bob"]),
     "content": st.text(max_size=40) | st.lists(st.fixed_dictionaries(
         {"type": st.sampled_from(["text", "image"]), "text": st.text(max_size=20)}),
         max_size=2)},
    optional={"name": st.text(max_size=8), "component": st.sampled_from(
        ["system_prompt", "conversation", "nope"]), "meta": json_values})
param_values = (st.sampled_from(FUZZ_SESSIONS) | json_values
                | st.from_regex(r"[0-9]{1,19}", fullmatch=True)  # cursors
                | st.lists(message_shaped, min_size=1, max_size=3))
params_shaped = st.dictionaries(
    st.sampled_from(["session_id", "messages", "project", "title", "budget", "limit",
                     "cursor", "state", "client", "protocol_features", "types", "since_seq",
                     "subscription_id", "system_prompt", "skill_prompts", "tool_definitions",
                     "allow_over"]) | st.text(max_size=8),
    param_values, max_size=4)
requests_shaped = st.fixed_dictionaries(
    {"jsonrpc": st.just("2.0"), "method": st.sampled_from(FUZZ_METHODS)},
    optional={"id": valid_ids, "params": params_shaped})
anything_shaped = st.fixed_dictionaries({}, optional={
    "jsonrpc": st.sampled_from(["2.0", "1.0", "2", ""]) | json_values,
    "id": valid_ids | json_values,
    "method": st.sampled_from(FUZZ_METHODS) | st.text(max_size=16) | json_values,
    "params": params_shaped | json_values,
    "extra": json_values,
})
request_like = requests_shaped | anything_shaped
lines_of_request_like = request_like | st.lists(request_like, max_size=4)
valid_requests = (st.fixed_dictionaries(
    {"jsonrpc": st.just("2.0"), "id": valid_ids, "method": st.sampled_from(FUZZ_METHODS)},
    optional={"params": params_shaped})
    | st.lists(requests_shaped, min_size=1, max_size=3))
INVALID_UTF8 = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xed\xa0\x80",
                b"\xf4\x90\x80\x80", b"\xf5", b"\xfe", b"\xff", b"\xc3", b"\xe2\x82",
                b"\xf0\x9f\x98"]


@dataclass(frozen=True)
class Expected:
    """One reply the daemon must send: its id and its code (ANY_OUTCOME: a method's own)."""

    request_id: Any
    code: int

    def key(self) -> tuple[str, int]:
        return json.dumps(self.request_id), self.code


def is_valid_id(value: Any) -> bool:
    return value is None or type(value) in (int, str)


def expected_item(value: Any, methods: frozenset[str]) -> Expected | None:
    """What one JSON value in a request position must get (None: nothing, a notification)."""
    if not isinstance(value, dict):
        return Expected(None, ErrorCode.INVALID_REQUEST)
    has_id = "id" in value
    id_ok = not has_id or is_valid_id(value["id"])
    readable_id = value["id"] if has_id and id_ok else None
    if not (isinstance(value.get("jsonrpc"), str) and isinstance(value.get("method"), str)
            and id_ok):
        return Expected(readable_id, ErrorCode.INVALID_REQUEST)
    if not has_id:
        return None
    if value["jsonrpc"] != "2.0":
        return Expected(readable_id, ErrorCode.INVALID_REQUEST)
    if value["method"] not in methods:
        return Expected(readable_id, ErrorCode.METHOD_NOT_FOUND)
    return Expected(readable_id, ANY_OUTCOME)


def reply_key(reply: Any) -> tuple[str, int]:
    check_response(reply)
    code = reply["error"]["code"] if "error" in reply else ANY_OUTCOME
    return json.dumps(reply["id"]), code if code in PROTOCOL_CODES else ANY_OUTCOME


def assert_replies_match(value: Any, line: bytes, replies: list[Any],
                         methods: frozenset[str]) -> None:
    """The exact replies a JSON value sent as one line must get."""
    if len(line) > SMALL_LIMIT:
        assert replies == [too_large(SMALL_LIMIT)]
        return
    if isinstance(value, list) and value:
        expected = [e for e in (expected_item(item, methods) for item in value) if e is not None]
        if not expected:
            assert replies == []
            return
        assert len(replies) == 1, replies
        assert isinstance(replies[0], list), replies
        assert Counter(reply_key(r) for r in replies[0]) == Counter(e.key() for e in expected)
        return
    if isinstance(value, list):
        single = Expected(None, ErrorCode.INVALID_REQUEST)
    else:
        single = expected_item(value, methods)
    if single is None:
        assert replies == []
        return
    assert len(replies) == 1, replies
    assert reply_key(replies[0]) == single.key(), replies
    assert same_id(replies[0]["id"], single.request_id)


def available_methods(daemon: DaemonProcess) -> frozenset[str]:
    with Wire(daemon.socket) as wire:
        return frozenset(wire.call(request("nope"))["error"]["data"]["available"])


def send_alone(daemon: DaemonProcess, line: bytes) -> list[Any]:
    """Send one line on a new connection, half-close, and return every reply but events."""
    with Wire(daemon.socket, timeout=FUZZ_TIMEOUT_S) as wire:
        wire.send(line + b"\n")
        return [message for message in wire.finish() if not is_event(message)]


def test_fuzz_random_bytes(fuzz_target: FuzzTarget) -> None:
    @FUZZ_SETTINGS
    @given(payload=st.binary(max_size=300)
           | st.tuples(st.binary(min_size=1, max_size=200), st.integers(2, 60)).map(
               lambda unit_times: unit_times[0] * unit_times[1]))
    def example(payload: bytes) -> None:
        with fuzz_target.example(payload):
            # The trailing newline ends whatever line (or discarded overlong line) is open.
            for message in fuzz_target.connection().exchange(payload + b"\n"):
                check_message(message)

    fuzz_target.run(example)


def assert_unparseable(line: bytes, replies: list[Any]) -> None:
    """A line that is not JSON gets exactly one error, with id null."""
    assert len(replies) == 1, replies
    if len(line) > SMALL_LIMIT:
        assert replies == [too_large(SMALL_LIMIT)]
    else:
        assert_parse_error(replies[0])


def send_both_ways(target: FuzzTarget, line: bytes) -> list[Any]:
    """Send ``line`` alone on a new connection (its exact replies are returned), then on
    the shared connection, which must still answer a ping after it."""
    replies = send_alone(target.current(), line)
    for message in target.connection().exchange(line + b"\n"):
        check_message(message)
    return replies


def test_fuzz_truncated_requests(fuzz_target: FuzzTarget) -> None:
    @FUZZ_SETTINGS
    @given(prefix=valid_requests.map(encode).flatmap(
        lambda line: st.integers(1, len(line) - 1).map(lambda cut: line[:cut])))
    def example(prefix: bytes) -> None:
        with fuzz_target.example(prefix):
            assert_unparseable(prefix, send_both_ways(fuzz_target, prefix))

    fuzz_target.run(example)


def test_fuzz_invalid_utf8_in_requests(fuzz_target: FuzzTarget) -> None:
    @FUZZ_SETTINGS
    @given(parts=valid_requests.map(encode).flatmap(lambda line: st.tuples(
        st.just(line), st.integers(0, len(line)), st.sampled_from(INVALID_UTF8))))
    def example(parts: tuple[bytes, int, bytes]) -> None:
        line, at, bad = parts
        corrupted = line[:at] + bad + line[at:]
        try:
            corrupted.decode()
        except UnicodeDecodeError:
            pass
        else:
            assume(False)  # the bytes happened to complete a character
        with fuzz_target.example(corrupted):
            assert_unparseable(corrupted, send_both_ways(fuzz_target, corrupted))

    fuzz_target.run(example)


@pytest.mark.parametrize("values", [json_values, lines_of_request_like],
                         ids=["json-values", "request-shaped"])
def test_fuzz_json(fuzz_target: FuzzTarget, values: st.SearchStrategy[Any]) -> None:
    methods = available_methods(fuzz_target.current())

    @FUZZ_SETTINGS
    @given(value=values)
    def example(value: Any) -> None:
        line = encode(value)
        with fuzz_target.example(line):
            assert_replies_match(value, line, send_both_ways(fuzz_target, line), methods)

    fuzz_target.run(example)


def test_a_client_that_does_not_read_cannot_grow_the_daemon(daemon: DaemonProcess) -> None:
    # Regression: inline answers (daemon.ping) were queued without limit while another
    # task of the same connection was blocked sending a large answer to a non-reader.
    with daemon.client() as client:
        client.call("session.open", {"session_id": "big", "budget": {
            "context_window": 10_000_000}})
        client.call("message.append", {"session_id": "big", "messages": [
            {"role": "user", "content": "x " * 2_000_000}]})
    with socket.socket(socket.AF_UNIX) as raw:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.connect(str(daemon.socket))
        raw.sendall(b'{"jsonrpc":"2.0","id":0,"method":"ctxd.render",'
                    b'"params":{"session_id":"big"}}\n')
        # Let the render's task become the one blocked sending its 4 MB answer, so the
        # pings' inline answers can only queue behind it.
        time.sleep(1.0)
        ping = b'{"jsonrpc":"2.0","id":1,"method":"daemon.ping"}\n' * 1000
        raw.settimeout(3)
        sent = 0
        try:
            while sent < 64 * 1024 * 1024:
                raw.sendall(ping)
                sent += len(ping)
        except TimeoutError:
            pass
        # The daemon stopped reading: what it took is bounded by its outbox limit
        # (1 MiB of answers, about 1.4 MiB of pings) plus the kernel's socket buffers.
        assert sent < 16 * 1024 * 1024
    with daemon.client() as client:
        assert client.call("daemon.ping")["pong"] is True

"""The client library: a peer that breaks the protocol (ctxd itself never does), what
importing it loads, and its exception classes."""

import json
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import pytest
import trio
from conftest import DaemonProcess, kill_leftovers, short_root
from tests_support import hello_text

import ctxclient
import ctxclient._errors
from ctxclient import DaemonUnavailable, RpcError
from ctxclient._spawn import start_command
from ctxd.errors import ErrorCode
from ctxd.wire.types import MemoryQuery


async def test_a_garbled_answer_ends_the_connection_as_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "peer.sock"
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener.bind(str(path))
    listener.listen()

    async def garbling_peer() -> None:
        connection, _ = await listener.accept()
        with connection:
            await connection.recv(65536)
            await connection.send(b"this is not json\n")
            await trio.sleep_forever()

    with listener:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(garbling_peer)
            with pytest.raises(DaemonUnavailable, match="connection closed"):
                async with ctxclient.connect(path) as client:
                    await client.call("daemon.ping")
            nursery.cancel_scope.cancel()


def test_importing_the_client_loads_nothing_of_the_daemon() -> None:
    # ctxctl starts in a shell hook; the tokenizer alone takes longer to load than a call.
    code = ("import json, sys, ctxclient, ctxclient.cli; "
            "print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                       text=True, check=True, timeout=60).stdout)
    assert [name for name in ("tiktoken", "apsw", "faiss", "numpy") if name in loaded] == []
    # ctxd.cost names the replay's policies and price models (its tokenizer comes with
    # the first count).
    assert sorted(name for name in loaded if name.split(".")[0] == "ctxd"
                  and not name.startswith("ctxd.wire")) == ["ctxd", "ctxd.cost", "ctxd.errors",
                                                            "ctxd.paths"]


def test_one_exception_class_per_error_code() -> None:
    assert {code.name: ctxclient.ERRORS[code].__name__ for code in ErrorCode} == {
        "PARSE_ERROR": "ParseError", "INVALID_REQUEST": "InvalidRequest",
        "METHOD_NOT_FOUND": "MethodNotFound", "INVALID_PARAMS": "InvalidParams",
        "INTERNAL_ERROR": "InternalError", "CONTEXT_LIMIT_EXCEEDED": "ContextLimitExceeded",
        "BUDGET_EXHAUSTED": "BudgetExhausted", "INVALID_STATE": "InvalidState",
        "NOT_FOUND": "NotFound", "LIMIT_REACHED": "LimitReached", "CANCELLED": "Cancelled",
        "OVERLOADED": "Overloaded", "STORAGE_ERROR": "StorageError", "TIMEOUT": "Timeout"}
    for code, cls in ctxclient.ERRORS.items():
        assert issubclass(cls, RpcError)
        assert (cls.error_code, getattr(ctxclient, cls.__name__)) == (code, cls)


def test_errors_from_the_daemon_raise_their_codes_class(shared_daemon: DaemonProcess,
                                                         sid: str) -> None:
    with shared_daemon.client() as client:
        with pytest.raises(ctxclient.NotFound) as unknown:
            client.call("session.get", {"session_id": sid})
        assert (unknown.value.code, unknown.value.message) == (-32004, f"unknown session '{sid}'")
        with pytest.raises(ctxclient.MethodNotFound):
            client.call("session.opne", {})
        with pytest.raises(ctxclient.InvalidParams):
            client.call("session.open", {"session_id": 5})
        client.call("session.open", {"session_id": sid, "budget": {
            "context_window": 1100, "max_output_tokens": 100}})
        with pytest.raises(ctxclient.ContextLimitExceeded):
            client.call("message.append", {"session_id": sid, "messages": [
                {"role": "user", "content": hello_text(1000)}]})
        client.call("session.close", {"session_id": sid})
        with pytest.raises(ctxclient.InvalidState):
            client.call("message.append", {"session_id": sid, "messages": [
                {"role": "user", "content": "late"}]})


def test_every_error_about_the_daemon_is_a_ctxd_client_error() -> None:
    from ctxclient._mcp import DaemonBusy, PumpError

    tree = [RpcError, *ctxclient.ERRORS.values(), DaemonUnavailable, ctxclient.BadSocketPath,
            ctxclient.UntrustedSocket, PumpError, DaemonBusy]
    assert [cls.__name__ for cls in tree
            if not issubclass(cls, ctxclient.CtxdClientError)] == []
    unavailable = DaemonUnavailable("/run/x.sock", "connection refused")
    # Code written before the common base caught OSError or ConnectionError: it still does.
    assert isinstance(unavailable, ConnectionError)
    assert (str(unavailable), unavailable.path, unavailable.reason) == (
        "no ctxd daemon is running on /run/x.sock (connection refused); start it with "
        f"`{start_command()} --socket /run/x.sock`", "/run/x.sock", "connection refused")
    with pytest.raises(ctxclient.CtxdClientError) as caught:
        raise ctxclient._errors.rpc_error(-32004, "unknown session 's1'")
    assert type(caught.value) is ctxclient.NotFound


def test_the_command_that_starts_the_daemon_is_one_the_user_can_type(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ctxd`` when PATH finds the one beside this interpreter; its full path when PATH
    does not (a virtualenv not activated) or finds another; ``ctxd`` when there is none
    beside it."""
    beside = Path(sys.executable).parent / "ctxd"
    assert beside.is_file()  # the development install's
    other = tmp_path / "bin"
    other.mkdir()
    (other / "ctxd").write_text("#!/bin/sh\n")
    (other / "ctxd").chmod(0o755)
    assert start_command(str(beside.parent)) == "ctxd"
    assert start_command(str(other)) == str(beside)
    assert start_command(str(tmp_path / "nothing")) == str(beside)
    assert start_command(f"{other}:{beside.parent}") == str(beside)
    assert start_command(f"{beside.parent}:{other}") == "ctxd"
    monkeypatch.setattr(sys, "executable", str(tmp_path / "nothing" / "python"))
    assert start_command(str(other)) == "ctxd"
    # A socket other than ctxd's default here is named, as the user gave it to ctxctl.
    monkeypatch.setenv("CTXD_SOCKET", str(tmp_path / "mine.sock"))
    assert start_command(str(other), str(tmp_path / "mine.sock")) == "ctxd"
    assert start_command(str(other), str(tmp_path / "b c.sock")) == (
        f"ctxd --socket '{tmp_path / 'b c.sock'}'")


def test_the_hook_cuts_its_query_to_what_memory_context_takes() -> None:
    # The hook imports the standard library only: it keeps the wire's limit as a number.
    from ctxclient._hook import MAX_QUERY_CHARS

    assert MAX_QUERY_CHARS == get_args(MemoryQuery)[1].max_length


def test_an_unknown_code_is_a_plain_rpc_error() -> None:
    error = ctxclient._errors.rpc_error(-31999, "new in a later daemon", {"x": 1})
    assert (type(error), error.code, error.message, error.data) == (
        RpcError, -31999, "new in a later daemon", {"x": 1})


def test_ctxctl_colours_a_branch_by_its_sessions_thresholds() -> None:
    from ctxclient._cli_values import HEALTH_STYLE, branch_budget_bar

    def health(used: int, budget: dict[str, float]) -> str:
        bar = branch_budget_bar({"budget_used": used, "budget": 100}, budget)
        assert bar.plain == f"{used:.1f}%"
        return next(name for name, style in HEALTH_STYLE.items() if style == bar.shown.style)

    # A session opened with lower thresholds than the defaults: its branches warn sooner.
    low = {"context_window": 4096, "max_output_tokens": 0, "warn": 0.3, "caution": 0.4,
           "compact_trigger": 0.85, "hard_block": 0.9}
    assert [health(used, low) for used in (20, 35, 50, 87, 95, 100)] == [
        "ok", "warn", "caution", "compact", "blocked", "blocked"]
    default = {"context_window": 200_000, "max_output_tokens": 8192, "warn": 0.7,
               "caution": 0.8, "compact_trigger": 0.95, "hard_block": 0.98}
    # 96 %: "compact" (red), as the daemon says of a session there; ctxctl had its own copy
    # of the levels without it, and showed "caution".
    assert [health(used, default) for used in (50, 75, 85, 96, 100)] == [
        "ok", "warn", "caution", "compact", "blocked"]


async def test_both_clients_send_unique_uuid_string_ids(tmp_path: Path) -> None:
    # Any connection may cancel a request by its id (request.cancel): ids must not repeat
    # across connections, as counters from 1 would.
    path = tmp_path / "peer.sock"
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener.bind(str(path))
    listener.listen()
    received: list[dict[str, object]] = []

    async def answering_peer() -> None:
        while True:
            connection, _ = await listener.accept()
            with connection:
                while data := await connection.recv(65536):
                    for line in data.splitlines():
                        request = json.loads(line)
                        received.append(request)
                        await connection.send(json.dumps({
                            "jsonrpc": "2.0", "id": request["id"], "result": {}}).encode()
                            + b"\n")

    def with_sync_client() -> None:
        with ctxclient.Client(path, timeout=10) as client:
            client.call("daemon.ping")
            client.call("daemon.ping", request_id="mine")

    with listener:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(answering_peer)
            async with ctxclient.connect(path) as client:
                await client.call("daemon.ping")
                await client.call("daemon.ping", request_id="ours")
            await trio.to_thread.run_sync(with_sync_client)
            nursery.cancel_scope.cancel()
    ids = [request["id"] for request in received]
    assert [ids[1], ids[3]] == ["ours", "mine"]
    generated = [ids[0], ids[2]]
    assert [str(uuid.UUID(str(request_id))) for request_id in generated] == generated
    assert generated[0] != generated[1]


SMALL_LIMIT = 4096
OVERSIZED = {"client": "x" * 5000}
"""daemon.hello params that make a line over SMALL_LIMIT: the daemon discards it and
answers with id null."""
DISCARDED = ("invalid request: line longer than max_request_bytes (4096); it was discarded")
ANSWER_WAIT_S = 30.0
"""A bound on a wait for an answer that comes at once (it fails the test, not times it)."""


@pytest.fixture(scope="module")
def small_lines() -> Iterator[DaemonProcess]:
    root = short_root()
    process = DaemonProcess(root, extra_args=["--max-request-bytes", str(SMALL_LIMIT)])
    with process.running():
        yield process
    kill_leftovers(root)
    shutil.rmtree(root, ignore_errors=True)


def test_an_id_null_error_answers_the_one_call_outstanding(small_lines: DaemonProcess) -> None:
    """docs/protocol.md, "Framing"; with several outstanding it is nobody's in particular
    (docs/decisions.md, "An error with id null")."""
    with ctxclient.Client(small_lines.socket, timeout=ANSWER_WAIT_S) as client:
        with pytest.raises(ctxclient.InvalidRequest) as discarded:
            client.call("daemon.hello", OVERSIZED)
        assert (discarded.value.message, client.notifications.empty()) == (DISCARDED, True)
        # One line, two requests outstanding: the error goes to the notifications, and both
        # go on waiting for their own answers.
        futures = client.batch([("daemon.hello", OVERSIZED), ("daemon.ping", None)])
        assert client.notifications.get(timeout=ANSWER_WAIT_S)["error"]["message"] == DISCARDED
        assert [future.done() for future in futures] == [False, False]
    assert [type(future.exception()) for future in futures] == [DaemonUnavailable] * 2


async def test_the_async_client_takes_an_id_null_error_as_its_calls_answer(
        small_lines: DaemonProcess) -> None:
    async with ctxclient.connect(small_lines.socket) as client:
        with trio.fail_after(ANSWER_WAIT_S), pytest.raises(ctxclient.InvalidRequest) as discarded:
            await client.call("daemon.hello", OVERSIZED)
        assert discarded.value.message == DISCARDED
        assert (await client.call("daemon.ping"))["pong"] is True


@pytest.mark.parametrize(("text", "expected"), [
    ("cut \ud83d here", "cut \ufffd here"),
    ("\udcff: an invalid UTF-8 byte of argv", "\ufffd: an invalid UTF-8 byte of argv"),
])
async def test_both_clients_send_a_lone_surrogate_as_its_escape(
        small_lines: DaemonProcess, text: str, expected: str) -> None:
    """What JSON.stringify writes; the daemon stores U+FFFD (docs/protocol.md, "Framing")."""
    session_id = "t_" + uuid.uuid4().hex[:12]
    async with ctxclient.connect(small_lines.socket) as client:
        await client.call("session.open", {"session_id": session_id})
        await client.call("message.append", {"session_id": session_id, "messages": [
            {"role": "user", "content": text}]})

    def with_sync_client() -> list[str]:
        with ctxclient.Client(small_lines.socket, timeout=ANSWER_WAIT_S) as client:
            client.call("message.append", {"session_id": session_id, "messages": [
                {"role": "user", "content": text}]})
            return [m["content"] for m in client.call(
                "message.list", {"session_id": session_id})["messages"]]

    assert await trio.to_thread.run_sync(with_sync_client) == [expected, expected]

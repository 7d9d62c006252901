"""The daemon process: placement, locking, signals, durability, concurrency, idle actors."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import resource
import signal
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest
import trio
from conftest import DaemonProcess
from e2e.test_cancel import SUMMARY, WINDOW, chat, gated_daemon
from tests_support import hello_text
from unit.test_embedders import EmbeddingServer

import ctxclient
from ctxclient import Client, DaemonUnavailable, Overloaded, RpcError
from ctxd.daemon._socket import Lock, PlacementError, _same_file
from ctxd.paths import peer_uid


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_socket_directory_and_lock_are_private(daemon: DaemonProcess) -> None:
    assert stat.S_ISSOCK(os.lstat(daemon.socket).st_mode)
    assert mode(daemon.socket) == 0o600
    assert mode(daemon.socket.parent) == 0o700
    assert mode(daemon.data_dir) == 0o700
    with daemon.client() as client:
        client.call("session.open", {"session_id": "private"})
    for name in ("ctxd.db", "ctxd.db-wal", "ctxd.db-shm", "ctxd.lock"):
        assert mode(daemon.data_dir / name) == 0o600, name
    lock = daemon.socket.with_name("ctxd.sock.lock")
    assert lock.read_text().strip() == str(daemon.proc.pid)  # type: ignore[union-attr]


def test_a_second_daemon_is_refused(daemon: DaemonProcess) -> None:
    second = subprocess.run(daemon.command(), capture_output=True, text=True, timeout=60,
                            env=daemon.environment(), check=False)
    assert second.returncode == 1
    assert f"another ctxd (pid {daemon.proc.pid}) is already running" in second.stderr  # type: ignore[union-attr]
    with daemon.client() as client:
        assert client.call("daemon.ping")["pong"] is True


def test_a_second_daemon_on_the_same_data_dir_is_refused(daemon: DaemonProcess) -> None:
    other = DaemonProcess(daemon.root / "other")
    command = [*other.command()[:-2], "--data-dir", str(daemon.data_dir)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60,
                            env=other.environment(), check=False)
    assert result.returncode == 1
    assert f"data directory {daemon.data_dir}" in result.stderr


def test_stale_socket_is_recovered_after_a_crash(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root).start()
    with process.client() as client:
        client.call("session.open", {"session_id": "kept"})
    process.kill()
    assert process.socket.exists()  # left behind by SIGKILL
    with pytest.raises(DaemonUnavailable):
        Client(process.socket)
    process.start()
    with process.client() as client:
        assert client.call("session.get", {"session_id": "kept"})["session"]["state"] == "open"
    assert process.stop() == 0


@pytest.mark.parametrize("problem", ["open-mode", "symlink", "not-a-socket"])
def test_unsafe_placement_is_refused(daemon_root: Path, problem: str) -> None:
    process = DaemonProcess(daemon_root)
    run_dir = process.socket.parent
    if problem == "open-mode":
        run_dir.mkdir(mode=0o755)
        os.chmod(run_dir, 0o755)
        expected = f"{run_dir} has mode 0755; it must be private: chmod 700 {run_dir}"
    elif problem == "symlink":
        (daemon_root / "elsewhere").mkdir(mode=0o700)
        run_dir.symlink_to(daemon_root / "elsewhere")
        expected = f"{run_dir} is a symlink"
    else:
        run_dir.mkdir(mode=0o700)
        process.socket.write_text("precious")
        expected = f"{process.socket} exists and is not a socket; not removing it"
    result = subprocess.run(process.command(), capture_output=True, text=True, timeout=60,
                            env=process.environment(), check=False)
    assert result.returncode == 1
    assert expected in result.stderr
    if problem == "not-a-socket":
        assert process.socket.read_text() == "precious"


def test_peer_credentials_are_read() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        assert peer_uid(left) == os.getuid()


def test_sigterm_exits_zero_keeps_everything_and_removes_the_socket(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root).start()
    with process.client() as client:
        client.call("session.open", {"session_id": "s"})
        client.call("message.append", {"session_id": "s", "messages": [
            {"role": "user", "content": f"message {i}"} for i in range(50)]})
    assert process.stop(signal.SIGTERM) == 0
    assert not process.socket.exists()
    assert sorted(os.listdir(process.socket.parent)) == []  # ctxd.sock.lock is gone too
    assert "ctxd stopped" in process.log()
    process.start()
    with process.client() as client:
        listed = client.call("message.list", {"session_id": "s", "limit": 100})
        assert [m["content"] for m in listed["messages"]] == [f"message {i}" for i in range(50)]
    assert process.stop(signal.SIGINT) == 0


def test_sigterm_lets_an_in_flight_request_finish(daemon_root: Path) -> None:
    # A compaction held in flight by its summarizer, before its commit point (a cancelled
    # one would be answered -32006), until the test opens the summarizer's gate: no race
    # with its end.
    gated = gated_daemon(daemon_root, "--hygiene-auto-compact", "false")
    process = gated.process.start()
    with process.client() as client:
        client.call("session.open", {"session_id": "s", "budget": WINDOW})
        client.call("message.append", {"session_id": "s", "messages": chat(10, 450)})
        compacting = client.submit("context.compact", {"session_id": "s",
                                                       "strategies": ["summarize"]})
        gated.wait_started()
        process.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        gated.release()
        done = compacting.result(60)
        assert (done["summarizer"], done["summarized"] > 0) == ("command", True)
    assert process.proc.wait(60) == 0  # type: ignore[union-attr]
    process.start()
    with process.client() as client:
        listed = client.call("message.list", {"session_id": "s", "limit": 1000})["messages"]
        assert SUMMARY in listed[-1]["content"]
    assert process.stop() == 0


def test_no_acknowledged_append_is_lost_to_sigkill(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root).start()
    rng = random.Random(7)
    acknowledged: dict[str, list[tuple[int, str]]] = {}
    for round_number in range(3):
        session_id = f"kill-{round_number}"
        acknowledged[session_id] = []
        stop = threading.Event()

        def writer(session_id: str = session_id, stop: threading.Event = stop) -> None:
            try:
                with process.client(timeout=10) as client:
                    client.call("session.open", {"session_id": session_id})
                    n = 0
                    while not stop.is_set():
                        batch = [f"{session_id}/{n + i}" for i in range(rng.randint(1, 5))]
                        result = client.call("message.append", {
                            "session_id": session_id,
                            "messages": [{"role": "user", "content": c} for c in batch]})
                        acknowledged[session_id].extend(
                            (m["seq"], c) for m, c in zip(result["appended"], batch, strict=True))
                        n += len(batch)
            except (DaemonUnavailable, OSError, TimeoutError):
                pass  # the daemon died under us: what was acknowledged is recorded

        thread = threading.Thread(target=writer)
        thread.start()
        deadline = time.monotonic() + 30
        while not acknowledged[session_id] and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.random() * 0.3)
        process.kill()
        stop.set()
        thread.join(20)
        assert len(acknowledged[session_id]) > 0
        process.start()
    with process.client() as client:
        for session_id, acked in acknowledged.items():
            listed = client.call("message.list", {"session_id": session_id, "limit": 1000})
            stored = {m["seq"]: m["content"] for m in listed["messages"]}
            cursor = listed["next_cursor"]
            while cursor:
                page = client.call("message.list", {"session_id": session_id,
                                                    "cursor": cursor, "limit": 1000})
                stored.update({m["seq"]: m["content"] for m in page["messages"]})
                cursor = page["next_cursor"]
            assert all(stored.get(seq) == content for seq, content in acked), session_id
            # Stored seqs are contiguous: nothing half-written in the middle.
            assert sorted(stored) == list(range(1, len(stored) + 1))
    assert process.stop() == 0


async def test_hundred_concurrent_clients_exact_totals(shared_daemon: DaemonProcess) -> None:
    clients, per_client = 100, 10
    prefix = f"conc-{os.getpid()}-{random.randrange(10**6)}"

    async def agent(n: int) -> None:
        async with ctxclient.connect(shared_daemon.socket) as client:
            session_id = f"{prefix}-{n}"
            await client.call("session.open", {"session_id": session_id})
            for i in range(per_client):
                # user message of 3 + 1 + (n % 7 + 1) tokens
                await client.call("message.append", {"session_id": session_id, "messages": [
                    {"role": "user", "content": hello_text(n % 7 + 1)}]})
                if i % 3 == 0:
                    await client.call("ctxd.render", {"session_id": session_id})

    async with trio.open_nursery() as nursery:
        for n in range(clients):
            nursery.start_soon(agent, n)
    async with ctxclient.connect(shared_daemon.socket) as client:
        for n in range(clients):
            got = await client.call("session.get", {"session_id": f"{prefix}-{n}"})
            expected = per_client * (4 + n % 7 + 1)
            assert (got["session"]["message_count"], got["session"]["total_tokens"]) == (
                per_client, expected)
            assert got["context_state"]["main_thread_tokens"] == expected + 3


def test_idle_actors_retire_and_rehydrate(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root, extra_args=["--session-idle-s", "0.2"]).start()
    with process.client() as client:
        client.call("session.open", {"session_id": "idle"})
        client.call("message.append", {"session_id": "idle", "messages": [
            {"role": "user", "content": "hello world"}]})
        deadline = time.monotonic() + 10
        while client.call("daemon.status")["session_actors"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.call("daemon.status")["session_actors"] == 0
        got = client.call("session.get", {"session_id": "idle"})
        assert (got["session"]["message_count"], got["session"]["total_tokens"]) == (1, 6)
        appended = client.call("message.append", {"session_id": "idle", "messages": [
            {"role": "user", "content": "hello world"}]})
        assert appended["appended"][0]["seq"] == 2
    assert process.stop() == 0


def test_daemon_status_reports_the_process(shared_daemon: DaemonProcess) -> None:
    with shared_daemon.client() as client:
        status = client.call("daemon.status")
    assert status["pid"] == shared_daemon.proc.pid  # type: ignore[union-attr]
    assert status["socket"] == str(shared_daemon.socket)
    assert status["data_dir"] == str(shared_daemon.data_dir)
    assert status["rss_bytes"] > 10 * 1024 * 1024
    assert status["db_size_bytes"] > 0
    assert status["connections"] >= 1
    assert status["requests_total"] >= 1


def test_shutdown_method_stops_the_daemon(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root).start()
    with process.client() as client:
        assert client.call("daemon.shutdown") == {"stopping": True}
    assert process.proc.wait(30) == 0  # type: ignore[union-attr]
    assert sorted(os.listdir(process.socket.parent)) == []


def test_a_lock_file_removed_by_its_holder_is_not_taken(tmp_path: Path) -> None:
    path = tmp_path / "ctxd.sock.lock"
    holder = Lock(path, "the socket")
    racing = os.open(path, os.O_RDWR)  # a newcomer opened the file just before it goes
    holder.release(remove=True)
    assert not path.exists()
    # The newcomer's flock succeeds on the removed file, which no longer counts: Lock
    # sees that it is not the file at the path and starts over ...
    fcntl.flock(racing, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        assert not _same_file(racing, path)
        # ... so the lock that counts is the one on the file now at the path: one holder.
        newcomer = Lock(path, "the socket")
        with pytest.raises(PlacementError, match=f"another ctxd \\(pid {os.getpid()}\\)"):
            Lock(path, "the socket")
        newcomer.release()
        assert path.read_text() == f"{os.getpid()}\n"  # kept without remove
    finally:
        os.close(racing)


@pytest.mark.parametrize("problem", ["too-long", "parent-is-a-file", "uncreatable",
                                     "a-directory", "open-mode", "shared-tmp"])
def test_a_bad_socket_path_is_refused_before_the_data_dir_is_touched(
        daemon_root: Path, problem: str) -> None:
    process = DaemonProcess(daemon_root)
    if problem == "too-long":
        socket_path = daemon_root / ("x" * 120) / "ctxd.sock"
        expected = (f"socket path {socket_path} is longer than 107 bytes; choose a shorter "
                    "--socket")
    elif problem == "parent-is-a-file":
        (daemon_root / "file").write_text("")
        socket_path = daemon_root / "file" / "ctxd.sock"
        expected = f"{daemon_root / 'file'} is not a directory"
    elif problem == "uncreatable":
        socket_path = Path("/proc/x/y.sock")
        expected = "cannot create the directory /proc/x: No such file or directory"
    elif problem == "a-directory":
        socket_path = daemon_root
        expected = f"{daemon_root} exists and is not a socket; not removing it"
    elif problem == "shared-tmp":
        # Never the advice to chmod a directory every user relies on.
        socket_path = Path("/tmp") / f"{daemon_root.name}.sock"
        expected = ("/tmp has mode 1777 and is shared; ctxd needs a private directory (mode "
                    "0700) of your own: choose one (a path inside a new directory) for "
                    "--socket/--data-dir")
    else:
        (daemon_root / "open").mkdir(mode=0o755)
        os.chmod(daemon_root / "open", 0o755)
        socket_path = daemon_root / "open" / "ctxd.sock"
        expected = (f"{daemon_root / 'open'} has mode 0755; it must be private: "
                    f"chmod 700 {daemon_root / 'open'}")
    command = [*process.command(), "--socket", str(socket_path)]  # the last --socket wins
    result = subprocess.run(command, capture_output=True, text=True, timeout=60,
                            env=process.environment(), check=False)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", f"ctxd: {expected}\n")
    assert not process.data_dir.exists()


@pytest.mark.parametrize("socket_directory", ["open", "missing"])
def test_an_open_socket_directory_and_data_directory_are_named_together(
        daemon_root: Path, socket_directory: str) -> None:
    """Both refused in one start, not one per start; nothing is changed or created (a
    missing socket directory stays missing while the data directory is refused)."""
    process = DaemonProcess(daemon_root)
    refused = [process.socket.parent, process.data_dir]
    if socket_directory == "missing":
        refused = refused[1:]
    for directory in refused:
        directory.mkdir(mode=0o755, parents=True)
        os.chmod(directory, 0o755)
    result = subprocess.run(process.command(), capture_output=True, text=True, timeout=60,
                            env=process.environment(), check=False)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", "".join(
        f"ctxd: {directory} has mode 0755; it must be private: chmod 700 {directory}\n"
        for directory in refused))
    assert list(process.data_dir.iterdir()) == []
    assert stat.S_IMODE(process.data_dir.stat().st_mode) == 0o755
    assert process.socket.parent.exists() == (socket_directory == "open")


async def test_errors_inside_the_async_client_block_propagate(
        shared_daemon: DaemonProcess) -> None:
    # Regression: closing the stream inside the cancelled nursery raised Cancelled there,
    # which replaced (and so swallowed) whatever the block raised.
    with pytest.raises(RpcError) as caught:
        async with ctxclient.connect(shared_daemon.socket) as client:
            await client.call("session.get", {"session_id": "nobody-has-this"})
    assert caught.value.code == -32004
    with pytest.raises(ValueError, match="from the block"):
        async with ctxclient.connect(shared_daemon.socket):
            raise ValueError("from the block")


def test_shutdown_under_load_answers_everything_it_ran(daemon_root: Path) -> None:
    # Regression: open connections kept starting requests during the drain, so a busy
    # client held shutdown for the whole deadline and some writes committed unanswered.
    process = DaemonProcess(daemon_root).start()
    acknowledged: set[str] = set()
    refused: set[str] = set()
    refused_codes: set[int] = set()
    with process.client(timeout=60) as client:
        client.call("session.open", {"session_id": "busy", "budget": {
            "context_window": 10_000_000}})
        pending: dict[str, object] = {}
        n = 0
        deadline = time.monotonic() + 30
        signalled = False
        while time.monotonic() < deadline:
            try:
                while len(pending) < 16:
                    text = f"m{n}"
                    pending[text] = client.submit("message.append", {
                        "session_id": "busy", "messages": [{"role": "user", "content": text}]})
                    n += 1
            except DaemonUnavailable:
                pass  # that one was never sent: the daemon had closed
            if not pending:
                break
            text, future = next(iter(pending.items()))
            try:
                future.result(30)  # type: ignore[attr-defined]
                acknowledged.add(text)
            except RpcError as error:
                refused_codes.add(error.code)
                refused.add(text)
            except DaemonUnavailable:
                break
            del pending[text]
            if len(acknowledged) == 500 and not signalled:
                process.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
                signalled = True
    assert process.proc.wait(60) == 0  # type: ignore[union-attr]
    assert "deadline" not in process.log()
    assert refused_codes <= {-32007}  # "ctxd is shutting down; retry": it was not run
    process.start()
    with process.client() as client:
        listed = client.call("message.list", {"session_id": "busy", "limit": 1000})
        stored = {m["content"] for m in listed["messages"]}
        cursor = listed["next_cursor"]
        while cursor:
            page = client.call("message.list", {"session_id": "busy", "cursor": cursor,
                                                "limit": 1000})
            stored |= {m["content"] for m in page["messages"]}
            cursor = page["next_cursor"]
    assert stored == acknowledged
    assert not stored & refused
    assert process.stop() == 0


def test_closed_sessions_expire_after_their_ttl(daemon_root: Path) -> None:
    # 0.0002 h is 0.72 s: the sweep runs every second here (every hour by default).
    process = DaemonProcess(daemon_root, extra_args=["--session-ttl-h", "0.0002"]).start()
    try:
        with process.client() as client:
            for session_id in ("closed", "open"):
                client.call("session.open", {"session_id": session_id})
                client.call("message.append", {"session_id": session_id, "messages": [
                    {"role": "user", "content": "hello world"}]})
            client.call("session.close", {"session_id": "closed"})
            deadline = time.monotonic() + 20
            while client.call("daemon.status")["sessions_total"] == 2:
                assert time.monotonic() < deadline, "the closed session never expired"
                time.sleep(0.1)
            with pytest.raises(RpcError) as caught:
                client.call("session.get", {"session_id": "closed"})
            assert caught.value.code == -32004
            kept = client.call("session.get", {"session_id": "open"})["session"]
            assert (kept["state"], kept["message_count"]) == ("open", 1)
            assert client.call("daemon.status")["sessions_open"] == 1
    finally:
        assert process.stop() == 0


NOFILE = 64
"""The open-files limit of the daemon that runs out of descriptors."""


def test_running_out_of_descriptors_keeps_the_daemon_serving(daemon_root: Path) -> None:
    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))

    process = DaemonProcess(daemon_root).start(before_exec=low_limit)
    try:
        with process.client() as client:
            fitting = client.call("daemon.status")["max_connections"]
        assert 1 <= fitting < NOFILE
        assert (f"max_connections is 256 but the open-files limit ({NOFILE}"
                in process.log())
        refused = {"jsonrpc": "2.0", "id": None, "error": {
            "code": -32007, "message": "overloaded: too many connections; retry later",
            "data": {"limit": "max_connections", "max": fitting,
                     "fix": "retry after a moment with fewer requests"}}}
        subscribed: list[socket.socket] = []
        refusals = 0
        try:
            # Subscribers, so that none is dropped as idle: more than the process could hold.
            for _ in range(NOFILE * 2):
                conn = socket.socket(socket.AF_UNIX)
                conn.settimeout(10)
                conn.connect(str(process.socket))
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    # (a refused connection may be closed already: its answer is read below)
                    conn.sendall(b'{"jsonrpc":"2.0","id":1,"method":"events.subscribe",'
                                 b'"params":{"session_id":"nobody"}}\n')
                reply = json.loads(conn.makefile("rb").readline())
                if "result" in reply:
                    subscribed.append(conn)
                else:
                    assert reply == refused
                    refusals += 1
                    conn.close()
            assert (len(subscribed), refusals) == (fitting, NOFILE * 2 - fitting)
            assert process.proc is not None
            assert process.proc.poll() is None
            for conn in subscribed:  # the open connections still answer
                conn.sendall(b'{"jsonrpc":"2.0","id":2,"method":"daemon.ping"}\n')
                assert json.loads(conn.makefile("rb").readline())["result"]["pong"] is True
        finally:
            for conn in subscribed:
                conn.close()
        # Once they are gone, newcomers are served again.
        deadline = time.monotonic() + 10
        while True:
            try:
                with process.client(timeout=5) as client:
                    assert client.call("daemon.ping")["pong"] is True
                    break
            except (DaemonUnavailable, Overloaded, OSError):
                # Refused while the daemon has not yet seen every closed connection go: the
                # refusal answers the client's one request (docs/protocol.md, "Framing").
                assert time.monotonic() < deadline, "no new connection was served"
                time.sleep(0.05)
    finally:
        process.stop()


def test_sigterm_stops_the_daemon_while_a_worker_thread_is_stuck(daemon_root: Path) -> None:
    # Regression: a worker thread blocked in a system call (here the embedding of a memory,
    # whose endpoint holds the request; before, a read of a FIFO) held the shutdown until
    # the thread returned: "still running 32 s later".
    grace_s = 1.0
    with EmbeddingServer() as server:
        process = DaemonProcess(daemon_root, [
            "--memory-embedder", "http", "--memory-embedding-url", server.url,
            "--memory-embedding-model", "test-model", "--shutdown-timeout-s", str(grace_s)])
        process.start()
        with process.client() as client:
            client.call("session.open", {"session_id": "s"})
            appended = client.call("message.append", {"session_id": "s", "messages": [
                {"role": "user", "content": f"message {i}"} for i in range(50)]})
            assert [m["seq"] for m in appended["appended"]] == list(range(1, 51))
            server.delay_s, server.delay_when = 120.0, "held"
            client.submit("memory.record", {"title": "held", "content": "its embedding"})
            deadline = time.monotonic() + 30
            while not any("held" in text for r in server.requests
                          for text in r.body["input"]):
                assert time.monotonic() < deadline, "the embedding was never requested"
                time.sleep(0.01)
            # A worker thread now waits for the endpoint's answer (for 30 s at least).
            assert process.proc is not None
            process.proc.send_signal(signal.SIGTERM)
            # A guard, not a measure: without the fix this waits for the thread.
            assert process.proc.wait(grace_s + 10) == 0
        assert "ctxd stopped" in process.log()
        assert not process.socket.exists()
        server.delay_s = 0.0
        process.start()
        with process.client() as client:
            listed = client.call("message.list", {"session_id": "s", "limit": 100})
            assert [m["content"] for m in listed["messages"]] == [
                f"message {i}" for i in range(50)]
        assert process.stop() == 0

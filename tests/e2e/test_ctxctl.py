"""ctxctl against a real daemon: tables, --json, raw calls, stop, and no daemon at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import DaemonProcess


def ctxctl(socket: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160", **env}
    environ.pop("CTXD_SOCKET", None)
    return subprocess.run([sys.executable, "-m", "ctxclient.cli", "--socket", str(socket),
                           *args], capture_output=True, text=True, env=environ, timeout=60,
                          check=False)


def test_status_shows_daemon_and_sessions(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid, "project": "demo", "budget": {
            "context_window": 1100, "max_output_tokens": 100}})
        client.call("message.append", {"session_id": sid, "messages": [
            {"role": "user", "content": "hello" + " hello" * 699}]})  # 704 + 3 tokens
    result = ctxctl(shared_daemon.socket, "status")
    assert result.returncode == 0, result.stderr
    assert f"pid {shared_daemon.proc.pid}" in result.stdout  # type: ignore[union-attr]
    row = next(line for line in result.stdout.splitlines() if sid in line)
    for cell in ("demo", "707/1,000", "70.7%", "warn"):
        assert cell in row
    assert "\x1b[" not in result.stdout  # NO_COLOR


def test_json_output(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid, "project": "json-" + sid})
    status = json.loads(ctxctl(shared_daemon.socket, "status", "--json").stdout)
    assert status["daemon"]["pid"] == shared_daemon.proc.pid  # type: ignore[union-attr]
    assert sid in [s["session_id"] for s in status["sessions"]]
    listed = json.loads(ctxctl(shared_daemon.socket, "sessions", "--json",
                               "--project", "json-" + sid).stdout)
    assert [s["session_id"] for s in listed["sessions"]] == [sid]
    called = ctxctl(shared_daemon.socket, "call", "session.get", json.dumps({"session_id": sid}))
    assert json.loads(called.stdout)["session"]["project"] == "json-" + sid


def test_call_errors_exit_one_with_the_message(shared_daemon: DaemonProcess) -> None:
    result = ctxctl(shared_daemon.socket, "call", "session.get", '{"session_id": "nope"}')
    assert result.returncode == 1
    assert result.stderr.strip() == "ctxctl: error -32004: unknown session 'nope'"
    as_json = ctxctl(shared_daemon.socket, "--json", "call", "session.get",
                     '{"session_id": "nope"}')
    assert json.loads(as_json.stdout)["error"]["code"] == -32004
    bad = ctxctl(shared_daemon.socket, "call", "session.get", "{not json")
    assert bad.returncode == 2
    assert "PARAMS is not valid JSON" in bad.stderr


def test_an_impossible_socket_path_is_exit_two_with_json(tmp_path: Path) -> None:
    too_long = tmp_path / ("x" * 120) / "ctxd.sock"
    result = ctxctl(too_long, "--json", "status")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert json.loads(result.stdout)["error"]["data"] == {"socket": str(too_long)}


def test_no_daemon_is_exit_two(tmp_path: Path) -> None:
    for command in (["status"], ["sessions"], ["call", "daemon.ping"], ["stop"]):
        result = ctxctl(tmp_path / "none.sock", *command)
        assert result.returncode == 2
        assert result.stderr.startswith(f"ctxctl: no ctxd daemon is running on "
                                        f"{tmp_path / 'none.sock'}")


def test_stop(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root).start()
    result = ctxctl(process.socket, "stop", "--json")
    assert result.returncode == 0, result.stderr + process.log()
    assert json.loads(result.stdout) == {"stopped": True, "pid": process.proc.pid}  # type: ignore[union-attr]
    # "stopped" means exited, not merely no longer accepting connections.
    assert process.proc.poll() == 0  # type: ignore[union-attr]


def test_status_watch_refreshes_until_interrupted(shared_daemon: DaemonProcess,
                                                  sid: str) -> None:
    import signal
    import time

    environ = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}
    watch = subprocess.Popen(
        [sys.executable, "-m", "ctxclient.cli", "--socket", str(shared_daemon.socket),
         "status", "--watch", "--interval", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
    try:
        time.sleep(0.5)
        with shared_daemon.client() as client:  # opened after the watch started
            client.call("session.open", {"session_id": sid, "project": "watched"})
        time.sleep(0.5)
    finally:
        watch.send_signal(signal.SIGINT)
        out, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, err
    assert sid in out

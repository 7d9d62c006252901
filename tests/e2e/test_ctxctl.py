"""ctxctl against a real daemon: tables, --json, raw calls, branches, stop, and no daemon at
all."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from conftest import DaemonProcess

from ctxclient import Client


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
            branch = client.call("branch.create", {"session_id": sid, "budget": 500,
                                                   "description": "watched", "prompt": "go"})
        time.sleep(0.5)
    finally:
        watch.send_signal(signal.SIGINT)
        out, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, err
    assert sid in out
    assert f"{branch['budget_used']}/500" in row_of(out, sid, branch["branch_id"])


def row_of(output: str, *cells: str) -> str:
    """The one line of ``output`` that holds every cell."""
    [row] = [line for line in output.splitlines() if all(cell in line for cell in cells)]
    return row


def branch_row(output: str, branch_id: str) -> str:
    """The row of a branch in the `branches` table (not those of its children)."""
    [row] = [line for line in output.splitlines() if line.startswith(f"│ {branch_id} ")]
    return row


def seconds(duration: str) -> int:
    """A ``_duration`` cell (``4m59s``) back in seconds."""
    minutes, secs = re.fullmatch(r"(\d+)m(\d\d)s", duration).groups()  # type: ignore[union-attr]
    return int(minutes) * 60 + int(secs)


def branch_status(client: Client, branch_id: str) -> dict[str, Any]:
    branch: dict[str, Any] = client.call("branch.status", {"branch_id": branch_id})["branch"]
    return branch


def without_time_left(branch: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in branch.items() if key != "time_left_s"}


def test_status_without_live_branches(daemon: DaemonProcess, sid: str) -> None:
    with daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        branch = client.call("branch.create", {"session_id": sid, "description": "done soon",
                                               "prompt": "look"})
        client.call("branch.return", {"branch_id": branch["branch_id"], "message": "found"})
    result = ctxctl(daemon.socket, "status")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "no live branches"
    assert "live branches" not in result.stdout.replace("no live branches", "")
    assert json.loads(ctxctl(daemon.socket, "status", "--json").stdout)["live_branches"] == []


def test_status_shows_the_live_branches_of_every_open_session(daemon: DaemonProcess) -> None:
    # Brackets are text, not rich markup (an unmatched closing tag used to crash the table).
    description = "[/draft] survey every caller of render() before the refactor"
    with daemon.client() as client:
        for session_id in ("s_first", "s_idle", "s_second"):
            client.call("session.open", {"session_id": session_id, "title": f"[b]{session_id}"})
        first = client.call("branch.create", {"session_id": "s_first", "budget": 1000,
                                              "description": description, "prompt": "go"})
        appended = client.call("message.append", {
            "session_id": "s_first", "branch_id": first["branch_id"], "messages": [
                {"role": "assistant", "content": "reading render.py " * 20},
                {"role": "tool", "content": "def render(): ..." * 10, "tool_call_id": "c1"}]})
        second = client.call("branch.create", {"session_id": "s_second", "budget": 2000,
                                               "timeout_seconds": 120, "description": "probe",
                                               "prompt": "go"})
        # A returned branch is no longer live.
        done = client.call("branch.create", {"session_id": "s_idle", "description": "quick",
                                             "prompt": "go"})
        client.call("branch.return", {"branch_id": done["branch_id"], "message": "ok"})
        expected = [branch_status(client, first["branch_id"]),
                    branch_status(client, second["branch_id"])]
    assert expected[0]["budget_used"] == first["budget_used"] + appended["tokens_appended"]

    # --limit 1: the sessions after the first page are still searched for branches.
    snapshot = json.loads(ctxctl(daemon.socket, "status", "--json", "--limit", "1").stdout)
    assert [s["session_id"] for s in snapshot["sessions"]] == ["s_first"]
    assert snapshot["more_sessions"] is True
    # session.list counts a session's live branches; ctxctl asks only the sessions it
    # counts them in.
    assert [s["live_branches"] for s in snapshot["sessions"]] == [1]
    assert snapshot["daemon"]["live_branches"] == 2
    shown = snapshot["live_branches"]
    assert [without_time_left(b) for b in shown] == [without_time_left(b) for b in expected]
    assert [(b["session_id"], b["budget"], b["budget_used"]) for b in shown] == [
        ("s_first", 1000, expected[0]["budget_used"]),
        ("s_second", 2000, expected[1]["budget_used"])]
    assert 0 < shown[1]["time_left_s"] <= 120

    result = ctxctl(daemon.socket, "status")
    assert result.returncode == 0, result.stderr
    assert "no live branches" not in result.stdout
    assert "[b]s_idle" in row_of(result.stdout, "s_idle", "open")
    row = row_of(result.stdout, first["branch_id"])
    used = expected[0]["budget_used"]
    for cell in ("s_first", " 1 ", description[:39] + "…", f"{used}/1,000",
                 f"{used / 1000 * 100:.1f}%"):
        assert cell in row
    assert description[:40] not in row
    row = row_of(result.stdout, second["branch_id"])
    for cell in ("s_second", "probe", f"{expected[1]['budget_used']}/2,000"):
        assert cell in row
    assert 60 < seconds(row.split()[-2]) <= 120  # time left, of 120 s
    assert done["branch_id"] not in result.stdout


def test_branches_lists_every_branch_of_a_session(shared_daemon: DaemonProcess,
                                                  sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        outer = client.call("branch.create", {"session_id": sid, "budget": 1000,
                                              "description": "outer", "prompt": "go"})
        inner = client.call("branch.create", {"session_id": sid, "description": "inner",
                                              "prompt": "go deeper"})
        returned = client.call("branch.return", {"branch_id": inner["branch_id"],
                                                 "message": "the answer is 42"})
        side = client.call("branch.create", {"session_id": sid, "parent_branch_id": None,
                                             "description": "side", "prompt": "elsewhere"})
        listed = client.call("branch.list", {"session_id": sid})
        outer_now = branch_status(client, outer["branch_id"])
    assert [b["branch_id"] for b in listed["branches"]] == [
        outer["branch_id"], inner["branch_id"], side["branch_id"]]

    result = ctxctl(shared_daemon.socket, "branches", sid, TZ="UTC")
    assert result.returncode == 0, result.stderr
    assert f"branches of session {sid}  (3 in all: 2 active, 1 folded)" in result.stdout
    row = branch_row(result.stdout, outer["branch_id"])
    for cell in ("main", " 1 ", "active", f"{outer_now['budget_used']}/1,000", "outer"):
        assert cell in row
    left = re.search(r"│ (\S+) left", row)
    assert left is not None
    assert 0 < seconds(left[1]) <= 300
    row = branch_row(result.stdout, inner["branch_id"])
    summary = returned["summary"]
    returned_at = datetime.fromtimestamp(returned["folded_at"], UTC)
    for cell in (outer["branch_id"], " 2 ", "completed", f"{returned['tokens_used']}/8,192",
                 returned_at.strftime("%Y-%m-%d %H:%M:%S"),
                 f"{summary['tokens_folded']}/{summary['tokens_saved']}", "inner"):
        assert cell in row
    row = branch_row(result.stdout, side["branch_id"])
    assert "main" in row
    assert "active" in row

    as_json = json.loads(ctxctl(shared_daemon.socket, "branches", sid, "--json").stdout)
    assert [without_time_left(b) for b in as_json["branches"]] == [
        without_time_left(b) for b in listed["branches"]]
    assert (as_json["total"], as_json["active"], as_json["folded"]) == (3, 2, 1)


def test_branches_with_a_status(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        kept = client.call("branch.create", {"session_id": sid, "description": "kept",
                                             "prompt": "go"})
        folded = client.call("branch.create", {"session_id": sid, "description": "folded",
                                               "prompt": "go", "parent_branch_id": None})
        client.call("branch.return", {"branch_id": folded["branch_id"], "message": "done"})
    result = ctxctl(shared_daemon.socket, "branches", sid, "--status", "completed")
    assert result.returncode == 0, result.stderr
    assert f"completed branches of session {sid}" in result.stdout
    assert "completed" in branch_row(result.stdout, folded["branch_id"])
    assert kept["branch_id"] not in result.stdout
    as_json = json.loads(ctxctl(shared_daemon.socket, "branches", sid, "--json",
                                "--status", "active").stdout)
    assert [b["branch_id"] for b in as_json["branches"]] == [kept["branch_id"]]
    none = ctxctl(shared_daemon.socket, "branches", sid, "--status", "timeout")
    assert (none.returncode, none.stdout) == (0, f"no timeout branches in session {sid}\n")
    bad = ctxctl(shared_daemon.socket, "branches", sid, "--status", "returned")
    assert bad.returncode == 2
    assert "invalid choice: 'returned'" in bad.stderr


def test_branches_of_an_unknown_session_exit_one(shared_daemon: DaemonProcess,
                                                 sid: str) -> None:
    result = ctxctl(shared_daemon.socket, "branches", sid)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.strip() == f"ctxctl: error -32004: unknown session '{sid}'"
    as_json = ctxctl(shared_daemon.socket, "branches", sid, "--json")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["error"]["code"] == -32004
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
    empty = ctxctl(shared_daemon.socket, "branches", sid)
    assert (empty.returncode, empty.stdout) == (0, f"no branches in session {sid}\n")

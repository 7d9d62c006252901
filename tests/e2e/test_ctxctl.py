"""ctxctl against a real daemon: tables, --json, raw calls, branches, memories, stop, and no
daemon at all."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonProcess
from jsonrpc import NOT_FOUND_FIX
from tests_support import COUNTER, hello_text, needs, placed_by_others

from ctxclient import Client
from ctxclient._output import IDS_SHORTENED


def ctxctl(socket: Path, *args: str, stdin: str = "",
           **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160", **env}
    environ.pop("CTXD_SOCKET", None)
    return subprocess.run([sys.executable, "-m", "ctxclient.cli", "--socket", str(socket),
                           *args], capture_output=True, text=True, env=environ, timeout=60,
                          input=stdin, check=False)


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
    assert result.stderr == ("ctxctl: error -32004: unknown session 'nope'\n"
                             f"ctxctl: fix: {NOT_FOUND_FIX}\n")
    as_json = ctxctl(shared_daemon.socket, "--json", "call", "session.get",
                     '{"session_id": "nope"}')
    assert json.loads(as_json.stdout)["error"]["code"] == -32004
    bad = ctxctl(shared_daemon.socket, "call", "session.get", "{not json")
    assert bad.returncode == 2
    assert "PARAMS is not valid JSON" in bad.stderr


def test_call_sends_a_lone_surrogate_as_javascript_would(shared_daemon: DaemonProcess,
                                                        sid: str) -> None:
    """PARAMS with half an emoji (valid JSON; Python keeps it, UTF-8 cannot encode it) go
    as its escape and are stored with U+FFFD (docs/protocol.md, "Framing")."""
    params = json.dumps({"session_id": sid, "messages": [  # ensure_ascii: the escape
        {"role": "user", "content": "cut \ud83d here"}]})
    assert "\\ud83d" in params
    opened = ctxctl(shared_daemon.socket, "call", "session.open", json.dumps({"session_id": sid}))
    assert opened.returncode == 0, opened.stderr
    result = ctxctl(shared_daemon.socket, "call", "message.append", params)
    assert (result.returncode, result.stderr) == (0, "")
    with shared_daemon.client() as client:
        [message] = client.call("message.list", {"session_id": sid})["messages"]
    assert message["content"] == "cut \ufffd here"


def test_call_a_request_answered_with_id_null_exits_one(daemon_root: Path) -> None:
    """A line the daemon cannot read is answered with id null: that answers the call at
    once (exit 1 with the error), not after the client's timeout."""
    daemon = DaemonProcess(daemon_root, extra_args=["--max-request-bytes", "4096"])
    with daemon.running():
        result = ctxctl(daemon.socket, "call", "daemon.hello",
                        json.dumps({"client": "x" * 5000}))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        "ctxctl: error -32600: invalid request: line longer than max_request_bytes (4096); it "
        "was discarded\n"
        "ctxctl: fix: send smaller requests (split a large append into batches)\n")


def test_stop(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root).start()
    result = ctxctl(process.socket, "stop", "--json")
    assert result.returncode == 0, result.stderr + process.log()
    assert json.loads(result.stdout) == {"stopped": True, "pid": process.proc.pid}  # type: ignore[union-attr]
    # "stopped" means exited, not merely no longer accepting connections.
    assert process.proc.poll() == 0  # type: ignore[union-attr]


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Screen:
    """What a process writes to its stdout, read as it comes (in a thread of its own)."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.data = stream, b""
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while chunk := os.read(self.stream.fileno(), 65536):
            with self.changed:
                self.data += chunk
                self.changed.notify_all()
        with self.changed:
            self.stream = None
            self.changed.notify_all()

    def frame(self) -> str:
        """The last frame a live display drew (after its last erase), without styles."""
        return ANSI.sub("", self.data.decode(errors="replace").rsplit("\x1b[2K", 1)[-1])

    def wait_for(self, shown: Callable[[str], bool]) -> None:
        """Until the last frame satisfies ``shown`` (Timeout: 60 s, when it never does)."""
        with self.changed:
            assert self.changed.wait_for(lambda: shown(self.frame()) or self.stream is None,
                                         timeout=60), self.frame()
            assert shown(self.frame()), self.frame()


def test_status_watch_refreshes_until_interrupted(shared_daemon: DaemonProcess,
                                                  sid: str) -> None:
    # As on a terminal: the live display redraws each refresh (into a pipe, it would draw
    # only its last frame, at the end).
    environ = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160", "TTY_COMPATIBLE": "1",
               "TTY_INTERACTIVE": "1"}
    with subprocess.Popen(
            [sys.executable, "-m", "ctxclient.cli", "--socket", str(shared_daemon.socket),
             "status", "--watch", "--interval", "0.1", "--format", "table"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environ) as watch:
        screen = Screen(watch.stdout)
        try:
            # Its first frame (which names the socket).
            screen.wait_for(lambda frame: f"socket {shared_daemon.socket}" in frame)
            with shared_daemon.client() as client:  # opened after the watch started
                client.call("session.open", {"session_id": sid, "project": "watched"})
                branch = client.call("branch.create", {
                    "session_id": sid, "budget": 500, "description": "watched",
                    "prompt": "go"})
            screen.wait_for(lambda frame: f"{branch['budget_used']}/500" in frame)
        finally:
            watch.send_signal(signal.SIGINT)
            try:
                watch.wait(30)
            except subprocess.TimeoutExpired:
                watch.kill()  # else leaving the block would wait for it forever
                raise
            screen.thread.join(30)
        err = watch.stderr.read()  # type: ignore[union-attr]
    assert watch.returncode == 0, err
    assert sid in screen.frame()
    assert f"{branch['budget_used']}/500" in row_of(screen.frame(), sid,
                                                     branch["branch_id"])


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
    result = ctxctl(daemon.socket, "status", "--format", "table")
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

    result = ctxctl(daemon.socket, "status", "--format", "table")
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

    result = ctxctl(shared_daemon.socket, "branches", sid, "--format", "table", TZ="UTC")
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
    result = ctxctl(shared_daemon.socket, "branches", sid, "--status", "completed",
                    "--format", "table")
    assert result.returncode == 0, result.stderr
    assert f"completed branches of session {sid}" in result.stdout
    assert "completed" in branch_row(result.stdout, folded["branch_id"])
    assert kept["branch_id"] not in result.stdout
    as_json = json.loads(ctxctl(shared_daemon.socket, "branches", sid, "--json",
                                "--status", "active").stdout)
    assert [b["branch_id"] for b in as_json["branches"]] == [kept["branch_id"]]
    none = ctxctl(shared_daemon.socket, "branches", sid, "--status", "timeout")
    assert (none.returncode, none.stdout, none.stderr) == (
        0, "", f"no timeout branches in session {sid}\n")
    bad = ctxctl(shared_daemon.socket, "branches", sid, "--status", "returned")
    assert bad.returncode == 2
    assert bad.stderr.endswith(
        "argument --status: invalid choice: 'returned' (choose from active, completed, "
        "budget_exhausted, timeout, failed, discarded)\n")


def test_branches_of_an_unknown_session_exit_one(shared_daemon: DaemonProcess,
                                                 sid: str) -> None:
    result = ctxctl(shared_daemon.socket, "branches", sid)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.splitlines()[0] == f"ctxctl: error -32004: unknown session '{sid}'"
    as_json = ctxctl(shared_daemon.socket, "branches", sid, "--json")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["error"]["code"] == -32004
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
    empty = ctxctl(shared_daemon.socket, "branches", sid, "--format", "table")
    assert (empty.returncode, empty.stdout) == (0, f"no branches in session {sid}\n")


GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5" * 4
"""A credential the daemon scrubs from stored text (as ``[REDACTED:github_token]``)."""


def memory_row(output: str, memory_id: int) -> str:
    """The row of a memory in a `memory list` or `memory search` table."""
    [row] = [line for line in output.splitlines() if line.startswith(f"│ {memory_id:>2} │")]
    return row


def memory_ids(output: str) -> list[str]:
    """The id column of a `memory list` or `memory search` table."""
    return [line.split("│")[1].strip() for line in output.splitlines() if line.startswith("│")]


def test_memory_add_list_search_rate_rm(daemon: DaemonProcess) -> None:
    # Brackets are text, not rich markup (an unmatched closing tag would crash a table).
    title = "[/draft] pytest under trio"
    content = (f"Set trio_mode = true in [tool.pytest.ini_options]; the CI token "
               f"{GITHUB_TOKEN} is not needed.\n")
    scope = "project:demo"
    added = ctxctl(daemon.socket, "memory", "add", title, "-", "--scope", scope,
                   "--description", "async tests", "--tag", "pytest", "--tag", "[trio]",
                   stdin=content)
    assert (added.returncode, added.stdout, added.stderr) == (
        0, "memory 1 recorded in project:demo; 1 secret scrubbed\n", "")
    other = ctxctl(daemon.socket, "memory", "add", "flaky network", "retry the download twice",
                   "--outcome", "failure", "--json")
    assert other.returncode == 0, other.stderr
    recorded = json.loads(other.stdout)
    assert {key: recorded["memory"][key] for key in (
        "id", "scope", "title", "description", "content", "outcome", "tags", "confidence",
        "usage_count", "source")} == {
        "id": 2, "scope": "global", "title": "flaky network", "description": "",
        "content": "retry the download twice", "outcome": "failure", "tags": [],
        "confidence": 0.8, "usage_count": 0, "source": None}
    assert (recorded["secrets_scrubbed"], recorded["indexed"]) == (0, True)
    with daemon.client() as client:
        first = client.call("memory.get", {"id": 1})["memory"]
        listed = client.call("memory.list", {})
    stored = content.replace(GITHUB_TOKEN, "[REDACTED:github_token]")
    assert (first["title"], first["content"], first["description"], first["scope"],
            first["outcome"], first["tags"], first["confidence"]) == (
        title, stored, "async tests", scope, "success", ["pytest", "[trio]"], 0.8)

    shown = ctxctl(daemon.socket, "memory", "list", "--format", "table", COLUMNS="200")
    assert shown.returncode == 0, shown.stderr
    assert "\x1b[" not in shown.stdout  # NO_COLOR
    assert "more:" not in shown.stdout
    row = memory_row(shown.stdout, 1)
    shortened = " ".join(stored.split())[:59] + "…"
    for cell in (f"│ {scope} ", " 0.800 │", "│ success │", "│    0 │", "│ pytest [trio] ",
                 f"│ {title} ", f"│ {shortened} │"):
        assert cell in row
    assert GITHUB_TOKEN not in shown.stdout
    row = memory_row(shown.stdout, 2)
    for cell in ("│ global ", " 0.800 │", "│ failure │", "│ flaky network ",
                 "│ retry the download twice "):
        assert cell in row
    assert json.loads(ctxctl(daemon.socket, "memory", "list", "--json").stdout) == listed
    assert [m["id"] for m in listed["memories"]] == [1, 2]
    assert listed["next_cursor"] is None

    query = ["pytest trio mode", "--scope", scope]
    found = ctxctl(daemon.socket, "memory", "search", *query, "--json")
    assert found.returncode == 0, found.stderr
    with daemon.client() as client:
        direct = client.call("memory.search", {"query": "pytest trio mode", "scope": scope})
    assert json.loads(found.stdout) == direct
    assert (direct["mode"], direct["legs_used"], direct["note"]) == (
        "hybrid", ["dense", "lexical"], None)
    best = direct["results"][0]
    assert (best["id"], best["title"], best["scope"], best["content"], best["confidence"],
            best["legs"]) == (1, title, scope, stored, 0.8, ["dense", "lexical"])
    lexical = json.loads(ctxctl(daemon.socket, "memory", "search", *query, "--mode", "lexical",
                                "-k", "1", "--json").stdout)
    assert [(r["id"], r["legs"]) for r in lexical["results"]] == [(1, ["lexical"])]
    assert (lexical["mode"], lexical["legs_used"]) == ("lexical", ["lexical"])
    table = ctxctl(daemon.socket, "memory", "search", *query, "--format", "table", COLUMNS="200")
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith(
        f"{len(direct['results'])} found by hybrid search (legs: dense, lexical)")
    assert "note:" not in table.stdout
    row = memory_row(table.stdout, 1)
    for cell in (f"│ {best['score']:.4f} │", " 0.800 │", "│ dense+lexical ", f"│ {scope} ",
                 f"│ {title} ", f"│ {shortened} │"):
        assert cell in row
    confident = json.loads(ctxctl(daemon.socket, "memory", "search", *query, "--json",
                                  "--min-confidence", "0.81").stdout)
    assert confident["results"] == []

    # Beta(4, 1) is 0.8; helpful adds one to alpha: 5/6.
    rated = ctxctl(daemon.socket, "memory", "rate", "1", "--helpful")
    assert (rated.returncode, rated.stdout) == (0, "memory 1: confidence 0.833\n")
    with daemon.client() as client:
        assert client.call("memory.get", {"id": 1})["memory"]["confidence"] == 0.833333
    failed = json.loads(ctxctl(daemon.socket, "memory", "rate", "1", "--failed",
                               "--json").stdout)
    assert (failed["memory"]["id"], failed["memory"]["confidence"]) == (1, 0.714286)  # 5/7
    succeeded = json.loads(ctxctl(daemon.socket, "memory", "rate", "2", "--succeeded",
                                  "--json").stdout)
    assert succeeded["memory"]["confidence"] == 0.833333  # 5/6
    unhelpful = ctxctl(daemon.socket, "memory", "rate", "2", "--unhelpful")
    assert (unhelpful.returncode, unhelpful.stdout) == (0, "memory 2: confidence 0.714\n")
    after = json.loads(ctxctl(daemon.socket, "memory", "search", *query, "--json").stdout)
    assert after["results"][0]["confidence"] == 0.714286
    assert " 0.714 │" in memory_row(ctxctl(daemon.socket, "memory", "search", *query,
                                            "--format", "table", COLUMNS="200").stdout, 1)

    removed = ctxctl(daemon.socket, "memory", "rm", "1")
    assert (removed.returncode, removed.stdout) == (0, "memory 1 deleted\n")
    gone = json.loads(ctxctl(daemon.socket, "memory", "search", *query, "--json").stdout)
    assert 1 not in [r["id"] for r in gone["results"]]
    as_json = ctxctl(daemon.socket, "memory", "rm", "2", "--json")
    assert json.loads(as_json.stdout) == {"id": 2, "deleted": True}
    assert json.loads(ctxctl(daemon.socket, "memory", "list", "--json").stdout) == {
        "memories": [], "next_cursor": None}
    empty = ctxctl(daemon.socket, "memory", "list", "--format", "table")
    assert (empty.returncode, empty.stdout) == (0, "no memories\n")
    nothing = ctxctl(daemon.socket, "memory", "search", "pytest", "--format", "table")
    assert (nothing.returncode, nothing.stdout) == (0, "no memories found by hybrid search\n")
    # Plain output (piped) stays empty: the remark goes to standard error.
    plain = ctxctl(daemon.socket, "memory", "list")
    assert (plain.returncode, plain.stdout, plain.stderr) == (0, "", "no memories\n")
    # Ids are never given again: after 2, the newest, was removed, the next memory is 3.
    again = ctxctl(daemon.socket, "memory", "add", "flaky network", "retry twice", "--json")
    assert json.loads(again.stdout)["memory"]["id"] == 3


def test_memory_list_pages_and_scopes(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        for n, scope in enumerate(["global", "project:a", "project:b", "project:a", "global"]):
            client.call("memory.record", {"title": f"memory {n}", "content": f"text {n}",
                                          "scope": scope})
    first = ctxctl(daemon.socket, "memory", "list", "--limit", "2", "--format", "table")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-1] == (
        "(more: --all, --limit larger than 2, or --cursor 2)")
    assert memory_ids(first.stdout) == ["1", "2"]
    page = json.loads(ctxctl(daemon.socket, "memory", "list", "--limit", "2", "--json").stdout)
    assert ([m["id"] for m in page["memories"]], page["next_cursor"]) == ([1, 2], "2")
    # The next page from the cursor the last one gave; a cursor that is none is refused.
    then = json.loads(ctxctl(daemon.socket, "memory", "list", "--limit", "2", "--cursor",
                             page["next_cursor"], "--json").stdout)
    assert ([m["id"] for m in then["memories"]], then["next_cursor"]) == ([3, 4], "4")
    past = ctxctl(daemon.socket, "memory", "list", "--cursor", "5")
    assert (past.returncode, past.stdout, past.stderr) == (0, "", "no more memories\n")
    bad = ctxctl(daemon.socket, "memory", "list", "--cursor", "not a cursor")
    assert bad.returncode == 2
    assert "argument --cursor: invalid cursor 'not a cursor'" in bad.stderr
    every = json.loads(ctxctl(daemon.socket, "memory", "list", "--limit", "2", "--all",
                              "--json").stdout)
    assert ([m["id"] for m in every["memories"]], every["next_cursor"]) == ([1, 2, 3, 4, 5], None)
    default = json.loads(ctxctl(daemon.socket, "memory", "list", "--all", "--json").stdout)
    assert default == every
    # A project scope lists its own memories and the global ones.
    scoped = json.loads(ctxctl(daemon.socket, "memory", "list", "--scope", "project:a",
                               "--limit", "1", "--all", "--json").stdout)
    assert [(m["id"], m["scope"]) for m in scoped["memories"]] == [
        (1, "global"), (2, "project:a"), (4, "project:a"), (5, "global")]
    table = ctxctl(daemon.socket, "memory", "list", "--scope", "global", "--all",
                   "--format", "table")
    assert table.returncode == 0, table.stderr
    assert memory_ids(table.stdout) == ["1", "5"]
    assert "more:" not in table.stdout


def test_memory_errors(shared_daemon: DaemonProcess) -> None:
    socket = shared_daemon.socket
    for command in (["rate", "999999", "--helpful"], ["rate", "999999", "--succeeded"],
                    ["rm", "999999"], ["show", "999999"]):
        result = ctxctl(socket, "memory", *command)
        assert (result.returncode, result.stdout) == (1, ""), command
        assert result.stderr.splitlines()[0] == "ctxctl: error -32004: unknown memory 999999"
        as_json = ctxctl(socket, "memory", *command, "--json")
        assert as_json.returncode == 1
        assert json.loads(as_json.stdout)["error"]["code"] == -32004
    # What the command line refuses itself (exit 2, before any connection):
    # tests/unit/test_ctxctl_refusals.py.
    empty = ctxctl(socket, "memory", "add", "t", "-")
    assert (empty.returncode, empty.stdout, empty.stderr) == (
        2, "", "ctxctl: standard input is empty\n")
    with shared_daemon.client() as client:
        assert client.call("memory.list", {})["memories"] == []


def test_memory_add_refuses_stdin_that_is_not_utf8(shared_daemon: DaemonProcess) -> None:
    environ = {**os.environ, "NO_COLOR": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "ctxclient.cli", "--socket", str(shared_daemon.socket),
         "memory", "add", "binary", "-"], input=b"\xff\xfe not text", capture_output=True,
        env=environ, timeout=60, check=False)
    assert (result.returncode, result.stdout) == (2, b"")
    assert result.stderr.startswith(b"ctxctl: standard input is not UTF-8 text: ")
    with shared_daemon.client() as client:
        assert client.call("memory.list", {})["memories"] == []


def test_memory_search_shows_the_note_of_a_missing_dense_leg(daemon_root: Path) -> None:
    config = daemon_root / "config" / "ctxd" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'[memory]\nembedder = "sentence-transformers"\n'
                      f'model_path = "{daemon_root / "no-such-model"}"\n')
    process = DaemonProcess(daemon_root).start()
    try:
        added = ctxctl(process.socket, "memory", "add", "pytest under trio", "trio_mode = true")
        # Piped: the remark goes to standard error, the result alone to standard output.
        assert (added.returncode, added.stdout, added.stderr) == (
            0, "memory 1 recorded in global\n", "not in the dense index yet (it is not "
                                                 "ready); lexical search finds it\n")
        as_json = json.loads(ctxctl(process.socket, "memory", "search", "pytest",
                                    "--json").stdout)
        assert [(r["id"], r["legs"]) for r in as_json["results"]] == [(1, ["lexical"])]
        assert (as_json["mode"], as_json["legs_used"]) == ("hybrid", ["lexical"])
        note = as_json["note"]
        assert note.startswith("dense leg unavailable (the embedder is unavailable: ")
        assert note.endswith("); lexical results only")
        shown = ctxctl(process.socket, "memory", "search", "pytest", "--format", "table",
                       COLUMNS="1000")
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith("1 found by hybrid search (legs: lexical)")
        assert shown.stdout.splitlines()[-1] == f"note: {note}"
        nothing = ctxctl(process.socket, "memory", "search", "zebra", "--format", "table",
                         COLUMNS="1000")
        assert (nothing.returncode, nothing.stdout) == (
            0, f"no memories found by hybrid search\nnote: {note}\n")
    finally:
        process.stop()


# ---- output formats ------------------------------------------------------------------

def in_terminal(socket: Path, *args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    """ctxctl with a terminal of ``columns`` as its standard output (a pseudo-terminal)."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    environ = {**os.environ, "NO_COLOR": "1", "COLUMNS": str(columns), "TERM": "xterm"}
    environ.pop("CTXD_SOCKET", None)
    with subprocess.Popen([sys.executable, "-m", "ctxclient.cli", "--socket", str(socket),
                           *args], stdin=subprocess.DEVNULL, stdout=terminal,
                          stderr=subprocess.PIPE, env=environ, text=True) as proc:
        os.close(terminal)
        chunks = []
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the terminal's other side closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(controller)
        stderr = proc.stderr.read()  # type: ignore[union-attr]
        returncode = proc.wait(60)
    # NO_COLOR leaves bold, italic and cursor moves: strip them, so cells can be compared.
    stdout = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode().replace("\r\n", "\n"))
    return subprocess.CompletedProcess(proc.args, returncode, stdout, stderr)


def test_piped_sessions_are_plain_rows(shared_daemon: DaemonProcess, sid: str) -> None:
    project = "plain-" + sid
    with shared_daemon.client() as client:
        opened = [client.call("session.open", {"project": project, "title": f"title {n}"})[
            "session"]["session_id"] for n in range(3)]
        client.call("session.close", {"session_id": opened[2]})
    result = ctxctl(shared_daemon.socket, "sessions", "--project", project)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["SESSION", *opened]
    assert lines[0].split() == ["SESSION", "PROJECT", "TITLE", "STATE", "MSGS", "TOKENS",
                                "USAGE", "HEALTH"]
    assert [line.split() for line in lines[1:]] == [
        [session, project, "title", str(n), state, "0", "0/191,808", "0.0%", "ok"]
        for n, (session, state) in enumerate(zip(opened, ["open", "open", "closed"],
                                                 strict=True))]
    assert len([line for line in lines if " open " in line]) == 2  # `grep -c ' open '`
    assert not set("│┃━─") & set(result.stdout)
    bare = ctxctl(shared_daemon.socket, "sessions", "--project", project, "--no-headers")
    assert [line.split() for line in bare.stdout.splitlines()] == [
        line.split() for line in lines[1:]]
    tsv = ctxctl(shared_daemon.socket, "sessions", "--project", project, "--format", "tsv",
                 "--no-headers")
    assert tsv.stdout.splitlines() == [
        f"{session}\t{project}\ttitle {n}\t{state}\t0\t0/191,808\t0.0%\tok"
        for n, (session, state) in enumerate(zip(opened, ["open", "open", "closed"],
                                                 strict=True))]
    assert json.loads(ctxctl(shared_daemon.socket, "sessions", "--project", project,
                             "--format", "json").stdout) == json.loads(ctxctl(
        shared_daemon.socket, "sessions", "--project", project, "--json").stdout)


def test_tables_fit_80_columns_and_never_cut_ids_or_states(shared_daemon: DaemonProcess,
                                                           sid: str) -> None:
    """At 80 columns a session shows its id, state, tokens, usage and health; an agent's
    id longer than ctxd's own (Claude Code's UUID) is shortened in the table only."""
    project = "wide-" + sid
    claude = str(uuid.uuid4())
    with shared_daemon.client() as client:
        opened = [client.call("session.open", {
            "project": project, "title": "a title long enough to need wrapping " * 2})[
            "session"]["session_id"] for _ in range(2)]
        client.call("session.open", {"session_id": claude, "project": project})
        client.call("message.append", {"session_id": claude, "messages": [
            {"role": "user", "content": "hello " * 100}]})
        claude_state = client.call("session.get", {"session_id": claude})["context_state"]
        client.call("session.open", {"session_id": sid})
        outer = client.call("branch.create", {"session_id": sid, "description": "outer " * 20,
                                              "prompt": "go"})
        inner = client.call("branch.create", {"session_id": sid, "description": "inner",
                                              "prompt": "go"})
        client.call("branch.return", {"branch_id": inner["branch_id"], "message": "done"})
    sessions = in_terminal(shared_daemon.socket, "sessions", "--project", project)
    assert sessions.returncode == 0, sessions.stderr
    assert max(len(line) for line in sessions.stdout.splitlines()) <= 80
    rows = [line for line in sessions.stdout.splitlines() if "ses_" in line]
    assert [row.split("│")[1].strip() for row in rows] == opened
    header = next(line for line in sessions.stdout.splitlines() if "┃" in line)
    assert [cell.strip() for cell in header.split("┃")[1:-1]] == [
        "session", "state", "tokens", "usage", "health"]
    for row in rows:
        assert [cell.strip() for cell in row.split("│")[2:3]] == ["open"]
    [long_row] = [line for line in sessions.stdout.splitlines() if claude[:19] in line]
    assert [cell.strip() for cell in long_row.split("│")[1:4]] == [
        claude[:19] + "…", "open",
        f"{claude_state['main_thread_tokens']:,}/{claude_state['effective_window']:,}"]
    assert long_row.split("│")[4].strip().endswith(f"{claude_state['usage'] * 100:.1f}%")
    assert sessions.stdout.splitlines()[-1] == (
        IDS_SHORTENED)
    status = in_terminal(shared_daemon.socket, "status", "--limit", "1000")
    assert max(len(line) for line in status.stdout.splitlines()) <= 80
    assert claude[:19] + "…" in status.stdout
    assert status.stdout.splitlines()[-1] == (
        IDS_SHORTENED)
    plain = ctxctl(shared_daemon.socket, "sessions", "--project", project)
    assert sorted(line.split()[0] for line in plain.stdout.splitlines()[1:]) == sorted(
        [*opened, claude])
    # The id as the table shows it is taken by the commands, as docker takes a short id.
    shown = ctxctl(shared_daemon.socket, "session", "show", claude[:19] + "…")
    assert (shown.returncode, shown.stdout.splitlines()[0].split()) == (0, ["session", claude])
    branches = in_terminal(shared_daemon.socket, "branches", sid)
    assert branches.returncode == 0, branches.stderr
    assert max(len(line) for line in branches.stdout.splitlines()) <= 80
    row = branch_row(branches.stdout, inner["branch_id"])
    assert [cell.strip() for cell in row.split("│")[1:4]] == [
        inner["branch_id"], outer["branch_id"], "completed"]
    assert "active" in branch_row(branches.stdout, outer["branch_id"])
    # Wide enough, every column is there.
    wide = in_terminal(shared_daemon.socket, "branches", sid, columns=200)
    header = next(line for line in wide.stdout.splitlines() if "┃" in line)
    assert [cell.strip() for cell in header.split("┃")[1:-1]] == [
        "branch", "parent", "depth", "status", "budget", "left/returned", "folded/saved",
        "description"]


# ---- status --watch ------------------------------------------------------------------

def watch(socket: Path, *args: str) -> subprocess.Popen[str]:
    environ = {**os.environ, "NO_COLOR": "1"}
    environ.pop("CTXD_SOCKET", None)
    return subprocess.Popen([sys.executable, "-m", "ctxclient.cli", "--socket", str(socket),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=environ)


def test_status_watch_json_streams_one_object_a_line(shared_daemon: DaemonProcess,
                                                     sid: str) -> None:
    stream = watch(shared_daemon.socket, "status", "--watch", "--json", "--interval", "0.1")
    try:
        assert stream.stdout is not None
        first = json.loads(stream.stdout.readline())
        with shared_daemon.client() as client:
            client.call("session.open", {"session_id": sid})
        while True:  # every line is one whole snapshot, until the new session shows
            snapshot = json.loads(stream.stdout.readline())
            assert set(snapshot) == {"daemon", "sessions", "more_sessions", "live_branches",
                                         "usage"}
            if sid in [s["session_id"] for s in snapshot["sessions"]]:
                break
    finally:
        stream.send_signal(signal.SIGINT)
        stream.communicate(timeout=30)
    assert first["daemon"]["pid"] == shared_daemon.proc.pid  # type: ignore[union-attr]
    assert stream.returncode == 0


def test_status_watch_plain_prints_one_snapshot_after_another(
        shared_daemon: DaemonProcess) -> None:
    stream = watch(shared_daemon.socket, "status", "--watch", "--interval", "0.1")
    try:
        assert stream.stdout is not None
        daemon_lines = [stream.stdout.readline() for _ in range(30)]
    finally:
        stream.send_signal(signal.SIGINT)
        stream.communicate(timeout=30)
    assert stream.returncode == 0
    assert len([line for line in daemon_lines if line.startswith("ctxd 0.1.0 pid ")]) >= 2


# ---- call, stop, version, completion -------------------------------------------------

def test_call_reads_params_from_standard_input(shared_daemon: DaemonProcess, sid: str) -> None:
    opened = ctxctl(shared_daemon.socket, "call", "session.open", "-",
                    stdin=json.dumps({"session_id": sid, "project": "from-stdin"}))
    assert opened.returncode == 0, opened.stderr
    assert json.loads(opened.stdout)["session"]["project"] == "from-stdin"
    bad = ctxctl(shared_daemon.socket, "call", "session.open", "-", stdin="{nope")
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr.startswith("ctxctl: standard input is not valid JSON: ")


def test_an_unknown_method_gets_a_suggestion(shared_daemon: DaemonProcess) -> None:
    result = ctxctl(shared_daemon.socket, "call", "session.opne", "{}")
    assert (result.returncode, result.stdout, result.stderr) == (
        1, "", "ctxctl: error -32601: method not found: 'session.opne'\n"
               "ctxctl: fix: did you mean session.open?\n")
    as_json = json.loads(ctxctl(shared_daemon.socket, "call", "session.opne", "--json").stdout)
    data = as_json["error"]["data"]
    assert (data["suggestion"], data["fix"]) == ("session.open", "did you mean session.open?")
    assert "session.open" in data["available"]
    far = ctxctl(shared_daemon.socket, "call", "zzz")
    assert far.returncode == 1
    assert far.stderr.splitlines() == [
        "ctxctl: error -32601: method not found: 'zzz'",
        f"ctxctl: the daemon's methods: {', '.join(data['available'])}"]


def test_completion_scripts(tmp_path: Path) -> None:
    bash = ctxctl(tmp_path / "none.sock", "completion", "bash")
    assert bash.returncode == 0, bash.stderr
    # Sourced by bash, the script completes ctxctl's commands and a command's own commands.
    probe = bash.stdout + textwrap.dedent("""
        complete -p ctxctl
        for line in "ctxctl mem" "ctxctl memory re" "ctxctl sessions --st" \
                    "ctxctl session o" "ctxctl session open --pro"; do
            read -ra COMP_WORDS <<< "$line"
            COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
            COMP_LINE=$line COMP_POINT=${#line}
            "$(complete -p ctxctl | sed -E 's/.*-F ([^ ]+).*/\\1/')" ctxctl
            echo "${COMPREPLY[*]}"
        done
    """)
    completed = subprocess.run(["bash", "-c", probe], capture_output=True, text=True,
                               timeout=60, check=False)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[0].startswith("complete ")
    assert lines[0].endswith(" ctxctl")
    assert lines[1:] == ["memory", "reindex", "--state", "open", "--project"]
    unknown = ctxctl(tmp_path / "none.sock", "completion", "tcsh")
    assert unknown.returncode == 2
    assert "invalid choice: 'tcsh' (choose from bash, zsh, fish)" in unknown.stderr


@pytest.mark.parametrize("check", [pytest.param(["zsh", "-n"], marks=needs("zsh")),
                                   pytest.param(["fish", "--no-execute"], marks=needs("fish"))],
                         ids=["zsh", "fish"])
def test_zsh_and_fish_completion_scripts_parse(tmp_path: Path, check: list[str]) -> None:
    script = ctxctl(tmp_path / "none.sock", "completion", check[0])
    assert script.returncode == 0, script.stderr
    assert "reindex" in script.stdout
    path = tmp_path / f"ctxctl.{check[0]}"
    path.write_text(script.stdout)
    syntax = subprocess.run([*check, str(path)], capture_output=True, text=True, timeout=60,
                            check=False)
    assert (syntax.returncode, syntax.stderr) == (0, "")


# ---- session, events, memory show and reindex ----------------------------------------

def utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def test_session_open_and_the_hints_name_ctxctl_commands(shared_daemon: DaemonProcess,
                                                         sid: str) -> None:
    """A hint names what to type at ctxctl, not the daemon's method (`session.open`), and
    what it names exists: ``ctxctl session open``."""
    unknown = ctxctl(shared_daemon.socket, "session", "show", sid)
    assert (unknown.returncode, unknown.stdout, unknown.stderr) == (
        1, "", f"ctxctl: error -32004: unknown session '{sid}'\n"
               "ctxctl: fix: check its id (`ctxctl sessions` lists them), or open it with "
               f"`ctxctl session open {sid}`\n")
    opened = ctxctl(shared_daemon.socket, "session", "open", sid, "--project", "demo",
                    "--title", "a try")
    assert (opened.returncode, opened.stdout, opened.stderr) == (
        0, f"session {sid} opened\n", "")
    with shared_daemon.client() as client:
        session = client.call("session.get", {"session_id": sid})["session"]
        assert (session["project"], session["title"], session["state"]) == (
            "demo", "a try", "open")
        client.call("message.append", {"session_id": sid, "messages": [
            {"role": "user", "content": "hello"}]})
    assert ctxctl(shared_daemon.socket, "session", "close", sid).returncode == 0
    closed = ctxctl(shared_daemon.socket, "inject", sid, "hello")
    assert (closed.returncode, closed.stderr) == (
        1, f"ctxctl: error -32003: session '{sid}' is closed\n"
           f"ctxctl: fix: reopen it with `ctxctl session open {sid}` or start a new session\n")
    again = ctxctl(shared_daemon.socket, "session", "open", sid, "--json")
    assert json.loads(again.stdout)["created"] is False
    assert json.loads(again.stdout)["session"]["state"] == "open"
    assert ctxctl(shared_daemon.socket, "session", "open", sid).stdout == (
        f"session {sid} is open (1 message)\n")
    missing = ctxctl(shared_daemon.socket, "memory", "rm", "987654")
    assert missing.stderr.splitlines()[-1] == (
        "ctxctl: fix: list memories with `ctxctl memory list` or find them with "
        "`ctxctl memory search QUERY`")
    as_json = ctxctl(shared_daemon.socket, "memory", "rm", "987654", "--json")
    assert json.loads(as_json.stdout)["error"]["data"]["fix"] == (  # the daemon's, as it is
        "list memories with memory.list or find them with memory.search")


def test_a_shortened_id_that_names_no_session_or_several_is_refused(
        shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        for suffix in ("a", "b"):
            client.call("session.open", {"session_id": f"{sid}-{suffix}"})
    several = ctxctl(shared_daemon.socket, "branches", sid + "…")
    assert (several.returncode, several.stdout, several.stderr) == (
        1, "", f"ctxctl: 2 sessions' ids start with '{sid}' ({sid}-a, {sid}-b); give more of "
               "the id\n")
    none = ctxctl(shared_daemon.socket, "tools", sid + "-c…")
    assert (none.returncode, none.stderr) == (
        1, f"ctxctl: no session's id starts with '{sid}-c'\n")
    one = ctxctl(shared_daemon.socket, "session", "close", sid + "-b…")
    assert (one.returncode, one.stdout) == (0, f"session {sid}-b closed\n")
    refused = ctxctl(shared_daemon.socket, "session", "open", sid + "-c…")
    assert refused.returncode == 2
    assert refused.stderr.endswith(f"invalid session id '{sid}-c…': use 1-128 of A-Z a-z 0-9 "
                                   ". _ : - (first alphanumeric)\n")


def test_session_show_render_messages_close_delete(shared_daemon: DaemonProcess,
                                                   sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid, "project": "demo", "budget": {
            "context_window": 2000, "max_output_tokens": 500, "warn": 0.5, "caution": 0.6}})
        client.call("message.append", {"session_id": sid, "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": hello_text(20)}]})
        info = client.call("session.get", {"session_id": sid})
        rendered = client.call("ctxd.render", {"session_id": sid})
        stored = client.call("message.list", {"session_id": sid})["messages"]
    session, state = info["session"], info["context_state"]
    shown = ctxctl(shared_daemon.socket, "session", "show", sid, TZ="UTC")
    assert shown.returncode == 0, shown.stderr
    assert [line.split(None, 1) for line in shown.stdout.splitlines()] == [
        ["session", sid], ["project", "demo"], ["title", "-"], ["state", "open"],
        ["messages", "2"],
        ["tokens", f"{state['main_thread_tokens']} in the main thread as sent, 0 in live "
                   "branches, 0 folded away"],
        ["window", "1,500 (2,000 less 500 for the reply)"],
        ["usage", f"{state['usage'] * 100:.1f}% ({state['health']})"],
        ["thresholds", "warn 50.0%, caution 60.0%, compact 95.0%, hard block 98.0%"],
        ["branch", "main"], ["live", "branches  0"],
        ["created", utc(session["created_at"])], ["updated", utc(session["updated_at"])],
        ["closed", "-"]]
    assert json.loads(ctxctl(shared_daemon.socket, "session", "show", sid, "--json").stdout
                      ) == info

    render = ctxctl(shared_daemon.socket, "session", "render", sid)
    assert (render.returncode, render.stdout, render.stderr) == (
        0, f"[system]\nBe brief.\n\n[user]\n{hello_text(20)}\n",
        f"(2 messages, {rendered['tokens']} tokens of 1,500: "
        f"{rendered['context_state']['usage'] * 100:.1f}%, ok)\n")
    assert json.loads(ctxctl(shared_daemon.socket, "session", "render", sid, "--json").stdout
                      ) == rendered

    messages = ctxctl(shared_daemon.socket, "session", "messages", sid, "--format", "tsv")
    assert messages.stdout.splitlines() == [
        "seq\trole\tcomponent\ttokens\tbranch\tcontent",
        *(f"{m['seq']}\t{m['role']}\t{m['component']}\t{m['tokens']}\tmain\t{m['content']}"
          for m in stored)]
    assert [m["role"] for m in stored] == ["system", "user"]
    page = ctxctl(shared_daemon.socket, "session", "messages", sid, "--limit", "1",
                  "--no-headers")
    assert (page.stdout.split(), page.stderr) == (
        ["1", "system", stored[0]["component"], str(stored[0]["tokens"]), "main", "Be",
         "brief."], "(more: --all, --limit larger than 1, or --cursor 1)\n")
    rest = ctxctl(shared_daemon.socket, "session", "messages", sid, "--cursor", "1", "--json")
    assert [m["seq"] for m in json.loads(rest.stdout)["messages"]] == [2]

    with shared_daemon.client() as client:  # a live branch's own tokens are counted apart
        branch = client.call("branch.create", {"session_id": sid, "description": "look",
                                               "prompt": "look around", "budget": 900})
        client.call("message.append", {"session_id": sid, "branch_id": branch["branch_id"],
                                       "messages": [{"role": "user", "content": "x " * 30}]})
        live = client.call("branch.status", {"branch_id": branch["branch_id"]})["branch"]
        state = client.call("session.get", {"session_id": sid})["context_state"]
        during = ctxctl(shared_daemon.socket, "session", "show", sid)
        client.call("branch.return", {"branch_id": branch["branch_id"], "message": "ok"})
        after = client.call("session.get", {"session_id": sid})["context_state"]
    assert live["budget_used"] > 0
    assert state["total_tokens"] == state["main_thread_tokens"] - 3 + live["budget_used"]
    assert during.stdout.splitlines()[5].split(None, 1) == [
        "tokens", f"{state['main_thread_tokens']} in the main thread as sent, "
                  f"{live['budget_used']} in live branches, 0 folded away"]
    assert after["folded_tokens"] > 0
    assert ctxctl(shared_daemon.socket, "session", "show", sid).stdout.splitlines()[5].split(
        None, 1) == ["tokens", f"{after['main_thread_tokens']} in the main thread as sent, 0 in "
                               f"live branches, {after['folded_tokens']} folded away"]

    closed = ctxctl(shared_daemon.socket, "session", "close", sid)
    assert (closed.returncode, closed.stdout) == (0, f"session {sid} closed\n")
    deleted = ctxctl(shared_daemon.socket, "session", "delete", sid)
    assert (deleted.returncode, deleted.stdout) == (  # the branch's 3 and the return's note
        0, f"session {sid} deleted (6 messages)\n")
    gone = ctxctl(shared_daemon.socket, "session", "show", sid)
    assert (gone.returncode, gone.stderr.splitlines()[0]) == (
        1, f"ctxctl: error -32004: unknown session '{sid}'")
    bad = ctxctl(shared_daemon.socket, "session", "show", "two words")
    assert bad.returncode == 2
    assert bad.stderr.endswith("error: argument ID: invalid session id 'two words': use 1-128 "
                               "of A-Z a-z 0-9 . _ : - (first alphanumeric)\n")


def test_events_follow_until_interrupted(shared_daemon: DaemonProcess, sid: str) -> None:
    as_json = watch(shared_daemon.socket, "events", "-f", "--json", "--session", sid)
    plain = watch(shared_daemon.socket, "events", "-f", "--session", sid,
                  "--type", "session.closed")
    try:
        with shared_daemon.client() as client:
            before = client.call("daemon.status")["subscribers"]
            while client.call("daemon.status")["subscribers"] < before + 2:
                pass  # both have subscribed
            client.call("session.open", {"session_id": sid})
            client.call("session.close", {"session_id": sid})
        assert as_json.stdout is not None
        assert plain.stdout is not None
        first = json.loads(as_json.stdout.readline())
        second = json.loads(as_json.stdout.readline())
        line = plain.stdout.readline().rstrip("\n")
    finally:
        for stream in (as_json, plain):
            stream.send_signal(signal.SIGINT)
            stream.communicate(timeout=30)
    assert (as_json.returncode, plain.returncode) == (0, 0)
    assert (first["session_id"], second["type"], second["seq"]) == (
        sid, "session.closed", first["seq"] + 1)
    when, seq, kind, session, data = line.split("  ")
    assert (kind, session) == ("session.closed", sid)
    assert json.loads(data) == {"message_count": 0, "total_tokens": 0}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}", when)
    assert int(seq) > 0


def test_events_end_when_the_daemon_goes(daemon: DaemonProcess) -> None:
    stream = watch(daemon.socket, "events", "-f")
    with daemon.client() as client:
        while client.call("daemon.status")["subscribers"] == 0:
            pass
    daemon.stop()
    out, err = stream.communicate(timeout=30)
    assert (stream.returncode, out) == (2, "")
    assert err.startswith(f"ctxctl: no ctxd daemon is running on {daemon.socket} (the daemon "
                          "closed the connection)")


def test_memory_show_and_reindex(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        for title in ("first", "second"):
            client.call("memory.record", {"title": title, "content": f"{title} line\nmore",
                                          "tags": ["a", "b"], "scope": "project:x"})
        memory = client.call("memory.get", {"id": 2})["memory"]
    shown = ctxctl(daemon.socket, "memory", "show", "2", "--format", "tsv", TZ="UTC")
    assert shown.stdout.splitlines() == [
        "id\t2", "scope\tproject:x", "title\tsecond", "description\t", "outcome\tsuccess",
        "tags\ta b", "confidence\t0.800", "uses\t0", "source\t",
        f"created\t{utc(memory['created_at'])}", f"updated\t{utc(memory['updated_at'])}",
        "content\tsecond line\\nmore"]
    assert json.loads(ctxctl(daemon.socket, "memory", "show", "2", "--json").stdout) == {
        "memory": memory}
    rebuilt = ctxctl(daemon.socket, "memory", "reindex")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert re.fullmatch(r"memory index ready: 2 vectors, 2 memories \(hashing-v1-1024\); "
                        r"rebuilt in \d+\.\d s\n", rebuilt.stdout)
    index = json.loads(ctxctl(daemon.socket, "memory", "reindex", "--json").stdout)
    assert (index["state"], index["vectors"], index["memories"]) == ("ready", 2, 2)
    # On a terminal a spinner runs while it rebuilds, then the same line is left.
    terminal = in_terminal(daemon.socket, "memory", "reindex")
    assert terminal.returncode == 0, terminal.stderr
    assert terminal.stdout.strip().splitlines()[-1].startswith(
        "memory index ready: 2 vectors, 2 memories (hashing-v1-1024); rebuilt in ")


def test_result_pages_and_greps_an_offloaded_tool_result(shared_daemon: DaemonProcess,
                                                         sid: str) -> None:
    text = "".join(f"line {i} {'ERROR disk' if i % 50 == 0 else 'ok'} ü\n"
                   for i in range(1, 1001))
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        client.call("message.append", {"session_id": sid, "messages": [
            {"role": "tool", "name": "bash", "tool_call_id": "c1", "content": text}]})
        ref = client.call("message.list", {"session_id": sid})["messages"][0]["ref_id"]
    page = ctxctl(shared_daemon.socket, "result", ref, "--session", sid, "--offset", "10",
                  "--limit", "100")
    assert (page.returncode, page.stdout) == (0, text[10:110])
    assert page.stderr == f"(characters 10 to 110 of {len(text):,}: --offset 110 for more)\n"
    whole = ctxctl(shared_daemon.socket, "result", ref, "--session", sid, "--limit", "1000000")
    assert (whole.returncode, whole.stdout, whole.stderr) == (0, text, "")
    found = ctxctl(shared_daemon.socket, "result", ref, "--session", sid, "--grep",
                   r"ERROR \w+", "--max-matches", "3")
    assert (found.returncode, found.stdout, found.stderr) == (
        0, "50:line 50 ERROR disk ü\n100:line 100 ERROR disk ü\n150:line 150 ERROR disk ü\n",
        "(17 more matching lines: --max-matches)\n")
    none = ctxctl(shared_daemon.socket, "result", ref, "--session", sid, "--grep", "ERROR (",
                  "-F")
    assert (none.returncode, none.stdout, none.stderr) == (1, "", "")
    bad = ctxctl(shared_daemon.socket, "result", ref, "--session", sid, "--grep", "ERROR (")
    assert (bad.returncode, bad.stdout, bad.stderr) == (
        1, "", "ctxctl: error -32602: invalid params: not a valid regular expression "
               "(missing ) at position 7); fix it, or add -F to search for the text as it "
               "is (at $.pattern)\n")
    both = ctxctl(shared_daemon.socket, "result", ref, "--session", sid, "--grep", "x",
                  "--offset", "5")
    assert (both.returncode, both.stderr) == (
        2, "ctxctl: --grep searches the whole result: leave out --offset and --limit\n")
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid + "x"})
    other = ctxctl(shared_daemon.socket, "result", ref, "--session", sid + "x")
    assert (other.returncode, other.stderr.splitlines()[0]) == (
        1, f"ctxctl: error -32004: unknown ref '{ref}'")


def test_result_finds_the_session_from_the_ref_alone(shared_daemon: DaemonProcess,
                                                     sid: str) -> None:
    """What a stub tells an agent without ctxd's tools to run: the ref is enough."""
    text = "".join(f"row {i}\n" for i in range(2000))
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        appended = client.call("message.append", {"session_id": sid, "messages": [
            {"role": "tool", "name": "bash", "tool_call_id": "c1", "content": text}]})
    [entry] = appended["appended"]
    ref = entry["ref_id"]
    assert entry["stub"].endswith(f'Use read_result with ref_id="{ref}" (or run: ctxctl '
                                  f"result {ref}) to read more.")
    whole = ctxctl(shared_daemon.socket, "result", ref, "--limit", "1000000")
    assert (whole.returncode, whole.stdout, whole.stderr) == (0, text, "")
    found = ctxctl(shared_daemon.socket, "result", ref, "--grep", "^row 1999$")
    assert (found.returncode, found.stdout, found.stderr) == (0, "2000:row 1999\n", "")
    missing = "res_" + "0" * 16
    unknown = ctxctl(shared_daemon.socket, "result", missing)
    assert (unknown.returncode, unknown.stdout, unknown.stderr) == (
        1, "", f"ctxctl: error -32004: unknown ref '{missing}'\n"
               "ctxctl: fix: use a ref_id from a stub that ctxd wrote\n")
    bad = ctxctl(shared_daemon.socket, "result", "res_12")
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr.splitlines()[-1].startswith("ctxctl result: error: argument REF: "
                                                  "invalid ref id 'res_12'")


def test_result_grep_exits_one_when_nothing_matched_with_json_too(
        shared_daemon: DaemonProcess, sid: str) -> None:
    """As ctxctl(1) says: exit status 1 means none matched (--json printed the answer and
    exited 0)."""
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        client.call("message.append", {"session_id": sid, "messages": [
            {"role": "tool", "name": "bash", "tool_call_id": "c1", "content": "ok\n" * 3000}]})
        ref = client.call("message.list", {"session_id": sid})["messages"][0]["ref_id"]
    none = ctxctl(shared_daemon.socket, "result", ref, "--session", sid, "--grep", "ERROR",
                  "--json")
    assert (none.returncode, none.stderr) == (1, "")
    assert (json.loads(none.stdout)["matched_lines"], json.loads(none.stdout)["matches"]) == (
        0, [])
    found = ctxctl(shared_daemon.socket, "result", ref, "--session", sid, "--grep", "ok",
                   "--max-matches", "1", "--json")
    assert (found.returncode, json.loads(found.stdout)["matched_lines"]) == (0, 3000)


def test_compact_shows_before_and_after_and_resume_the_snapshot(
        daemon_root: Path, sid: str) -> None:
    process = DaemonProcess(daemon_root, extra_args=["--hygiene-auto-compact", "false"])
    with process.running():
        with process.client() as client:
            client.call("session.open", {"session_id": sid, "budget": {
                "context_window": 4000, "max_output_tokens": 0}})
            client.call("message.append", {"session_id": sid, "messages": [
                {"role": "system", "content": "You are careful."},
                {"role": "user", "content": "Fix it."}]})
            for step in range(5):
                client.call("message.append", {"session_id": sid, "messages": [
                    {"role": "assistant", "content": f"Step {step}."},
                    {"role": "tool", "name": "bash", "tool_call_id": f"c{step}",
                     "content": "".join(f"line {i} of output {step}\n" for i in range(80))}]})
            before = client.call("ctxd.render", {"session_id": sid})
        compacted = ctxctl(process.socket, "compact", sid, "--strategy", "truncate")
        with process.client() as client:
            after = client.call("ctxd.render", {"session_id": sid})
            [marker] = [m for m in client.call("message.list", {"session_id": sid})["messages"]
                        if (m.get("meta") or {}).get("compaction") == "truncated"]
        again = ctxctl(process.socket, "compact", sid, "--json")
        resumed = ctxctl(process.socket, "session", "resume", sid)
        unknown = ctxctl(process.socket, "compact", "nobody")
    b, a = before["tokens"], after["tokens"]
    assert compacted.returncode == 0, compacted.stderr
    # Plain output: columns aligned with spaces.
    assert [line.split() for line in compacted.stdout.splitlines()] == [
        ["BEFORE", "AFTER", "CHANGE"],
        ["tokens", f"{b:,}", f"{a:,}", f"{a - b:+,}"],
        ["usage", f"{b / 40:.1f}%", f"{a / 40:.1f}%", f"{(a - b) / 40:+.1f}", "pts"],
        ["messages", "12", str(len(after["messages"])), f"{len(after['messages']) - 12:+}"]]
    assert compacted.stderr == (f"(ran truncate: {marker['content'].split()[0][1:]} "
                                "truncated; target 2,400 tokens)\n")
    result = json.loads(again.stdout)
    assert (result["strategies_run"], result["before_tokens"], result["after_tokens"]) == (
        [], a, a)
    assert resumed.returncode == 0
    assert resumed.stderr.startswith(f"({len(after['messages'])} messages, {a:,} tokens, "
                                     "from the snapshot of ")
    assert resumed.stdout.startswith("[system]\nYou are careful.\n\n[user]\nFix it.\n\n[user]\n"
                                     + marker["content"])
    assert (unknown.returncode, unknown.stderr.splitlines()[0]) == (
        1, "ctxctl: error -32004: unknown session 'nobody'")


def test_usage_notes_the_latest_calls_input_beside_ctxds_count(
        shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        client.call("message.append", {"session_id": sid, "messages": [
            {"role": "user", "content": "hello " * 99}]})
        local = client.call("ctxd.render", {"session_id": sid})["tokens"]
        client.call("usage.record", {"session_id": sid, "model": "m", "input_tokens": 2 * local})
    noted = ctxctl(shared_daemon.socket, "usage", sid)
    assert (noted.returncode, noted.stderr) == (
        0, f"latest call: {2 * local:,} input tokens reported, ctxd counted {local:,} "
           "(ratio 2.0000)\n")


def test_usage_by_model_with_cost_and_in_status(daemon_root: Path, sid: str) -> None:
    config = daemon_root / "prices.toml"
    config.write_text('[usage.prices.big]\ninput = 3.0\noutput = 15.0\n', encoding="utf-8")
    with DaemonProcess(daemon_root, extra_args=["--config", str(config)]).running() as daemon:
        with daemon.client() as client:
            client.call("session.open", {"session_id": sid})
            client.call("usage.record", {"session_id": sid, "model": "big",
                                         "input_tokens": 1_000_000, "output_tokens": 20_000})
            client.call("usage.record", {"session_id": sid, "model": "free",
                                         "input_tokens": 1_500, "thinking_tokens": 7})
        result = ctxctl(daemon.socket, "usage", sid, "--by", "model", "--format", "tsv")
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == [
            "model\tcalls\tinput\toutput\tcache_read\tcache_write\tthinking\tcost",
            "big\t1\t1,000,000\t20,000\t0\t0\t0\t3.3000",
            "free\t1\t1,500\t0\t0\t0\t7\t-",
            "total\t2\t1,001,500\t20,000\t0\t0\t7\t3.3000"]
        # No calibration note: ctxd held none of the thread when the call was recorded.
        assert result.stderr.splitlines() == ["1 call has no price (not in [usage] prices)"]
        every = ctxctl(daemon.socket, "usage", "--format", "tsv", "--no-headers")
        assert every.stdout.splitlines() == [f"{sid}\t2\t1,001,500\t20,000\t0\t0\t7\t3.3000"]
        as_json = json.loads(ctxctl(daemon.socket, "usage", sid, "--json").stdout)
        assert as_json["totals"]["calls"] == 2
        assert as_json["cost"]["total"] == 3.3
        status = ctxctl(daemon.socket, "status", "--format", "plain")
        assert status.stdout.splitlines()[-2:] == [
            "SESSION         CALLS      INPUT  OUTPUT  CACHE_READ  CACHE_WRITE  THINKING    COST",
            f"{sid}      2  1,001,500  20,000           0            0         7  3.3000"]
        status_json = json.loads(ctxctl(daemon.socket, "status", "--json").stdout)
        assert status_json["usage"][sid]["totals"] == {
            "input_tokens": 1_001_500, "output_tokens": 20_000, "cache_read_tokens": 0,
            "cache_write_tokens": 0, "thinking_tokens": 7, "calls": 2}
        assert ctxctl(daemon.socket, "usage", "nope").returncode == 1
        # Every session's calls by model: another session's call of "big" adds up.
        with daemon.client() as client:
            client.call("session.open", {"session_id": sid + "-2"})
            client.call("usage.record", {"session_id": sid + "-2", "model": "big",
                                         "input_tokens": 1_000_000})
        by_model = ctxctl(daemon.socket, "usage", "--by", "model", "--format", "tsv")
        assert by_model.stdout.splitlines() == [
            "model\tcalls\tinput\toutput\tcache_read\tcache_write\tthinking\tcost",
            "big\t2\t2,000,000\t20,000\t0\t0\t0\t6.3000",
            "free\t1\t1,500\t0\t0\t0\t7\t-",
            "total\t3\t2,001,500\t20,000\t0\t0\t7\t6.3000"]
        by_branch = ctxctl(daemon.socket, "usage", "--by", "branch")
        assert (by_branch.returncode, by_branch.stdout) == (2, "")
        assert by_branch.stderr.startswith("ctxctl usage: --by branch groups one session's")


def test_tools_lists_tool_calls_and_their_states(shared_daemon: DaemonProcess,
                                                 sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        for call_id, state in (("call_a", "pending"), ("call_a", "running"),
                               ("call_a", "completed"), ("call_b", "awaiting_approval")):
            client.call("tool.state", {"session_id": sid, "tool_call_id": call_id,
                                       "state": state, "tool_name": "bash"})
        calls = client.call("tool.list", {"session_id": sid})["tool_calls"]
    result = ctxctl(shared_daemon.socket, "tools", sid, "--format", "tsv")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "tool_call\ttool\tstate\tin_state\thistory"
    a_history = calls[0]["history"]
    assert lines[1] == (f"call_a\tbash\tcompleted\t-\tpending {a_history[0]['seconds']:.1f}s > "
                        f"running {a_history[1]['seconds']:.1f}s > completed")
    assert lines[2].startswith("call_b\tbash\tawaiting_approval\t")
    assert lines[2].endswith("s\tawaiting_approval")
    only = ctxctl(shared_daemon.socket, "tools", sid, "--state", "completed", "--json")
    assert [c["tool_call_id"] for c in json.loads(only.stdout)["tool_calls"]] == ["call_a"]
    none = ctxctl(shared_daemon.socket, "tools", sid, "--state", "denied")
    assert (none.returncode, none.stdout, none.stderr.strip()) == (
        0, "", f"no denied tool calls in session {sid}")
# ---- inject ----------------------------------------------------------------------------

def test_inject_queues_a_text_and_status_counts_what_waits(shared_daemon: DaemonProcess,
                                                           sid: str) -> None:
    github_token = "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
    queued = ctxctl(shared_daemon.socket, "inject", sid, "the user says: stop refactoring",
                    "--priority", "immediate", "--key", "stop-1")
    again = ctxctl(shared_daemon.socket, "inject", sid, "the user says: stop refactoring",
                   "--key", "stop-1", "--json")
    piped = ctxctl(shared_daemon.socket, "inject", sid, "-",
                   stdin=f"deploy key {github_token}\n")
    assert queued.returncode == 0, queued.stderr
    injection_id = queued.stdout.split()[1]
    tokens = COUNTER.message_tokens("user", "the user says: stop refactoring", None, None)
    assert queued.stdout == (f"injection {injection_id} queued for {sid} (immediate, "
                             f"{tokens} tokens)\n")
    assert json.loads(again.stdout) == {
        "injection_id": injection_id, "duplicate": True, "state": "pending",
        "priority": "immediate", "tokens": tokens, "secrets_scrubbed": 0}
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.endswith("(normal, " + str(COUNTER.message_tokens(
        "user", "deploy key [REDACTED:github_token]\n", None, None))
        + " tokens); 1 secret scrubbed\n")
    with shared_daemon.client() as client:
        pulled = client.call("inject.pull", {"session_id": sid, "limit": 1})["injections"]
        assert [(i["injection_id"], i["source"]) for i in pulled] == [(injection_id, "ctxctl")]
    status = ctxctl(shared_daemon.socket, "status")
    assert status.returncode == 0, status.stderr
    assert [line.split() for line in status.stdout.splitlines() if line.startswith(sid)][
        1:] == [[sid, "1", "1"]]
    as_json = json.loads(ctxctl(shared_daemon.socket, "status", "--json").stdout)
    [session] = [s for s in as_json["sessions"] if s["session_id"] == sid]
    assert session["injections"] == {"pending": 1, "delivered": 1, "accepted": 0,
                                     "rejected": 0}


def test_inject_errors(shared_daemon: DaemonProcess, sid: str) -> None:
    unknown = ctxctl(shared_daemon.socket, "inject", sid, "hello")
    assert (unknown.returncode, unknown.stderr.splitlines()[0]) == (
        1, f"ctxctl: error -32004: unknown session '{sid}'")
    empty = ctxctl(shared_daemon.socket, "inject", sid, "-", stdin="")
    assert (empty.returncode, empty.stderr) == (2, "ctxctl: standard input is empty\n")
    bad = ctxctl(shared_daemon.socket, "inject", sid, "x", "--priority", "urgent")
    assert bad.returncode == 2
    assert "invalid choice: 'urgent'" in bad.stderr
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid, "budget": {
            "context_window": 1_100, "max_output_tokens": 100}})
    over = ctxctl(shared_daemon.socket, "inject", sid, hello_text(1_000))
    assert (over.returncode, over.stderr.splitlines()[0]) == (
        1, "ctxctl: error -32001: injecting 1004 tokens would bring the context to 1007 of "
           "1000 tokens, past the hard block at 980")



@pytest.mark.parametrize("where", ["open-mode", "shared"])
def test_a_socket_others_could_have_placed_is_refused_naming_the_fix(
        tmp_path: Path, where: str) -> None:
    # docs/decisions.md, "Who serves the socket": a given path is held to the rule too.
    with placed_by_others(tmp_path, where) as (path, reason):
        for command in (["status"], ["stop"], ["call", "daemon.ping"]):
            result = ctxctl(path, *command)
            assert (result.returncode, result.stdout, result.stderr) == (
                2, "", f"ctxctl: {reason}\n")


def test_a_reader_that_goes_away_ends_ctxctl_quietly(shared_daemon: DaemonProcess) -> None:
    """``ctxctl status | head -1``: the pipe's reader closed before ctxctl writes, ctxctl
    exits as SIGPIPE would end it (141), with no traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    environ = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}
    environ.pop("CTXD_SOCKET", None)
    try:
        done = subprocess.run([str(Path(sys.executable).with_name("ctxctl")), "--socket",
                               str(shared_daemon.socket), "status"], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, env=environ, timeout=60,
                              check=False)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, "")


def test_team_status_without_a_team_names_the_file_to_edit(
        shared_daemon: DaemonProcess) -> None:
    result = ctxctl(shared_daemon.socket, "team", "status")
    assert (result.returncode, result.stdout, result.stderr) == (
        2, "", "ctxctl: no team: name one under [memory.team] in ctxd's config "
               "($XDG_CONFIG_HOME/ctxd/config.toml, ctxd.toml(5)): name = \"…\", and the "
               "database's URL in the variable url_env names; then restart ctxd\n")

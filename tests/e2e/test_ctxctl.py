"""ctxctl against a real daemon: tables, --json, raw calls, branches, memories, stop, and no
daemon at all."""

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
    for command in (["status"], ["sessions"], ["call", "daemon.ping"], ["stop"],
                    ["memory", "search", "x"], ["memory", "add", "t", "c"],
                    ["memory", "list"], ["memory", "rate", "1", "--helpful"],
                    ["memory", "rm", "1"]):
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

    shown = ctxctl(daemon.socket, "memory", "list", COLUMNS="200")
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
    table = ctxctl(daemon.socket, "memory", "search", *query, COLUMNS="200")
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
                                            COLUMNS="200").stdout, 1)

    removed = ctxctl(daemon.socket, "memory", "rm", "1")
    assert (removed.returncode, removed.stdout) == (0, "memory 1 deleted\n")
    gone = json.loads(ctxctl(daemon.socket, "memory", "search", *query, "--json").stdout)
    assert 1 not in [r["id"] for r in gone["results"]]
    as_json = ctxctl(daemon.socket, "memory", "rm", "2", "--json")
    assert json.loads(as_json.stdout) == {"id": 2, "deleted": True}
    assert json.loads(ctxctl(daemon.socket, "memory", "list", "--json").stdout) == {
        "memories": [], "next_cursor": None}
    empty = ctxctl(daemon.socket, "memory", "list")
    assert (empty.returncode, empty.stdout) == (0, "no memories\n")
    nothing = ctxctl(daemon.socket, "memory", "search", "pytest")
    assert (nothing.returncode, nothing.stdout) == (0, "no memories found by hybrid search\n")


def test_memory_list_pages_and_scopes(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        for n, scope in enumerate(["global", "project:a", "project:b", "project:a", "global"]):
            client.call("memory.record", {"title": f"memory {n}", "content": f"text {n}",
                                          "scope": scope})
    first = ctxctl(daemon.socket, "memory", "list", "--limit", "2")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-1] == "(more: --all, or --limit larger than 2)"
    assert memory_ids(first.stdout) == ["1", "2"]
    page = json.loads(ctxctl(daemon.socket, "memory", "list", "--limit", "2", "--json").stdout)
    assert ([m["id"] for m in page["memories"]], page["next_cursor"]) == ([1, 2], "2")
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
    table = ctxctl(daemon.socket, "memory", "list", "--scope", "global", "--all")
    assert table.returncode == 0, table.stderr
    assert memory_ids(table.stdout) == ["1", "5"]
    assert "more:" not in table.stdout


def test_memory_errors(shared_daemon: DaemonProcess) -> None:
    socket = shared_daemon.socket
    for command in (["rate", "999999", "--helpful"], ["rate", "999999", "--succeeded"],
                    ["rm", "999999"]):
        result = ctxctl(socket, "memory", *command)
        assert (result.returncode, result.stdout) == (1, ""), command
        assert result.stderr == "ctxctl: error -32004: unknown memory 999999\n"
        as_json = ctxctl(socket, "memory", *command, "--json")
        assert as_json.returncode == 1
        assert json.loads(as_json.stdout)["error"]["code"] == -32004
    # Scopes are checked by the daemon (like projects and session ids): -32602, exit 1.
    for command in (["add", "t", "c", "--scope", "project:two words"],
                    ["search", "q", "--scope", "team:x"], ["list", "--scope", "Global"]):
        result = ctxctl(socket, "memory", *command)
        assert (result.returncode, result.stdout) == (1, ""), command
        assert result.stderr.startswith("ctxctl: error -32602: invalid params: ")
        assert result.stderr.endswith("(at $.scope)\n")
        as_json = json.loads(ctxctl(socket, "memory", *command, "--json").stdout)
        assert as_json["error"]["code"] == -32602
    for command, field in ((["search", "q", "-k", "0"], "$.k"),
                           (["search", "q", "--min-confidence", "1.5"], "$.min_confidence"),
                           (["list", "--limit", "0"], "$.limit"),
                           (["add", "t", "-"], "$.content")):
        result = ctxctl(socket, "memory", *command)
        assert result.returncode == 1, command
        assert result.stderr.startswith("ctxctl: error -32602: invalid params: ")
        assert result.stderr.endswith(f"(at {field})\n")
    with shared_daemon.client() as client:
        assert client.call("memory.list", {})["memories"] == []
    # Fixed choices and the shape of the command line are checked here: exit 2.
    for command, message in (
            (["rate", "1"], "one of the arguments --helpful --unhelpful --succeeded --failed "
                            "is required"),
            (["rate", "1", "--helpful", "--failed"],
             "argument --failed: not allowed with argument --helpful"),
            (["rate", "one", "--helpful"], "argument ID: invalid int value: 'one'"),
            (["rm", "1.5"], "argument ID: invalid int value: '1.5'"),
            (["search", "q", "--mode", "fuzzy"], "argument --mode: invalid choice: 'fuzzy'"),
            (["add", "t", "c", "--outcome", "partial"],
             "argument --outcome: invalid choice: 'partial'"),
            (["add", "t"], "the following arguments are required: CONTENT"),
            ([], "the following arguments are required: action")):
        result = ctxctl(socket, "memory", *command)
        assert (result.returncode, result.stdout) == (2, ""), command
        assert message in result.stderr, command


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
        assert (added.returncode, added.stdout) == (
            0, "memory 1 recorded in global\nnot in the dense index yet (it is not ready); "
               "lexical search finds it\n")
        as_json = json.loads(ctxctl(process.socket, "memory", "search", "pytest",
                                    "--json").stdout)
        assert [(r["id"], r["legs"]) for r in as_json["results"]] == [(1, ["lexical"])]
        assert (as_json["mode"], as_json["legs_used"]) == ("hybrid", ["lexical"])
        note = as_json["note"]
        assert note.startswith("dense leg unavailable (the embedder is unavailable: ")
        assert note.endswith("); lexical results only")
        shown = ctxctl(process.socket, "memory", "search", "pytest", COLUMNS="1000")
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith("1 found by hybrid search (legs: lexical)")
        assert shown.stdout.splitlines()[-1] == f"note: {note}"
        nothing = ctxctl(process.socket, "memory", "search", "zebra", COLUMNS="1000")
        assert (nothing.returncode, nothing.stdout) == (
            0, f"no memories found by hybrid search\nnote: {note}\n")
    finally:
        process.stop()

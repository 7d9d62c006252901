"""transcript.import against a real daemon: the recorded Claude Code transcripts with
exact counts computed here from the raw JSON, idempotent re-import, a grown file, a
malformed line, a replaced file, sub-agents as folded branches, and an OpenCode export with
every part type; `ctxctl import`: its summary, --json, and the next step told for each
error (docs/protocol.md, "transcript.import")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonProcess, kill_leftovers, short_root
from kill_at_commit import KILL_AT_COMMIT
from tests_support import rpc_error

from ctxclient import Client, DaemonUnavailable
from ctxclient._spawn import start_command

TRANSCRIPTS = Path(__file__).resolve().parents[3] / "shared" / "bench-data" / "transcripts"
VIEWER = TRANSCRIPTS / "claude-code_claude-code-viewer_fe5e1c67.jsonl"
DEEP = TRANSCRIPTS / "claude-code_claude-code-log_deep-manifest_a7da6a22.jsonl"
TEMPLAR = TRANSCRIPTS / "claude-code_templar_chat.json"
"""Claude Code records saved as one JSON array."""
needs_data = pytest.mark.skipif(not VIEWER.exists(), reason="bench-data transcripts absent")


def records_of(path: Path) -> list[dict[str, Any]]:
    """A transcript's records: a JSON array's elements, or JSONL's lines."""
    text = path.read_text()
    if text.lstrip().startswith("["):
        return json.loads(text)  # type: ignore[no-any-return]
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def expected(path: Path) -> dict[str, Any]:
    """What an import must add, counted from the raw records (independently of the parser):
    a tool result per tool_result block, a message per assistant record with text or
    tool_use blocks, a user message per user record with text; usage once per message.id."""
    records = records_of(path)
    tool_results = assistants = users = 0
    usage: dict[str, dict[str, int]] = {}
    sidechains = set()
    for record in records:
        if record.get("type") not in ("user", "assistant"):
            continue
        content = record["message"]["content"]
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        if record["type"] == "assistant":
            assistants += any(b["type"] in ("text", "tool_use") for b in blocks)
            usage.setdefault(record["message"]["id"], record["message"]["usage"])
        else:
            tool_results += sum(b["type"] == "tool_result" for b in blocks)
            users += any(b["type"] != "tool_result" for b in blocks)
        if record.get("isSidechain") and record.get("parentUuid") is None:
            sidechains.add(record["uuid"])
    return {"messages": tool_results + assistants + users, "tool_results": tool_results,
            "usage": len(usage), "branches": len(sidechains),
            "input": sum(u["input_tokens"] for u in usage.values()),
            "output": sum(u["output_tokens"] for u in usage.values()),
            "cache_read": sum(u.get("cache_read_input_tokens", 0) for u in usage.values()),
            "cache_write": sum(u.get("cache_creation_input_tokens", 0)
                               for u in usage.values()),
            "lines": len(path.read_text().splitlines()), "size": path.stat().st_size}


def do_import(client: Any, path: Path, **extra: Any) -> dict[str, Any]:
    return client.call("transcript.import",  # type: ignore[no-any-return]
                       {"format": "claude-code", "path": str(path), **extra})


def import_error(client: Any, path: Path, **extra: Any) -> Any:
    return rpc_error(client, "transcript.import",
                     {"format": "claude-code", "path": str(path), **extra})


@needs_data
@pytest.mark.parametrize("path", [VIEWER, DEEP], ids=["viewer", "deep-manifest"])
def test_real_transcript_exact_counts(shared_daemon: DaemonProcess, path: Path) -> None:
    want = expected(path)
    session_id = next(json.loads(raw)["sessionId"] for raw in path.read_text().splitlines()
                      if "sessionId" in json.loads(raw))
    with shared_daemon.client() as client:
        got = do_import(client, path, project="import-test")
        assert (got["session_id"], got["created"], got["messages_added"],
                got["tool_results"], got["usage_records"], got["usage_duplicates"],
                got["branches"], got["malformed"], got["lines_read"], got["bytes_read"],
                got["offset"], got["size"]) == (
            session_id, True, want["messages"], want["tool_results"], want["usage"], 0,
            want["branches"], [], want["lines"], want["size"], want["size"], want["size"])
        usage = client.call("usage.get", {"session_id": session_id})
        totals = usage["totals"]
        assert (totals["calls"], totals["input_tokens"], totals["output_tokens"],
                totals["cache_read_tokens"], totals["cache_write_tokens"]) == (
            want["usage"], want["input"], want["output"], want["cache_read"],
            want["cache_write"])
        branches = client.call("branch.list", {"session_id": session_id})["branches"]
        assert len(branches) == want["branches"]
        assert all(branch["status"] != "active" for branch in branches)
        again = do_import(client, path)
        assert (again["created"], again["messages_added"], again["usage_records"],
                again["lines_read"], again["bytes_read"], again["offset"]) == (
            False, 0, 0, 0, 0, want["size"])


@needs_data
def test_json_array_of_records_exact_counts(shared_daemon: DaemonProcess) -> None:
    """templar's records are saved as one JSON array: read whole, a record's position is its
    index (docs/protocol.md, "transcript.import"); a re-import adds nothing."""
    records = records_of(TEMPLAR)
    want = expected(TEMPLAR)
    session_id = next(r["sessionId"] for r in records if "sessionId" in r)
    others = [r["type"] for r in records if r["type"] not in ("user", "assistant")]
    summaries = sum(bool(r.get("isCompactSummary")) for r in records)
    size = TEMPLAR.stat().st_size
    with shared_daemon.client() as client:
        got = do_import(client, TEMPLAR)
        assert (got["session_id"], got["created"], got["messages_added"],
                got["tool_results"], got["usage_records"], got["usage_duplicates"],
                got["branches"], got["compactions"], got["malformed"], got["unknown_kept"],
                got["lines_read"], got["bytes_read"], got["offset"], got["size"]) == (
            session_id, True, want["messages"], want["tool_results"], want["usage"], 0,
            want["branches"], summaries, [], {"system": len(others)}, len(records), size,
            len(records), size)
        assert (want["messages"], want["tool_results"], want["usage"], summaries,
                len(others), len(records)) == (167, 60, 63, 2, 165, 332)
        totals = client.call("usage.get", {"session_id": session_id})["totals"]
        assert (totals["calls"], totals["input_tokens"], totals["output_tokens"]) == (
            want["usage"], want["input"], want["output"])
        again = do_import(client, TEMPLAR)
        assert (again["created"], again["messages_added"], again["usage_records"],
                again["lines_read"], again["bytes_read"], again["offset"]) == (
            False, 0, 0, 0, 0, len(records))


def test_grown_json_array_imports_the_new_records_only(shared_daemon: DaemonProcess,
                                                       tmp_path: Path, sid: str) -> None:
    """An array saved again with more records (its first 4,096 bytes unchanged) adds only
    the records after those already imported; one whose head changed was replaced."""
    records = [user(f"u{i}", f"u{i - 1}" if i else None, f"request {i} " + "x" * 900)
               for i in range(6)]
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(records[:4], indent=2))
    with shared_daemon.client() as client:
        first = do_import(client, path, session_id=sid)
        assert (first["messages_added"], first["lines_read"], first["offset"]) == (4, 4, 4)
        path.write_text(json.dumps(records, indent=2))
        grown = do_import(client, path, session_id=sid)
        assert (grown["messages_added"], grown["lines_read"], grown["offset"]) == (2, 2, 6)
        texts = [m["content"] for m in client.call(
            "message.list", {"session_id": sid})["messages"]]
        assert texts == [r["message"]["content"] for r in records]
        path.write_text(json.dumps(records[1:], indent=2))
        error = import_error(client, path, session_id=sid)
        assert error.code == -32003
        assert error.message.startswith(f"{path} was replaced or truncated since it was "
                                        f"last imported into {sid}")


def test_pinned_counts_of_the_recorded_transcripts() -> None:
    """The figures checked by hand against the files (README of bench-data)."""
    if not VIEWER.exists():
        pytest.skip("bench-data transcripts absent")
    assert {k: expected(VIEWER)[k] for k in ("messages", "tool_results", "usage",
                                             "branches")} == {
        "messages": 437, "tool_results": 167, "usage": 170, "branches": 5}
    assert {k: expected(DEEP)[k] for k in ("messages", "tool_results", "usage",
                                           "branches")} == {
        "messages": 299, "tool_results": 108, "usage": 103, "branches": 0}


def line(record: dict[str, Any]) -> str:
    return json.dumps(record) + "\n"


def user(uuid: str, parent: str | None, text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "user", "uuid": uuid, "parentUuid": parent, "sessionId": "cc-made-up",
            "message": {"role": "user", "content": text}, **extra}


def assistant(uuid: str, parent: str, message_id: str, block: dict[str, Any],
              **extra: Any) -> dict[str, Any]:
    return {"type": "assistant", "uuid": uuid, "parentUuid": parent, "sessionId": "cc-made-up",
            "message": {"id": message_id, "model": "claude-x", "role": "assistant",
                        "content": [block],
                        "usage": {"input_tokens": 10, "output_tokens": 5,
                                  "cache_read_input_tokens": 100,
                                  "cache_creation_input_tokens": 7}}, **extra}


def test_grown_file_malformed_line_partial_line_and_replacement(
        shared_daemon: DaemonProcess, tmp_path: Path, sid: str) -> None:
    path = tmp_path / "t.jsonl"
    first = [
        line(user("u1", None, "list the files")),
        line(assistant("a1", "u1", "msg_1", {"type": "thinking", "thinking": "hm"})),
        line(assistant("a2", "a1", "msg_1", {"type": "tool_use", "id": "tu1", "name": "Bash",
                                              "input": {"command": "ls"}})),
        "{not json\n",
        line({"type": "user", "uuid": "r1", "parentUuid": "a2", "message": {
            "role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1",
                                         "content": "a.txt\nb.txt"}]},
              "toolUseResult": {"stdout": "a.txt\nb.txt", "stderr": ""}}),
        line({"type": "file-history-snapshot", "messageId": "x"}),
    ]
    path.write_text("".join(first) + '{"type": "user", "uuid": "partial"')
    with shared_daemon.client() as client:
        got = do_import(client, path, session_id=sid)
        assert (got["messages_added"], got["tool_results"], got["usage_records"],
                got["malformed"], got["unknown_kept"], got["lines_read"], got["offset"]) == (
            3, 1, 1, [{"line": 4, "error": got["malformed"][0]["error"]}],
            {"file-history-snapshot": 1}, 6, len("".join(first).encode()))
        assert got["malformed"][0]["error"].startswith("not JSON")
        listed = client.call("message.list", {"session_id": sid})["messages"]
        assert [(m["role"], m.get("name")) for m in listed] == [
            ("user", None), ("assistant", None), ("tool", "Bash")]
        assert listed[2]["meta"]["tool_use_result"] == {"stdout": "a.txt\nb.txt",
                                                        "stderr": ""}
        assert listed[1]["meta"]["source"] == {"format": "claude-code", "type": "assistant",
                                               "line": 3, "uuid": "a2", "parent_uuid": "a1"}
        # The partial line completed, and one more response (same usage id again: counted
        # once).
        rest = [
            line(user("partial", "r1", "and now?")),
            line(assistant("a3", "partial", "msg_2", {"type": "text", "text": "done"})),
            line(assistant("a4", "a3", "msg_2", {"type": "text", "text": "really"})),
        ]
        path.write_text("".join(first) + "".join(rest))
        grown = do_import(client, path, session_id=sid)
        assert (grown["messages_added"], grown["usage_records"], grown["lines_read"],
                grown["malformed"], grown["bytes_read"]) == (
            3, 1, 3, [], len("".join(rest).encode()))
        assert do_import(client, path, session_id=sid)["messages_added"] == 0
        usage = client.call("usage.get", {"session_id": sid})["totals"]
        assert (usage["calls"], usage["input_tokens"], usage["cache_write_tokens"]) == (
            2, 20, 14)
        # Replaced by another file: an error that says what to do, then --restart.
        path.write_text(line(user("z1", None, "another transcript")))
        error = import_error(client, path, session_id=sid)
        assert error.code == -32003
        assert "replaced or truncated" in error.message
        again = do_import(client, path, session_id=sid, restart=True)
        assert (again["restarted"], again["messages_added"]) == (True, 1)


def test_a_result_read_by_a_later_import_is_named_after_its_call(
        shared_daemon: DaemonProcess, tmp_path: Path, sid: str) -> None:
    """The call was read by the import before (or by one that was interrupted): the result
    read now still carries the tool's name."""
    path = tmp_path / "t.jsonl"
    call = [line(user("u1", None, "list the files")),
            line(assistant("a1", "u1", "msg_1", {"type": "tool_use", "id": "tu1",
                                                  "name": "Bash", "input": {"command": "ls"}}))]
    path.write_text("".join(call))
    with shared_daemon.client() as client:
        assert do_import(client, path, session_id=sid)["messages_added"] == 2
        path.write_text("".join(call) + line({
            "type": "user", "uuid": "r1", "parentUuid": "a1", "message": {
                "role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1",
                                             "content": "a.txt"}]}}))
        assert do_import(client, path, session_id=sid)["messages_added"] == 1
        listed = client.call("message.list", {"session_id": sid})["messages"]
        assert [(m["role"], m.get("name"), m.get("tool_call_id")) for m in listed] == [
            ("user", None, None), ("assistant", None, None), ("tool", "Bash", "tu1")]


def test_sidechains_fold_as_branches(shared_daemon: DaemonProcess, tmp_path: Path,
                                     sid: str) -> None:
    records = [
        user("u1", None, "research this"),
        assistant("a1", "u1", "m1", {"type": "tool_use", "id": "task1", "name": "Task",
                                     "input": {"prompt": "look it up"}}),
        user("s1", None, "look it up", isSidechain=True),
        assistant("s2", "s1", "m2", {"type": "text", "text": "found: 42"}, isSidechain=True),
        {"type": "user", "uuid": "r1", "parentUuid": "a1", "message": {"role": "user",
         "content": [{"type": "tool_result", "tool_use_id": "task1", "content": "42"}]}},
    ]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(line(r) for r in records))
    with shared_daemon.client() as client:
        got = do_import(client, path, session_id=sid)
        assert (got["branches"], got["messages_added"], got["usage_records"]) == (1, 5, 2)
        [branch] = client.call("branch.list", {"session_id": sid})["branches"]
        assert (branch["status"], branch["description"]) == ("completed", "sub-agent s1")
        status = client.call("branch.status", {"branch_id": branch["branch_id"]})
        assert status["branch"]["result"] == "found: 42"
        listed = client.call("message.list", {"session_id": sid})["messages"]
        main = [m for m in listed if m.get("branch_id") is None]
        assert [m["role"] for m in main] == ["user", "assistant", "user", "tool"]
        assert [m["content"] for m in listed if m.get("branch_id")][1:] == [
            "look it up", [{"type": "text", "text": "found: 42"}]]
        assert "found: 42" in json.dumps(main[2]["content"])
        usage = client.call("usage.get", {"session_id": sid, "group_by": "branch"})
        assert sorted((g["key"] or "", g["totals"]["calls"]) for g in usage["groups"]) == [
            ("", 1), (branch["branch_id"], 1)]


def test_a_branch_an_interrupted_import_left_active_is_returned_first(
        shared_daemon: DaemonProcess, tmp_path: Path, sid: str) -> None:
    """What an import killed between opening a sub-agent's branch and appending to it left
    (before they committed together): the branch active with only its opening, the read
    position before the sub-agent. The next import returns it before reading, then imports
    the sub-agent as a branch of its own: none stays active, and the main thread compacts
    (a live branch made context.compact answer -32003)."""
    path = tmp_path / "s.jsonl"
    path.write_text("".join(line(r) for r in [
        user("u1", None, "research this"),
        user("s1", None, "look it up", isSidechain=True),
        assistant("s2", "s1", "m2", {"type": "text", "text": "found: 42"}, isSidechain=True),
        assistant("a1", "u1", "m1", {"type": "text", "text": "it is 42"})]))
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        left = client.call("branch.create", {
            "session_id": sid, "description": "sub-agent s1", "prompt": "look it up",
            "budget": 32_768, "timeout_seconds": 600, "inject_memories": False})["branch_id"]
        got = do_import(client, path, session_id=sid)
        assert (got["branches"], got["messages_added"]) == (1, 4)
        branches = client.call("branch.list", {"session_id": sid})["branches"]
        assert [(b["branch_id"] == left, b["description"], b["status"], b["result"])
                for b in sorted(branches, key=lambda b: b["fork_seq"])] == [
            (True, "sub-agent s1", "completed", "(the sub-agent left no answer)"),
            (False, "sub-agent s1", "completed", "found: 42")]
        compacted = client.call("context.compact", {"session_id": sid})
        assert compacted["branch_id"] is None


def test_path_errors(shared_daemon: DaemonProcess, tmp_path: Path, sid: str) -> None:
    fifo = tmp_path / "swapped.jsonl"
    os.mkfifo(fifo)
    linked = tmp_path / "linked.jsonl"
    linked.symlink_to(fifo)
    with shared_daemon.client() as client:
        for path, reason in (
                (tmp_path / "none.jsonl",
                 f"cannot read {tmp_path / 'none.jsonl'}: No such file or directory"),
                (tmp_path, f"{tmp_path} is a directory, not a regular file; give the path of "
                           "a transcript file"),
                # Opened without blocking and checked on what was opened: a FIFO (nobody
                # writes to it) is refused at once, also behind a symbolic link.
                (fifo, f"{fifo} is a FIFO (named pipe), not a regular file; give the path "
                       "of a transcript file"),
                (linked, f"{linked} is a FIFO (named pipe), not a regular file; give the "
                         "path of a transcript file")):
            error = import_error(client, path, session_id=sid)
            assert (error.code, error.data) == (-32602, {"path": "$.path", "reason": reason})
        error = import_error(client, Path("rel.jsonl"), session_id=sid)
        assert "not an absolute path" in error.data["reason"]
        empty = tmp_path / "empty.jsonl"
        empty.write_text("")
        error = import_error(client, empty)
        assert error.data["path"] == "$.session_id"


OPENCODE = {
    "info": {"id": "ses_opencode1", "title": "made up", "directory": "/tmp/p"},
    "messages": [
        {"info": {"id": "msg_u1", "role": "user", "sessionID": "ses_opencode1"},
         "parts": [{"type": "text", "text": "fix the bug"},
                   {"type": "file", "mime": "text/plain", "filename": "a.py",
                    "url": "file:///tmp/p/a.py"},
                   {"type": "agent", "name": "build"},
                   {"type": "subtask", "prompt": "look", "description": "d", "agent": "x"}]},
        {"info": {"id": "msg_a1", "role": "assistant", "modelID": "gpt-x", "providerID": "p",
                  "tokens": {"input": 100, "output": 20, "reasoning": 3,
                             "cache": {"read": 50, "write": 4}}},
         "parts": [{"type": "step-start", "snapshot": "s0"},
                   {"type": "reasoning", "text": "thinking"},
                   {"type": "text", "text": "reading it"},
                   {"type": "tool", "callID": "call_1", "tool": "read",
                    "state": {"status": "completed", "input": {"path": "a.py"},
                              "output": "x = 1\n" * 5000, "title": "a.py",
                              "time": {"start": 1, "end": 2, "compacted": 3}}},
                   {"type": "tool", "callID": "call_2", "tool": "bash",
                    "state": {"status": "error", "input": {"command": "false"},
                              "error": "exit 1", "time": {"start": 2, "end": 3}}},
                   {"type": "step-finish", "reason": "tool-calls", "cost": 0,
                    "tokens": {"input": 100}},
                   {"type": "patch", "hash": "h", "files": ["a.py"]},
                   {"type": "snapshot", "snapshot": "s1"},
                   {"type": "retry", "attempt": 1, "error": {"message": "503"}},
                   {"type": "hologram", "beam": 1}]},
        {"info": {"id": "msg_u2", "role": "user"},
         "parts": [{"type": "compaction", "auto": True}]},
        {"info": {"id": "msg_a2", "role": "assistant", "summary": True, "modelID": "gpt-x",
                  "tokens": {"input": 7, "output": 8, "reasoning": 0,
                             "cache": {"read": 0, "write": 0}}},
         "parts": [{"type": "text", "text": "Summary: the bug is in a.py"}]},
    ],
}


def test_opencode_export_every_part_type(shared_daemon: DaemonProcess, tmp_path: Path
                                         ) -> None:
    path = tmp_path / "export.json"
    path.write_text(json.dumps(OPENCODE))
    with shared_daemon.client() as client:
        got = client.call("transcript.import", {"format": "opencode", "path": str(path)})
        sid = got["session_id"]
        assert (sid, got["messages_added"], got["tool_results"], got["usage_records"],
                got["compactions"], got["unknown_kept"], got["offset"]) == (
            "ses_opencode1", 8, 2, 2, 1, {"part:hologram": 1}, 4)
        listed = client.call("message.list", {"session_id": sid})["messages"]
        roles = [(m["role"], m.get("name")) for m in listed]
        assert roles == [("user", None), ("assistant", None), ("tool", "read"),
                         ("assistant", None), ("tool", "bash"), ("assistant", None),
                         ("user", None), ("assistant", None)]
        assert [p["type"] for p in listed[1]["meta"]["parts"]] == ["step-start", "reasoning"]
        assert [p["type"] for p in listed[5]["meta"]["parts"]] == [
            "step-finish", "patch", "snapshot", "retry", "hologram"]
        assert listed[7]["meta"]["summary"] is True
        read = listed[2]
        assert read["meta"]["compacted"] == 3
        assert read["content"] == "x = 1\n" * 5000  # compacted in OpenCode, still stored
        assert listed[4]["meta"]["is_error"] is True
        assert [p["type"] for p in listed[0]["meta"]["parts"]] == ["file", "agent", "subtask"]
        usage = client.call("usage.get", {"session_id": sid})["totals"]
        assert (usage["input_tokens"], usage["thinking_tokens"], usage["cache_read_tokens"],
                usage["cache_write_tokens"]) == (107, 3, 50, 4)
        again = client.call("transcript.import", {"format": "opencode", "path": str(path)})
        assert (again["messages_added"], again["usage_records"]) == (0, 0)
        grown = dict(OPENCODE, messages=[*OPENCODE["messages"], {
            "info": {"id": "msg_u3", "role": "user"},
            "parts": [{"type": "text", "text": "thanks"}]}])
        path.write_text(json.dumps(grown))
        more = client.call("transcript.import", {"format": "opencode", "path": str(path)})
        assert (more["messages_added"], more["offset"]) == (1, 5)


# ---- ctxctl import ----


def ctxctl(socket: Path, *args: str, cwd: Path | None = None,
           columns: int = 160) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "NO_COLOR": "1", "COLUMNS": str(columns)}
    environ.pop("CTXD_SOCKET", None)
    return subprocess.run([sys.executable, "-m", "ctxclient.cli", "--socket", str(socket),
                           *args], capture_output=True, text=True, env=environ, timeout=120,
                          cwd=cwd, check=False)


@needs_data
def test_import_real_transcript_summary_then_nothing_new(shared_daemon: DaemonProcess,
                                                         sid: str) -> None:
    want = expected(VIEWER)
    first = ctxctl(shared_daemon.socket, "import", "claude-code", str(VIEWER),
                   "--session", sid, "--project", "cli-import", "--format", "tsv")
    assert first.returncode == 0, first.stderr
    table = [line.split("\t") for line in first.stdout.splitlines()]
    assert table[0] == ["what", "count", "detail"]
    assert {row[0]: row[1] for row in table[1:]} == {
        "messages": f"{want['messages']:,}", "tool results": f"{want['tool_results']:,}",
        "usage records": f"{want['usage']:,}", "branches": f"{want['branches']:,}",
        "compactions": "0", "bytes read": f"{want['size']:,}",
        "kept as metadata": table[-1][1]}
    assert table[-1][0] == "kept as metadata"
    assert f"({'created'} session {sid})" in first.stderr
    again = ctxctl(shared_daemon.socket, "import", "claude-code", str(VIEWER), "--session",
                   sid)
    assert (again.returncode, again.stdout) == (0, "")
    assert again.stderr == (f"nothing new: {VIEWER} is imported into session {sid} up to "
                            f"{want['size']:,} of {want['size']:,} bytes\n")


@needs_data
def test_import_json_array_summary_counts_records(shared_daemon: DaemonProcess,
                                                  sid: str) -> None:
    """An array's position is in records, not bytes: the summary and "nothing new" say so."""
    records = records_of(TEMPLAR)
    size = TEMPLAR.stat().st_size
    first = ctxctl(shared_daemon.socket, "import", "claude-code", str(TEMPLAR), "--session",
                   sid, "--format", "tsv", "--no-headers")
    assert first.returncode == 0, first.stderr
    rows = {row[0]: row[1:] for row in (line.split("\t") for line in first.stdout.splitlines())}
    assert rows["bytes read"] == [f"{size:,}", f"{len(records)} records in the array"]
    again = ctxctl(shared_daemon.socket, "import", "claude-code", str(TEMPLAR), "--session",
                   sid)
    assert (again.returncode, again.stdout, again.stderr) == (
        0, "", f"nothing new: {TEMPLAR} is imported into session {sid} up to its "
               f"{len(records)} records\n")


def test_relative_path_json_and_malformed_lines(shared_daemon: DaemonProcess, tmp_path: Path,
                                                sid: str) -> None:
    record = {"type": "user", "uuid": "u1", "parentUuid": None, "sessionId": sid,
              "message": {"role": "user", "content": "hello"}}
    (tmp_path / "t.jsonl").write_text(json.dumps(record) + "\n{oops\n[1]\n")
    result = ctxctl(shared_daemon.socket, "import", "claude-code", "t.jsonl", "--json",
                    cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert (got["session_id"], got["path"], got["messages_added"],
            [m["line"] for m in got["malformed"]]) == (sid, str(tmp_path / "t.jsonl"), 1,
                                                       [2, 3])
    (tmp_path / "t.jsonl").write_text(json.dumps(record) + "\n{oops\n[1]\n"
                                      + json.dumps(record | {"uuid": "u2"}) + "\n")
    plain = ctxctl(shared_daemon.socket, "import", "claude-code", "t.jsonl", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    # Plain rows: the malformed lines were read by the first import, not again.
    assert [line.split() for line in plain.stdout.splitlines()[:3]] == [
        ["WHAT", "COUNT", "DETAIL"], ["messages", "1", "-"], ["tool", "results", "0", "-"]]
    assert "malformed" not in plain.stdout


def test_summary_lists_malformed_line_numbers_and_fits_narrow_terminals(
        shared_daemon: DaemonProcess, tmp_path: Path, sid: str) -> None:
    record = {"type": "user", "uuid": "u1", "parentUuid": None,
              "message": {"role": "user", "content": "hello"}}
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(record) + "\n" + "{bad\n" * 12)
    result = ctxctl(shared_daemon.socket, "import", "claude-code", str(path), "--session",
                    sid, "--format", "tsv", "--no-headers")
    assert result.returncode == 0, result.stderr
    malformed = next(line.split("\t") for line in result.stdout.splitlines()
                     if line.startswith("malformed lines"))
    assert malformed == ["malformed lines", "12",
                         "line 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 and 2 more"]
    path.write_text(path.read_text() + json.dumps(record | {"uuid": "u2"}) + "\n")
    narrow = ctxctl(shared_daemon.socket, "import", "claude-code", str(path), "--session",
                    sid, "--format", "table", columns=40)
    assert narrow.returncode == 0, narrow.stderr
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 40
    assert "messages" in narrow.stdout


def test_opencode_export(shared_daemon: DaemonProcess, tmp_path: Path) -> None:
    path = tmp_path / "export.json"
    path.write_text(json.dumps(OPENCODE | {"info": {"id": "ses_cli_opencode"}}))
    result = ctxctl(shared_daemon.socket, "import", "opencode", str(path), "--format", "tsv")
    assert result.returncode == 0, result.stderr
    table = {row.split("\t")[0]: row.split("\t")[1:] for row in result.stdout.splitlines()}
    assert (table["messages"], table["tool results"], table["usage records"],
            table["compactions"], table["bytes read"][1], table["kept as metadata"]) == (
        ["8", ""], ["2", ""], ["2", ""], ["1", ""], "4 messages in the export",
        ["1", "part:hologram 1"])


def test_errors_say_what_to_do_next(shared_daemon: DaemonProcess, tmp_path: Path,
                                    sid: str) -> None:
    missing = ctxctl(shared_daemon.socket, "import", "claude-code", str(tmp_path / "no.jsonl"))
    assert (missing.returncode, missing.stdout) == (2, "")
    assert missing.stderr == (f"ctxctl: {tmp_path / 'no.jsonl'} does not exist\nctxctl: next: "
                              "give the path of a Claude Code JSONL transcript "
                              "(~/.claude/projects/*/ID.jsonl)\n")
    path = tmp_path / "r.jsonl"
    record = {"type": "user", "uuid": "u1", "parentUuid": None,
              "message": {"role": "user", "content": "first"}}
    path.write_text(json.dumps(record) + "\n")
    assert ctxctl(shared_daemon.socket, "import", "claude-code", str(path), "--session",
                  sid).returncode == 0
    path.write_text(json.dumps(record | {"message": {"role": "user", "content": "other"}})
                    + "\n")
    replaced = ctxctl(shared_daemon.socket, "import", "claude-code", str(path), "--session",
                      sid)
    assert (replaced.returncode, replaced.stdout) == (1, "")
    assert "was replaced or truncated" in replaced.stderr
    assert replaced.stderr.endswith(
        f"ctxctl: next: to import it again from its start (what was imported stays): "
        f"ctxctl import claude-code {path} --session {sid} --restart\n")
    again = ctxctl(shared_daemon.socket, "import", "claude-code", str(path), "--session",
                   sid, "--restart", "--format", "tsv", "--no-headers")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[0] == "messages\t1\t"
    assert "imported again from the start" in again.stderr
    no_id = ctxctl(shared_daemon.socket, "import", "claude-code", str(path))
    assert no_id.returncode == 1
    assert no_id.stderr.endswith(f"ctxctl: next: name the session: ctxctl import "
                                 f"claude-code {path} --session ID\n")
    as_json = ctxctl(shared_daemon.socket, "import", "claude-code", str(path), "--json")
    assert (as_json.returncode, json.loads(as_json.stdout)["error"]["code"]) == (1, -32602)


def test_a_file_that_is_not_a_transcript_is_refused(shared_daemon: DaemonProcess,
                                                     tmp_path: Path, sid: str) -> None:
    """A file of which no line (element) is a record is refused, not imported as nothing
    (docs/decisions.md, "Transcript importers"); records of types the parser does not know
    are kept as before."""
    readme = tmp_path / "README.md"
    readme.write_text("# ctxd\n\nA daemon.\n")
    array = tmp_path / "numbers.json"
    array.write_text("[1, 2]")
    with shared_daemon.client() as client:
        error = import_error(client, readme, session_id=sid)
        assert (error.code, error.data["path"], error.data["reason"]) == (
            -32602, "$.path", f"{readme} is not a Claude Code transcript: none of the 2 lines "
                              "read is a JSON record (an object with a `type`); an OpenCode "
                              "export is imported with format opencode")
        error = import_error(client, array, session_id=sid)
        assert (error.code, error.data["reason"]) == (
            -32602, f"{array} starts with [ but is not a JSON array of Claude Code records: "
                    "none of its 2 elements is a Claude Code record (an object with a `type`)")
        # Refused before anything is written: no session was opened for it.
        assert sid not in [s["session_id"] for s in client.call("session.list",
                                                                 {})["sessions"]]
        kept = tmp_path / "kept.jsonl"
        kept.write_text('{"type": "summary", "summary": "x"}\n')
        got = do_import(client, kept, session_id=sid)
        assert (got["messages_added"], got["lines_read"], got["unknown_kept"]) == (
            0, 1, {"summary": 1})
    done = ctxctl(shared_daemon.socket, "import", "claude-code", str(readme), "--session", sid)
    assert (done.returncode, done.stdout, done.stderr) == (
        1, "", f"ctxctl: {readme} is not a Claude Code transcript: none of the 2 lines read is "
               "a JSON record (an object with a `type`); an OpenCode export is imported with "
               "format opencode\nctxctl: next: give the path of a Claude Code JSONL "
               "transcript (~/.claude/projects/*/ID.jsonl)\n")


def test_no_daemon(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("{}\n")
    result = ctxctl(tmp_path / "none.sock", "import", "claude-code", str(path))
    assert result.returncode == 2
    assert result.stderr.startswith(f"ctxctl: no ctxd daemon is running on "
                                    f"{tmp_path / 'none.sock'}")
    assert f"start it with `{start_command()} --socket {tmp_path / 'none.sock'}`" in result.stderr


@pytest.mark.parametrize("fmt", ["claude-code", "opencode"])
def test_help_names_the_format(fmt: str, tmp_path: Path) -> None:
    result = ctxctl(tmp_path / "none.sock", "import", fmt, "-h")
    assert result.returncode == 0
    assert "--restart" in result.stdout


# ---- Claude Code sub-agent files ----

def subagent_layout(root: Path) -> tuple[Path, list[Path]]:
    """The recorded transcript laid out as Claude Code 2.1 writes it: the main thread in
    ``<session id>.jsonl``, each sub-agent chain (its real lines, with the ``agentId`` 2.1
    adds) in ``<session id>/subagents/agent-<id>.jsonl``."""
    records = [json.loads(raw) for raw in VIEWER.read_text().splitlines() if raw.strip()]
    session_id = next(r["sessionId"] for r in records if r.get("sessionId"))
    chain_of: dict[str, str] = {}
    chains: dict[str, list[dict[str, Any]]] = {}
    main = []
    for record in records:
        if not record.get("isSidechain"):
            main.append(record)
            continue
        first = chain_of.get(record["parentUuid"], record["uuid"])
        chain_of[record["uuid"]] = first
        chains.setdefault(first, []).append(record)
    path = root / f"{session_id}.jsonl"
    path.write_text("".join(line(r) for r in main))
    folder = root / session_id / "subagents"
    folder.mkdir(parents=True)
    agents = []
    for number, chain in enumerate(chains.values()):
        agent = folder / f"agent-a{number}.jsonl"
        agent.write_text("".join(line(r | {"agentId": f"a{number}"}) for r in chain))
        agents.append(agent)
    (folder / "notes.txt").write_text("not a transcript")
    return path, agents


@needs_data
def test_subagent_files_import_as_branches(shared_daemon: DaemonProcess, tmp_path: Path,
                                           sid: str) -> None:
    want = expected(VIEWER)
    path, agents = subagent_layout(tmp_path)
    with shared_daemon.client() as client:
        got = do_import(client, path, session_id=sid)
        assert (got["messages_added"], got["tool_results"], got["usage_records"],
                got["branches"], got["subagent_files"], got["malformed"], got["bytes_read"],
                got["offset"], got["size"]) == (
            want["messages"], want["tool_results"], want["usage"], 5, 5, [],
            sum(p.stat().st_size for p in [path, *agents]), path.stat().st_size,
            path.stat().st_size)
        totals = client.call("usage.get", {"session_id": sid})["totals"]
        assert (totals["calls"], totals["input_tokens"], totals["output_tokens"]) == (
            want["usage"], want["input"], want["output"])
        branches = client.call("branch.list", {"session_id": sid})["branches"]
        assert sorted(b["description"] for b in branches) == [
            f"sub-agent a{n}" for n in range(5)]
        assert {b["status"] for b in branches} == {"completed"}
        again = do_import(client, path, session_id=sid)
        assert (again["messages_added"], again["bytes_read"], again["branches"],
                again["subagent_files"]) == (0, 0, 0, 5)
        # A sub-agent that goes on: only its new lines, as a new branch.
        tail = json.loads(agents[1].read_text().splitlines()[-1])
        more = {"type": "user", "uuid": "extra-1", "parentUuid": tail["uuid"],
                "isSidechain": True, "agentId": "a1", "sessionId": tail["sessionId"],
                "message": {"role": "user", "content": "one more thing"}}
        with agents[1].open("a") as file:
            file.write(line(more) + "{torn\n")
        grown = do_import(client, path, session_id=sid)
        assert (grown["messages_added"], grown["branches"], grown["bytes_read"],
                grown["malformed"]) == (
            1, 1, len(line(more)) + 6,
            [{"line": len(agents[1].read_text().splitlines()), "error": grown["malformed"][0][
                "error"], "path": str(agents[1])}])


@needs_data
def test_subagent_stop_imports_the_agent_file_into_the_main_session(
        shared_daemon: DaemonProcess, tmp_path: Path, sid: str) -> None:
    """SubagentStop passes ``agent_transcript_path``: imported into the main session's id it
    is a branch, and the main transcript's import later does not add it again."""
    want = expected(VIEWER)
    path, agents = subagent_layout(tmp_path)
    with shared_daemon.client() as client:
        first = do_import(client, agents[2], session_id=sid)
        assert (first["created"], first["branches"], first["subagent_files"],
                first["offset"]) == (True, 1, 0, agents[2].stat().st_size)
        [branch] = client.call("branch.list", {"session_id": sid})["branches"]
        assert (branch["description"], branch["status"]) == ("sub-agent a2", "completed")
        rest = do_import(client, path, session_id=sid)
        assert (rest["branches"], rest["subagent_files"],
                first["messages_added"] + rest["messages_added"],
                first["usage_records"] + rest["usage_records"]) == (
            4, 5, want["messages"], want["usage"])


# ---- an import killed at each of its commits ----

def sub_agents_transcript(root: Path) -> Path:
    """A Claude Code transcript with three sidechains (two of them one after the other,
    flushed together) and a sub-agent file beside it: every kind of commit an import makes."""
    session = "cc-made-up"

    def result(uuid: str, parent: str, tool_use_id: str, text: str,
               **extra: Any) -> dict[str, Any]:
        return {"type": "user", "uuid": uuid, "parentUuid": parent, "sessionId": session,
                "message": {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": tool_use_id, "content": text}]},
                **extra}

    def task(uuid: str, parent: str, message_id: str, tool_use_id: str) -> dict[str, Any]:
        return assistant(uuid, parent, message_id, {
            "type": "tool_use", "id": tool_use_id, "name": "Task",
            "input": {"prompt": "look into it"}})

    records = [
        user("u1", None, "plan the release"),
        task("a1", "u1", "m1", "task1"),
        user("s1", None, "find the config", isSidechain=True),
        assistant("s2", "s1", "m2", {"type": "tool_use", "id": "rd1", "name": "Read",
                                     "input": {"file_path": "/etc/app.toml"}},
                  isSidechain=True),
        result("s3", "s2", "rd1", "version = 3", isSidechain=True),
        assistant("s4", "s3", "m3", {"type": "text", "text": "the config says version 3"},
                  isSidechain=True),
        user("t1", None, "count the tests", isSidechain=True),
        assistant("t2", "t1", "m4", {"type": "text", "text": "there are 7"},
                  isSidechain=True),
        result("r1", "a1", "task1", "version 3, 7 tests"),
        assistant("a2", "r1", "m5", {"type": "text", "text": "now the changelog"}),
        task("a3", "a2", "m6", "task2"),
        user("c1", None, "write the changelog", isSidechain=True),
        assistant("c2", "c1", "m7", {"type": "text", "text": "changelog: fixes"},
                  isSidechain=True),
        result("r2", "a3", "task2", "changelog: fixes"),
        assistant("a4", "r2", "m8", {"type": "text", "text": "released"}),
    ]
    path = root / f"{session}.jsonl"
    path.write_text("".join(line(r) for r in records))
    folder = root / session / "subagents"
    folder.mkdir(parents=True)
    (folder / "agent-a9.jsonl").write_text("".join(line(r | {"agentId": "a9"}) for r in [
        user("g1", None, "check the tags", isSidechain=True),
        assistant("g2", "g1", "m9", {"type": "text", "text": "tags are fine"},
                  isSidechain=True)]))
    return path


def import_state(client: Client, sid: str) -> dict[str, Any]:
    """What an import leaves in a session, with branch ids numbered in their order and
    no timestamps: every message of every thread, the branches, the usage, the session."""
    messages = client.call("message.list", {"session_id": sid, "limit": 1000})
    assert messages["next_cursor"] is None
    branches = client.call("branch.list", {"session_id": sid})["branches"]
    state = {
        "messages": messages["messages"], "branches": branches,
        "usage": client.call("usage.get", {"session_id": sid, "group_by": "branch"}),
        "session": client.call("session.get", {"session_id": sid})["session"],
    }
    text = json.dumps(state)
    for n, branch in enumerate(sorted(branches, key=lambda b: b["fork_seq"])):
        text = text.replace(branch["branch_id"], f"branch-{n}")

    def timeless(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: timeless(v) for k, v in value.items() if not k.endswith(
                ("_at", "deadline", "time_left_s")) and k not in ("session_id", "usage_id")}
        return [timeless(v) for v in value] if isinstance(value, list) else value

    found = timeless(json.loads(text))
    found["branches"].sort(key=lambda b: b["fork_seq"])
    found["usage"]["groups"].sort(key=lambda g: str(g["key"]))
    return found  # type: ignore[no-any-return]


def test_import_killed_at_each_commit_resumes_to_the_uninterrupted_state(
        daemon_root: Path, tmp_path: Path) -> None:
    """Killed (SIGKILL) before each commit the import makes and after its last, the daemon
    restarted and the import run again: the session is exactly as an uninterrupted import
    leaves it (every thread's messages, the branches, none of them active, the usage once),
    and context.compact works. After commit N is the state before commit N+1: the kills
    after the others add no state."""
    path = sub_agents_transcript(tmp_path)
    log = tmp_path / "commits"
    params = {"format": "claude-code", "path": str(path)}

    def launcher(session_id: str, **env: str) -> DaemonProcess:
        return DaemonProcess(daemon_root, entry=[KILL_AT_COMMIT],
                             env={"TEST_KILL_SESSION": session_id, **env})

    with launcher("whole", TEST_COMMIT_LOG=str(log)).running() as process, \
            process.client() as client:
        whole = client.call("transcript.import", {**params, "session_id": "whole"})
        reference = import_state(client, "whole")
    commits = len(log.read_text().splitlines())
    # The session; in the transcript, before each of its two sidechain groups the main
    # thread so far, then each sub-agent (branch with messages, fold), and the main thread's
    # end; in the sub-agent file, its position, its sub-agent, its end.
    assert (whole["branches"], whole["subagent_files"], commits) == (
        4, 1, 1 + (1 + 2 * 2) + (1 + 2) + 1 + (1 + 2 + 1))
    assert [b["status"] for b in reference["branches"]] == ["completed"] * 4
    kills = [("before", n) for n in range(1, commits + 1)] + [("after", commits)]

    compacted: list[dict[str, Any]] = []

    def without_session_id(result: dict[str, Any]) -> dict[str, Any]:
        state = {k: v for k, v in result["context_state"].items() if k != "session_id"}
        return result | {"context_state": state}

    def resumed(client: Client, sid: str) -> None:
        client.call("transcript.import", {**params, "session_id": sid})
        assert import_state(client, sid) == reference, sid
        assert client.call("branch.list", {"session_id": sid, "status": "active"}
                           )["branches"] == []
        compacted.append(without_session_id(client.call("context.compact",
                                                        {"session_id": sid})))

    previous = None
    for when, number in kills:
        sid = f"{when}-{number}"
        process = launcher(sid, TEST_KILL_AT_COMMIT=f"{when}:{number}").start()
        with process.client() as client:
            if previous is not None:
                resumed(client, previous)
            with pytest.raises(DaemonUnavailable):
                client.call("transcript.import", {**params, "session_id": sid})
        assert process.proc is not None
        assert process.proc.wait(20) == -9
        previous = sid
    with DaemonProcess(daemon_root).running() as process, process.client() as client:
        resumed(client, previous)
        whole_compacted = client.call("context.compact", {"session_id": "whole"})
    assert compacted == [without_session_id(whole_compacted)] * len(kills)


# ---- Bad records and bounds ----

DEEP_LINE = '{"type": "user", "message": ' + "[" * 100_000 + "]" * 100_000 + "}"
"""A record nested 100,000 deep: no JSON reader of the daemon reads it."""
HALF_EMOJI = "emoji cut in half: \ud83d"
"""A lone surrogate: json.dumps writes it escaped, as JavaScript does."""


def contents(client: Any, sid: str) -> list[Any]:
    return [m["content"] for m in client.call("message.list",
                                              {"session_id": sid, "limit": 1000})["messages"]]


@pytest.mark.parametrize("shape", ["jsonl", "array"])
def test_bad_records_are_skipped_and_the_rest_imported(shared_daemon: DaemonProcess,
                                                       tmp_path: Path, sid: str,
                                                       shape: str) -> None:
    """A lone surrogate is read as U+FFFD, a record nested 100,000 deep is skipped and
    reported with its position, and the 500 records after them are imported (a retry then
    has nothing left to add)."""
    good = [user(f"u{i}", None, f"request {i}") for i in range(500)]
    texts = [json.dumps(user("half", None, HALF_EMOJI)), DEEP_LINE,
             *(json.dumps(record) for record in good)]
    path = tmp_path / f"bad.{shape}"
    path.write_text("".join(text + "\n" for text in texts) if shape == "jsonl"
                    else "[" + ",\n".join(texts) + "]")
    with shared_daemon.client() as client:
        got = do_import(client, path, session_id=sid)
        assert (got["messages_added"], got["malformed"], got["lines_read"]) == (
            501, [{"line": 2, "error": "not JSON: nested too deep to read"}], 502)
        assert contents(client, sid) == ["emoji cut in half: \ufffd",
                                         *(f"request {i}" for i in range(500))]
        again = do_import(client, path, session_id=sid)
        assert (again["messages_added"], again["malformed"], again["lines_read"]) == (
            0, [], 0)


LIMIT = 65_536
"""The daemon's max_request_bytes in the tests of a record's size."""


@pytest.fixture(scope="module")
def small_daemon() -> Iterator[DaemonProcess]:
    """A daemon whose records (and requests) may have at most LIMIT bytes."""
    root = short_root()
    process = DaemonProcess(root, extra_args=["--max-request-bytes", str(LIMIT)]).start()
    yield process
    process.stop()
    kill_leftovers(root)
    shutil.rmtree(root, ignore_errors=True)


def over_limit(size: int) -> str:
    """A record of exactly ``size`` bytes of JSON."""
    head = json.dumps(user("big", None, ""))
    return head[:-3] + "x" * (size - len(head)) + head[-3:]


@pytest.mark.parametrize("shape", ["jsonl", "array"])
def test_a_record_over_the_limit_is_skipped_with_its_size(small_daemon: DaemonProcess,
                                                          tmp_path: Path, sid: str,
                                                          shape: str) -> None:
    """A record longer than max_request_bytes is not read into memory nor imported: it is
    reported with its position and size, and the records around it are imported."""
    big = over_limit(LIMIT + 1000)
    texts = [json.dumps(user("u1", None, "before")), big, json.dumps(user("u2", "u1", "after"))]
    path = tmp_path / f"big.{shape}"
    path.write_text("".join(text + "\n" for text in texts) if shape == "jsonl"
                    else "[" + ",".join(texts) + "]")
    with small_daemon.client() as client:
        got = do_import(client, path, session_id=sid)
        assert (got["messages_added"], got["malformed"]) == (2, [{
            "line": 2, "error": f"a record of {LIMIT + 1000:,} bytes, over the {LIMIT:,} a "
                                "record may have (max_request_bytes): skipped"}])
        assert contents(client, sid) == ["before", "after"]


def test_an_unterminated_last_line_is_not_read_again(small_daemon: DaemonProcess,
                                                     tmp_path: Path, sid: str) -> None:
    """A last line already longer than a record may be is read on from where the last
    import stopped. To see it, the bytes already read are changed in place (a newline put
    among them, past the first max_request_bytes that are checked): read again, they would
    make two lines. The line, once ended, is reported once with its whole size; the record
    after it is imported once."""
    first = line(user("u1", None, "first"))
    big = over_limit(LIMIT + 1000)
    path = tmp_path / "t.jsonl"
    path.write_text(first + big[:LIMIT + 500])
    with small_daemon.client() as client:
        got = do_import(client, path, session_id=sid)
        assert (got["messages_added"], got["malformed"], got["offset"]) == (
            1, [], len(first))
        with path.open("r+b") as file:
            file.seek(len(first) + LIMIT + 200)
            file.write(b"\n")
        again = do_import(client, path, session_id=sid)
        assert (again["messages_added"], again["malformed"], again["bytes_read"],
                again["offset"]) == (0, [], 0, len(first))
        last = line(user("u2", "u1", "last"))
        with path.open("a") as file:
            file.write(big[LIMIT + 500:] + "\n" + last)
        done = do_import(client, path, session_id=sid)
        assert (done["messages_added"], done["malformed"], done["lines_read"],
                done["bytes_read"], done["offset"]) == (
            1, [{"line": 2, "error": f"a record of {LIMIT + 1000:,} bytes, over the "
                                     f"{LIMIT:,} a record may have (max_request_bytes): "
                                     "skipped"}],
            2, LIMIT + 1001 + len(last), path.stat().st_size)
        assert do_import(client, path, session_id=sid)["messages_added"] == 0
        assert contents(client, sid) == ["first", "last"]


def test_an_unclosed_array_imports_its_complete_elements(shared_daemon: DaemonProcess,
                                                         tmp_path: Path, sid: str) -> None:
    """A JSON array is read as a stream of elements: one being written (no closing ``]``)
    imports the elements a comma ends, and the rest once the file grows."""
    records = [json.dumps(user(f"u{i}", None, f"request {i}")) for i in range(4)]
    path = tmp_path / "growing.json"
    path.write_text("[" + ",\n".join(records[:3]))
    with shared_daemon.client() as client:
        got = do_import(client, path, session_id=sid)
        assert (got["messages_added"], got["lines_read"], got["offset"]) == (2, 2, 2)
        path.write_text("[" + ",\n".join(records) + "]")
        grown = do_import(client, path, session_id=sid)
        assert (grown["messages_added"], grown["lines_read"], grown["offset"]) == (2, 2, 4)
        assert contents(client, sid) == [f"request {i}" for i in range(4)]


def test_an_opencode_export_with_bad_messages_imports_the_rest(shared_daemon: DaemonProcess,
                                                               tmp_path: Path) -> None:
    """An export's messages are read one by one: one nested 100,000 deep is reported at its
    index, a lone surrogate is U+FFFD, and the messages after them are imported."""
    half = {"info": {"id": "msg_h", "role": "user"},
            "parts": [{"type": "text", "text": HALF_EMOJI}]}
    after = {"info": {"id": "msg_z", "role": "user"}, "parts": [{"type": "text",
                                                                  "text": "after"}]}
    path = tmp_path / "export.json"
    path.write_text('{"info": {"id": "ses_bad_opencode"}, "messages": ['
                    + json.dumps(half) + ", " + "[" * 100_000 + "]" * 100_000 + ", "
                    + json.dumps(after) + "]}")
    with shared_daemon.client() as client:
        got = client.call("transcript.import", {"format": "opencode", "path": str(path)})
        assert (got["session_id"], got["messages_added"], got["malformed"], got["offset"]) == (
            "ses_bad_opencode", 2, [{"line": 2, "error": "not JSON: nested too deep to read"}],
            3)
        assert contents(client, "ses_bad_opencode") == [
            [{"type": "text", "text": "emoji cut in half: \ufffd"}],
            [{"type": "text", "text": "after"}]]


def test_a_token_count_too_large_to_store_counts_zero(shared_daemon: DaemonProcess,
                                                      tmp_path: Path, sid: str) -> None:
    """A usage count past what SQLite stores (2**63 - 1) is not a count: the record and
    those after it are imported, the count as 0 (it failed the import, -32603)."""
    big = assistant("a1", "u1", "msg_big", {"type": "text", "text": "hi"})
    big["message"]["usage"]["input_tokens"] = 10**30
    path = tmp_path / "t.jsonl"
    path.write_text(line(user("u1", None, "q")) + line(big) + line(user("u2", "a1", "after")))
    with shared_daemon.client() as client:
        got = do_import(client, path, session_id=sid)
        assert (got["messages_added"], got["usage_records"], got["malformed"]) == (3, 1, [])
        totals = client.call("usage.get", {"session_id": sid})["totals"]
        assert (totals["input_tokens"], totals["output_tokens"]) == (0, 5)

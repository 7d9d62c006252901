"""transcript.import against a real daemon: the recorded Claude Code transcripts with
exact counts computed here from the raw JSON, idempotent re-import, a grown file, a
malformed line, a replaced file, sub-agents as folded branches, and an OpenCode export with
every part type; `ctxctl import`: its summary, --json, and the next step told for each
error (docs/protocol.md, "transcript.import")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonProcess
from tests_support import rpc_error

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
    assert "start it with `ctxd`" in result.stderr


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

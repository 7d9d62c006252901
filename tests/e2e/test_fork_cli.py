"""`ctxctl fork`: a session's forked context, its figures (--stats, --json), a transcript
forked through a temporary session (--from), and the exit status of each error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonProcess


def ctxctl(socket: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}
    environ.pop("CTXD_SOCKET", None)
    return subprocess.run([sys.executable, "-m", "ctxclient.cli", "--socket", str(socket),
                           *args], capture_output=True, text=True, env=environ, timeout=120,
                          check=False)


MESSAGES = [
    {"role": "user", "content": "run the tests"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "bash",
                                       "input": {"command": "pytest"}}]},
    {"role": "tool", "content": "1 passed", "tool_call_id": "c1", "name": "bash"},
    {"role": "assistant", "content": "all green"},
]
PREAMBLE = (
    "[Forked context: a bounded copy of another session's conversation.]\n"
    "Compaction: none found; the context starts at the first message.\n"
    "Tool results: 1 newest kept whole, 0 cut to at most 3,000 characters, 0 cut to at most "
    "500 characters (0 truncated, 0 already cleared).\n"
    "Messages removed to fit the character budget: 0.\n"
    "Cut text is marked …[truncated N chars]…: re-read files for full contents.")
CONTEXT = ("[user]\nrun the tests\n\n"
           '[assistant]\n[tool_use bash id=c1] {"command": "pytest"}\n\n'
           "[tool: bash]\n1 passed\n\n[assistant]\nall green")
STATS = {"original_count": 4, "final_count": 4, "total_chars": len(CONTEXT),
         "removed_messages": 0, "compaction_detected": False, "compaction_slice_index": None,
         "truncated_results": 0, "tier_distribution": {"tier1": 1, "tier2": 0, "tier3": 0},
         "head_tail_applied": 0, "cleared_results": 0, "truncated_params": 0}


def seeded(daemon: DaemonProcess, sid: str) -> None:
    with daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        client.call("message.append", {"session_id": sid, "messages": MESSAGES})


def test_fork_prints_the_preamble_and_the_context(shared_daemon: DaemonProcess,
                                                  sid: str) -> None:
    seeded(shared_daemon, sid)
    done = ctxctl(shared_daemon.socket, "fork", sid)
    assert (done.returncode, done.stdout, done.stderr) == (0, PREAMBLE + "\n\n" + CONTEXT + "\n",
                                                           "")


def test_fork_stats(shared_daemon: DaemonProcess, sid: str) -> None:
    seeded(shared_daemon, sid)
    done = ctxctl(shared_daemon.socket, "fork", sid, "--stats", "--format", "tsv")
    assert done.returncode == 0, done.stderr
    rows = dict(line.split("\t") for line in done.stdout.splitlines()[1:])
    tokens = rows.pop("tokens")
    assert rows == {
        "original_count": "4", "final_count": "4", "total_chars": f"{len(CONTEXT):,}",
        "removed_messages": "0", "compaction_detected": "no", "compaction_slice_index": "-",
        "truncated_results": "0", "tier1": "1", "tier2": "0", "tier3": "0",
        "head_tail_applied": "0", "cleared_results": "0", "truncated_params": "0"}
    as_json = json.loads(ctxctl(shared_daemon.socket, "fork", sid, "--stats", "--json").stdout)
    assert as_json["stats"] == STATS
    assert f"{as_json['tokens']:,}" == tokens


def test_fork_json_is_the_result(shared_daemon: DaemonProcess, sid: str) -> None:
    seeded(shared_daemon, sid)
    done = ctxctl(shared_daemon.socket, "fork", sid, "--json")
    result: dict[str, Any] = json.loads(done.stdout)
    assert (result["preamble"], result["context"], result["stats"], result["session_id"],
            result["branch_id"]) == (PREAMBLE, CONTEXT, STATS, sid, None)


def claude_code_lines() -> str:
    records = [
        {"type": "user", "uuid": "u1", "parentUuid": None, "sessionId": "cc-fork",
         "message": {"role": "user", "content": "run the tests"}},
        {"type": "assistant", "uuid": "a1", "parentUuid": "u1", "sessionId": "cc-fork",
         "message": {"id": "m1", "role": "assistant", "model": "claude-x",
                     "content": [{"type": "tool_use", "id": "c1", "name": "bash",
                                  "input": {"command": "pytest"}}],
                     "usage": {"input_tokens": 1, "output_tokens": 1}}},
        {"type": "user", "uuid": "u2", "parentUuid": "a1", "sessionId": "cc-fork",
         "message": {"role": "user", "content": [
             {"type": "tool_result", "tool_use_id": "c1", "content": "1 passed"}]}},
        {"type": "assistant", "uuid": "a2", "parentUuid": "u2", "sessionId": "cc-fork",
         "message": {"id": "m2", "role": "assistant", "model": "claude-x",
                     "content": [{"type": "text", "text": "all green"}],
                     "usage": {"input_tokens": 1, "output_tokens": 1}}}]
    return "".join(json.dumps(record) + "\n" for record in records)


def test_fork_from_a_claude_code_transcript_leaves_no_session(shared_daemon: DaemonProcess,
                                                              tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(claude_code_lines())
    with shared_daemon.client() as client:
        before = client.call("session.list", {"limit": 1000})["sessions"]
    done = ctxctl(shared_daemon.socket, "fork", "--from", "claude-code", str(path))
    assert (done.returncode, done.stdout, done.stderr) == (0, PREAMBLE + "\n\n" + CONTEXT + "\n",
                                                           "")
    with shared_daemon.client() as client:
        after = client.call("session.list", {"limit": 1000})["sessions"]
    assert [s["session_id"] for s in after] == [s["session_id"] for s in before]


def test_fork_from_an_opencode_export(shared_daemon: DaemonProcess, tmp_path: Path) -> None:
    path = tmp_path / "export.json"
    path.write_text(json.dumps({"info": {"id": "ses_cli_fork"}, "messages": [
        {"info": {"id": "u1", "role": "user"},
         "parts": [{"type": "text", "text": "run the tests"}]},
        {"info": {"id": "a1", "role": "assistant"}, "parts": [
            {"type": "tool", "callID": "c1", "tool": "bash",
             "state": {"status": "completed", "input": {"command": "pytest"},
                       "output": "1 passed", "time": {"start": 1, "end": 2}}},
            {"type": "text", "text": "all green"}]}]}))
    done = ctxctl(shared_daemon.socket, "fork", "--from", "opencode", str(path), "--stats",
                  "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stats"] == STATS


def test_fork_errors(shared_daemon: DaemonProcess, tmp_path: Path) -> None:
    socket = shared_daemon.socket
    unknown = ctxctl(socket, "fork", "never-opened-session")
    assert (unknown.returncode, unknown.stdout) == (1, "")
    assert unknown.stderr.startswith("ctxctl: error -32004: ")
    missing = ctxctl(socket, "fork", "--from", "opencode", str(tmp_path / "nope.json"))
    assert (missing.returncode, missing.stderr) == (
        2, f"ctxctl: {tmp_path / 'nope.json'} does not exist\nctxctl: next: give the path of "
           "an OpenCode session export (`opencode export ID > FILE.json`)\n")
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    refused = ctxctl(socket, "fork", "--from", "opencode", str(bad))
    assert (refused.returncode, refused.stdout, refused.stderr) == (
        1, "", f"ctxctl: {bad} is not an OpenCode export: an OpenCode export is an object "
               "{info, messages: [...]}\nctxctl: next: give the path of an OpenCode session "
               "export (`opencode export ID > FILE.json`), or, if it is a Claude Code JSONL "
               f"transcript: ctxctl fork --from claude-code {bad}\n")
    wrong = ctxctl(socket, "fork", "--from", "codex", str(bad))
    assert (wrong.returncode, wrong.stderr) == (
        2, "ctxctl: --from takes claude-code or opencode, not 'codex'\n")
    neither = ctxctl(socket, "fork")
    assert (neither.returncode, neither.stderr) == (
        2, "ctxctl: fork takes a SESSION or --from FORMAT FILE (one of them)\n")


def test_fork_a_branch(shared_daemon: DaemonProcess, sid: str, tmp_path: Path) -> None:
    seeded(shared_daemon, sid)
    with shared_daemon.client() as client:
        branch = client.call("branch.create", {"session_id": sid, "description": "look",
                                               "prompt": "find it",
                                               "inject_memories": False})["branch_id"]
        native = client.call("context.fork", {"session_id": sid, "branch_id": branch})
    done = ctxctl(shared_daemon.socket, "fork", sid, "--branch", branch)
    assert (done.returncode, done.stdout) == (
        0, native["preamble"] + "\n\n" + native["context"] + "\n")
    both = ctxctl(shared_daemon.socket, "fork", "--from", "opencode", str(tmp_path / "x"),
                  "--branch", branch)
    assert (both.returncode, both.stderr) == (
        2, "ctxctl: --branch forks a branch of a SESSION, not of --from's file\n")


TRANSCRIPTS = Path(__file__).resolve().parents[3] / "shared" / "bench-data" / "transcripts"
TEMPLAR = TRANSCRIPTS / "claude-code_templar_chat.json"


@pytest.mark.skipif(not TEMPLAR.exists(), reason="bench-data transcripts absent")
def test_fork_from_a_json_array_of_claude_code_records(shared_daemon: DaemonProcess) -> None:
    """templar's records saved as one JSON array fork like its JSONL would (the counts of
    tests/e2e/test_fork.py)."""
    done = ctxctl(shared_daemon.socket, "fork", "--from", "claude-code", str(TEMPLAR),
                  "--stats", "--json")
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)["stats"]
    assert (stats["original_count"], stats["final_count"], stats["compaction_slice_index"],
            stats["total_chars"]) == (167, 32, 135, 21_503)


CLAUDE_NEXT = ("ctxctl: next: give the path of a Claude Code JSONL transcript, or, if it is "
               "an OpenCode session export (`opencode export ID > FILE.json`): ctxctl fork "
               "--from opencode {}\n")


def test_fork_from_a_file_that_is_not_a_transcript(shared_daemon: DaemonProcess,
                                                   tmp_path: Path) -> None:
    """Text, an OpenCode export and records of no conversation, given as Claude Code: exit
    1, the format expected and how to pick the other (docs/decisions.md, "Transcript
    importers")."""
    socket = shared_daemon.socket
    readme = tmp_path / "README.md"
    readme.write_text("# ctxd\n\nA daemon.\n")
    text = ctxctl(socket, "fork", "--from", "claude-code", str(readme))
    assert (text.returncode, text.stdout, text.stderr) == (
        1, "", f"ctxctl: {readme} is not a Claude Code transcript: none of the 2 lines read "
               "is a JSON record (an object with a `type`); an OpenCode export is imported "
               f"with format opencode\n" + CLAUDE_NEXT.format(readme))
    export = tmp_path / "export.json"
    export.write_text(json.dumps({"info": {"id": "ses_x"}, "messages": []}))
    one = ctxctl(socket, "fork", "--from", "claude-code", str(export))
    assert (one.returncode, one.stderr) == (
        1, f"ctxctl: {export} is not a Claude Code transcript: its one line is not a JSON "
           "record (an object with a `type`); an OpenCode export is imported with format "
           "opencode\n" + CLAUDE_NEXT.format(export))
    records = tmp_path / "records.jsonl"
    records.write_text('{"type": "summary", "summary": "x"}\nnot json\n'
                       '{"type": "file-history-snapshot"}\n')
    empty = ctxctl(socket, "fork", "--from", "claude-code", str(records))
    assert (empty.returncode, empty.stdout, empty.stderr) == (
        1, "", f"ctxctl: {records}: nothing to fork: no message in it as a Claude Code JSONL "
               "transcript (3 records read; 1 malformed; 2 of another type: "
               "file-history-snapshot, summary)\n" + CLAUDE_NEXT.format(records))
    with shared_daemon.client() as client:
        left = [s["session_id"] for s in client.call("session.list", {})["sessions"]
                if s["session_id"].startswith("fork-")]
    assert left == []


TRAJ = TRANSCRIPTS / "swe-agent_pydicom-1458.traj"


@pytest.mark.skipif(not TRAJ.exists(), reason="bench-data transcripts absent")
def test_fork_from_a_swe_agent_trajectory(shared_daemon: DaemonProcess) -> None:
    lines = [line for line in TRAJ.read_text().splitlines() if line.strip()]
    done = ctxctl(shared_daemon.socket, "fork", "--from", "claude-code", str(TRAJ), "--stats")
    assert (done.returncode, done.stdout, done.stderr) == (
        1, "", f"ctxctl: {TRAJ} is not a Claude Code transcript: none of the {len(lines)} "
               "lines read is a JSON record (an object with a `type`); an OpenCode export is "
               f"imported with format opencode\n" + CLAUDE_NEXT.format(TRAJ))
    assert len(lines) == 257

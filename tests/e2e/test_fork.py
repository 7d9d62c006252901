"""context.fork and session.open's fork_from against a real daemon: made-up sessions with
exact results, the recorded Claude Code transcripts and a made-up OpenCode export imported
with transcript.import, then forked (docs/protocol.md, "context.fork")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonProcess
from tests_support import rpc_error

from ctxd.tokens import TokenCounter

TRANSCRIPTS = Path(__file__).resolve().parents[3] / "shared" / "bench-data" / "transcripts"
VIEWER = TRANSCRIPTS / "claude-code_claude-code-viewer_fe5e1c67.jsonl"
DEEP = TRANSCRIPTS / "claude-code_claude-code-log_deep-manifest_a7da6a22.jsonl"
TEMPLAR = TRANSCRIPTS / "claude-code_templar_chat.json"
needs_data = pytest.mark.skipif(not VIEWER.exists(), reason="bench-data transcripts absent")


def call(call_id: str, name: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant",
            "content": [{"type": "tool_use", "id": call_id, "name": name, "input": params}]}


def result(call_id: str, text: str, name: str = "read") -> dict[str, Any]:
    return {"role": "tool", "content": text, "tool_call_id": call_id, "name": name}


def made_up(results: int = 16) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "read the files"}]
    for index in range(results):
        messages += [call(f"c{index}", "read", {"path": f"f{index}.py"}),
                     result(f"c{index}", f"{index:02d}" * 2_000)]
    return [*messages, {"role": "assistant", "content": "done"}]


def stats(**fields: Any) -> dict[str, Any]:
    base = {"removed_messages": 0, "compaction_detected": False,
            "compaction_slice_index": None, "head_tail_applied": 0, "cleared_results": 0,
            "truncated_params": 0}
    return base | fields


def test_fork_of_a_made_up_session(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        client.call("message.append", {"session_id": sid, "messages": made_up()})
        got = client.call("context.fork", {"session_id": sid})
        blocks = got["context"].split("\n\n")
        # 16 results of 4,000 characters: the oldest one cut to 500, ten to 3,000, five whole.
        assert blocks[0] == "[user]\nread the files"
        assert blocks[2] == "[tool: read]\n" + "00" * 250 + "…[truncated 3500 chars]…"
        assert blocks[4] == "[tool: read]\n" + "01" * 1_500 + "…[truncated 1000 chars]…"
        assert blocks[24] == "[tool: read]\n" + "11" * 2_000
        assert blocks[-1] == "[assistant]\ndone"
        assert got["stats"] == stats(
            original_count=34, final_count=34, total_chars=len(got["context"]),
            truncated_results=11,
            tier_distribution={"tier1": 5, "tier2": 10, "tier3": 1})
        assert got["preamble"].splitlines()[2] == (
            "Tool results: 5 newest kept whole, 10 cut to at most 3,000 characters, 1 cut to "
            "at most 500 characters (11 truncated, 0 already cleared).")
        assert got["tokens"] == TokenCounter().count(got["preamble"] + "\n\n" + got["context"])
        small = client.call("context.fork", {"session_id": sid, "char_budget": 20_000,
                                             "no_removal_chars": 10_000})
        # The request (the only user message) always stays; then from the call of result
        # 12 on: four results whole and the tail fit 20,000.
        assert small["stats"]["removed_messages"] == 24
        assert small["context"].startswith(
            "[user]\nread the files\n\n[assistant]\n[tool_use read id=c12]")
        assert small["stats"]["total_chars"] <= 20_000


def test_fork_of_a_session_ctxd_compacted(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid, "budget": {
            "context_window": 4_096, "max_output_tokens": 0}})
        appended = client.call("message.append", {"session_id": sid, "allow_over": True,
                                                  "messages": [
            {"role": "user", "content": f"request {i}: " + "word " * 600} if i % 2 == 0
            else {"role": "assistant", "content": f"answer {i}: " + "done " * 600}
            for i in range(8)]})
        assert [c["summarized"] for c in appended["compactions"]] == [6]
        got = client.call("context.fork", {"session_id": sid})
        thread = client.call("ctxd.render", {"session_id": sid})["messages"]
    # The summary stands first in the kept thread: the fork starts there and keeps all.
    assert got["stats"] == stats(original_count=3, final_count=3,
                                 total_chars=len(got["context"]), compaction_detected=True,
                                 compaction_slice_index=0, truncated_results=0,
                                 tier_distribution={"tier1": 0, "tier2": 0, "tier3": 0})
    assert got["context"] == "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in thread)
    assert got["preamble"].splitlines()[1] == (
        "Compaction: the context was compacted before; it starts at the latest compaction "
        "summary (0 earlier messages left out).")


def test_fork_of_a_branch(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        client.call("message.append", {"session_id": sid, "messages": [
            {"role": "user", "content": "main work"}]})
        branch = client.call("branch.create", {"session_id": sid, "description": "look",
                                               "prompt": "find the bug",
                                               "inject_memories": False})["branch_id"]
        client.call("message.append", {"session_id": sid, "branch_id": branch, "messages": [
            call("b1", "grep", {"pattern": "bug"}), result("b1", "a.py:3: bug", "grep")]})
        own = client.call("message.list", {"session_id": sid, "branch_id": branch})
        got = client.call("context.fork", {"session_id": sid, "branch_id": branch})
    # The branch's own messages only: its opening, then its work.
    assert got["branch_id"] == branch
    assert got["stats"]["original_count"] == len(own["messages"])
    assert got["context"].endswith('\n\n[assistant]\n[tool_use grep id=b1] '
                                   '{"pattern": "bug"}\n\n[tool: grep]\na.py:3: bug')
    assert "main work" not in got["context"]


def test_fork_from_seeds_a_new_session(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        client.call("message.append", {"session_id": sid, "messages": [
            {"role": "user", "content": "list files"}, call("c1", "bash", {"command": "ls"}),
            result("c1", "a.py", name="bash"), {"role": "assistant", "content": "one file"}]})
        fork = client.call("context.fork", {"session_id": sid})
        opened = client.call("session.open", {"session_id": sid + "-child",
                                              "fork_from": {"session_id": sid}})
        assert (opened["created"], opened["session"]["message_count"]) == (True, 5)
        listed = client.call("message.list", {"session_id": sid + "-child"})["messages"]
        assert [(m["seq"], m["role"], m["content"], m.get("name"), m.get("tool_call_id"),
                 m.get("meta")) for m in listed] == [
            (1, "user", fork["preamble"], None, None,
             {"fork": {"session_id": sid, "branch_id": None}}),
            (2, "user", "list files", None, None, None),
            (3, "assistant", [{"type": "tool_use", "id": "c1", "name": "bash",
                               "input": {"command": "ls"}}], None, None, None),
            (4, "tool", "a.py", "bash", "c1", None),
            (5, "assistant", "one file", None, None, None)]
        child = sid + "-child"
        rendered = client.call("ctxd.render", {"session_id": child})
        assert opened["context_state"]["main_thread_tokens"] == rendered["tokens"]
        assert [m["content"] for m in rendered["messages"]] == [m["content"] for m in listed]
        more = client.call("message.append", {"session_id": child, "messages": [
            {"role": "user", "content": "go on"}]})
        assert [a["seq"] for a in more["appended"]] == [6]
        error = rpc_error(client, "session.open", {"session_id": sid,
                                                   "fork_from": {"session_id": sid}})
        assert error.code == -32003
        error = rpc_error(client, "session.open", {"fork_from": {"session_id": "nope-x"}})
        assert error.code == -32004


# ---- real and made-up transcripts ------------------------------------------------------

def record_messages(record: dict[str, Any]) -> tuple[int, int]:
    """The messages and the tool results an imported record becomes (the rules of
    tests/e2e/test_import.py: a tool result per tool_result block, a message per assistant
    record with text or tool_use, a user message per user record with other blocks)."""
    content = record["message"]["content"]
    blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
    if record["type"] == "assistant":
        return int(any(b["type"] in ("text", "tool_use") for b in blocks)), 0
    results = sum(b["type"] == "tool_result" for b in blocks)
    return results + any(b["type"] != "tool_result" for b in blocks), results


def raw_expectations(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What the fork of an imported transcript's main thread must show, counted from the raw
    records: its messages, whether a compaction summary is there, the messages from the
    latest one on, and their tool results by tier."""
    main = [r for r in records if r.get("type") in ("user", "assistant")
            and not r.get("isSidechain")]
    counts = [record_messages(r) for r in main]
    summaries = [i for i, r in enumerate(main) if r.get("isCompactSummary")]
    start = summaries[-1] if summaries else 0
    before = sum(messages for messages, _ in counts[:start])
    kept = sum(messages for messages, _ in counts[start:])
    results = sum(tool_results for _, tool_results in counts[start:])
    # Each sub-agent (a sidechain's root record) is a branch whose fold message joins the
    # main thread; no recorded file has both sub-agents and a compaction summary.
    folds = sum(1 for r in records if r.get("isSidechain") and r.get("parentUuid") is None)
    assert not (folds and summaries)
    kept += folds
    return {"original_count": before + kept, "final_count": kept,
            "compaction_detected": bool(summaries),
            "compaction_slice_index": before if summaries else None,
            "tier_distribution": {"tier1": min(5, results),
                                  "tier2": min(10, max(0, results - 5)),
                                  "tier3": max(0, results - 15)}}


def fork_of(client: Any, path: Path, fmt: str = "claude-code") -> dict[str, Any]:
    imported = client.call("transcript.import", {"format": fmt, "path": str(path)})
    return client.call("context.fork",  # type: ignore[no-any-return]
                       {"session_id": imported["session_id"]})


@needs_data
@pytest.mark.parametrize(("name", "pinned"), [
    # Pinned from the daemon's answer (the counts of messages, compaction and tiers are
    # computed from the raw records by raw_expectations): each file's forked context is
    # under 120,000 characters (nothing removed), and the truncation markers are counted
    # in the context below.
    ("viewer", {"original_count": 37, "final_count": 37, "total_chars": 27_521,
                "removed_messages": 0, "compaction_slice_index": None,
                "truncated_results": 0, "head_tail_applied": 2, "truncated_params": 9}),
    ("deep", {"original_count": 299, "final_count": 299, "total_chars": 92_413,
              "removed_messages": 0, "compaction_slice_index": None,
              "truncated_results": 55, "head_tail_applied": 77, "truncated_params": 63}),
    ("templar", {"original_count": 167, "final_count": 32, "total_chars": 21_503,
                 "removed_messages": 0, "compaction_slice_index": 135,
                 "truncated_results": 0, "head_tail_applied": 7, "truncated_params": 14})])
def test_recorded_claude_code_transcripts(shared_daemon: DaemonProcess,
                                          name: str, pinned: dict[str, Any]) -> None:
    path = {"viewer": VIEWER, "deep": DEEP, "templar": TEMPLAR}[name]
    # templar's records are one JSON array, imported as it is.
    records = json.loads(path.read_text()) if name == "templar" else [
        json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    with shared_daemon.client() as client:
        got = fork_of(client, path)
    stats_got = got["stats"]
    want = raw_expectations(records)
    assert {k: stats_got[k] for k in want} == want
    assert {k: stats_got[k] for k in pinned} == pinned
    assert got["context"].count("…[truncated ") == (
        stats_got["truncated_results"] + stats_got["truncated_params"])
    summaries = [r for r in records if r.get("isCompactSummary")]
    if summaries:
        # The latest of the summaries (templar has two) opens the context.
        content = summaries[-1]["message"]["content"]
        text = content if isinstance(content, str) else "\n".join(
            b["text"] for b in content if b["type"] == "text")
        assert got["context"].startswith(f"[user]\n{text}\n\n")


OPENCODE = {
    "info": {"id": "ses_fork_opencode", "title": "made up"},
    "messages": [
        {"info": {"id": "u1", "role": "user"}, "parts": [{"type": "text", "text": "fix it"}]},
        {"info": {"id": "a1", "role": "assistant"}, "parts": [
            {"type": "tool", "callID": "k1", "tool": "read",
             "state": {"status": "completed", "input": {"path": "a.py"}, "output": "A" * 900,
                       "time": {"start": 1, "end": 2, "compacted": 3}}}]},
        {"info": {"id": "u2", "role": "user"}, "parts": [{"type": "compaction", "auto": True}]},
        {"info": {"id": "a2", "role": "assistant", "summary": True},
         "parts": [{"type": "text", "text": "Summary: a.py has the bug"}]},
        {"info": {"id": "u3", "role": "user"}, "parts": [{"type": "text", "text": "go on"}]},
        {"info": {"id": "a3", "role": "assistant"}, "parts": [
            {"type": "tool", "callID": "k2", "tool": "read",
             "state": {"status": "completed", "input": {"path": "b.py"}, "output": "B" * 600,
                       "time": {"start": 4, "end": 5, "compacted": 6}}},
            {"type": "tool", "callID": "k3", "tool": "bash",
             "state": {"status": "error", "input": {"command": "pytest"},
                       "error": "FAILED test_a", "time": {"start": 6, "end": 7}}},
            {"type": "text", "text": "the test fails"}]},
    ],
}


def test_made_up_opencode_export(shared_daemon: DaemonProcess, tmp_path: Path) -> None:
    path = tmp_path / "export.json"
    path.write_text(json.dumps(OPENCODE))
    with shared_daemon.client() as client:
        got = fork_of(client, path, "opencode")
    # Imported: u1, a1's call, its result, u2, a2, u3, a3's two calls and results, a3's text.
    assert got["stats"] == stats(
        original_count=11, final_count=7, total_chars=len(got["context"]),
        compaction_detected=True, compaction_slice_index=4, truncated_results=0,
        cleared_results=1, tier_distribution={"tier1": 2, "tier2": 0, "tier3": 0})
    assert got["context"] == "\n\n".join([
        "[assistant]\nSummary: a.py has the bug", "[user]\ngo on",
        '[assistant]\n[tool_use read id=k2] {"path": "b.py"}',
        "[tool: read]\n[Old tool result content cleared]",
        '[assistant]\n[tool_use bash id=k3] {"command": "pytest"}',
        "[tool: bash]\nFAILED test_a", "[assistant]\nthe test fails"])

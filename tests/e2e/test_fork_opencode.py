"""context.fork of OpenCode's own exports (tests/opencode_runs.py: the real OpenCode against
the mock model), imported with ``transcript.import``: the stats, the preamble and the context
expected here are computed from the export's JSON by the rules of docs/protocol.md
("transcript.import", "context.fork"), not read back from ctxd. The exports are made at
test time, never stored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonProcess
from opencode_runs import (
    BUILD_LOG,
    OPENCODE,
    SUMMARY,
    TIER_CALLS,
    export_once,
    exported_compacted_session,
    exported_tiers_session,
    exported_tool_session,
)

from ctxd.tokens import TokenCounter

pytestmark = pytest.mark.skipif(
    OPENCODE is None, reason="opencode not installed (npm install opencode-ai; .ci/run does)")

ERROR_WORDS = ("error", "Error", "ERROR", "failed", "FAIL", "exception", "traceback")


def tool_text(part: dict[str, Any]) -> str:
    state = part["state"]
    return str(state["output"] if state["status"] == "completed" else state["error"])


def cut(text: str, limit: int | None, head_tail: bool) -> str:
    """docs/protocol.md, "context.fork", Stage 2: at most ``limit`` characters and the
    marker; 80% head and 20% tail, or the head only."""
    if limit is None or len(text) <= limit:
        return text
    marker = f"…[truncated {len(text) - limit} chars]…"
    head = int(limit * 0.8) if head_tail else limit
    tail = limit - head
    return text[:head] + marker + (text[len(text) - tail:] if tail else "")


def head_tail(tool: str, text: str) -> bool:
    return "bash" in tool.lower() or any(word in text for word in ERROR_WORDS)


class Stage2:
    """Stage 2's tiers (by call id) and what it cut, counted as the stats count them."""

    def __init__(self, parts: list[dict[str, Any]]) -> None:
        ranks = range(len(parts) - 1, -1, -1)
        self.tiers = {p["callID"]: 0 if r < 5 else 1 if r < 15 else 2
                      for p, r in zip(parts, ranks, strict=True)}
        self.truncated = self.head_tail = self.params = 0

    def result(self, part: dict[str, Any]) -> str:
        text = tool_text(part)
        limit = (None, 3_000, 500)[self.tiers[part["callID"]]]
        if limit is not None and len(text) > limit:
            self.truncated += 1
            self.head_tail += head_tail(part["tool"], text)
            return cut(text, limit, head_tail(part["tool"], text))
        return text

    def call(self, part: dict[str, Any]) -> str:
        params = part["state"]["input"]
        text = json.dumps(params, ensure_ascii=False)
        limit = (500, 200, 100)[self.tiers[part["callID"]]]
        if len(text) > limit:
            self.params += 1
            self.head_tail += head_tail(part["tool"], text)
            params = {"truncated_input": cut(text, limit, head_tail(part["tool"], text))}
        return json.dumps(params, ensure_ascii=False)


def imported(item: dict[str, Any], stage2: Stage2 | None = None) -> list[str]:
    """The blocks of the messages an OpenCode message becomes: each tool part closes an
    assistant message (its text so far and the call) and adds a ``tool`` message; what
    follows the last one (text, step, compaction parts) is one more message. A block is
    ``[role]`` then the text; a call ``[tool_use NAME id=ID] INPUT``."""
    role = item["info"]["role"]
    out: list[str] = []
    lines: list[str] = []
    pending = False
    for part in item["parts"]:
        if part["type"] == "text":
            lines.append(part["text"])
        elif part["type"] == "tool":
            params = stage2.call(part) if stage2 else ""
            lines.append(f"[tool_use {part['tool']} id={part['callID']}] {params}")
            out.append("\n".join([f"[{role}]", *lines]))
            out.append(f"[tool: {part['tool']}]\n" + (stage2.result(part) if stage2 else ""))
            lines, pending = [], False
            continue
        pending = True
    if lines or pending:
        out.append("\n".join([f"[{role}]", *lines]) if lines else f"[{role}]\n")
    return out


def kept(export: dict[str, Any]) -> tuple[list[dict[str, Any]], int | None, int]:
    """Stage 1 on the export: the messages a fork keeps, in its order (OpenCode's summary,
    the tail its compaction part names, what followed the summary), the summary's index
    among the imported messages, and how many imported messages the tail holds."""
    items = export["messages"]
    asked = [i for i, item in enumerate(items)
             if any(p["type"] == "compaction" for p in item["parts"])]
    if not asked:
        return items, None, 0
    request = asked[-1]
    summary = next(i for i in range(request + 1, len(items))
                   if items[i]["info"].get("summary") is True)
    [part] = [p for p in items[request]["parts"] if p["type"] == "compaction"]
    ids = [item["info"]["id"] for item in items[:request]]
    tail = items[ids.index(part["tail_start_id"]):request] \
        if part.get("tail_start_id") in ids else []
    before = sum(len(imported(item)) for item in items[:summary])
    return ([items[summary], *tail, *items[summary + 1:]], before,
            sum(len(imported(item)) for item in tail))


def expected(export: dict[str, Any]) -> tuple[dict[str, Any], str, int]:
    """The fork's stats, context and tail length for ``export``."""
    items, summary, tail = kept(export)
    stage2 = Stage2([p for item in items for p in item["parts"] if p["type"] == "tool"])
    blocks = [block for item in items for block in imported(item, stage2)]
    context = "\n\n".join(blocks)
    assert len(context) <= 120_000  # so Stage 3 removes nothing
    tiers = list(stage2.tiers.values())
    stats = {
        "original_count": sum(len(imported(item)) for item in export["messages"]),
        "final_count": len(blocks), "total_chars": len(context), "removed_messages": 0,
        "compaction_detected": summary is not None, "compaction_slice_index": summary,
        "truncated_results": stage2.truncated,
        "tier_distribution": {"tier1": tiers.count(0), "tier2": tiers.count(1),
                              "tier3": tiers.count(2)},
        "head_tail_applied": stage2.head_tail, "cleared_results": 0,
        "truncated_params": stage2.params}
    return stats, context, tail


def preamble(stats: dict[str, Any], tail: int) -> str:
    tiers = stats["tier_distribution"]
    if stats["compaction_detected"]:
        left_out = stats["compaction_slice_index"] - tail
        compaction = ("Compaction: the context was compacted before; it starts at the latest "
                      f"compaction summary, then the {tail} messages the agent kept verbatim "
                      f"before it ({left_out} earlier messages left out).")
    else:
        compaction = "Compaction: none found; the context starts at the first message."
    return "\n".join((
        "[Forked context: a bounded copy of another session's conversation.]", compaction,
        f"Tool results: {tiers['tier1']} newest kept whole, {tiers['tier2']} cut to at most "
        f"3,000 characters, {tiers['tier3']} cut to at most 500 characters "
        f"({stats['truncated_results']} truncated, 0 already cleared).",
        "Messages removed to fit the character budget: 0.",
        "Cut text is marked …[truncated N chars]…: re-read files for full contents."))


def forked(daemon: DaemonProcess, path: Path, export: dict[str, Any]) -> dict[str, Any]:
    path.write_text(json.dumps(export))
    with daemon.client() as ctxd:
        done = ctxd.call("transcript.import", {"format": "opencode", "path": str(path)})
        assert (done["created"], done["malformed"]) == (True, [])
        result: dict[str, Any] = ctxd.call("context.fork", {"session_id": done["session_id"]})
    return result


def ctxctl_fork(socket: Path, path: Path) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "NO_COLOR": "1"}
    environ.pop("CTXD_SOCKET", None)
    return subprocess.run([sys.executable, "-m", "ctxclient.cli", "--socket", str(socket),
                           "fork", "--from", "opencode", str(path), "--stats", "--json"],
                          capture_output=True, text=True, env=environ, timeout=120,
                          check=False)


def test_fork_of_a_session_of_built_in_tools(tmp_path: Path, run_folder: Path,
                                             daemon: DaemonProcess) -> None:
    export = export_once(run_folder, exported_tool_session)
    got = forked(daemon, tmp_path / "export.json", export)
    stats, context, _ = expected(export)
    # No compaction: 16 messages, all kept; the four results are the newest five's tier, so
    # even the 31,000-character build log is whole.
    assert stats == {
        "original_count": 16, "final_count": 16, "total_chars": len(context),
        "removed_messages": 0, "compaction_detected": False, "compaction_slice_index": None,
        "truncated_results": 0, "tier_distribution": {"tier1": 4, "tier2": 0, "tier3": 0},
        "head_tail_applied": 0, "cleared_results": 0, "truncated_params": 0}
    assert (got["stats"], got["context"], got["preamble"]) == (
        stats, context, preamble(stats, 0))
    assert f"[tool: bash]\n{BUILD_LOG}" in got["context"]
    assert got["tokens"] == TokenCounter().count(got["preamble"] + "\n\n" + got["context"])

    # The same through ctxctl, from the export file.
    done = ctxctl_fork(daemon.socket, tmp_path / "export.json")
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout)["stats"] == stats


def test_fork_of_a_session_opencode_compacted(tmp_path: Path, run_folder: Path,
                                              daemon: DaemonProcess) -> None:
    export = export_once(run_folder, exported_compacted_session)
    items = export["messages"]
    [request] = [item for item in items if item["parts"][0]["type"] == "compaction"]
    # OpenCode kept its newest turns verbatim from the answer after the six logs on: the
    # tail is that answer, the next two turns, and the deploy step (its call and output).
    tail_start = request["parts"][0]["tail_start_id"]
    [first] = [item for item in items if item["info"]["id"] == tail_start]
    assert [p["text"] for p in first["parts"] if p["type"] == "text"] == [
        "All six logs are clean."]
    got = forked(daemon, tmp_path / "export.json", export)
    stats, context, tail = expected(export)
    # 30 imported messages; the summary is the 28th (index 27); kept: the summary, the 7
    # of the tail, the continuation and the answer after it. The deploy output is the only
    # result left (the six logs are in the summary's span), the newest: whole.
    assert (stats, tail) == ({
        "original_count": 30, "final_count": 10, "total_chars": len(context),
        "removed_messages": 0, "compaction_detected": True, "compaction_slice_index": 27,
        "truncated_results": 0, "tier_distribution": {"tier1": 1, "tier2": 0, "tier3": 0},
        "head_tail_applied": 0, "cleared_results": 0, "truncated_params": 0}, 7)
    assert (got["stats"], got["context"], got["preamble"]) == (
        stats, context, preamble(stats, tail))
    assert got["preamble"].splitlines()[1] == (
        "Compaction: the context was compacted before; it starts at the latest compaction "
        "summary, then the 7 messages the agent kept verbatim before it (20 earlier "
        "messages left out).")
    # It starts with OpenCode's summary, holds the tail and its tool output, then what
    # followed; the six logs the summary covers are gone.
    blocks = got["context"].split("\n\n")
    assert blocks[:3] == [f"[assistant]\n{SUMMARY}", "[assistant]\nAll six logs are clean.",
                          '[user]\n"Are they clean?"']
    assert '[assistant]\n[tool_use bash id=call_deploy] {"command": "echo deployed", ' \
           '"description": "Deploy"}\n\n[tool: bash]\ndeployed\n' in got["context"]
    assert blocks[-1] == "[assistant]\nDeployed."
    assert "of the log 0: ok" not in got["context"]
    assert got["tokens"] == TokenCounter().count(got["preamble"] + "\n\n" + got["context"])


def test_fork_of_a_session_with_every_tier(tmp_path: Path, run_folder: Path,
                                           daemon: DaemonProcess) -> None:
    export = export_once(run_folder, exported_tiers_session)
    got = forked(daemon, tmp_path / "export.json", export)
    stats, context, _ = expected(export)
    # 17 results (tests/opencode_runs.py, `exported_tiers_session`), oldest first:
    # tier 3: two bash outputs of 4,500 characters, cut to 500 head+tail, and their
    # parameters (117 characters) to 100, head+tail too; tier 2: seven over 3,000 cut —
    # three bash outputs and two reads of errors.txt (its ERROR, and its name in the
    # output's path) head+tail, two reads of big.txt head only — and three bash outputs of
    # 1,500 characters whole; tier 1: the newest five whole. Counted by hand from the
    # kinds of `exported_tiers_session`, and computed from the export by `expected`.
    assert stats == {
        # The prompt; per step a call, its result and the step's end; the answer.
        "original_count": 3 * TIER_CALLS + 2, "final_count": 3 * TIER_CALLS + 2,
        "total_chars": len(context), "removed_messages": 0, "compaction_detected": False,
        "compaction_slice_index": None, "truncated_results": 9,
        "tier_distribution": {"tier1": 5, "tier2": 10, "tier3": 2},
        "head_tail_applied": 9, "cleared_results": 0, "truncated_params": 2}
    assert (got["stats"], got["context"], got["preamble"]) == (
        stats, context, preamble(stats, 0))
    # The oldest result, by the rule: its first 400 characters and its last 100.
    output = "".join(f"line {i:04d} of the output 0: ok\n" for i in range(150))
    call = got["context"].index("[tool_use bash id=call_00]")
    assert got["context"][call:].split("\n\n", 1)[1].startswith(
        "[tool: bash]\n" + output[:400] + "…[truncated 4000 chars]…" + output[-100:]
        + "\n\n[assistant]\n")
    assert got["tokens"] == TokenCounter().count(got["preamble"] + "\n\n" + got["context"])

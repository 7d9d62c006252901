"""OpenCode's own exports (``opencode export``) of sessions the real OpenCode ran against
the mock model, imported with ``transcript.import``: the counts computed here from the
export's JSON are the importer's. The exports are made at test time, never stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonProcess
from opencode_runs import (
    BIG_LINES,
    BIG_OUTPUTS,
    BUILD_LOG,
    CONFIG_TOML,
    OPENCODE,
    SUMMARY,
    export_once,
    exported_compacted_session,
    exported_tool_session,
)

pytestmark = pytest.mark.skipif(
    OPENCODE is None, reason="opencode not installed (npm install opencode-ai; .ci/run does)")


def expected(export: dict[str, Any]) -> dict[str, int]:
    """What importing ``export`` adds, by docs/protocol.md, "transcript.import": each tool
    part is the assistant message up to its call plus a ``tool`` message; what follows the
    last tool part (text, step and compaction parts) is one more message; each assistant
    message is one usage record; one with ``summary: true`` is a compaction."""
    counts = {"messages_added": 0, "tool_results": 0, "usage_records": 0, "compactions": 0,
              "compacted_parts": 0, "errors": 0, "input_tokens": 0, "output_tokens": 0}
    for item in export["messages"]:
        info, parts = item["info"], item["parts"]
        tools = [i for i, part in enumerate(parts) if part["type"] == "tool"]
        rest = parts[tools[-1] + 1:] if tools else parts
        counts["messages_added"] += 2 * len(tools) + (1 if rest else 0)
        counts["tool_results"] += len(tools)
        counts["compacted_parts"] += sum(
            parts[i]["state"]["time"].get("compacted") is not None for i in tools)
        counts["errors"] += sum(parts[i]["state"]["status"] == "error" for i in tools)
        if info["role"] == "assistant":
            counts["usage_records"] += 1
            counts["compactions"] += info.get("summary") is True
            counts["input_tokens"] += info["tokens"]["input"]
            counts["output_tokens"] += info["tokens"]["output"]
    return counts


def tool_parts(export: dict[str, Any]) -> list[dict[str, Any]]:
    return [part for item in export["messages"] for part in item["parts"]
            if part["type"] == "tool"]


def imported(daemon: DaemonProcess, path: Path, export: dict[str, Any]) -> dict[str, int]:
    """Import ``export`` (written to ``path``) and count as `expected` does, from the
    import's answer and the session's messages and usage."""
    path.write_text(json.dumps(export))
    with daemon.client() as ctxd:
        done = ctxd.call("transcript.import", {"format": "opencode", "path": str(path)})
        session_id = export["info"]["id"]
        assert (done["session_id"], done["created"], done["malformed"]) == (
            session_id, True, [])
        again = ctxd.call("transcript.import", {"format": "opencode", "path": str(path)})
        assert (again["messages_added"], again["usage_records"]) == (0, 0)
        messages = ctxd.call("message.list", {"session_id": session_id,
                                              "limit": 1000})["messages"]
        totals = ctxd.call("usage.get", {"session_id": session_id})["totals"]
    originals = [m for m in messages if not (m.get("meta") or {}).get("compaction")]
    tools = [m for m in originals if m["role"] == "tool"]
    assert len(originals) == done["messages_added"]
    assert len(tools) == done["tool_results"]
    return {"messages_added": done["messages_added"], "tool_results": done["tool_results"],
            "usage_records": done["usage_records"], "compactions": done["compactions"],
            "compacted_parts": sum("compacted" in m["meta"] for m in tools),
            "errors": sum(m["meta"].get("is_error") is True for m in tools),
            "input_tokens": totals["input_tokens"], "output_tokens": totals["output_tokens"]}


def test_a_session_of_built_in_tools(tmp_path: Path, run_folder: Path,
                                     daemon: DaemonProcess) -> None:
    export = export_once(run_folder, exported_tool_session)
    # What OpenCode stored: the whole outputs, the failed read as an error part, the
    # failed command as a completed one (its output is the error).
    parts = tool_parts(export)
    assert [(p["tool"], p["callID"], p["state"]["status"]) for p in parts] == [
        ("bash", "call_build", "completed"), ("read", "call_read", "completed"),
        ("read", "call_missing", "error"), ("bash", "call_ls", "completed")]
    assert parts[0]["state"]["output"] == BUILD_LOG
    assert all(f"{n}: {line}" in parts[1]["state"]["output"]
               for n, line in enumerate(CONFIG_TOML.splitlines(), 1))
    assert "No such file or directory" in parts[3]["state"]["output"]
    assert [m["info"]["role"] for m in export["messages"]] == [
        "user", "assistant", "assistant", "assistant", "user", "assistant", "assistant",
        "assistant"]

    counts = expected(export)
    assert counts == {"messages_added": 16, "tool_results": 4, "usage_records": 6,
                      "compactions": 0, "compacted_parts": 0, "errors": 1,
                      "input_tokens": 7200, "output_tokens": 204}
    assert imported(daemon, tmp_path / "export.json", export) == counts


def test_a_session_opencode_compacted(tmp_path: Path, run_folder: Path,
                                      daemon: DaemonProcess) -> None:
    export = export_once(run_folder, exported_compacted_session)
    messages = export["messages"]
    [at] = [i for i, m in enumerate(messages)
            if any(p["type"] == "compaction" for p in m["parts"])]
    assert [p["type"] for p in messages[at]["parts"]] == ["compaction"]
    assert messages[at]["parts"][0]["auto"] is True
    summary = messages[at + 1]
    assert summary["info"]["summary"] is True
    assert [p["text"] for p in summary["parts"] if p["type"] == "text"] == [SUMMARY]
    outputs = [p["state"]["output"] for p in tool_parts(export)]
    assert len(outputs) == BIG_OUTPUTS + 1
    assert [len(o.splitlines()) for o in outputs[:BIG_OUTPUTS]] == [BIG_LINES] * BIG_OUTPUTS

    counts = expected(export)
    assert counts == {"messages_added": 30, "tool_results": 7, "usage_records": 11,
                      "compactions": 1, "compacted_parts": 0, "errors": 0,
                      "input_tokens": 15500, "output_tokens": 374}
    assert imported(daemon, tmp_path / "export.json", export) == counts

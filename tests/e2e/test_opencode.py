"""OpenCode itself (the npm package opencode-ai) with ctxd's plugin, installed by
``ctxctl install opencode``, against a mock OpenAI-compatible model and a real daemon."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from chat_server import USAGE, ChatServer, ToolCall
from conftest import DaemonProcess
from mcp_big_output import INVENTORY
from opencode_runs import (
    OPENCODE,
    OpenCode,
    hermetic_env,
    model_turns,
    opencode_project,
    system_text,
    tool_messages,
)

pytestmark = pytest.mark.skipif(
    OPENCODE is None, reason="opencode not installed (npm install opencode-ai; .ci/run does)")

LOG_LINES = 800
BUILD_LOG = "".join(f"line {i:04d} of the build log: ok\n" for i in range(LOG_LINES))
"""The bash tool's output: 26,400 bytes, well over the offload threshold."""
PROMPT = "How do we deploy the service? Print the build log first."
SCRIPT = f"for i in range({LOG_LINES}): print(f'line {{i:04d}} of the build log: ok')"
TURNS = [ToolCall("bash", {"command": f'python3 -c "{SCRIPT}"', "description": "Print the log"}),
         "Deploy it with make ship."]
"""The model's turns: it runs a command that prints `BUILD_LOG`, then answers."""
READ_CHARS = 5000
"""A read_result page over the offload threshold: ctxd's own tools' answers stay whole."""


def ref_in_last_result(body: dict[str, Any]) -> str:
    """The ref_id of the stub in the last tool result the model was sent."""
    content = tool_messages(body)[-1]["content"]
    return str(content).split('ref_id="')[1].split('"')[0]


def answer(request: dict[str, Any], call_id: str) -> dict[str, Any]:
    """What one of ctxd's MCP tools answered the call ``call_id``, as the model got it."""
    [content] = [m["content"] for m in tool_messages(request) if m["tool_call_id"] == call_id]
    decoded: dict[str, Any] = json.loads(content)
    return decoded


READ_BACK_TURNS = [
    # 108,894 bytes, over OpenCode's own cut (50 KB): OpenCode saves the output in its
    # tool-output folder and shows the model its tail.
    ToolCall("bash", {"command": "seq 1 20000", "description": "Count"}, call_id="call_seq"),
    lambda body: ToolCall("ctxd_read_result", {"ref_id": ref_in_last_result(body), "offset": 0,
                                               "limit": READ_CHARS}, call_id="call_read"),
    ToolCall("ctxd_memory_record", {"title": "Counting", "content": "seq 1 20000 counts."},
             call_id="call_memory"),
    ToolCall("ctxd_context_branch", {"description": "Check the count", "prompt": "Count again",
                                     "inject_memories": False}, call_id="call_branch"),
    ToolCall("ctxd_context_return", {"message": "The count is right."}, call_id="call_return"),
    ToolCall("ctxd_compact_context", {}, call_id="call_compact"),
]
"""After the build log: a command whose output OpenCode cuts, then ctxd's MCP tools, each
on the session of the conversation (the plugin names it to them)."""
SHORT_LOG = "".join(f"line {i:04d} of the build log: ok\n" for i in range(100))
"""3,100 bytes (1,100 tokens): under the offload threshold, so it stays inline."""
OVERFLOW = {"prompt_tokens": 3500, "completion_tokens": 34, "total_tokens": 3534}
"""Usage over the small model's limit (4,000 tokens less 1,000 for the reply): OpenCode
compacts the session before the next turn."""
MEMORY = {"title": "Deploying the service",
          "content": "Deploy the service with `make ship` from a clean checkout, never by hand."}


def test_opencode_offloads_remembers_and_records(tmp_path: Path, daemon: DaemonProcess) -> None:
    """The plugin records and offloads; the model reads back, through ctxd's MCP tools, what
    ctxd removed, and those tools act on the conversation's own session."""
    with daemon.client() as ctxd:
        ctxd.call("memory.record", MEMORY)
    with ChatServer() as model:
        model.summary = "Deploying"
        model.turns = [TURNS[0], *READ_BACK_TURNS, TURNS[1]]
        # memory_record is not in ctxd's default set of tools: asked for with the rest.
        project = opencode_project(tmp_path, model.url, ctxd_tools=(
            "read_result,memory_record,context_branch,context_return,compact_context"))
        session_id = OpenCode(project, hermetic_env(tmp_path, daemon.socket)).run(PROMPT)
        turns = model_turns(model.requests)

    # The model asked for the log and got ctxd's stub in its place.
    assert len(turns) == 8
    assert [m["role"] for m in turns[1]["messages"]][-2:] == ["assistant", "tool"]
    [stub] = [m["content"] for m in tool_messages(turns[1])]
    assert isinstance(stub, str)
    # 30 characters a line: five lines of each end fit in 180.
    lines = BUILD_LOG.splitlines()
    assert stub.startswith(f"[Tool result stored — {len(BUILD_LOG.encode()):,} bytes, "
                           f'{LOG_LINES} lines from "bash". First and last lines, and lines '
                           "with errors:\n" + "\n".join(
                               [*lines[:5], f"[… {LOG_LINES - 10} lines …]", *lines[-5:]])
                           + '\n] Use read_result with ref_id="')
    assert "line 0400" not in json.dumps(turns[1])  # the middle of the log was left out
    ref_id = stub.split('ref_id="')[1].split('"')[0]

    # Each model turn's system prompt carried the memory recorded beforehand.
    for turn in turns:
        assert f"- {MEMORY['title']}: {MEMORY['content']}" in system_text(turn)

    # OpenCode cut seq's output itself; ctxd stored it whole from OpenCode's file, and the
    # model read it back from offset 0: the numbers, not OpenCode's notice, in one answer
    # over the offload threshold that is no stub.
    # (OpenCode 1.18 itself may lose a chunk of the output, 8 KB, when the command exits
    # before OpenCode has read all of it: seen under load. ctxd stores what OpenCode saved,
    # so the test compares with that file, not with seq's whole output.)
    # (OpenCode saves other long outputs there too: seq's is the one of numbers only. The
    # chunk it loses may be the first: the file need not start at 1. Under load it has
    # saved seq's output twice, in two files of the same bytes: one text.)
    folder = tmp_path / "home/.local/share/opencode/tool-output"
    [saved] = {text for text in (f.read_text() for f in sorted(folder.iterdir()))
               if text.strip() and all(line.isdigit() for line in text.splitlines())}
    assert len(saved.encode()) > 51_200  # over OpenCode's own cut
    count_ref = ref_in_last_result(turns[2])
    assert "output truncated" not in json.dumps(turns[2])
    read = answer(turns[3], "call_read")
    assert (read["ref_id"], read["tool_name"], read["size_bytes"], read["offset"],
            read["content"], read["next_offset"]) == (
        count_ref, "bash", len(saved.encode()), 0, saved[:READ_CHARS], READ_CHARS)
    assert read["context_state"]["session_id"] == session_id
    # The model is sent its calls as it made them (the session the plugin named to ctxd's
    # server is not among their arguments).
    [read_call] = turns[3]["messages"][-2]["tool_calls"]
    assert json.loads(read_call["function"]["arguments"]) == {
        "ref_id": count_ref, "offset": 0, "limit": READ_CHARS}
    remembered = answer(turns[4], "call_memory")
    assert (remembered["memory"]["scope"], remembered["memory"]["title"]) == (
        f"project:{project}", "Counting")
    branched = answer(turns[5], "call_branch")
    assert branched["context_state"]["session_id"] == session_id
    assert branched["context_state"]["branch_path"] == [branched["branch_id"]]
    returned = answer(turns[6], "call_return")
    assert (returned["success"], returned["branch_id"],
            returned["context_state"]["session_id"],
            returned["context_state"]["active_branch_id"]) == (
        True, branched["branch_id"], session_id, None)
    compacted = answer(turns[7], "call_compact")
    assert compacted["context_state"]["session_id"] == session_id

    with daemon.client() as ctxd:
        [session] = ctxd.call("session.list", {"project": str(project)})["sessions"]
        assert session["session_id"] == session_id
        assert session_id.startswith("ses_")
        whole = ctxd.call("result.read", {"session_id": session_id, "ref_id": ref_id,
                                          "limit": 1_000_000})
        assert (whole["tool_name"], whole["content"], whole["next_offset"]) == (
            "bash", BUILD_LOG, None)
        found = ctxd.call("result.read", {"session_id": session_id, "ref_id": ref_id,
                                          "pattern": "^line 0799"})
        assert [m["text"] for m in found["matches"]] == ["line 0799 of the build log: ok"]
        messages = ctxd.call("message.list", {"session_id": session_id})["messages"]
        main = [m for m in messages if m.get("branch_id") is None]
        assert [(m["role"], m.get("name")) for m in main] == [
            ("user", None), ("tool", "bash"), ("tool", "bash"), ("tool", "ctxd_read_result"),
            ("tool", "ctxd_memory_record"), ("tool", "ctxd_context_branch"), ("user", None),
            ("tool", "ctxd_context_return"), ("tool", "ctxd_compact_context"),
            ("assistant", None)]
        assert [m.get("ref_id") is not None for m in main[:3]] == [False, True, True]
        assert main[2]["ref_id"] == count_ref
        counted = ctxd.call("result.read", {"session_id": session_id, "ref_id": count_ref,
                                            "limit": 1_000_000})
        assert (counted["content"], counted["next_offset"]) == (saved, None)
        # `opencode run` quotes an argument with spaces in the text it sends.
        assert main[0]["content"] == turns[0]["messages"][-1]["content"] == f'"{PROMPT}"'
        assert main[6]["content"] == 'Branch "Check the count" returned: The count is right.'
        assert main[-1]["content"] == "Deploy it with make ship."
        [branch] = ctxd.call("branch.list", {"session_id": session_id})["branches"]
        assert (branch["branch_id"], branch["status"]) == (branched["branch_id"], "completed")
        # ctxd's MCP server opened no session of its own: every call named OpenCode's.
        assert [s["session_id"] for s in ctxd.call("session.list", {})["sessions"]] == [
            session_id]
        totals = ctxd.call("usage.get", {"session_id": session_id})["totals"]
        assert (totals["input_tokens"], totals["output_tokens"]) == (
            len(turns) * USAGE["prompt_tokens"], len(turns) * USAGE["completion_tokens"])


def test_without_a_daemon_opencode_works_as_before(tmp_path: Path,
                                                   daemon: DaemonProcess) -> None:
    daemon.stop()
    with ChatServer() as model:
        model.turns = list(TURNS)
        project = opencode_project(tmp_path, model.url)
        # The plugin alone: ctxd's MCP server entry would start a daemon (ctxctl mcp does
        # when none answers), and this is about the plugin failing open without one.
        config = json.loads((project / "opencode.json").read_text())
        del config["mcp"]
        (project / "opencode.json").write_text(json.dumps(config))
        OpenCode(project, hermetic_env(tmp_path, daemon.socket)).run(PROMPT)
        turns = model_turns(model.requests)
    assert len(turns) == 2
    assert [m["content"] for m in tool_messages(turns[1])] == [BUILD_LOG]
    assert "ctxd" not in system_text(turns[0])


def test_an_mcp_tools_large_output_reaches_the_model_as_a_stub(
        tmp_path: Path, daemon: DaemonProcess) -> None:
    """`tool.execute.after` on an MCP tool: the plugin replaces its text content."""
    server = Path(__file__).parent.parent / "mcp_big_output.py"
    with ChatServer() as model:
        model.turns = [ToolCall("warehouse_inventory", {}), "400 items."]
        project = opencode_project(tmp_path, model.url, mcp={"warehouse": {
            "type": "local", "command": [sys.executable, str(server)]}})
        session_id = OpenCode(project, hermetic_env(tmp_path, daemon.socket)).run(
            "What is in the warehouse?")
        turns = model_turns(model.requests)

    assert len(turns) == 2
    assert "warehouse_inventory" in [tool["function"]["name"] for tool in turns[0]["tools"]]
    [stub] = [m["content"] for m in tool_messages(turns[1])]
    assert isinstance(stub, str)
    ref_id = stub.split('ref_id="')[1].split('"')[0]
    # 50 characters a line: three lines of each end fit in 180.
    items = INVENTORY.splitlines()
    assert stub == (f"[Tool result stored — {len(INVENTORY.encode()):,} bytes, 400 lines from "
                    '"warehouse_inventory". First and last lines, and lines with errors:\n'
                    + "\n".join([*items[:3], "[… 394 lines …]", *items[-3:]])
                    + f'\n] Use read_result with ref_id="{ref_id}" (or run: ctxctl result '
                    f"{ref_id}) to read more.")
    assert "item 0200" not in json.dumps(turns[1])
    with daemon.client() as ctxd:
        whole = ctxd.call("result.read", {"session_id": session_id, "ref_id": ref_id,
                                          "limit": 1_000_000})
        assert (whole["tool_name"], whole["content"], whole["next_offset"]) == (
            "warehouse_inventory", INVENTORY, None)


def test_a_pending_injection_joins_the_next_system_prompt_once(
        tmp_path: Path, daemon: DaemonProcess) -> None:
    """`experimental.chat.system.transform` pulls the session's pending injections, adds
    them to the system prompt and acknowledges them: the next request has none."""
    note = "The staging database is read-only until 14:00; deploy to canary instead."
    with ChatServer() as model:
        model.turns = ["Hello.", *TURNS]
        opencode = OpenCode(opencode_project(tmp_path, model.url),
                            hermetic_env(tmp_path, daemon.socket))
        session_id = opencode.run("Hello")
        with daemon.client() as ctxd:
            pushed = ctxd.call("inject.push", {"session_id": session_id, "content": note,
                                               "source": "ci"})
        assert opencode.run(PROMPT, session_id) == session_id
        turns = model_turns(model.requests)

    assert len(turns) == 3
    assert note not in system_text(turns[0])
    assert f"Notes for this session (ctxd):\n{note}" in system_text(turns[1])
    assert system_text(turns[1]).count(note) == 1
    assert note not in system_text(turns[2])
    with daemon.client() as ctxd:
        [injection] = ctxd.call("inject.list", {"session_id": session_id})["injections"]
    assert (injection["injection_id"], injection["state"], injection["deliveries"],
            injection["content"]) == (pushed["injection_id"], "accepted", 1, note)


def test_opencodes_compaction_snapshots_ctxds_copy(tmp_path: Path, daemon_root: Path) -> None:
    """OpenCode compacts by itself when a turn's usage reaches its model's limit; the
    plugin's `experimental.session.compacting` compacts ctxd's copy first, which saves the
    snapshot `session.resume` serves. The daemon's window is small (1,500 tokens effective)
    and keeps no tool result from clearing, so that ctxd's copy (the prompt and a 1,100-token
    inline output: 75% full, under the 95% at which ctxd compacts by itself) has room to
    shrink."""
    config = daemon_root / "config" / "ctxd" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("[budget]\ncontext_window = 2000\nmax_output_tokens = 500\n\n"
                      "[hygiene]\nkeep_tool_results = 0\n")
    command = "python3 -c \"" + SCRIPT.replace("800", "100") + "\""
    summary = "## Objective\n- Print the build log."
    with DaemonProcess(daemon_root).running() as daemon, ChatServer() as model:
        model.summary = summary
        model.turns = [ToolCall("bash", {"command": command, "description": "Print the log"},
                                usage=OVERFLOW), "Deploy it with make ship."]
        project = opencode_project(tmp_path, model.url,
                                   model_limit={"context": 4000, "output": 1000})
        opencode = OpenCode(project, hermetic_env(tmp_path, daemon.socket))
        session_id = opencode.run(PROMPT)
        turns = model_turns(model.requests)
        exported = opencode.export(session_id)
        with daemon.client() as ctxd:
            resumed = ctxd.call("session.resume", {"session_id": session_id})
            ref_id = resumed["messages"][1]["content"].split('ref_id="')[1].split('"')[0]
            whole = ctxd.call("result.read", {"session_id": session_id, "ref_id": ref_id,
                                              "limit": 1_000_000})

    # OpenCode compacted: its summary replaced the turns before it.
    assert [part["type"] for part in exported["messages"][2]["parts"]] == ["compaction"]
    assert exported["messages"][3]["info"]["summary"] is True
    assert len(turns) == 2
    assert [m["content"] for m in turns[1]["messages"][1:3]] == [
        "What did we do so far?", summary]
    assert "line 0099" not in json.dumps(turns[1])

    # ctxd compacted its copy as OpenCode began to: the output was cleared, the snapshot
    # kept, and what came after (OpenCode's summary and its next turn) follows it.
    assert resumed["source"] == "snapshot"
    assert resumed["compacted_at"] is not None
    [prompt, cleared, *after] = resumed["messages"]
    assert prompt["content"] == f'"{PROMPT}"'
    assert (cleared["role"], cleared["name"], cleared["tool_call_id"]) == (
        "tool", "bash", "call_1")
    assert cleared["content"] == (
        f'[Old tool result content cleared — read it with read_result ref_id="{ref_id}" '
        f"or ctxctl result {ref_id}]")
    assert [(m["role"], m["content"]) for m in after] == [
        ("assistant", summary),
        ("user", "Continue if you have next steps, or stop and ask for clarification if "
                 "you are unsure how to proceed."),
        ("assistant", "Deploy it with make ship.")]
    assert (whole["tool_name"], whole["content"]) == ("bash", SHORT_LOG)

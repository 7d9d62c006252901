"""The real Claude Code CLI (the one claude-agent-sdk bundles) wired to a real daemon by
``ctxctl install claude-code --scope project``; only the model is scripted, by the mock
Messages API of tests/mock_anthropic.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonProcess
from mock_anthropic import Block, MockAnthropic, text, tool_results, tool_use
from tests_support import bundled_claude

from ctxclient import Client

CTXCTL = Path(sys.executable).with_name("ctxctl")


CLAUDE = bundled_claude()
pytestmark = pytest.mark.skipif(CLAUDE is None, reason="claude-agent-sdk (with its bundled "
                                                       "Claude Code CLI) is not installed")

LINES = 540
BIG_COMMAND = ("python3 -c \"print('\\n'.join(f'zebra-{i:05d} the quick brown fox jumps' "
               f"for i in range({LINES})))\"")
BIG_OUTPUT = "\n".join(f"zebra-{i:05d} the quick brown fox jumps" for i in range(LINES))


def claude(project: Path, home: Path, mock: MockAnthropic, prompt: str,
           tools: tuple[str, ...] = ("Bash", "mcp__ctxd__memory_record"),
           base_url: str | None = None) -> dict[str, Any]:
    """One ``claude -p`` run in ``project``, hermetic: its own HOME, the mock model (at
    ``base_url`` when given: a gateway in front of it)."""
    assert CLAUDE is not None
    env = {"PATH": os.environ["PATH"], "HOME": str(home),
           "ANTHROPIC_BASE_URL": base_url or mock.url,
           "ANTHROPIC_API_KEY": "sk-ant-dummy", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "ENABLE_TOOL_SEARCH": "false"}
    # Claude Code refuses --dangerously-skip-permissions as root: allow Bash by name.
    done = subprocess.run([str(CLAUDE), "-p", prompt, "--output-format", "json",
                           "--allowedTools", *tools],
                          cwd=project, env=env,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, (done.stdout, done.stderr)
    result: dict[str, Any] = json.loads(done.stdout)
    assert result["is_error"] is False, result
    return result


def test_a_claude_code_session_is_managed_by_ctxd(tmp_path: Path,
                                                  shared_daemon: DaemonProcess) -> None:
    home, project = tmp_path / "home", tmp_path / "otterbay"
    home.mkdir()
    project.mkdir()
    # memory_record is not in the default set of tools: asked for by name.
    installed = subprocess.run([str(CTXCTL), "install", "claude-code", "--scope", "project",
                                "--socket", str(shared_daemon.socket),
                                "--tools", "read_result,memory_record"], cwd=project,
                               capture_output=True, text=True, timeout=60, check=True)
    assert installed.stdout.count("added ") == 12
    with Client(shared_daemon.socket) as client:
        client.call("memory.record", {
            "title": "otterbay releases", "content": "otterbay ships with make release-zebra.",
            "scope": f"project:{project}"})
    turns = [[tool_use("toolu_big01", "Bash", {"command": BIG_COMMAND,
                                               "description": "Print the big log"})],
             [tool_use("toolu_mcp01", "mcp__ctxd__memory_record", {
                 "title": "zebra logs are long", "content": "Read them with read_result."})]]
    with MockAnthropic(turns, final="All read.") as mock:
        result = claude(project, home, mock, "Print the big log, please")
    assert result["result"] == "All read."
    requests = mock.main_requests()
    assert len(requests) == 3
    first, second, third = requests

    # The model is offered the ctxd tools the install asked for, and no others.
    assert sorted(tool["name"] for tool in first["tools"]
                  if tool["name"].startswith("mcp__ctxd__")) == [
        "mcp__ctxd__memory_record", "mcp__ctxd__read_result"]

    # (b) SessionStart's additionalContext carries the project's memory to the model.
    memory_line = "- otterbay releases (confidence 0.80): otterbay ships with make release-zebra."
    assert ("Memories from earlier work that may help with this task:\n" + memory_line
            in json.dumps(first, ensure_ascii=False).replace("\\n", "\n"))

    # (a) The model's next request holds ctxd's stub in place of the 20 KB output.
    sent = json.dumps(second, ensure_ascii=False)
    assert BIG_OUTPUT[-2_000:] not in sent
    assert "zebra-00270" not in sent  # the middle of the output was left out
    results = [block for message in second["messages"] if message["role"] == "user"
               and isinstance(message["content"], list) for block in message["content"]
               if block.get("type") == "tool_result" and block["tool_use_id"] == "toolu_big01"]
    assert len(results) == 1
    content = results[0]["content"]
    shown = content if isinstance(content, str) else "".join(b["text"] for b in content)

    # (c) The session is Claude's own, with the prompt and the offloaded result in full.
    session_id = result["session_id"]
    with Client(shared_daemon.socket) as client:
        session = client.call("session.get", {"session_id": session_id})["session"]
        assert session["project"] == str(project)
        messages = client.call("message.list", {"session_id": session_id})["messages"]
        assert [m["role"] for m in messages][:3] == ["user", "assistant", "tool"]
        assert messages[0]["content"] == "Print the big log, please"
        assert messages[2]["tool_call_id"] == "toolu_big01"
        ref_id = messages[2]["ref_id"]
        # 37 characters a line: four lines of each end fit in 180.
        lines = BIG_OUTPUT.split("\n")
        assert shown == (f'[Tool result stored — {len(BIG_OUTPUT):,} bytes, 540 lines from '
                         '"Bash". First and last lines, and lines with errors:\n'
                         + "\n".join([*lines[:4], "[… 532 lines …]", *lines[-4:]])
                         + f'\n] Use read_result with ref_id="{ref_id}" (or run: ctxctl '
                         f"result {ref_id}) to read more.")
        read = client.call("result.read", {"session_id": session_id, "ref_id": ref_id,
                                           "limit": 1_000_000})
        assert read["content"] == BIG_OUTPUT
        assert len(BIG_OUTPUT) > 20_000

        # The scripted call of ctxd's MCP tool reached the daemon, on Claude's session.
        recorded = [m for m in client.call("memory.list", {"limit": 1000})["memories"]
                    if m["title"] == "zebra logs are long"]
        assert [(m["content"], m["scope"]) for m in recorded] == [
            ("Read them with read_result.", f"project:{project}")]
        answers = [b for m in third["messages"] if m["role"] == "user"
                   and isinstance(m["content"], list) for b in m["content"]
                   if b.get("type") == "tool_result" and b["tool_use_id"] == "toolu_mcp01"]
        assert len(answers) == 1
        assert answers[0].get("is_error", False) is False
        content = answers[0]["content"]
        tool_text = content if isinstance(content, str) else "".join(
            block["text"] for block in content if block["type"] == "text")
        answered = json.loads(tool_text)
        assert (answered["memory"]["id"], answered["memory"]["title"]) == (
            recorded[0]["id"], "zebra logs are long")
        assert answered["context_state"]["session_id"] == session_id

        # Stop ingested the transcript: the answers the hooks did not see, and the usage of
        # each of the three responses once.
        messages = client.call("message.list", {"session_id": session_id})["messages"]
        assert [m["role"] for m in messages] == [
            "user", "assistant", "tool", "assistant", "tool", "assistant"]
        assert messages[-1]["content"] == [{"type": "text", "text": "All read."}]
        usage = client.call("usage.get", {"session_id": session_id})
        assert usage["totals"]["calls"] == 3
        assert usage["totals"]["input_tokens"] == sum(
            max(1, len(json.dumps(body)) // 4) for body in requests)


WALRUS_COMMAND = ("python3 -c \"print('\\n'.join(f'walrus-{i:05d} ' + 'x' * 40 "
                  "for i in range(2000)))\"")
WALRUS = "".join(f"walrus-{i:05d} " + "x" * 40 + "\n" for i in range(2000))
"""108,000 bytes: Claude Code saves it to a file and hands the hook 30,000 characters."""
FAILING_SUITE = ("import sys\nprint('FAIL: test_parser (tests.test_parser.ParserTest)')\n"
                 "print('SyntaxError: invalid syntax')\nsys.exit(1)\n")


def test_claude_codes_reads_failures_saved_outputs_and_ctxds_own_answers(
        tmp_path: Path, shared_daemon: DaemonProcess) -> None:
    home, project = tmp_path / "home", tmp_path / "walrusbay"
    home.mkdir()
    project.mkdir()
    subprocess.run([str(CTXCTL), "install", "claude-code", "--scope", "project",
                    "--socket", str(shared_daemon.socket)], cwd=project,
                   capture_output=True, text=True, timeout=60, check=True)
    lines = [f"line {i:06d} of a big file with words" for i in range(4000)]
    (project / "big.txt").write_text("".join(line + "\n" for line in lines))
    (project / "test_suite.py").write_text(FAILING_SUITE)

    def read_back(body: dict[str, Any]) -> list[dict[str, Any]]:
        [stub] = tool_results(body, "toolu_walrus")
        ref_id = stub.split('ref_id="')[1].split('"')[0]
        return [tool_use("toolu_page", "mcp__ctxd__read_result",
                         {"ref_id": ref_id, "offset": 100_000, "limit": 8_000})]

    turns: list[Any] = [
        [tool_use("toolu_walrus", "Bash", {"command": WALRUS_COMMAND, "description": "Log"})],
        [tool_use("toolu_read", "Read", {"file_path": str(project / "big.txt")})],
        [tool_use("toolu_fail", "Bash", {"command": "python3 test_suite.py",
                                         "description": "Run the tests"})],
        read_back]
    with MockAnthropic(turns, final="Seen.") as mock:
        outcome = claude(project, home, mock, "Look at the log, the file and the tests",
                         tools=("Bash", "Read", "mcp__ctxd__read_result"))
    assert (outcome["is_error"], outcome["result"]) == (False, "Seen.")
    session_id = outcome["session_id"]
    requests = mock.main_requests()
    assert len(requests) == 5
    last = requests[-1]

    with Client(shared_daemon.socket) as client:
        listed = client.call("message.list", {"session_id": session_id})["messages"]
        results = {m["tool_call_id"]: m for m in listed if m["role"] == "tool"}
        rendered = {m["tool_call_id"]: m["content"] for m in client.call(
            "ctxd.render", {"session_id": session_id})["messages"] if m["role"] == "tool"}

        def whole(call_id: str) -> str:
            return str(client.call("result.read", {
                "session_id": session_id, "ref_id": results[call_id]["ref_id"],
                "limit": 1_000_000})["content"])

        # Each result once: the transcript's import (Stop) did not add those the hooks
        # recorded, the failure among them.
        assert sorted(results) == ["toolu_fail", "toolu_page", "toolu_read", "toolu_walrus"]

        # The 108,000-byte output, kept whole from Claude Code's own file (it handed the
        # hook 30,000 characters); the model received ctxd's stub, with the output's end.
        assert whole("toolu_walrus") == WALRUS
        assert tool_results(last, "toolu_walrus") == [rendered["toolu_walrus"]]
        assert rendered["toolu_walrus"].startswith(
            '[Tool result stored — 108,000 bytes, 2,000 lines from "Bash".')
        assert f"walrus-01999 {'x' * 40}\n]" in rendered["toolu_walrus"]
        assert "<persisted-output>" not in json.dumps(last)

        # Read: offloaded (what Claude Code read: the file's first lines, whole); Claude
        # Code numbers the lines of the stub it is handed.
        read = whole("toolu_read")
        count = read.count("\n") + 1  # the last line read has no newline
        assert 100 < count < 4000
        assert read == "\n".join(lines[:count])
        assert tool_results(last, "toolu_read") == ["\n".join(
            f"{n}\t{line}" for n, line in enumerate(rendered["toolu_read"].split("\n"), 1))]

        # The failed run: recorded as an error, inline, its FAIL and SyntaxError lines
        # in what the model received.
        failed = results["toolu_fail"]
        assert failed["meta"] == {"live": "PostToolUseFailure", "is_error": True}
        assert failed["content"] == ("Exit code 1\nFAIL: test_parser (tests.test_parser."
                                     "ParserTest)\nSyntaxError: invalid syntax")
        [received] = tool_results(last, "toolu_fail")
        assert received == failed["content"]

        # read_result's 8,000-character page reached the model whole: ctxd's own
        # tools' answers are never offloaded.
        [page] = tool_results(last, "toolu_page")
        assert json.loads(page)["content"] == WALRUS[100_000:]
        assert results["toolu_page"].get("ref_id") is None


SUB_LOG_LINES = 300
SUB_LOG = "\n".join(f"heron-{i:04d} nested in the reeds by the river" for i in range(SUB_LOG_LINES))
SUB_LOG_COMMAND = ("python3 -c \"print('\\n'.join(f'heron-{i:04d} nested in the reeds by the "
                   f"river' for i in range({SUB_LOG_LINES})))\"")
SUB_BRANCH_BUDGET = 600
"""Tokens a sub-agent's branch may add: the first sub-agent's work fits, the heron log (over
2,000 tokens) does not."""


def agent_call(call_id: str, description: str, prompt: str) -> Block:
    return tool_use(call_id, "Agent", {"description": description, "prompt": prompt,
                                       "subagent_type": "general-purpose",
                                       "run_in_background": False})


@pytest.mark.parametrize("through", ["hooks", "gateway"])
def test_claude_codes_sub_agents_are_branches(tmp_path: Path, daemon_root: Path,
                                              through: str) -> None:
    """Two sub-agents, one after the other: the first works within its branch's budget,
    gets the memory of its task through SubagentStart and returns its branch with its last
    message; the second spends its budget on one output, and its next tool call is denied
    with the reason, which its model reads; then it ends too. With the model calls through
    ctxd's gateway as well: a sub-agent's calls go as sent, its hooks record it."""
    home, project = tmp_path / "home", tmp_path / "ospreyworks"
    home.mkdir()
    project.mkdir()
    turns = [[agent_call("toolu_agent1", "Count osprey nests",
                         "Count the osprey nests and report the number.")],
             [tool_use("toolu_sub1a", "Bash", {"command": "echo nests: 4",
                                                "description": "Count"})],
             [text("There are 4 osprey nests.")],
             [agent_call("toolu_agent2", "Read the heron log",
                         "Print the heron log and sum it up.")],
             [tool_use("toolu_sub2a", "Bash", {"command": SUB_LOG_COMMAND,
                                                "description": "Print the log"})],
             [tool_use("toolu_sub2b", "Bash", {"command": "echo more",
                                                "description": "Look further"})],
             [text("The herons nest in the reeds.")]]
    with MockAnthropic(turns, final="Both reports are in.") as mock:
        small_branches = DaemonProcess(daemon_root, env={
            "CTXD_BRANCH_BUDGET": str(SUB_BRANCH_BUDGET),
            "CTXD_HYGIENE_OFFLOAD_THRESHOLD_BYTES": "1000000",
            "CTXD_GATEWAY_ANTHROPIC_UPSTREAM": mock.url}).start()
        try:
            subprocess.run([str(CTXCTL), "install", "claude-code", "--scope", "project",
                            "--socket", str(small_branches.socket)], cwd=project,
                           capture_output=True, text=True, timeout=60, check=True)
            with Client(small_branches.socket) as client:
                client.call("memory.record", {
                    "title": "osprey nests",
                    "content": "Osprey nests are counted from the east tower.",
                    "scope": f"project:{project}"})
                gateway = client.call("daemon.status", {})["gateway"]["base_url"]
            result = claude(project, home, mock, "Survey the birds, please",
                            tools=("Bash", "Agent"),
                            base_url=gateway if through == "gateway" else None)
            check_sub_agents(small_branches, mock, result)
            with Client(small_branches.socket) as client:
                calls = client.call("daemon.status", {})["gateway"]["calls"]
            # Through the gateway: every model call of the run went through it.
            assert calls == (len([path for path, _ in mock.requests
                                  if path.startswith("/v1/messages")])
                             if through == "gateway" else 0)
        finally:
            small_branches.stop()


def check_sub_agents(small_branches: DaemonProcess, mock: MockAnthropic,
                     result: dict[str, Any]) -> None:
    assert result["result"] == "Both reports are in."
    assert mock.turns == []
    requests = mock.main_requests()
    assert len(requests) == 8
    # The first sub-agent's first request holds the memory of its task (SubagentStart).
    memory_line = ("- osprey nests (confidence 0.80): Osprey nests are counted from the "
                   "east tower.")
    first_sub = json.dumps(requests[1], ensure_ascii=False).replace("\\n", "\n")
    assert memory_line in first_sub
    assert "Count the osprey nests and report the number." in first_sub
    # The second sub-agent's second call was denied with the reason, and its model read it
    # (Claude Code words a denial "PreToolUse:Bash hook error: REASON").
    [denied] = tool_results(requests[6], "toolu_sub2b")
    assert denied.endswith(": budget exhausted: return your result now")
    assert tool_results(requests[6], "toolu_sub2a") == [SUB_LOG]

    session_id = result["session_id"]
    with Client(small_branches.socket) as client:
        branches = client.call("branch.list", {"session_id": session_id})["branches"]
        osprey, heron = sorted(branches, key=lambda b: b["created_at"])
        assert (osprey["description"], osprey["status"], osprey["result"]) == (
            "Count osprey nests", "completed", "There are 4 osprey nests.")
        assert (heron["description"], heron["status"]) == (
            "Read the heron log", "budget_exhausted")
        assert heron["budget_used"] > SUB_BRANCH_BUDGET
        assert (osprey["parent_branch_id"], heron["parent_branch_id"]) == (None, None)
        # The sub-agents' tool calls were charged to their branches, not the main thread.
        own = client.call("message.list", {"session_id": session_id,
                                           "branch_id": osprey["branch_id"]})["messages"]
        assert [m["tool_call_id"] for m in own if m["role"] == "tool"] == ["toolu_sub1a"]
        assert [m["content"] for m in own if m["role"] == "tool"] == ["nests: 4"]
        assert memory_line in [m["content"] for m in own if m["role"] == "user"][-1]
        heron_own = client.call("message.list", {"session_id": session_id,
                                                 "branch_id": heron["branch_id"]})["messages"]
        assert [m["tool_call_id"] for m in heron_own if m["role"] == "tool"] == [
            "toolu_sub2a"]
        main = client.call("message.list", {"session_id": session_id})["messages"]
        assert [m["tool_call_id"] for m in main if m["role"] == "tool"
                and m.get("branch_id") is None] == ["toolu_agent1", "toolu_agent2"]

"""The real OpenCode (the npm package opencode-ai) with ctxd installed by ``ctxctl install
opencode`` at user scope, its Anthropic provider's baseURL at a real daemon's gateway whose
upstream is the scripted Messages API of tests/mock_anthropic.py: what the model received,
request by request; which session the gateway records (OpenCode's own: the plugin names it
in the ``x-ctxd-session`` header) and that nothing is recorded twice (the plugin stands
back: the gateway records)."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonProcess, kill_leftovers, short_root
from mock_anthropic import MockAnthropic, text, tool_results, tool_use
from opencode_runs import OPENCODE, OpenCode, gateway_project, hermetic_env, point_anthropic_at

pytestmark = pytest.mark.skipif(
    OPENCODE is None, reason="opencode not installed (npm install opencode-ai; .ci/run does)")

LINES = 600
BIG_COMMAND = ("python3 -c \"print('\\n'.join(f'walrus-{i:05d} served in {i % 97} ms' "
               f"for i in range({LINES})))\"")
BIG_OUTPUT = "".join(f"walrus-{i:05d} served in {i % 97} ms\n" for i in range(LINES))
"""What the command prints: 17,330 bytes, well over the offload threshold."""
PROMPT = "Show me the service log, then check the disk."


def read_back(body: dict[str, Any]) -> list[Any]:
    """The model reads the log's last line back with ctxd's MCP tool, by the ref_id of the
    stub it was sent."""
    [stub] = tool_results(body, "toolu_big1")
    ref = re.search(r'ref_id="(res_[0-9a-f]+)"', stub)
    assert ref is not None, stub
    return [tool_use("toolu_read1", "ctxd_read_result",
                     {"ref_id": ref[1], "pattern": "^walrus-00599 "})]


def script() -> list[Any]:
    return [[text("Reading the log."), tool_use("toolu_big1", "bash", {
                "command": BIG_COMMAND, "description": "Show the log"})],
            [tool_use("toolu_small1", "bash", {"command": "echo disk-ok",
                                               "description": "Check the disk"})],
            read_back]


LAST_LINE = [{"line": LINES, "text": f"walrus-{LINES - 1:05d} served in 17 ms",
              "truncated": False}]
"""What the model's read_result finds: the log's last line."""


def read_answer(request: dict[str, Any], session_id: str) -> list[Any]:
    """The matches of the read_result answer the model received, checked to be of
    ``session_id`` (the conversation's: the plugin named it to ctxd's MCP server)."""
    [content] = tool_results(request, "toolu_read1")
    answer = json.loads(content)
    assert answer["context_state"]["session_id"] == session_id
    matches: list[Any] = answer["matches"]
    return matches


@pytest.fixture
def mock() -> Iterator[MockAnthropic]:
    with MockAnthropic(script(), final="All done.") as server:
        yield server


@pytest.fixture
def daemon(mock: MockAnthropic) -> Iterator[DaemonProcess]:
    root = short_root()
    process = DaemonProcess(root, env={"CTXD_GATEWAY_ANTHROPIC_UPSTREAM": mock.url}).start()
    yield process
    process.stop()
    kill_leftovers(root)
    shutil.rmtree(root, ignore_errors=True)


def opencode(tmp_path: Path, daemon: DaemonProcess, ctxd: str) -> OpenCode:
    env = {**hermetic_env(tmp_path, daemon.socket), "ANTHROPIC_API_KEY": "sk-ant-dummy"}
    return OpenCode(gateway_project(tmp_path, env, daemon.socket, ctxd=ctxd), env)


def test_what_opencodes_model_receives_through_the_gateway(
        tmp_path: Path, mock: MockAnthropic, daemon: DaemonProcess) -> None:
    agent = opencode(tmp_path, daemon, "gateway")
    with daemon.client() as client:
        base_url = client.call("daemon.status")["gateway"]["base_url"]
    installed = json.loads((tmp_path / "home/.config/opencode/opencode.json").read_text())
    assert installed["provider"] == {"anthropic": {"options": {"baseURL": base_url + "/v1"}}}
    session_id = agent.run(PROMPT)

    # Four model calls (the command, the second command, the read back, the answer) and
    # OpenCode's title request, which offers no tools.
    calls = [body for path, body in mock.requests if path == "/v1/messages"]
    requests = mock.main_requests()
    assert len(requests) == 4
    assert len(calls) == 5
    [title] = [body for body in calls if not body.get("tools")]
    assert mock.turns == []

    # The big output reaches the model as ctxd's stub, the same bytes in the next request.
    [stub] = tool_results(requests[1], "toolu_big1")
    # Lines of 27 characters at the head (6 fit in 180), of 28 at the tail (6 fit).
    lines = BIG_OUTPUT.splitlines()
    assert stub.startswith(f"[Tool result stored — {len(BIG_OUTPUT.encode()):,} bytes, 600 "
                           'lines from "bash". First and last lines, and lines with errors:\n'
                           + "\n".join([*lines[:6], "[… 588 lines …]", *lines[-6:]]) + "\n]")
    ref = re.search(r'ref_id="(res_[0-9a-f]+)"', stub)
    assert ref is not None, stub
    assert stub.endswith(f'Use read_result with ref_id="{ref[1]}" (or run: ctxctl result '
                         f"{ref[1]}) to read more.")
    assert tool_results(requests[2], "toolu_big1") == [stub]
    assert "walrus-00300" not in json.dumps(requests)  # the middle of the log was left out
    assert tool_results(requests[2], "toolu_small1") == ["disk-ok\n"]
    # The model read the end of the log back, from the session the gateway records.
    assert read_answer(requests[3], session_id) == LAST_LINE

    with daemon.client() as client:
        read = client.call("result.read", {"session_id": session_id, "ref_id": ref[1],
                                           "limit": 1_000_000})
        assert (read["tool_name"], read["content"], read["next_offset"]) == (
            "bash", BIG_OUTPUT, None)
        sessions = {s["session_id"]: s for s in client.call("session.list", {})["sessions"]}
        archive = client.call("message.list", {"session_id": session_id,
                                               "limit": 1000})["messages"]
        totals = client.call("usage.get", {"session_id": session_id})["totals"]
        [title_session] = set(sessions) - {session_id}
        title_totals = client.call("usage.get", {"session_id": title_session})["totals"]
        status = client.call("daemon.status")["gateway"]

    # The gateway's session is OpenCode's own, opened by the plugin with its project; the
    # title request, a conversation of its own, has a session of its own by its key.
    assert session_id.startswith("ses_")
    assert sessions[session_id]["project"] == str(agent.project)
    assert title_session.startswith("gw-")
    assert "Generate a title" in json.dumps(title["messages"])
    # Recorded once, by the gateway: the plugin recorded none of it (no text of its own, no
    # tool output, no usage).
    assert [(m["role"], (m.get("meta") or {}).get("source", {}).get("format"))
            for m in archive] == [("user", "gateway"), ("assistant", "gateway"),
                                  ("tool", "gateway"), ("assistant", "gateway"),
                                  ("tool", "gateway"), ("assistant", "gateway"),
                                  ("tool", "gateway")]
    assert archive[0]["content"] == f'"{PROMPT}"'
    assert [m.get("tool_call_id") for m in archive].count("toolu_big1") == 1
    # Every model call's usage in the ledger once.
    assert (totals["calls"], title_totals["calls"], status["calls"]) == (4, 1, 5)
    assert totals["output_tokens"] == 4 * 10


def test_with_the_plugin_only_opencode_sends_the_plugins_stub(
        tmp_path: Path, mock: MockAnthropic, daemon: DaemonProcess) -> None:
    """``--no-gateway``: OpenCode talks to the model directly and the plugin does all it
    does (records, offloads): the gateway sees nothing."""
    agent = opencode(tmp_path, daemon, "plugin")
    point_anthropic_at(agent.project, mock.url + "/v1")
    session_id = agent.run(PROMPT)
    requests = mock.main_requests()
    assert len(requests) == 4
    assert read_answer(requests[3], session_id) == LAST_LINE
    [stub] = tool_results(requests[1], "toolu_big1")
    ref = re.search(r'ref_id="(res_[0-9a-f]+)"', stub)
    assert ref is not None, stub
    with daemon.client() as client:
        read = client.call("result.read", {"session_id": session_id, "ref_id": ref[1],
                                           "limit": 1_000_000})
        [session] = client.call("session.list", {})["sessions"]
        archive = client.call("message.list", {"session_id": session_id,
                                               "limit": 1000})["messages"]
        status = client.call("daemon.status")["gateway"]
    assert read["content"] == BIG_OUTPUT
    assert session["session_id"] == session_id
    # The plugin's own record: text parts and tool outputs (no tool calls).
    assert [(m["role"], m.get("tool_call_id")) for m in archive] == [
        ("user", None), ("assistant", None), ("tool", "toolu_big1"), ("tool", "toolu_small1"),
        ("tool", "toolu_read1"), ("assistant", None)]
    assert status["calls"] == 0

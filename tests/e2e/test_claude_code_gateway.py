"""The real Claude Code CLI (claude-agent-sdk's) with ctxd installed (hooks and MCP) and its
base URL at a real daemon's gateway, whose upstream is the scripted Messages API of
tests/mock_anthropic.py: what the model received, request by request, over a session of
more than twenty model calls — large Bash, Read and failing outputs as stubs, a branch the
model opens and returns folded out of the next request, a compaction that shrinks it, a
result read back exactly, thinking blocks unchanged, and every call's usage once."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonProcess, kill_leftovers, short_root
from mock_anthropic import Block, MockAnthropic, tool_results, tool_use
from tests_support import bundled_claude

CTXCTL = Path(sys.executable).with_name("ctxctl")
LINES = 600
BIG_COMMAND = ("python3 -c \"print('\\n'.join(f'walrus-{i:05d} served in {i % 97} ms' "
               f"for i in range({LINES})))\"")
BIG_OUTPUT = "\n".join(f"walrus-{i:05d} served in {i % 97} ms" for i in range(LINES))
TOOLS = ("Bash", "Read", "mcp__ctxd__context_branch", "mcp__ctxd__context_return",
         "mcp__ctxd__compact_context", "mcp__ctxd__read_result")
THINKING = {"type": "thinking", "thinking": "The log is long; read its head back.",
            "signature": "c2lnbmF0dXJlLW9mLXRoZS10aGlua2luZy1ibG9jaw=="}
INSIDE_COMMAND = "python3 -c \"print('narwhal-inside-{} ' * 180)\""
MEDIUM_COMMAND = "python3 -c \"print('beaver-medium-{} ' * 200)\""
FOLD_SUMMARY = "The parser handles every input; nothing to change."


CLAUDE = bundled_claude()
pytestmark = pytest.mark.skipif(CLAUDE is None, reason="claude-agent-sdk (with its bundled "
                                                       "Claude Code CLI) is not installed")


def sent(body: dict[str, Any]) -> str:
    """A request's messages as one text, for what it holds."""
    return json.dumps(body["messages"], ensure_ascii=False)


def read_back(body: dict[str, Any]) -> list[Block]:
    """The model's turn that reads the big log's head back through ctxd's MCP tool, by
    the ref its stub names."""
    [stub] = tool_results(body, "toolu_big1")
    ref = re.search(r'ref_id="(res_[0-9a-f]+)"', stub)
    assert ref is not None, stub
    return [THINKING, tool_use("toolu_read", "mcp__ctxd__read_result",
                               {"ref_id": ref[1], "limit": 2_000})]


def script(project: Path) -> list[Any]:
    (project / "module.py").write_text("".join(
        f"def handler_{n}(request):\n    return respond(request, code={n})\n\n"
        for n in range(600)))
    (project / "test_suite.py").write_text(
        "import sys\nprint('FAIL: test_parser (AssertionError: 3 != 4)')\nsys.exit(1)\n")

    def bash(call_id: str, command: str) -> list[Block]:
        return [tool_use(call_id, "Bash", {"command": command, "description": command[:40]})]

    return [
        bash("toolu_big1", BIG_COMMAND),                                         # 1
        [tool_use("toolu_read1", "Read", {"file_path": str(project / "module.py")})],
        bash("toolu_fail1", "python3 test_suite.py"),
        [tool_use("toolu_branch", "mcp__ctxd__context_branch", {
            "description": "Check the parser", "prompt": "Look at the parser's cases."})],
        # Inside the branch: outputs under the offload threshold, that stay inline.
        bash("toolu_inside1", INSIDE_COMMAND.format("one")),                  # 5
        bash("toolu_inside2", INSIDE_COMMAND.format("two")),
        [tool_use("toolu_return", "mcp__ctxd__context_return", {"message": FOLD_SUMMARY})],
        bash("toolu_after1", "echo after-one"),
        read_back,
        bash("toolu_after2", "echo after-two"),                                # 10
        bash("toolu_big2", BIG_COMMAND.replace("walrus", "otter")),
        [tool_use("toolu_read2", "Read", {"file_path": str(project / "module.py"),
                                          "offset": 100})],
        # Outputs under the offload threshold, inline until the compaction.
        *(bash(f"toolu_medium{n}", MEDIUM_COMMAND.format(n)) for n in range(1, 7)),
        [tool_use("toolu_compact", "mcp__ctxd__compact_context", {})],
        bash("toolu_after3", "echo after-three"),                             # 20
        bash("toolu_after4", "echo after-four"),
        bash("toolu_after5", "echo after-five"),
    ]


@pytest.fixture
def mock() -> Iterator[MockAnthropic]:
    with MockAnthropic([], final="All done.") as server:
        yield server


@pytest.fixture
def daemon(mock: MockAnthropic) -> Iterator[DaemonProcess]:
    root = short_root()
    # compact_context brings a thread under 5% of the window (about 9,600 tokens): this
    # session's ~15,000 tokens are compacted, not left as they are.
    process = DaemonProcess(root, env={"CTXD_GATEWAY_ANTHROPIC_UPSTREAM": mock.url,
                                       "CTXD_HYGIENE_COMPACT_TARGET": "0.05"}).start()
    yield process
    process.stop()
    kill_leftovers(root)
    shutil.rmtree(root, ignore_errors=True)


def test_what_claude_codes_model_receives_through_the_gateway(
        tmp_path: Path, mock: MockAnthropic, daemon: DaemonProcess) -> None:
    assert CLAUDE is not None
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    subprocess.run([str(CTXCTL), "install", "claude-code", "--scope", "project",
                    "--socket", str(daemon.socket)], cwd=project, capture_output=True,
                   text=True, timeout=60, check=True)
    mock.turns = script(project)
    with daemon.client() as client:
        base_url = client.call("daemon.status")["gateway"]["base_url"]
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "ANTHROPIC_BASE_URL": base_url,
           "ANTHROPIC_API_KEY": "sk-ant-dummy", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "ENABLE_TOOL_SEARCH": "false"}
    done = subprocess.run([str(CLAUDE), "-p", "Work through it.", "--output-format", "json",
                           "--allowedTools", *TOOLS], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, (done.stdout, done.stderr)
    outcome = json.loads(done.stdout)
    assert (outcome["is_error"], outcome["result"]) == (False, "All done.")
    session_id = outcome["session_id"]
    requests = mock.main_requests()
    assert len(requests) == 23
    # ctxd's lean default set is what the model is offered (ctxctl mcp --tools: the rest).
    assert sorted(tool["name"] for tool in requests[0]["tools"]
                  if tool["name"].startswith("mcp__ctxd__")) == [
        "mcp__ctxd__compact_context", "mcp__ctxd__context_branch",
        "mcp__ctxd__context_return", "mcp__ctxd__memory_search", "mcp__ctxd__read_result"]
    by_call: dict[str, int] = {}
    for index, body in enumerate(requests):
        for message in body["messages"]:
            if message["role"] == "assistant" and isinstance(message["content"], list):
                for block in message["content"]:
                    if block.get("type") == "tool_use":
                        by_call.setdefault(block["id"], index)

    def after(call_id: str) -> dict[str, Any]:
        """The first request that carries ``call_id``'s result."""
        return requests[by_call[call_id]]

    # Large outputs reach the model as ctxd's stubs, the same bytes in every later request.
    for call_id in ("toolu_big1", "toolu_read1", "toolu_big2", "toolu_read2"):
        first = after(call_id)
        [stub] = tool_results(first, call_id)
        assert re.search(r'Use read_result with ref_id="res_[0-9a-f]+"', stub), stub[:300]
        assert len(stub) < 1_000
        assert all(tool_results(later, call_id) in ([stub], []) for later in
                   requests[by_call[call_id]:])
    assert "walrus-00300" not in json.dumps(requests)  # the middle of the output was left out
    # The failing run stays inline: the model sees what failed.
    [failed] = tool_results(after("toolu_fail1"), "toolu_fail1")
    assert "FAIL: test_parser (AssertionError: 3 != 4)" in failed

    # The branch: inside it the model saw its work; from the request after context_return
    # on, the work is folded away and the return's summary stays.
    assert "narwhal-inside-two" in sent(after("toolu_inside2"))
    for body in requests[by_call["toolu_return"]:by_call["toolu_compact"]]:
        assert "narwhal-inside" not in sent(body)
    assert FOLD_SUMMARY in sent(after("toolu_return"))
    before_return = requests[by_call["toolu_return"] - 1]
    assert len(sent(after("toolu_return"))) < len(sent(before_return))

    # read_result through ctxd's MCP server: the exact head of the stored output.
    [answer] = tool_results(after("toolu_read"), "toolu_read")
    assert json.loads(answer)["content"] == BIG_OUTPUT[:2_000]
    # The thinking block the model wrote comes back unchanged in every later request
    # (until the compaction, which stands for it).
    until_compaction = requests[by_call["toolu_read"]:by_call["toolu_compact"]]
    thinking = [block for body in until_compaction
                for message in body["messages"] if message["role"] == "assistant"
                and isinstance(message["content"], list) for block in message["content"]
                if block.get("type") == "thinking"]
    assert thinking == [THINKING] * len(until_compaction)

    # compact_context shrinks the next request.
    compacted = after("toolu_compact")
    assert len(json.dumps(compacted["messages"])) < len(
        json.dumps(requests[by_call["toolu_compact"] - 1]["messages"]))

    # Every model call's usage is in the session's ledger once.
    messages_calls = [path for path, _ in mock.requests
                      if path.endswith("/v1/messages") or "/v1/messages?" in path]
    with daemon.client() as client:
        read = client.call("result.read", {"ref_id": re.search(
            r'ref_id="(res_[0-9a-f]+)"', tool_results(after("toolu_big1"), "toolu_big1")[0])[1],
            "limit": 1_000_000})
        assert read["content"] == BIG_OUTPUT
        totals = client.call("usage.get", {"session_id": session_id})["totals"]
        # The gateway records the conversation; the hooks, which see Claude Code's base URL
        # is the gateway, record none of it again (ctxd adds its own: a branch's opening and
        # fold, its compaction's markers).
        archive = client.call("message.list", {"session_id": session_id,
                                               "limit": 1000})["messages"]
    recorded = [m for m in archive if not {"compaction", "ctxd"} & set(m.get("meta") or {})]
    assert {(m.get("meta") or {}).get("source", {}).get("format") for m in recorded} == {
        "gateway"}
    assert [m.get("tool_call_id") for m in recorded].count("toolu_big1") == 1
    assert totals["calls"] == len(messages_calls)

"""The rewrite over the requests the real Claude Code CLI (claude-agent-sdk's) sends: the
CLI runs a scripted session against the mock Messages API, then every request it sent is
prepared, in order, by the gateway's rewrite on a Supervisor with a real Store file. Its
history must read as one conversation (no boundary), its large result go out as a stub
that reads back whole, and what was sent for a message stay the same bytes."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest
from mock_anthropic import MockAnthropic, tool_use
from tests_support import bundled_claude, running_supervisor

from ctxd.config import Config
from ctxd.cost import CacheUsage, PromptCache
from ctxd.gateway import GatewayRequest, prepare
from ctxd.gateway._blocks import bare
from ctxd.sessions import Supervisor, get_session, read_result
from ctxd.wire.types import ResultReadParams

STEPS = 20
LINES = 540
BIG_COMMAND = ("python3 -c \"print('\\n'.join(f'zebra-{i:05d} the quick brown fox jumps' "
               f"for i in range({LINES})))\"")
BIG_OUTPUT = "\n".join(f"zebra-{i:05d} the quick brown fox jumps" for i in range(LINES))


CLAUDE = bundled_claude()
pytestmark = pytest.mark.skipif(CLAUDE is None, reason="claude-agent-sdk (with its bundled "
                                                       "Claude Code CLI) is not installed")


def claude(project: Path, home: Path, mock: MockAnthropic, prompt: str) -> dict[str, Any]:
    """One ``claude -p`` run in ``project``, hermetic: its own HOME, the mock model, no
    ctxd installed (the agent alone, as the gateway sees it)."""
    assert CLAUDE is not None
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "ANTHROPIC_BASE_URL": mock.url,
           "ANTHROPIC_API_KEY": "sk-ant-dummy", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "ENABLE_TOOL_SEARCH": "false"}
    # Claude Code refuses --dangerously-skip-permissions as root: allow Bash by name.
    done = subprocess.run([str(CLAUDE), "-p", prompt, "--output-format", "json",
                           "--allowedTools", "Bash"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, (done.stdout, done.stderr)
    result: dict[str, Any] = json.loads(done.stdout)
    assert result["is_error"] is False, result
    return result


def stub_of(messages: list[dict[str, Any]], call_id: str) -> str:
    [content] = [block["content"] for message in messages if message["role"] == "user"
                 and isinstance(message["content"], list) for block in message["content"]
                 if block.get("type") == "tool_result" and block["tool_use_id"] == call_id]
    return content if isinstance(content, str) else "".join(b["text"] for b in content)


async def test_claude_codes_requests_read_as_one_conversation_with_sticky_stubs(
        tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    turns = [[tool_use("toolu_big01", "Bash", {"command": BIG_COMMAND,
                                               "description": "Print the big log"})]]
    turns += [[tool_use(f"toolu_step{n}", "Bash", {
        "command": BIG_COMMAND if n % 4 == 3 else f"echo step {n}", "description": f"Step {n}"})]
        for n in range(STEPS)]
    with MockAnthropic(turns, final="All done.") as mock:
        result = claude(project, home, mock, "Print the big log, then take twenty steps")
    requests = mock.main_requests()
    assert len(requests) == STEPS + 2
    session_id = result["session_id"]
    async with running_supervisor(tmp_path / "ctxd.db", Config()) as supervisor:
        events = supervisor.bus.subscribe(session_id, types=["gateway.boundary"])
        sent: list[list[dict[str, Any]]] = []
        now = [0.0]
        direct, rewritten = PromptCache(lambda: now[0]), PromptCache(lambda: now[0])
        charged: list[tuple[CacheUsage, CacheUsage]] = []
        for body in requests:
            prepared = await prepare(supervisor, GatewayRequest(
                api="anthropic", endpoint="messages", session_header=None, body=body))
            assert prepared.session_id == session_id
            rewritten_body = msgspec.json.decode(prepared.body)
            sent.append(rewritten_body["messages"])
            charged.append((direct.charge(body), rewritten.charge(rewritten_body)))
            now[0] += 10.0
        assert events.receive_nowait() is None  # one conversation: no boundary
        events.close()
        # Each request's messages, marks aside, begin with the previous request's.
        for before, after in itertools.pairwise(sent):
            assert [bare(m) for m in after[:len(before)]] == [bare(m) for m in before]
        stub = stub_of(sent[1], "toolu_big01")
        assert BIG_OUTPUT[-200:] not in json.dumps(sent[-1])
        assert all(stub_of(messages, "toolu_big01") == stub for messages in sent[1:])
        ref_id = stub.split('ref_id="')[1].split('"')[0]
        assert await whole(supervisor, session_id, ref_id) == BIG_OUTPUT
        # The prompt cache is read as much through the rewrite, for fewer tokens.
        read_direct, read_rewritten = (
            sum(c[i].cache_read_tokens for c in charged) / sum(c[i].total for c in charged)
            for i in (0, 1))
        assert read_rewritten >= read_direct - 0.05, (read_rewritten, read_direct)
        assert sum(c[1].total for c in charged) < 0.6 * sum(c[0].total for c in charged)
        # Recorded once each: the prompt, then per turn the call and its result.
        recorded = (await supervisor.call(session_id, get_session)).session.message_count
        assert recorded == len(requests[-1]["messages"])


async def whole(supervisor: Supervisor, session_id: str, ref_id: str) -> str:
    page = await supervisor.call(session_id, lambda a: read_result(a, ResultReadParams(
        session_id=session_id, ref_id=ref_id, limit=1_048_576)))
    return page.content or ""

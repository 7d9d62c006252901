"""README's "Your own agent loop": its Python block run as it is, with the real `openai`
SDK, against a real daemon and a scripted OpenAI-compatible model server; what the model
received is checked (valid requests, each tool call answered, the large output as its
stub, the branch folded), not only what ctxd recorded."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from chat_server import USAGE, ChatServer, ToolCall
from conftest import DaemonProcess
from tests_support import REPOSITORY

from ctxd.gateway import _openai

README = (REPOSITORY / "README.md").read_text(encoding="utf-8")
OUTPUT = "".join(f"{i}\n" for i in range(1, 3001))
"""What ``seq 1 3000`` prints: 13,893 bytes, over the offload threshold."""


def readme_loop() -> str:
    """The Python block of README's "Your own agent loop" section."""
    section = README.split("## Your own agent loop", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    return block


def test_the_readme_agent_loop_runs_and_the_model_receives_valid_managed_context(
        shared_daemon: DaemonProcess, tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text("x" * 10_000)
    (tmp_path / "small.txt").write_text("x")
    with ChatServer() as server:
        server.turns = [ToolCall("bash", {"cmd": "seq 1 3000"}, "call_1"),
                        "It prints 3000 lines.",
                        ToolCall("bash", {"cmd": "ls -S | head -n 1"}, "call_2"),
                        "big.txt",
                        "3000 lines; the largest file is big.txt."]
        env = {**os.environ, "CTXD_SOCKET": str(shared_daemon.socket),
               "OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "test"}
        run = subprocess.run([sys.executable, "-c", readme_loop()], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120, check=False)
        assert run.returncode == 0, run.stderr
        assert run.stdout == "It prints 3000 lines.\n3000 lines; the largest file is big.txt.\n"
        bodies: list[dict[str, Any]] = [seen.body for seen in server.requests]
        assert [seen.path for seen in server.requests] == ["/v1/chat/completions"] * 5

    with shared_daemon.client() as client:
        stored = client.call("message.list", {"session_id": "quickstart"})["messages"]
        usage = client.call("usage.get", {"session_id": "quickstart"})["totals"]
    [offloaded] = [m for m in stored if m.get("ref_id")]
    ref = offloaded["ref_id"]
    assert (offloaded["tool_call_id"], offloaded["content"]) == ("call_1", OUTPUT)
    assert (usage["calls"], usage["input_tokens"], usage["output_tokens"]) == (
        5, 5 * USAGE["prompt_tokens"], 5 * USAGE["completion_tokens"])

    for body in bodies:
        assert _openai.problems(body["messages"]) == []
        assert [tool["function"]["name"] for tool in body["tools"]] == ["bash"]
    first, after_tool, in_branch, branch_after_tool, last = (b["messages"] for b in bodies)
    assert [m["role"] for m in first] == ["system", "user"]
    call_1 = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "bash", "arguments": json.dumps({"cmd": "seq 1 3000"})}}]}
    assert after_tool[:3] == [*first, call_1]
    stub = after_tool[3]
    assert (stub["role"], stub["tool_call_id"]) == ("tool", "call_1")
    assert ref in stub["content"]
    assert OUTPUT not in stub["content"]
    assert len(stub["content"]) < 1_000
    assert len(after_tool) == 4

    # The branch sees the main thread, then its opening (the prompt last).
    assert in_branch[:5] == [*after_tool, {"role": "assistant",
                                           "content": "It prints 3000 lines."}]
    assert in_branch[-1] == {"role": "user",
                             "content": "Find the largest file in this directory."}
    assert branch_after_tool[-1] == {"role": "tool", "tool_call_id": "call_2",
                                     "content": "big.txt\n"}
    assert branch_after_tool[-2]["tool_calls"][0]["id"] == "call_2"

    # Back on the main thread: the branch is one fold message, its calls are gone.
    assert last[:5] == in_branch[:5]
    assert last[5:] == [
        {"role": "user", "content": 'Branch "find the largest file" returned: big.txt'},
        {"role": "user", "content": "Sum it up."}]

"""OpenCode itself (the npm package opencode-ai) with ctxd's plugin, installed by
``ctxctl install opencode``, against a mock OpenAI-compatible model and a real daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from chat_server import USAGE, ChatServer, ToolCall
from conftest import DaemonProcess
from tests_support import npm_tool

OPENCODE = npm_tool("opencode")

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
MEMORY = {"title": "Deploying the service",
          "content": "Deploy the service with `make ship` from a clean checkout, never by hand."}


def opencode_project(root: Path, model_url: str) -> Path:
    """A project with ctxd installed (project scope) and the mock model as its provider."""
    project = root / "project"
    project.mkdir()
    installed = subprocess.run(
        [sys.executable, "-m", "ctxclient.cli", "install", "opencode", "--scope", "project"],
        cwd=project, capture_output=True, text=True, timeout=60, check=True)
    assert installed.stdout.splitlines()[0] == \
        f"added the plugin in {project}/.opencode/plugin/ctxd.js"
    config_path = project / "opencode.json"
    config = json.loads(config_path.read_text())
    config.update({
        "model": "mock/m1", "small_model": "mock/m1", "autoupdate": False, "share": "disabled",
        "permission": {"bash": "allow", "external_directory": "allow"},
        "provider": {"mock": {
            "npm": "@ai-sdk/openai-compatible", "name": "Mock",
            "options": {"baseURL": model_url, "apiKey": "dummy"},
            "models": {"m1": {"name": "m1", "tool_call": True,
                              "limit": {"context": 200000, "output": 8192}}}}}})
    config_path.write_text(json.dumps(config, indent=2))
    return project


def hermetic_env(root: Path, daemon: DaemonProcess) -> dict[str, str]:
    home = root / "home"
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_DATA_HOME": str(home / ".local/share"), "XDG_CACHE_HOME": str(home / ".cache"),
           "XDG_STATE_HOME": str(home / ".local/state"), "CTXD_SOCKET": str(daemon.socket),
           "PATH": os.environ["PATH"], "OPENCODE_DISABLE_AUTOUPDATE": "1",
           "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1"}
    home.mkdir()
    return env


def tool_message(request: dict[str, Any]) -> dict[str, Any]:
    [message] = [m for m in request["messages"] if m["role"] == "tool"]
    return message


def system_text(request: dict[str, Any]) -> str:
    return "\n".join(str(m["content"]) for m in request["messages"] if m["role"] == "system")


def test_opencode_offloads_remembers_and_records(tmp_path: Path, daemon: DaemonProcess) -> None:
    with daemon.client() as ctxd:
        ctxd.call("memory.record", MEMORY)
    with ChatServer() as model:
        model.summary = "Deploying"
        model.turns = list(TURNS)
        project = opencode_project(tmp_path, model.url)
        run = subprocess.run([str(OPENCODE), "run", PROMPT], cwd=project,
                             env=hermetic_env(tmp_path, daemon), capture_output=True,
                             text=True, timeout=300, check=False)
        assert run.returncode == 0, run.stderr
        turns = [seen.body for seen in model.requests if seen.body.get("tools")]

    # The model asked for the log and got ctxd's stub in its place.
    assert len(turns) == 2
    assert [m["role"] for m in turns[1]["messages"]][-2:] == ["assistant", "tool"]
    stub = tool_message(turns[1])["content"]
    assert isinstance(stub, str)
    assert stub.startswith(f"[Tool result stored — {len(BUILD_LOG.encode()):,} bytes from "
                           f'"bash". First 200 chars: {BUILD_LOG[:200]}')
    assert "line 0799" not in json.dumps(turns[1])
    ref_id = stub.split('ref_id="')[1].split('"')[0]

    # Each model turn's system prompt carried the memory recorded beforehand.
    for turn in turns:
        assert f"- {MEMORY['title']}: {MEMORY['content']}" in system_text(turn)

    with daemon.client() as ctxd:
        [session] = ctxd.call("session.list", {"project": str(project)})["sessions"]
        session_id = session["session_id"]
        assert session_id.startswith("ses_")
        whole = ctxd.call("result.read", {"session_id": session_id, "ref_id": ref_id,
                                          "limit": 1_000_000})
        assert (whole["tool_name"], whole["content"], whole["next_offset"]) == (
            "bash", BUILD_LOG, None)
        found = ctxd.call("result.read", {"session_id": session_id, "ref_id": ref_id,
                                          "pattern": "^line 0799"})
        assert [m["text"] for m in found["matches"]] == ["line 0799 of the build log: ok"]
        messages = ctxd.call("message.list", {"session_id": session_id})["messages"]
        assert [(m["role"], m.get("ref_id") is not None) for m in messages] == [
            ("user", False), ("tool", True), ("assistant", False)]
        # `opencode run` quotes an argument with spaces in the text it sends.
        assert messages[0]["content"] == turns[0]["messages"][-1]["content"] == f'"{PROMPT}"'
        assert messages[2]["content"] == "Deploy it with make ship."
        totals = ctxd.call("usage.get", {"session_id": session_id})["totals"]
        assert (totals["input_tokens"], totals["output_tokens"]) == (
            2 * USAGE["prompt_tokens"], 2 * USAGE["completion_tokens"])


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
        run = subprocess.run([str(OPENCODE), "run", PROMPT], cwd=project,
                             env=hermetic_env(tmp_path, daemon), capture_output=True,
                             text=True, timeout=300, check=False)
        assert run.returncode == 0, run.stderr
        turns = [seen.body for seen in model.requests if seen.body.get("tools")]
    assert len(turns) == 2
    assert tool_message(turns[1])["content"] == BUILD_LOG
    assert "ctxd" not in system_text(turns[0])

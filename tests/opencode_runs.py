"""Real OpenCode sessions (the npm package opencode-ai) against the mock model of
chat_server.py: a project with ctxd installed by ``ctxctl install opencode``, a hermetic
home, ``opencode run`` and ``opencode export``.

Used by the OpenCode end-to-end tests and by the tests that import OpenCode's own exports
(which are produced here at test time, never stored in the repository)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests_support import npm_tool

OPENCODE = npm_tool("opencode")
"""The OpenCode CLI: on PATH, else where .ci/run installs it; None when missing."""

MODEL = "mock/m1"
MODEL_LIMIT = {"context": 200000, "output": 8192}


def opencode_project(root: Path, model_url: str, *, model_limit: dict[str, int] | None = None,
                     mcp: dict[str, Any] | None = None, ctxd: bool = True) -> Path:
    """``root/project``: ctxd installed (project scope) unless ``ctxd`` is false, the mock
    model at ``model_url`` as its only model (with ``model_limit``, default `MODEL_LIMIT`)
    and the MCP servers of ``mcp`` beside ctxd's."""
    project = root / "project"
    project.mkdir()
    config: dict[str, Any] = {}
    if ctxd:
        installed = subprocess.run(
            [sys.executable, "-m", "ctxclient.cli", "install", "opencode", "--scope", "project"],
            cwd=project, capture_output=True, text=True, timeout=60, check=True)
        assert installed.stdout.splitlines()[0] == \
            f"added the plugin in {project}/.opencode/plugin/ctxd.js"
        config = json.loads((project / "opencode.json").read_text())
    config.update({
        "model": MODEL, "small_model": MODEL, "autoupdate": False, "share": "disabled",
        "permission": {"bash": "allow", "external_directory": "allow"},
        "provider": {"mock": {
            "npm": "@ai-sdk/openai-compatible", "name": "Mock",
            "options": {"baseURL": model_url, "apiKey": "dummy"},
            "models": {"m1": {"name": "m1", "tool_call": True,
                              "limit": model_limit or MODEL_LIMIT}}}}})
    if mcp:
        config["mcp"] = {**config.get("mcp", {}), **mcp}
    (project / "opencode.json").write_text(json.dumps(config, indent=2))
    return project


def hermetic_env(root: Path, socket: Path) -> dict[str, str]:
    """OpenCode's environment: a home of its own under ``root`` (its data, config, cache
    and state there too) and ctxd's socket."""
    home = root / "home"
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_DATA_HOME": str(home / ".local/share"), "XDG_CACHE_HOME": str(home / ".cache"),
           "XDG_STATE_HOME": str(home / ".local/state"), "CTXD_SOCKET": str(socket),
           "PATH": os.environ["PATH"], "OPENCODE_DISABLE_AUTOUPDATE": "1",
           "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1"}
    home.mkdir(exist_ok=True)
    return env


@dataclass(frozen=True)
class OpenCode:
    """OpenCode in ``project`` with the environment ``env`` (see `hermetic_env`)."""

    project: Path
    env: dict[str, str]

    def run(self, prompt: str, session_id: str | None = None) -> str:
        """``opencode run PROMPT`` (in ``session_id`` when given); the session's id."""
        more = ["--session", session_id] if session_id else []
        done = subprocess.run([str(OPENCODE), "run", "--format", "json", *more, prompt],
                              cwd=self.project, env=self.env, capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, done.stderr
        ids = {json.loads(line)["sessionID"] for line in done.stdout.splitlines()
               if line.startswith("{")}
        [found] = ids
        assert session_id in (None, found)
        return str(found)

    def export(self, session_id: str) -> dict[str, Any]:
        """``opencode export SESSION``: ``{info, messages: [{info, parts}]}``."""
        done = subprocess.run([str(OPENCODE), "export", session_id], cwd=self.project,
                              env=self.env, capture_output=True, text=True, timeout=120,
                              check=False)
        assert done.returncode == 0, done.stderr
        exported: dict[str, Any] = json.loads(done.stdout)
        return exported


def model_turns(requests: list[Any]) -> list[dict[str, Any]]:
    """The bodies of the mock model's requests that offered tools: the agent's turns
    (a title or summary request offers none)."""
    return [seen.body for seen in requests if seen.body.get("tools")]


def tool_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in request["messages"] if m["role"] == "tool"]


def system_text(request: dict[str, Any]) -> str:
    return "\n".join(str(m["content"]) for m in request["messages"] if m["role"] == "system")

"""Real OpenCode sessions (the npm package opencode-ai) against the mock model of
chat_server.py: a project with ctxd installed by ``ctxctl install opencode``, a hermetic
home, ``opencode run`` and ``opencode export``.

Used by the OpenCode end-to-end tests and by the tests that import OpenCode's own exports
(which are produced here at test time, never stored in the repository)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests_support import npm_tool

OPENCODE = npm_tool("opencode")
"""The OpenCode CLI: on PATH, else where .ci/run installs it; None when missing."""

MODEL = "mock/m1"
MODEL_LIMIT = {"context": 200000, "output": 8192}


PLUGIN_SDK = "@opencode-ai/plugin"


def plugin_sdk_installed(folder: Path) -> None:
    """Mark OpenCode's config ``folder`` (a project's ``.opencode``, the user's
    ``opencode`` folder) as holding its plugin SDK: on its first start with a config
    folder, OpenCode 1.18 installs `PLUGIN_SDK` there with npm (10 s and the network), and
    skips that when ``node_modules`` exists and ``package-lock.json`` names the package.
    ctxd's plugin imports nothing from it (clients/opencode/ctxd.js), so the suite need
    not download it a time per test."""
    (folder / "node_modules").mkdir(parents=True, exist_ok=True)
    (folder / "package-lock.json").write_text(json.dumps(
        {"packages": {"": {"dependencies": {PLUGIN_SDK: "*"}}}}))


def opencode_project(root: Path, model_url: str, *, model_limit: dict[str, int] | None = None,
                     mcp: dict[str, Any] | None = None, ctxd: bool = True,
                     ctxd_tools: str | None = None) -> Path:
    """``root/project``: ctxd installed (project scope) unless ``ctxd`` is false (its MCP
    server offering ``ctxd_tools``: ``ctxctl install --tools``; None, its default set), the
    mock model at ``model_url`` as its only model (with ``model_limit``, default
    `MODEL_LIMIT`) and the MCP servers of ``mcp`` beside ctxd's."""
    project = root / "project"
    project.mkdir(parents=True)
    config: dict[str, Any] = {}
    if ctxd:
        installed = subprocess.run(
            [sys.executable, "-m", "ctxclient.cli", "install", "opencode", "--scope", "project",
             *(["--tools", ctxd_tools] if ctxd_tools else [])],
            cwd=project, capture_output=True, text=True, timeout=60, check=True)
        assert installed.stdout.splitlines()[0] == \
            f"added the plugin in {project}/.opencode/plugin/ctxd.js"
        config = json.loads((project / "opencode.json").read_text())
        plugin_sdk_installed(project / ".opencode")
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
    and state there too; its config folder holding the plugin SDK, `plugin_sdk_installed`)
    and ctxd's socket."""
    home = root / "home"
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_DATA_HOME": str(home / ".local/share"), "XDG_CACHE_HOME": str(home / ".cache"),
           "XDG_STATE_HOME": str(home / ".local/state"), "CTXD_SOCKET": str(socket),
           "PATH": os.environ["PATH"], "OPENCODE_DISABLE_AUTOUPDATE": "1",
           "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1"}
    home.mkdir(exist_ok=True)
    plugin_sdk_installed(home / ".config/opencode")  # OpenCode creates it if missing
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
        """``opencode export SESSION``: ``{info, messages: [{info, parts}]}``.

        Its stdout goes to a file: into a pipe, OpenCode 1.18 exits before a large export
        is all written (it stops at 64 KB)."""
        path = self.project.parent / f"export-{session_id}.json"
        with path.open("w") as out:
            done = subprocess.run([str(OPENCODE), "export", session_id], cwd=self.project,
                                  env=self.env, stdout=out, stderr=subprocess.PIPE,
                                  text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        exported: dict[str, Any] = json.loads(path.read_text())
        return exported


def model_turns(requests: list[Any]) -> list[dict[str, Any]]:
    """The bodies of the mock model's requests that offered tools: the agent's turns
    (a title or summary request offers none)."""
    return [seen.body for seen in requests if seen.body.get("tools")]


def tool_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in request["messages"] if m["role"] == "tool"]


def system_text(request: dict[str, Any]) -> str:
    return "\n".join(str(m["content"]) for m in request["messages"] if m["role"] == "system")


# ---- OpenCode's own exports, for the importer and the fork pipeline ----
#
# Sessions run without ctxd (no plugin, no MCP server): the export holds what OpenCode
# itself stored, whole tool outputs included.


def export_once(folder: Path, make: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """``make(root)``'s export, made once in ``folder`` (a folder all of the suite's
    workers share, `conftest.run_folder`) and read back after: each export session is
    OpenCode's own work, the same for every test that imports or forks it."""
    folder.mkdir(parents=True, exist_ok=True)
    saved = folder / f"{make.__name__}.json"
    with (folder / f"{make.__name__}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be making it
        if not saved.exists():
            made = make(folder / make.__name__)
            temporary = saved.with_suffix(".tmp")
            temporary.write_text(json.dumps(made))
            temporary.replace(saved)
    exported: dict[str, Any] = json.loads(saved.read_text())
    return exported


BUILD_LINES = 1000
BUILD_LOG = "".join(f"line {i:04d} of the build log: ok\n" for i in range(BUILD_LINES))
"""What the tool session's first command prints: 31,000 bytes."""
CONFIG_TOML = "[server]\nport = 8080\nworkers = 4\n"


def _python(script: str) -> str:
    return f'python3 -c "{script}"'


def _log_command(lines: int, label: str) -> str:
    return _python(f"for i in range({lines}): print(f'line {{i:04d}} of the {label}: ok')")


def exported_tool_session(root: Path) -> dict[str, Any]:
    """Two turns of built-in tools: a bash command with a 31 KB output (`BUILD_LOG`), a
    read of ``config.toml`` (`CONFIG_TOML`), then a read of a missing file (the tool fails:
    status ``error``) and a command that exits with an error (status ``completed``, its
    output the error); each turn ends with a text answer. OpenCode's export of it."""
    from chat_server import ChatServer, ToolCall

    with ChatServer() as model:
        model.summary = "Build and config"
        project = opencode_project(root, model.url, ctxd=False)
        (project / "config.toml").write_text(CONFIG_TOML)
        model.turns = [
            ToolCall("bash", {"command": _log_command(BUILD_LINES, "build log"),
                              "description": "Build"}, call_id="call_build"),
            ToolCall("read", {"filePath": str(project / "config.toml")}, call_id="call_read"),
            "The build passed and the server listens on port 8080.",
            ToolCall("read", {"filePath": str(project / "missing.toml")},
                     call_id="call_missing"),
            ToolCall("bash", {"command": "ls /nonexistent-ctxd-dir", "description": "List"},
                     call_id="call_ls"),
            "Neither exists.",
        ]
        opencode = OpenCode(project, hermetic_env(root, root / "no-ctxd.sock"))
        session_id = opencode.run("Build the project and show me its config.")
        opencode.run("Now look for missing.toml and /nonexistent-ctxd-dir.", session_id)
        assert model.turns == []
        return opencode.export(session_id)


OVERFLOW = {"prompt_tokens": 3500, "completion_tokens": 34, "total_tokens": 3534}
"""Usage over `SMALL_MODEL`'s limit: OpenCode compacts before the next step."""
SMALL_MODEL = {"context": 4000, "output": 1000}
BIG_OUTPUTS = 6
BIG_LINES = 1700
"""Six outputs of 1,700 lines (45,900 bytes each, under OpenCode's own cut at 2,000 lines
or 50 KB)."""
SUMMARY = "## Objective\n- Collect the six logs and deploy."


def exported_compacted_session(root: Path) -> dict[str, Any]:
    """A session OpenCode compacted by itself: six large bash outputs, a text turn, then
    a turn whose tool call reports usage over the model's limit, so that OpenCode
    summarises the session (`SUMMARY`) and goes on. OpenCode's export of it.

    ``compaction.prune`` is off: OpenCode prunes after a turn, in the background, and
    whether ``opencode run`` exits before the pruning marks its parts
    (``state.time.compacted``) is a race (the export had none, or three). The importer's
    reading of a pruned part is tested on exports written out (tests/e2e/test_import.py)."""
    from chat_server import ChatServer, ToolCall

    with ChatServer() as model:
        model.summary = SUMMARY
        project = opencode_project(root, model.url, ctxd=False, model_limit=SMALL_MODEL)
        config = json.loads((project / "opencode.json").read_text())
        config["compaction"] = {"prune": False}
        (project / "opencode.json").write_text(json.dumps(config, indent=2))
        model.turns = [
            *[ToolCall("bash", {"command": _log_command(BIG_LINES, f"log {n}"),
                                "description": f"Log {n}"}, call_id=f"call_log{n}")
              for n in range(BIG_OUTPUTS)],
            "All six logs are clean.",
            "Deploying next.",
            ToolCall("bash", {"command": "echo deployed", "description": "Deploy"},
                     call_id="call_deploy", usage=OVERFLOW),
            "Deployed.",
        ]
        opencode = OpenCode(project, hermetic_env(root, root / "no-ctxd.sock"))
        session_id = opencode.run("Print the six logs.")
        opencode.run("Are they clean?", session_id)
        opencode.run("Deploy it.", session_id)
        assert model.turns == []
        return opencode.export(session_id)


BIG_FILE = "".join(f"row {i:03d}: value {i * 7}\n" for i in range(200))
"""A file whose read output (with OpenCode's line numbers) is over 3,000 characters."""
ERROR_FILE = "ERROR: disk full at block 7\n" + "".join(f"retry {i:03d}: waiting\n"
                                                       for i in range(200))
"""A file whose text shows an error: a cut keeps its head and its tail."""
TIER_CALLS = 17
"""Results enough for every tier: the newest 5 whole, the next 10 cut to 3,000 characters,
the oldest 2 to 500."""


def exported_tiers_session(root: Path) -> dict[str, Any]:
    """One turn of `TIER_CALLS` tool calls, oldest first: two bash commands of 150 lines
    (over 500 characters, their parameters over 100), then bash commands of 150 lines and
    of 50 (under 3,000 characters), reads of `BIG_FILE` and of `ERROR_FILE`, then five more
    calls; a text answer. OpenCode's export of it."""
    from chat_server import ChatServer, ToolCall

    with ChatServer() as model:
        model.summary = "Tiers"
        project = opencode_project(root, model.url, ctxd=False)
        (project / "big.txt").write_text(BIG_FILE)
        (project / "errors.txt").write_text(ERROR_FILE)
        kinds = ["long", "long", "long", "short", "big", "errors", "long", "short", "big",
                 "errors", "long", "short", "long", "big", "short", "errors", "long"]
        assert len(kinds) == TIER_CALLS
        calls: list[Any] = []
        for n, kind in enumerate(kinds):
            if kind in ("long", "short"):
                command = _log_command(150 if kind == "long" else 50, f"output {n}")
                calls.append(ToolCall("bash", {"command": command, "description": f"Out {n}"},
                                      call_id=f"call_{n:02d}"))
            else:
                calls.append(ToolCall("read", {"filePath": str(project / f"{kind}.txt")},
                                      call_id=f"call_{n:02d}"))
        model.turns = [*calls, "All read."]
        opencode = OpenCode(project, hermetic_env(root, root / "no-ctxd.sock"))
        session_id = opencode.run("Run the commands and read the files.")
        assert model.turns == []
        return opencode.export(session_id)


# ---- OpenCode through ctxd's model gateway ----

ANTHROPIC_MODEL = "anthropic/claude-mock"


def gateway_project(root: Path, env: dict[str, str], socket: Path, *,
                    ctxd: str = "gateway") -> Path:
    """``root/project`` for OpenCode on the Anthropic provider (model `ANTHROPIC_MODEL`,
    a dummy key in ``env``) with ctxd as ``ctxd`` says: ``"gateway"``, ``ctxctl install
    opencode`` at user scope (plugin, MCP server and the Anthropic provider's baseURL at the
    daemon's gateway, in ``env``'s ``XDG_CONFIG_HOME``); ``"plugin"``, the same with
    ``--no-gateway``; ``"none"``, no ctxd. The provider's baseURL, when ctxd does not set
    it, is the caller's to set (`point_anthropic_at`)."""
    project = root / "project"
    project.mkdir(parents=True)
    if ctxd != "none":
        more = ["--no-gateway"] if ctxd == "plugin" else []
        subprocess.run([sys.executable, "-m", "ctxclient.cli", "install", "opencode",
                        "--socket", str(socket), *more], cwd=project, env=env,
                       capture_output=True, text=True, timeout=60, check=True)
    config = {
        "$schema": "https://opencode.ai/config.json",
        "model": ANTHROPIC_MODEL, "small_model": ANTHROPIC_MODEL, "autoupdate": False,
        "share": "disabled", "permission": {"bash": "allow", "external_directory": "allow"},
        "provider": {"anthropic": {"models": {"claude-mock": {
            "name": "Claude (scripted)", "tool_call": True, "limit": MODEL_LIMIT}}}}}
    (project / "opencode.json").write_text(json.dumps(config, indent=2))
    return project


def point_anthropic_at(project: Path, url: str) -> None:
    """The project's Anthropic provider at ``url`` (the AI SDK adds ``/messages``)."""
    config = json.loads((project / "opencode.json").read_text())
    config["provider"]["anthropic"]["options"] = {"baseURL": url}
    (project / "opencode.json").write_text(json.dumps(config, indent=2))

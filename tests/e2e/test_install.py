"""`ctxctl install|uninstall claude-code` and `ctxctl doctor`'s view of them, through the
installed console script, on settings files in a temporary HOME and project."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonProcess
from tests_support import NO_PROVIDER_NOTE, doctor_gateway_lines

CTXCTL = Path(sys.executable).with_name("ctxctl")
EVENTS = ["SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse",
          "PostToolUseFailure", "PreCompact", "Stop", "SubagentStart", "SubagentStop",
          "SessionEnd"]


def ctxctl(home: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CTXD_", "CLAUDE_CONFIG_DIR"))}
    return subprocess.run([str(CTXCTL), *args], cwd=cwd, env={**env, "HOME": str(home)},
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "proj").mkdir()
    return tmp_path / "proj"


def read(path: Path) -> Any:
    return json.loads(path.read_text())


USER_SETTINGS = {
    "model": "opus", "permissions": {"allow": ["Bash(ls:*)"]},
    "hooks": {"PostToolUse": [{"matcher": "Write", "hooks": [
        {"type": "command", "command": "prettier --write", "timeout": 5}]}],
              "Notification": [{"hooks": [{"type": "command", "command": "notify-send hi"}]}]}}
USER_CLAUDE_JSON = {"numStartups": 3, "mcpServers": {"github": {
    "type": "stdio", "command": "gh-mcp", "args": []}}, "projects": {"/x": {}}}


def test_user_scope_merges_and_uninstall_restores_exactly(home: Path, project: Path) -> None:
    settings, claude_json = home / ".claude" / "settings.json", home / ".claude.json"
    settings.parent.mkdir()
    # The user's own layout: four-space indents, an array on one line, no final newline.
    settings.write_text(json.dumps(USER_SETTINGS, indent=4).replace(
        '[\n            "Bash(ls:*)"\n        ]', '["Bash(ls:*)"]'))
    claude_json.write_text(json.dumps(USER_CLAUDE_JSON))
    claude_json.chmod(0o600)
    originals = (settings.read_bytes(), claude_json.read_bytes())
    assert b'["Bash(ls:*)"]' in originals[0]
    done = ctxctl(home, project, "install", "claude-code", "--no-gateway")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [
        *(f"added hook {e} in {settings}" for e in EVENTS),
        f"added MCP server ctxd in {claude_json}"]
    hook = {"type": "command", "command": f"{CTXCTL} hook", "timeout": 10}
    merged = read(settings)
    assert merged["hooks"]["PostToolUse"] == [USER_SETTINGS["hooks"]["PostToolUse"][0],
                                              {"hooks": [hook]}]
    assert merged["hooks"]["Notification"] == USER_SETTINGS["hooks"]["Notification"]
    assert {e: merged["hooks"][e] for e in EVENTS if e != "PostToolUse"} == {
        e: [{"hooks": [hook]}] for e in EVENTS if e != "PostToolUse"}
    assert (merged["model"], merged["permissions"]) == ("opus", {"allow": ["Bash(ls:*)"]})
    assert read(claude_json)["mcpServers"] == {
        **USER_CLAUDE_JSON["mcpServers"],  # type: ignore[dict-item]
        "ctxd": {"type": "stdio", "command": str(CTXCTL), "args": ["mcp"]}}
    assert stat.S_IMODE(claude_json.stat().st_mode) == 0o600
    # A second run changes nothing, and says so.
    before = (settings.read_bytes(), claude_json.read_bytes())
    again = ctxctl(home, project, "install", "claude-code", "--no-gateway", "--json")
    assert json.loads(again.stdout) == {"target": "claude-code", "scope": "user",
                                        "changed": False, "changes": []}
    assert (settings.read_bytes(), claude_json.read_bytes()) == before
    assert ctxctl(home, project, "install", "claude-code", "--no-gateway").stdout == (
        "claude-code (user): already installed, nothing changed\n")
    # Uninstall takes out exactly what install added.
    gone = ctxctl(home, project, "uninstall", "claude-code", "--json")
    assert gone.returncode == 0
    assert [(c["action"], c["what"]) for c in json.loads(gone.stdout)["changes"]] == [
        *(("removed", f"hook {e}") for e in EVENTS), ("removed", "MCP server ctxd")]
    assert (read(settings), read(claude_json)) == (USER_SETTINGS, USER_CLAUDE_JSON)
    # What install did not touch keeps the user's layout (a list it added to and took from
    # again is written anew); the file it only added a key to comes back byte for byte.
    assert b'\n    "permissions": {\n        "allow": ["Bash(ls:*)"]\n    },' in (
        settings.read_bytes())
    assert claude_json.read_bytes() == originals[1]
    assert ctxctl(home, project, "uninstall", "claude-code").stdout == (
        "claude-code (user): ctxd is not installed there, nothing changed\n")


def test_project_scope_writes_the_project_files_and_pre_approves_the_server(
        home: Path, project: Path) -> None:
    done = ctxctl(home, project, "install", "claude-code", "--scope", "project",
                  "--socket", "/run/ctxd/ctxd.sock")
    assert done.returncode == 0
    settings = read(project / ".claude" / "settings.json")
    assert settings["enabledMcpjsonServers"] == ["ctxd"]
    assert settings["hooks"]["Stop"] == [{"hooks": [{
        "type": "command", "command": f"{CTXCTL} hook --socket /run/ctxd/ctxd.sock",
        "timeout": 10}]}]
    assert read(project / ".mcp.json") == {"mcpServers": {"ctxd": {
        "type": "stdio", "command": str(CTXCTL),
        "args": ["mcp", "--socket", "/run/ctxd/ctxd.sock"]}}}
    assert not (home / ".claude").exists()
    # Another socket updates ctxd's entries in place rather than adding a second set.
    moved = ctxctl(home, project, "install", "claude-code", "--scope", "project")
    assert moved.stdout.splitlines()[0] == (
        f"updated hook SessionStart in {project / '.claude' / 'settings.json'}")
    assert read(project / ".claude" / "settings.json")["hooks"]["Stop"] == [{"hooks": [{
        "type": "command", "command": f"{CTXCTL} hook", "timeout": 10}]}]
    # Files ctxd created hold nothing else: uninstall removes them.
    assert ctxctl(home, project, "uninstall", "claude-code", "--scope", "project",
                  ).returncode == 0
    assert sorted(p.name for p in project.rglob("*")) == [".claude"]


@pytest.mark.parametrize("text", ["{\"hooks\": {", "[1, 2]"])
def test_a_malformed_settings_file_is_refused_and_left_alone(
        home: Path, project: Path, text: str) -> None:
    settings = project / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(text)
    for action in ("install", "uninstall"):
        done = ctxctl(home, project, action, "claude-code", "--scope", "project")
        assert done.returncode == 3
        assert done.stderr.startswith(f"ctxctl: {settings}: ")
        assert "fix or move the file" in done.stderr
        assert settings.read_text() == text
        assert not (project / ".mcp.json").exists()


def test_a_foreign_server_named_ctxd_is_refused(home: Path, project: Path) -> None:
    mcp = {"mcpServers": {"ctxd": {"command": "npx", "args": ["other-ctxd"]}}}
    (project / ".mcp.json").write_text(json.dumps(mcp))
    done = ctxctl(home, project, "install", "claude-code", "--scope", "project")
    assert done.returncode == 3
    assert "an MCP server named 'ctxd' that is not ctxctl's" in done.stderr
    assert read(project / ".mcp.json") == mcp
    assert not (project / ".claude").exists()


def test_doctor_checks_the_claude_code_settings(home: Path, project: Path,
                                                shared_daemon: DaemonProcess) -> None:
    sock = str(shared_daemon.socket)

    def doctor() -> subprocess.CompletedProcess[str]:
        return ctxctl(home, project, "--socket", sock, "doctor")

    healthy = doctor()  # not installed anywhere: nothing to say about Claude Code
    with shared_daemon.client() as client:
        gateway = doctor_gateway_lines(client)
    assert (healthy.returncode, healthy.stderr, healthy.stdout.splitlines()[1:]) == (
        0, NO_PROVIDER_NOTE, gateway)
    ctxctl(home, project, "install", "claude-code", "--scope", "project", "--socket", sock)
    assert doctor().stdout.splitlines()[1:] == [*gateway, "claude-code (project): ok"]
    settings_path = project / ".claude" / "settings.json"
    settings = read(settings_path)
    del settings["hooks"]["PostToolUse"], settings["hooks"]["Stop"]
    settings_path.write_text(json.dumps(settings))
    (project / ".mcp.json").unlink()
    broken = doctor()
    assert broken.returncode == 1
    fix = "fix: ctxctl install claude-code --scope project"
    assert broken.stdout.splitlines()[1:] == [
        *gateway,
        f"claude-code (project): {settings_path}: no ctxd hook for PostToolUse, Stop; {fix}",
        f"claude-code (project): {project / '.mcp.json'}: no MCP server ctxd; {fix}"]
    assert broken.stderr == NO_PROVIDER_NOTE + (
        "ctxctl: an agent's ctxd settings are incomplete; run the fix shown\n")
    as_json = json.loads(ctxctl(home, project, "--socket", sock, "doctor", "--json").stdout)
    assert as_json["integrations"][0]["ok"] is False
    assert [p["problem"] for p in as_json["integrations"][0]["problems"]] == [
        "no ctxd hook for PostToolUse, Stop", "no MCP server ctxd"]
    # A ctxctl that moved away, and a socket that is gone.
    ctxctl(home, project, "install", "claude-code", "--scope", "project", "--socket", sock)
    text = settings_path.read_text().replace(str(CTXCTL), "/gone/bin/ctxctl")
    settings_path.write_text(text.replace(sock, "/gone/ctxd.sock"))
    moved = doctor().stdout.splitlines()[1 + len(gateway):]
    assert moved == [
        f"claude-code (project): {settings_path}: /gone/bin/ctxctl does not exist or is not "
        f"executable; {fix}",
        f"claude-code (project): {settings_path}: the socket /gone/ctxd.sock the hooks use "
        f"does not exist (is ctxd running there?); fix: start ctxd, or ctxctl install "
        "claude-code --scope project --socket PATH"]
    # With no daemon the settings are still checked; the exit says the daemon is missing.
    down = ctxctl(home, project, "--socket", str(project / "none.sock"), "doctor")
    assert down.returncode == 2
    assert down.stdout.splitlines() == moved


# ---- OpenCode's settings are JSONC ------------------------------------------------------

OPENCODE_JSONC = """{
  // my settings: the theme is for the dark terminal
  "$schema": "https://opencode.ai/config.json",
  "theme": "dark", /* keep */
  "mcp": {
    "github": {"type": "local", "command": ["gh-mcp"]}, // theirs
  },
}
"""


def test_opencode_settings_with_comments_are_edited_in_place(home: Path,
                                                             project: Path) -> None:
    """OpenCode reads opencode.json as JSONC: one with comments and trailing commas is
    merged into, its comments and layout kept, and uninstall gives back its text."""
    config = project / "opencode.json"
    config.write_text(OPENCODE_JSONC)
    installed = ctxctl(home, project, "install", "opencode", "--scope", "project")
    assert (installed.returncode, installed.stderr) == (0, "")
    assert installed.stdout.splitlines() == [
        f"added the plugin in {project}/.opencode/plugin/ctxd.js",
        f"added MCP server ctxd in {config}"]
    text = config.read_text()
    assert text.startswith(OPENCODE_JSONC[:OPENCODE_JSONC.index('    "github"')])
    assert '    "github": {"type": "local", "command": ["gh-mcp"]}, // theirs\n' \
           '    "ctxd": {\n' in text
    assert text.endswith("    },\n  },\n}\n")
    from ctxclient._jsonc import loads

    assert loads(text)["mcp"]["ctxd"] == {"type": "local", "command": [str(CTXCTL), "mcp"],
                                          "enabled": True}
    again = ctxctl(home, project, "install", "opencode", "--scope", "project")
    assert again.stdout == "opencode (project): already installed, nothing changed\n"
    removed = ctxctl(home, project, "uninstall", "opencode", "--scope", "project")
    assert removed.returncode == 0, removed.stderr
    assert config.read_text() == OPENCODE_JSONC


def test_opencode_jsonc_alone_is_the_file_edited(home: Path, project: Path) -> None:
    """With only opencode.jsonc, install edits it and writes no opencode.json beside it;
    OpenCode itself then reads ctxd's MCP server from it (`opencode debug config`)."""
    jsonc = project / "opencode.jsonc"
    jsonc.write_text(OPENCODE_JSONC)
    installed = ctxctl(home, project, "install", "opencode", "--scope", "project")
    assert installed.returncode == 0, installed.stderr
    assert installed.stdout.splitlines()[-1] == f"added MCP server ctxd in {jsonc}"
    assert not (project / "opencode.json").exists()
    assert "// my settings: the theme is for the dark terminal\n" in jsonc.read_text()
    broken = project.parent / "broken"
    broken.mkdir()
    (broken / "opencode.jsonc").write_text('{"mcp": {/* no end\n')
    refused = ctxctl(home, broken, "install", "opencode", "--scope", "project")
    assert (refused.returncode, refused.stdout) == (3, "")
    assert refused.stderr == (
        f"ctxctl: {broken}/opencode.jsonc: not valid JSON (comments and trailing commas "
        "allowed) (a /* comment that never ends (line 1)); fix or move the file, then run "
        "the command again\n")
    from opencode_runs import OPENCODE, hermetic_env, plugin_sdk_installed

    if OPENCODE is None:
        pytest.skip("opencode not installed (npm install opencode-ai; .ci/run does)")
    plugin_sdk_installed(project / ".opencode")
    env = hermetic_env(project.parent, project.parent / "none.sock")
    shown = subprocess.run([OPENCODE, "debug", "config"], cwd=project, env=env,
                           capture_output=True, text=True, timeout=120, check=False)
    assert shown.returncode == 0, shown.stderr
    resolved = json.loads(shown.stdout)
    assert resolved["mcp"]["github"] == {"type": "local", "command": ["gh-mcp"]}
    assert resolved["mcp"]["ctxd"] == {"type": "local", "command": [str(CTXCTL), "mcp"],
                                       "enabled": True}

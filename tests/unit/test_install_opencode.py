"""ctxctl install opencode / uninstall opencode: idempotent, keeps the user's keys, removes
exactly what it added, refuses a malformed opencode.json."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ctxclient._install import OpenCode, SettingsError, plugin_source

CTXCTL = "/opt/ctxd/bin/ctxctl"
TARGET = OpenCode()


def server_entry(ctxctl: str) -> dict[str, object]:
    return {"type": "local", "command": [ctxctl, "mcp"], "enabled": True}


def lines(changes: list) -> list[str]:  # type: ignore[type-arg]
    return [change.line() for change in changes]


def tree(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes()
            for path in sorted(root.rglob("*")) if path.is_file()}


def test_project_install_is_idempotent_and_uninstall_restores(tmp_path: Path) -> None:
    assert lines(TARGET.install("project", tmp_path, CTXCTL, None)) == [
        f"added the plugin in {tmp_path}/.opencode/plugin/ctxd.js",
        f"added MCP server ctxd in {tmp_path}/opencode.json"]
    assert (tmp_path / ".opencode/plugin/ctxd.js").read_bytes() == plugin_source().read_bytes()
    assert json.loads((tmp_path / "opencode.json").read_text()) == {
        "mcp": {"ctxd": server_entry(CTXCTL)}}
    assert [p.problem for p in TARGET.check("project", tmp_path)] == [
        f"{CTXCTL} does not exist or is not executable"]
    before = tree(tmp_path)
    assert TARGET.install("project", tmp_path, CTXCTL, None) == []
    assert tree(tmp_path) == before
    assert lines(TARGET.uninstall("project", tmp_path, CTXCTL)) == [
        f"removed the plugin in {tmp_path}/.opencode/plugin/ctxd.js",
        f"removed MCP server ctxd in {tmp_path}/opencode.json"]
    assert list(tmp_path.iterdir()) == []
    assert TARGET.uninstall("project", tmp_path, CTXCTL) == []


def test_install_keeps_the_users_keys_and_uninstall_removes_only_ctxd(tmp_path: Path) -> None:
    mine = {"$schema": "https://opencode.ai/config.json", "model": "anthropic/claude",
            "mcp": {"github": {"type": "remote", "url": "https://example.com/mcp"}}}
    (tmp_path / "opencode.json").write_text(json.dumps(mine))
    (tmp_path / ".opencode/plugin").mkdir(parents=True)
    (tmp_path / ".opencode/plugin/other.js").write_text("export const P = async () => ({})\n")
    TARGET.install("project", tmp_path, CTXCTL, "/run/ctxd.sock")
    config = json.loads((tmp_path / "opencode.json").read_text())
    assert config == {**mine, "mcp": {**mine["mcp"], "ctxd": {
        "type": "local", "command": [CTXCTL, "mcp", "--socket", "/run/ctxd.sock"],
        "enabled": True}}}
    assert list(config) == ["$schema", "model", "mcp"]
    TARGET.uninstall("project", tmp_path, CTXCTL)
    assert json.loads((tmp_path / "opencode.json").read_text()) == mine
    assert sorted(p.name for p in (tmp_path / ".opencode/plugin").iterdir()) == ["other.js"]


def test_install_updates_its_own_entry_after_ctxctl_moved(tmp_path: Path) -> None:
    TARGET.install("project", tmp_path, "/old/venv/bin/ctxctl", None)
    assert lines(TARGET.install("project", tmp_path, CTXCTL, None)) == [
        f"updated MCP server ctxd in {tmp_path}/opencode.json"]
    assert json.loads((tmp_path / "opencode.json").read_text())["mcp"]["ctxd"] == \
        server_entry(CTXCTL)


def test_uninstall_leaves_a_ctxd_entry_and_plugin_it_did_not_write(tmp_path: Path) -> None:
    theirs = {"mcp": {"ctxd": {"type": "remote", "url": "https://example.com"}}}
    (tmp_path / "opencode.json").write_text(json.dumps(theirs))
    (tmp_path / ".opencode/plugin").mkdir(parents=True)
    (tmp_path / ".opencode/plugin/ctxd.js").write_text("// someone else's\n")
    assert TARGET.uninstall("project", tmp_path, CTXCTL) == []
    with pytest.raises(SettingsError, match="an MCP server named 'ctxd' that is not "
                                            "ctxctl's is already there"):
        TARGET.install("project", tmp_path, CTXCTL, None)
    assert json.loads((tmp_path / "opencode.json").read_text()) == theirs


@pytest.mark.parametrize(("text", "reason"), [
    ('{"model": "x"', r"not valid JSON \(comments and trailing commas allowed\)"),
    ("[1, 2]", "holds a JSON list, not an object"),
    ('{"mcp": []}', "mcp is not a JSON object"),
])
def test_a_malformed_opencode_json_is_refused(tmp_path: Path, text: str, reason: str) -> None:
    (tmp_path / "opencode.json").write_text(text)
    with pytest.raises(SettingsError, match=reason):
        TARGET.install("project", tmp_path, CTXCTL, None)
    assert (tmp_path / "opencode.json").read_text() == text
    assert not (tmp_path / ".opencode").exists()


def test_user_scope_goes_to_xdg_config_home(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    TARGET.install("user", tmp_path / "elsewhere", CTXCTL, None)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) \
        == ["config/opencode/opencode.json", "config/opencode/plugin/ctxd.js"]
    TARGET.uninstall("user", tmp_path / "elsewhere", CTXCTL)
    assert [p.name for p in tmp_path.rglob("*")] == ["config", "opencode"]
    monkeypatch.delenv("XDG_CONFIG_HOME")
    TARGET.install("user", tmp_path, CTXCTL, None)
    assert (tmp_path / "home/.config/opencode/plugin/ctxd.js").is_file()


def test_the_gateway_makes_the_file_private_until_uninstall_gives_its_mode_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    config = tmp_path / "config/opencode/opencode.json"
    config.parent.mkdir(parents=True)
    config.write_text('{"model": "anthropic/claude"}\n')
    config.chmod(0o644)
    gateway = "http://127.0.0.1:8788/q0Wp9dVd3kD2m8e7b_RfZ1c-AaBbCcDdEeFfGgHhIiJ"
    TARGET.install("user", tmp_path, CTXCTL, None, gateway)
    assert json.loads(config.read_text())["provider"]["anthropic"]["options"]["baseURL"] \
        == f"{gateway}/v1"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600  # the URL holds the user's token
    TARGET.install("user", tmp_path, CTXCTL, None, gateway)  # again: the mode kept is 0644
    TARGET.uninstall("user", tmp_path, CTXCTL)
    assert (config.read_text(), stat.S_IMODE(config.stat().st_mode)) == (
        '{"model": "anthropic/claude"}\n', 0o644)


def test_ctxctl_install_and_uninstall_commands(tmp_path: Path) -> None:
    def ctxctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ctxclient.cli", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60, check=False)

    done = ctxctl("install", "opencode", "--scope", "project")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines()[0] == \
        f"added the plugin in {tmp_path}/.opencode/plugin/ctxd.js"
    command = json.loads((tmp_path / "opencode.json").read_text())["mcp"]["ctxd"]["command"]
    assert Path(command[0]).is_absolute()
    assert command[1] == "mcp"
    again = ctxctl("install", "opencode", "--scope", "project")
    assert (again.returncode, again.stdout) == (
        0, "opencode (project): already installed, nothing changed\n")
    removed = ctxctl("uninstall", "opencode", "--scope", "project")
    assert (removed.returncode, len(removed.stdout.splitlines())) == (0, 2)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "opencode.json").write_text("{nope")
    refused = ctxctl("install", "opencode", "--scope", "project")
    assert refused.returncode == 3
    assert refused.stderr.startswith(f"ctxctl: {tmp_path}/opencode.json: not valid JSON (")

"""ctxctl install opencode / uninstall opencode: idempotent, keeps the user's keys, removes
exactly what it added, refuses a malformed opencode.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ctxclient._install_opencode import (
    InstallError,
    install,
    plugin_source,
    server_entry,
    uninstall,
)

CTXCTL = "/opt/ctxd/bin/ctxctl"


def tree(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes()
            for path in sorted(root.rglob("*")) if path.is_file()}


def test_project_install_is_idempotent_and_uninstall_restores(tmp_path: Path) -> None:
    assert install("project", tmp_path, CTXCTL) == [
        f"added the plugin {tmp_path}/.opencode/plugin/ctxd.js",
        f"added the MCP server 'ctxd' in {tmp_path}/opencode.json"]
    assert (tmp_path / ".opencode/plugin/ctxd.js").read_bytes() == plugin_source().read_bytes()
    assert json.loads((tmp_path / "opencode.json").read_text()) == {
        "mcp": {"ctxd": {"type": "local", "command": [CTXCTL, "mcp"], "enabled": True}}}
    before = tree(tmp_path)
    assert install("project", tmp_path, CTXCTL) == []
    assert tree(tmp_path) == before
    assert uninstall("project", tmp_path) == [
        f"removed the plugin {tmp_path}/.opencode/plugin/ctxd.js",
        f"removed the MCP server 'ctxd' from {tmp_path}/opencode.json"]
    assert list(tmp_path.iterdir()) == []
    assert uninstall("project", tmp_path) == []


def test_install_keeps_the_users_keys_and_uninstall_removes_only_ctxd(tmp_path: Path) -> None:
    mine = {"$schema": "https://opencode.ai/config.json", "model": "anthropic/claude",
            "mcp": {"github": {"type": "remote", "url": "https://example.com/mcp"}}}
    (tmp_path / "opencode.json").write_text(json.dumps(mine))
    (tmp_path / ".opencode/plugin").mkdir(parents=True)
    (tmp_path / ".opencode/plugin/other.js").write_text("export const P = async () => ({})\n")
    install("project", tmp_path, CTXCTL)
    config = json.loads((tmp_path / "opencode.json").read_text())
    assert config == {**mine, "mcp": {**mine["mcp"], "ctxd": server_entry(CTXCTL)}}
    assert list(config) == ["$schema", "model", "mcp"]
    uninstall("project", tmp_path)
    assert json.loads((tmp_path / "opencode.json").read_text()) == mine
    assert sorted(p.name for p in (tmp_path / ".opencode/plugin").iterdir()) == ["other.js"]


def test_install_updates_its_own_entry_after_ctxctl_moved(tmp_path: Path) -> None:
    install("project", tmp_path, "/old/venv/bin/ctxctl")
    assert install("project", tmp_path, CTXCTL) == [
        f"updated the MCP server 'ctxd' in {tmp_path}/opencode.json"]
    assert json.loads((tmp_path / "opencode.json").read_text())["mcp"]["ctxd"] == \
        server_entry(CTXCTL)


def test_uninstall_leaves_a_ctxd_entry_and_plugin_it_did_not_write(tmp_path: Path) -> None:
    theirs = {"mcp": {"ctxd": {"type": "remote", "url": "https://example.com"}}}
    (tmp_path / "opencode.json").write_text(json.dumps(theirs))
    (tmp_path / ".opencode/plugin").mkdir(parents=True)
    (tmp_path / ".opencode/plugin/ctxd.js").write_text("// someone else's\n")
    assert uninstall("project", tmp_path) == []
    with pytest.raises(InstallError, match="already has an MCP server named 'ctxd' that "
                                           "ctxctl did not write"):
        install("project", tmp_path, CTXCTL)
    assert json.loads((tmp_path / "opencode.json").read_text()) == theirs


@pytest.mark.parametrize(("text", "reason"), [
    ('{"model": "x",}', "is not valid JSON"),
    ("[1, 2]", "holds a JSON list, not an object"),
    ('{"mcp": []}', "`mcp` is not an object"),
])
def test_a_malformed_opencode_json_is_refused(tmp_path: Path, text: str, reason: str) -> None:
    (tmp_path / "opencode.json").write_text(text)
    for action in (lambda: install("project", tmp_path, CTXCTL),
                   lambda: uninstall("project", tmp_path)):
        with pytest.raises(InstallError, match=reason):
            action()
    assert (tmp_path / "opencode.json").read_text() == text
    assert not (tmp_path / ".opencode").exists()


def test_user_scope_goes_to_xdg_config_home(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "HOME": str(tmp_path / "home")}
    install("user", ctxctl=CTXCTL, environ=env)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) \
        == ["config/opencode/opencode.json", "config/opencode/plugin/ctxd.js"]
    uninstall("user", environ=env)
    assert [p.name for p in tmp_path.rglob("*")] == ["config", "opencode"]
    install("user", ctxctl=CTXCTL, environ={"HOME": str(tmp_path / "home")})
    assert (tmp_path / "home/.config/opencode/plugin/ctxd.js").is_file()


def test_ctxctl_install_and_uninstall_commands(tmp_path: Path) -> None:
    def ctxctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ctxclient.cli", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60, check=False)

    done = ctxctl("install", "opencode", "--scope", "project")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines()[0] == f"added the plugin {tmp_path}/.opencode/plugin/ctxd.js"
    command = json.loads((tmp_path / "opencode.json").read_text())["mcp"]["ctxd"]["command"]
    assert Path(command[0]).is_absolute()
    assert command[1] == "mcp"
    again = ctxctl("install", "opencode", "--scope", "project")
    assert (again.returncode, again.stdout) == (
        0, "nothing to do: ctxd is already installed for OpenCode (project scope)\n")
    removed = ctxctl("uninstall", "opencode", "--scope", "project")
    assert (removed.returncode, len(removed.stdout.splitlines())) == (0, 2)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "opencode.json").write_text("{nope")
    refused = ctxctl("install", "opencode", "--scope", "project")
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"ctxctl: {tmp_path}/opencode.json is not valid JSON (")

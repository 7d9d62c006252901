"""ctxctl and the model gateway against a real daemon: ``run``, ``install`` at user scope,
``status`` and ``doctor``, with the gateway disabled (what to type next) and enabled (the
agent's environment and settings point at the base URL daemon.status gives)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import DaemonProcess
from tests_support import placed_by_others

from ctxd.config import Config

GATEWAY = "gateway" in {field.name for field in msgspec.structs.fields(Config)}
"""Whether this ctxd has the model gateway (ctxd/gateway/)."""
needs_gateway = pytest.mark.skipif(not GATEWAY, reason="this ctxd has no model gateway")
CTXCTL = Path(sys.executable).with_name("ctxctl")
EVENTS = ["SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse",
          "PostToolUseFailure", "PreCompact", "Stop", "SubagentStart", "SubagentStop",
          "SessionEnd"]
ENABLE_FIX = ("set `enabled = true` under [gateway] in ctxd's config (ctxd.toml(5)), then "
              "restart ctxd: `ctxctl stop`, then `ctxd`")
AGENT = ("import os, sys; print(os.environ['ANTHROPIC_BASE_URL'], "
         "os.environ['OPENAI_BASE_URL'], os.environ['CTXD_SOCKET']); sys.exit(7)")


def ctxctl(home: Path, socket: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CTXD_", "CLAUDE_CONFIG_DIR", "XDG_", "ANTHROPIC_", "OPENAI_"))}
    return subprocess.run([str(CTXCTL), "--socket", str(socket), *args], cwd=home / "work",
                          env={**env, "HOME": str(home), "NO_COLOR": "1"},
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home" / "work").mkdir(parents=True)  # a project without ctxd: not home
    return tmp_path / "home"


@pytest.fixture
def gateway_off(daemon_root: Path) -> Iterator[DaemonProcess]:
    """A daemon whose daemon.status says ``gateway: null``."""
    args: list[str] = []
    if GATEWAY:
        config = daemon_root / "gateway-off.toml"
        config.write_text("[gateway]\nenabled = false\n")
        args = ["--config", str(config)]
    process = DaemonProcess(daemon_root, extra_args=args).start()
    yield process
    process.stop()


def test_with_the_gateway_disabled_each_command_says_what_to_type(
        home: Path, gateway_off: DaemonProcess) -> None:
    socket = gateway_off.socket
    with gateway_off.client() as client:
        assert client.call("daemon.status").get("gateway") is None
    ran = ctxctl(home, socket, "run", "--", sys.executable, "-c", "print('ran')")
    assert (ran.returncode, ran.stdout, ran.stderr) == (
        125, "", f"ctxctl run: the daemon's model gateway is disabled; {ENABLE_FIX}\n")
    status = ctxctl(home, socket, "status")
    assert status.returncode == 0
    assert status.stdout.splitlines()[1].startswith("memories 0 (hashing-v1-1024): ")
    assert status.stdout.splitlines()[2] == "gateway: disabled"
    as_json = json.loads(ctxctl(home, socket, "status", "--json").stdout)
    assert (as_json["daemon"].get("gateway"), "gateway" in as_json["daemon"]) == (None, GATEWAY)
    # install wires the rest, and says the model calls do not go through ctxd.
    installed = ctxctl(home, socket, "install", "claude-code")
    settings, claude_json = home / ".claude" / "settings.json", home / ".claude.json"
    assert installed.returncode == 1
    assert installed.stdout.splitlines() == [
        *(f"added hook {event} in {settings}" for event in EVENTS),
        f"added MCP server ctxd in {claude_json}"]
    assert installed.stderr == (
        "ctxctl: Claude Code's model calls do not go through ctxd's gateway: the daemon's "
        f"model gateway is disabled; {ENABLE_FIX}; then run `ctxctl install claude-code` "
        "again (or add --no-gateway to install without it)\n")
    assert "env" not in json.loads(settings.read_text())
    again = ctxctl(home, socket, "install", "claude-code", "--json")
    assert json.loads(again.stdout) == {
        "target": "claude-code", "scope": "user", "changed": False, "changes": [],
        "gateway": {"base_url": None, "note": None,
                    "error": f"the daemon's model gateway is disabled; {ENABLE_FIX}"}}
    quiet = ctxctl(home, socket, "install", "claude-code", "--no-gateway")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (
        0, "claude-code (user): already installed, nothing changed\n", "")


def test_a_socket_others_could_have_placed_is_refused_before_the_command_runs(
        home: Path, tmp_path: Path) -> None:
    with placed_by_others(tmp_path, "open") as (socket, reason):
        ran = ctxctl(home, socket, "run", "--", sys.executable, "-c", "print('ran')")
        assert (ran.returncode, ran.stdout, ran.stderr) == (125, "", f"ctxctl run: {reason}\n")


def test_run_without_a_command_is_a_usage_error(home: Path, tmp_path: Path) -> None:
    ran = ctxctl(home, tmp_path / "none.sock", "run", "--")
    assert (ran.returncode, ran.stdout) == (2, "")
    assert ran.stderr.splitlines()[-1] == (
        "ctxctl run: error: missing CMD: ctxctl run -- CMD [ARGS ...]")


# ---- with the gateway (ctxd/gateway/) ---------------------------------------------------

def gateway_of(daemon: DaemonProcess) -> dict[str, Any]:
    with daemon.client() as client:
        gateway: dict[str, Any] = client.call("daemon.status")["gateway"]
    return gateway


@needs_gateway
def test_run_points_the_agent_at_the_gateway_and_exits_as_it_does(
        home: Path, daemon: DaemonProcess) -> None:
    base_url = gateway_of(daemon)["base_url"]
    ran = ctxctl(home, daemon.socket, "run", "--", sys.executable, "-c", AGENT)
    assert (ran.returncode, ran.stdout, ran.stderr) == (
        7, f"{base_url} {base_url}/v1 {daemon.socket}\n", "")


@needs_gateway
def test_install_at_user_scope_wires_the_gateway_and_uninstall_restores_the_value(
        home: Path, daemon: DaemonProcess) -> None:
    base_url = gateway_of(daemon)["base_url"]
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir()
    original = {"env": {"ANTHROPIC_BASE_URL": "http://proxy.example:8080"}, "model": "opus"}
    settings.write_text(json.dumps(original))
    settings.chmod(0o644)
    done = ctxctl(home, daemon.socket, "install", "claude-code")
    assert (done.returncode, done.stderr) == (0, "")
    # The URL holds the user's secret: the file is the user's alone from now on.
    assert stat.S_IMODE(settings.stat().st_mode) == 0o600
    assert done.stdout.splitlines()[-2:] == [
        f"updated env.ANTHROPIC_BASE_URL in {settings}",
        f"Claude Code's model calls now go through ctxd's gateway (http://"
        f"{gateway_of(daemon)['listen']}/<token>). Without systemd's socket unit only ctxd's "
        "MCP server starts it, when Claude Code starts: stopped while Claude Code runs, ctxd "
        "fails its model calls until it is started again. Keep `ctxd` running, or install "
        "the units (README, \"Running it as a service\")."]
    assert json.loads(settings.read_text())["env"] == {"ANTHROPIC_BASE_URL": base_url}
    doctor = ctxctl(home, daemon.socket, "doctor")
    assert (doctor.returncode, doctor.stdout.splitlines()[1]) == (
        0, f"gateway {gateway_of(daemon)['listen']}: ok (/_ctxd/health answered)")
    # A URL at the gateway's address with another token (mistyped, an old one) is found.
    wrong = f"http://{gateway_of(daemon)['listen']}/WRONGTOKEN"
    settings.write_text(json.dumps({**original, "env": {"ANTHROPIC_BASE_URL": wrong}}))
    doctor = ctxctl(home, daemon.socket, "doctor")
    assert doctor.returncode == 1
    assert (f"claude-code (user): {settings}: env.ANTHROPIC_BASE_URL is not the running "
            "gateway's URL") in doctor.stdout
    settings.write_text(json.dumps({**original, "env": {"ANTHROPIC_BASE_URL": base_url}}))
    gone = ctxctl(home, daemon.socket, "uninstall", "claude-code")
    assert gone.stdout.splitlines()[-1] == f"restored env.ANTHROPIC_BASE_URL in {settings}"
    assert json.loads(settings.read_text()) == original
    # Its mode as it was, too: nothing of the secret is left in it.
    assert stat.S_IMODE(settings.stat().st_mode) == 0o644

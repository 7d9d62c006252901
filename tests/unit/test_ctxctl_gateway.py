"""ctxctl's side of the model gateway, without a gateway: the URLs and environment that
point an agent at it, the settings entries install writes and uninstall puts back, the
health check against a local HTTP server, ``ctxctl run``'s exec, and the status table."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, ClassVar

import pytest
from local_http import LocalServer, ScriptedHandler
from rich.console import Console

from ctxclient._cli_daemon import gateway_line, gateway_listing
from ctxclient._gateway import (
    GatewayUnavailable,
    agent_environment,
    base_url_of,
    daemon_status,
    health_problem,
    is_gateway_url,
    openai_url,
    overridden,
)
from ctxclient._install import (
    GATEWAY_KEYS,
    ClaudeCode,
    OpenCode,
    Saved,
    SettingsError,
    doctor,
    gateway_problems,
    restore_entry,
    set_entry,
)
from ctxclient._output import plain_lines, table
from ctxclient._spawn import start_command

TOKEN = "q0Wp9dVd3kD2m8e7b_RfZ1c-AaBbCcDdEeFfGgHhIiJ"
BASE = f"http://127.0.0.1:8788/{TOKEN}"
CTXCTL = "/opt/ctxd/bin/ctxctl"
ENABLE_FIX = ("set `enabled = true` under [gateway] in ctxd's config (ctxd.toml(5)), then "
              "restart ctxd: `ctxctl stop`, then `ctxd`")


# ---- URLs and environment ---------------------------------------------------------------

def test_openai_base_url_ends_in_v1_as_the_sdks_default_does() -> None:
    assert openai_url(BASE) == f"{BASE}/v1"
    assert openai_url(BASE + "/") == f"{BASE}/v1"


@pytest.mark.parametrize(("value", "ours"), [
    (BASE, True), (f"{BASE}/v1", True), (f"http://localhost:9/{TOKEN}", True),
    (f"http://[::1]:8788/{TOKEN}/", True),
    (f"https://127.0.0.1:8788/{TOKEN}", False),  # the gateway speaks plain HTTP
    (f"http://10.0.0.2:8788/{TOKEN}", False), (f"http://127.0.0.1/{TOKEN}", False),
    ("http://127.0.0.1:8788/short", False), (f"http://127.0.0.1:8788/{TOKEN}/v2", False),
    (f"http://127.0.0.1:8788/{TOKEN}?x=1", False), ("https://api.anthropic.com", False),
    ("http://127.0.0.1:99999/" + TOKEN, False), (None, False), (8788, False)])
def test_a_gateway_url_is_known_by_its_shape(value: object, ours: bool) -> None:
    assert is_gateway_url(value) is ours


def test_the_base_url_comes_from_daemon_status() -> None:
    status = {"version": "0.1.0", "gateway": {"listen": "127.0.0.1:8788", "base_url": BASE}}
    assert base_url_of(status) == BASE
    for off in ({"version": "0.1.0", "gateway": None}, {"version": "0.1.0"}):
        with pytest.raises(GatewayUnavailable) as caught:
            base_url_of(off)
        assert str(caught.value) == f"the daemon's model gateway is disabled; {ENABLE_FIX}"


def test_the_agent_environment_points_both_apis_at_the_gateway() -> None:
    environ = {"PATH": "/bin", "ANTHROPIC_API_KEY": "k", "CTXD_SOCKET": "/x.sock"}
    assert agent_environment(BASE, environ, None) == {
        **environ, "ANTHROPIC_BASE_URL": BASE, "OPENAI_BASE_URL": f"{BASE}/v1"}
    assert agent_environment(BASE, environ, "rel/ctxd.sock")["CTXD_SOCKET"] == \
        os.path.abspath("rel/ctxd.sock")
    assert environ == {"PATH": "/bin", "ANTHROPIC_API_KEY": "k", "CTXD_SOCKET": "/x.sock"}


def test_a_base_url_the_agent_had_is_named_when_replaced() -> None:
    environ = {"ANTHROPIC_BASE_URL": "http://proxy:8080", "OPENAI_BASE_URL": f"{BASE}/v1"}
    assert overridden(environ, agent_environment(BASE, environ, None)) == [
        "ANTHROPIC_BASE_URL was http://proxy:8080; through the gateway, calls go to its "
        "[gateway] anthropic_upstream instead"]
    assert overridden({}, agent_environment(BASE, {}, None)) == []


# ---- settings entries -------------------------------------------------------------------

KEYS = ("provider", "anthropic", "options", "baseURL")


def test_an_entry_set_where_none_was_goes_with_the_objects_it_made(tmp_path: Path) -> None:
    saved, file = Saved(tmp_path / "saved.json"), tmp_path / "opencode.json"
    data: dict[str, Any] = {"provider": {"mine": {"npm": "x"}}, "model": "m"}
    change = set_entry(data, file, KEYS, BASE, saved)
    assert change is not None
    assert change.line() == (
        f"added provider.anthropic.options.baseURL in {file}")
    assert data == {"provider": {"mine": {"npm": "x"}, "anthropic": {"options": {
        "baseURL": BASE}}}, "model": "m"}
    assert set_entry(data, file, KEYS, BASE, saved) is None  # idempotent
    saved.save()
    assert json.loads((tmp_path / "saved.json").read_text()) == {
        str(file): {"provider/anthropic/options/baseURL": {"value": BASE, "created": 2}}}
    assert (tmp_path / "saved.json").stat().st_mode & 0o777 == 0o600
    again = Saved(tmp_path / "saved.json")
    restored = restore_entry(data, file, KEYS, again)
    assert restored is not None
    assert restored.line() == (
        f"removed provider.anthropic.options.baseURL in {file}")
    assert data == {"provider": {"mine": {"npm": "x"}}, "model": "m"}
    again.save()
    assert not (tmp_path / "saved.json").exists()
    assert restore_entry(data, file, KEYS, again) is None


def test_a_value_the_user_had_is_put_back(tmp_path: Path) -> None:
    saved, file = Saved(tmp_path / "saved.json"), tmp_path / "settings.json"
    data: dict[str, Any] = {"env": {"ANTHROPIC_BASE_URL": "http://proxy:1", "A": "b"}}
    assert set_entry(data, file, GATEWAY_KEYS, BASE, saved) is not None
    # The gateway moved (another port): install updates its own value, keeps the user's.
    moved = BASE.replace("8788", "9999")
    change = set_entry(data, file, GATEWAY_KEYS, moved, saved)
    assert change is not None
    assert change.line() == f"updated env.ANTHROPIC_BASE_URL in {file}"
    assert saved.record(file, GATEWAY_KEYS) == {"value": moved, "created": 0,
                                                "previous": "http://proxy:1"}
    restored = restore_entry(data, file, GATEWAY_KEYS, saved)
    assert restored is not None
    assert restored.line() == (
        f"restored env.ANTHROPIC_BASE_URL in {file}")
    assert data == {"env": {"ANTHROPIC_BASE_URL": "http://proxy:1", "A": "b"}}


def test_a_value_changed_since_install_is_the_users(tmp_path: Path) -> None:
    saved, file = Saved(tmp_path / "saved.json"), tmp_path / "settings.json"
    data: dict[str, Any] = {}
    set_entry(data, file, GATEWAY_KEYS, BASE, saved)
    data["env"]["ANTHROPIC_BASE_URL"] = "http://elsewhere:2"
    assert restore_entry(data, file, GATEWAY_KEYS, saved) is None
    assert data == {"env": {"ANTHROPIC_BASE_URL": "http://elsewhere:2"}}
    assert saved.records == {}
    # Installed over the user's new value, it is that value uninstall puts back.
    set_entry(data, file, GATEWAY_KEYS, BASE, saved)
    restore_entry(data, file, GATEWAY_KEYS, saved)
    assert data == {"env": {"ANTHROPIC_BASE_URL": "http://elsewhere:2"}}


def test_without_a_record_only_a_gateway_url_is_taken_out(tmp_path: Path) -> None:
    saved, file = Saved(tmp_path / "saved.json"), tmp_path / "settings.json"
    data: dict[str, Any] = {"env": {"ANTHROPIC_BASE_URL": "http://proxy:1"}}
    assert restore_entry(data, file, GATEWAY_KEYS, saved) is None
    assert data == {"env": {"ANTHROPIC_BASE_URL": "http://proxy:1"}}
    data = {"env": {"ANTHROPIC_BASE_URL": BASE}, "model": "opus"}
    assert restore_entry(data, file, GATEWAY_KEYS, saved) is not None
    assert data == {"model": "opus"}


def test_an_entry_under_a_value_that_is_not_an_object_is_refused(tmp_path: Path) -> None:
    data: dict[str, Any] = {"env": ["not", "an", "object"]}
    with pytest.raises(SettingsError) as caught:
        set_entry(data, tmp_path / "settings.json", GATEWAY_KEYS, BASE,
                  Saved(tmp_path / "saved.json"))
    assert str(caught.value) == (f"{tmp_path / 'settings.json'}: env is not a JSON object; "
                                 "fix or move the file")
    assert data == {"env": ["not", "an", "object"]}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for variable in ("CLAUDE_CONFIG_DIR", "XDG_CONFIG_HOME", "XDG_STATE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def test_claude_code_user_install_sets_the_base_url_and_uninstall_restores_bytes(
        home: Path) -> None:
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir()
    original = {"env": {"ANTHROPIC_BASE_URL": "http://proxy:1", "DEBUG": "1"}, "model": "opus"}
    settings.write_text(json.dumps(original, indent=2) + "\n")
    before = settings.read_bytes()
    target = ClaudeCode()
    changes = target.install("user", home, CTXCTL, None, BASE)
    assert [c.line() for c in changes][-1] == f"updated env.ANTHROPIC_BASE_URL in {settings}"
    assert json.loads(settings.read_text())["env"] == {"ANTHROPIC_BASE_URL": BASE,
                                                       "DEBUG": "1"}
    assert target.install("user", home, CTXCTL, None, BASE) == []
    gone = target.uninstall("user", home, CTXCTL)
    assert [c.line() for c in gone][-1] == f"restored env.ANTHROPIC_BASE_URL in {settings}"
    assert settings.read_bytes() == before
    assert not (home / ".local/state/ctxd/install-saved.json").exists()


def test_claude_code_project_install_leaves_the_model_calls_alone(home: Path) -> None:
    """A project's settings may be shared: the gateway's URL holds the user's token."""
    project = home / "proj"
    project.mkdir()
    ClaudeCode().install("project", project, CTXCTL, None, None)
    assert "env" not in json.loads((project / ".claude/settings.json").read_text())
    assert not (home / ".claude").exists()


def test_opencode_user_install_points_anthropic_at_the_gateway(home: Path) -> None:
    config = home / ".config" / "opencode" / "opencode.json"
    config.parent.mkdir(parents=True)
    original = {"model": "anthropic/claude-sonnet-4-5",
                "provider": {"anthropic": {"models": {"x": {}}}}}
    config.write_text(json.dumps(original))
    target = OpenCode()
    changes = target.install("user", home, CTXCTL, None, BASE)
    assert [c.line() for c in changes] == [
        f"added the plugin in {config.parent}/plugin/ctxd.js",
        f"added MCP server ctxd in {config}",
        f"added provider.anthropic.options.baseURL in {config}"]
    written = json.loads(config.read_text())
    assert written["provider"] == {"anthropic": {"models": {"x": {}},
                                                 "options": {"baseURL": f"{BASE}/v1"}}}
    assert [c.line() for c in target.uninstall("user", home, CTXCTL)] == [
        f"removed the plugin in {config.parent}/plugin/ctxd.js",
        f"removed MCP server ctxd in {config}",
        f"removed provider.anthropic.options.baseURL in {config}"]
    assert json.loads(config.read_text()) == original


# ---- the health check -------------------------------------------------------------------

class Health(ScriptedHandler):
    answers: ClassVar[dict[str, tuple[int, bytes]]] = {
        f"/{TOKEN}/_ctxd/health": (200, b'{"ok": true, "version": "0.1.0", "session_id": null}'),
        "/sick/_ctxd/health": (503, b'{"ok": false}'),
        "/text/_ctxd/health": (200, b"hello"),
    }

    def do_GET(self) -> None:
        status, body = self.answers.get(self.path, (404, b'{"error": "no route"}'))
        self.answer(status, body)


def test_the_health_check_expects_200_and_ok_true() -> None:
    with LocalServer(Health) as server:
        assert health_problem(f"{server.origin}/{TOKEN}") is None
        assert health_problem(f"{server.origin}/{TOKEN}/") is None
        assert health_problem(f"{server.origin}/sick") == (
            f"{server.origin}/<token>/_ctxd/health answered 503: {{\"ok\": false}}")
        assert health_problem(f"{server.origin}/text") == (
            f"{server.origin}/<token>/_ctxd/health answered 200: hello")
        assert health_problem(f"{server.origin}/wrong-token") == (
            f"{server.origin}/<token>/_ctxd/health answered 404: {{\"error\": \"no route\"}}")
    with socket.socket() as bound:  # bound, then closed: nothing listens there
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
    assert health_problem(f"http://127.0.0.1:{port}/{TOKEN}") == (
        f"no answer from http://127.0.0.1:{port}/<token>/_ctxd/health ([Errno 111] "
        "Connection refused)")


# ---- ctxctl run's exec ------------------------------------------------------------------

def exec_agent(argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """A process that runs `exec_agent`, as ``ctxctl run`` ends."""
    code = ("import json, sys; from ctxclient._gateway import exec_agent; "
            "sys.exit(exec_agent(json.loads(sys.argv[1]), json.loads(sys.argv[2])))")
    return subprocess.Popen([sys.executable, "-c", code, json.dumps(argv), json.dumps(env)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


AGENT = textwrap.dedent("""\
    import os, signal, sys
    if sys.argv[1] == "wait":  # the handler before the line that says it is ready
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(42))
    print(os.getpid(), os.environ["ANTHROPIC_BASE_URL"], os.environ["OPENAI_BASE_URL"],
          flush=True)
    if sys.argv[1] == "wait":
        signal.pause()
    sys.exit(int(sys.argv[1]))
""")


def test_the_command_becomes_the_process_with_its_environment_and_status() -> None:
    env = agent_environment(BASE, dict(os.environ), None)
    proc = exec_agent([sys.executable, "-c", AGENT, "7"], env)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (7, f"{proc.pid} {BASE} {BASE}/v1\n", "")


def test_a_signal_reaches_the_command() -> None:
    with exec_agent([sys.executable, "-c", AGENT, "wait"],
                    agent_environment(BASE, dict(os.environ), None)) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == f"{proc.pid} {BASE} {BASE}/v1\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 42


def test_a_command_not_found_or_not_executable(tmp_path: Path) -> None:
    missing = exec_agent(["no-such-agent-here"], {"PATH": str(tmp_path)})
    assert missing.communicate(timeout=60) == (
        "", "ctxctl run: no-such-agent-here: command not found\n")
    assert missing.returncode == 127
    (tmp_path / "agent").write_text("#!/bin/sh\n")
    refused = exec_agent([str(tmp_path / "agent")], {"PATH": str(tmp_path)})
    assert refused.communicate(timeout=60) == (
        "", f"ctxctl run: {tmp_path / 'agent'}: Permission denied\n")
    assert refused.returncode == 126


# ---- status -------------------------------------------------------------------------------

CALL = {"session_id": "6f1c2a3b-9d8e-4f70-a1b2-c3d4e5f60718", "model": "claude-sonnet-4-5",
        "last_call_at": 1_790_000_000.0, "sent_tokens": 81_552, "removed_tokens": 40_210,
        "input_tokens": 1_204, "output_tokens": 512, "cache_read_tokens": 80_100,
        "cache_write_tokens": 250, "cost": 11_076.5}
GATEWAY = {"listen": "127.0.0.1:8788", "base_url": BASE, "calls": 1_234,
           "rewrite_failures": 2, "sessions": [CALL, {**CALL, "session_id": "s2",
                                                      "model": None, "cost": 0.4}]}


def test_the_gateway_line_and_its_calls_as_plain_rows() -> None:
    assert gateway_line({"gateway": None}) == "gateway: disabled"
    assert gateway_line({"gateway": None, "gateway_off": "it cannot listen"}) == (
        "gateway: off: it cannot listen")
    assert gateway_line({"gateway": GATEWAY}) == (
        "gateway 127.0.0.1:8788  calls 1,234  rewrite failures 2")
    assert gateway_listing(None).rows == []
    assert plain_lines(gateway_listing(GATEWAY), headers=True) == [
        "SESSION                               MODEL                SENT  REMOVED  INPUT  "
        "CACHE_READ  CACHE_WRITE    COST",
        "6f1c2a3b-9d8e-4f70-a1b2-c3d4e5f60718  claude-sonnet-4-5  81,552   40,210  1,204  "
        "    80,100          250  11,076",
        "s2                                    -                  81,552   40,210  1,204  "
        "    80,100          250       0"]


def test_the_gateway_table_fits_80_columns_and_shortens_a_long_session_id() -> None:
    """Claude Code's 36-character session id is shown as ctxd's own are at most (20
    characters), which leaves room for the cache reads."""
    console = Console(width=80, record=True, color_system=None)
    console.print(table(gateway_listing(GATEWAY), 80))
    shown = console.export_text().splitlines()
    assert max(len(line) for line in shown) <= 80
    rows = [line.split("│")[1].strip() for line in shown if line.startswith("│")]
    assert rows == [CALL["session_id"][:19] + "…", "s2"]
    header = next(line for line in shown if line.startswith("┃ session"))
    assert header.replace("┃", " ").split() == [
        "session", "sent", "removed", "input", "cache", "read", "cost"]
    wide = Console(width=160, record=True, color_system=None)
    wide.print(table(gateway_listing(GATEWAY), 160))
    header = next(line for line in wide.export_text().splitlines()
                  if line.startswith("┃ session"))
    assert header.replace("┃", " ").split() == [
        "session", "model", "sent", "removed", "input", "cache", "read", "cache", "write",
        "cost"]


# ---- doctor: the settings point at the running gateway ------------------------------------

def test_doctor_finds_settings_pointing_at_another_or_a_disabled_gateway(home: Path) -> None:
    settings = home / ".claude" / "settings.json"
    ClaudeCode().install("user", home, CTXCTL, None, BASE)
    OpenCode().install("user", home, CTXCTL, None, BASE)
    config = home / ".config" / "opencode" / "opencode.json"
    assert gateway_problems("claude-code", BASE) == []
    assert gateway_problems("opencode", BASE + "/") == []
    moved = BASE.replace("8788", "9999")
    assert [p.to_json() for p in gateway_problems("claude-code", moved)] == [{
        "file": str(settings), "fix": "ctxctl install claude-code",
        "problem": "env.ANTHROPIC_BASE_URL is not the running gateway's URL "
                   "(http://127.0.0.1:9999/<token>: another port or token)"}]
    assert [p.to_json() for p in gateway_problems("opencode", None)] == [{
        "file": str(config),
        "fix": "enable it ([gateway] enabled = true), or ctxctl uninstall opencode",
        "problem": "provider.anthropic.options.baseURL points at ctxd's gateway, which is "
                   "disabled"}]
    (home / "elsewhere").mkdir()
    rows, ok = doctor(home / "elsewhere", moved)
    assert ok is False
    assert [(row["target"], row["scope"], [p["problem"] for p in row["problems"]])
            for row in rows] == [
        ("claude-code", "user", [f"{CTXCTL} does not exist or is not executable",
                                 "env.ANTHROPIC_BASE_URL is not the running gateway's URL "
                                 "(http://127.0.0.1:9999/<token>: another port or token)"]),
        ("opencode", "user", [f"{CTXCTL} does not exist or is not executable",
                              "provider.anthropic.options.baseURL is not the running "
                              "gateway's URL (http://127.0.0.1:9999/<token>/v1: another port "
                              "or token)"])]
    # A value that is not a gateway's is the user's business.
    ClaudeCode().uninstall("user", home, CTXCTL)
    settings.write_text(json.dumps({"env": {"ANTHROPIC_BASE_URL": "http://proxy:1"}}))
    assert gateway_problems("claude-code", BASE) == []


def test_without_a_daemon_the_gateway_names_both_ways_to_start_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ctxd's default socket: `ctxd`, or the user unit that listens there.
    monkeypatch.setenv("CTXD_SOCKET", str(tmp_path / "none.sock"))
    with pytest.raises(GatewayUnavailable) as caught:
        daemon_status(str(tmp_path / "none.sock"), start=False, who="ctxctl test")
    assert str(caught.value) == (
        f"no ctxd daemon is running on {tmp_path / 'none.sock'} (No such file or directory); "
        f"start it with `{start_command()}` (or `systemctl --user start ctxd.socket`)")
    # Another socket: only ctxd started on it.
    with pytest.raises(GatewayUnavailable) as caught:
        daemon_status(str(tmp_path / "other.sock"), start=False, who="ctxctl test")
    assert str(caught.value) == (
        f"no ctxd daemon is running on {tmp_path / 'other.sock'} (No such file or directory); "
        f"start it with `{start_command()} --socket {tmp_path / 'other.sock'}`")

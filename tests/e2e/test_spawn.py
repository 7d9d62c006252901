"""One way to start a daemon (``ctxclient.spawn_daemon``, docs/decisions.md): a folder named
``ctxd`` where the user stands is never imported in place of the installed package, by
each path that starts one: the tests' and benchmarks' `DaemonProcess`, ``ctxctl replay``'s
private daemons, and the start of a missing daemon by ``ctxctl mcp`` and ``ctxctl run``,
which also works with a client's own variable (``CTXD_PLUGIN_TIMEOUT_MS``) set; each with
an empty ``PYTHONPATH`` entry, which would put the current directory back on the path."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_process import DaemonProcess

CTXCTL = str(Path(sys.executable).parent / "ctxctl")
IMPOSTOR = 'raise SystemExit("imported the ctxd folder where the user stands")\n'


@pytest.fixture
def standing_in(tmp_path: Path) -> Path:
    """A folder holding a ``ctxd`` package that exits as soon as it is imported."""
    folder = tmp_path / "here"
    (folder / "ctxd").mkdir(parents=True)
    (folder / "ctxd" / "__init__.py").write_text(IMPOSTOR)
    (folder / "ctxd" / "__main__.py").write_text(IMPOSTOR)
    return folder


def _with_an_empty_entry(environ: dict[str, str]) -> dict[str, str]:
    """``PYTHONPATH`` as ``export PYTHONPATH=$PYTHONPATH:/x`` leaves it with none before:
    an empty first entry, which Python reads as the current directory."""
    return {**environ, "PYTHONPATH": os.pathsep.join(["", *filter(None, [
        environ.get("PYTHONPATH")])]) + os.pathsep + "/nonexistent"}


def test_the_folder_is_imported_by_python_m_ctxd(standing_in: Path) -> None:
    """What the starters avoid: ``python -m ctxd`` puts the current directory first, and
    so does ``-P`` with an empty ``PYTHONPATH`` entry."""
    for flags, env in (([], dict(os.environ)), (["-P"], _with_an_empty_entry(
            dict(os.environ)))):
        done = subprocess.run([sys.executable, *flags, "-m", "ctxd", "--version"],
                              cwd=standing_in, env=env, capture_output=True, text=True,
                              timeout=60, check=False)
        assert (done.returncode, done.stdout, done.stderr) == (
            1, "", "imported the ctxd folder where the user stands\n")


def test_a_daemon_process_ignores_it(daemon_root: Path, standing_in: Path) -> None:
    process = DaemonProcess(daemon_root, forked=False).start(cwd=standing_in)
    try:
        assert process.command()[1:4] == ["-P", "-m", "ctxd"]
        with process.client() as client:
            assert client.call("daemon.ping")["pong"] is True
    finally:
        assert process.stop() == 0


def test_ctxctl_replay_ignores_it(tmp_path: Path, standing_in: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({
        "type": role, "uuid": f"{role}-{turn}", "sessionId": "s1",
        "message": {"role": role, "content": f"{role} {turn}"}}) + "\n"
        for turn in (1, 2) for role in ("user", "assistant")))
    done = subprocess.run([CTXCTL, "replay", str(path), "--json"], cwd=standing_in,
                          env=_with_an_empty_entry(dict(os.environ)), capture_output=True,
                          text=True, timeout=300, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert [point["turn"] for point in json.loads(done.stdout)["series"]] == [1, 2]


def _user_environment(root: Path) -> dict[str, str]:
    """A user's environment whose ctxd lives under ``root``, with the OpenCode plugin's
    time limit set as README shows (a client's variable, not a daemon setting)."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("CTXD_", "CLAUDE_", "ANTHROPIC_", "OPENAI_"))}
    env.update(HOME=str(root), XDG_CONFIG_HOME=str(root / "config"),
               XDG_STATE_HOME=str(root / "state"), CTXD_SOCKET=str(root / "run" / "ctxd.sock"),
               CTXD_DATA_DIR=str(root / "data"), CTXD_GATEWAY_LISTEN="127.0.0.1:0",
               CTXD_PLUGIN_TIMEOUT_MS="5000")
    return _with_an_empty_entry(env)


def _shut_down(sock: Path) -> None:
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as client:
        client.connect(str(sock))
        client.sendall(b'{"jsonrpc":"2.0","id":1,"method":"daemon.shutdown"}\n')
        client.recv(1024)


def test_ctxctl_mcp_starts_a_daemon_that_ignores_it(daemon_root: Path,
                                                    standing_in: Path) -> None:
    sock = daemon_root / "run" / "ctxd.sock"
    env = _user_environment(daemon_root)
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}}
    with subprocess.Popen([CTXCTL, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env, cwd=standing_in) as process:
        assert process.stdin is not None
        assert process.stdout is not None
        try:
            process.stdin.write(json.dumps(initialize).encode() + b"\n")
            process.stdin.flush()
            answer = json.loads(process.stdout.readline())
        finally:
            process.stdin.close()
            process.wait(30)
            _shut_down(sock)
    assert process.returncode == 0
    assert answer["result"]["serverInfo"]["name"] == "ctxd"


def test_ctxctl_run_starts_a_daemon_that_ignores_it(daemon_root: Path,
                                                   standing_in: Path) -> None:
    sock = daemon_root / "run" / "ctxd.sock"
    agent = "import os; print(os.environ['ANTHROPIC_BASE_URL'].startswith('http://127.0.0.1:'))"
    try:
        ran = subprocess.run([CTXCTL, "run", "--", sys.executable, "-c", agent],
                             cwd=standing_in, env=_user_environment(daemon_root),
                             capture_output=True, text=True, timeout=60, check=False)
    finally:
        _shut_down(sock)
    log = daemon_root / "state" / "ctxd" / "ctxd.log"
    assert (ran.returncode, ran.stdout, ran.stderr) == (
        0, "True\n", f"ctxctl run: no daemon on {sock}; starting ctxd (log: {log})\n")


def test_ctxctl_hook_ignores_it(tmp_path: Path, standing_in: Path) -> None:
    """Claude Code runs the hook in the project: it fails open there too (exit 0, nothing
    said), rather than exiting 1 from the folder's ``ctxd``."""
    env = _with_an_empty_entry({key: value for key, value in os.environ.items()
                                if not key.startswith("CTXD_")})
    done = subprocess.run([CTXCTL, "hook", "--socket", str(tmp_path / "none.sock")],
                          cwd=standing_in, env=env, input="{}", capture_output=True,
                          text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")

"""Who serves the socket, tried with two real users (docs/security.md, "Who serves the
socket"): user B listens where user A's clients look, and A's clients (the Python client,
ctxctl, ctxctl hook, ctxctl mcp, ctxd-call, the OpenCode plugin) refuse it before sending a
byte; A's daemon says in one line whose the directory is and what to do.

Needs root (to create the two throwaway users with useradd and run as them with runuser)
and an interpreter of this Python version that the users may run; skipped otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from daemon_process import REPO_ROOT
from tests_support import SOCKET_FIX

from ctxclient import daemon_command

PROMPT = "my db password is hunter2"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or None in (shutil.which("useradd"), shutil.which("runuser")),
    reason="needs root, useradd (userdel comes with it) and runuser (apt-get install passwd "
           "util-linux): two throwaway users")

# B's server: it answers every request with an empty result (so that a client that talked
# to it would go on talking) and counts what it receives. Connections are served one after
# another, so when root's connection (the test's) comes, every client's has been counted.
LISTENER = r"""
import json, os, socket, sys
path, directory_mode = sys.argv[1], int(sys.argv[2], 8)
os.makedirs(os.path.dirname(path), exist_ok=True)
os.chmod(os.path.dirname(path), directory_mode)
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
os.chmod(path, 0o777)
server.listen(64)
server.settimeout(120)
print(os.getpid(), flush=True)
connections = received = 0
while True:
    conn, _ = server.accept()
    with conn:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        if int.from_bytes(creds[4:8], sys.byteorder) == 0:
            print(json.dumps({"connections": connections, "bytes": received}), flush=True)
            break
        connections += 1
        conn.settimeout(30)
        buffer = b""
        try:
            while data := conn.recv(65536):
                received += len(data)
                buffer += data
                while b"\n" in buffer:
                    line, _, buffer = buffer.partition(b"\n")
                    request = json.loads(line)
                    if isinstance(request, dict) and request.get("id") is not None:
                        conn.sendall(json.dumps({"jsonrpc": "2.0", "id": request["id"],
                                                 "result": {}}).encode() + b"\n")
        except (OSError, ValueError):
            pass
"""

# A's Python clients, the blocking one and the trio one: what each raised.
PYTHON_CLIENTS = r"""
import trio
import ctxclient

def blocking():
    try:
        ctxclient.Client().call("daemon.ping")
    except ctxclient.UntrustedSocket as exc:
        return str(exc)
    return "connected"

async def with_trio():
    try:
        async with ctxclient.connect() as client:
            await client.call("daemon.ping")
    except ctxclient.UntrustedSocket as exc:
        return str(exc)
    return "connected"

print(blocking())
print(trio.run(with_trio))
"""

# A's OpenCode plugin: a user prompt is recorded and the system prompt built.
PLUGIN = r"""
const { CtxdPlugin } = await import(process.argv[1])
const hooks = await CtxdPlugin({ directory: "/home/a/project" })
const prompt = process.argv[2]
await hooks.event({ event: { type: "message.updated",
  properties: { info: { id: "m1", role: "user", sessionID: "s1" } } } })
await hooks.event({ event: { type: "message.part.updated", properties: {
  part: { id: "p1", messageID: "m1", sessionID: "s1", type: "text", text: prompt } } } })
const output = { system: [] }
await hooks["chat.message"]({ sessionID: "s1" }, { parts: [{ type: "text", text: prompt }] })
await hooks["experimental.chat.system.transform"]({ sessionID: "s1" }, output)
console.log(JSON.stringify(output))
"""


@dataclass
class User:
    name: str
    uid: int
    home: Path


@dataclass
class Users:
    a: User
    b: User
    base: Path
    python: str
    bin_dir: Path

    def env(self, **extra: str) -> dict[str, str]:
        """A's environment: neither XDG_RUNTIME_DIR nor CTXD_SOCKET unless given."""
        site = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
        return {"HOME": str(self.a.home), "PATH": f"{self.bin_dir}:/usr/bin:/bin",
                "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "clients"),
                                               *site]), **extra}

    def run(self, user: User, command: list[str], env: dict[str, str], stdin: str = "",
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["runuser", "-u", user.name, "--", "env", "-i",
             *(f"{k}={v}" for k, v in env.items()), *command],
            input=stdin, capture_output=True, text=True, cwd=self.base, timeout=60,
            check=False)

    def ctxctl(self, *args: str, stdin: str = "", **env: str,
               ) -> subprocess.CompletedProcess[str]:
        return self.run(self.a, [self.python, "-c",
                                 "import sys; from ctxclient._entry import main; "
                                 "sys.exit(main())", *args], self.env(**env), stdin)


def _useradd(base: Path, role: str) -> User:
    name = f"ctxd{role}{uuid.uuid4().hex[:8]}"
    home = base / f"home-{role}"
    subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--shell",
                    "/bin/sh", "--user-group", name], check=True, capture_output=True)
    os.chmod(home, 0o755)  # B's socket directory is in it, reachable by A
    return User(name, int(subprocess.run(["id", "-u", name], check=True, capture_output=True,
                                         text=True).stdout), home)


def _interpreter(users: Users) -> str | None:
    """This Python, as a path the throwaway users may run, that imports this tree."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [sys.executable, os.path.realpath(sys.executable), f"/usr/bin/python{version}",
                  f"/usr/local/bin/python{version}"]
    probe = ("import sys, ctxd.daemon, ctxclient.cli, trio; "
             "print(f'{sys.version_info[0]}.{sys.version_info[1]}')")
    for candidate in dict.fromkeys(candidates):
        if not os.path.exists(candidate):
            continue
        done = users.run(users.a, [candidate, "-c", probe], users.env())
        if done.returncode == 0 and done.stdout.strip() == version:
            return candidate
    return None


@pytest.fixture(scope="module")
def users() -> Iterator[Users]:
    base = Path(tempfile.mkdtemp(prefix="ctxd-users-"))
    os.chmod(base, 0o755)  # the users' homes are in it
    made: list[User] = []
    try:
        made.append(_useradd(base, "a"))
        made.append(_useradd(base, "b"))
        bin_dir = base / "bin"
        bin_dir.mkdir(mode=0o755)
        found = Users(made[0], made[1], base, sys.executable, bin_dir)
        python = _interpreter(found)
        if python is None:
            pytest.skip(f"no Python {sys.version_info[0]}.{sys.version_info[1]} that the "
                        f"throwaway users may run imports this tree ({REPO_ROOT}) and its "
                        "packages: it and the virtualenv must be readable by all")
        found.python = python
        (bin_dir / "python3").symlink_to(python)  # ctxd-call's python transport
        yield found
    finally:
        for user in made:
            subprocess.run(["userdel", "--remove", user.name], check=False,
                           capture_output=True)
            shutil.rmtree(f"/tmp/ctxd-{user.uid}", ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)


@dataclass
class Listener:
    """B's server at ``path``."""

    path: Path
    proc: subprocess.Popen[str]
    pid: int

    def received(self) -> dict[str, int]:
        """Stop it (root connects last) and say what A's clients sent it."""
        with socket.socket(socket.AF_UNIX) as stop:
            stop.connect(str(self.path))
        assert self.proc.stdout is not None
        report: dict[str, int] = json.loads(self.proc.stdout.readline())
        self.proc.wait(30)
        return report


@pytest.fixture(params=["fallback", "peer"])
def attack(request: pytest.FixtureRequest, users: Users) -> Iterator[tuple[str, Listener,
                                                                       dict[str, str]]]:
    """B's server, and A's environment that finds it:

    - fallback: XDG_RUNTIME_DIR and CTXD_SOCKET unset; B made /tmp/ctxd-<A's uid> (0755)
      and listens there;
    - peer: A's CTXD_SOCKET is in a private directory of A's own, where a symlink leads to
      B's socket: only the server's uid (SO_PEERCRED) tells.
    """
    if request.param == "fallback":
        path = Path(f"/tmp/ctxd-{users.a.uid}/ctxd.sock")
        env: dict[str, str] = {}
    else:
        path = users.b.home / "run" / "ctxd.sock"
        private = users.base / f"a-run-{uuid.uuid4().hex[:6]}"
        private.mkdir(mode=0o700)
        os.chown(private, users.a.uid, users.a.uid)
        (private / "ctxd.sock").symlink_to(path)
        env = {"CTXD_SOCKET": str(private / "ctxd.sock")}
    shutil.rmtree(path.parent, ignore_errors=True)
    (users.base / "listener.py").write_text(LISTENER)
    proc = subprocess.Popen(
        ["runuser", "-u", users.b.name, "--", users.python, str(users.base / "listener.py"),
         str(path), "755"], stdout=subprocess.PIPE, text=True, cwd=users.base)
    assert proc.stdout is not None
    listener = Listener(path, proc, int(proc.stdout.readline()))
    try:
        yield request.param, listener, env
    finally:
        if proc.poll() is None:
            os.kill(listener.pid, signal.SIGKILL)
            proc.wait(30)
        proc.stdout.close()
        shutil.rmtree(path.parent, ignore_errors=True)


def refusal(users: Users, scenario: str, env: dict[str, str]) -> str:
    """What every client of A's says."""
    if scenario == "fallback":
        directory, b = f"/tmp/ctxd-{users.a.uid}", users.b.uid
        return (f"{directory} is owned by uid {b}, not by you (uid {users.a.uid}), so a socket "
                f"there is not your ctxd's: have it removed (by uid {b} or root), or {SOCKET_FIX}")
    return (f"{env['CTXD_SOCKET']} is served by uid {users.b.uid}, not by you (uid "
            f"{users.a.uid}), so it is not your ctxd; nothing was sent to it: stop that "
            f"server (or have root do so), or {SOCKET_FIX}")


def test_python_clients_refuse(users: Users, attack: tuple[str, Listener, dict[str, str]],
                               ) -> None:
    scenario, listener, env = attack
    done = users.run(users.a, [users.python, "-c", PYTHON_CLIENTS], users.env(**env))
    message = refusal(users, scenario, env)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{message}\n{message}\n", "")
    assert listener.received()["bytes"] == 0


def test_ctxctl_refuses(users: Users, attack: tuple[str, Listener, dict[str, str]]) -> None:
    scenario, listener, env = attack
    done = users.ctxctl("status", **env)
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", f"ctxctl: {refusal(users, scenario, env)}\n")
    assert listener.received()["bytes"] == 0


def test_ctxctl_hook_fails_open_and_says_nothing_to_the_server(
        users: Users, attack: tuple[str, Listener, dict[str, str]]) -> None:
    scenario, listener, env = attack
    event = {"session_id": str(uuid.uuid4()), "cwd": "/home/a/project",
             "transcript_path": "/home/a/t.jsonl", "hook_event_name": "UserPromptSubmit",
             "prompt": PROMPT}
    done = users.ctxctl("hook", stdin=json.dumps(event), **env)
    assert (done.returncode, done.stdout, done.stderr) == (
        0, "", f"ctxctl hook: {refusal(users, scenario, env)}\n")
    assert listener.received()["bytes"] == 0


def test_ctxctl_mcp_refuses_and_starts_no_daemon(
        users: Users, attack: tuple[str, Listener, dict[str, str]]) -> None:
    scenario, listener, env = attack
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"}}}
    done = users.ctxctl("mcp", stdin=json.dumps(initialize) + "\n", **env)
    assert (done.returncode, done.stdout, done.stderr) == (
        1, "", f"ctxctl mcp: {refusal(users, scenario, env)}\n")
    assert listener.received()["bytes"] == 0
    assert not (users.a.home / ".local" / "state" / "ctxd" / "ctxd.log").exists()


@pytest.mark.parametrize("transport", ["python", "socat"])
def test_shell_client_refuses(users: Users, attack: tuple[str, Listener, dict[str, str]],
                              transport: str) -> None:
    scenario, listener, env = attack
    if transport == "socat" and shutil.which("socat") is None:
        pytest.skip("socat not installed (apt-get install socat)")
    done = users.run(users.a, ["sh", str(REPO_ROOT / "clients" / "shell" / "ctxd-call"),
                               "daemon.ping"],
                     users.env(CTXD_CALL_TRANSPORT=transport, **env))
    message = refusal(users, scenario, env)
    if transport == "socat" and scenario == "peer":
        # socat cannot read SO_PEERCRED: the socket file's owner tells instead.
        message = (f"{env['CTXD_SOCKET']} is owned by uid {users.b.uid}, not by you (uid "
                   f"{users.a.uid}), so it is not your ctxd's; nothing was sent to it: "
                   f"{SOCKET_FIX}")
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"ctxd-call: {message}\n")
    assert listener.received()["bytes"] == 0


def test_opencode_plugin_changes_nothing_and_sends_nothing(
        users: Users, attack: tuple[str, Listener, dict[str, str]]) -> None:
    _, listener, env = attack
    node = shutil.which("node")
    if node is None:
        pytest.skip("node not installed (apt-get install nodejs)")
    plugin = (REPO_ROOT / "clients" / "opencode" / "ctxd.js").as_uri()
    done = users.run(users.a, [node, "--input-type=module", "-e", PLUGIN, plugin, PROMPT],
                     users.env(**env))
    assert (done.returncode, done.stdout, done.stderr) == (0, '{"system":[]}\n', "")
    assert listener.received() == {"connections": 0, "bytes": 0}


@pytest.mark.parametrize("mode", ["755", "700"])
def test_the_daemon_names_whose_directory_it_is_and_the_fix(users: Users, mode: str) -> None:
    directory = Path(f"/tmp/ctxd-{users.a.uid}")
    shutil.rmtree(directory, ignore_errors=True)
    made = users.run(users.b, ["mkdir", "-m", mode, str(directory)], {"PATH": "/usr/bin:/bin"})
    assert made.returncode == 0, made.stderr
    try:
        done = users.run(users.a, daemon_command(python=users.python), users.env())
        assert (done.returncode, done.stdout, done.stderr) == (
            1, "", f"ctxd: {refusal(users, 'fallback', {})}\n")
        assert not (users.a.home / ".local" / "share" / "ctxd").exists()
    finally:
        shutil.rmtree(directory, ignore_errors=True)

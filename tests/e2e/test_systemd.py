"""systemd integration: sd_notify (READY, WATCHDOG, STOPPING), socket activation, the units."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from conftest import DaemonProcess
from e2e.test_cancel import WINDOW, chat, gated_daemon
from tests_support import installed_prefix, needs

from ctxd.config import Config, default_socket_path
from ctxd.daemon import parser as ctxd_parser

UNITS = Path(__file__).resolve().parents[2] / "systemd"
WAIT_S = 10.0


# ---- sd_notify ----------------------------------------------------------------------

def receive_until(sock: socket.socket, done: str, count: int = 1) -> list[str]:
    """Datagrams until ``done`` has arrived ``count`` times (fails after WAIT_S)."""
    received: list[str] = []
    deadline = time.monotonic() + WAIT_S
    while received.count(done) < count:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            received.append(sock.recv(4096).decode())
        except TimeoutError:
            raise AssertionError(f"no {done!r} after {received}") from None
    return received


def check_notifications(process: DaemonProcess, notify: socket.socket) -> None:
    assert process.proc is not None
    ready = (f"READY=1\nSTATUS=serving on {process.socket}\nMAINPID={process.proc.pid}")
    early = receive_until(notify, "WATCHDOG=1", count=2)  # every 0.1 s: WATCHDOG_USEC/2
    assert early[0] == ready
    assert early[1:] == ["WATCHDOG=1"] * (len(early) - 1)
    assert process.stop() == 0
    late = receive_until(notify, "STOPPING=1")
    # The watchdog keeps being fed until the server has drained; nothing else comes.
    assert late == ["WATCHDOG=1"] * (len(late) - 1) + ["STOPPING=1"]
    notify.setblocking(False)
    with pytest.raises(BlockingIOError):
        notify.recv(4096)


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_notify_ready_watchdog_stopping(daemon_root: Path, abstract: bool) -> None:
    if abstract:
        name = f"ctxd-test-{uuid.uuid4().hex}"
        address, notify_socket = "\0" + name, "@" + name
    else:
        address = notify_socket = str(daemon_root / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(address)
        process = DaemonProcess(daemon_root, env={"NOTIFY_SOCKET": notify_socket,
                                                  "WATCHDOG_USEC": "200000"})
        process.start()
        try:
            check_notifications(process, notify)
        finally:
            process.stop()


# ---- socket activation --------------------------------------------------------------

# What systemd does between fork and exec: the listening socket becomes fd 3 and
# LISTEN_PID/LISTEN_FDS name this very process, which then becomes ctxd.
ACTIVATE = """
import os, sys
fd = int(sys.argv[1])
if fd != 3:
    os.dup2(fd, 3)
    os.close(fd)
os.environ["LISTEN_PID"] = str(os.getpid())
os.environ["LISTEN_FDS"] = "1"
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


@dataclass
class ActivatedDaemon(DaemonProcess):
    """A ctxd handed an already listening socket, the way systemd starts it."""

    listen_fd: int = -1

    def entry_point(self) -> list[str]:
        return ["-c", ACTIVATE, str(self.listen_fd), "-P", *super().entry_point()]

    def start(self, wait: bool = True, *, cwd: Path | None = None,
              pass_fds: tuple[int, ...] = ()) -> ActivatedDaemon:
        super().start(wait, cwd=cwd, pass_fds=(*pass_fds, self.listen_fd))
        return self


def listening_socket(path: Path, mode: int) -> socket.socket:
    """A listening Unix socket at ``path`` (what ctxd.socket makes), chmodded to ``mode``."""
    path.parent.mkdir(mode=0o700)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(16)
    os.chmod(path, mode)
    return sock


def test_socket_activation(daemon_root: Path) -> None:
    process = ActivatedDaemon(daemon_root)
    # A mode ctxd would never choose, so a chmod by the daemon would show.
    with listening_socket(process.socket, 0o640) as listener:
        process.listen_fd = listener.fileno()
        process.start()
        try:
            with process.client() as client:
                assert client.call("daemon.ping")["pong"] is True
                # status names the socket it serves
                assert client.call("daemon.status")["socket"] == str(process.socket)
        finally:
            assert process.stop() == 0
        info = os.lstat(process.socket)
        assert stat.S_ISSOCK(info.st_mode)
        assert stat.S_IMODE(info.st_mode) == 0o640
        assert not process.socket.with_name("ctxd.sock.lock").exists()
        assert f"ready on {process.socket} (systemd-activated)" in process.log()

        # Between two daemons the socket keeps accepting; the next daemon answers what
        # was asked meanwhile (what systemd's restart and on-demand start rely on).
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as early:
            early.connect(str(process.socket))
            early.sendall(b'{"jsonrpc":"2.0","id":7,"method":"daemon.ping"}\n')
            successor = ActivatedDaemon(daemon_root, listen_fd=listener.fileno())
            successor.start()
            try:
                early.settimeout(WAIT_S)
                answer = msgspec.json.decode(early.makefile("rb").readline())
            finally:
                assert successor.stop() == 0
        assert (answer["id"], answer["result"]["pong"]) == (7, True)
        assert process.socket.exists()


def test_listen_fds_for_another_process_are_ignored(daemon_root: Path) -> None:
    # LISTEN_PID names someone else (e.g. inherited from a parent): bind our own socket.
    process = DaemonProcess(daemon_root, env={"LISTEN_PID": "1", "LISTEN_FDS": "1"})
    process.start()
    try:
        with process.client() as client:
            assert client.call("daemon.ping")["pong"] is True
        assert stat.S_IMODE(os.lstat(process.socket).st_mode) == 0o600
    finally:
        assert process.stop() == 0
    assert not process.socket.exists()  # a socket it bound itself is removed


def test_second_signal_exits_at_once(daemon_root: Path) -> None:
    # A compaction held in flight by its summarizer (whose gate never opens): the graceful
    # shutdown the first signal starts cannot end before the second arrives (with nothing
    # in flight it could, and exit 0 first).
    gated = gated_daemon(daemon_root, "--hygiene-auto-compact", "false")
    process = gated.process.start()
    assert process.proc is not None
    with process.client() as client:
        client.call("session.open", {"session_id": "s", "budget": WINDOW})
        client.call("message.append", {"session_id": "s", "messages": chat(10, 450)})
        client.submit("context.compact", {"session_id": "s", "strategies": ["summarize"]})
        gated.wait_started()
        # Stopped, the daemon gets both signals at the same moment when it continues: the
        # first starts a graceful shutdown, the second ends the process at once (exit 1).
        process.proc.send_signal(signal.SIGSTOP)
        process.proc.send_signal(signal.SIGTERM)
        process.proc.send_signal(signal.SIGINT)
        process.proc.send_signal(signal.SIGCONT)
        assert process.proc.wait(WAIT_S) == 1
    assert "shutting down gracefully" in process.log()
    assert ": exiting at once" in process.log()


# ---- the unit files -----------------------------------------------------------------

Unit = dict[str, dict[str, list[str]]]


def read_unit(path: Path) -> Unit:
    """Sections → key → every value given (a key may repeat in systemd units)."""
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"{path.name}:{number}: no continuation lines here"
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        key, equals, value = line.partition("=")
        assert section is not None, f"{path.name}:{number}: a key before any [section]"
        assert equals, f"{path.name}:{number}: not KEY=VALUE: {raw!r}"
        assert key.isidentifier(), f"{path.name}:{number}: bad key {key!r}"
        section.setdefault(key, []).append(value.strip())
    return unit


def test_service_unit() -> None:
    unit = read_unit(UNITS / "ctxd.service")
    service = unit["Service"]
    assert {key: service[key] for key in (
        "Type", "NotifyAccess", "WatchdogSec", "Restart", "RestartPreventExitStatus",
        "KillSignal", "TimeoutStopSec", "NoNewPrivileges", "ProtectSystem", "PrivateTmp",
        "PrivateUsers", "ReadWritePaths", "LimitNOFILE",
    )} == {
        "Type": ["notify"], "NotifyAccess": ["main"], "WatchdogSec": ["30"],
        "Restart": ["on-failure"], "RestartPreventExitStatus": ["78"],
        "KillSignal": ["SIGTERM"], "TimeoutStopSec": ["20"], "NoNewPrivileges": ["yes"],
        "ProtectSystem": ["strict"], "PrivateTmp": ["yes"],
        "PrivateUsers": ["yes"], "ReadWritePaths": ["%h/.local/share/ctxd %t/ctxd"],
        "LimitNOFILE": ["65536"],
    }
    # Every connection the daemon serves by default fits, with room to spare.
    assert int(service["LimitNOFILE"][0]) > 4 * Config().max_connections
    # Room for the graceful shutdown (in-flight requests get shutdown_timeout_s).
    assert int(service["TimeoutStopSec"][0]) > Config().shutdown_timeout_s
    [exec_start] = service["ExecStart"]
    program, *flags = shlex.split(exec_start)
    assert program == "%h/.local/bin/ctxd"
    args = ctxd_parser().parse_args(flags)  # every flag is one ctxd knows
    socket_unit = read_unit(UNITS / "ctxd.socket")
    assert vars(args)["cfg:socket"] == socket_unit["Socket"]["ListenStream"][0]
    assert vars(args)["cfg:data_dir"] in service["ReadWritePaths"][0].split()
    assert unit["Unit"]["Requires"] == unit["Unit"]["After"] == ["ctxd.socket"]


def test_socket_unit() -> None:
    unit = read_unit(UNITS / "ctxd.socket")
    assert unit["Socket"] == {"ListenStream": ["%t/ctxd/ctxd.sock", "127.0.0.1:8788"],
                              "SocketMode": ["0600"],
                              "DirectoryMode": ["0700"], "RemoveOnStop": ["yes"]}
    assert unit["Install"] == {"WantedBy": ["sockets.target"]}
    # The gateway's port is the configuration's default.
    assert unit["Socket"]["ListenStream"][1] == Config().gateway.listen
    # %t is $XDG_RUNTIME_DIR: the socket is where clients look when nothing else is said.
    runtime = {"XDG_RUNTIME_DIR": "/run/user/1000"}
    assert str(default_socket_path(runtime)) == unit["Socket"]["ListenStream"][0].replace(
        "%t", "/run/user/1000")


@needs("systemd-analyze", "man")
def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    """The units as the README installs them, ctxd as `pip install --user` puts it
    (~/.local/bin, and its manual pages in ~/.local/share/man): every check passes,
    the Documentation= pages included."""
    home = tmp_path / "home"
    units = home / ".config" / "systemd" / "user"
    units.mkdir(parents=True)
    for name in ("ctxd.service", "ctxd.socket"):
        shutil.copy(UNITS / name, units / name)
    ctxd = Path(sys.executable).with_name("ctxd")
    if not ctxd.exists():
        pytest.skip(f"no ctxd console script beside {sys.executable} (pip install -e .)")
    (home / ".local" / "bin").mkdir(parents=True)
    (home / ".local" / "bin" / "ctxd").symlink_to(ctxd)
    shutil.copytree(installed_prefix() / "share", home / ".local" / "share")
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {key: value for key, value in os.environ.items() if key != "MANPATH"}
    env.update({"HOME": str(home), "XDG_RUNTIME_DIR": str(runtime),
                "XDG_CONFIG_HOME": str(home / ".config"),
                "PATH": f"{home / '.local' / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"})
    proc = subprocess.run(
        ["systemd-analyze", "--user", "verify",
         str(units / "ctxd.service"), str(units / "ctxd.socket")],
        capture_output=True, text=True, env=env, timeout=60, check=False)
    assert (proc.returncode, proc.stderr, proc.stdout) == (0, "", "")

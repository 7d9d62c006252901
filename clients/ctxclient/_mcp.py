"""``ctxctl mcp``: MCP on stdio, pumped to the daemon's socket, which speaks MCP itself
(docs/protocol.md, "MCP"). It binds the connection to a session first (``mcp.bind``), then
copies bytes both ways (one JSON message a line) until either side closes."""

from __future__ import annotations

import errno
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from ctxclient._codec import encode
from ctxd.paths import UntrustedSocket, check_peer, check_socket_directory, default_socket_path

START_WAIT_S = 15.0
"""How long ctxctl mcp waits for a daemon it started to answer (it loads the tokenizer)."""
CHUNK = 256 * 1024
BIND_ID = "ctxctl-mcp-bind"
SOCKET_UNITS = (Path("/etc/systemd/user/ctxd.socket"), Path("/usr/lib/systemd/user/ctxd.socket"),
                Path("/lib/systemd/user/ctxd.socket"))
"""Where a systemd user socket unit for ctxd is installed system-wide."""


class PumpError(Exception):
    """What ctxctl mcp says on stderr before exiting 1."""


def _user_socket_unit(environ: Mapping[str, str]) -> Path | None:
    home = Path(environ.get("HOME") or Path.home())
    config = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
    for unit in (config / "systemd" / "user" / "ctxd.socket", *SOCKET_UNITS):
        if unit.exists():
            return unit
    return None


def _connect(path: str) -> socket.socket | None:
    """A connection to the user's own ctxd at ``path``; None when nothing listens there.

    Raises:
        PumpError: connecting failed otherwise, or the socket is not the user's own ctxd's
            (nothing is sent to it, and no daemon is started).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        check_socket_directory(path)
        sock.connect(path)
        check_peer(sock, path)
    except UntrustedSocket as exc:
        sock.close()
        raise PumpError(str(exc)) from None
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.ENOENT, errno.ECONNREFUSED):
            return None
        raise PumpError(f"cannot connect to ctxd at {path}: {exc.strerror}") from None
    return sock


def _log_path(environ: Mapping[str, str]) -> Path:
    home = Path(environ.get("HOME") or Path.home())
    state = Path(environ.get("XDG_STATE_HOME") or home / ".local" / "state")
    return state / "ctxd" / "ctxd.log"


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def start_daemon(path: str, explicit: bool, environ: Mapping[str, str]) -> socket.socket:
    """Start ctxd in the background (its own session, its log in
    ``$XDG_STATE_HOME/ctxd/ctxd.log``) and return a connection once it answers.

    Raises:
        PumpError: it exited, or did not answer within `START_WAIT_S`.
    """
    log_path = _log_path(environ)
    log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    command = [sys.executable, "-m", "ctxd", *(["--socket", path] if explicit else [])]
    print(f"ctxctl mcp: no daemon on {path}; starting ctxd (log: {log_path})", file=sys.stderr)
    with log_path.open("ab") as log:
        os.chmod(log_path, 0o600)
        daemon = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                  start_new_session=True, close_fds=True)
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        sock = _connect(path)
        if sock is not None:
            return sock
        exited = daemon.poll()
        if exited is not None:
            sock = _connect(path)  # another client's ctxd may have won the race
            if sock is not None:
                return sock
            raise PumpError(f"ctxd exited with status {exited} before answering on {path}; "
                            f"its log ({log_path}) ends with:\n{_tail(log_path)}")
        time.sleep(0.05)
    raise PumpError(f"ctxd did not answer on {path} within {START_WAIT_S:.0f} s; see "
                    f"{log_path}")


def connect(socket_path: str | None, environ: Mapping[str, str]) -> socket.socket:
    """A connection to the daemon: the one running, else one started for it.

    Raises:
        PumpError: nothing answers and ctxd could not be started (or systemd should).
    """
    path = str(socket_path or default_socket_path(environ))
    sock = _connect(path)
    if sock is not None:
        return sock
    unit = _user_socket_unit(environ)
    if unit is not None and socket_path is None:
        raise PumpError(f"nothing listens on {path}, and the systemd socket unit {unit} is "
                        "installed: start it with `systemctl --user enable --now ctxd.socket`")
    return start_daemon(path, socket_path is not None, environ)


def bind(sock: socket.socket, session_id: str | None, project: str | None) -> bytes:
    """Send ``mcp.bind`` and read its answer.

    Returns:
        Bytes the daemon sent after the answer (to pass on to the client).

    Raises:
        PumpError: the daemon refused the binding (an invalid session id, an old daemon).
    """
    params: dict[str, Any] = {"session_id": session_id, "project": project}
    sock.sendall(encode({"jsonrpc": "2.0", "id": BIND_ID, "method": "mcp.bind",
                         "params": params}) + b"\n")
    received = b""
    while b"\n" not in received:
        chunk = sock.recv(CHUNK)
        if not chunk:
            raise PumpError("ctxd closed the connection before answering mcp.bind")
        received += chunk
    line, _, rest = received.partition(b"\n")
    answer = msgspec.json.decode(line)
    error = answer.get("error") if isinstance(answer, dict) else None
    if error:
        fix = (error.get("data") or {}).get("fix") if isinstance(error.get("data"), dict) \
            else None
        raise PumpError(f"ctxd refused the MCP session binding: {error.get('message')}"
                        + (f" (fix: {fix})" if fix else ""))
    return rest


def pump(sock: socket.socket, stdin: int, stdout: int, pending_out: bytes = b"") -> None:
    """Copy stdin to the socket and the socket to stdout until the daemon closes.

    The socket is non-blocking and written only when it has room, so a daemon waiting for
    its answers to be read never waits on a pump blocked in a write to it. At the end of
    stdin the socket's sending side is shut: the daemon cancels the calls still running
    (the client went away), sends what it has, and closes.
    """
    sock.setblocking(False)
    to_daemon = bytearray()
    to_client = bytearray(pending_out)
    stdin_open = True
    shut = False
    poller = select.poll()
    poller.register(stdin, select.POLLIN)
    while True:
        while to_client:
            del to_client[:os.write(stdout, to_client)]
        poller.register(sock, select.POLLIN | (select.POLLOUT if to_daemon else 0))
        if stdin_open:
            # Stop reading the client while the daemon is not taking what it sent.
            poller.modify(stdin, select.POLLIN if len(to_daemon) < 4 * CHUNK else 0)
        for fd, event in poller.poll():
            if fd == stdin:
                data = os.read(stdin, CHUNK)
                if data:
                    to_daemon += data
                else:
                    stdin_open = False
                    poller.unregister(stdin)
                continue
            if event & select.POLLOUT and to_daemon:
                try:
                    del to_daemon[:sock.send(to_daemon)]
                except BlockingIOError:
                    pass
            if event & (select.POLLIN | select.POLLHUP | select.POLLERR):
                try:
                    data = sock.recv(CHUNK)
                except BlockingIOError:
                    continue
                if not data:
                    if stdin_open:
                        raise PumpError("ctxd closed the connection")
                    return
                to_client += data
        if not stdin_open and not to_daemon and not shut:
            shut = True
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                return


def run(socket_path: str | None, session_id: str | None,
        environ: Mapping[str, str] | None = None) -> int:
    """``ctxctl mcp``: 0 when the client hung up, 1 (with why on stderr) otherwise."""
    environ = os.environ if environ is None else environ
    session_id = session_id or environ.get("CLAUDE_CODE_SESSION_ID") or None
    project = environ.get("CLAUDE_PROJECT_DIR") or None
    try:
        sock = connect(socket_path, environ)
        with sock:
            rest = bind(sock, session_id, project)
            pump(sock, sys.stdin.fileno(), sys.stdout.fileno(), rest)
    except PumpError as exc:
        print(f"ctxctl mcp: {exc}", file=sys.stderr)
        return 1
    except (BrokenPipeError, ConnectionResetError):
        return 0
    except KeyboardInterrupt:
        return 130
    return 0

"""``ctxctl mcp``: MCP on stdio, pumped to the daemon's socket, which speaks MCP itself
(docs/protocol.md, "MCP"). It binds the connection to a session first (``mcp.bind``), then
copies messages both ways (one JSON message a line) until the client hangs up; a daemon
that goes away meanwhile is connected to again, bound to the same session."""

from __future__ import annotations

import errno
import os
import select
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from ctxclient._codec import encode
from ctxclient._errors import CtxdClientError
from ctxclient._spawn import spawn_daemon
from ctxd.errors import ErrorCode
from ctxd.paths import UntrustedSocket, check_peer, check_socket_directory, default_socket_path

START_WAIT_S = 15.0
"""How long ctxctl mcp waits for a daemon it started to answer (it loads the tokenizer)."""
CHUNK = 256 * 1024
BIND_ID = "ctxctl-mcp-bind"
SOCKET_UNITS = (Path("/etc/systemd/user/ctxd.socket"), Path("/usr/lib/systemd/user/ctxd.socket"),
                Path("/lib/systemd/user/ctxd.socket"))
"""Where a systemd user socket unit for ctxd is installed system-wide."""


class PumpError(CtxdClientError):
    """What ctxctl mcp says on stderr before exiting 1."""


class DaemonBusy(PumpError):
    """The daemon closed the connection before answering the binding, or answered -32007
    (its connections are all taken, it is shutting down): a reconnection tries again."""


def user_socket_unit(environ: Mapping[str, str]) -> Path | None:
    """ctxd's systemd user socket unit, when one is installed."""
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


def state_dir(environ: Mapping[str, str]) -> Path:
    """ctxctl's state directory, ``$XDG_STATE_HOME/ctxd``: the log of a daemon it starts,
    what install replaced."""
    home = Path(environ.get("HOME") or Path.home())
    return Path(environ.get("XDG_STATE_HOME") or home / ".local" / "state") / "ctxd"


def _log_path(environ: Mapping[str, str]) -> Path:
    return state_dir(environ) / "ctxd.log"


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def start_daemon(path: str, explicit: bool, environ: Mapping[str, str],
                 who: str = "ctxctl mcp") -> socket.socket:
    """Start ctxd in the background (its own session, its log in
    ``$XDG_STATE_HOME/ctxd/ctxd.log``) and return a connection once it answers.

    Raises:
        PumpError: it exited, or did not answer within `START_WAIT_S`.
    """
    log_path = _log_path(environ)
    log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    print(f"{who}: no daemon on {path}; starting ctxd (log: {log_path})", file=sys.stderr)
    daemon = spawn_daemon(["--socket", path] if explicit else [], log=log_path, detach=True)
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


def connect(socket_path: str | None, environ: Mapping[str, str],
            who: str = "ctxctl mcp") -> socket.socket:
    """A connection to the daemon: the one running, else one started for it (``who``
    says so on stderr).

    Raises:
        PumpError: nothing answers and ctxd could not be started (or systemd should).
    """
    path = str(socket_path or default_socket_path(environ))
    sock = _connect(path)
    if sock is not None:
        return sock
    unit = user_socket_unit(environ)
    if unit is not None and socket_path is None:
        raise PumpError(f"nothing listens on {path}, and the systemd socket unit {unit} is "
                        "installed: start it with `systemctl --user enable --now ctxd.socket`")
    return start_daemon(path, socket_path is not None, environ, who)


def tools_param(tools: str | None) -> str | list[str] | None:
    """``--tools``: ``default`` (None: the daemon's default set), ``all``, or tool names
    separated by commas."""
    if tools is None or tools in ("all", "default"):
        return tools
    return [name.strip() for name in tools.split(",") if name.strip()]


def bind(sock: socket.socket, session_id: str | None, project: str | None,
         tools: str | None = None) -> bytes:
    """Send ``mcp.bind`` and read its answer.

    Returns:
        Bytes the daemon sent after the answer (to pass on to the client).

    Raises:
        PumpError: the daemon refused the binding (an invalid session id, an old daemon);
            DaemonBusy when it closed the connection, did not answer, or was busy (-32007).
    """
    params: dict[str, Any] = {"session_id": session_id, "project": project}
    if tools is not None:
        params["tools"] = tools_param(tools)
    sock.sendall(encode({"jsonrpc": "2.0", "id": BIND_ID, "method": "mcp.bind",
                         "params": params}) + b"\n")
    received = b""
    sock.settimeout(START_WAIT_S)  # a daemon that accepted and hangs is not waited for
    try:
        while b"\n" not in received:
            chunk = sock.recv(CHUNK)
            if not chunk:
                raise DaemonBusy("ctxd closed the connection before answering mcp.bind")
            received += chunk
    except TimeoutError:
        raise DaemonBusy(f"ctxd did not answer mcp.bind within {START_WAIT_S:.0f} s") from None
    finally:
        sock.settimeout(None)
    line, _, rest = received.partition(b"\n")
    answer = msgspec.json.decode(line)
    error = answer.get("error") if isinstance(answer, dict) else None
    if error:
        fix = (error.get("data") or {}).get("fix") if isinstance(error.get("data"), dict) \
            else None
        refused = (DaemonBusy if error.get("code") == ErrorCode.OVERLOADED else PumpError)
        raise refused(f"ctxd refused the MCP session binding: {error.get('message')}"
                      + (f" (fix: {fix})" if fix else ""))
    return rest


STOPPED = "ctxd stopped; retrying"
"""What a call in flight when the daemon went away is answered (docs/protocol.md, "MCP")."""
REINITIALIZE_ID = "ctxctl-mcp-reinitialize"
RECONNECT_FIRST_S = 0.05
RECONNECT_MAX_S = 1.0
"""After the daemon went away, connecting again is tried after 50 ms, then twice as long
each time, at most every second (and at once when the client sends a request)."""


class _Message(msgspec.Struct):
    """What the pump reads of a JSON-RPC message: is it a request, a notification, an
    answer, and to which request."""

    id: int | str | None = None
    method: str | None = None
    params: msgspec.Raw = msgspec.Raw()
    result: msgspec.Raw = msgspec.Raw()
    """Left as they are (empty when absent)."""


class _CancelledParams(msgspec.Struct):
    requestId: int | str | None = None


class _Named(msgspec.Struct):
    """A ``_meta`` that may name the session a call acts on (docs/protocol.md, "MCP")."""

    session_id: Any = msgspec.field(default=None, name="ctxd/session_id")


class _ArgumentsOfCall(msgspec.Struct):
    meta: _Named | None = msgspec.field(default=None, name="_meta")


class _CallParams(msgspec.Struct):
    meta: _Named | None = msgspec.field(default=None, name="_meta")
    arguments: _ArgumentsOfCall | None = None


def _names_a_session(params: msgspec.Raw) -> bool:
    """Whether a ``tools/call``'s params name the session it acts on in ``_meta`` (its own
    or its arguments'): its answer's session is then not the connection's."""
    call = _decode(params, _CallParams) if params else None
    if call is None:
        return False
    return any(meta is not None and meta.session_id is not None for meta in (
        call.meta, call.arguments.meta if call.arguments is not None else None))


class _ContextState(msgspec.Struct):
    session_id: str | None = None


class _Structured(msgspec.Struct):
    context_state: _ContextState | None = None


class _ToolResult(msgspec.Struct):
    structuredContent: _Structured | None = None


def _decode(line: bytes, kind: type[Any]) -> Any:
    try:
        return msgspec.json.decode(line, type=kind)
    except msgspec.DecodeError:
        return None


def stopped_answer(request_id: int | str, method: str) -> bytes:
    """The answer to a request the daemon will not answer: it went away."""
    if method == "tools/call":
        answer: dict[str, Any] = {"result": {"content": [{"type": "text", "text": STOPPED}],
                                             "isError": True}}
    else:
        answer = {"error": {"code": int(ErrorCode.OVERLOADED), "message": STOPPED}}
    return msgspec.json.encode({"jsonrpc": "2.0", "id": request_id, **answer}) + b"\n"


class Link:
    """The MCP session the pump keeps across connections to the daemon: the binding, the
    client's handshake, the requests in flight.

    Args:
        path: the daemon's socket.
        session_id: the session to bind (None: the one the daemon makes, learnt from the
            first tool result, so that a new connection binds the same).
        project: the project to bind.
    """

    def __init__(self, path: str, session_id: str | None, project: str | None,
                 tools: str | None = None):
        self.path = path
        self.session_id = session_id
        self.project = project
        self.tools = tools
        self.in_flight: dict[int | str, str] = {}
        """Method of each request sent and not yet answered, by id, oldest first."""
        self.named: set[int | str] = set()
        """Ids of the calls in flight that name their own session (`_names_a_session`)."""
        self.initialize: dict[str, Any] | None = None
        """The client's initialize request, sent again on a new connection."""
        self.initialized = False

    def from_client(self, line: bytes) -> None:
        """Note what a line from the client asks (a request in flight, the handshake, a
        call it cancelled: the daemon does not answer it)."""
        message = _decode(line, _Message)
        if message is None or message.method is None:
            return
        if message.id is not None:
            self.in_flight[message.id] = message.method
            if message.method == "tools/call" and _names_a_session(message.params):
                self.named.add(message.id)
            if message.method == "initialize":
                self.initialize = msgspec.json.decode(line)
        elif message.method == "notifications/initialized":
            self.initialized = True
        elif message.method == "notifications/cancelled" and message.params:
            cancelled = _decode(message.params, _CancelledParams)
            if cancelled is not None and cancelled.requestId is not None:
                self.in_flight.pop(cancelled.requestId, None)
                self.named.discard(cancelled.requestId)

    def from_daemon(self, line: bytes) -> bool:
        """Note an answer from the daemon; whether to pass the line on to the client (the
        answer to the pump's own initialize is not)."""
        message = _decode(line, _Message)
        if message is None or message.method is not None or message.id is None:
            return True
        if message.id == REINITIALIZE_ID:
            return False
        method = self.in_flight.pop(message.id, None)
        if message.id in self.named:
            self.named.discard(message.id)
            return True  # its session is the one it named, not the connection's
        if method == "tools/call" and self.session_id is None and message.result:
            result = _decode(message.result, _ToolResult)
            if result is not None and result.structuredContent is not None \
                    and result.structuredContent.context_state is not None:
                self.session_id = result.structuredContent.context_state.session_id
        return True

    def lost(self) -> bytes:
        """The answers to every request in flight, which the daemon will not send."""
        answers = b"".join(stopped_answer(request_id, method)
                           for request_id, method in self.in_flight.items())
        self.in_flight.clear()
        self.named.clear()
        return answers

    def reconnect(self) -> tuple[socket.socket, bytes] | None:
        """A new connection, bound to the same session and handshaken as the client did,
        and what the daemon sent after the binding's answer; None when nothing listens (or
        what listens went away at once).

        Raises:
            PumpError: the daemon refused the binding (not for being busy: `DaemonBusy`
                is tried again).
        """
        sock = _connect(self.path)
        if sock is None:
            return None
        try:
            rest = bind(sock, self.session_id, self.project, self.tools)
            handshake = b""
            if self.initialize is not None:
                handshake += msgspec.json.encode({**self.initialize,
                                                  "id": REINITIALIZE_ID}) + b"\n"
            if self.initialized:
                handshake += b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
            sock.sendall(handshake)
        except (OSError, DaemonBusy):
            sock.close()
            return None  # tried again after a while
        except PumpError:
            sock.close()
            raise
        sock.setblocking(False)
        return sock, rest


def _lines(buffer: bytearray) -> list[bytes]:
    """The complete lines at the start of ``buffer`` (taken out of it, without newlines)."""
    end = buffer.rfind(b"\n")
    if end < 0:
        return []
    lines = bytes(buffer[:end]).split(b"\n")
    del buffer[:end + 1]
    return lines


def pump(link: Link, sock: socket.socket, stdin: int, stdout: int,
         pending_out: bytes = b"") -> None:
    """Copy stdin to the socket and the socket to stdout, a line at a time, until the client
    has hung up and the daemon has answered.

    The socket is non-blocking and written only when it has room, so a daemon waiting for
    its answers to be read never waits on a pump blocked in a write to it. At the end of
    stdin the socket's sending side is shut: the daemon cancels the calls still running
    (the client went away), sends what it has, and closes. Should the daemon go away while
    the client is there, each request in flight is answered `STOPPED` (a tool call as a
    result with ``isError``, anything else as error -32007), and the pump connects again
    (`Link.reconnect`), binding the same session; a request sent meanwhile is answered the
    same when no daemon listens yet.
    """
    sock.setblocking(False)
    connection: socket.socket | None = sock
    from_client = bytearray()
    to_daemon = bytearray()
    from_daemon = bytearray(pending_out)
    to_client = bytearray()
    stdin_open = True
    shut = False
    retry_s = RECONNECT_FIRST_S
    poller = select.poll()
    poller.register(stdin, select.POLLIN)

    def connected(new: tuple[socket.socket, bytes]) -> socket.socket:
        nonlocal retry_s
        new_sock, rest = new
        from_daemon[:] = rest
        retry_s = RECONNECT_FIRST_S
        return new_sock

    def lose() -> None:
        nonlocal connection
        assert connection is not None
        poller.unregister(connection)
        connection.close()
        connection = None
        from_daemon.clear()
        to_daemon.clear()
        to_client.extend(link.lost())

    while True:
        for line in _lines(from_daemon):
            if link.from_daemon(line):
                to_client += line + b"\n"
        while to_client:
            del to_client[:os.write(stdout, to_client)]
        if connection is None and not stdin_open:
            return
        if connection is not None:
            poller.register(connection, select.POLLIN | (select.POLLOUT if to_daemon else 0))
        if stdin_open:
            # Stop reading the client while the daemon is not taking what it sent.
            poller.modify(stdin, select.POLLIN if len(to_daemon) < 4 * CHUNK else 0)
        events = poller.poll(None if connection is not None else retry_s * 1000)
        if connection is None and not events:
            reconnected = link.reconnect()
            if reconnected is None:
                retry_s = min(2 * retry_s, RECONNECT_MAX_S)
            else:
                connection = connected(reconnected)
            continue
        for fd, event in events:
            if fd == stdin:
                data = os.read(stdin, CHUNK)
                if not data:
                    stdin_open = False
                    poller.unregister(stdin)
                    to_daemon += from_client  # an unfinished last line, as it is
                    continue
                from_client += data
                for line in _lines(from_client):
                    link.from_client(line)
                    to_daemon += line + b"\n"
                if connection is None and link.in_flight:
                    reconnected = link.reconnect()
                    if reconnected is None:
                        to_daemon.clear()
                        to_client.extend(link.lost())
                    else:
                        connection = connected(reconnected)
                continue
            if connection is None:
                continue
            try:
                if event & select.POLLOUT and to_daemon:
                    try:
                        del to_daemon[:connection.send(to_daemon)]
                    except BlockingIOError:
                        pass
                if event & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    try:
                        data = connection.recv(CHUNK)
                    except BlockingIOError:
                        continue
                    if not data:
                        if not stdin_open:
                            return
                        lose()
                        continue
                    from_daemon += data
            except (ConnectionResetError, BrokenPipeError):
                if not stdin_open:
                    return
                lose()
        if connection is None:
            to_daemon.clear()  # what was not sent is answered (`Link.lost`)
        elif not stdin_open and not to_daemon and not shut:
            shut = True
            try:
                connection.shutdown(socket.SHUT_WR)
            except OSError:
                return


def run(socket_path: str | None, session_id: str | None,
        environ: Mapping[str, str] | None = None, tools: str | None = None) -> int:
    """``ctxctl mcp``: 0 when the client hung up, 1 (with why on stderr) otherwise.
    ``tools``: ``--tools`` (None: the default set)."""
    environ = os.environ if environ is None else environ
    session_id = session_id or environ.get("CLAUDE_CODE_SESSION_ID") or None
    project = environ.get("CLAUDE_PROJECT_DIR") or None
    path = str(socket_path or default_socket_path(environ))
    try:
        sock = connect(socket_path, environ)
        with sock:
            rest = bind(sock, session_id, project, tools)
            pump(Link(path, session_id, project, tools), sock, sys.stdin.fileno(),
                 sys.stdout.fileno(), rest)
    except PumpError as exc:
        print(f"ctxctl mcp: {exc}", file=sys.stderr)
        return 1
    except (BrokenPipeError, ConnectionResetError):
        return 0
    except KeyboardInterrupt:
        return 130
    return 0

"""Client-side errors, one tree under `CtxdClientError`: `RpcError` and one subclass of it per
error code (docs/protocol.md, Errors), `DaemonUnavailable` when no daemon answers."""

from __future__ import annotations

import os
import stat
from typing import Any, ClassVar

from ctxclient._spawn import start_command
from ctxd import paths
from ctxd.errors import ErrorCode
from ctxd.paths import MAX_SOCKET_PATH


class CtxdClientError(Exception):
    """The base of every error the client raises about the daemon: catch it for any call
    that did not get an answer (``except CtxdClientError``), a subclass for one reason.

    ::

        CtxdClientError
        ├── RpcError               the daemon answered with an error
        │   └── NotFound, InvalidParams, …   one class per error code
        ├── DaemonUnavailable      no daemon answers (also a ConnectionError)
        │   └── BadSocketPath      none could: the path is wrong
        │       └── UntrustedSocket   not the user's own ctxd's
        └── PumpError              ctxctl mcp could not bind or pump (DaemonBusy: try again)
    """


class RpcError(CtxdClientError):
    """The daemon answered with a JSON-RPC error; the base of one class per code.

    Catch a subclass (``except NotFound``) for one code, or ``RpcError`` for any.
    """

    error_code: ClassVar[ErrorCode | None] = None
    """The code this class stands for (None: a code this client does not know)."""

    def __init__(self, code: int, message: str, data: Any = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data


class ParseError(RpcError):
    error_code = ErrorCode.PARSE_ERROR


class InvalidRequest(RpcError):
    error_code = ErrorCode.INVALID_REQUEST


class MethodNotFound(RpcError):
    error_code = ErrorCode.METHOD_NOT_FOUND


class InvalidParams(RpcError):
    error_code = ErrorCode.INVALID_PARAMS


class InternalError(RpcError):
    error_code = ErrorCode.INTERNAL_ERROR


class ContextLimitExceeded(RpcError):
    error_code = ErrorCode.CONTEXT_LIMIT_EXCEEDED


class BudgetExhausted(RpcError):
    error_code = ErrorCode.BUDGET_EXHAUSTED


class InvalidState(RpcError):
    error_code = ErrorCode.INVALID_STATE


class NotFound(RpcError):
    error_code = ErrorCode.NOT_FOUND


class LimitReached(RpcError):
    error_code = ErrorCode.LIMIT_REACHED


class Cancelled(RpcError):
    error_code = ErrorCode.CANCELLED


class Overloaded(RpcError):
    error_code = ErrorCode.OVERLOADED


class StorageError(RpcError):
    error_code = ErrorCode.STORAGE_ERROR


class Timeout(RpcError):
    error_code = ErrorCode.TIMEOUT


ERRORS: dict[int, type[RpcError]] = {
    int(cls.error_code): cls for cls in (
        ParseError, InvalidRequest, MethodNotFound, InvalidParams, InternalError,
        ContextLimitExceeded, BudgetExhausted, InvalidState, NotFound, LimitReached, Cancelled,
        Overloaded, StorageError, Timeout)
    if cls.error_code is not None}
"""The class of each error code."""


def rpc_error(code: int, message: str, data: Any = None) -> RpcError:
    """The exception for an error answer: its code's class, else `RpcError` itself."""
    return ERRORS.get(code, RpcError)(code, message, data)


class DaemonUnavailable(CtxdClientError, ConnectionError):
    """No daemon listens on the socket (or the connection was lost); still a
    `ConnectionError`, as it was before `CtxdClientError` existed."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"no ctxd daemon is running on {path} ({reason}); "
                         f"start it with `{start_command(socket=path)}`")
        self.path = path
        self.reason = reason


class BadSocketPath(DaemonUnavailable):
    """No daemon can listen at the path at all: it is too long, or not a socket."""

    def __init__(self, path: str, reason: str):
        super().__init__(path, reason)
        self.args = (f"{path} cannot be ctxd's socket: {reason}",)


class UntrustedSocket(BadSocketPath):
    """The socket is not the user's own ctxd's: its directory is another user's or open to
    others, or another user's process listens on it (docs/security.md, "Who serves the
    socket"). Nothing was sent to it."""

    def __init__(self, path: str, reason: str):
        super().__init__(path, reason)
        self.args = (reason,)


def check_socket_path(path: str) -> None:
    """Raise `BadSocketPath` when nothing could listen at ``path``, `UntrustedSocket` when
    whatever listens there may not be the user's own ctxd (``ctxd.paths``).

    A missing file or a refused connection says that no daemon runs there; these say that
    the path itself is wrong, which starting a daemon would not fix.
    """
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise BadSocketPath(path, f"the path is longer than {MAX_SOCKET_PATH} bytes; choose a "
                                  "shorter --socket or CTXD_SOCKET")
    try:
        mode = os.stat(path).st_mode
    except NotADirectoryError:
        raise BadSocketPath(path, "a parent of it is not a directory") from None
    except OSError:
        mode = None  # missing (no daemon), or unreadable: connecting says which
    if mode is not None and not stat.S_ISSOCK(mode):
        raise BadSocketPath(path, "it exists and is not a socket")
    try:
        paths.check_socket_directory(path)
    except paths.UntrustedSocket as exc:
        raise UntrustedSocket(path, str(exc)) from None


def check_server(sock: paths.Socket, path: str) -> None:
    """Raise `UntrustedSocket` unless the user's own process listens on the connected
    ``sock`` (SO_PEERCRED); before a byte is sent."""
    try:
        paths.check_peer(sock, path)
    except paths.UntrustedSocket as exc:
        raise UntrustedSocket(path, str(exc)) from None


def outcome(message: dict[str, Any]) -> Any:
    """The result of a response, or raise its error."""
    if "error" in message:
        error = message["error"] or {}
        raise rpc_error(int(error.get("code", -32603)), str(error.get("message", "")),
                        error.get("data"))
    return message.get("result")

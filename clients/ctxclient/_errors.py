"""Client-side errors: one `RpcError` subclass per error code (docs/protocol.md, Errors)."""

from __future__ import annotations

from typing import Any, ClassVar

from ctxd.errors import ErrorCode


class RpcError(Exception):
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


class DaemonUnavailable(ConnectionError):
    """No daemon listens on the socket (or the connection was lost)."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"no ctxd daemon is running on {path} ({reason}); start it with `ctxd`")
        self.path = path
        self.reason = reason


def outcome(message: dict[str, Any]) -> Any:
    """The result of a response, or raise its error."""
    if "error" in message:
        error = message["error"] or {}
        raise rpc_error(int(error.get("code", -32603)), str(error.get("message", "")),
                        error.get("data"))
    return message.get("result")

"""The JSON-RPC error codes of ctxd (docs/protocol.md, Errors), the exception that carries
them, and one constructor per kind of error."""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class ErrorCode(IntEnum):
    """Every error code a ctxd response can carry."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    CONTEXT_LIMIT_EXCEEDED = -32001
    BUDGET_EXHAUSTED = -32002
    INVALID_STATE = -32003
    NOT_FOUND = -32004
    LIMIT_REACHED = -32005
    CANCELLED = -32006
    OVERLOADED = -32007
    STORAGE_ERROR = -32008
    TIMEOUT = -32009


class CtxdError(Exception):
    """An error that becomes a JSON-RPC error response.

    Args:
        code: the error code.
        message: one sentence that says what went wrong and what to do.
        data: machine-readable details (ids, limits, the fix).
    """

    def __init__(self, code: ErrorCode, message: str, data: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def not_found(kind: str, ident: str, hint: str) -> CtxdError:
    """-32004: an unknown id of some kind (session, branch, …)."""
    return CtxdError(
        ErrorCode.NOT_FOUND, f"unknown {kind} {ident!r}", {kind + "_id": ident, "fix": hint}
    )


def params_error(path: str, reason: str) -> CtxdError:
    """-32602 for a bad field at ``path`` (``$.budget.warn``), with what is wrong."""
    return CtxdError(ErrorCode.INVALID_PARAMS, f"invalid params: {reason} (at {path})",
                     {"path": path, "reason": reason})


def invalid_state(message: str, fix: str, **data: Any) -> CtxdError:
    """-32003: the thing exists but is not in a state that allows this (a closed session, a
    discarded branch); ``data`` names it and says what it is in."""
    return CtxdError(ErrorCode.INVALID_STATE, message, data | {"fix": fix})


def limit_reached(limit: str, maximum: int, message: str, fix: str) -> CtxdError:
    """-32005: a configured limit (``limit``, at ``maximum``) would be passed."""
    return CtxdError(ErrorCode.LIMIT_REACHED, message, {"limit": limit, "max": maximum,
                                                        "fix": fix})


def shutting_down(what: str = "ctxd") -> CtxdError:
    """-32007: the daemon (or one of its parts) is stopping; the caller may retry."""
    return CtxdError(ErrorCode.OVERLOADED, f"{what} is shutting down; retry",
                     {"fix": "retry once the daemon is back"})


def scrub_failed(what: str, exc: Exception, consequence: str,
                 data: dict[str, Any] | None = None) -> CtxdError:
    """-32603: a text could not be checked for secrets, so it was not stored or shown
    (scrubbing fails closed: docs/security.md)."""
    return CtxdError(ErrorCode.INTERNAL_ERROR,
                     f"{what} could not be checked for secrets ({exc}); {consequence}",
                     (data or {}) | {"fix": "retry; report the error if it persists"})


def cancelled(request_id: Any, reason: str | None) -> CtxdError:
    """-32006: the request was cancelled (request.cancel) before it wrote anything."""
    because = f": {reason}" if reason else ""
    return CtxdError(ErrorCode.CANCELLED, f"request {request_id!r} was cancelled{because}",
                     {"request_id": request_id, "reason": reason,
                      "fix": "nothing was written; send the request again if still wanted"})


def internal_error(message: str, data: dict[str, Any] | None = None) -> CtxdError:
    """-32603: a bug, reported to the caller instead of taking the daemon down."""
    return CtxdError(ErrorCode.INTERNAL_ERROR, message, data)


__all__ = ["CtxdError", "ErrorCode", "cancelled", "internal_error", "invalid_state",
           "limit_reached", "not_found", "params_error", "scrub_failed", "shutting_down"]

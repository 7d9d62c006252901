"""The JSON-RPC error codes of ctxd (DESIGN §4) and the exception that carries them."""

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
    """An unknown id of some kind (session, branch, …)."""
    return CtxdError(
        ErrorCode.NOT_FOUND, f"unknown {kind} {ident!r}", {kind + "_id": ident, "fix": hint}
    )


__all__ = ["CtxdError", "ErrorCode", "not_found"]

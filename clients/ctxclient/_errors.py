"""Client-side errors."""

from __future__ import annotations

from typing import Any


class RpcError(Exception):
    """The daemon answered with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Any = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data


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
        raise RpcError(int(error.get("code", -32603)), str(error.get("message", "")),
                       error.get("data"))
    return message.get("result")

"""JSON-RPC 2.0 messages as the tests send them and the answers they expect (the shapes of
docs/protocol.md, "Errors"), for the dispatcher in-process and the daemon over its socket."""

from __future__ import annotations

import json
from typing import Any

from ctxd.errors import ErrorCode

PARSE_FIX = {"fix": "send valid UTF-8 JSON"}
INVALID_REQUEST_FIX = {"fix": 'send {"jsonrpc":"2.0","id":1,"method":"daemon.ping"}'}
NOT_FOUND_FIX = "check its id (session.list lists them), or open it with session.open"


def encode(message: Any) -> bytes:
    """Compact JSON, non-ASCII characters as raw UTF-8 (as most clients send them)."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()


def request(method: Any, params: Any = None, request_id: Any = 1) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


def notification(method: str, params: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    return message


def error(request_id: Any, code: int, message: str, data: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id,
            "error": {"code": code, "message": message, "data": data}}


def invalid_params(request_id: Any, path: str, reason: str) -> dict[str, Any]:
    return error(request_id, ErrorCode.INVALID_PARAMS, f"invalid params: {reason} (at {path})",
                 {"path": path, "reason": reason})


def invalid_request(request_id: Any, reason: str) -> dict[str, Any]:
    return error(request_id, ErrorCode.INVALID_REQUEST, f"invalid request: {reason}",
                 INVALID_REQUEST_FIX)


def assert_parse_error(reply: Any) -> None:
    """-32700 with id null; the message is msgspec's, so only its prefix is fixed."""
    assert reply == error(None, ErrorCode.PARSE_ERROR, reply["error"]["message"], PARSE_FIX)
    assert reply["error"]["message"].startswith("parse error: ")


def assert_pong(reply: Any, request_id: Any) -> None:
    assert reply == {"jsonrpc": "2.0", "id": request_id,
                     "result": {"pong": True, "ts": reply["result"]["ts"]}}
    assert isinstance(reply["result"]["ts"], float)


def same_id(left: Any, right: Any) -> bool:
    """JSON ids compare by type too: 1, 1.0, true and "1" are four different ids."""
    return type(left) is type(right) and left == right

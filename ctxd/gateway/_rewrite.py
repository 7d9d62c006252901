"""What the gateway sends for a request: its session, and the body with ctxd's
substitutions (docs/architecture.md, "Gateway").

This version substitutes nothing: the body sent is the agent's, re-encoded, and its
tokens are counted by component; the session is found by the identity rules and opened
when it does not exist.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from ctxd.sessions import SessionActor, Supervisor, session_open
from ctxd.wire.types import SessionOpenParams

Api = Literal["anthropic", "openai"]
Endpoint = Literal["messages", "count_tokens", "chat_completions"]
KEY_PREFIX = "gw-"
"""Sessions found by their conversation's key (no header, no Claude Code metadata)."""


@dataclass(frozen=True)
class GatewayRequest:
    api: Api
    endpoint: Endpoint
    session_header: str | None
    """The ``x-ctxd-session`` header's value, if any."""
    body: dict[str, Any]
    """The agent's JSON body, parsed."""


@dataclass(frozen=True)
class Prepared:
    session_id: str
    body: bytes
    """The JSON to send upstream."""
    tokens: dict[str, int]
    """ctxd's count of the sent body by `budget.measure` component: "system_prompt",
    "tool_descriptions", "conversation"."""
    removed_tokens: int
    """Tokens ctxd's substitutions took out of this request."""
    model: str | None


def _claude_code_session(body: dict[str, Any]) -> str | None:
    """``metadata.user_id``'s ``session_id`` (a JSON string, as Claude Code sends it)."""
    metadata = body.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
    if not isinstance(user_id, str):
        return None
    try:
        found = json.loads(user_id)
    except ValueError:
        return None
    session_id = found.get("session_id") if isinstance(found, dict) else None
    return session_id if isinstance(session_id, str) and session_id else None


def _first_user_message(body: dict[str, Any]) -> Any:
    for message in body.get("messages") or ():
        if isinstance(message, dict) and message.get("role") == "user":
            return message.get("content")
    return None


def session_of(request: GatewayRequest) -> str:
    """The request's session: ``x-ctxd-session``; else Claude Code's ``metadata.user_id``
    ``session_id``; else ``gw-`` and a hash of the system prompt and the first user
    message, which every request of one conversation repeats. Never raises."""
    if request.session_header:
        return request.session_header
    found = _claude_code_session(request.body)
    if found is not None:
        return found
    system = request.body.get("system")
    key = msgspec.json.encode([request.api, system, _first_user_message(request.body)])
    return KEY_PREFIX + hashlib.sha256(key).hexdigest()[:32]


async def _open(supervisor: Supervisor, session_id: str) -> None:
    async def exists(actor: SessionActor) -> bool:
        return actor.record is not None

    if not await supervisor.call(session_id, exists):
        await session_open(supervisor, SessionOpenParams(session_id=session_id))


async def prepare(supervisor: Supervisor, request: GatewayRequest) -> Prepared:
    """The session of ``request`` (opened if new) and the body to send for it.

    Raises:
        Exception: any failure; the gateway then sends the agent's own bytes.
    """
    session_id = session_of(request)
    await _open(supervisor, session_id)
    body = request.body
    parts = {"system_prompt": body.get("system"), "tool_descriptions": body.get("tools"),
             "conversation": body.get("messages")}
    texts = ["" if part is None else msgspec.json.encode(part).decode()
             for part in parts.values()]
    counts = await supervisor.services.counter.count_texts(texts)
    model = body.get("model")
    return Prepared(session_id=session_id, body=msgspec.json.encode(body),
                    tokens=dict(zip(parts, counts, strict=True)), removed_tokens=0,
                    model=model if isinstance(model, str) else None)

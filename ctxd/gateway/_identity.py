"""Which ctxd session a model request belongs to (docs/decisions.md, Gateway: identity)."""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

import msgspec

from ctxd.gateway._blocks import bare

if TYPE_CHECKING:
    from ctxd.gateway._rewrite import GatewayRequest

_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")
"""A session id as session.open takes it (ctxd.wire.types.SessionId)."""
_encode = msgspec.json.Encoder().encode


def _as_session_id(value: str) -> str:
    """``value`` if it is a valid session id, else ``gw-`` and a digest of it."""
    if _SESSION_ID.match(value):
        return value
    return "gw-" + hashlib.blake2b(value.encode("utf-8", "replace"),
                                   digest_size=12).hexdigest()


_USER_ID_SESSION = re.compile(r"_session_([0-9A-Za-z-]{8,64})\Z")
"""The session at the end of an older Claude Code's ``user_id``
(``user_<hash>_account_<uuid>_session_<uuid>``)."""


def _claude_code_session(body: dict[str, Any]) -> str | None:
    """``metadata.user_id``'s session: Claude Code sends a JSON string with its
    ``session_id`` (the id its hooks and MCP server see); older versions a string that
    ends with ``_session_<id>``."""
    metadata = body.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
    if not isinstance(user_id, str):
        return None
    try:
        decoded = msgspec.json.decode(user_id)
    except msgspec.DecodeError:
        found = _USER_ID_SESSION.search(user_id)
        return None if found is None else found.group(1)
    session_id = decoded.get("session_id") if isinstance(decoded, dict) else None
    return session_id if isinstance(session_id, str) and session_id else None


def conversation_key(body: dict[str, Any]) -> str:
    """``gw-`` and a digest of what starts the conversation and stays: the system prompt
    (the ``system`` field, or the leading system and developer messages) and the first
    user message, their ``cache_control`` marks left out."""
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    system: list[Any] = [body.get("system")]
    first_user = None
    for message in messages:
        if not isinstance(message, dict):
            continue
        if message.get("role") in ("system", "developer") and first_user is None:
            system.append(bare(message))
        elif message.get("role") == "user":
            first_user = bare(message)
            break
    if isinstance(system[0], list):
        system[0] = bare({"content": system[0]})["content"]
    digest = hashlib.blake2b(_encode([system, first_user]), digest_size=12)
    return "gw-" + digest.hexdigest()


def session_of(request: GatewayRequest) -> str:
    """The request's session: the ``x-ctxd-session`` header; else Claude Code's
    ``metadata.user_id`` ``session_id``; else the conversation's key (`conversation_key`).
    A header or id that is not a valid session id stands as ``gw-`` and its digest.
    Never raises."""
    try:
        if request.session_header:
            return _as_session_id(request.session_header)
        claude_code = _claude_code_session(request.body)
        if claude_code is not None:
            return _as_session_id(claude_code)
        return conversation_key(request.body)
    except (RecursionError, msgspec.EncodeError):
        # A body too deeply nested to encode: one key for all of them.
        return "gw-unreadable"

"""The model gateway: an Anthropic and OpenAI API base URL on loopback that forwards each
model call to its provider with the session's context management applied
(docs/architecture.md, "Gateway"; its threat model: docs/security.md)."""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from ctxd.gateway._rewrite import GatewayRequest, Prepared, prepare, session_of
from ctxd.gateway._server import Gateway, bind
from ctxd.gateway._usage import ProviderUsage, UsageReader

TOKEN_FILE = "gateway.token"


def load_token(data_dir: Path) -> str:
    """The gateway's secret path segment, from ``gateway.token`` in the data directory
    (made, 0600, on first use: 32 random bytes, URL-safe base64). It persists: agents'
    settings files hold the base URL."""
    path = data_dir / TOKEN_FILE
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        os.chmod(path, 0o600, follow_symlinks=False)
        saved = path.read_text(encoding="ascii").strip()
        if re.fullmatch(r"[A-Za-z0-9_-]{32,}", saved):
            return saved
        os.unlink(path)  # empty, cut short by a crash, or edited badly: a new one
        return load_token(data_dir)
    token = secrets.token_urlsafe(32)
    with os.fdopen(descriptor, "w", encoding="ascii") as file:
        file.write(token + "\n")
    return token


__all__ = ["TOKEN_FILE", "Gateway", "GatewayRequest", "Prepared", "ProviderUsage",
           "UsageReader", "bind", "load_token", "prepare", "session_of"]

"""How the Python clients write a message: one line of compact JSON."""

from __future__ import annotations

import json
from typing import Any

import msgspec

_encode = msgspec.json.Encoder().encode


def encode(message: Any) -> bytes:
    """``message`` as JSON text (no newline).

    A str may hold a lone surrogate (``json.loads`` keeps ``"\\ud83d"`` as one), which UTF-8
    cannot encode: such a message is written with every non-ASCII character escaped, as
    JavaScript's ``JSON.stringify`` writes it, and the daemon reads each lone surrogate as
    U+FFFD (docs/protocol.md, "Framing").
    """
    try:
        return _encode(message)
    except UnicodeEncodeError:
        return json.dumps(msgspec.to_builtins(message), separators=(",", ":")).encode()

"""What a parser yields for one record of a transcript (a line, or an OpenCode message)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ctxd.transcripts._split import Piece
from ctxd.wire.types import MessageIn

TOKEN_COUNT_MAX = (1 << 63) - 1
"""The largest count a usage record stores (an SQLite integer)."""


def token_count(value: Any) -> int:
    """A transcript's token count: 0 for what is not one (not an integer, negative, or past
    what a usage record stores: one bad number must not fail the import)."""
    return value if isinstance(value, int) and not isinstance(value, bool) \
        and 0 <= value <= TOKEN_COUNT_MAX else 0


@dataclass(frozen=True)
class Usage:
    """One API response's token usage, keyed by the response's id (the idempotency key)."""

    key: str
    model: str | None
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    thinking_tokens: int = 0


@dataclass
class Entry:
    """One record: the messages it becomes, in order, on which thread.

    ``thread`` is None for the main thread, else the key of the sub-agent whose branch
    holds it. ``kind`` is ``message`` (``messages`` may still be empty: a thinking-only
    record), ``unknown`` (a record type the parser does not know: kept as ``unknown_type``),
    or ``malformed`` (``error`` says why; nothing imported).
    """

    line: int
    end: int
    kind: str
    thread: str | None = None
    messages: list[MessageIn] = field(default_factory=list)
    usage: Usage | None = None
    unknown_type: str | None = None
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


def unreadable(piece: Piece, limit: int, end: int) -> Entry | None:
    """The malformed entry of a record a splitter cut out that holds nothing to decode: one
    longer than ``limit`` bytes (its bytes were not kept; its size is told), or an empty
    array element; None for any other."""
    if piece.data is None:
        return Entry(line=piece.line, end=end, kind="malformed",
                     error=f"a record of {piece.size:,} bytes, over the {limit:,} a record "
                           "may have (max_request_bytes): skipped")
    if not piece.data.strip():
        return Entry(line=piece.line, end=end, kind="malformed", error="an empty element")
    return None

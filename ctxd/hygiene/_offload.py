"""Offloaded tool results: the ``tool_result_blobs`` table, the stub a large tool result
renders as, and `result.read`'s pages and line search (docs/protocol.md, "Offloaded tool
results")."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import apsw
import msgspec
import regex
import trio

from ctxd.errors import params_error
from ctxd.store import Transaction
from ctxd.wire.types import Content, LineMatch, MessageIn

EXCERPT_CHARS = 600
"""The most characters of the result a stub shows (its excerpt: head, error lines, tail,
and the markers of what it skips between them)."""
HEAD_SHARE_CHARS = 180
"""The excerpt's share for the result's first lines; as much for its last lines. What they
leave of `EXCERPT_CHARS` goes to the lines that show an error."""
EXCERPT_LINE_CHARS = 160
"""The most characters of one error line the excerpt shows (cut around its error word)."""
ERROR_CONTEXT_CHARS = 40
"""Characters kept before an error word in a cut error line."""
MAX_ERROR_LINES = 8
"""The most error lines an excerpt looks at (the first ones, in the result's order)."""
ERROR_WORDS = ("error", "Error", "ERROR", "failed", "FAIL", "exception", "traceback")
"""Words (case-sensitive) that show an error in a tool result's text: the offload stub
keeps the lines that hold one, and the fork pipeline cuts such a text head+tail (its cause
is often at the end). ``FAIL`` is a test runner's verdict (``FAIL: test_x``, ``FAILED``)."""
OWN_TOOL_PREFIXES = ("mcp__ctxd__", "ctxd_")
"""How ctxd's own MCP tools are named by the agents that call them: Claude Code
(``mcp__ctxd__read_result``) and OpenCode (``ctxd_read_result``), for the server name
``ctxctl install`` writes. Their answers are never offloaded: a `read_result` page that
became a stub would hide the very text the model asked for."""
ERROR_INLINE_FACTOR = 4
"""An error result stays inline up to this many times ``offload_threshold_bytes``; beyond
it, it is offloaded like any result (its stub keeps the error lines)."""
LINE_CHARS = 1_000
"""Characters shown of one matching line: `result.read`'s output stays bounded however
long the blob's lines are."""

_encode = msgspec.json.Encoder().encode
_decode_content = msgspec.json.Decoder(Content).decode


@dataclass(frozen=True)
class ToolResultBlob:
    """A tool result stored whole; the message at ``seq`` carries its stub."""

    ref_id: str
    tool_name: str | None
    size_bytes: int
    text: str
    """What `result.read` serves: the content, or its text parts joined by newlines."""
    parts: list[dict[str, Any]] | None
    """The content as given when it was a list of parts (``message.list`` shows it)."""
    seq: int = 0
    branch_id: str | None = None
    created_at: float = 0.0

    def placed(self, seq: int, branch_id: str | None, created_at: float) -> ToolResultBlob:
        """The blob of the message stored at ``seq``."""
        return dataclasses.replace(self, seq=seq, branch_id=branch_id, created_at=created_at)


@dataclass(frozen=True)
class BlobInfo:
    """A stored blob as `result.read` reads it."""

    tool_name: str | None
    size_bytes: int
    text: str
    seq: int
    branch_id: str | None


class ToolResultLike(Protocol):
    """A message as `is_error_result` reads it."""

    @property
    def meta(self) -> dict[str, Any] | None: ...

    @property
    def content(self) -> Content: ...


def is_error_result(message: ToolResultLike) -> bool:
    """Whether a tool message reports an error: ``meta.is_error`` is true, or one of its
    content parts has ``is_error: true`` (as Anthropic's ``tool_result`` blocks do). Error
    results stay inline up to a larger bound (`offload`; docs/decisions.md, Hygiene)."""
    if message.meta is not None and message.meta.get("is_error") is True:
        return True
    return not isinstance(message.content, str) and any(
        part.get("is_error") is True for part in message.content)


def _result_text(content: Content) -> str | None:
    """The text of a tool result, or None when a part is not text (kept inline)."""
    if isinstance(content, str):
        return content
    if all(part.get("type") == "text" and isinstance(part.get("text"), str)
           for part in content):
        return "\n".join(part["text"] for part in content)
    return None


def is_own_tool(name: str | None) -> bool:
    """Whether a tool is one of ctxd's own MCP tools, as an agent names it
    (`OWN_TOOL_PREFIXES`)."""
    return name is not None and name.startswith(OWN_TOOL_PREFIXES)


def result_size(content: Content) -> int:
    """UTF-8 bytes of a tool result as it was given (its text, or its parts' JSON)."""
    text = _result_text(content)
    return len((text if text is not None else _encode(content).decode()).encode())


STUB_PREFIX = "[Tool result stored — "
"""How an offloaded result's stub starts."""


def stub_text(size_bytes: int, tool_name: str | None, text: str, ref_id: str) -> str:
    """What an offloaded result renders as (docs/protocol.md, "Offloaded tool results"):
    its size, its lines, its `excerpt`, and the MCP tool and the shell command that read it
    back, so an agent without ctxd's tools (its model calls reach ctxd through the gateway)
    can still read it. A function of its arguments only: a stub is sent as it was first
    sent (a prompt cache holds it)."""
    source = f' from "{tool_name}"' if tool_name else ""
    lines = _line_count(text)
    return (f"{STUB_PREFIX}{size_bytes:,} bytes, {lines:,} line{'' if lines == 1 else 's'}"
            f"{source}. First and last lines, and lines with errors:\n{excerpt(text)}\n] "
            f"Use read_result with ref_id=\"{ref_id}\" (or run: ctxctl result {ref_id}) to "
            "read more.")


def _line_count(text: str) -> int:
    """Lines of ``text`` (a final newline ends the last line, it does not start one)."""
    return text.count("\n") + (0 if text.endswith("\n") else 1)


@dataclass(frozen=True)
class _Piece:
    """A line of the result, or a part of one, as the excerpt shows it."""

    start: int
    """Where its line starts in the text."""
    end: int
    """Where its line ends (its newline, or the text's end)."""
    shown: str
    line: int = 0
    """Its line's index (worked out for the pieces an excerpt may show, in one pass)."""


def excerpt(text: str) -> str:
    """What a stub shows of ``text``, at most `EXCERPT_CHARS` characters: its first lines
    (up to `HEAD_SHARE_CHARS`), the lines between that hold one of `ERROR_WORDS` (the first
    ones, each cut to `EXCERPT_LINE_CHARS` around its word), then its last lines (up to as
    many), one a line, with ``[… N lines …]`` where lines are skipped. A line longer than
    a share is cut (``…`` marks the cut). Deterministic; linear in the text."""
    end = len(text) - 1 if text.endswith("\n") else len(text)
    if end <= 0:
        return ""
    head = _head(text, end)
    tail = _tail(text, end, head)
    middle_start = head[-1].end + 1
    middle_end = tail[0].start - 1 if tail else middle_start
    errors = _error_lines(text, middle_start, middle_end)
    numbered = []
    line = at = 0
    for piece in sorted(head + errors + tail, key=lambda p: p.start):
        line += text.count("\n", at, piece.start)
        at = piece.start
        numbered.append(dataclasses.replace(piece, line=line))
    head = numbered[:len(head)]
    tail = numbered[len(numbered) - len(tail):]
    pieces = head + tail
    shown = _render(pieces)
    for piece in numbered[len(head):len(numbered) - len(tail)]:
        widened = sorted([*pieces, piece], key=lambda p: p.start)
        rendered = _render(widened)
        if len(rendered) > EXCERPT_CHARS:
            break
        pieces, shown = widened, rendered
    return shown


def _line_end(text: str, start: int, end: int) -> int:
    found = text.find("\n", start, end)
    return end if found < 0 else found


def _head(text: str, end: int) -> list[_Piece]:
    """The first lines, at least a part of the first one."""
    pieces: list[_Piece] = []
    used = 0
    start = 0
    while start <= end:
        stop = _line_end(text, start, end)
        if used + stop - start > HEAD_SHARE_CHARS:
            if not pieces:
                pieces.append(_Piece(start, stop, text[start:start + HEAD_SHARE_CHARS - 1]
                                     + "…"))
            break
        pieces.append(_Piece(start, stop, text[start:stop]))
        used += stop - start + 1
        start = stop + 1
    return pieces


def _tail(text: str, end: int, head: list[_Piece]) -> list[_Piece]:
    """The last lines after the head's, at least the end of the last one; of a line the
    head cut, only what it did not show."""
    last = head[-1]
    shown_to = last.start + len(last.shown) - 1 if last.shown.endswith("…") else last.end
    pieces: list[_Piece] = []
    used = 0
    stop = end
    while stop > shown_to:
        start = text.rfind("\n", 0, stop) + 1
        if start <= last.start or used + stop - start > HEAD_SHARE_CHARS:
            if not pieces:
                first = max(shown_to, start, stop - HEAD_SHARE_CHARS + 1)
                pieces.append(_Piece(start, stop, ("…" if first > start else "")
                                     + text[first:stop]))
            break
        pieces.append(_Piece(start, stop, text[start:stop]))
        used += stop - start + 1
        stop = start - 1
    pieces.reverse()
    return pieces


def _error_lines(text: str, start: int, end: int) -> list[_Piece]:
    """The first `MAX_ERROR_LINES` lines between ``start`` and ``end`` that hold one of
    `ERROR_WORDS`, in order, each cut around its first error word."""
    if start >= end:
        return []
    found: dict[int, tuple[int, int]] = {}  # line start -> (line end, first word there)
    for word in ERROR_WORDS:
        at = text.find(word, start, end)
        lines = 0
        while at >= 0 and lines < MAX_ERROR_LINES:
            line_start = text.rfind("\n", start, at) + 1 or start
            line_end = _line_end(text, at, end)
            known = found.get(line_start)
            found[line_start] = (line_end, at if known is None else min(at, known[1]))
            lines += 1
            at = text.find(word, line_end + 1, end)
    pieces = []
    for line_start in sorted(found)[:MAX_ERROR_LINES]:
        line_end, at = found[line_start]
        if line_end - line_start <= EXCERPT_LINE_CHARS:
            shown = text[line_start:line_end]
        else:
            first = max(line_start, at - ERROR_CONTEXT_CHARS)
            room = EXCERPT_LINE_CHARS - (first > line_start)
            last = min(line_end, first + room)
            if last < line_end:
                last -= 1
            shown = ("…" if first > line_start else "") + text[first:last] + (
                "…" if last < line_end else "")
        pieces.append(_Piece(line_start, line_end, shown))
    return pieces


def _render(pieces: list[_Piece]) -> str:
    """The pieces one a line, with a marker of the lines skipped between two of them."""
    lines = [pieces[0].shown]
    for before, piece in itertools.pairwise(pieces):
        skipped = piece.line - before.line - 1
        if skipped > 0:
            lines.append(f"[… {skipped:,} line{'' if skipped == 1 else 's'} …]")
        lines.append(piece.shown)
    return "\n".join(lines)


def ref_id_for(session_id: str, seq: int) -> str:
    """The ref_id of the blob of message ``seq`` of a session: ``res_`` and the first 16
    hex digits of a BLAKE2b hash of the two. Derived, not random, so that the same session
    renders (and counts) the same tokens every time (docs/decisions.md, "Replay: context
    saved"); unique, as a message has at most one blob."""
    digest = hashlib.blake2b(f"{session_id}\0{seq}".encode(), digest_size=8)
    return "res_" + digest.hexdigest()


OFF_LOOP_CHARS = 1 << 20
"""A tool result with a longer text is offloaded in a worker thread: its stub's excerpt
scans the whole text for error words (about 3 ms a MB), which the event loop must not
wait for."""


async def offload_off_loop(message: MessageIn, threshold_bytes: int, session_id: str,
                           seq: int) -> tuple[MessageIn, ToolResultBlob] | None:
    """`offload`, in a worker thread when the message's text is over `OFF_LOOP_CHARS`."""
    if isinstance(message.content, str) and len(message.content) > OFF_LOOP_CHARS:
        return await trio.to_thread.run_sync(offload, message, threshold_bytes, session_id,
                                             seq)
    return offload(message, threshold_bytes, session_id, seq)


def offload(message: MessageIn, threshold_bytes: int, session_id: str,
            seq: int) -> tuple[MessageIn, ToolResultBlob] | None:
    """The stub message and the blob that replace a tool result over ``threshold_bytes``
    (UTF-8 bytes of its text; `ERROR_INLINE_FACTOR` times that for an error result),
    message ``seq`` of the session (its blob's ref is `ref_id_for` them, worked out only
    then: most messages stay inline); None when it stays inline (not a tool message, the
    answer of one of ctxd's own tools, small, or with parts that are not text)."""
    if message.role != "tool" or is_own_tool(message.name):
        return None
    if is_error_result(message):
        threshold_bytes *= ERROR_INLINE_FACTOR
    text = _result_text(message.content)
    # A character takes 1 to 4 bytes: most texts are decided without encoding them.
    if text is None or len(text) * 4 <= threshold_bytes:
        return None
    size = len(text.encode())
    if size <= threshold_bytes:
        return None
    ref_id = ref_id_for(session_id, seq)
    stub = msgspec.structs.replace(
        message, content=stub_text(size, message.name, text, ref_id))
    return stub, ToolResultBlob(ref_id=ref_id, tool_name=message.name, size_bytes=size,
                                text=text, parts=None if isinstance(message.content, str)
                                else message.content)


def stage_blobs(transaction: Transaction, session_id: str,
                blobs: Sequence[ToolResultBlob]) -> None:
    """Add the blobs' insert to a transaction, after the messages that carry their stubs
    (nothing when there is none: an empty insert still costs the store's thread a statement)."""
    if blobs:
        transaction.add(insert_blobs, session_id, list(blobs))


def insert_blobs(conn: apsw.Connection, session_id: str,
                 blobs: Sequence[ToolResultBlob]) -> None:
    conn.executemany(
        "INSERT INTO tool_result_blobs (ref_id, session_id, seq, branch_id, tool_name, "
        "size_bytes, text, parts, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(b.ref_id, session_id, b.seq, b.branch_id, b.tool_name, b.size_bytes, b.text,
          None if b.parts is None else _encode(b.parts), b.created_at) for b in blobs])


def originals(conn: apsw.Connection, session_id: str,
              seqs: Sequence[int]) -> dict[int, tuple[str, Content]]:
    """The ref and whole content of the offloaded results among messages ``seqs``."""
    if not seqs:
        return {}
    found: dict[int, tuple[str, Content]] = {}
    for seq, ref_id, text, parts in conn.execute(
            "SELECT seq, ref_id, text, parts FROM tool_result_blobs WHERE session_id = ? "
            "AND seq IN (SELECT value FROM json_each(?))", (session_id, _encode(list(seqs)))):
        found[seq] = (ref_id, text if parts is None else _decode_content(parts))
    return found


def blob_refs(conn: apsw.Connection, session_id: str,
              seqs: Sequence[int]) -> dict[int, tuple[str, int]]:
    """The ref and size of the offloaded results among messages ``seqs``."""
    if not seqs:
        return {}
    return {seq: (ref_id, size) for seq, ref_id, size in conn.execute(
        "SELECT seq, ref_id, size_bytes FROM tool_result_blobs WHERE session_id = ? "
        "AND seq IN (SELECT value FROM json_each(?))", (session_id, _encode(list(seqs))))}


def load_blob(conn: apsw.Connection, session_id: str, ref_id: str) -> BlobInfo | None:
    """The blob ``ref_id`` of the session (None when it has none of that ref)."""
    rows = conn.execute(
        "SELECT tool_name, size_bytes, text, seq, branch_id FROM tool_result_blobs "
        "WHERE ref_id = ? AND session_id = ?", (ref_id, session_id)).fetchall()
    if not rows:
        return None
    row: Any = rows[0]
    return BlobInfo(tool_name=row[0], size_bytes=row[1], text=row[2], seq=row[3],
                    branch_id=row[4])


def blob_session(conn: apsw.Connection, ref_id: str) -> str | None:
    """The session that holds the blob ``ref_id`` (None when no session does)."""
    rows = conn.execute("SELECT session_id FROM tool_result_blobs WHERE ref_id = ?",
                        (ref_id,)).fetchall()
    return str(rows[0][0]) if rows else None


def page(text: str, offset: int, limit: int) -> tuple[str, int | None]:
    """``limit`` characters from ``offset`` (code points: a page never splits one) and
    where the next page starts (None at the end)."""
    end = offset + limit
    return text[offset:end], end if end < len(text) else None


def compile_pattern(pattern: str, literal: bool) -> regex.Pattern[str]:
    """``pattern`` as a regular expression (``literal``: matched as plain text).

    The `regex` module (tiktoken's own dependency), not `re`: its searches take a timeout
    and release the GIL, where a pattern that backtracks without end in `re` would hold
    every thread of the daemon, the event loop's too (docs/decisions.md, Hygiene). Its
    default syntax (``V0``) is `re`'s.

    Raises:
        CtxdError: -32602 when it is not a valid regular expression.
    """
    try:
        return regex.compile(regex.escape(pattern) if literal else pattern, regex.MULTILINE)
    except regex.error as exc:
        raise params_error("$.pattern", f"not a valid regular expression ({exc}); fix it, "
                                        "or pass literal=true to search for the text as "
                                        "it is") from exc


def grep(text: str, pattern: regex.Pattern[str], max_matches: int,
         timeout_s: float) -> tuple[list[LineMatch], int]:
    """The lines of ``text`` that ``pattern`` matches, numbered from 1 like ``grep -n``
    (at most ``max_matches``, each cut at `LINE_CHARS`), and how many lines match in all.

    One scan of the whole text (a match is on the line where it starts), skipping to the
    next line after each match: linear in the text, whatever the number of lines. Runs
    without the GIL (call it in a worker thread).

    Raises:
        TimeoutError: the search took more than ``timeout_s`` in all.
    """
    deadline = time.monotonic() + timeout_s
    matches: list[LineMatch] = []
    matched = 0
    line = 1
    counted_to = 0
    position = 0
    while position < len(text):
        found = pattern.search(text, position, concurrent=True,
                               timeout=max(0.0, deadline - time.monotonic()))
        if found is None:
            break
        start = text.rfind("\n", 0, found.start()) + 1
        end = text.find("\n", found.start())
        if end < 0:
            end = len(text)
        line += text.count("\n", counted_to, start)
        counted_to = start
        matched += 1
        if len(matches) < max_matches:
            matches.append(LineMatch(line=line, text=text[start:min(end, start + LINE_CHARS)],
                                     truncated=end - start > LINE_CHARS))
        position = end + 1
    return matches, matched

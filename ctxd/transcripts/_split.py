"""A transcript's records cut out of its bytes as they are read, a chunk at a time: JSONL
lines, or the elements of one top-level JSON array (docs/protocol.md, "transcript.import").

Memory is one record at most: a record longer than the limit is not kept, only its size
(the importer reports it and skips it). Nothing here decodes JSON: a splitter only finds
where each record starts and ends, and the parser decodes each one by itself, so a bad
record is that record's failure, never the file's.
"""

from __future__ import annotations

import re
from typing import NamedTuple


class Piece(NamedTuple):
    """One record's bytes (``data``; None when it is longer than the limit), its position
    (``line``: a JSONL line's 1-based number, or an array element's 1-based index), the
    byte offset just after it (``end``) and its length in bytes (``size``)."""

    line: int
    end: int
    data: bytes | None
    size: int


class _Pending:
    """The bytes of a record not ended yet, kept while they fit the limit."""

    def __init__(self, limit: int, seen: int = 0) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = seen
        """Bytes of the record so far (a record resumed past the limit starts with them)."""

    def add(self, data: bytes) -> None:
        self.size += len(data)
        if self.size <= self.limit:
            self.parts.append(data)
        else:
            self.parts.clear()

    def take(self, last: bytes) -> tuple[bytes | None, int]:
        """The record ended by ``last``: its bytes (None over the limit) and size."""
        if not self.size:  # all of it in one chunk: the common case
            return (last if len(last) <= self.limit else None), len(last)
        size = self.size + len(last)
        data = None if size > self.limit else b"".join([*self.parts, last])
        self.parts.clear()
        self.size = 0
        return data, size


class LineSplitter:
    """The lines of a JSONL file from a given position: each complete line once its newline
    is read; a trailing line without one stays pending (a file being written).

    Args:
        offset: the byte offset of the first line to read (where the pending line began).
        line: that line's 1-based number.
        limit: the longest line kept, in bytes; a longer one is yielded with ``data`` None.
        seen: bytes of that first line already read, by an earlier import, without a
            newline among them; the caller reads on from ``offset + seen``. Only a line
            already over the limit is resumed so (a shorter one is read again whole).
    """

    def __init__(self, offset: int, line: int, limit: int, seen: int = 0) -> None:
        self.offset = offset
        """Where the pending line began: the position an import commits."""
        self.line = line
        self._pending = _Pending(limit, seen)

    @property
    def pending_bytes(self) -> int:
        """Bytes of the pending line read so far (no newline among them)."""
        return self._pending.size

    def feed(self, chunk: bytes) -> list[Piece]:
        """The lines ``chunk`` completes, blank ones left out (they count as lines)."""
        pieces = []
        start = 0
        while (newline := chunk.find(b"\n", start)) >= 0:
            data, size = self._pending.take(chunk[start:newline])
            end = self.offset + size + 1
            if data is None or data.strip():
                pieces.append(Piece(self.line, end, data, size))
            self.offset, self.line, start = end, self.line + 1, newline + 1
        self._pending.add(chunk[start:])
        return pieces


_STRING = rb'"(?:[^"\\]++|\\.)*+"'
_ELEMENT_END = re.compile(rb"(?:" + _STRING + rb'|[^"\[\]{},]++)*+([\[{]++|[\]}]++|,)',
                          re.DOTALL)
"""Up to the next bytes that change the depth (a run of openers, or of closers) or end an
element (a comma), whole strings skipped: at the array's own depth."""
_NESTED_END = re.compile(rb"(?:" + _STRING + rb'|[^"\[\]{}]++)*+([\[{]++|[\]}]++)',
                         re.DOTALL)
"""The same inside an element, where commas do not matter."""
_UNSTRUCTURED = re.compile(rb"(?:" + _STRING + rb'|[^"\[\]{}]++)*+', re.DOTALL)
"""What neither pattern can pass: the bytes up to a string the chunk does not close."""
_STRING_BODY = re.compile(rb'(?:[^"\\]++|\\.)*+', re.DOTALL)
"""The rest of a string up to its closing quote (or a backslash ending the chunk)."""
_BLANK = b" \t\r\n"


class ArraySplitter:
    """The elements of a file holding one JSON array (``[record, …]``), from its start.

    It tracks strings (and their escapes) and brackets over the chunks: an element ends at
    a comma or at the array's ``]`` met outside any string at the array's own depth. What
    an element holds is not checked here (the parser decodes each one), so one broken
    element costs itself; brackets that do not balance inside one make it run on to the
    next one that does, or to the end of the file.

    Args:
        limit: the longest element kept, in bytes; a longer one is yielded with ``data``
            None.
    """

    def __init__(self, limit: int) -> None:
        self._pending = _Pending(limit)
        self.count = 0
        """Elements ended so far (blank ones included: they are reported)."""
        self.closed = False
        """Whether the array's ``]`` was read."""
        self._offset = 0
        self._depth = 0
        self._in_string = False
        self._escape = False

    def feed(self, chunk: bytes) -> list[Piece]:
        """The elements ``chunk`` ends (an empty one, ``[1,,2]``, with ``data`` b"")."""
        pieces: list[Piece] = []
        start = 0
        position = 0
        size = len(chunk)
        while position < size and not self.closed:
            if self._in_string:
                if self._escape:
                    position, self._escape = position + 1, False
                    continue
                body = _STRING_BODY.match(chunk, position)
                position = body.end() if body else position
                if position == size:
                    break
                if chunk[position] == 0x22:  # the closing quote
                    self._in_string = False
                else:  # a backslash, the chunk's last byte: its escaped byte comes next
                    self._escape = True
                position += 1
                continue
            found = (_ELEMENT_END if self._depth <= 1 else _NESTED_END).match(chunk, position)
            if found is None:  # no such byte before the chunk's end, or a string open at it
                position = _UNSTRUCTURED.match(chunk, position).end()  # type: ignore[union-attr]
                if position < size:  # the opening quote of a string the chunk does not close
                    self._in_string, position = True, position + 1
                continue
            at, position = found.span(1)
            byte = chunk[at]
            if byte in b"[{":  # a run: nesting 100,000 deep is one step
                if self._depth == 0:  # the array opens: its first element starts after it
                    start = at + 1
                self._depth += position - at
            elif byte in b"]}":
                if position - at < self._depth:
                    self._depth -= position - at
                else:  # the array's own ] is in the run
                    at += self._depth - 1
                    self._depth, self.closed = 0, True
                    self._end(pieces, chunk[start:at], at, blank_ok=True)
            elif self._depth == 1:  # a comma
                self._end(pieces, chunk[start:at], at, blank_ok=False)
                start = position
        if not self.closed and self._depth >= 1:
            self._pending.add(chunk[start:])
        self._offset += size
        return pieces

    def _end(self, pieces: list[Piece], last: bytes, at: int, *, blank_ok: bool) -> None:
        """An element ended at ``at`` in the chunk (``blank_ok``: by the ``]``, where
        nothing is no element: ``[]`` or a trailing comma)."""
        data, size = self._pending.take(last)
        if data is not None and not data.strip(_BLANK):
            if blank_ok:
                return
            data = b""
        self.count += 1
        pieces.append(Piece(self.count, self._offset + at, data, size))


__all__ = ["ArraySplitter", "LineSplitter", "Piece"]

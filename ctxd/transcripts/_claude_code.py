"""Claude Code's JSONL transcript, line by line, as ctxd messages (docs/protocol.md,
"transcript.import").

One line is one record: ``user`` and ``assistant`` records carry an API ``message``; an
assistant response spans one line per content block, all with the same ``message.id`` and
the same ``usage`` (counted once). Records link through ``uuid``/``parentUuid``;
``isSidechain`` records belong to a sub-agent, a chain of its own. A ``system`` record with
``subtype: compact_boundary`` starts a new root after a compaction; the ``user`` record
after it with ``isCompactSummary`` holds the summary. Other record types (``summary``,
``file-history-snapshot``, hook ``system`` records …) are kept by type, never an error.

The same records saved as one JSON array (``[record, …]``) are read element by element
(`ctxd.transcripts.ArraySplitter`): a record's ``line`` is then its 1-based index in the
array.

A record is decoded by itself (`decode_record`): an escaped lone surrogate (``\\ud83d``,
half an emoji as JavaScript writes it) becomes U+FFFD; a record that is not JSON, nested
too deep to read, or longer than the limit (`ClaudeCodeParser.parse_piece`) is a malformed
entry and the records after it are read as usual.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import msgspec

from ctxd.transcripts._model import Entry, Usage, token_count, unreadable
from ctxd.transcripts._split import Piece
from ctxd.wire import replace_lone_surrogates
from ctxd.wire.types import MessageIn

PERSISTED_OUTPUT = "<persisted-output>"
"""How the result starts when Claude Code saved a large output to a file and shows the
model a preview of it (its ``toolUseResult.persistedOutputPath`` names the file)."""
_SAVED_TO = re.compile(r"Full output saved to: (/[^\n]+)\n")
_PREVIEW = "Preview (first 2KB):\n"
_PREVIEW_ENDS = ("\n...\n</persisted-output>", "\n</persisted-output>")
TOOL_USE_RESULT_MAX = 4096
"""A ``toolUseResult`` up to this many bytes of JSON is kept whole in the tool message's
meta; a larger one (it mostly repeats the result's content) is kept as its size."""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = []
    for block in content:
        if isinstance(block, dict):
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif isinstance(block.get("type"), str):
                texts.append(f"[{block['type']}]")
    return "\n".join(texts)


def decode_record(raw: bytes) -> Any:
    """One record's JSON, each escaped lone surrogate read as U+FFFD (docs/protocol.md,
    "transcript.import"): the text it gives can be stored and sent like any other.

    Raises:
        ValueError: not JSON (a number out of range included), or nested too deep to read
            (the reason is the message).
    """
    raw = replace_lone_surrogates(raw)
    try:
        return msgspec.json.decode(raw)
    except RecursionError:
        raise ValueError("nested too deep to read") from None


class ClaudeCodeParser:
    """Turns complete lines into entries; keeps what links lines across calls (tool names,
    sub-agent chains, usage already counted), so a file can be fed in pieces."""

    def __init__(self) -> None:
        self.tool_names: dict[str, str] = {}
        self.agent_of: dict[str, str] = {}
        self.usage_seen: set[str] = set()
        self._boundary: dict[str, Any] | None = None
        self.persisted: Callable[[str], str | None] | None = None
        """Reads the file Claude Code saved a large output to (None: no file is read; the
        preview is the result)."""

    def feed(self, data: bytes, base: int, first_line: int) -> tuple[list[Entry], int]:
        """Parse the complete lines of ``data`` (the file's bytes from offset ``base``,
        starting at 1-based line ``first_line``).

        Returns:
            The entries of the non-blank lines, and the bytes consumed: up to the last
            newline (a trailing partial line, a file being written, is left for later).
        """
        entries = []
        position = 0
        line = first_line
        while True:
            newline = data.find(b"\n", position)
            if newline < 0:
                break
            raw = data[position:newline]
            position = newline + 1
            if raw.strip():
                entries.append(self.parse_line(raw, line, base + position))
            line += 1
        return entries, position

    def parse_line(self, raw: bytes, line: int, end: int) -> Entry:
        """One record's bytes (a line, or an array's element) as its entry."""
        try:
            record = decode_record(raw)
        except ValueError as exc:
            return Entry(line=line, end=end, kind="malformed", error=f"not JSON: {exc}")
        try:
            return self.parse_record(record, line, end)
        except RecursionError:  # a value copied into the entry (toolUseResult) re-encoded
            return Entry(line=line, end=end, kind="malformed",
                         error="not JSON: nested too deep to read")

    def parse_piece(self, piece: Piece, limit: int, end: int | None = None) -> Entry:
        """A record a splitter cut out: its entry, or, longer than ``limit`` bytes, a
        malformed entry saying so (its bytes were not kept). ``end`` is the position the
        entry ends at, when not the piece's byte offset (an array's element: its index)."""
        at = piece.end if end is None else end
        bad = unreadable(piece, limit, at)
        return bad if bad is not None else self.parse_line(piece.data or b"", piece.line, at)

    def parse_record(self, record: Any, line: int, end: int) -> Entry:
        """One decoded record (a line's JSON, or an element of a JSON array)."""
        if not isinstance(record, dict):
            return Entry(line=line, end=end, kind="malformed",
                         error="a record must be a JSON object")
        kind = record.get("type")
        if kind == "system" and record.get("subtype") == "compact_boundary":
            metadata = record.get("compactMetadata")
            self._boundary = {"uuid": record.get("uuid"),
                              "logical_parent_uuid": record.get("logicalParentUuid"),
                              **(metadata if isinstance(metadata, dict) else {})}
            return Entry(line=line, end=end, kind="message",
                         info={"compact_boundary": self._boundary})
        if kind not in ("user", "assistant"):
            name = str(kind) if kind is not None else "(no type)"
            if kind == "system" and isinstance(record.get("subtype"), str):
                name = f"system:{record['subtype']}"
            return Entry(line=line, end=end, kind="unknown", unknown_type=name)
        message = record.get("message")
        if not isinstance(message, dict):
            return Entry(line=line, end=end, kind="malformed",
                         error=f"{'an' if kind == 'assistant' else 'a'} {kind} record "
                               "needs a `message` object")
        entry = Entry(line=line, end=end, kind="message", thread=self._thread(record))
        source: dict[str, Any] = {"format": "claude-code", "type": kind, "line": line}
        for field, name in (("uuid", "uuid"), ("parentUuid", "parent_uuid"),
                            ("timestamp", "timestamp")):
            if record.get(field) is not None:
                source[name] = record[field]
        if kind == "assistant":
            self._assistant(entry, message, source)
        else:
            self._user(entry, record, message, source)
        return entry

    def _thread(self, record: dict[str, Any]) -> str | None:
        if not record.get("isSidechain"):
            return None
        parent = record.get("parentUuid")
        key = self.agent_of.get(parent) if isinstance(parent, str) else None
        if key is None:
            agent = record.get("agentId")
            key = agent if isinstance(agent, str) else str(record.get("uuid"))
        if isinstance(record.get("uuid"), str):
            self.agent_of[record["uuid"]] = key
        return key

    def _assistant(self, entry: Entry, message: dict[str, Any], source: dict[str, Any]) -> None:
        content = message.get("content")
        parts: list[dict[str, Any]] = []
        dropped: list[str] = []
        if isinstance(content, str):
            parts.append({"type": "text", "text": content})
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            block_type = block.get("type")
            if block_type == "text" and isinstance(block.get("text"), str):
                parts.append({"type": "text", "text": block["text"]})
            elif block_type == "tool_use":
                call_id, name = str(block.get("id")), str(block.get("name"))
                self.tool_names[call_id] = name
                parts.append({"type": "tool_use", "id": call_id, "name": name,
                              "input": block.get("input")})
            else:
                dropped.append(str(block_type))
        meta: dict[str, Any] = {"source": source}
        for field in ("id", "model", "stop_reason"):
            if message.get(field) is not None:
                meta[f"message_{field}" if field == "id" else field] = message[field]
        if dropped:
            # Thinking is not sent back to the model by a harness: not part of the thread.
            meta["dropped_blocks"] = dropped
            entry.info["dropped_blocks"] = dropped
        if parts:
            entry.messages.append(MessageIn(role="assistant", content=parts, meta=meta))
        usage = message.get("usage")
        key = message.get("id")
        if isinstance(usage, dict) and isinstance(key, str) and key not in self.usage_seen:
            self.usage_seen.add(key)
            model = message.get("model")
            entry.usage = Usage(
                key=key, model=model if isinstance(model, str) else None,
                input_tokens=token_count(usage.get("input_tokens")),
                output_tokens=token_count(usage.get("output_tokens")),
                cache_read_tokens=token_count(usage.get("cache_read_input_tokens")),
                cache_write_tokens=token_count(usage.get("cache_creation_input_tokens")))

    def _user(self, entry: Entry, record: dict[str, Any], message: dict[str, Any],
              source: dict[str, Any]) -> None:
        content = message.get("content")
        meta: dict[str, Any] = {"source": source}
        if record.get("isCompactSummary"):
            meta["compact_summary"] = True
            if self._boundary is not None:
                meta["compact_boundary"] = self._boundary
                self._boundary = None
        if record.get("isMeta"):
            meta["is_meta"] = True
        if isinstance(content, str):
            entry.messages.append(MessageIn(role="user", content=content, meta=meta))
            return
        texts = []
        result = record.get("toolUseResult")
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_result":
                call_id = str(block.get("tool_use_id"))
                tool_meta: dict[str, Any] = {"source": source}
                if block.get("is_error"):
                    tool_meta["is_error"] = True
                text = _text(block.get("content"))
                if result is not None and text.startswith(PERSISTED_OUTPUT):
                    text = self._whole(result) or text
                if result is not None:
                    encoded = json.dumps(result, ensure_ascii=False)
                    tool_meta["tool_use_result"] = (
                        result if len(encoded.encode()) <= TOOL_USE_RESULT_MAX
                        else {"omitted_bytes": len(encoded.encode())})
                    result = None
                entry.messages.append(MessageIn(
                    role="tool", content=text, tool_call_id=call_id,
                    name=self.tool_names.get(call_id, "tool")[:256], meta=tool_meta))
            elif block.get("type") == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif isinstance(block.get("type"), str):
                texts.append(f"[{block['type']}]")
        if texts:
            entry.messages.append(MessageIn(role="user", content="\n".join(texts), meta=meta))


    def _whole(self, result: Any) -> str | None:
        """The whole output of a Bash result Claude Code saved to its file, with its
        stderr (None: no file, or `persisted` could not read it)."""
        if self.persisted is None or not isinstance(result, dict):
            return None
        path = result.get("persistedOutputPath")
        whole = self.persisted(path) if isinstance(path, str) else None
        if whole is None:
            return None
        stderr = result.get("stderr")
        return whole + (f"\n{stderr}" if isinstance(stderr, str) and stderr else "")


def saved_output(text: str, read: Callable[[str], str | None]) -> str | None:
    """The whole output behind Claude Code's ``<persisted-output>`` preview ``text``: the
    file it names (``Full output saved to: PATH``), as ``read`` reads it, when that file
    begins with the preview; None otherwise (not a preview, or not that file)."""
    if not text.startswith(PERSISTED_OUTPUT):
        return None
    found = _SAVED_TO.search(text, 0, 4096)
    at = text.find(_PREVIEW)
    end = next((end for end in _PREVIEW_ENDS if text.endswith(end)), None)
    if found is None or at < 0 or end is None:
        return None
    preview = text[at + len(_PREVIEW):len(text) - len(end)]
    whole = read(found[1])
    return whole if preview and whole is not None and whole.startswith(preview) else None


def is_array(head: bytes) -> bool:
    """Whether a file whose first non-blank bytes are ``head`` is one JSON array of records
    (a JSONL line starts with ``{``)."""
    return head.lstrip()[:1] == b"["

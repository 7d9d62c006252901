"""transcript.import: a Claude Code or OpenCode transcript appended to a session, from the
last byte read (docs/protocol.md, "transcript.import"); owns ``transcript_imports``.

The parsers (`ctxd.transcripts`) turn records into messages and usage; this module reads the
file in chunks, appends the main thread's messages through the session's normal append (so
offload and auto-compaction apply), turns each sub-agent's records into a branch that folds,
and commits the read position and the usage records in the same transaction as the
messages they follow, so an import interrupted anywhere resumes where its last commit ended.
A sub-agent's branch commits with its messages and the position after them; a branch that an
interrupted import left active is returned by the next import before it reads anything.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import apsw
import msgspec
import trio

from ctxd.errors import CtxdError, ErrorCode, invalid_state, params_error
from ctxd.hub import find_usage, insert_usage
from ctxd.sessions._actor import SessionActor
from ctxd.sessions._branch_ops import create_branch, return_branch
from ctxd.sessions._files import open_regular, read_inside
from ctxd.sessions._queries import decode_meta, list_messages, scalar_rowid
from ctxd.sessions._session_ops import append, open_session
from ctxd.sessions._supervisor import Supervisor
from ctxd.store import Transaction
from ctxd.transcripts import (
    NOT_AN_EXPORT,
    ArraySplitter,
    ClaudeCodeParser,
    Entry,
    LineSplitter,
    Piece,
    Usage,
    decode_record,
    is_array,
    locate_messages,
    parse_message,
)
from ctxd.wire.types import (
    RETURN_MESSAGE_CHARS,
    Branch,
    BranchCreateParams,
    BranchReturnParams,
    MalformedLine,
    MessageAppendParams,
    MessageIn,
    SessionOpenParams,
    StoredMessage,
    TranscriptImportParams,
    TranscriptImportResult,
    UsageEntry,
    UsageRecordParams,
)

log = logging.getLogger("ctxd.sessions")

CHUNK_BYTES = 1 << 20
"""Bytes read from the file at a time: memory stays bounded whatever the file's size (one
chunk, and one record of at most ``max_request_bytes``)."""
BATCH_MESSAGES = 500
"""Main-thread messages appended in one transaction at most."""
HEAD_BYTES = 4096
"""The first bytes of the file whose hash tells a grown file from a replaced one."""
BATCH_ENTRIES = 1024
"""Records parsed in a worker thread, then taken on the event loop, at a time: a chunk of
tiny records is tens of thousands of them, which neither the loop nor the garbage
collector (a full collection of what a whole chunk left alive) must take in one go
(docs/decisions.md, "Bounded imports")."""
AGENT_PROMPT_CHARS = 20_000
"""A sub-agent branch's prompt (its first user message), cut to this many characters."""
AGENT_BUDGET = 32_768
AGENT_TIMEOUT_S = 600.0
AGENT_DESCRIPTION = "sub-agent "
"""A sub-agent branch's description: this and the sub-agent's id. With `AGENT_BUDGET` and
`AGENT_TIMEOUT_S` it tells a branch an import opened."""
PERSISTED_MAX_BYTES = 4 << 20
"""The largest output an import reads from the file Claude Code saved it to (a larger one
is imported as the preview Claude Code showed the model)."""
SESSION_ID_SCAN_BYTES = 1 << 20
RESUME_TOOL_CALLS = 1000
"""The session's latest assistant messages whose tool calls name the results an import
that resumes mid-file reads before it meets a call (the parser met the calls before)."""
LIVE = "live"
"""The meta key of a message a live integration recorded as it happened (``ctxctl hook``
writes the event's name): an import does not append it again (docs/protocol.md,
"transcript.import")."""
LIVE_MATCHED = "live_matched"
"""Set on a live prompt once an import met its line, so a later equal prompt is not
taken for it."""


@dataclass
class _State:
    """A row of ``transcript_imports``.

    ``size`` is, for a JSONL file, how far the last finished import read: the bytes from
    ``offset`` (where the unterminated last line began) up to it hold no newline, so a line
    already longer than a record may be is not read again (0 after an interrupted import:
    nothing claimed). For a file read by index (a JSON array, an OpenCode export), it is
    the file's size, which only grows while records are added.
    """

    offset: int = 0
    lines: int = 0
    size: int = 0
    head_bytes: int = 0
    head_hash: str = ""


def _load_state(conn: apsw.Connection, session_id: str, path: str) -> _State | None:
    rows = conn.execute("SELECT offset, lines, size, head_bytes, head_hash "
                        "FROM transcript_imports WHERE session_id = ? AND path = ?",
                        (session_id, path)).fetchall()
    if not rows:
        return None
    offset, lines, size, head_bytes, head_hash = rows[0]
    return _State(scalar_rowid(offset), scalar_rowid(lines), scalar_rowid(size),
                  scalar_rowid(head_bytes), str(head_hash))


def _save_state(conn: apsw.Connection, session_id: str, path: str, fmt: str,
                state: _State) -> None:
    conn.execute(
        "INSERT INTO transcript_imports (session_id, path, format, offset, lines, size, "
        "head_bytes, head_hash, imported_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (session_id, path) DO UPDATE SET format = excluded.format, "
        "offset = excluded.offset, lines = excluded.lines, size = excluded.size, "
        "head_bytes = excluded.head_bytes, head_hash = excluded.head_hash, "
        "imported_at = excluded.imported_at",
        (session_id, path, fmt, state.offset, state.lines, state.size, state.head_bytes,
         state.head_hash, time.time()))


@dataclass
class _Live:
    """What the live hooks recorded in the session that an import must not append again:
    the ids of the tool calls (their results were recorded with them), and the prompts no
    import has met yet, oldest first."""

    tool_ids: set[str] = field(default_factory=set)
    prompts: list[tuple[int, str, dict[str, object]]] = field(default_factory=list)
    matched: list[tuple[int, dict[str, object]]] = field(default_factory=list)
    """Prompts met by this import, marked when its next batch commits."""
    skipped: int = 0

    def kept(self, message: MessageIn) -> MessageIn | None:
        """``message`` as the import appends it: None when the hooks recorded it, an
        assistant message without the tool calls they recorded."""
        if message.role == "tool" and message.tool_call_id in self.tool_ids:
            self.skipped += 1
            return None
        if message.role == "user" and isinstance(message.content, str):
            for i, (seq, content, meta) in enumerate(self.prompts):
                if content == message.content:
                    del self.prompts[i]
                    self.matched.append((seq, meta))
                    self.skipped += 1
                    return None
        if message.role == "assistant" and not isinstance(message.content, str):
            parts = [part for part in message.content if not (
                part.get("type") == "tool_use" and part.get("id") in self.tool_ids)]
            if len(parts) < len(message.content):
                if not parts:
                    self.skipped += 1
                    return None
                return msgspec.structs.replace(message, content=parts)
        return message


def _load_live(conn: apsw.Connection, session_id: str) -> _Live:
    live = _Live()
    for seq, role, content, tool_call_id, meta in conn.execute(
            "SELECT seq, role, content, tool_call_id, meta FROM messages "
            "WHERE session_id = ? AND CAST(meta AS TEXT) LIKE ? ORDER BY seq",
            (session_id, f'%"{LIVE}":%')):
        decoded = decode_meta(meta)
        if LIVE not in decoded:
            continue
        if role == "tool" and tool_call_id:
            live.tool_ids.add(str(tool_call_id))
        elif role == "user" and not decoded.get(LIVE_MATCHED):
            text = json.loads(content)
            if isinstance(text, str):
                live.prompts.append((scalar_rowid(seq), text, decoded))
    return live


def _mark_matched(conn: apsw.Connection, session_id: str,
                  matched: list[tuple[int, dict[str, object]]]) -> None:
    conn.executemany("UPDATE messages SET meta = ? WHERE session_id = ? AND seq = ?",
                     [(msgspec.json.encode({**meta, LIVE_MATCHED: True}), session_id, seq)
                      for seq, meta in matched])


def _tool_names(conn: apsw.Connection, session_id: str) -> dict[str, str]:
    """The names of the tool calls among the session's latest `RESUME_TOOL_CALLS`
    assistant messages, by call id."""
    names: dict[str, str] = {}
    for (content,) in conn.execute(
            "SELECT content FROM messages WHERE session_id = ? AND role = 'assistant' "
            "ORDER BY seq DESC LIMIT ?", (session_id, RESUME_TOOL_CALLS)):
        parts = json.loads(content)
        for part in parts if isinstance(parts, list) else []:
            if isinstance(part, dict) and part.get("type") == "tool_use":
                names.setdefault(str(part.get("id")), str(part.get("name")))
    return names


def _head_hash(path: Path, length: int) -> str:
    with open_regular(path) as file:
        return hashlib.sha256(file.read(length)).hexdigest()


def check_path(raw: str) -> tuple[Path, int]:
    """The transcript's path and size, if it is an absolute path to a readable regular file.

    Raises:
        CtxdError: -32602 at ``$.path`` saying what is wrong.
    """
    path = Path(raw)
    if not path.is_absolute():
        raise params_error("$.path", f"{raw!r} is not an absolute path; give the full path "
                                     "(ctxctl resolves a relative one)")
    with open_regular(path) as file:
        return path, os.fstat(file.fileno()).st_size


def _newline_free(path: Path, offset: int, length: int) -> bool:
    """Whether the ``length`` bytes at ``offset`` hold no newline: what a remembered
    unterminated line claims of its start (a row written before ``size`` meant that could
    claim bytes an interrupted import never read; a real line holds none)."""
    with open_regular(path) as file:
        file.seek(offset)
        return b"\n" not in file.read(length)


def _first_byte(path: Path) -> bytes:
    """The file's first non-blank byte (b"" when it has none)."""
    with open_regular(path) as file:
        while chunk := file.read(HEAD_BYTES):
            if chunk.strip():
                return chunk.lstrip()[:1]
    return b""


def _starts_array(path: Path) -> bool:
    """Whether the file's first non-blank byte is ``[`` (Claude Code records saved as one
    JSON array rather than JSONL)."""
    return is_array(_first_byte(path))


def _is_record(record: object) -> bool:
    """A Claude Code record: a JSON object with a string ``type`` (one of a type the parser
    does not know is kept, docs/decisions.md, "Transcript importers")."""
    return isinstance(record, dict) and isinstance(record.get("type"), str)


def _recognise(records: Iterable[bytes]) -> tuple[bool, str | None]:
    """Whether any of ``records`` is a Claude Code record, and the first session id one
    names (read until both are known)."""
    recognised, session_id = False, None
    for raw in records:
        try:
            record = decode_record(raw)
        except ValueError:
            continue
        recognised = recognised or _is_record(record)
        if session_id is None and isinstance(record, dict) \
                and isinstance(record.get("sessionId"), str):
            session_id = str(record["sessionId"])
        if recognised and session_id is not None:
            break
    return recognised, session_id


def _scan_claude(path: Path) -> tuple[str | None, str | None]:
    """The ``sessionId`` of the first record that has one, within the file's first MB, and
    why the file is not a Claude Code transcript (None when it is, or cannot be told:
    complete lines there, and not one of them is a record)."""
    with open_regular(path) as file:
        data = file.read(SESSION_ID_SCAN_BYTES)
    # Complete lines only: the last one too when the whole file was read.
    whole = len(data) < SESSION_ID_SCAN_BYTES
    lines = [raw for raw in (data if whole else data[:data.rfind(b"\n") + 1]).splitlines()
             if raw.strip()]
    recognised, session_id = _recognise(lines)
    if recognised or not lines:
        return session_id, None
    which = "its one line is not" if len(lines) == 1 \
        else f"none of the {len(lines)} lines read is"
    return None, (f"{path} is not a Claude Code transcript: {which} a JSON record (an object "
                  "with a `type`); an OpenCode export is imported with format opencode")


def _scan_array(path: Path, limit: int) -> tuple[str | None, str | None]:
    """As `_scan_claude`, for a file holding one JSON array: the elements complete within
    its first MB."""
    splitter = ArraySplitter(limit)
    with open_regular(path) as file:
        data = file.read(SESSION_ID_SCAN_BYTES)
    pieces = splitter.feed(data)
    recognised, session_id = _recognise(piece.data or b"" for piece in pieces)
    whole = len(data) < SESSION_ID_SCAN_BYTES
    if recognised or (not pieces and (splitter.closed or not whole)):
        return session_id, None  # a record, an empty array, or nothing complete yet
    which = f"none of its {len(pieces)} elements is" if splitter.closed \
        else f"none of the {len(pieces)} complete elements read is"
    return None, (f"{path} starts with [ but is not a JSON array of Claude Code records: "
                  f"{which} a Claude Code record (an object with a `type`)")


def _scan_export(path: Path, limit: int) -> tuple[dict[str, Any], int]:
    """An OpenCode export's session info and the byte offset of its ``messages`` array: the
    file is cut into its top-level members, a chunk at a time (memory: the members that fit
    the limit, such as ``info``).

    Raises:
        ValueError: not ``{info, messages: [...]}``.
    """
    if _first_byte(path) != b"{":
        raise ValueError(NOT_AN_EXPORT)
    with open_regular(path) as file:
        splitter = ArraySplitter(limit)
        members = []
        while chunk := file.read(CHUNK_BYTES):
            members += splitter.feed(chunk)

        def head(offset: int, length: int) -> bytes:
            file.seek(offset)
            return file.read(length)

        return locate_messages(members, head)


@dataclass
class _Agent:
    messages: list[MessageIn] = field(default_factory=list)
    usage: list[Usage] = field(default_factory=list)
    end: int = 0
    line: int = 0


@dataclass
class _Import:
    """One import's progress: what is buffered, what is committed, the counts."""

    actor: SessionActor
    params: TranscriptImportParams
    path: str
    state: _State
    start_lines: int
    live: _Live
    main: list[MessageIn] = field(default_factory=list)
    main_usage: list[Usage] = field(default_factory=list)
    agents: dict[str, _Agent] = field(default_factory=dict)
    messages_added: int = 0
    tool_results: int = 0
    usage_records: int = 0
    usage_duplicates: int = 0
    branches: int = 0
    compactions: int = 0
    malformed: list[MalformedLine] = field(default_factory=list)
    unknown: dict[str, int] = field(default_factory=dict)
    safe_end: int = 0
    safe_line: int = 0
    """The position after the last record that nothing buffered precedes."""
    subagent_file: bool = False
    """A Claude Code sub-agent file found beside the transcript (its malformed lines name
    it)."""

    def take(self, entry: Entry) -> None:
        """Count an entry and buffer what it adds (its position is committed with it)."""
        if entry.kind == "malformed":
            self.malformed.append(MalformedLine(
                line=entry.line, error=entry.error or "",
                path=self.path if self.subagent_file else None))
        elif entry.kind == "unknown":
            name = entry.unknown_type or "(unknown)"
            self.unknown[name] = self.unknown.get(name, 0) + 1
        for name in entry.info.get("unknown_parts", []):
            self.unknown[f"part:{name}"] = self.unknown.get(f"part:{name}", 0) + 1
        if "compact_boundary" in entry.info:
            self.compactions += 1
        for message in entry.messages:
            meta = message.meta or {}
            if (meta.get("compact_summary") and "compact_boundary" not in meta) or (
                    meta.get("summary") is True and message.role == "assistant"):
                self.compactions += 1
        messages = [m for m in map(self.live.kept, entry.messages) if m is not None]
        if entry.thread is None:
            self.main.extend(messages)
            if entry.usage is not None:
                self.main_usage.append(entry.usage)
        else:
            agent = self.agents.setdefault(entry.thread, _Agent())
            agent.messages.extend(messages)
            if entry.usage is not None:
                agent.usage.append(entry.usage)
            agent.end, agent.line = entry.end, entry.line

    def _stage(self, state: _State, usage: list[Usage], done: list[tuple[UsageEntry, bool]]
               ) -> Callable[[Transaction, str | None], None]:
        """The steps that commit the read position ``state`` and the ``usage`` records
        (of the thread whose id the returned function is given) with the messages before
        them."""
        session_id = self.actor.session_id
        local = self.actor.require().main_thread_tokens
        matched, self.live.matched = self.live.matched, []

        def record(conn: apsw.Connection, branch_id: str | None) -> None:
            now = time.time()
            for item in usage:
                first = find_usage(conn, session_id, item.key)
                if first is not None:
                    done.append((first, True))
                    continue
                params = UsageRecordParams(
                    session_id=session_id, branch_id=branch_id, model=item.model,
                    request_id=item.key, idempotency_key=item.key)
                counters = {"input_tokens": item.input_tokens,
                            "output_tokens": item.output_tokens,
                            "cache_read_tokens": item.cache_read_tokens,
                            "cache_write_tokens": item.cache_write_tokens,
                            "thinking_tokens": item.thinking_tokens}
                done.append((insert_usage(conn, params, counters, local, now), False))

        def stage(transaction: Transaction, branch_id: str | None) -> None:
            transaction.add(_save_state, session_id, self.path, self.params.format,
                            _copy(state))
            if matched:
                transaction.add(_mark_matched, session_id, matched)
            if usage:
                transaction.add(record, branch_id)
        return stage

    def _recorded(self, done: list[tuple[UsageEntry, bool]]) -> None:
        bus = self.actor.services.bus
        for entry, duplicate in done:
            if duplicate:
                self.usage_duplicates += 1
                continue
            self.usage_records += 1
            bus.publish(self.actor.session_id, "usage.recorded", {
                "usage_id": entry.usage_id, "branch_id": entry.branch_id,
                "model": entry.model, "request_id": entry.request_id,
                "local_input_tokens": entry.local_input_tokens,
                "input_tokens": entry.input_tokens, "output_tokens": entry.output_tokens,
                "cache_read_tokens": entry.cache_read_tokens,
                "cache_write_tokens": entry.cache_write_tokens,
                "thinking_tokens": entry.thinking_tokens})

    async def _commit(self, messages: list[MessageIn],
                      stage: Callable[[Transaction, str | None], None]) -> None:
        """Append ``messages`` to the main thread (or, without any, write only the position
        and usage) with ``stage``'s steps in the same transaction."""
        if messages:
            await append(self.actor, MessageAppendParams(
                session_id=self.actor.session_id, messages=messages, allow_over=True),
                lambda transaction: stage(transaction, None))
            self._added(messages)
        else:
            transaction = Transaction()
            stage(transaction, None)
            await self.actor.services.store.commit(transaction)

    def _added(self, messages: list[MessageIn]) -> None:
        self.messages_added += len(messages)
        self.tool_results += sum(message.role == "tool" for message in messages)

    async def flush_main(self, end: int, line: int) -> None:
        self.state.offset, self.state.lines = end, line
        done: list[tuple[UsageEntry, bool]] = []
        await self._commit(self.main, self._stage(self.state, self.main_usage, done))
        self._recorded(done)
        self.main = []
        self.main_usage.clear()

    async def flush_agents(self) -> None:
        """Each buffered sub-agent as a branch of the main thread that folds its last answer;
        one the window has no room for is appended to the main thread instead.

        The branch, its messages, their usage and the read position after them commit in
        one transaction: a crash before it leaves nothing of the sub-agent (it is read
        again), after it a live branch that the next import returns
        (`finish_interrupted`)."""
        for key, agent in list(self.agents.items()):
            del self.agents[key]
            state = _copy(self.state)
            state.offset, state.lines = max(agent.end, state.offset), max(agent.line,
                                                                         state.lines)
            done: list[tuple[UsageEntry, bool]] = []
            stage = self._stage(state, agent.usage, done)
            branch_id = await self._open_branch(key, agent.messages, stage)
            if branch_id is None:
                await self._commit(agent.messages, stage)
            self.state = state
            self._recorded(done)
            if branch_id is None:
                continue
            self.branches += 1
            if branch_id in self.actor.branches.live:
                await return_branch(self.actor, BranchReturnParams(
                    branch_id=branch_id, message=_answer(agent.messages)))

    async def _open_branch(self, key: str, messages: list[MessageIn],
                           stage: Callable[[Transaction, str | None], None]) -> str | None:
        """A branch for a sub-agent with its messages, its first user message as the prompt
        (that message is then the branch's opening, not appended again), committed with
        ``stage``; its id, or None when the session has no room for it (nothing written)."""
        first = next((i for i, m in enumerate(messages) if m.role == "user"
                      and isinstance(m.content, str) and m.content.strip()), None)
        prompt = "(sub-agent)" if first is None else str(messages[first].content)
        rest = messages
        if first is not None and len(prompt) <= AGENT_PROMPT_CHARS:
            rest = messages[:first] + messages[first + 1:]
        seq_before = self.actor.require().last_seq
        try:
            created = await create_branch(self.actor, BranchCreateParams(
                session_id=self.actor.session_id,
                description=f"{AGENT_DESCRIPTION}{key}"[:500],
                prompt=prompt[:AGENT_PROMPT_CHARS], budget=AGENT_BUDGET,
                timeout_seconds=AGENT_TIMEOUT_S, inject_memories=False,
                parent_branch_id=None), rest, stage)
        except CtxdError as error:
            if error.code == ErrorCode.CANCELLED or self.actor.require().last_seq != seq_before:
                raise  # written (a step after its commit failed): not to be appended again
            return None
        self._added(rest)
        self.messages_added += len(messages) - len(rest)
        return created.branch_id


def _opened_by_import(branch: Branch) -> bool:
    """Whether a branch is a sub-agent's that an import opened (its description, budget
    and timeout are the import's)."""
    return (branch.description.startswith(AGENT_DESCRIPTION)
            and branch.budget == AGENT_BUDGET and branch.timeout_seconds == AGENT_TIMEOUT_S)


def _branch_messages(conn: apsw.Connection, session_id: str, branch_id: str
                     ) -> list[StoredMessage]:
    """A branch's messages as they were appended (not what compaction wrote for them)."""
    return [m for m in list_messages(conn, session_id, branch_id, 0, 1 << 62)
            if m.at_seq is None]


async def finish_interrupted(actor: SessionActor) -> None:
    """Return each sub-agent branch that an interrupted import left active, its fold the
    last answer among its messages, as that import would have returned it.

    An import runs on its session's actor, alone: a live branch an import opened is one
    whose import stopped (the daemon was killed, or a later step of the import failed)
    between committing the branch and folding it. Left live, it would keep the main thread
    from being compacted until its deadline (docs/decisions.md, "Imports that were
    interrupted")."""
    for branch in actor.branches.oldest_first():
        if not _opened_by_import(branch) or branch.branch_id not in actor.branches.live:
            continue
        messages = await actor.services.store.read(_branch_messages, actor.session_id,
                                                   branch.branch_id)
        try:
            await return_branch(actor, BranchReturnParams(branch_id=branch.branch_id,
                                                          message=_answer(messages)))
        except CtxdError:
            if branch.branch_id in actor.branches.live:
                raise
            # Force-returned on the way (its budget was spent, or its deadline passed).
        log.info("session %s: returned branch %s (%s), which an interrupted import left "
                 "active", actor.session_id, branch.branch_id, branch.description)


def _copy(state: _State) -> _State:
    """A copy of the position, as a transaction commits it."""
    return _State(state.offset, state.lines, state.size, state.head_bytes, state.head_hash)


def _answer(messages: Sequence[MessageIn | StoredMessage]) -> str:
    """A sub-agent's final answer: the text of its last assistant message that has any."""
    for message in reversed(messages):
        if message.role != "assistant":
            continue
        text = message.content if isinstance(message.content, str) else "\n".join(
            part.get("text", "") for part in message.content if part.get("type") == "text")
        if text.strip():
            return text[:RETURN_MESSAGE_CHARS]
    return "(the sub-agent left no answer)"


class _Records:
    """A file's entries, read and parsed in worker threads a batch at a time: a chunk is
    read and cut into records once the previous chunk's are all handed out."""

    def __init__(self, file: BinaryIO, cut: Callable[[bytes], list[Piece]],
                 parse: Callable[[Piece], Entry]) -> None:
        self._file = file
        self._cut = cut
        self._parse = parse
        self._pieces: list[Piece] = []
        self._next = 0

    @property
    def drained(self) -> bool:
        """Whether every record cut so far was handed out."""
        return self._next >= len(self._pieces)

    def batch(self) -> list[Entry]:
        """The next BATCH_ENTRIES entries at most; none at the file's end (blocking)."""
        while self.drained:
            chunk = self._file.read(CHUNK_BYTES)
            if not chunk:
                return []
            self._pieces, self._next = self._cut(chunk), 0
        pieces = self._pieces[self._next:self._next + BATCH_ENTRIES]
        self._next += len(pieces)
        return [self._parse(piece) for piece in pieces]


def claude_code_parser(transcript: str) -> ClaudeCodeParser:
    """A parser of a transcript that reads the outputs Claude Code saved to files inside the
    transcript's folder (where it keeps them: ``<session>/tool-results/``), never a file
    elsewhere that a record names."""
    parser = ClaudeCodeParser()
    folder = os.path.dirname(transcript)
    parser.persisted = lambda path: read_inside(path, folder, PERSISTED_MAX_BYTES)
    return parser


async def _import_claude_code(job: _Import, path: Path, limit: int, seen: int) -> int:
    """Read from the committed offset to the last complete line; the bytes read (up to its
    newline). A line longer than ``limit`` is skipped, reported with its size; ``seen`` is
    how much of such a line, the file's unterminated last one, an earlier import read (it
    is not read again)."""
    parser = claude_code_parser(job.params.path)
    start = job.state.offset
    if start:
        # The calls read before this position name their results read after it.
        parser.tool_names = await job.actor.services.store.read(_tool_names,
                                                                job.actor.session_id)
    splitter = LineSplitter(start, job.state.lines + 1, limit, seen)
    job.state.size = 0  # what an interrupted import commits claims no unterminated line
    with open_regular(path) as file:
        file.seek(start + seen)
        records = _Records(file, splitter.feed,
                           lambda piece: parser.parse_piece(piece, limit))
        while entries := await trio.to_thread.run_sync(records.batch):
            for entry in entries:
                if entry.thread is None and entry.kind == "message" and job.agents:
                    await job.flush_main(job.safe_end, job.safe_line)
                    await job.flush_agents()
                job.take(entry)
                if not job.agents:
                    job.safe_end, job.safe_line = entry.end, entry.line
                    if len(job.main) >= BATCH_MESSAGES:
                        await job.flush_main(entry.end, entry.line)
            if not job.agents and records.drained:
                # Blank lines at the chunk's end move the position too.
                job.safe_end, job.safe_line = splitter.offset, splitter.line - 1
    if job.agents:
        await job.flush_main(job.safe_end, job.safe_line)
        await job.flush_agents()
    job.state.size = splitter.offset + splitter.pending_bytes
    await job.flush_main(splitter.offset, splitter.line - 1)
    return splitter.offset - start


async def _import_elements(job: _Import, path: Path, start: int,
                           parse: Callable[[Piece], Entry]) -> None:
    """The elements of the JSON array at byte ``start`` (Claude Code records saved as one
    array; an OpenCode export's ``messages``), read as a stream (memory: one chunk and one
    element): those after the ``job.state.offset`` already imported (a record's position
    is its 1-based index). An element longer than the limit is skipped, reported with its
    size; elements after an unclosed array's last comma are left for later."""
    splitter = ArraySplitter(job.actor.services.config.max_request_bytes)
    imported = job.state.offset
    with open_regular(path) as file:
        file.seek(start)
        # The elements already imported are parsed too: the parser links records across
        # them (tool names, sub-agent chains).
        records = _Records(file, splitter.feed, parse)
        while entries := await trio.to_thread.run_sync(records.batch):
            await _take_indexed(job, [entry for entry in entries if entry.line > imported])
    if job.agents:
        await job.flush_main(job.safe_end, job.safe_line)
        await job.flush_agents()
    total = max(splitter.count, imported)
    await job.flush_main(total, total)


async def _take_indexed(job: _Import, entries: list[Entry]) -> None:
    """Entries positioned by index (an array's elements, an export's messages), taken in
    order: a sub-agent's, buffered, become its branch before the next main-thread record,
    as in a JSONL file."""
    for entry in entries:
        if entry.thread is None and entry.kind == "message" and job.agents:
            await job.flush_main(job.safe_end, job.safe_line)
            await job.flush_agents()
        job.take(entry)
        if not job.agents:
            job.safe_end = job.safe_line = entry.line
            if len(job.main) >= BATCH_MESSAGES:
                await job.flush_main(entry.line, entry.line)


def subagent_files(path: Path) -> list[Path]:
    """The sub-agent transcripts Claude Code (2.1) writes beside a session's transcript,
    ``<dir>/<session id>/subagents/agent-*.jsonl``, in name order."""
    folder = path.parent / path.stem / "subagents"
    try:
        return sorted(found for found in folder.glob("agent-*.jsonl") if found.is_file())
    except OSError:
        return []


async def _import_file(actor: SessionActor, p: TranscriptImportParams, path: Path, size: int,
                       array_at: int | None, subagent_file: bool = False
                       ) -> tuple[_Import, int, bool]:
    """One file from its committed position: the job (its counts), the bytes read and
    whether it was restarted. ``array_at``: where the JSON array of its records starts (an
    OpenCode export's ``messages``, Claude Code records saved as one array: read as a
    stream, positioned by index); None for a JSONL file."""
    store = actor.services.store
    limit = actor.services.config.max_request_bytes
    key = str(path)
    stored = await store.read(_load_state, actor.session_id, key)
    head_bytes = min(size, HEAD_BYTES) if stored is None else stored.head_bytes
    head = await trio.to_thread.run_sync(_head_hash, path, head_bytes)
    restarted = False
    if stored is not None:
        position = stored.offset if array_at is None else stored.size
        if size < position or head != stored.head_hash:
            if not p.restart:
                raise invalid_state(
                    f"{key} was replaced or truncated since it was last imported into "
                    f"{actor.session_id} (now {size} bytes, {position} read before)",
                    "pass restart: true (ctxctl import --restart) to import it from its "
                    "start again (what was imported stays), or import it into another "
                    "session", path=key, size=size, offset=stored.offset)
            stored, restarted = None, True
            head_bytes = min(size, HEAD_BYTES)
            head = await trio.to_thread.run_sync(_head_hash, path, head_bytes)
    # An unterminated last line already over the limit is read on from where the last
    # import stopped (docs/decisions.md, "Bounded imports").
    tail = 0 if stored is None or array_at is not None else stored.size - stored.offset
    seen = tail if tail > limit and await trio.to_thread.run_sync(
        _newline_free, path, stored.offset if stored else 0, limit + 1) else 0
    state = stored or _State(head_bytes=head_bytes, head_hash=head)
    state.size = size
    live = await store.read(_load_live, actor.session_id)
    job = _Import(actor=actor, params=p, path=key, state=state, start_lines=state.lines,
                  live=live, subagent_file=subagent_file)
    job.safe_end, job.safe_line = state.offset, state.lines
    start = state.offset
    bytes_read = 0
    if array_at is None:
        if state.offset + seen < size:
            bytes_read = await _import_claude_code(job, path, limit, seen)
    else:
        parser = claude_code_parser(p.path)
        await _import_elements(job, path, array_at, (
            lambda piece: parse_message(piece, limit)) if p.format == "opencode" else (
            lambda piece: parser.parse_piece(piece, limit, piece.line)))
        bytes_read = size if job.state.offset > start or stored is None else 0
    return job, bytes_read, restarted


async def run_import(actor: SessionActor, p: TranscriptImportParams, path: Path, size: int,
                     array_at: int | None) -> TranscriptImportResult:
    """The import on the session's actor (one at a time per session): the file
    (``array_at``: where the JSON array of its records starts, None for JSONL), then
    (Claude Code) the sub-agent files beside it, each from its own position, as
    branches."""
    created = actor.record is None
    await open_session(actor, SessionOpenParams(session_id=actor.session_id,
                                                project=p.project))
    await finish_interrupted(actor)
    job, bytes_read, restarted = await _import_file(actor, p, path, size, array_at)
    jobs = [job]
    subagents = [] if p.format != "claude-code" or not p.subagents else (
        await trio.to_thread.run_sync(subagent_files, path))
    for found in subagents:
        try:
            found_size = (await trio.to_thread.run_sync(os.stat, found)).st_size
            sub, sub_bytes, _ = await _import_file(actor, p, found, found_size, None, True)
        except OSError:
            continue  # gone since it was listed
        except CtxdError as error:
            if error.code != ErrorCode.INVALID_PARAMS:
                raise
            # Not a regular file once opened (swapped since it was listed): the main
            # file's import stands; this one is left out, as a vanished one is.
            log.warning("session %s: sub-agent file left out of the import: %s",
                        actor.session_id, error.message)
            continue
        jobs.append(sub)
        bytes_read += sub_bytes
    unknown: dict[str, int] = {}
    for each in jobs:
        for name, count in each.unknown.items():
            unknown[name] = unknown.get(name, 0) + count
    result = TranscriptImportResult(
        session_id=actor.session_id, format=p.format, path=str(path), created=created,
        restarted=restarted, lines_read=sum(j.state.lines - j.start_lines for j in jobs),
        messages_added=sum(j.messages_added for j in jobs),
        tool_results=sum(j.tool_results for j in jobs),
        usage_records=sum(j.usage_records for j in jobs),
        usage_duplicates=sum(j.usage_duplicates for j in jobs),
        already_recorded=sum(j.live.skipped for j in jobs),
        branches=sum(j.branches for j in jobs), compactions=sum(j.compactions for j in jobs),
        malformed=[m for j in jobs for m in j.malformed],
        unknown_kept=dict(sorted(unknown.items())), bytes_read=bytes_read,
        offset=job.state.offset, size=size, subagent_files=len(subagents))
    actor.services.bus.publish(actor.session_id, "transcript.imported", {
        name: value for name, value in msgspec.structs.asdict(result).items()
        if name not in ("malformed", "unknown_kept")} | {
        "malformed": len(result.malformed), "unknown_kept": sum(unknown.values())})
    return result


async def transcript_import(supervisor: Supervisor, p: TranscriptImportParams
                            ) -> TranscriptImportResult:
    """transcript.import: the file is checked and its session found (the params', else the
    one the transcript names), then read on that session's actor (`run_import`)."""
    path, size = check_path(p.path)
    session_id = p.session_id
    limit = supervisor.config.max_request_bytes
    array_at: int | None = None
    if p.format == "opencode":
        try:
            info, array_at = await trio.to_thread.run_sync(_scan_export, path, limit)
        except ValueError as exc:
            raise params_error("$.path", f"{p.path} is not an OpenCode export: {exc}"
                               ) from exc
        session_id = session_id or (info.get("id") if isinstance(info.get("id"), str)
                                    else None)
    elif await trio.to_thread.run_sync(_starts_array, path):
        # Claude Code records saved as one JSON array: read as a stream of elements.
        found, refused = await trio.to_thread.run_sync(_scan_array, path, limit)
        if refused is not None:
            raise params_error("$.path", refused)
        array_at = 0
        session_id = session_id or found
    else:
        found, refused = await trio.to_thread.run_sync(_scan_claude, path)
        if refused is not None:
            raise params_error("$.path", refused)
        session_id = session_id or found
    if session_id is None:
        raise params_error("$.session_id", f"{p.path} names no session id; give one "
                                           "(ctxctl import --session ID)")
    try:
        msgspec.convert({"session_id": session_id, "format": p.format, "path": p.path},
                        TranscriptImportParams)
    except msgspec.ValidationError as exc:
        raise params_error("$.session_id", f"the transcript's session id "
                                           f"{session_id!r} is not a valid ctxd session "
                                           "id; give one (ctxctl import --session ID)"
                           ) from exc
    return await supervisor.call(session_id, lambda a: run_import(a, p, path, size,
                                                                  array_at))


__all__ = ["run_import", "transcript_import"]


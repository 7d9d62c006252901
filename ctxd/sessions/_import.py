"""transcript.import: a Claude Code or OpenCode transcript appended to a session, from the
last byte read (docs/protocol.md, "transcript.import"); owns ``transcript_imports``.

The parsers (`ctxd.transcripts`) turn records into messages and usage; this module reads the
file in chunks, appends the main thread's messages through the session's normal append (so
offload and auto-compaction apply), turns each sub-agent's records into a branch that folds,
and commits the read position and the usage records in the same transaction as the
messages they follow, so an import interrupted anywhere resumes where its last commit ended.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import apsw
import msgspec
import trio

from ctxd.errors import CtxdError, invalid_state, params_error
from ctxd.hub import find_usage, insert_usage
from ctxd.sessions._actor import SessionActor
from ctxd.sessions._files import open_regular, read_regular
from ctxd.sessions._queries import decode_meta, scalar_rowid
from ctxd.sessions._supervisor import Supervisor
from ctxd.store import Transaction
from ctxd.transcripts import (
    ClaudeCodeParser,
    Entry,
    Usage,
    is_array,
    parse_claude_code_array,
    parse_opencode,
)
from ctxd.wire import Call, Dispatcher
from ctxd.wire.types import (
    BranchCreateParams,
    BranchReturnParams,
    MalformedLine,
    MessageAppendParams,
    MessageIn,
    SessionOpenParams,
    TranscriptImportParams,
    TranscriptImportResult,
    UsageEntry,
    UsageRecordParams,
)

CHUNK_BYTES = 1 << 20
"""Bytes read from the file at a time: memory stays bounded whatever the file's size."""
BATCH_MESSAGES = 500
"""Main-thread messages appended in one transaction at most."""
HEAD_BYTES = 4096
"""The first bytes of the file whose hash tells a grown file from a replaced one."""
WHOLE_MAX_BYTES = 256 << 20
"""An OpenCode export, or Claude Code records saved as a JSON array, is one JSON document,
read whole: at most this large."""
AGENT_PROMPT_CHARS = 20_000
"""A sub-agent branch's prompt (its first user message), cut to this many characters."""
AGENT_BUDGET = 32_768
AGENT_TIMEOUT_S = 600.0
SESSION_ID_SCAN_BYTES = 1 << 20
LIVE = "live"
"""The meta key of a message a live integration recorded as it happened (``ctxctl hook``
writes the event's name): an import does not append it again (docs/protocol.md,
"transcript.import")."""
LIVE_MATCHED = "live_matched"
"""Set on a live prompt once an import met its line, so a later equal prompt is not
taken for it."""


@dataclass
class _State:
    """A row of ``transcript_imports``."""

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


def _starts_array(path: Path) -> bool:
    """Whether the file's first non-blank byte is ``[`` (Claude Code records saved as one
    JSON array rather than JSONL)."""
    with open_regular(path) as file:
        while chunk := file.read(HEAD_BYTES):
            if chunk.strip():
                return is_array(chunk)
    return False


def _is_record(record: object) -> bool:
    """A Claude Code record: a JSON object with a string ``type`` (one of a type the parser
    does not know is kept, docs/decisions.md, "Transcript importers")."""
    return isinstance(record, dict) and isinstance(record.get("type"), str)


def _scan_claude(path: Path) -> tuple[str | None, str | None]:
    """The ``sessionId`` of the first record that has one, within the file's first MB, and
    why the file is not a Claude Code transcript (None when it is, or cannot be told:
    complete lines there, and not one of them is a record)."""
    with open_regular(path) as file:
        data = file.read(SESSION_ID_SCAN_BYTES)
    session_id: str | None = None
    recognised = False
    # Complete lines only: the last one too when the whole file was read.
    whole = len(data) < SESSION_ID_SCAN_BYTES
    lines = [raw for raw in (data if whole else data[:data.rfind(b"\n") + 1]).splitlines()
             if raw.strip()]
    for raw in lines:
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        recognised = recognised or _is_record(record)
        if session_id is None and isinstance(record, dict) \
                and isinstance(record.get("sessionId"), str):
            session_id = str(record["sessionId"])
        if recognised and session_id is not None:
            break
    if recognised or not lines:
        return session_id, None
    which = "its one line is not" if len(lines) == 1 \
        else f"none of the {len(lines)} lines read is"
    return None, (f"{path} is not a Claude Code transcript: {which} a JSON record (an object "
                  "with a `type`); an OpenCode export is imported with format opencode")


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

    def _stage(self, state: _State, usage: list[Usage], branch_id: str | None,
               done: list[tuple[UsageEntry, bool]]) -> Callable[[Transaction], None]:
        session_id = self.actor.session_id
        local = self.actor.require().main_thread_tokens
        matched, self.live.matched = self.live.matched, []

        def record(conn: apsw.Connection) -> None:
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

        def stage(transaction: Transaction) -> None:
            transaction.add(_save_state, session_id, self.path, self.params.format,
                            _copy(state))
            if matched:
                transaction.add(_mark_matched, session_id, matched)
            if usage:
                transaction.add(record)
        return stage

    def _recorded(self, done: list[tuple[UsageEntry, bool]]) -> None:
        bus = self.actor.supervisor.bus
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

    async def _commit(self, messages: list[MessageIn], usage: list[Usage],
                      branch_id: str | None, state: _State) -> None:
        """Append ``messages`` (or, without any, write only the position and usage) with
        the read position ``state`` in the same transaction."""
        done: list[tuple[UsageEntry, bool]] = []
        stage = self._stage(state, usage, branch_id, done)
        if messages:
            await self.actor.append(MessageAppendParams(
                session_id=self.actor.session_id, messages=messages, branch_id=branch_id,
                allow_over=True), stage)
            self.messages_added += len(messages)
            self.tool_results += sum(message.role == "tool" for message in messages)
        else:
            transaction = Transaction()
            stage(transaction)
            await self.actor.supervisor.store.commit(transaction)
        self._recorded(done)

    async def flush_main(self, end: int, line: int) -> None:
        self.state.offset, self.state.lines = end, line
        await self._commit(self.main, self.main_usage, None, self.state)
        self.main = []
        self.main_usage.clear()

    async def flush_agents(self) -> None:
        """Each buffered sub-agent as a branch of the main thread that folds its last answer;
        one the window has no room for is appended to the main thread instead."""
        for key, agent in list(self.agents.items()):
            del self.agents[key]
            state = _copy(self.state)
            state.offset, state.lines = max(agent.end, state.offset), max(agent.line,
                                                                         state.lines)
            opened = await self._open_branch(key, agent.messages)
            if opened is None:
                await self._commit(agent.messages, agent.usage, None, state)
                self.state = state
                continue
            branch_id, rest = opened
            self.branches += 1
            await self._commit(rest, agent.usage, branch_id, state)
            self.state = state
            if branch_id in self.actor.branches.live:
                await self.actor.return_branch(BranchReturnParams(
                    branch_id=branch_id, message=_answer(agent.messages)))

    async def _open_branch(self, key: str, messages: list[MessageIn]
                           ) -> tuple[str, list[MessageIn]] | None:
        """A branch for a sub-agent, its first user message as the prompt (that message is
        then the branch's opening, not appended again); the messages left to append."""
        first = next((i for i, m in enumerate(messages) if m.role == "user"
                      and isinstance(m.content, str) and m.content.strip()), None)
        prompt = "(sub-agent)" if first is None else str(messages[first].content)
        try:
            created = await self.actor.create_branch(BranchCreateParams(
                session_id=self.actor.session_id, description=f"sub-agent {key}"[:500],
                prompt=prompt[:AGENT_PROMPT_CHARS], budget=AGENT_BUDGET,
                timeout_seconds=AGENT_TIMEOUT_S, inject_memories=False,
                parent_branch_id=None))
        except CtxdError:
            return None
        if first is not None and len(prompt) <= AGENT_PROMPT_CHARS:
            self.messages_added += 1
            messages = messages[:first] + messages[first + 1:]
        return created.branch_id, messages


def _copy(state: _State) -> _State:
    """A copy of the position, as a transaction commits it."""
    return _State(state.offset, state.lines, state.size, state.head_bytes, state.head_hash)


def _answer(messages: list[MessageIn]) -> str:
    """A sub-agent's final answer: the text of its last assistant message that has any."""
    for message in reversed(messages):
        if message.role != "assistant":
            continue
        text = message.content if isinstance(message.content, str) else "\n".join(
            part.get("text", "") for part in message.content if part.get("type") == "text")
        if text.strip():
            return text[:65_536]
    return "(the sub-agent left no answer)"


async def _import_claude_code(job: _Import, path: Path, size: int) -> int:
    """Read from the committed offset to the last complete line; the bytes read."""
    parser = ClaudeCodeParser()
    offset, line = job.state.offset, job.state.lines + 1
    read = 0
    with open_regular(path) as file:
        file.seek(offset)
        carry = b""
        while True:
            chunk = await trio.to_thread.run_sync(file.read, CHUNK_BYTES)
            if not chunk:
                break
            read += len(chunk)
            data = carry + chunk
            entries, used = await trio.to_thread.run_sync(parser.feed, data, offset, line)
            line += data[:used].count(b"\n")
            offset += used
            carry = data[used:]
            for entry in entries:
                if entry.thread is None and entry.kind == "message" and job.agents:
                    await job.flush_main(job.safe_end, job.safe_line)
                    await job.flush_agents()
                job.take(entry)
                if not job.agents:
                    job.safe_end, job.safe_line = entry.end, entry.line
                    if len(job.main) >= BATCH_MESSAGES:
                        await job.flush_main(entry.end, entry.line)
            if not job.agents:
                # Blank lines at the chunk's end move the position too.
                job.safe_end, job.safe_line = offset, line - 1
    if job.agents:
        await job.flush_main(job.safe_end, job.safe_line)
        await job.flush_agents()
    await job.flush_main(offset, line - 1)
    return read - len(carry)


async def _import_whole(job: _Import, entries: list[Entry], total: int) -> None:
    """A document read whole (an OpenCode export, Claude Code records as a JSON array): the
    records after the ``job.state.offset`` already imported (a record's position is its
    1-based index); a sub-agent's records, buffered, become its branch before the next
    main-thread record, as in a JSONL file."""
    for entry in entries:
        if entry.line <= job.state.offset:
            continue
        if entry.thread is None and entry.kind == "message" and job.agents:
            await job.flush_main(job.safe_end, job.safe_line)
            await job.flush_agents()
        job.take(entry)
        if not job.agents:
            job.safe_end = job.safe_line = entry.line
            if len(job.main) >= BATCH_MESSAGES:
                await job.flush_main(entry.line, entry.line)
    if job.agents:
        await job.flush_main(job.safe_end, job.safe_line)
        await job.flush_agents()
    await job.flush_main(total, total)


def subagent_files(path: Path) -> list[Path]:
    """The sub-agent transcripts Claude Code (2.1) writes beside a session's transcript,
    ``<dir>/<session id>/subagents/agent-*.jsonl``, in name order."""
    folder = path.parent / path.stem / "subagents"
    try:
        return sorted(found for found in folder.glob("agent-*.jsonl") if found.is_file())
    except OSError:
        return []


async def _import_file(actor: SessionActor, p: TranscriptImportParams, path: Path, size: int,
                       whole: tuple[list[Entry], int] | None,
                       subagent_file: bool = False) -> tuple[_Import, int, bool]:
    """One file from its committed position: the job (its counts), the bytes read and
    whether it was restarted."""
    store = actor.supervisor.store
    key = str(path)
    stored = await store.read(_load_state, actor.session_id, key)
    head_bytes = min(size, HEAD_BYTES) if stored is None else stored.head_bytes
    head = await trio.to_thread.run_sync(_head_hash, path, head_bytes)
    restarted = False
    if stored is not None:
        position = stored.offset if whole is None else stored.size
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
    state = stored or _State(head_bytes=head_bytes, head_hash=head)
    state.size = size
    live = await store.read(_load_live, actor.session_id)
    job = _Import(actor=actor, params=p, path=key, state=state, start_lines=state.lines,
                  live=live, subagent_file=subagent_file)
    job.safe_end, job.safe_line = state.offset, state.lines
    start = state.offset
    bytes_read = 0
    if whole is None:
        if state.offset < size:
            bytes_read = await _import_claude_code(job, path, size)
    else:
        entries, total = whole
        if total > state.offset or stored is None:
            await _import_whole(job, entries, total)
        bytes_read = size if job.state.offset > start or stored is None else 0
    return job, bytes_read, restarted


async def run_import(actor: SessionActor, p: TranscriptImportParams, path: Path, size: int,
                     whole: tuple[list[Entry], int] | None) -> TranscriptImportResult:
    """The import on the session's actor (one at a time per session): the file (``whole``:
    its entries and record count when it is read whole), then (Claude Code) the sub-agent
    files beside it, each from its own position, as branches."""
    created = actor.record is None
    await actor.open(SessionOpenParams(session_id=actor.session_id, project=p.project))
    job, bytes_read, restarted = await _import_file(actor, p, path, size, whole)
    jobs = [job]
    subagents = [] if p.format != "claude-code" else await trio.to_thread.run_sync(
        subagent_files, path)
    for found in subagents:
        try:
            found_size = (await trio.to_thread.run_sync(os.stat, found)).st_size
        except OSError:
            continue  # gone since it was listed
        sub, sub_bytes, _ = await _import_file(actor, p, found, found_size, None, True)
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
    actor.supervisor.bus.publish(actor.session_id, "transcript.imported", {
        name: value for name, value in msgspec.structs.asdict(result).items()
        if name not in ("malformed", "unknown_kept")} | {
        "malformed": len(result.malformed), "unknown_kept": sum(unknown.values())})
    return result


def register_import(dispatcher: Dispatcher, supervisor: Supervisor) -> None:
    """Add transcript.import to the dispatcher."""

    async def transcript_import(call: Call, p: TranscriptImportParams
                                ) -> TranscriptImportResult:
        path, size = check_path(p.path)
        session_id = p.session_id
        whole: tuple[list[Entry], int] | None = None
        if p.format == "opencode":
            if size > WHOLE_MAX_BYTES:
                raise params_error("$.path", f"{p.path} is {size} bytes; an OpenCode export "
                                             f"is read whole, at most {WHOLE_MAX_BYTES}")
            data = await trio.to_thread.run_sync(read_regular, path)
            try:
                info, entries, total = await trio.to_thread.run_sync(parse_opencode, data)
            except ValueError as exc:
                raise params_error("$.path", f"{p.path} is not an OpenCode export: {exc}"
                                   ) from exc
            whole = (entries, total)
            session_id = session_id or (info.get("id") if isinstance(info.get("id"), str)
                                        else None)
        elif await trio.to_thread.run_sync(_starts_array, path):
            # Claude Code records saved as one JSON array: read whole, like an export.
            if size > WHOLE_MAX_BYTES:
                raise params_error("$.path", f"{p.path} is {size} bytes; a JSON array of "
                                             f"records is read whole, at most "
                                             f"{WHOLE_MAX_BYTES}")
            data = await trio.to_thread.run_sync(read_regular, path)
            try:
                entries, total, found = await trio.to_thread.run_sync(
                    parse_claude_code_array, data)
            except ValueError as exc:
                raise params_error("$.path", f"{p.path} starts with [ but is not a JSON array "
                                             f"of Claude Code records: {exc}") from exc
            whole = (entries, total)
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
                                                                      whole))

    dispatcher.register("transcript.import", TranscriptImportParams, transcript_import)


__all__ = ["register_import", "run_import"]


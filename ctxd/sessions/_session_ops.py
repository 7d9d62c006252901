"""The session's own operations on its actor: session.open (a forked one seeded), .get,
.close, .delete; message.append, message.list, ctxd.render, budget.measure.

Above `_returns` and `_hygiene_ops` (an append enforces its branch and compacts the thread
it grew), below `_branch_ops` (a branch created with its first messages appends them)
(docs/architecture.md, "A session actor and its operations").
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from ctxd.errors import CtxdError, ErrorCode, invalid_state, params_error, scrub_failed
from ctxd.folding import Opening, rendered_tokens
from ctxd.hygiene import (
    ToolResultBlob,
    called_tools,
    deferred_note,
    ends_promotions,
    offload_off_loop,
    originals,
    stage_blobs,
    stage_use,
)
from ctxd.scrub import ScrubError, scrub, scrub_value
from ctxd.sessions import _queries as q
from ctxd.sessions._actor import SessionActor
from ctxd.sessions._hygiene_ops import auto_compact, tool_view
from ctxd.sessions._returns import enforce, enforce_all, live_branch, return_all
from ctxd.sessions._state import (
    SessionRecord,
    resolve_budget,
    thread_tokens,
)
from ctxd.store import Transaction
from ctxd.tokens import REPLY_PRIMING
from ctxd.transcripts import (
    anthropic_messages,
    anthropic_tools,
    openai_messages,
    openai_tools,
    recorded,
)
from ctxd.wire.types import (
    COMPONENTS,
    AppendedMessage,
    AppendRequest,
    Branch,
    BudgetMeasureParams,
    BudgetMeasureResult,
    CompactResult,
    Component,
    ForcedReturn,
    MessageAppendParams,
    MessageAppendResult,
    MessageIn,
    MessageListParams,
    MessageListResult,
    ProviderRenderResult,
    RenderParams,
    RenderResult,
    RenderStats,
    SessionDeleteResult,
    SessionOpenParams,
    SessionOpenResult,
    SessionResult,
    StoredMessage,
)

if TYPE_CHECKING:
    from ctxd.sessions._fork import Seed

log = logging.getLogger("ctxd.sessions")

_encode = msgspec.json.Encoder().encode


def _check_parts(messages: list[MessageIn]) -> None:
    for i, message in enumerate(messages):
        if isinstance(message.content, str):
            continue
        for j, part in enumerate(message.content):
            kind = part.get("type")
            if not isinstance(kind, str):
                raise params_error(f"$.messages[{i}].content[{j}].type",
                                   "every content part needs a string `type`")
            if kind == "text" and not isinstance(part.get("text"), str):
                raise params_error(f"$.messages[{i}].content[{j}].text",
                                   "a text part needs a string `text`")


def _shown(title: str | None) -> str | None:
    """A session's title as its events show it to every subscriber: scrubbed, or left out
    when it cannot be (what leaves a session is scrubbed, fail closed: docs/security.md)."""
    if title is None:
        return None
    try:
        return scrub(title).text
    except ScrubError:
        log.exception("a session title could not be scrubbed; its event leaves it out")
        return None


@dataclass(frozen=True)
class Opened:
    """A branch planned by `create_branch` that commits with the first append to it: the
    session's record with its opening counted, and the steps that write it."""

    planned: Opening
    record: SessionRecord
    stage: Callable[[Transaction], None]


async def open_session(actor: SessionActor, params: SessionOpenParams,
                       seed: Seed | None = None) -> SessionOpenResult:
    """session.open; ``seed``: the messages of a session forked from another, stored
    in the transaction that creates it (docs/protocol.md, "context.fork")."""
    now = time.time()
    services = actor.services
    if actor.record is not None and seed is not None:
        raise invalid_state(
            f"session {actor.session_id} exists; fork_from seeds a new session",
            "leave session_id out (a new id is made) or give one not in use",
            session_id=actor.session_id)
    if actor.record is None:
        record = SessionRecord(
            session_id=actor.session_id, project=params.project, title=params.title,
            state="open", budget=resolve_budget(params.budget, services.config.budget),
            created_at=now, updated_at=now)
        with services.sessions.open_slot():
            if seed is not None:
                await _create_seeded(actor, record, seed)
            else:
                await actor.save(record)
        services.sessions.created()
        services.bus.publish(actor.session_id, "session.opened",
                             {"project": record.project, "title": _shown(record.title),
                              "created": True})
        return SessionOpenResult(session=record.info(actor.branches), created=True,
                                 context_state=actor.context_state(),
                                 fork=msgspec.UNSET if seed is None else seed.info)
    record = dataclasses.replace(actor.record)
    reopened = record.state != "open"
    if reopened:
        record.state, record.closed_at = "open", None
    if params.budget is not None:
        record.budget = resolve_budget(params.budget, record.budget)
    record.project = params.project if params.project is not None else record.project
    record.title = params.title if params.title is not None else record.title
    if record != actor.record:
        record.updated_at = now
        if reopened:
            with services.sessions.open_slot():
                await actor.save(record)
        else:
            await actor.save(record)
    if reopened:
        services.bus.publish(actor.session_id, "session.opened",
                             {"project": record.project, "title": _shown(record.title),
                              "created": False})
    return SessionOpenResult(session=record.info(actor.branches), created=False,
                             context_state=actor.context_state())


async def _create_seeded(actor: SessionActor, record: SessionRecord, seed: Seed) -> None:
    """Create the session with its first messages and their blobs, in one
    transaction."""
    stored = [StoredMessage(seq=seq, role=m.role, content=m.content,
                            component="system_prompt" if m.role == "system"
                            else "conversation", tokens=tokens,
                            created_at=record.created_at, name=m.name,
                            tool_call_id=m.tool_call_id, meta=m.meta)
              for seq, (m, tokens) in enumerate(zip(seed.messages, seed.tokens,
                                                    strict=True), 1)]
    record.component_tokens = dict(record.component_tokens)
    for message in stored:
        record.component_tokens[message.component] += message.tokens
    record.last_seq = record.message_count = len(stored)
    transaction = Transaction()
    transaction.add(q.save_session, record)
    transaction.add(q.insert_messages, actor.session_id, stored)
    stage_blobs(transaction, actor.session_id,
                [blob.placed(blob.seq, None, record.created_at) for blob in seed.blobs])
    await actor.services.store.commit(transaction)
    actor.record = record


async def get_session(actor: SessionActor) -> SessionResult:
    """session.get: the session and where its context stands."""
    record = actor.require()
    return SessionResult(session=record.info(actor.branches),
                         context_state=actor.context_state())


async def close_session(actor: SessionActor) -> SessionResult:
    """session.close: its live branches force-returned (``session_closed``), then the
    session closed; a closed session is answered as it is."""
    record = actor.require()
    if record.state == "open":
        await return_all(actor, "session_closed")
        record = actor.require()
        now = time.time()
        closed = dataclasses.replace(record, state="closed", closed_at=now, updated_at=now)
        await actor.save(closed)
        record = closed
        actor.services.sessions.closed()
        actor.services.bus.publish(actor.session_id, "session.closed",
                                   {"message_count": record.message_count,
                                    "total_tokens": actor.context_state().total_tokens})
    return SessionResult(session=record.info(actor.branches),
                         context_state=actor.context_state())


async def delete_session(actor: SessionActor) -> SessionDeleteResult:
    """session.delete: its live branches force-returned (``session_deleted``), then the
    session and everything of it deleted."""
    record = actor.require()
    if actor.branches.live:
        await return_all(actor, "session_deleted")
    deleted = await actor.services.store.write(q.delete_session, actor.session_id)
    actor.services.bus.forget(actor.session_id)
    actor.branches.deleted()
    actor.services.sessions.deleted(was_open=record.state == "open")
    actor.record = None
    actor.services.bus.publish(actor.session_id, "session.deleted",
                               {"messages_deleted": deleted})
    return SessionDeleteResult(session_id=actor.session_id, deleted=True,
                               messages_deleted=deleted)


def _at_rest(actor: SessionActor, messages: list[MessageIn],
             consequence: str) -> list[MessageIn]:
    """The messages as the session stores them: as given, or with ``scrub_at_rest``
    their text scrubbed (docs/security.md "What is stored as given")."""
    if not actor.services.config.scrub_at_rest:
        return messages
    try:
        return [msgspec.structs.replace(message, content=scrub_value(message.content))
                for message in messages]
    except ScrubError as exc:
        raise scrub_failed("a message", exc, consequence) from exc


def text_at_rest(actor: SessionActor, text: str, consequence: str) -> str:
    """A text of the session's own, as it is stored (see `_at_rest`)."""
    if not actor.services.config.scrub_at_rest:
        return text
    try:
        return scrub(text).text
    except ScrubError as exc:
        raise scrub_failed("a message", exc, consequence) from exc


async def append_request(actor: SessionActor, params: AppendRequest) -> MessageAppendResult:
    """message.append as a client sends it: its messages in ctxd's form or a provider's,
    recorded in ctxd's (docs/protocol.md, "Provider shapes")."""
    return await append(actor, MessageAppendParams(
        session_id=params.session_id, messages=recorded(params.messages),
        branch_id=params.branch_id, allow_over=params.allow_over))


async def append(actor: SessionActor, params: MessageAppendParams,
                 stage: Callable[[Transaction], None] | None = None) -> MessageAppendResult:
    """message.append; ``stage`` adds a caller's steps to the append's transaction (the
    importer's read position and usage: docs/protocol.md, "transcript.import")."""
    actor.require_open()
    messages, offloads = await prepared(actor, params.messages,
                                        actor.require().last_seq + 1, "nothing was appended")
    branch = None
    if params.branch_id is not None:
        branch = await live_branch(actor, params.branch_id, for_append=True)
    return await append_prepared(actor, params, branch, messages, offloads, [], stage)


async def prepared(actor: SessionActor, messages: list[MessageIn], first_seq: int,
                   nothing: str
                   ) -> tuple[list[MessageIn], list[tuple[MessageIn, ToolResultBlob] | None]]:
    """``messages`` checked and as they are stored (`_at_rest`; ``nothing`` says what a
    failure left undone), with the offload of each, numbered from ``first_seq`` (a very
    long one off the event loop: `offload_off_loop`)."""
    _check_parts(messages)
    at_rest = _at_rest(actor, messages, nothing)
    threshold = actor.services.config.hygiene.offload_threshold_bytes
    return at_rest, [await offload_off_loop(message, threshold, actor.session_id,
                                            first_seq + offset)
                     for offset, message in enumerate(at_rest)]


async def append_prepared(actor: SessionActor, params: MessageAppendParams,
                          branch: Branch | None, messages: list[MessageIn],
                          offloads: list[tuple[MessageIn, ToolResultBlob] | None],
                          compactions: list[CompactResult],
                          stage: Callable[[Transaction], None] | None = None,
                          opened: Opened | None = None) -> MessageAppendResult:
    """Store ``messages`` (as `prepared` made them), the large tool results among them as
    their stubs (``offloads``) with their blobs, in one transaction. Should that commit
    fail with blobs in it, the append is made again with every result inline
    (docs/decisions.md, Hygiene).

    An append that would pass the hard block first has the thread compacted (when
    ``auto_compact`` is on); one that brings it to the compact trigger is followed by a
    compaction (``compactions``: those run, docs/protocol.md, "Compaction").

    ``opened``: ``branch`` is new, created in the same transaction (``allow_over``)."""
    record = actor.require() if opened is None else opened.record
    shown = [message if offloaded is None else offloaded[0]
             for message, offloaded in zip(messages, offloads, strict=True)]
    counts = await actor.services.counter.count_messages(shown)
    tokens_appended = sum(counts)

    def would_use() -> int:
        thread_before = (actor.require().main_message_tokens if branch is None
                         else rendered_tokens(branch))
        return thread_before + tokens_appended + REPLY_PRIMING

    window = record.budget.effective_window
    if would_use() / window >= record.budget.hard_block and not params.allow_over:
        done = await auto_compact(actor, branch, room=tokens_appended, before_append=True)
        if done is not None:
            compactions.append(done)
            record = actor.require()
            if branch is not None:
                branch = actor.branches.live[branch.branch_id]
        if would_use() / window >= record.budget.hard_block:
            raise actor.over_hard_block(would_use(), tokens_appended)
    health_before = actor.require().health(actor.branches)
    now = time.time()
    updated = record.appended(len(messages), now)
    stored: list[StoredMessage] = []
    blobs: list[ToolResultBlob] = []
    for offset, (message, offloaded, tokens) in enumerate(
            zip(shown, offloads, counts, strict=True)):
        component: Component = message.component or (
            "system_prompt" if message.role == "system" else "conversation")
        if branch is None:
            updated.component_tokens[component] += tokens
        seq = record.last_seq + offset + 1
        stored.append(StoredMessage(
            seq=seq, role=message.role, content=message.content,
            component=component, tokens=tokens, created_at=now, name=message.name,
            tool_call_id=message.tool_call_id, meta=message.meta,
            branch_id=params.branch_id))
        if offloaded is not None:
            blobs.append(offloaded[1].placed(seq, params.branch_id, now))
    transaction = Transaction()
    if opened is not None:
        opened.stage(transaction)
    transaction.add(q.insert_messages, actor.session_id, stored)
    stage_blobs(transaction, actor.session_id, blobs)
    if any(m.role == "assistant" for m in messages):
        stage_use(transaction, actor.session_id,
                  {name: seq for seq, m in enumerate(messages, record.last_seq + 1)
                   for name in called_tools(m)},
                  end_promotions=any(ends_promotions(m) for m in messages))
    grown = None
    if branch is None:
        updated.message_count += len(messages)
    else:
        grown = actor.branches.charge(branch, tokens_appended,
                                      sum(m.role == "assistant" for m in messages))
        actor.branches.stage_meter(transaction, grown)
    transaction.add(q.save_counters, updated)
    if stage is not None:
        stage(transaction)
    bus = actor.services.bus
    events: list[tuple[str, dict[str, Any]]] = [
        ("result.offloaded",
         {"branch_id": blob.branch_id, "seq": blob.seq, "ref_id": blob.ref_id,
          "tool_name": blob.tool_name, "size_bytes": blob.size_bytes,
          "tokens": counts[blob.seq - stored[0].seq]}) for blob in blobs]
    events.append(("message.appended",
                   {"branch_id": params.branch_id, "first_seq": stored[0].seq,
                    "last_seq": stored[-1].seq, "count": len(stored),
                    "tokens": tokens_appended,
                    "main_thread_tokens": updated.main_thread_tokens}))
    # Written with the append (docs/decisions.md, Events), unless a branch's events
    # (created, budget warning) are to come first: they are published after the commit.
    staged = branch is None and opened is None
    if staged:
        bus.stage(transaction, actor.session_id, events)
    try:
        with (contextlib.nullcontext() if opened is None
              else actor.branches.registry.slot()):
            await actor.services.store.commit(transaction)
    except Exception as exc:
        if not blobs or (isinstance(exc, CtxdError) and exc.code == ErrorCode.CANCELLED):
            raise  # a cancelled request writes nothing, inline or not
        log.warning("session %s: %d tool result(s) could not be offloaded, appended "
                    "inline instead: %s: %s", actor.session_id, len(blobs),
                    type(exc).__name__, exc)
        bus.publish(actor.session_id, "result.offload_failed",
                    {"branch_id": params.branch_id, "count": len(blobs),
                     "error": f"{type(exc).__name__}: {exc}"})
        return await append_prepared(actor, params, branch, messages,
                                     [None] * len(messages), compactions, stage, opened)
    actor.record = updated
    if opened is not None:
        actor.branches.created(opened.planned)
    if branch is not None and grown is not None:
        actor.branches.charged(branch, grown)
    state = actor.context_state()
    if not staged:
        for kind, data in events:
            bus.publish(actor.session_id, kind, data)
    if state.health != health_before:
        bus.publish(actor.session_id, "context.health",
                    {"from": health_before, "to": state.health, "usage": state.usage})
    forced: list[ForcedReturn] = []
    if grown is not None:
        # The append has committed: a failure of the forced return is retried when the
        # branch is next touched, and does not turn this answer into an error.
        forced = await enforce(actor, grown)
    thread = None if branch is None else actor.branches.live.get(branch.branch_id)
    if branch is None or thread is not None:
        done = await auto_compact(actor, thread)
        if done is not None:
            compactions.append(done)
    refs = {blob.seq: blob.ref_id for blob in blobs}
    return MessageAppendResult(
        appended=[AppendedMessage(seq=m.seq, tokens=m.tokens, component=m.component,
                                  ref_id=refs.get(m.seq),
                                  stub=m.content if m.seq in refs
                                  and isinstance(m.content, str) else None)
                  for m in stored],
        tokens_appended=tokens_appended, forced_returns=forced,
        # On the main thread, unchanged since `state` unless a compaction ran.
        context_state=state if branch is None and done is None and actor.record is updated
        else actor.context_state(), compactions=compactions)


async def list_messages(actor: SessionActor, params: MessageListParams) -> MessageListResult:
    """message.list: a page of a thread's archive, offloaded tool results whole."""
    actor.require()
    if params.branch_id is not None:
        await actor.branches.stored(params.branch_id)
    after = int(params.cursor) if params.cursor else 0
    messages = await actor.services.store.read(_whole_messages, actor.session_id,
                                               params.branch_id, after, params.limit + 1)
    more = len(messages) > params.limit
    messages = messages[:params.limit]
    return MessageListResult(messages=messages,
                             next_cursor=str(messages[-1].seq) if more else None,
                             context_state=actor.context_state())


def _whole_messages(conn: Any, session_id: str, branch_id: str | None, after: int,
                    limit: int) -> list[StoredMessage]:
    """A page of the archive, each offloaded tool result whole with its ``ref_id``
    (in the store's thread)."""
    messages = q.list_messages(conn, session_id, branch_id, after, limit)
    whole = originals(conn, session_id,
                      [m.seq for m in messages if m.role == "tool"])
    return [m if m.seq not in whole else msgspec.structs.replace(
                m, content=whole[m.seq][1], ref_id=whole[m.seq][0]) for m in messages]


async def render_request(actor: SessionActor, params: RenderParams
                         ) -> RenderResult | ProviderRenderResult:
    """ctxd.render: `render`, in ctxd's form or (``format``) a provider's
    (docs/protocol.md, "Provider shapes")."""
    if params.format == "ctxd":
        return await render(actor, params)
    metas: list[dict[str, Any] | None] = []
    done = await render(actor, params, metas)
    rows = list(zip(done.messages, metas, strict=True))
    if params.format == "openai":
        system, messages = None, openai_messages(rows)
        tools = openai_tools(done.tools)
    else:
        system, messages = anthropic_messages(rows)
        tools = anthropic_tools(done.tools)
    return ProviderRenderResult(
        format=params.format, branch_id=done.branch_id, messages=messages, system=system,
        tokens=done.tokens, context_state=done.context_state, stats=done.stats, tools=tools,
        tool_tokens=done.tool_tokens, tools_note=done.tools_note,
        context_note=done.context_note)


async def render(actor: SessionActor, params: RenderParams,
                 metas: list[dict[str, Any] | None] | None = None) -> RenderResult:
    """ctxd.render: the active thread (or the one asked for) as the model is to see it,
    with the tools that are not deferred; ``metas`` gets each message's ``meta``."""
    if params.branch_id is msgspec.UNSET:
        await enforce_all(actor)
        active = actor.branches.active
        branch_id = None if active is None else active.branch_id
    else:
        branch_id = params.branch_id
        if branch_id is not None:
            live = actor.branches.live.get(branch_id)
            if live is not None:
                await enforce(actor, live)
            else:
                await actor.branches.stored(branch_id)
    record = actor.require()
    messages, message_tokens = await actor.services.store.read(
        q.render_rows, actor.session_id, branch_id, metas)
    tokens = thread_tokens(message_tokens, len(messages))
    shown, deferred = await tool_view(actor)
    usage = tokens / record.budget.effective_window
    note = actor.services.config.hygiene.context_note
    return RenderResult(
        context_note=note.format(percent=round(usage * 100))
        if note and usage >= record.budget.warn else None,
        branch_id=branch_id, messages=messages, tokens=tokens,
        context_state=actor.context_state(),
        stats=RenderStats(message_count=len(messages), stored_messages=record.last_seq,
                          message_tokens=message_tokens,
                          reply_priming_tokens=tokens - message_tokens),
        tools=[tool.definition() for tool in shown],
        tool_tokens=sum(tool.tokens for tool in shown),
        tools_note=deferred_note(len(deferred)) if deferred else None)


async def measure(actor: SessionActor, params: BudgetMeasureParams) -> BudgetMeasureResult:
    """budget.measure: the session's budget with the given prompts and tools added."""
    record = actor.require()
    counter = actor.services.counter
    extra: dict[Component, int] = dict.fromkeys(COMPONENTS, 0)
    if params.system_prompt is not None:
        # Counted as the system message it will be (the rule lives in TokenCounter).
        [extra["system_prompt"]] = await counter.count_messages(
            [MessageIn(role="system", content=params.system_prompt)])
    # One batch: its counting is bounded on the loop by total size, not item by item
    # (docs/performance.md, A request does not hold the loop).
    skills = list(params.skill_prompts or ())
    tools = [_encode(tool).decode() for tool in params.tool_definitions or ()]
    counts = await counter.count_texts(skills + tools)
    extra["skill_prompts"] += sum(counts[:len(skills)])
    extra["tool_descriptions"] += sum(counts[len(skills):])
    active, _ = await tool_view(actor)
    extra["tool_descriptions"] += sum(tool.tokens for tool in active)
    parts = {c: record.component_tokens[c] + extra[c] for c in COMPONENTS}
    message_total = sum(parts.values())
    used = message_total + REPLY_PRIMING if message_total else 0
    window = record.budget.effective_window
    usage = used / window
    return BudgetMeasureResult(
        total=record.budget.context_window, max_output_tokens=record.budget.max_output_tokens,
        effective_window=window, system_prompt=parts["system_prompt"],
        skill_prompts=parts["skill_prompts"], tool_descriptions=parts["tool_descriptions"],
        conversation=parts["conversation"], used=used, remaining=window - used,
        used_pct=round(usage * 100, 4),
        should_compact=usage >= record.budget.compact_trigger,
        is_blocked=record.budget.health(usage) == "blocked",
        context_state=actor.context_state())

"""Context hygiene on a session's actor: compaction (asked for and automatic) and its
snapshot, session.resume, result.read of an offloaded tool result, and tool deferral
(tools.register, tools.search, the tools a render shows) (docs/protocol.md, "Compaction",
"Offloaded tool results", "Tool deferral").

Above `_returns` (a compaction enforces the thread's branches first), below the session's
and the branches' operations, which compact after they grow a thread
(docs/architecture.md, "A session actor and its operations").
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import regex
import trio

from ctxd.errors import CtxdError, ErrorCode, invalid_state, not_found, params_error
from ctxd.folding import OPENING_META, rendered_tokens
from ctxd.hygiene import (
    SessionTool,
    Snapshot,
    blob_session,
    check_tools,
    compile_pattern,
    counted_form,
    defer,
    grep,
    load_blob,
    load_snapshot,
    load_tools,
    page,
    rank,
    save_snapshot,
    stage_blobs,
    stage_promote,
    stage_register,
)
from ctxd.jobs import cancellation_point
from ctxd.sessions import _queries as q
from ctxd.sessions._actor import SessionActor
from ctxd.sessions._compaction import STRATEGIES, Plan, thread_view
from ctxd.sessions._returns import enforce_all, live_branch
from ctxd.sessions._state import COMPACT_BREAKER, SessionRecord, thread_tokens
from ctxd.store import Transaction
from ctxd.tokens import REPLY_PRIMING
from ctxd.wire.types import (
    Branch,
    CompactResult,
    ContextCompactParams,
    ContextCompactResult,
    RegisteredTool,
    ResultReadParams,
    ResultReadResult,
    SessionResumeResult,
    Strategy,
    ToolDefinition,
    ToolMatch,
    ToolsRegisterParams,
    ToolsRegisterResult,
    ToolsSearchParams,
    ToolsSearchResult,
)

if TYPE_CHECKING:
    from ctxd.sessions._supervisor import Supervisor

log = logging.getLogger("ctxd.sessions")

SEARCH_TIMEOUT_S = 5.0
"""How long `result.read`'s pattern search may run (10 MB take about 15 ms)."""
DEFAULT_PAGE_CHARS = 8_000
"""Characters `result.read` returns when it is given no ``limit``."""


@dataclass(frozen=True)
class Search:
    """`result.read`'s search of a blob, which its session's actor hands out: it runs off
    the mailbox, so that slow searches do not hold up the session's other requests (the
    blob's text, read under the actor, is a value: the search sees the blob as it was)."""

    shape: ResultReadResult
    """The result without its matches."""
    text: str
    pattern: regex.Pattern[str]
    max_matches: int

    async def run(self, limiter: trio.CapacityLimiter) -> ResultReadResult:
        """The result with its matches, searched in a worker thread of ``limiter``.

        Raises:
            CtxdError: -32602 when the search does not end within `SEARCH_TIMEOUT_S`.

        Cancellation: `request.cancel` stops the wait at once (-32006); a search already
        running ends in its thread within `SEARCH_TIMEOUT_S`, its result dropped.
        """
        try:
            with cancellation_point():
                matches, matched = await trio.to_thread.run_sync(
                    grep, self.text, self.pattern, self.max_matches, SEARCH_TIMEOUT_S,
                    limiter=limiter, abandon_on_cancel=True)
        except TimeoutError:
            raise params_error(
                "$.pattern", f"the search did not end within {SEARCH_TIMEOUT_S:g} s (a "
                             "pattern with nested repetition can backtrack without end); "
                             "simplify it, or pass literal=true") from None
        return msgspec.structs.replace(self.shape, matches=matches, matched_lines=matched,
                                       more_matches=matched - len(matches))


async def session_of_result(supervisor: Supervisor, p: ResultReadParams) -> str:
    """The session whose actor serves a result.read: ``p.session_id`` when given, else
    the one that holds ``p.ref_id`` (``ctxctl result REF`` names no session).

    Raises:
        CtxdError: -32004 when no session holds the ref.
    """
    if p.session_id is not None:
        return p.session_id
    session_id = await supervisor.store.read(blob_session, p.ref_id)
    if session_id is None:
        raise not_found("ref", p.ref_id, "use a ref_id from a stub that ctxd wrote")
    return session_id


async def read_result(actor: SessionActor, p: ResultReadParams) -> ResultReadResult | Search:
    """result.read: a page of an offloaded tool result of this session, or the search
    for its lines that match ``pattern``, to run off the mailbox (docs/protocol.md,
    "Offloaded tool results")."""
    actor.require()
    pattern = None
    if p.pattern is not None:
        if p.offset is not msgspec.UNSET or p.limit is not msgspec.UNSET:
            raise params_error("$.offset" if p.offset is not msgspec.UNSET else "$.limit",
                               "offset and limit page the text; a pattern searches all "
                               "of it: leave them out (max_matches bounds the lines)")
        pattern = compile_pattern(p.pattern, p.literal)
    blob = await actor.services.store.read(load_blob, actor.session_id, p.ref_id)
    if blob is None:
        raise not_found("ref", p.ref_id, "use a ref_id from a stub in this session's "
                                         "ctxd.render or message.list")
    shape = ResultReadResult(ref_id=p.ref_id, tool_name=blob.tool_name,
                             size_bytes=blob.size_bytes, total_chars=len(blob.text),
                             seq=blob.seq, branch_id=blob.branch_id)
    if pattern is None:
        offset = 0 if p.offset is msgspec.UNSET else p.offset
        limit = DEFAULT_PAGE_CHARS if p.limit is msgspec.UNSET else p.limit
        content, next_offset = page(blob.text, offset, limit)
        return msgspec.structs.replace(shape, offset=offset, content=content,
                                       next_offset=next_offset)
    return Search(shape, blob.text, pattern, p.max_matches)


def _thread_used(actor: SessionActor, branch: Branch | None) -> int:
    """Rendered tokens of a thread: the main thread, or a branch with its prefix."""
    if branch is None:
        return actor.require().main_thread_tokens
    return rendered_tokens(branch) + REPLY_PRIMING


def _live_children(actor: SessionActor, thread: str | None) -> list[str]:
    """The live branches that started from ``thread`` (None: the main thread)."""
    return [b.branch_id for b in actor.branches.live.values()
            if b.parent_branch_id == thread]


async def compact(actor: SessionActor, p: ContextCompactParams) -> ContextCompactResult:
    """context.compact: run the chain on the main thread or on a live branch."""
    actor.require_open()
    branch = None
    if p.branch_id is None:
        await enforce_all(actor)
    else:
        branch = await live_branch(actor, p.branch_id, for_append=False)
    children = _live_children(actor, p.branch_id)
    if children:
        raise invalid_state(
            f"the thread has live branches that started from its context "
            f"({', '.join(children)}); compacting it would change what they see",
            "return them first (branch.return), or compact one of them with its branch_id",
            session_id=actor.session_id, branch_id=p.branch_id, live_branches=children)
    strategies = tuple(p.strategies) if p.strategies else STRATEGIES
    done = await _compact(actor, branch, strategies, automatic=False)
    return ContextCompactResult(**msgspec.structs.asdict(done),
                                context_state=actor.context_state())


async def auto_compact(actor: SessionActor, branch: Branch | None, room: int = 0,
                       before_append: bool = False) -> CompactResult | None:
    """Compact a thread that reached the compact trigger (``before_append``: that an
    append of ``room`` tokens would bring past the hard block), when ``auto_compact``
    is on, the breaker has not tripped, and no live branch started from it. A storage
    failure is logged: the request that triggered it stands; but before an append, the
    append cannot fit without the compaction, so the failure is its answer (-32008
    with the cause, not -32001)."""
    record = actor.require()
    if not actor.services.config.hygiene.auto_compact or record.auto_compact_paused \
            or record.state != "open":
        return None
    thread = None if branch is None else branch.branch_id
    if _live_children(actor, thread):
        return None
    limit = record.budget.hard_block if before_append else record.budget.compact_trigger
    if (_thread_used(actor, branch) + room) / record.budget.effective_window < limit:
        return None
    try:
        return await _compact(actor, branch, STRATEGIES, automatic=True, room=room)
    except CtxdError as error:
        if error.code != ErrorCode.STORAGE_ERROR:
            raise
        if before_append:
            raise CtxdError(error.code, f"{error.message} (the automatic compaction this "
                            "append needed to fit could not be written)",
                            error.data) from error
        log.warning("session %s: automatic compaction not written: %s", actor.session_id,
                    error.message)
        return None


async def _compact(actor: SessionActor, branch: Branch | None,
                   strategies: tuple[Strategy, ...], *, automatic: bool,
                   room: int = 0) -> CompactResult:
    """Plan the chain on the thread, then write it in one transaction with the
    session's counters (or the branch's meter) and the breaker; then the snapshot."""
    services = actor.services
    record = actor.require()
    health_before = actor.context_state().health
    thread = None if branch is None else branch.branch_id
    window = record.budget.effective_window
    target = math.floor(window * min(services.config.hygiene.compact_target,
                                     record.budget.compact_trigger))
    before = _thread_used(actor, branch)
    needed = before > target - room
    now = time.time()
    plan = Plan(session_id=actor.session_id, thread=thread, next_seq=record.last_seq + 1,
                now=now, used=before)
    if needed or branch is not None:
        view = await services.store.read(thread_view, actor.session_id, thread, OPENING_META)
        with cancellation_point():  # the summarizer may take long; nothing is written
            after = await services.compactor.plan(view, plan, target - room, strategies)
        before_msgs, after_msgs = len(view), len(after)
    else:
        # Under its target the chain stops at once: the main thread is not read (its
        # kept messages are the record's count), so a storm of compactions of a thread
        # that needs none costs its session nothing (docs/decisions.md, "One session's
        # storm").
        before_msgs = after_msgs = record.message_count
    shrank = plan.used < before
    updated = dataclasses.replace(record, component_tokens=dict(record.component_tokens))
    transaction = Transaction()
    grown = None
    if shrank:
        updated.last_seq, updated.updated_at = plan.next_seq - 1, now
        updated.compact_failures = 0
        transaction.add(q.insert_messages, actor.session_id, plan.replacements)
        transaction.add(q.mark_compacted, actor.session_id, plan.marks)
        stage_blobs(transaction, actor.session_id, plan.blobs)
        if branch is None:
            updated.compactions, updated.compacted_at = record.compactions + 1, now
            for component, tokens in plan.removed.items():
                updated.component_tokens[component] -= tokens
            updated.component_tokens["conversation"] += plan.added
            updated.message_count += len(plan.replacements) - len(plan.marks)
        else:
            grown = actor.branches.charge(branch, plan.used - before, 0)
            actor.branches.stage_meter(transaction, grown)
    elif needed:
        updated.compact_failures += 1
    if updated != record:
        transaction.add(q.save_counters, updated)
        await services.store.commit(transaction)
        actor.record = updated
        if branch is not None and grown is not None:
            actor.branches.charged(branch, grown)
    snapshot_saved = shrank and branch is None and await _snapshot(actor, updated)
    result = CompactResult(
        branch_id=thread, before_tokens=before, after_tokens=plan.used,
        tokens_recovered=before - plan.used, target_tokens=target - room,
        before_msgs=before_msgs, after_msgs=after_msgs, strategies_run=plan.strategies_run,
        cleared=plan.counts["cleared"], summarized=plan.counts["summarized"],
        truncated=plan.counts["truncated"], summarizer=plan.summarizer,
        summarizer_error=plan.summarizer_error, snapshot_saved=snapshot_saved,
        automatic=automatic)
    bus = services.bus
    if needed or shrank:
        bus.publish(actor.session_id, "context.compacted",
                    msgspec.structs.asdict(result) | {
                        "compact_failures": updated.compact_failures})
    if updated.compact_failures == COMPACT_BREAKER > record.compact_failures:
        log.warning("session %s: %d compactions in a row did not shrink the context; "
                    "automatic compaction is paused", actor.session_id, COMPACT_BREAKER)
        bus.publish(actor.session_id, "context.auto_compact_paused",
                    {"branch_id": thread, "compact_failures": updated.compact_failures})
    state = actor.context_state()
    if state.health != health_before:
        bus.publish(actor.session_id, "context.health",
                    {"from": health_before, "to": state.health, "usage": state.usage})
    return result


async def _snapshot(actor: SessionActor, record: SessionRecord) -> bool:
    """Save the compacted main thread as the session's snapshot. A failure is logged
    and published, and leaves `session.resume` on the thread itself (docs/decisions.md,
    Hygiene)."""
    store = actor.services.store
    try:
        messages, message_tokens = await store.read(q.render_rows, actor.session_id, None)
        assert record.compacted_at is not None
        await store.write(save_snapshot, actor.session_id, Snapshot(
            compaction=record.compactions, through_seq=record.last_seq,
            compacted_at=record.compacted_at, message_tokens=message_tokens,
            messages=messages))
    except Exception as exc:
        log.warning("session %s: the snapshot of its compaction could not be saved "
                    "(session.resume gives the thread instead): %s: %s", actor.session_id,
                    type(exc).__name__, exc)
        actor.services.bus.publish(actor.session_id, "snapshot.failed",
                                   {"error": f"{type(exc).__name__}: {exc}"})
        return False
    return True


async def resume(actor: SessionActor) -> SessionResumeResult:
    """session.resume: the latest snapshot and what came after it; the main thread
    when there is no current snapshot."""
    record = actor.require()
    store = actor.services.store
    snapshot = await store.read(load_snapshot, actor.session_id)
    if snapshot is not None and snapshot.compaction == record.compactions:
        later, later_tokens = await store.read(q.main_rows_after, actor.session_id,
                                               snapshot.through_seq)
        messages = snapshot.messages + later
        return SessionResumeResult(
            session_id=actor.session_id, source="snapshot",
            compacted_at=snapshot.compacted_at, messages=messages,
            tokens=thread_tokens(snapshot.message_tokens + later_tokens, len(messages)),
            context_state=actor.context_state())
    messages, message_tokens = await store.read(q.render_rows, actor.session_id, None)
    return SessionResumeResult(
        session_id=actor.session_id, source="thread", compacted_at=None, messages=messages,
        tokens=thread_tokens(message_tokens, len(messages)),
        context_state=actor.context_state())


def _tool_threshold(actor: SessionActor) -> int:
    return math.floor(actor.services.config.hygiene.tool_deferral_threshold
                      * actor.require().budget.effective_window)


async def tool_view(actor: SessionActor) -> tuple[list[SessionTool], list[SessionTool]]:
    """The session's active and deferred tools. Should the deferral fail, every tool is
    active: it costs context, never the request (docs/decisions.md, Hygiene)."""
    tools = await actor.services.store.read(load_tools, actor.session_id)
    try:
        active, deferred = defer(tools, _tool_threshold(actor))
    except Exception as exc:
        log.exception("session %s: tool deferral failed; every tool is rendered",
                      actor.session_id)
        actor.services.bus.publish(actor.session_id, "tools.deferral_failed",
                                   {"tools": len(tools),
                                    "error": f"{type(exc).__name__}: {exc}"})
        return tools, []
    names = tuple(tool.name for tool in deferred)
    if names != actor.tools_deferred:
        actor.tools_deferred = names
        actor.services.bus.publish(actor.session_id, "tools.deferred", {
            "count": len(names), "names": list(names),
            "active_tokens": sum(tool.tokens for tool in active),
            "deferred_tokens": sum(tool.tokens for tool in deferred),
            "threshold_tokens": _tool_threshold(actor)})
    return active, deferred


async def offered_tools(actor: SessionActor, tools: list[ToolDefinition],
                        register: bool) -> frozenset[str]:
    """Which of the tools an agent's model request offers (``tools``, each name once) the
    session defers now: they are registered first (``register``, when they are not the
    ones registered last), then deferred as tools.register's are, among themselves (a tool
    registered before and no longer offered neither counts nor comes back)."""
    actor.require_open()
    store = actor.services.store
    digest = hashlib.blake2b(msgspec.json.encode(tools), digest_size=16).digest()
    if register and digest != actor.tools_offered:
        counts = await actor.services.counter.count_texts([counted_form(t) for t in tools])
        transaction = Transaction()
        stage_register(transaction, actor.session_id, list(zip(tools, counts, strict=True)),
                       time.time())
        await store.commit(transaction)
        actor.tools_offered = digest
    names = {tool.name for tool in tools}
    registered = [tool for tool in await store.read(load_tools, actor.session_id)
                  if tool.name in names]
    _, deferred = defer(registered, _tool_threshold(actor))
    return frozenset(tool.name for tool in deferred)


async def register_tools(actor: SessionActor, p: ToolsRegisterParams) -> ToolsRegisterResult:
    """tools.register: the tools counted and stored; which of them are deferred."""
    actor.require_open()
    check_tools(p.tools)
    counts = await actor.services.counter.count_texts([counted_form(t) for t in p.tools])
    before = {tool.name for tool in
              await actor.services.store.read(load_tools, actor.session_id)}
    transaction = Transaction()
    stage_register(transaction, actor.session_id, list(zip(p.tools, counts, strict=True)),
                   time.time())
    await actor.services.store.commit(transaction)
    active, deferred = await tool_view(actor)
    return ToolsRegisterResult(
        registered=[RegisteredTool(name=tool.name, tokens=tokens,
                                   replaced=tool.name in before)
                    for tool, tokens in zip(p.tools, counts, strict=True)],
        total_tools=len(active) + len(deferred),
        total_tokens=sum(tool.tokens for tool in [*active, *deferred]),
        threshold_tokens=_tool_threshold(actor),
        deferred=[tool.name for tool in deferred])


async def search_tools(actor: SessionActor, p: ToolsSearchParams) -> ToolsSearchResult:
    """tools.search: the deferred tools that match, promoted to active."""
    actor.require()
    _, deferred = await tool_view(actor)
    found = rank(deferred, p.query)[:p.limit]
    if found:
        transaction = Transaction()
        stage_promote(transaction, actor.session_id, [tool.name for tool, _ in found])
        await actor.services.store.commit(transaction)
        # The promoted tools may push others out, to stay under the threshold.
        _, deferred = await tool_view(actor)
    return ToolsSearchResult(
        matches=[ToolMatch(name=tool.name, source=tool.source,
                           description=tool.description, input_schema=tool.input_schema,
                           score=score, tokens=tool.tokens)
                 for tool, score in found],
        deferred=len(deferred))

"""Folding operations, run by a SessionActor in order with its session's other requests.

Create, return (fold), force-return, status, list, rollback, and the arming of BranchActors
when a session with live branches is loaded. Every change is written in one transaction
first and applied to the actor's in-memory record only once it has committed.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from ctxd.errors import CtxdError, ErrorCode, not_found
from ctxd.folding import _queries as q
from ctxd.folding._actor import BranchActor
from ctxd.folding._state import FORCED_STATUS, BranchRecord, branch_note, fold_text, partial_result
from ctxd.memory._injection import INJECT_SHARE, Injected
from ctxd.memory._queries import project_scope
from ctxd.scrub import ScrubError, scrub
from ctxd.sessions import _queries as session_queries
from ctxd.sessions._state import SessionRecord, effective_window
from ctxd.tokens import REPLY_PRIMING
from ctxd.wire import params_error
from ctxd.wire.types import (
    BranchCreateParams,
    BranchCreateResult,
    BranchInfo,
    BranchListParams,
    BranchListResult,
    BranchReturnParams,
    BranchReturnResult,
    BranchRollbackParams,
    BranchRollbackResult,
    BranchStatus,
    BranchStatusResult,
    FoldSummary,
    ForcedReturn,
    Injection,
    MessageIn,
)

if TYPE_CHECKING:
    from ctxd.sessions._actor import SessionActor

log = logging.getLogger("ctxd.folding")
_encode = msgspec.json.Encoder().encode
_OPENING_META = msgspec.json.decode(q.OPENING_META)
UNSCRUBBABLE = "(the partial result was withheld: it could not be checked for secrets)"


def new_branch_id() -> str:
    """``br_`` and 12 random hex digits."""
    return "br_" + secrets.token_hex(6)


# ---- loading and arming --------------------------------------------------------------

async def load(actor: SessionActor) -> SessionRecord | None:
    """Read the session and its live branches, and arm a BranchActor for each new one."""
    store = actor.supervisor.store
    record = await store.read(session_queries.load_session, actor.session_id)
    if record is None:
        return None
    branches = await store.read(q.live_branches, actor.session_id)
    now_trio, now_wall = trio.current_time(), time.time()
    for branch in branches:
        known = actor.record.live.get(branch.branch_id) if actor.record else None
        branch.deadline = (known.deadline if known is not None
                           else now_trio + (branch.deadline_at - now_wall))
        record.live[branch.branch_id] = branch
        arm(actor, branch)
    return record


def arm(actor: SessionActor, branch: BranchRecord) -> None:
    """Start the branch's BranchActor in the session's nursery (once per branch)."""
    running = actor.branch_actors.get(branch.branch_id)
    if running is not None and not running.ended:
        return

    async def on_deadline(branch_id: str) -> None:
        await actor.submit_internal(lambda a: expire(a, branch_id))

    branch_actor = BranchActor(branch.branch_id, branch.deadline, on_deadline)
    actor.branch_actors[branch.branch_id] = branch_actor
    actor.supervisor.branch_sessions[branch.branch_id] = actor.session_id
    actor.nursery.start_soon(branch_actor.run)


def _ended(actor: SessionActor, branch_id: str) -> None:
    """Bookkeeping once a branch has left ``active`` in the store."""
    branch_actor = actor.branch_actors.pop(branch_id, None)
    if branch_actor is not None:
        branch_actor.end()
    actor.supervisor.release_branch(branch_id)


# ---- errors ----------------------------------------------------------------------------

async def stored_branch(actor: SessionActor, branch_id: str) -> BranchInfo:
    """The branch's stored record, which must belong to this session.

    Raises:
        CtxdError: -32004 for an unknown branch (or one of another session).
    """
    info = await actor.supervisor.store.read(q.branch_info, branch_id)
    if info is None or info.session_id != actor.session_id:
        raise not_found("branch", branch_id,
                        "list the session's branches with branch.list")
    return info


def not_active(info: BranchInfo, for_append: bool) -> CtxdError:
    """The error for using a branch that is no longer active (-32002, -32009 or -32003)."""
    data: dict[str, Any] = {"branch_id": info.branch_id, "status": info.status,
                            "return_reason": info.return_reason}
    if for_append and info.status == "budget_exhausted":
        return CtxdError(
            ErrorCode.BUDGET_EXHAUSTED,
            f"branch {info.branch_id!r} used its budget ({info.budget_used} of {info.budget} "
            "tokens) and was force-returned",
            data | {"budget": info.budget, "budget_used": info.budget_used,
                    "fix": "continue in the parent thread (its fold message holds the partial "
                           "result), or create a new branch with a larger budget"})
    if for_append and info.status == "timeout":
        return CtxdError(
            ErrorCode.TIMEOUT,
            f"branch {info.branch_id!r} passed its deadline ({info.timeout_seconds:g} s) and "
            "was force-returned",
            data | {"deadline": info.deadline,
                    "fix": "continue in the parent thread (its fold message holds the partial "
                           "result), or create a new branch with a longer timeout"})
    return CtxdError(
        ErrorCode.INVALID_STATE,
        f"branch {info.branch_id!r} is not active (status {info.status})",
        data | {"fix": "only an active branch can take messages or return; see branch.list"})


async def live_branch(actor: SessionActor, branch_id: str, *, for_append: bool
                      ) -> BranchRecord:
    """The live branch ``branch_id`` after its deadline and budget have been enforced.

    Raises:
        CtxdError: -32004 unknown; -32002 / -32009 / -32003 when it is not active (or was
            force-returned just now because its deadline had passed).
    """
    branch = actor.require().live.get(branch_id)
    if branch is not None:
        await enforce(actor, branch)
        branch = actor.require().live.get(branch_id)
    if branch is None:
        raise not_active(await stored_branch(actor, branch_id), for_append)
    overdue = _overdue(actor, branch)
    if overdue is not None:
        # Its forced return could not be written (the store failed); refuse all the same.
        raise not_active(msgspec.structs.replace(branch.info(trio.current_time()),
                                                 status=overdue), for_append)
    return branch


# ---- force-return ----------------------------------------------------------------------

def _overdue(actor: SessionActor, branch: BranchRecord) -> BranchStatus | None:
    """Why the branch must be force-returned now (judged at the request's arrival). A spent
    budget comes first: it was spent by an append accepted before the deadline."""
    if branch.tokens_used >= branch.budget:
        return "budget_exhausted"
    if actor.arrived >= branch.deadline:
        return "timeout"
    return None


async def enforce(actor: SessionActor, branch: BranchRecord) -> list[ForcedReturn]:
    """Force-return the branch if its deadline had passed when the request arrived, or its
    budget is spent.

    A storage failure is logged, not raised: the branch stays live and the forced return
    is tried again by the next request that touches it (and by its BranchActor).
    """
    reason = _overdue(actor, branch)
    if reason is None:
        return []
    try:
        return await force_return(actor, branch, reason)
    except CtxdError as error:
        if error.code != ErrorCode.STORAGE_ERROR:
            raise
        log.warning("branch %s: forced return (%s) not written: %s", branch.branch_id,
                    reason, error.message)
        return []


async def enforce_all(actor: SessionActor) -> list[ForcedReturn]:
    """`enforce` every live branch of the session, oldest first."""
    forced: list[ForcedReturn] = []
    record = actor.require()
    for branch in sorted(record.live.values(), key=lambda b: b.fork_seq):
        if branch.branch_id in record.live:
            forced += await enforce(actor, record.live[branch.branch_id])
    return forced


async def expire(actor: SessionActor, branch_id: str) -> None:
    """The BranchActor's deadline passed: force-return the branch if it is still live."""
    branch = actor.record.live.get(branch_id) if actor.record else None
    if branch is not None:
        await enforce(actor, branch)


def _descendants(record: SessionRecord, branch_id: str) -> list[BranchRecord]:
    """Live descendants, deepest (then newest) first."""
    found: list[BranchRecord] = []
    parents = {branch_id}
    for branch in sorted(record.live.values(), key=lambda b: b.fork_seq):
        if branch.parent_id in parents:
            found.append(branch)
            parents.add(branch.branch_id)
    return sorted(found, key=lambda b: (b.depth, b.fork_seq), reverse=True)


async def force_return(actor: SessionActor, branch: BranchRecord, reason: str, *,
                       charge_parent: bool = True) -> list[ForcedReturn]:
    """Return a branch for the agent: its live children first (deepest first), then it,
    each with a partial result.

    Args:
        charge_parent: whether the parent, grown by the fold message, may then get its
            budget warning or be force-returned in turn (not when the parent is itself
            being returned).

    Returns:
        Every branch force-returned, in order.
    """
    forced = await _return_children(actor, branch)
    last, recent = await actor.supervisor.store.read(q.recent_work, branch.branch_id)
    result = partial_result(last, recent)
    try:
        scrubbed = scrub(result)
    except ScrubError:
        log.exception("branch %s: partial result could not be scrubbed", branch.branch_id)
        scrubbed = scrub(UNSCRUBBABLE)
    done = await _fold(actor, actor.require().live[branch.branch_id], scrubbed.text,
                       scrubbed.total, reason, False)
    forced.append(ForcedReturn(branch_id=branch.branch_id, status=done.status, reason=reason,
                               result=scrubbed.text))
    if charge_parent:
        forced += await _after_fold(actor, done)
    return forced


async def _return_children(actor: SessionActor, branch: BranchRecord) -> list[ForcedReturn]:
    """Force-return a branch's live descendants, deepest first; their folds go into threads
    that are being returned, so no parent is charged on the way."""
    forced: list[ForcedReturn] = []
    for child in _descendants(actor.require(), branch.branch_id):
        if child.branch_id in actor.require().live:
            forced += await force_return(actor, child, "parent_returned", charge_parent=False)
    return forced


async def close_all(actor: SessionActor, reason: str = "session_closed"
                    ) -> list[ForcedReturn]:
    """Force-return every live branch of a session that is being closed or deleted,
    deepest first."""
    forced: list[ForcedReturn] = []
    record = actor.require()
    for branch in sorted(record.live.values(), key=lambda b: (b.depth, b.fork_seq),
                         reverse=True):
        if branch.branch_id in record.live:
            forced += await force_return(actor, branch, reason, charge_parent=False)
    return forced


# ---- fold ------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Folded:
    status: BranchStatus
    fold: q.Fold
    parent: BranchRecord | None
    parent_warned_now: bool


async def _fold(actor: SessionActor, branch: BranchRecord, result: str, secrets_scrubbed: int,
                reason: str | None, extract_memory: bool) -> _Folded:
    """Close ``branch`` and append its fold message to the parent thread (one transaction)."""
    sup = actor.supervisor
    record = actor.require()
    status: BranchStatus = "completed" if reason is None else FORCED_STATUS[reason]
    text = fold_text(branch.description, result, reason)
    [fold_tokens] = await sup.counter.count_messages([MessageIn(role="user", content=text)])
    now = time.time()
    seq = record.last_seq + 1
    parent = record.live.get(branch.parent_id) if branch.parent_id else None
    updated = dataclasses.replace(record, last_seq=seq, updated_at=now,
                                  folded_tokens=record.folded_tokens + branch.tokens_used,
                                  component_tokens=dict(record.component_tokens))
    new_parent = None
    warned_now = False
    if branch.parent_id is None:
        updated.message_count += 1
        updated.component_tokens["conversation"] += fold_tokens
    elif parent is not None:
        new_parent = dataclasses.replace(parent, tokens_used=parent.tokens_used + fold_tokens)
        warned_now = new_parent.past_warning and not parent.warned
        new_parent.warned = parent.warned or warned_now
    meta = {"ctxd": "fold", "branch_id": branch.branch_id}
    done = q.Fold(
        branch_id=branch.branch_id, status=status, return_reason=reason, returned_at=now,
        result=result, fold_seq=seq, tokens_folded=branch.tokens_used,
        tokens_saved=branch.tokens_used - fold_tokens, secrets_scrubbed=secrets_scrubbed,
        fold_row=(actor.session_id, seq, "user", _encode(text), None, None, "conversation",
                  _encode(meta), fold_tokens, now, branch.parent_id),
        memory_candidate=(actor.session_id, branch.branch_id, branch.description, result,
                          "success" if status == "completed" else "failure", now,
                          project_scope(record.project))
        if extract_memory else None)
    await sup.store.write(q.fold, done, updated, new_parent)
    updated.live.pop(branch.branch_id, None)
    if new_parent is not None:
        updated.live[new_parent.branch_id] = new_parent
    actor.record = updated
    _ended(actor, branch.branch_id)
    if reason is not None:
        data: dict[str, Any] = {"branch_id": branch.branch_id, "status": status,
                                "reason": reason, "budget": branch.budget,
                                "budget_used": branch.tokens_used}
        if reason == "timeout":
            data["deadline"] = branch.deadline_at
        sup.bus.publish(actor.session_id, "branch.forced_return", data)
    sup.bus.publish(actor.session_id, "branch.folded", {
        "branch_id": branch.branch_id, "parent_branch_id": branch.parent_id, "status": status,
        "fold_seq": seq, "tokens_folded": done.tokens_folded, "tokens_saved": done.tokens_saved,
        "secrets_scrubbed": secrets_scrubbed})
    return _Folded(status, done, new_parent, warned_now)


def publish_budget_warning(actor: SessionActor, branch: BranchRecord) -> None:
    """The ``branch.budget_warning`` event (the branch has reached 80% of its budget)."""
    actor.supervisor.bus.publish(actor.session_id, "branch.budget_warning", {
        "branch_id": branch.branch_id, "budget": branch.budget,
        "budget_used": branch.tokens_used,
        "usage": round(branch.tokens_used / branch.budget, 6)})


async def _after_fold(actor: SessionActor, done: _Folded) -> list[ForcedReturn]:
    """The fold message grew the parent branch: warn, or force-return it at its budget."""
    parent = done.parent
    if parent is None:
        return []
    if done.parent_warned_now:
        publish_budget_warning(actor, parent)
    return await enforce(actor, parent)


async def return_branch(actor: SessionActor, p: BranchReturnParams) -> BranchReturnResult:
    """branch.return: children first, then the scrubbed fold into the parent."""
    branch = await live_branch(actor, p.branch_id, for_append=False)
    try:
        scrubbed = scrub(p.message)
    except ScrubError as exc:
        raise CtxdError(ErrorCode.INTERNAL_ERROR,
                        f"the return message could not be checked for secrets ({exc}); "
                        "nothing was folded",
                        {"branch_id": p.branch_id, "fix": "retry; report the error if it "
                                                          "persists"}) from exc
    forced = await _return_children(actor, branch)
    branch = actor.require().live[p.branch_id]
    done = await _fold(actor, branch, scrubbed.text, scrubbed.total, None, p.extract_memory)
    forced += await _after_fold(actor, done)
    return BranchReturnResult(
        success=True, branch_id=branch.branch_id, parent_branch_id=branch.parent_id,
        folded_at=done.fold.returned_at, fold_seq=done.fold.fold_seq,
        tokens_used=branch.tokens_used,
        summary=FoldSummary(tokens_folded=done.fold.tokens_folded,
                            tokens_saved=done.fold.tokens_saved,
                            operations_count=branch.operations,
                            secrets_scrubbed=scrubbed.total,
                            summary_redacted=scrubbed.total > 0),
        memory_queued=p.extract_memory, forced_returns=forced,
        context_state=actor.require().context_state())


# ---- create ----------------------------------------------------------------------------

def _limit(what: str, message: str, maximum: int, fix: str) -> CtxdError:
    return CtxdError(ErrorCode.LIMIT_REACHED, message,
                     {"limit": what, "max": maximum, "fix": fix})


async def create(actor: SessionActor, p: BranchCreateParams) -> BranchCreateResult:
    """branch.create: a new live branch under the active branch (or the given parent)."""
    sup = actor.supervisor
    config = sup.config
    actor.require_open()
    await enforce_all(actor)
    record = actor.require()
    parent_id = (record.active_branch.branch_id if record.active_branch else None
                 ) if p.parent_branch_id is msgspec.UNSET else p.parent_branch_id
    parent: BranchRecord | None = None
    if parent_id is not None:
        parent = await live_branch(actor, parent_id, for_append=True)
        record = actor.require()
    depth = (parent.depth if parent else 0) + 1
    if depth > config.max_branch_depth:
        raise _limit("max_branch_depth",
                     f"a branch of branch {parent_id!r} would be at depth {depth}; the "
                     f"maximum is {config.max_branch_depth}", config.max_branch_depth,
                     "return the current branch first, or branch from a shallower one")
    if len(record.live) >= config.max_live_branches_per_session:
        raise _limit("max_live_branches_per_session",
                     f"session {actor.session_id!r} has {len(record.live)} active branches, "
                     "the maximum", config.max_live_branches_per_session,
                     "return or roll back a branch first")
    budget = p.budget or config.branch_budget
    timeout_s = p.timeout_seconds or config.branch_timeout_s
    try:
        # Shown in the note and the fold message, and kept as a memory's title.
        description = scrub(p.description).text
    except ScrubError as exc:
        raise CtxdError(ErrorCode.INTERNAL_ERROR,
                        f"the description could not be checked for secrets ({exc}); no "
                        "branch was created", {"fix": "retry; report the error if it "
                                                      "persists"}) from exc
    note = branch_note(description, budget, timeout_s, depth, config.max_branch_depth)
    opening = [MessageIn(role="user", content=note), MessageIn(role="user", content=p.prompt)]
    counts = await sup.counter.count_messages(opening)
    if sum(counts) >= budget:
        raise params_error("$.budget",
                           f"the branch's opening (its note and prompt) takes {sum(counts)} "
                           f"tokens, so a budget of {budget} leaves nothing for its work; "
                           "give a larger budget or a shorter prompt")
    prefix_tokens = parent.rendered_tokens if parent else record.main_message_tokens
    window = effective_window(record.budget)
    window_room = (math.ceil(window * record.budget.hard_block) - 1 - prefix_tokens
                   - sum(counts) - REPLY_PRIMING)
    injected = await _inject(actor, p, description,
                             min(budget - sum(counts) - 1, max(0, window_room)))
    if injected.text is not None:
        opening.insert(1, MessageIn(role="user", content=injected.text))
        counts.insert(1, injected.tokens)
    opening_tokens = sum(counts)
    would_use = prefix_tokens + opening_tokens + REPLY_PRIMING
    if would_use / window >= record.budget.hard_block:
        raise actor.over_hard_block(would_use, opening_tokens, allow_over=False)
    now, now_trio = time.time(), trio.current_time()
    fork_seq = record.last_seq
    branch = BranchRecord(
        branch_id=new_branch_id(), session_id=actor.session_id, parent_id=parent_id,
        depth=depth, description=description, budget=budget, tokens_used=opening_tokens,
        operations=0, warned=False, timeout_s=timeout_s, created_at=now,
        deadline_at=now + timeout_s, deadline=now_trio + timeout_s, fork_seq=fork_seq,
        prefix_tokens=prefix_tokens)
    branch.warned = branch.past_warning
    updated = dataclasses.replace(record, last_seq=fork_seq + len(opening), updated_at=now)
    meta = _encode(_OPENING_META)
    rows = [(actor.session_id, fork_seq + 1 + i, m.role, _encode(m.content), None, None,
             "conversation", meta, tokens, now, branch.branch_id)
            for i, (m, tokens) in enumerate(zip(opening, counts, strict=True))]
    with sup.branch_slot():
        if (injected.items or injected.counted) and sup.memory is not None:
            # Their use, and the content tokens fitting counted, in the same commit.
            await sup.memory.write_with_use(q.insert_branch, injected, branch.branch_id,
                                            branch, p.prompt, updated, rows)
        else:
            await sup.store.write(q.insert_branch, branch, p.prompt, updated, rows)
    updated.live[branch.branch_id] = branch
    actor.record = updated
    arm(actor, branch)
    sup.bus.publish(actor.session_id, "branch.created", {
        "branch_id": branch.branch_id, "parent_branch_id": parent_id, "depth": depth,
        "description": description, "budget": budget, "budget_used": opening_tokens,
        "timeout_seconds": timeout_s, "deadline": branch.deadline_at})
    if branch.warned:
        publish_budget_warning(actor, branch)
    parent_remaining = (parent.budget - parent.tokens_used if parent
                        else window - record.main_thread_tokens)
    return BranchCreateResult(
        branch_id=branch.branch_id, parent_branch_id=parent_id, depth=depth,
        budget_allocated=budget, budget_used=opening_tokens,
        parent_budget_remaining=parent_remaining, timeout_seconds=timeout_s,
        deadline=branch.deadline_at, injected_context=injected.items,
        injection=injected.injection, created_at=now,
        context_state=updated.context_state())


async def _inject(actor: SessionActor, p: BranchCreateParams, description: str,
                  room: int) -> Injected:
    """Memories for the new branch, within 20% of its budget (and the ``room`` its note
    and prompt leave in the budget and under the session's hard block)."""
    memory = actor.supervisor.memory
    cap = min(int(INJECT_SHARE * (p.budget or actor.supervisor.config.branch_budget)), room)
    if not p.inject_memories or memory is None:
        reason = ("inject_memories is false" if not p.inject_memories
                  else "memory is not running in this daemon")
        return Injected(None, 0, [], Injection(status="disabled", reason=reason, tokens=0,
                                               budget=cap))
    return await memory.inject(f"{description}\n{p.prompt}",
                               project_scope(actor.require().project), cap)


# ---- status, list ----------------------------------------------------------------------

async def status(actor: SessionActor, branch_id: str) -> BranchStatusResult:
    """branch.status: the live record when the branch is active, else the stored one."""
    record = actor.require()
    branch = record.live.get(branch_id)
    if branch is not None:
        await enforce(actor, branch)
        branch = actor.require().live.get(branch_id)
    info = (branch.info(trio.current_time()) if branch
            else await stored_branch(actor, branch_id))
    return BranchStatusResult(branch=info, context_state=actor.require().context_state())


async def list_branches(actor: SessionActor, p: BranchListParams) -> BranchListResult:
    """branch.list: every branch of the session, live ones with their current meters."""
    await enforce_all(actor)
    record = actor.require()
    now = trio.current_time()
    stored = await actor.supervisor.store.read(q.list_branches, actor.session_id)
    every = [record.live[b.branch_id].info(now) if b.branch_id in record.live else b
             for b in stored]
    return BranchListResult(
        branches=[b for b in every if p.status is None or b.status == p.status],
        total=len(every), active=sum(b.status == "active" for b in every),
        folded=sum(b.fold_seq is not None and b.status != "discarded" for b in every),
        context_state=record.context_state())


# ---- rollback --------------------------------------------------------------------------

async def rollback(actor: SessionActor, p: BranchRollbackParams) -> BranchRollbackResult:
    """branch.rollback: the branch's parent thread as it was when the branch was created."""
    actor.require_open()
    info = await stored_branch(actor, p.branch_id)
    if info.status == "discarded":
        raise CtxdError(ErrorCode.INVALID_STATE,
                        f"branch {p.branch_id!r} was already discarded by a rollback",
                        {"branch_id": p.branch_id, "status": info.status,
                         "fix": "roll back to a branch that is not discarded; see branch.list"})
    thread = info.parent_branch_id
    if thread is not None:
        await live_branch(actor, thread, for_append=False)
    await enforce_all(actor)
    record = actor.require()
    parent = record.live.get(thread) if thread else None
    now = time.time()

    def roll_back(conn: Any) -> tuple[q.Discarded, SessionRecord, BranchRecord | None]:
        gone = q.rollback(conn, actor.session_id, thread, info.fork_seq, now)
        updated = dataclasses.replace(record, updated_at=now, folded_tokens=gone.folded_tokens,
                                      component_tokens=dict(record.component_tokens))
        new_parent = None
        if parent is None:
            updated.message_count -= gone.thread_messages
            for component, tokens in gone.thread_tokens.items():
                updated.component_tokens[component] -= tokens
        else:
            new_parent = dataclasses.replace(
                parent, tokens_used=parent.tokens_used - sum(gone.thread_tokens.values()),
                operations=parent.operations - gone.thread_operations)
            new_parent.warned = parent.warned and new_parent.past_warning
            q.save_meter(conn, new_parent)
        session_queries.save_counters(conn, updated)
        return gone, updated, new_parent

    gone, updated, new_parent = await actor.supervisor.store.write(roll_back)
    for branch_id in gone.branch_ids:
        if updated.live.pop(branch_id, None) is not None:
            _ended(actor, branch_id)
    if new_parent is not None:
        updated.live[new_parent.branch_id] = new_parent
    actor.record = updated
    actor.supervisor.bus.publish(actor.session_id, "branch.rolled_back", {
        "branch_id": p.branch_id, "thread": thread, "rolled_back_to": info.fork_seq,
        "branches_discarded": gone.branch_ids, "messages_discarded": gone.messages,
        "tokens_recovered": gone.tokens_recovered})
    return BranchRollbackResult(
        rolled_back_to=info.fork_seq, thread=thread, branches_discarded=gone.branch_ids,
        messages_discarded=gone.messages, tokens_recovered=gone.tokens_recovered,
        context_state=updated.context_state())


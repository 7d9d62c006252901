"""Branches on a session's actor: branch.create (with its memories injected, or with its
first messages), branch.return, branch.status, branch.list, branch.rollback.

The top of the session operations: it uses `_returns` (enforcement, folds),
`_hygiene_ops` (a fold grows its parent thread, which may compact) and `_session_ops` (a
branch created with its first messages appends them) (docs/architecture.md, "A session
actor and its operations").
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import msgspec

from ctxd.errors import invalid_state, params_error, scrub_failed
from ctxd.folding import Discarded, branch_note, rendered_tokens
from ctxd.hygiene import drop_snapshot_after
from ctxd.memory import INJECT_SHARE, Injected, project_scope
from ctxd.scrub import ScrubError, scrub
from ctxd.sessions import _queries as q
from ctxd.sessions._actor import SessionActor
from ctxd.sessions._hygiene_ops import auto_compact
from ctxd.sessions._returns import (
    Return,
    charge_parents,
    enforce,
    enforce_all,
    live_branch,
    return_branches,
)
from ctxd.sessions._session_ops import Opened, append_prepared, prepared, text_at_rest
from ctxd.sessions._state import SessionRecord
from ctxd.store import Transaction
from ctxd.tokens import REPLY_PRIMING
from ctxd.wire.types import (
    Branch,
    BranchCreateParams,
    BranchCreateResult,
    BranchListParams,
    BranchListResult,
    BranchReturnParams,
    BranchReturnResult,
    BranchRollbackParams,
    BranchRollbackResult,
    BranchStatusResult,
    FoldSummary,
    Injection,
    MessageAppendParams,
    MessageIn,
)


async def create_branch(actor: SessionActor, p: BranchCreateParams,
                        first: list[MessageIn] | None = None,
                        stage: Callable[[Transaction, str], None] | None = None
                        ) -> BranchCreateResult:
    """branch.create: a new live branch under the active branch (or the given parent).

    Args:
        p: the branch.
        first: messages appended to the new branch in the transaction that creates it
            (as with ``allow_over``), so that no crash leaves the branch without them
            (transcript.import's sub-agents, docs/protocol.md, "transcript.import").
        stage: adds a caller's steps to that transaction; called with the branch's id.
    """
    services = actor.services
    config = services.config
    actor.require_open()
    await enforce_all(actor)
    active = actor.branches.active
    parent_id = ((active.branch_id if active else None)
                 if p.parent_branch_id is msgspec.UNSET else p.parent_branch_id)
    parent: Branch | None = None
    if parent_id is not None:
        parent = await live_branch(actor, parent_id, for_append=True)
    record = actor.require()
    depth = actor.branches.check_room(parent)
    budget = p.budget or config.branch_budget
    timeout_s = p.timeout_seconds or config.branch_timeout_s
    try:
        # Shown in the note and the fold message, and kept as a memory's title.
        description = scrub(p.description).text
    except ScrubError as exc:
        raise scrub_failed("the description", exc, "no branch was created") from exc
    note = branch_note(description, budget, timeout_s, depth, config.max_branch_depth)
    # The prompt is kept twice: the branch's opening message and its row.
    prompt = text_at_rest(actor, p.prompt, "no branch was created")
    opening = [MessageIn(role="user", content=note), MessageIn(role="user", content=prompt)]
    counts = await services.counter.count_messages(opening)
    if sum(counts) >= budget:
        raise params_error("$.budget",
                           f"the branch's opening (its note and prompt) takes {sum(counts)} "
                           f"tokens, so a budget of {budget} leaves nothing for its work; "
                           "give a larger budget or a shorter prompt")
    prefix_tokens = rendered_tokens(parent) if parent else record.main_message_tokens
    window = record.budget.effective_window
    window_room = (math.ceil(window * record.budget.hard_block) - 1 - prefix_tokens
                   - sum(counts) - REPLY_PRIMING)
    injected = await _inject(actor, p, description, budget,
                             min(budget - sum(counts) - 1, max(0, window_room)))
    if injected.text is not None:
        opening.insert(1, MessageIn(role="user", content=injected.text))
        counts.insert(1, injected.tokens)
    opening_tokens = sum(counts)
    would_use = prefix_tokens + opening_tokens + REPLY_PRIMING
    if would_use / window >= record.budget.hard_block:
        raise actor.over_hard_block(would_use, opening_tokens, allow_over=False)
    planned = actor.branches.opening(
        parent=parent, depth=depth, description=description, prompt=prompt,
        budget=budget, timeout_s=timeout_s, messages=opening, counts=counts,
        prefix_tokens=prefix_tokens, fork_seq=record.last_seq)
    branch = planned.branch
    updated = dataclasses.replace(record, last_seq=record.last_seq + len(opening),
                                  updated_at=branch.created_at)

    def stage_opening(transaction: Transaction) -> None:
        actor.branches.stage_create(transaction, planned)
        transaction.add(q.insert_messages, actor.session_id, planned.messages)
        if services.memory is not None:
            # Their use, and the content tokens fitting counted, in the same commit.
            services.memory.stage_use(transaction, injected, branch.branch_id)

    def stage_caller(transaction: Transaction) -> None:
        if stage is not None:
            stage(transaction, branch.branch_id)

    if first:
        try:
            at_rest, offloads = await prepared(actor, first, updated.last_seq + 1,
                                               "no branch was created")
            await append_prepared(
                actor, MessageAppendParams(session_id=actor.session_id, messages=first,
                                           branch_id=branch.branch_id, allow_over=True),
                branch, at_rest, offloads, [], stage_caller,
                Opened(planned, updated, stage_opening))
        except BaseException:
            if actor.require().last_seq == record.last_seq:
                actor.branches.abandoned(planned)  # nothing was committed
            raise
    else:
        transaction = Transaction()
        stage_opening(transaction)
        transaction.add(q.save_counters, updated)
        stage_caller(transaction)
        try:
            with actor.branches.registry.slot():
                await services.store.commit(transaction)
        except BaseException:
            actor.branches.abandoned(planned)
            raise
        actor.record = updated
        actor.branches.created(planned)
    parent_remaining = (parent.budget - parent.budget_used if parent
                        else window - record.main_thread_tokens)
    return BranchCreateResult(
        branch_id=branch.branch_id, parent_branch_id=parent_id, depth=depth,
        budget_allocated=budget, budget_used=opening_tokens,
        parent_budget_remaining=parent_remaining, timeout_seconds=timeout_s,
        deadline=branch.deadline, injected_context=injected.items,
        injection=injected.injection, created_at=branch.created_at,
        context_state=actor.context_state())


async def _inject(actor: SessionActor, p: BranchCreateParams, description: str, budget: int,
                  room: int) -> Injected:
    """Memories for the new branch, within 20% of its budget (and the ``room`` its note
    and prompt leave in the budget and under the session's hard block)."""
    cap = min(int(INJECT_SHARE * budget), room)
    memory = actor.services.memory
    if not p.inject_memories or memory is None:
        reason = ("inject_memories is false" if not p.inject_memories
                  else "memory is not running in this daemon")
        return Injected(None, 0, [], Injection(status="disabled", reason=reason, tokens=0,
                                               budget=cap))
    return await memory.inject(f"{description}\n{p.prompt}",
                               project_scope(actor.require().project), cap)


async def return_branch(actor: SessionActor, p: BranchReturnParams) -> BranchReturnResult:
    """branch.return: children first, then the scrubbed fold into the parent, in one
    transaction; then the parent, grown by the fold, is enforced."""
    branch = await live_branch(actor, p.branch_id, for_append=False)
    try:
        scrubbed = scrub(p.message)
    except ScrubError as exc:
        raise scrub_failed("the return message", exc, "nothing was folded",
                           {"branch_id": p.branch_id}) from exc
    folds, forced = await return_branches(actor, [Return(
        branch, None, (scrubbed.text, scrubbed.total), p.extract_memory)])
    fold = folds[-1]
    forced += await enforce_all(actor, charge_parents(actor, [fold]))
    parent = fold.branch.parent_branch_id
    if parent is None or parent in actor.branches.live:
        # The fold grew its parent thread (docs/protocol.md, "Compaction").
        await auto_compact(actor, None if parent is None else actor.branches.live[parent])
    return BranchReturnResult(
        success=True, branch_id=branch.branch_id, parent_branch_id=branch.parent_branch_id,
        folded_at=fold.message.created_at, fold_seq=fold.message.seq,
        tokens_used=fold.branch.budget_used,
        summary=FoldSummary(tokens_folded=fold.branch.budget_used,
                            tokens_saved=fold.tokens_saved,
                            operations_count=fold.branch.operations_count,
                            secrets_scrubbed=scrubbed.total,
                            summary_redacted=scrubbed.total > 0,
                            summary_truncated=fold.summary_truncated),
        memory_queued=p.extract_memory, forced_returns=forced,
        context_state=actor.context_state())


async def branch_status(actor: SessionActor, branch_id: str) -> BranchStatusResult:
    """branch.status: the live record when the branch is active, else the stored one."""
    actor.require()
    branch = actor.branches.live.get(branch_id)
    if branch is not None:
        await enforce(actor, branch)
        branch = actor.branches.live.get(branch_id)
    shown = (actor.branches.shown(branch) if branch
             else await actor.branches.stored(branch_id))
    return BranchStatusResult(branch=shown, context_state=actor.context_state())


async def list_branches(actor: SessionActor, p: BranchListParams) -> BranchListResult:
    """branch.list: every branch of the session, live ones with their current meters."""
    await enforce_all(actor)
    actor.require()
    every = await actor.branches.every()
    return BranchListResult(
        branches=[b for b in every if p.status is None or b.status == p.status],
        total=len(every), active=sum(b.status == "active" for b in every),
        folded=sum(b.fold_seq is not None and b.status != "discarded" for b in every),
        context_state=actor.context_state())


async def rollback(actor: SessionActor, p: BranchRollbackParams) -> BranchRollbackResult:
    """branch.rollback: the branch's parent thread as it was when the branch was
    created."""
    actor.require_open()
    info = await actor.branches.stored(p.branch_id)
    if info.status == "discarded":
        raise invalid_state(f"branch {p.branch_id!r} was already discarded by a rollback",
                            "roll back to a branch that is not discarded; see branch.list",
                            branch_id=p.branch_id, status=info.status)
    thread = info.parent_branch_id
    if thread is not None:
        await live_branch(actor, thread, for_append=False)
    await enforce_all(actor)
    record = actor.require()
    now = time.time()
    session_id = actor.session_id

    def roll_back(conn: Any) -> tuple[Discarded, SessionRecord]:
        gone = actor.branches.discard(
            conn, thread, info.fork_seq, now,
            lambda c, ids: q.discard_messages(c, session_id, thread, info.fork_seq, ids))
        updated = dataclasses.replace(record, updated_at=now,
                                      folded_tokens=gone.folded_tokens,
                                      component_tokens=dict(record.component_tokens))
        if thread is None:
            updated.message_count -= gone.thread_messages
            for component, tokens in gone.thread_tokens.items():
                updated.component_tokens[component] -= tokens
        q.save_counters(conn, updated)
        if thread is None:
            # A snapshot with messages after the fork no longer is the thread's.
            drop_snapshot_after(conn, session_id, info.fork_seq)
        return gone, updated

    gone, updated = await actor.services.store.write(roll_back)
    actor.record = updated
    actor.branches.rolled_back(p.branch_id, info.fork_seq, gone)
    return BranchRollbackResult(
        rolled_back_to=info.fork_seq, thread=thread, branches_discarded=gone.branch_ids,
        messages_discarded=gone.messages, tokens_recovered=gone.tokens_recovered,
        context_state=actor.context_state())

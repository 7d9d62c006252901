"""Branch returns and their enforcement on a session's actor: the agent's return and the
forced ones (a spent budget, a passed deadline, a parent returning, a closing session),
folded in one transaction; the expiry that the session's deadline timer queues.

The lowest of the session operations (docs/architecture.md, "A session actor and its
operations"): every other module of operations uses it, and it uses none of them.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import msgspec
import trio

from ctxd.errors import CtxdError, ErrorCode
from ctxd.folding import OPENING_META, Fold, not_active, partial_result
from ctxd.memory import Memory, MemoryCandidate, project_scope
from ctxd.scrub import ScrubError, scrub
from ctxd.sessions import _queries as q
from ctxd.sessions._actor import SessionActor
from ctxd.sessions._state import SessionRecord
from ctxd.store import Transaction
from ctxd.wire.types import Branch, ForcedReturn, StoredMessage

log = logging.getLogger("ctxd.sessions")

UNSCRUBBABLE = "(the partial result was withheld: it could not be checked for secrets)"
NO_WORK = scrub(partial_result(None, []))
"""The partial result of a branch that recorded no work, scrubbed once (it is ctxd's own
text: the same for every such branch)."""


@dataclass(frozen=True)
class Return:
    """A branch to return: by the agent (``reason`` None, with its scrubbed message and
    the number of secrets scrubbed from it), or forced by ctxd for ``reason``."""

    branch: Branch
    reason: str | None
    message: tuple[str, int] | None = None
    extract_memory: bool = False


def _with_folds(record: SessionRecord, folds: list[Fold]) -> SessionRecord:
    """The session's record once ``folds`` are written: its seq, its folded tokens, and
    the main thread's counters for the fold messages that go there."""
    updated = dataclasses.replace(
        record, last_seq=folds[-1].message.seq, updated_at=folds[-1].message.created_at,
        folded_tokens=record.folded_tokens + sum(fold.branch.budget_used for fold in folds),
        component_tokens=dict(record.component_tokens))
    for fold in folds:
        if fold.message.branch_id is None:
            updated.message_count += 1
            updated.component_tokens["conversation"] += fold.message.tokens
    return updated


async def live_branch(actor: SessionActor, branch_id: str, *, for_append: bool) -> Branch:
    """The live branch ``branch_id`` after its deadline and budget were enforced.

    Raises:
        CtxdError: -32004 unknown; -32002 / -32009 / -32003 when it is not active (or
            was force-returned just now because its deadline had passed).
    """
    branch = actor.branches.live.get(branch_id)
    if branch is not None:
        await enforce(actor, branch)
        branch = actor.branches.live.get(branch_id)
    if branch is None:
        raise not_active(await actor.branches.stored(branch_id), for_append)
    overdue = actor.branches.overdue(branch, actor.arrived)
    if overdue is not None:
        # Its forced return could not be written (the store failed); refuse all the same.
        raise not_active(msgspec.structs.replace(actor.branches.shown(branch),
                                                 status=overdue), for_append)
    return branch


async def enforce(actor: SessionActor, branch: Branch) -> list[ForcedReturn]:
    """`enforce_all`, for one branch."""
    return await enforce_all(actor, [branch])


async def enforce_all(actor: SessionActor,
                      branches: list[Branch] | None = None) -> list[ForcedReturn]:
    """Force-return every branch (of ``branches``, else of the session) whose deadline
    had passed when the request arrived, or whose budget is spent: all in one
    transaction, and again for parents that their folds spent.

    A storage failure is logged, not raised: the branches stay live and their forced
    returns are tried again by the next request that touches them (and by the session's
    deadline timer).
    """
    forced: list[ForcedReturn] = []
    candidates = actor.branches.oldest_first() if branches is None else branches
    while True:
        due = [Return(b, reason) for b in candidates
               if b.branch_id in actor.branches.live
               and (reason := actor.branches.overdue(actor.branches.live[b.branch_id],
                                                     actor.arrived)) is not None]
        if not due:
            return forced
        try:
            folds, done = await return_branches(actor, due)
        except CtxdError as error:
            if error.code != ErrorCode.STORAGE_ERROR:
                raise
            log.warning("session %s: forced return of %s not written: %s",
                        actor.session_id, ", ".join(r.branch.branch_id for r in due),
                        error.message)
            return forced
        forced += done
        candidates = charge_parents(actor, folds)


def charge_parents(actor: SessionActor, folds: list[Fold]) -> list[Branch]:
    """The parents that folds grew: their budget warning goes out (once); they are the
    ones to enforce next."""
    parents: dict[str, Branch] = {}
    for fold in folds:
        parent = fold.parent
        if parent is None or parent.branch_id not in actor.branches.live:
            continue
        if fold.parent_warned_now:
            actor.branches.publish_budget_warning(parent)
        parents[parent.branch_id] = actor.branches.live[parent.branch_id]
    return list(parents.values())


async def expire(actor: SessionActor) -> None:
    """The earliest deadline of the session's live branches passed (its deadline timer
    queued this): force-return every branch that is due, in one transaction (branches
    whose deadlines coincide return together).

    When nothing else waits in the mailbox, no request can have arrived before a deadline
    that has passed since, so "due" is judged now rather than when this expiry was queued:
    the branches whose deadlines passed meanwhile go in the same transaction. Otherwise it
    is judged at its arrival, so that a request that arrived before a deadline (and waits
    behind this expiry) is not overtaken; the timer queues the next expiry at once.
    """
    if not actor.has_queued():
        actor.arrived = trio.current_time()
    await enforce_all(actor)


async def return_branches(actor: SessionActor,
                          targets: list[Return]) -> tuple[list[Fold], list[ForcedReturn]]:
    """Return ``targets``, each after its live descendants (deepest first, force-returned
    as ``parent_returned``), in one transaction with the session's counters.

    The folds are planned on a copy of the live branches; the record and the branches
    change only once the transaction has committed.
    """
    plan: list[Return] = []
    planned: set[str] = set()
    parents = {branch.parent_branch_id for branch in actor.branches.live.values()}
    for target in targets:
        children = (actor.branches.descendants(target.branch.branch_id)
                    if target.branch.branch_id in parents else [])
        for item in [*(Return(child, "parent_returned") for child in children), target]:
            if item.branch.branch_id not in planned:
                plan.append(item)
                planned.add(item.branch.branch_id)
    # A branch that holds only its opening has no work to read (nor a secret to scrub).
    read = [item.branch.branch_id for item in plan if item.reason is not None
            and not actor.branches.untouched(item.branch.branch_id)]
    works = await actor.services.store.read(q.recent_works, read, OPENING_META) if read \
        else {}
    live = dict(actor.branches.live)
    record = actor.require()
    seq = record.last_seq
    folded_into: dict[str, list[StoredMessage]] = {}
    folds: list[Fold] = []
    forced: list[ForcedReturn] = []
    candidates: list[MemoryCandidate] = []
    for item in plan:
        branch = live[item.branch.branch_id]
        if item.reason is None:
            assert item.message is not None
            result, scrubbed_count = item.message
        else:
            last, recent = works.get(branch.branch_id, (None, []))
            # Its children folded into it on the way: their folds are its latest work.
            recent += [(m.role, m.content) for m in folded_into.get(branch.branch_id, [])]
            if last is None and not recent:
                scrubbed = NO_WORK
            else:
                try:
                    scrubbed = scrub(partial_result(last, recent[-3:]))
                except ScrubError:
                    log.exception("branch %s: partial result could not be scrubbed",
                                  branch.branch_id)
                    scrubbed = scrub(UNSCRUBBABLE)
            result, scrubbed_count = scrubbed.text, scrubbed.total
        parent = live.get(branch.parent_branch_id) if branch.parent_branch_id else None
        seq += 1
        fold = await actor.branches.fold(branch, result, scrubbed_count, item.reason, seq,
                                         parent)
        del live[branch.branch_id]
        if fold.parent is not None:
            live[fold.parent.branch_id] = fold.parent
            folded_into.setdefault(fold.parent.branch_id, []).append(fold.message)
        if item.extract_memory:
            candidates.append(MemoryCandidate(
                session_id=actor.session_id, branch_id=branch.branch_id,
                title=branch.description, content=result, outcome="success",
                created_at=fold.message.created_at, scope=project_scope(record.project)))
        folds.append(fold)
        if item.reason is not None:
            forced.append(ForcedReturn(branch_id=branch.branch_id, status=fold.status,
                                       reason=item.reason, result=result))
    if folds:
        record = _with_folds(record, folds)
    transaction = Transaction()
    transaction.add(q.insert_messages, actor.session_id, [fold.message for fold in folds])
    actor.branches.stage_folds(transaction, folds)
    for candidate in candidates:
        Memory.stage_candidate(transaction, candidate)
    transaction.add(q.save_counters, record)
    await actor.services.store.commit(transaction)
    actor.record = record
    for fold in folds:
        actor.branches.folded(fold)
    return folds, forced


async def return_all(actor: SessionActor, reason: str) -> list[ForcedReturn]:
    """Force-return every live branch of a session that is being closed or deleted,
    deepest first, in one transaction."""
    _, forced = await return_branches(actor, [Return(branch, reason)
                                              for branch in actor.branches.deepest_first()])
    return forced

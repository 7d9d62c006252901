"""Branches: one session's live branches, their deadlines, and the changes folding makes.

The session actor owns one `Branches` and calls it: it plans a change (a new branch, a
fold, a rollback), the actor adds the change's rows to its transaction (`stage_*`) next to
its own, commits, and then applies it here (`created`, `charged`, `folded`,
`rolled_back`). Folding never writes the session's record; it says what changed
(docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import trio

from ctxd.config import Config
from ctxd.errors import CtxdError, ErrorCode, limit_reached, not_found
from ctxd.folding import _queries as q
from ctxd.folding._deadlines import DeadlineTimer
from ctxd.folding._state import (
    BUDGET_WARNING,
    FORCED_STATUS,
    OPENING_META,
    bounded_result,
    fold_text,
    metered,
    past_warning,
)
from ctxd.hub import EventBus
from ctxd.store import Store, Transaction
from ctxd.tokens import TokenCounter
from ctxd.wire.types import Branch, BranchStatus, Component, MessageIn, StoredMessage


def new_branch_id() -> str:
    """``br_`` and 12 random hex digits."""
    return "br_" + secrets.token_hex(6)


class Registry:
    """Every live branch of the daemon: the session that holds it, and the
    ``max_live_branches`` limit. One per daemon, shared by every session's `Branches`.

    Args:
        store: the database (a branch that is not live is looked up there).
        maximum: ``max_live_branches``.
    """

    def __init__(self, store: Store, maximum: int):
        self._store = store
        self.maximum = maximum
        self.count = 0
        """Live branches in the daemon (read from the store at start, then kept)."""
        self._sessions: dict[str, str] = {}
        """Live branch → its session (other branches are looked up in the store)."""

    async def load(self) -> None:
        """Count the live branches in the store (once, at start-up)."""
        self.count = await self._store.read(q.count_live_branches)

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Count one more live branch for the block; given back if the block fails.

        Raises:
            CtxdError: -32005 when it would pass ``max_live_branches``.
        """
        if self.count >= self.maximum:
            raise limit_reached("max_live_branches", self.maximum,
                                f"{self.count} branches are active in this daemon, the "
                                f"maximum (max_live_branches = {self.maximum})",
                                "return branches that are done, or retry later")
        self.count += 1
        try:
            yield
        except BaseException:
            self.count -= 1
            raise

    def armed(self, branch_id: str, session_id: str) -> None:
        self._sessions[branch_id] = session_id

    def released(self, branch_id: str) -> None:
        """A live branch ended (returned, discarded, or deleted with its session)."""
        if self._sessions.pop(branch_id, None) is not None:
            self.count -= 1

    async def session_of(self, branch_id: str) -> str:
        """The session a branch belongs to.

        Raises:
            CtxdError: -32004 for an unknown branch.
        """
        session_id = self._sessions.get(branch_id)
        if session_id is None:
            session_id = await self._store.read(q.session_of, branch_id)
        if session_id is None:
            raise not_found("branch", branch_id, "list a session's branches with branch.list")
        return session_id

    async def sessions_with_live_branches(self) -> list[str]:
        return await self._store.read(q.sessions_with_live_branches)


@dataclass(frozen=True)
class Opening:
    """A branch about to be created: its record and the messages that open it."""

    branch: Branch
    prompt: str
    messages: list[StoredMessage]


@dataclass(frozen=True)
class Fold:
    """A branch about to be returned, and the one message its parent thread gets."""

    branch: Branch
    status: BranchStatus
    reason: str | None
    result: str
    """The full (scrubbed) result, kept in the archive."""
    secrets_scrubbed: int
    summary_truncated: bool
    message: StoredMessage
    """The fold message, in the parent thread (``branch_id`` None: the main thread)."""
    parent: Branch | None
    """The parent branch grown by the fold message (None: the main thread)."""
    parent_warned_now: bool

    @property
    def tokens_saved(self) -> int:
        return self.branch.budget_used - self.message.tokens


@dataclass(frozen=True)
class Discarded:
    """What a rollback marked as discarded, and the thread it rolled back."""

    branch_ids: list[str]
    thread: str | None
    thread_tokens: dict[Component, int]
    thread_messages: int
    thread_operations: int
    messages: int
    tokens_recovered: int
    folded_tokens: int
    parent: Branch | None
    """The rolled-back branch thread's new meter (None: the main thread)."""


class Branches:
    """One session's live branches (its active ones), and one timer for their deadlines.

    Args:
        session_id: the session.
        store: the database (folding reads and stages only its own table).
        counter: the token counter.
        bus: where branch events are published.
        config: limits and defaults of branches.
        registry: the daemon's live branches.
        on_deadline: called when the earliest deadline of a live branch has passed (once
            for deadlines that pass together); the session actor queues the forced returns
            in order with its other requests.
    """

    def __init__(self, session_id: str, store: Store, counter: TokenCounter, bus: EventBus,
                 config: Config, registry: Registry,
                 on_deadline: Callable[[], Awaitable[None]]):
        self.session_id = session_id
        self._store = store
        self._counter = counter
        self._bus = bus
        self._config = config
        self.registry = registry
        self.live: dict[str, Branch] = {}
        self._trio_deadlines: dict[str, float] = {}
        """Each live branch's deadline on trio's clock (``Branch.deadline`` is wall-clock)."""
        self._timer = DeadlineTimer(on_deadline)
        self._untouched: set[str] = set()
        """Live branches created by this actor that hold nothing but their opening (see
        `untouched`)."""

    # ---- the live set ------------------------------------------------------------------

    def start(self, nursery: trio.Nursery) -> None:
        """Where the deadline timer runs: the session actor's nursery (it ends with it)."""
        self._timer.start(nursery)

    async def load(self) -> None:
        """Read the session's live branches and arm the deadline of each new one; a branch
        already known keeps its deadline."""
        stored = await self._store.read(q.live_branches, self.session_id)
        now_trio, now_wall = trio.current_time(), time.time()
        self.live = {branch.branch_id: branch for branch in stored}
        for branch in stored:
            # Re-armed from the wall-clock deadline (a restart); a known one keeps its own.
            self._trio_deadlines.setdefault(branch.branch_id,
                                            now_trio + (branch.deadline - now_wall))
            self._arm(branch)

    def _arm(self, branch: Branch) -> None:
        """Wait for the branch's deadline (once per branch) and register it as live."""
        self._timer.arm(branch.branch_id, self._trio_deadlines[branch.branch_id])
        self.registry.armed(branch.branch_id, self.session_id)

    def _ended(self, branch_id: str) -> None:
        """Bookkeeping once a branch has left ``active`` in the store."""
        self.live.pop(branch_id, None)
        self._untouched.discard(branch_id)
        self._trio_deadlines.pop(branch_id, None)
        self._timer.disarm(branch_id)
        self.registry.released(branch_id)

    @property
    def active(self) -> Branch | None:
        """The newest live branch: where the agent works now (None: the main thread)."""
        return max(self.live.values(), key=lambda b: b.fork_seq, default=None)

    @property
    def budget_used(self) -> int:
        """Tokens of the live branches' own messages."""
        return sum(b.budget_used for b in self.live.values())

    def path(self, branch: Branch | None) -> list[str]:
        """Ids from the outermost live ancestor down to ``branch``."""
        path: list[str] = []
        while branch is not None:
            path.append(branch.branch_id)
            branch = self.live.get(branch.parent_branch_id) if branch.parent_branch_id else None
        return path[::-1]

    def overdue(self, branch: Branch, arrived: float) -> BranchStatus | None:
        """Why the branch must be force-returned now, judged at the request's arrival
        (trio's clock). A spent budget comes first: it was spent by an append accepted
        before the deadline."""
        if branch.budget_used >= branch.budget:
            return "budget_exhausted"
        if arrived >= self._trio_deadlines[branch.branch_id]:
            return "timeout"
        return None

    def descendants(self, branch_id: str) -> list[Branch]:
        """Live descendants, deepest (then newest) first."""
        found: list[Branch] = []
        parents = {branch_id}
        for branch in sorted(self.live.values(), key=lambda b: b.fork_seq):
            if branch.parent_branch_id in parents:
                found.append(branch)
                parents.add(branch.branch_id)
        return sorted(found, key=lambda b: (b.depth, b.fork_seq), reverse=True)

    def deepest_first(self) -> list[Branch]:
        """Every live branch, deepest (then newest) first: the order a closing session
        returns them in."""
        return sorted(self.live.values(), key=lambda b: (b.depth, b.fork_seq), reverse=True)

    def untouched(self, branch_id: str) -> bool:
        """Whether a live branch holds nothing but its opening messages: nothing appended
        to it, no child folded into it, since this actor created it (a branch loaded from
        the store may hold anything). Its forced return has no work to read."""
        return branch_id in self._untouched

    def oldest_first(self) -> list[Branch]:
        return sorted(self.live.values(), key=lambda b: b.fork_seq)

    # ---- stored branches and their errors ----------------------------------------------

    async def stored(self, branch_id: str) -> Branch:
        """The branch's stored record, which must belong to this session.

        Raises:
            CtxdError: -32004 for an unknown branch (or one of another session).
        """
        info = await self._store.read(q.branch_info, branch_id)
        if info is None or info.session_id != self.session_id:
            raise not_found("branch", branch_id, "list the session's branches with branch.list")
        return info

    async def every(self) -> list[Branch]:
        """Every branch of the session, live ones with their current meters."""
        now = trio.current_time()
        stored = await self._store.read(q.list_branches, self.session_id)
        return [self.shown(self.live[b.branch_id], now) if b.branch_id in self.live else b
                for b in stored]

    def shown(self, branch: Branch, now: float | None = None) -> Branch:
        """A live branch as methods show it: with its time left (``now``: trio's clock)."""
        now = trio.current_time() if now is None else now
        left = max(0.0, self._trio_deadlines[branch.branch_id] - now)
        return msgspec.structs.replace(branch, time_left_s=round(left, 3))

    # ---- create ------------------------------------------------------------------------

    def check_room(self, parent: Branch | None) -> int:
        """The depth of a new branch under ``parent``, after the session's limits.

        Raises:
            CtxdError: -32005 past ``max_branch_depth`` or
                ``max_live_branches_per_session``.
        """
        config = self._config
        depth = (parent.depth if parent else 0) + 1
        if depth > config.max_branch_depth:
            raise limit_reached(
                "max_branch_depth", config.max_branch_depth,
                f"a branch of branch {parent.branch_id if parent else None!r} would be at "
                f"depth {depth}; the maximum is {config.max_branch_depth}",
                "return the current branch first, or branch from a shallower one")
        if len(self.live) >= config.max_live_branches_per_session:
            raise limit_reached(
                "max_live_branches_per_session", config.max_live_branches_per_session,
                f"session {self.session_id!r} has {len(self.live)} active branches, the "
                "maximum", "return or roll back a branch first")
        return depth

    def opening(self, *, parent: Branch | None, depth: int, description: str,
                prompt: str, budget: int, timeout_s: float, messages: list[MessageIn],
                counts: list[int], prefix_tokens: int, fork_seq: int) -> Opening:
        """The new branch's record and its opening messages (note, memories, prompt)."""
        now, now_trio = time.time(), trio.current_time()
        opening_tokens = sum(counts)
        branch = Branch(
            branch_id=new_branch_id(), session_id=self.session_id,
            parent_branch_id=None if parent is None else parent.branch_id, depth=depth,
            description=description, status="active", return_reason=None, budget=budget,
            budget_used=opening_tokens, budget_remaining=max(0, budget - opening_tokens),
            budget_warned=False, operations_count=0, timeout_seconds=timeout_s,
            created_at=now, deadline=now + timeout_s, fork_seq=fork_seq,
            prefix_tokens=prefix_tokens)
        branch = msgspec.structs.replace(branch, budget_warned=past_warning(branch))
        self._trio_deadlines[branch.branch_id] = now_trio + timeout_s
        rows = [StoredMessage(seq=fork_seq + 1 + i, role=m.role, content=m.content,
                              component="conversation", tokens=tokens, created_at=now,
                              meta=OPENING_META, branch_id=branch.branch_id)
                for i, (m, tokens) in enumerate(zip(messages, counts, strict=True))]
        return Opening(branch, prompt, rows)

    @staticmethod
    def stage_create(transaction: Transaction, opening: Opening) -> None:
        transaction.add(q.insert_branch, opening.branch, opening.prompt)

    def created(self, opening: Opening) -> None:
        """The new branch committed: it is live, armed and announced."""
        branch = opening.branch
        self.live[branch.branch_id] = branch
        self._untouched.add(branch.branch_id)
        self._arm(branch)
        self._bus.publish(self.session_id, "branch.created", {
            "branch_id": branch.branch_id, "parent_branch_id": branch.parent_branch_id,
            "depth": branch.depth, "description": branch.description, "budget": branch.budget,
            "budget_used": branch.budget_used, "timeout_seconds": branch.timeout_seconds,
            "deadline": branch.deadline})
        if branch.budget_warned:
            self.publish_budget_warning(branch)

    def abandoned(self, opening: Opening) -> None:
        """The new branch did not commit."""
        self._trio_deadlines.pop(opening.branch.branch_id, None)

    # ---- appends -----------------------------------------------------------------------

    @staticmethod
    def charge(branch: Branch, tokens: int, operations: int) -> Branch:
        """The branch's meter after messages of ``tokens`` (``operations`` of them by the
        assistant) were appended to it."""
        return metered(branch, branch.budget_used + tokens, branch.operations_count + operations)

    @staticmethod
    def stage_meter(transaction: Transaction, branch: Branch) -> None:
        transaction.add(q.save_meter, branch)

    def charged(self, before: Branch, after: Branch) -> None:
        """The new meter committed; the budget warning goes out the first time."""
        self.live[after.branch_id] = after
        self._untouched.discard(after.branch_id)
        if after.budget_warned and not before.budget_warned:
            self.publish_budget_warning(after)

    def publish_budget_warning(self, branch: Branch) -> None:
        """The ``branch.budget_warning`` event (the branch has reached 80% of its budget)."""
        self._bus.publish(self.session_id, "branch.budget_warning", {
            "branch_id": branch.branch_id, "budget": branch.budget,
            "budget_used": branch.budget_used,
            "usage": round(branch.budget_used / branch.budget, 6)})

    # ---- fold --------------------------------------------------------------------------

    async def fold(self, branch: Branch, result: str, secrets_scrubbed: int,
                   reason: str | None, seq: int, parent: Branch | None) -> Fold:
        """Plan the return of ``branch``: its status, and the fold message (at ``seq``)
        that replaces it in its parent thread, bounded by ``max_fold_tokens``. Nothing
        changes until `folded`: ``parent`` is the parent branch as the caller's plan has
        it so far (None: the main thread)."""
        status: BranchStatus = "completed" if reason is None else FORCED_STATUS[reason]
        limit = min(self._config.max_fold_tokens, branch.budget // 4)

        async def fold_tokens(text: str) -> int:
            message = MessageIn(role="user", content=fold_text(branch.description, text, reason))
            [tokens] = await self._counter.count_messages([message])
            return tokens

        shown, tokens = await bounded_result(self._counter, fold_tokens, result, limit,
                                             branch.branch_id)
        text = fold_text(branch.description, shown, reason)
        grown = None
        warned_now = False
        if parent is not None:
            grown = metered(parent, parent.budget_used + tokens, parent.operations_count)
            warned_now = grown.budget_warned and not parent.budget_warned
        message = StoredMessage(
            seq=seq, role="user", content=text, component="conversation", tokens=tokens,
            created_at=time.time(), meta={"ctxd": "fold", "branch_id": branch.branch_id},
            branch_id=branch.parent_branch_id)
        return Fold(branch=branch, status=status, reason=reason, result=result,
                    secrets_scrubbed=secrets_scrubbed, summary_truncated=shown is not result,
                    message=message, parent=grown, parent_warned_now=warned_now)

    @staticmethod
    def stage_folds(transaction: Transaction, folds: Sequence[Fold]) -> None:
        """The branches' ends, and each grown parent's meter as the last of the folds
        into it left it."""
        transaction.add(q.close_branches, [q.Closed(
            branch_id=fold.branch.branch_id, status=fold.status, return_reason=fold.reason,
            returned_at=fold.message.created_at, result=fold.result,
            fold_seq=fold.message.seq, tokens_folded=fold.branch.budget_used,
            tokens_saved=fold.tokens_saved, secrets_scrubbed=fold.secrets_scrubbed)
            for fold in folds])
        grown = {fold.parent.branch_id: fold.parent for fold in folds
                 if fold.parent is not None}
        if grown:
            transaction.add(q.save_meters, list(grown.values()))

    def folded(self, fold: Fold) -> None:
        """The fold committed: the branch has ended, its parent grew; events go out (the
        parent's budget warning is the caller's, after it has enforced the parent)."""
        branch = fold.branch
        self._ended(branch.branch_id)
        if fold.parent is not None:
            self.live[fold.parent.branch_id] = fold.parent
            self._untouched.discard(fold.parent.branch_id)
        if fold.reason is not None:
            data: dict[str, Any] = {"branch_id": branch.branch_id, "status": fold.status,
                                    "reason": fold.reason, "budget": branch.budget,
                                    "budget_used": branch.budget_used}
            if fold.reason == "timeout":
                data["deadline"] = branch.deadline
            self._bus.publish(self.session_id, "branch.forced_return", data)
        self._bus.publish(self.session_id, "branch.folded", {
            "branch_id": branch.branch_id, "parent_branch_id": branch.parent_branch_id,
            "status": fold.status, "fold_seq": fold.message.seq,
            "tokens_folded": branch.budget_used, "tokens_saved": fold.tokens_saved,
            "secrets_scrubbed": fold.secrets_scrubbed,
            "summary_truncated": fold.summary_truncated})

    # ---- rollback ----------------------------------------------------------------------

    def discard(self, conn: Any, thread: str | None, fork_seq: int, now: float,
                discard_messages: Callable[[Any, list[str]], q.MessagesDiscarded]
                ) -> Discarded:
        """In the store's thread, inside the rollback's transaction: discard what came
        after ``fork_seq`` in a thread (``discard_messages`` marks the messages, which are
        the session's), and work out the thread's new meter."""
        branch_ids, active = q.discard_later_branches(conn, self.session_id, thread,
                                                      fork_seq, now)
        gone = discard_messages(conn, branch_ids)
        recovered = sum(gone.thread_tokens.values()) + sum(
            gone.branch_tokens.get(branch_id, 0) for branch_id in active)
        parent = self.live.get(thread) if thread else None
        if parent is not None:
            used = parent.budget_used - sum(gone.thread_tokens.values())
            parent = metered(parent, used, parent.operations_count - gone.thread_operations,
                             warned=parent.budget_warned and used >= BUDGET_WARNING * parent.budget)
            q.save_meter(conn, parent)
        return Discarded(
            branch_ids=branch_ids, thread=thread, thread_tokens=gone.thread_tokens,
            thread_messages=gone.thread_messages, thread_operations=gone.thread_operations,
            messages=gone.thread_messages + sum(gone.branch_messages.values()),
            tokens_recovered=recovered, folded_tokens=q.folded_tokens(conn, self.session_id),
            parent=parent)

    def rolled_back(self, branch_id: str, fork_seq: int, gone: Discarded) -> None:
        """The rollback committed."""
        for discarded in gone.branch_ids:
            if discarded in self.live:
                self._ended(discarded)
        if gone.parent is not None:
            self.live[gone.parent.branch_id] = gone.parent
            self._untouched.discard(gone.parent.branch_id)
        self._bus.publish(self.session_id, "branch.rolled_back", {
            "branch_id": branch_id, "thread": gone.thread, "rolled_back_to": fork_seq,
            "branches_discarded": gone.branch_ids, "messages_discarded": gone.messages,
            "tokens_recovered": gone.tokens_recovered})

    def deleted(self) -> None:
        """The session was deleted with its branches."""
        for branch_id in list(self.live):
            self._ended(branch_id)


def not_active(info: Branch, for_append: bool) -> CtxdError:
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



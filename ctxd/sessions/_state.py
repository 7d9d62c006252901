"""A session's in-memory record, its budget, and the context_state every result carries."""

from __future__ import annotations

from dataclasses import dataclass, field

from ctxd.config import threshold_order_error
from ctxd.errors import params_error
from ctxd.folding import Branches, rendered_tokens
from ctxd.tokens import REPLY_PRIMING
from ctxd.wire.types import (
    COMPONENTS,
    HEALTH_ORDER,
    Branch,
    Budget,
    BudgetParams,
    Component,
    ContextState,
    Health,
    SessionInfo,
)


def resolve_budget(given: BudgetParams | None, base: Budget) -> Budget:
    """Fill a client's budget from ``base`` and check that it makes sense.

    Raises:
        CtxdError: -32602 naming the field when the budget is inconsistent.
    """
    values = {name: getattr(base, name) for name in Budget.__struct_fields__}
    if given is not None:
        values.update({name: getattr(given, name) for name in Budget.__struct_fields__
                       if getattr(given, name) is not None})
    budget = Budget(**values)
    problem = threshold_order_error(budget)
    if problem:
        raise params_error(f"$.budget.{problem.split(' ', 1)[0]}", problem)
    return budget


def worse_health(a: Health, b: Health) -> Health:
    return max(a, b, key=HEALTH_ORDER.index)


COMPACT_BREAKER = 3
"""Compactions in a row that do not shrink the context before ctxd stops compacting the
session by itself (docs/protocol.md, "Compaction")."""


def thread_tokens(message_tokens: int, message_count: int) -> int:
    """Tokens of a rendered thread: its messages plus the reply priming (none when empty)."""
    return message_tokens + REPLY_PRIMING if message_count else 0


@dataclass
class SessionRecord:
    """What a SessionActor holds of its session; the row in ``sessions`` is the truth.
    Its live branches are the actor's `Branches`."""

    session_id: str
    project: str | None
    title: str | None
    state: str
    budget: Budget
    created_at: float
    updated_at: float
    closed_at: float | None = None
    message_count: int = 0
    """Kept messages of the main thread."""
    component_tokens: dict[Component, int] = field(
        default_factory=lambda: dict.fromkeys(COMPONENTS, 0))
    """Tokens of the main thread's kept messages, by budget component."""
    last_seq: int = 0
    """The newest message's seq in any thread (seqs are never reused)."""
    folded_tokens: int = 0
    """Tokens of every branch that folded (and was not rolled back)."""
    compactions: int = 0
    """Compactions that shrank a thread of the session."""
    compact_failures: int = 0
    """Compactions in a row that did not shrink the thread they were run on."""
    compacted_at: float | None = None
    """When a compaction last shrank a thread of the session."""

    def appended(self, count: int, now: float) -> SessionRecord:
        """The record once ``count`` messages are appended at ``now``: seq and time moved
        on, with component tokens of its own for the caller to add to. (A copy without
        `dataclasses.replace`, which inspects the fields on every call: one per append.)"""
        record = object.__new__(SessionRecord)
        record.__dict__.update(self.__dict__)
        record.last_seq = self.last_seq + count
        record.updated_at = now
        record.component_tokens = dict(self.component_tokens)
        return record

    @property
    def auto_compact_paused(self) -> bool:
        return self.compact_failures >= COMPACT_BREAKER

    @property
    def main_message_tokens(self) -> int:
        """Tokens of the main thread's kept messages (without the reply priming)."""
        return sum(self.component_tokens.values())

    @property
    def main_thread_tokens(self) -> int:
        return thread_tokens(self.main_message_tokens, self.message_count)

    def usage_of(self, tokens: int) -> float:
        return tokens / self.budget.effective_window

    def _active(self, branches: Branches | None, main_messages: int
                ) -> tuple[Branch | None, float, Health]:
        """The active thread (a branch, or None for the main thread), its usage and its
        health (a branch past its budget warning is at least ``caution``)."""
        branch = None if branches is None or not branches.live else branches.active
        if branch is None:
            used = thread_tokens(main_messages, self.message_count)
        else:
            used = rendered_tokens(branch) + REPLY_PRIMING
        usage = self.usage_of(used)
        health = self.budget.health(usage)
        if branch is not None and branch.budget_warned:
            health = worse_health(health, "caution")
        return branch, usage, health

    def health(self, branches: Branches | None = None) -> Health:
        """The ``health`` of `context_state`, alone."""
        return self._active(branches, self.main_message_tokens)[2]

    def context_state(self, branches: Branches | None = None) -> ContextState:
        """Where the context stands; ``usage`` and ``health`` are those of the active
        thread (the active branch's rendered context, else the main thread), and a branch
        past its budget warning is at least ``caution``."""
        main_messages = self.main_message_tokens
        branch, usage, health = self._active(branches, main_messages)
        return ContextState(
            session_id=self.session_id,
            active_branch_id=None if branch is None else branch.branch_id,
            branch_depth=0 if branch is None else branch.depth,
            branch_path=[] if branches is None or branch is None else branches.path(branch),
            total_tokens=main_messages + (0 if branches is None else branches.budget_used),
            main_thread_tokens=thread_tokens(main_messages, self.message_count),
            current_branch_tokens=0 if branch is None else branch.budget_used,
            current_branch_budget=0 if branch is None else branch.budget,
            folded_tokens=self.folded_tokens, effective_window=self.budget.effective_window,
            usage=round(usage, 6), health=health, compact_failures=self.compact_failures,
            auto_compact_paused=self.auto_compact_paused)

    def info(self, branches: Branches | None = None, live_branches: int = 0) -> SessionInfo:
        """The session as listed: with its actor's branches, or (read from the store
        without them) with the stored count of its active branches."""
        state = self.context_state(branches)
        return SessionInfo(
            session_id=self.session_id, project=self.project, title=self.title,
            state="open" if self.state == "open" else "closed", budget=self.budget,
            message_count=self.message_count, total_tokens=state.total_tokens,
            main_thread_tokens=state.main_thread_tokens,
            effective_window=state.effective_window, usage=state.usage, health=state.health,
            live_branches=live_branches if branches is None else len(branches.live),
            created_at=self.created_at, updated_at=self.updated_at, closed_at=self.closed_at)

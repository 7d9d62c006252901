"""A session's in-memory record, its budget, and the context_state every result carries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ctxd.config import BudgetDefaults, threshold_order_error
from ctxd.tokens import REPLY_PRIMING
from ctxd.wire import params_error
from ctxd.wire.types import (
    COMPONENTS,
    Budget,
    BudgetParams,
    Component,
    ContextState,
    Health,
    SessionInfo,
)

if TYPE_CHECKING:
    from ctxd.folding._state import BranchRecord


def resolve_budget(given: BudgetParams | None, base: Budget | BudgetDefaults) -> Budget:
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


def effective_window(budget: Budget) -> int:
    """The tokens a prompt may use: context_window - max_output_tokens."""
    return budget.context_window - budget.max_output_tokens


HEALTH_ORDER: tuple[Health, ...] = ("ok", "warn", "caution", "compact", "blocked")


def worse_health(a: Health, b: Health) -> Health:
    return max(a, b, key=HEALTH_ORDER.index)


def health_of(usage: float, budget: Budget) -> Health:
    """ok < warn ≤ caution ≤ compact ≤ blocked, by the budget's thresholds."""
    if usage >= budget.hard_block:
        return "blocked"
    if usage >= budget.compact_trigger:
        return "compact"
    if usage >= budget.caution:
        return "caution"
    if usage >= budget.warn:
        return "warn"
    return "ok"


def thread_tokens(message_tokens: int, message_count: int) -> int:
    """Tokens of a rendered thread: its messages plus the reply priming (none when empty)."""
    return message_tokens + REPLY_PRIMING if message_count else 0


@dataclass
class SessionRecord:
    """What a SessionActor holds of its session; the row in ``sessions`` is the truth."""

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
    live: dict[str, BranchRecord] = field(default_factory=dict, compare=False)
    """The session's active branches. Shared by copies of the record: the actor changes
    it only after the write that makes the change has committed."""

    @property
    def main_message_tokens(self) -> int:
        """Tokens of the main thread's kept messages (without the reply priming)."""
        return sum(self.component_tokens.values())

    @property
    def total_tokens(self) -> int:
        """Tokens of every message in a live context: the main thread and active branches."""
        return self.main_message_tokens + sum(b.tokens_used for b in self.live.values())

    @property
    def main_thread_tokens(self) -> int:
        return thread_tokens(self.main_message_tokens, self.message_count)

    @property
    def active_branch(self) -> BranchRecord | None:
        """The newest live branch: where the agent works now (None: the main thread)."""
        return max(self.live.values(), key=lambda b: b.fork_seq, default=None)

    def branch_path(self, branch: BranchRecord | None) -> list[str]:
        """Ids from the outermost live ancestor down to ``branch``."""
        path: list[str] = []
        while branch is not None:
            path.append(branch.branch_id)
            branch = self.live.get(branch.parent_id) if branch.parent_id else None
        return path[::-1]

    def usage_of(self, tokens: int) -> float:
        return tokens / effective_window(self.budget)

    def context_state(self) -> ContextState:
        """Where the context stands; ``usage`` and ``health`` are those of the active
        thread (the active branch's rendered context, else the main thread), and a branch
        past its budget warning is at least ``caution``."""
        main = self.main_thread_tokens
        branch = self.active_branch
        used = main if branch is None else branch.rendered_tokens + REPLY_PRIMING
        usage = self.usage_of(used)
        health = health_of(usage, self.budget)
        if branch is not None and branch.past_warning:
            health = worse_health(health, "caution")
        return ContextState(
            session_id=self.session_id,
            active_branch_id=None if branch is None else branch.branch_id,
            branch_depth=0 if branch is None else branch.depth,
            branch_path=self.branch_path(branch), total_tokens=self.total_tokens,
            main_thread_tokens=main,
            current_branch_tokens=0 if branch is None else branch.tokens_used,
            current_branch_budget=0 if branch is None else branch.budget,
            folded_tokens=self.folded_tokens, effective_window=effective_window(self.budget),
            usage=round(usage, 6), health=health)

    def info(self, live_branches: int | None = None) -> SessionInfo:
        """The session as listed; ``live_branches`` counts stored active branches when the
        record was read from the store without them."""
        state = self.context_state()
        return SessionInfo(
            session_id=self.session_id, project=self.project, title=self.title,
            state="open" if self.state == "open" else "closed", budget=self.budget,
            message_count=self.message_count, total_tokens=self.total_tokens,
            main_thread_tokens=state.main_thread_tokens, usage=state.usage,
            health=state.health,
            live_branches=len(self.live) if live_branches is None else live_branches,
            created_at=self.created_at,
            updated_at=self.updated_at, closed_at=self.closed_at)

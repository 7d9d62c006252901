"""A session's in-memory record, its budget, and the context_state every result carries."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    component_tokens: dict[Component, int] = field(
        default_factory=lambda: dict.fromkeys(COMPONENTS, 0))

    @property
    def total_tokens(self) -> int:
        return sum(self.component_tokens.values())

    @property
    def main_thread_tokens(self) -> int:
        return thread_tokens(self.total_tokens, self.message_count)

    def usage_of(self, tokens: int) -> float:
        return tokens / effective_window(self.budget)

    def context_state(self) -> ContextState:
        used = self.main_thread_tokens
        usage = self.usage_of(used)
        return ContextState(
            session_id=self.session_id, active_branch_id=None, branch_depth=0, branch_path=[],
            total_tokens=self.total_tokens, main_thread_tokens=used, current_branch_tokens=0,
            folded_tokens=0, effective_window=effective_window(self.budget),
            usage=round(usage, 6), health=health_of(usage, self.budget))

    def info(self) -> SessionInfo:
        state = self.context_state()
        return SessionInfo(
            session_id=self.session_id, project=self.project, title=self.title,
            state="open" if self.state == "open" else "closed", budget=self.budget,
            message_count=self.message_count, total_tokens=self.total_tokens,
            main_thread_tokens=state.main_thread_tokens, usage=state.usage,
            health=state.health, created_at=self.created_at, updated_at=self.updated_at,
            closed_at=self.closed_at)


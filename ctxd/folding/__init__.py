"""Context folding: a session's branches with their deadlines and budgets, fold, rollback
(docs/architecture.md). The session actor owns one `Branches` and calls it."""

from ctxd.folding._branches import (
    Branches,
    Discarded,
    Fold,
    Opening,
    Registry,
    not_active,
)
from ctxd.folding._deadlines import RETRY_S, DeadlineTimer, TimerStatistics
from ctxd.folding._queries import (
    MessagesDiscarded,
    chunks,
    live_branch_counts,
    thread_chain,
)
from ctxd.folding._state import (
    OPENING_META,
    branch_note,
    partial_result,
    rendered_tokens,
)

__all__ = ["OPENING_META", "RETRY_S", "Branches", "DeadlineTimer", "Discarded", "Fold",
           "MessagesDiscarded", "Opening", "Registry", "TimerStatistics", "branch_note",
           "chunks", "live_branch_counts", "not_active", "partial_result", "rendered_tokens",
           "thread_chain"]

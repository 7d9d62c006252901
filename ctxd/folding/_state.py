"""A branch's in-memory record and the texts ctxd writes for it (note, fold, partial result)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ctxd.tokens import part_text
from ctxd.wire.types import BranchInfo, BranchStatus

BUDGET_WARNING = 0.8
"""Share of its budget at which a branch gets a ``branch.budget_warning``."""

SHOWN_DESCRIPTION = 200
"""Characters of a description that go into the note and the fold message (500 are kept)."""

PARTIAL_RESULT_CHARS = 4000
"""A forced return's partial result is cut to this many characters."""

FORCED_STATUS: dict[str, BranchStatus] = {
    "budget_exhausted": "budget_exhausted",
    "timeout": "timeout",
    "parent_returned": "failed",
    "session_closed": "failed",
    "session_deleted": "failed",
}
"""The status a branch ends in, by the reason ctxd returned it."""

_REASON_TEXT = {
    "budget_exhausted": "its token budget ran out",
    "timeout": "its time limit passed",
    "parent_returned": "its parent branch returned first",
    "session_closed": "the session was closed",
    "session_deleted": "the session was deleted",
}


@dataclass
class BranchRecord:
    """What a SessionActor holds of one live branch; the row in ``branches`` is the truth.

    ``tokens_used`` is the sum of the tokens of the branch's own messages (its opening
    note and prompt, the messages appended to it, the folds of its children): what it
    adds to the context on top of its parent's prefix, and what its budget is charged.
    ``deadline`` is on trio's clock (re-armed from the wall-clock ``deadline_at`` when
    the daemon restarts).
    """

    branch_id: str
    session_id: str
    parent_id: str | None
    depth: int
    description: str
    budget: int
    tokens_used: int
    operations: int
    warned: bool
    timeout_s: float
    created_at: float
    deadline_at: float
    deadline: float
    fork_seq: int
    prefix_tokens: int

    @property
    def past_warning(self) -> bool:
        """At or past `BUDGET_WARNING` of the budget."""
        return self.tokens_used >= BUDGET_WARNING * self.budget

    @property
    def rendered_tokens(self) -> int:
        """Message tokens of the branch's whole rendered context (prefix included)."""
        return self.prefix_tokens + self.tokens_used

    def info(self, now: float) -> BranchInfo:
        """The branch's status; ``now`` is trio's clock (time left is measured on it)."""
        return BranchInfo(
            branch_id=self.branch_id, session_id=self.session_id,
            parent_branch_id=self.parent_id, depth=self.depth, description=self.description,
            status="active", return_reason=None, budget=self.budget,
            budget_used=self.tokens_used, budget_remaining=max(0, self.budget - self.tokens_used),
            operations_count=self.operations, timeout_seconds=self.timeout_s,
            created_at=self.created_at, deadline=self.deadline_at,
            time_left_s=round(max(0.0, self.deadline - now), 3),
            fork_seq=self.fork_seq, returned_at=None, result=None, fold_seq=None,
            tokens_folded=None, tokens_saved=None, secrets_scrubbed=None)


def shown(description: str) -> str:
    """The part of a description that is shown to the model."""
    if len(description) <= SHOWN_DESCRIPTION:
        return description
    return description[:SHOWN_DESCRIPTION - 1] + "…"


def _seconds(value: float) -> str:
    return f"{value:g}"


def branch_note(description: str, budget: int, timeout_s: float, depth: int,
                max_depth: int) -> str:
    """The branch-mode note that opens every branch's own context."""
    return (f'[Branch mode] You are working in a branch (depth {depth} of {max_depth}) on one '
            f'sub-task: "{shown(description)}". It has a budget of {budget} tokens and '
            f"{_seconds(timeout_s)} seconds. Work only on this sub-task. When it is done, "
            "return from the branch with a short summary of the result: the branch's "
            "messages are then folded away, and only your summary stays in the parent's "
            "context.")


def fold_text(description: str, result: str, reason: str | None) -> str:
    """The one message a parent receives in place of a returned branch."""
    if reason is None:
        return f'Branch "{shown(description)}" returned: {result}'
    return (f'Branch "{shown(description)}" was stopped ({_REASON_TEXT[reason]}); '
            f"partial result: {result}")


def _text(content: str | Sequence[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(filter(None, (part_text(part) for part in content)))


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def partial_result(last_assistant: str | Sequence[dict[str, Any]] | None,
                   recent: Sequence[tuple[str, str | Sequence[dict[str, Any]]]]) -> str:
    """What a force-returned branch hands back (DESIGN §7).

    Args:
        last_assistant: content of the branch's last assistant message, if it has one.
        recent: (role, content) of the branch's last few messages appended by the
            client, oldest first (used only when there is no assistant message).

    Returns:
        The last assistant message; or, without one, an extractive summary of the recent
        messages; cut to `PARTIAL_RESULT_CHARS`.
    """
    if last_assistant is not None:
        text = _text(last_assistant).strip()
        if text:
            return _cut(text, PARTIAL_RESULT_CHARS)
    if not recent:
        return "(the branch ended before any work was recorded)"
    share = PARTIAL_RESULT_CHARS // len(recent) - 16
    lines = [f"[{role}] {_cut(' '.join(_text(content).split()), share)}"
             for role, content in recent]
    return _cut("no assistant message; last messages: " + " | ".join(lines),
                PARTIAL_RESULT_CHARS)

"""What folding knows of a branch (its meter, its warning) and the texts ctxd writes for it:
the note, the fold message, the partial result."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

from ctxd.tokens import TokenCounter, part_text
from ctxd.wire.types import Branch, BranchStatus

BUDGET_WARNING = 0.8
"""Share of its budget at which a branch gets a ``branch.budget_warning``."""

SHOWN_DESCRIPTION = 200
"""Characters of a description that go into the note and the fold message (500 are kept)."""

PARTIAL_RESULT_CHARS = 4000
"""A forced return's partial result is cut to this many characters (the fold message that
shows it is bounded in tokens as well: `bounded_result`)."""
OPENING_META = {"ctxd": "branch_opening"}
"""The ``meta`` of the note, memories and prompt that open a branch."""

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


def past_warning(branch: Branch) -> bool:
    """At or past `BUDGET_WARNING` of its budget."""
    return branch.budget_used >= BUDGET_WARNING * branch.budget


def rendered_tokens(branch: Branch) -> int:
    """Message tokens of the branch's whole rendered context (prefix included)."""
    return branch.prefix_tokens + branch.budget_used


def metered(branch: Branch, budget_used: int, operations_count: int,
            warned: bool | None = None) -> Branch:
    """The branch with a new meter; ``budget_warned`` stays once set unless ``warned``
    says otherwise (a rollback can take it back)."""
    grown = msgspec.structs.replace(branch, budget_used=budget_used,
                                    budget_remaining=max(0, branch.budget - budget_used),
                                    operations_count=operations_count)
    if warned is None:
        warned = branch.budget_warned or past_warning(grown)
    return msgspec.structs.replace(grown, budget_warned=warned)


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
    """What a force-returned branch hands back (docs/protocol.md, Context folding).

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


CUT_MARKER = "\n[… {cut} tokens cut; the whole text is the result of branch {branch_id} …]\n"
"""What stands between the head and the tail of a result cut to fit a fold message."""
HEAD_SHARE = 0.7
"""Share of a cut result's room given to its head (the rest to its tail)."""


async def bounded_result(counter: TokenCounter, count: Callable[[str], Awaitable[int]],
                         result: str, limit: int, branch_id: str) -> tuple[str, int]:
    """``result`` cut so that the fold message that shows it (``count(text)``: its tokens)
    takes at most ``limit`` tokens: cut at token boundaries, its head and its tail kept
    around a marker that says how much was cut (docs/decisions.md, "A fold is bounded").
    A frame that alone passes ``limit`` keeps only the marker.

    Returns:
        The text to show (``result`` itself when it fits), and the fold message's tokens.
    """
    whole = await count(result)
    if whole <= limit:
        return result, whole
    tokens = await counter.encode_async(result)
    marker = CUT_MARKER.format(cut=len(tokens), branch_id=branch_id)
    room = max(0, limit - (whole - len(tokens)) - counter.count(marker))
    while True:
        head = int(room * HEAD_SHARE)
        tail = room - head
        shown = (counter.decode(tokens[:head])
                 + CUT_MARKER.format(cut=len(tokens) - head - tail, branch_id=branch_id)
                 + (counter.decode(tokens[-tail:]) if tail else ""))
        shown_tokens = await count(shown)
        if room == 0 or shown_tokens <= limit:
            return shown, shown_tokens
        room -= max(1, room // 10)

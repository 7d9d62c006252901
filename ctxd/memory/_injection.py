"""Injection of memories into a new branch: the best items that fit 20% of its budget,
by exact token counts (DESIGN §7, §9)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ctxd.tokens import TokenCounter
from ctxd.wire.types import InjectedItem, Injection

log = logging.getLogger("ctxd.memory")

INJECT_SHARE = 0.2
"""Share of a branch's budget that injected memories may use."""
INJECT_MIN_CONFIDENCE = 0.7
INJECT_MAX_ITEMS = 10
MAX_TOKEN_BYTES = 128
"""The longest token of cl100k_base, in bytes (a character is at least one byte)."""
HEADER = "Memories from earlier work that may help with this sub-task:\n"


@dataclass(frozen=True)
class Injected:
    """The message to put in the branch's opening (None: nothing injected)."""

    text: str | None
    tokens: int
    items: list[InjectedItem]
    injection: Injection


def block(title: str, content: str, confidence: float, outcome: str) -> str:
    """How one memory reads in the injected message (a lesson from a failure says so).

    A block starts with ``-`` and ends with one newline, and so does the header end: the
    tokenizer's pre-splitting always cuts between a newline and a following ``-``, so the
    tokens of the whole message are exactly the header's plus each block's.
    """
    lesson = ", learned from a failure" if outcome == "failure" else ""
    return f"- {title} (confidence {confidence:.2f}{lesson}): {content}".rstrip() + "\n"


def fit(candidates: list[tuple[int, str, str, float, str]], counter: TokenCounter,
        cap: int) -> Injected:
    """Greedily add (id, title, content, confidence, outcome) candidates, best first, while
    the whole message (as a user message) stays within ``cap`` tokens. Each item's
    ``tokens`` is its block's, and the header's and the items' add up to the message's
    exactly (see `block`); each block is counted once."""
    used = counter.message_tokens("user", HEADER)
    blocks: list[str] = []
    items: list[InjectedItem] = []
    for memory_id, title, content, confidence, outcome in candidates[:INJECT_MAX_ITEMS]:
        text = block(title, content, confidence, outcome)
        if used + len(text) // MAX_TOKEN_BYTES > cap:
            continue  # cannot fit, whatever its exact count: spare counting a long text
        tokens = counter.count(text)
        if used + tokens > cap:
            continue
        blocks.append(text)
        items.append(InjectedItem(memory_id=memory_id, title=title, tokens=tokens))
        used += tokens
    if not items:
        return Injected(None, 0, [], Injection(
            status="none_found", reason="no memory with confidence ≥ 0.7 fits the budget"
            if candidates else "no memory matched", tokens=0, budget=cap))
    return Injected(HEADER + "".join(blocks), used, items,
                    Injection(status="injected", reason=None, tokens=used, budget=cap))

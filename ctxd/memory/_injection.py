"""Injection of memories into a new branch: the best items that fit 20% of its budget,
by exact token counts (docs/protocol.md, Injection into a new branch)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ctxd.tokens import TokenCounter
from ctxd.wire.types import InjectedItem, Injection

INJECT_SHARE = 0.2
"""Share of a branch's budget that injected memories may use."""
INJECT_MIN_CONFIDENCE = 0.7
INJECT_MAX_ITEMS = 10
MAX_TOKEN_BYTES = 128
"""The longest token of cl100k_base, in bytes (a character is at least one byte)."""
HEADER = "Memories from earlier work that may help with this sub-task:\n"
"""The injected message's first line in a new branch."""
PROMPT_HEADER = "Memories from earlier work that may help with this task:\n"
"""Its first line beside a user's prompt (the hooks' ``memory.context``, the gateway's first
request of a conversation): a conversation, not a sub-task."""


@dataclass(frozen=True)
class Candidate:
    """A retrieved memory that injection may show."""

    memory_id: int
    title: str
    content: str
    confidence: float
    outcome: str
    content_tokens: int | None
    """The tokens of its `tail` as SQLite keeps them (None: not counted yet, or a blank
    content)."""


@dataclass(frozen=True)
class Injected:
    """The message to put in the branch's opening (None: nothing injected)."""

    text: str | None
    tokens: int
    items: list[InjectedItem]
    injection: Injection
    shown: dict[int, str] = field(default_factory=dict)
    """Memory id: content of the injected memories (their use is recorded only where a
    memory still holds it)."""
    counted: dict[int, tuple[int, str]] = field(default_factory=dict)
    """Memory id: (tokens of its `tail`, content) of the candidates whose count SQLite
    lacked and fitting counted (injected or not), for the branch's write to keep."""


def head(title: str, confidence: float, outcome: str) -> str:
    """A memory's block up to its content (a lesson from a failure says so)."""
    lesson = ", learned from a failure" if outcome == "failure" else ""
    return f"- {title} (confidence {confidence:.2f}{lesson}):"


def tail(content: str) -> str | None:
    """A memory's block from its head on, which depends on its content alone, so its
    tokens are counted once and kept with it: None when the content is blank (the block
    is then its head and a newline, counted whole)."""
    content = content.rstrip()
    return f" {content}\n" if content else None


def block(first: str, rest: str | None) -> str:
    """How one memory reads in the injected message: its `head`, then its `tail`.

    The tokenizer's pre-splitting always cuts between the head's closing ``):`` and the
    tail's opening space, and between a block's final newline and the next block's ``-``
    (or the header's newline and the first ``-``): so the tokens of a block are exactly
    its head's plus its tail's, and those of the whole message the header's plus each
    block's. BPE never merges across those cuts.
    """
    return first + ("\n" if rest is None else rest)


def fit(candidates: list[Candidate], counter: TokenCounter, cap: int,
        header: str = HEADER) -> Injected:
    """Greedily add candidates, best first, while the whole message (as a user message)
    stays within ``cap`` tokens. Each item's ``tokens`` is its block's, and the header's
    and the items' add up to the message's exactly (see `block`: ``header`` ends with a
    newline); a content's tokens are counted only when SQLite does not keep them yet."""
    used = counter.message_tokens("user", header)
    blocks: list[str] = []
    items: list[InjectedItem] = []
    shown: dict[int, str] = {}
    counted: dict[int, tuple[int, str]] = {}
    for memory in candidates[:INJECT_MAX_ITEMS]:
        first = head(memory.title, memory.confidence, memory.outcome)
        rest = tail(memory.content)
        text = block(first, rest)
        if used + len(text) // MAX_TOKEN_BYTES > cap:
            continue  # cannot fit, whatever its exact count: spare counting a long text
        rest_tokens = memory.content_tokens
        if rest is None:
            tokens = counter.count(text)
        else:
            if rest_tokens is None:
                rest_tokens = counter.count(rest)
            tokens = counter.count(first) + rest_tokens
        if rest_tokens is not None and memory.content_tokens is None:
            counted[memory.memory_id] = (rest_tokens, memory.content)
        if used + tokens > cap:
            continue
        blocks.append(text)
        items.append(InjectedItem(type="memory", id=memory.memory_id, title=memory.title,
                                  content=memory.content, tokens=tokens))
        shown[memory.memory_id] = memory.content
        used += tokens
    if not items:
        return Injected(None, 0, [], Injection(
            status="none_found", reason="no memory with confidence ≥ 0.7 fits the budget"
            if candidates else "no memory matched", tokens=0, budget=cap), counted=counted)
    return Injected(header + "".join(blocks), used, items,
                    Injection(status="injected", reason=None, tokens=used, budget=cap),
                    shown, counted)

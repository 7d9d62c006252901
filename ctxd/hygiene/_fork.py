"""The fork pipeline (docs/protocol.md, "context.fork"): a bounded copy of a thread for a
sub-agent, in three pure stages — the latest compaction boundary (what it keeps scrubbed of
secrets), graduated tool-result truncation, a character budget — and the text a child reads
(a preamble that says what was cut, then the formatted context). Linear in the thread's
size; no LLM call."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from ctxd.hygiene._compact import COMPACTION_META
from ctxd.hygiene._offload import ERROR_WORDS, STUB_PREFIX
from ctxd.scrub import scrub_value
from ctxd.wire.types import Content, ForkStats, Role, StoredMessage, TierDistribution

FULL_RESULTS = 5
"""The newest tool results kept whole (tier 1)."""
CUT_RESULTS = 10
"""The tool results after those, cut to 3,000 characters (tier 2); older ones: tier 3."""
RESULT_CHARS = (None, 3_000, 500)
"""Characters kept of a tool result, by tier (None: whole)."""
PARAM_CHARS = (500, 200, 100)
"""Characters kept of a tool call's parameters (as JSON), by its result's tier."""
HEAD_SHARE = 0.8
"""Head+tail truncation keeps 80% of the allowance from the start, 20% from the end."""
HEAD_TAIL_TOOLS = ("bash", "pty", "exec")
"""A tool whose name contains one of these (any case) is cut head+tail: a command's
outcome is at its end."""
CLEARED_MARKER = "[Old tool result content cleared]"
"""What Claude Code and OpenCode show for a cleared result (OpenCode: a tool part with
``state.time.compacted``, imported with ``meta.compacted``)."""
OWN_MARKERS = (STUB_PREFIX, CLEARED_MARKER[:-1] + " — ")
"""How ctxd's offload stub and cleared result start: in a fork, `CLEARED_MARKER`."""
INPUT_MARKER_START = "[Old tool input cleared — "
"""How ctxd's marker of a cleared tool-call argument starts (it names a blob)."""
CLEARED_INPUT = "[Old tool input cleared]"
"""What a fork shows for such an argument."""
NO_REMOVAL_CHARS = 120_000
CHAR_BUDGET = 200_000
SEPARATOR = "\n\n"
"""Between two messages' blocks in the formatted context."""


@dataclass(frozen=True)
class ForkedMessage:
    """A message of the forked context (a tool result or call maybe cut)."""

    role: Role
    content: Content
    name: str | None = None
    tool_call_id: str | None = None
    tier: int | None = None
    """A tool result's tier (0, 1, 2); None for other messages."""
    cut: bool = False
    """A tool result cut by stage 2."""
    cleared: bool = False
    """A tool result already cleared."""


@dataclass(frozen=True)
class Fork:
    preamble: str
    context: str
    messages: list[ForkedMessage]
    stats: ForkStats
    tokens: int
    """Exact tokens of what a child reads: the preamble, a blank line, the context."""


# ---- Stage 1: the latest compaction boundary --------------------------------------------

def _source_id(meta: dict[str, Any]) -> str | None:
    """The id of the message an importer read a message from (OpenCode: its message id)."""
    source = meta.get("source")
    found = source.get("id") if isinstance(source, dict) else None
    return found if isinstance(found, str) else None


@dataclass(frozen=True)
class Boundary:
    """The latest compaction: its summary's index, and the messages before the summary that
    the compacted agent still saw verbatim after it (OpenCode's tail; else empty)."""

    summary: int
    tail: range = range(0)


def compaction_slice(messages: Sequence[StoredMessage]) -> Boundary | None:
    """The latest compaction boundary, or None. A summary is Claude Code's
    ``isCompactSummary`` record (``meta.compact_summary``), OpenCode's ``summary: true``
    assistant message after a user message with a ``compaction`` part, or a message ctxd's
    own compaction wrote for a span (``meta.compaction``: ``summary`` or ``truncated``).

    OpenCode's compaction part may name, in ``tail_start_id``, the first message of the
    newest turns it keeps verbatim: the tail runs from the first message imported from that
    OpenCode message up to the compaction request (excluded). Without it, or when no message
    before the request has that id, there is no tail."""
    boundary: Boundary | None = None
    first_of: dict[str, int] = {}
    request: tuple[int, str | None] | None = None
    for index, message in enumerate(messages):
        meta = message.meta
        if not meta:
            continue
        source = _source_id(meta)
        if source is not None:
            first_of.setdefault(source, index)
        if meta.get("compact_summary") is True \
                or meta.get(COMPACTION_META) in ("summary", "truncated"):
            boundary = Boundary(index)
        elif message.role == "user" and (tail_id := _compaction_part(meta)) is not None:
            request = (index, tail_id or None)
        elif request is not None and message.role == "assistant" \
                and meta.get("summary") is True:
            asked, tail_id = request
            start = first_of.get(tail_id) if tail_id else None
            boundary = Boundary(index, range(start, asked) if start is not None
                                and start < asked else range(0))
            request = None
    return boundary


def _compaction_part(meta: dict[str, Any]) -> str | None:
    """A compaction part's ``tail_start_id`` ("" without one), or None: no compaction part."""
    parts = meta.get("parts")
    if not isinstance(parts, list):
        return None
    found = None
    for part in parts:
        if isinstance(part, dict) and part.get("type") == "compaction":
            tail = part.get("tail_start_id")
            found = tail if isinstance(tail, str) else ""
    return found


@dataclass(frozen=True)
class Sliced:
    """Stage 1's outcome: the messages a fork is made of, in the order the child reads them,
    their content scrubbed of secrets (what leaves a session is: docs/security.md)."""

    messages: list[StoredMessage]
    original_count: int
    """The thread's messages."""
    boundary: Boundary | None
    skipped: int
    """The thread's messages left out before the latest compaction summary."""


def sliced(messages: Sequence[StoredMessage]) -> Sliced:
    """Stage 1: the thread from its latest compaction boundary (`compaction_slice`), each
    message's content scrubbed before anything is cut, so that no cut leaves a piece of a
    secret the scrubber would no longer recognise.

    Raises:
        ScrubError: a content could not be scrubbed; nothing of the thread may leave.
    """
    boundary = compaction_slice(messages)
    kept: Sequence[StoredMessage]
    if boundary is None:
        kept, skipped = messages, 0
    else:
        # The summary, then the tail the agent kept (OpenCode), then what followed: the
        # order the compacted agent saw them in (docs/decisions.md, "Fork pipeline").
        summary, tail = boundary.summary, boundary.tail
        kept = [messages[summary], *(messages[i] for i in tail), *messages[summary + 1:]]
        skipped = summary - len(tail)
    return Sliced(messages=[msgspec.structs.replace(m, content=scrub_value(m.content))
                            for m in kept],
                  original_count=len(messages), boundary=boundary, skipped=skipped)


def compaction_boundary(messages: Sequence[StoredMessage]) -> int | None:
    """The index of the latest compaction summary (`compaction_slice`), or None."""
    boundary = compaction_slice(messages)
    return None if boundary is None else boundary.summary


# ---- Stage 2: graduated truncation -------------------------------------------------------

def cut(text: str, limit: int, head_tail: bool) -> str:
    """``text`` in at most ``limit`` characters and the marker ``…[truncated N chars]…``
    (N: the characters left out): its head, or 80% head and 20% tail. Characters are code
    points: a cut never splits one."""
    if len(text) <= limit:
        return text
    marker = f"…[truncated {len(text) - limit} chars]…"
    if not head_tail:
        return text[:limit] + marker
    head = int(limit * HEAD_SHARE)
    tail = limit - head
    return text[:head] + marker + (text[len(text) - tail:] if tail else "")


def wants_head_tail(tool_name: str | None, text: str) -> bool:
    """Head+tail for a shell-like tool or a text that shows an error; head only else."""
    if tool_name:
        lowered = tool_name.lower()
        if any(word in lowered for word in HEAD_TAIL_TOOLS):
            return True
    return any(word in text for word in ERROR_WORDS)


def is_cleared(message: StoredMessage) -> bool:
    """A tool result already cleared: by the agent's harness, or by ctxd's compaction (its
    stub: docs/protocol.md, "Compaction")."""
    meta = message.meta or {}
    if meta.get(COMPACTION_META) == "cleared" or meta.get("compacted") is not None:
        return True
    return isinstance(message.content, str) and message.content.startswith(
        (CLEARED_MARKER[:-1], STUB_PREFIX))


def content_text(content: Content) -> str:
    """A content's text: a string, or its text parts joined by newlines."""
    if isinstance(content, str):
        return content
    return "\n".join(str(part.get("text", "")) for part in content
                     if part.get("type") == "text")


def tier_of(rank: int) -> int:
    """The tier (0, 1, 2) of the tool result ``rank`` places from the newest."""
    if rank < FULL_RESULTS:
        return 0
    return 1 if rank < FULL_RESULTS + CUT_RESULTS else 2


@dataclass
class _Counts:
    tiers: list[int] = field(default_factory=lambda: [0, 0, 0])
    truncated: int = 0
    head_tail: int = 0
    cleared: int = 0
    params: int = 0


def _plain_inputs(value: Any) -> tuple[Any, int]:
    """``value`` with each of ctxd's cleared-input markers (a whole string) replaced by
    `CLEARED_INPUT`, and how many there were."""
    if isinstance(value, str):
        return (CLEARED_INPUT, 1) if value.startswith(INPUT_MARKER_START) else (value, 0)
    if isinstance(value, dict):
        found = 0
        plain = {}
        for key, item in value.items():
            plain[key], more = _plain_inputs(item)
            found += more
        return plain, found
    if isinstance(value, list):
        pairs = [_plain_inputs(item) for item in value]
        return [item for item, _ in pairs], sum(more for _, more in pairs)
    return value, 0


def _cut_calls(content: Content, tiers: dict[str, int], counts: _Counts) -> Content:
    if isinstance(content, str) or not any(p.get("type") == "tool_use" for p in content):
        return content
    parts = []
    for part in content:
        if part.get("type") == "tool_use":
            limit = PARAM_CHARS[tiers.get(str(part.get("id")), 0)]
            params, markers = _plain_inputs(part.get("input"))
            if markers:
                part = {**part, "input": params}
            text = json.dumps(params, ensure_ascii=False)
            # An input that holds only cleared markers besides what fits is already cleared:
            # never cut a marker in half.
            if len(text) - markers * len(CLEARED_INPUT) > limit:
                name = part.get("name")
                head_tail = wants_head_tail(name if isinstance(name, str) else None, text)
                counts.params += 1
                counts.head_tail += head_tail
                part = {**part, "input": {"truncated_input": cut(text, limit, head_tail)}}
        parts.append(part)
    return parts


def truncate(messages: Sequence[StoredMessage]) -> tuple[list[ForkedMessage], _Counts]:
    """Stage 2: tool results by recency (the newest `FULL_RESULTS` whole, the next
    `CUT_RESULTS` to 3,000 characters, the rest to 500) and tool calls' parameters by their
    result's tier (500 / 200 / 100); cleared results pass through."""
    tiers: dict[str, int] = {}
    rank_of: dict[int, int] = {}
    rank = 0
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role == "tool":
            rank_of[index] = rank
            if message.tool_call_id is not None:
                tiers.setdefault(message.tool_call_id, tier_of(rank))
            rank += 1
    counts = _Counts()
    forked = []
    for index, message in enumerate(messages):
        content = message.content
        tier = cleared = None
        truncated = False
        if message.role == "tool":
            tier = tier_of(rank_of[index])
            counts.tiers[tier] += 1
            limit = RESULT_CHARS[tier]
            cleared = is_cleared(message)
            if cleared:
                counts.cleared += 1
                if (message.meta and message.meta.get("compacted") is not None) \
                        or (isinstance(content, str) and content.startswith(OWN_MARKERS)):
                    # ctxd's own markers name a blob of the forked session, which a child
                    # cannot read: the plain marker (docs/decisions.md, "Fork pipeline").
                    content = CLEARED_MARKER
            elif limit is not None:
                text = content_text(content)
                if len(text) > limit:
                    head_tail = wants_head_tail(message.name, text)
                    counts.truncated += 1
                    counts.head_tail += head_tail
                    content = cut(text, limit, head_tail)
                    truncated = True
        elif message.role == "assistant":
            content = _cut_calls(content, tiers, counts)
        forked.append(ForkedMessage(role=message.role, content=content, name=message.name,
                                    tool_call_id=message.tool_call_id, tier=tier,
                                    cut=truncated, cleared=bool(cleared)))
    return forked, counts


# ---- Stage 3: the character budget ---------------------------------------------------------

def block(message: ForkedMessage) -> str:
    """One message of the formatted context: its role (a tool result: and the tool's
    name), then its text; a tool call as ``[tool_use NAME id=ID] PARAMS``."""
    if message.role == "tool":
        header = f"[tool: {message.name or 'tool'}]"
    else:
        header = f"[{message.role}]"
    if isinstance(message.content, str):
        return f"{header}\n{message.content}"
    lines = [header]
    for part in message.content:
        kind = part.get("type")
        if kind == "text":
            lines.append(str(part.get("text", "")))
        elif kind == "tool_use":
            lines.append(f"[tool_use {part.get('name')} id={part.get('id')}] "
                         + json.dumps(part.get("input"), ensure_ascii=False))
        elif kind == "tool_result":
            body = part.get("content")
            lines.append(f"[tool_result id={part.get('tool_use_id')}] "
                         + (content_text(body) if isinstance(body, str | list) else ""))
        else:
            lines.append(f"[{kind}]")
    return "\n".join(lines)


def cut_within(text: str, size: int) -> str:
    """``text`` cut head+tail (80/20) so that, with its marker, it holds at most ``size``
    characters (a text that fits is left alone; a marker alone longer than ``size`` is all
    that is left)."""
    if len(text) <= size:
        return text
    limit = size
    while True:
        shorter = max(0, size - len(f"…[truncated {len(text) - limit} chars]…"))
        if shorter == limit:
            return cut(text, limit, head_tail=True)
        limit = shorter


def _shrunk(message: ForkedMessage, excess: int) -> ForkedMessage:
    """The message with its text ``excess`` characters shorter, cut head+tail: a string
    content, else its longest text parts (a tool call's parameters stay as stage 2 left
    them)."""
    if isinstance(message.content, str):
        text = message.content
        return replace(message, content=cut_within(text, max(0, len(text) - excess)))
    parts = list(message.content)
    order = sorted((i for i, part in enumerate(parts) if part.get("type") == "text"),
                   key=lambda i: -len(str(parts[i].get("text", ""))))
    for index in order:
        if excess <= 0:
            break
        text = str(parts[index].get("text", ""))
        shorter = cut_within(text, max(0, len(text) - excess))
        excess -= len(text) - len(shorter)
        parts[index] = {**parts[index], "text": shorter}
    return replace(message, content=parts)


@dataclass(frozen=True)
class Fitted:
    """Stage 3's outcome: the messages kept (indices, in order), and the ones that must
    stay cut to a block length (index: characters) when they alone exceed the budget."""

    kept: list[int]
    caps: dict[int, int] = field(default_factory=dict)


def fit(blocks: Sequence[str], roles: Sequence[Role], char_budget: int,
        no_removal_chars: int, keep: frozenset[int] = frozenset(),
        parents: Sequence[int | None] | None = None) -> Fitted:
    """Stage 3: which messages stay so that the formatted context fits in ``char_budget``
    (all at or under ``no_removal_chars``, or under ``char_budget``): the oldest go first,
    except those in ``keep`` (the newest message, the latest user request: they always
    stay); a tool result goes with its call (``parents``: the index of each result's call,
    None when it is not in the context; by default the message before the results). When
    what stays is still over the budget, it is all in ``keep``: the longest of those are
    capped to share the budget."""
    count = len(blocks)
    if parents is None:
        parents = _preceding(roles)
    chars = sum(len(text) for text in blocks)
    if chars + len(SEPARATOR) * max(0, count - 1) <= max(no_removal_chars, char_budget):
        return Fitted(list(range(count)))
    removed = [False] * count
    left = count
    for index in range(count):
        if chars + len(SEPARATOR) * max(0, left - 1) <= char_budget:
            break
        if index not in keep:
            removed[index] = True
            chars -= len(blocks[index])
            left -= 1
    for index in range(count):
        if removed[index] or roles[index] != "tool" or index in keep:
            continue
        parent = parents[index]
        if parent is not None and removed[parent]:
            removed[index] = True
            chars -= len(blocks[index])
            left -= 1
    kept = [index for index in range(count) if not removed[index]]
    available = char_budget - len(SEPARATOR) * max(0, left - 1)
    if chars <= available:
        return Fitted(kept)
    # Share what is available: blocks under an equal share stay whole, the rest are capped.
    caps: dict[int, int] = {}
    by_length = sorted(kept, key=lambda index: len(blocks[index]))
    for position, index in enumerate(by_length):
        share = max(0, available) // (len(by_length) - position)
        if len(blocks[index]) <= share:
            available -= len(blocks[index])
            continue
        caps.update((longer, share) for longer in by_length[position:])
        break
    return Fitted(kept, caps)


def _preceding(roles: Sequence[Role]) -> list[int | None]:
    """For each tool result, the latest message before it that is not a tool result."""
    parents: list[int | None] = []
    last: int | None = None
    for index, role in enumerate(roles):
        parents.append(last if role == "tool" else None)
        if role != "tool":
            last = index
    return parents


def protected(messages: Sequence[ForkedMessage]) -> frozenset[int]:
    """The messages stage 3 never removes: the newest (and, a tool result, its call) and
    the latest user request."""
    if not messages:
        return frozenset()
    keep = {len(messages) - 1}
    newest = messages[-1]
    if newest.role == "tool" and newest.tool_call_id is not None:
        for index in range(len(messages) - 2, -1, -1):
            if newest.tool_call_id in _call_ids(messages[index]):
                keep.add(index)
                break
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            keep.add(index)
            break
    return frozenset(keep)


def _call_ids(message: ForkedMessage) -> list[str]:
    if message.role != "assistant" or isinstance(message.content, str):
        return []
    return [str(part.get("id")) for part in message.content if part.get("type") == "tool_use"]


def call_parents(messages: Sequence[ForkedMessage]) -> list[int | None]:
    """For each tool result, the index of the message with its call (None: unknown)."""
    call_at: dict[str, int] = {}
    parents: list[int | None] = []
    for index, message in enumerate(messages):
        for call_id in _call_ids(message):
            call_at[call_id] = index
        parents.append(call_at.get(message.tool_call_id or "")
                       if message.role == "tool" else None)
    return parents


# ---- the pipeline ----------------------------------------------------------------------------

def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def preamble(stats: ForkStats, skipped: int, tail: int, cut_to_fit: int,
             shown: Sequence[ForkedMessage]) -> str:
    """What the child is told was cut (``tail``: the messages kept verbatim before the
    summary, shown after it; ``cut_to_fit``: messages that must stay, cut to fit the
    budget; ``shown``: the messages the context holds, whose tool results are counted)."""
    results = [message for message in shown if message.tier is not None]
    tiers = [sum(message.tier == tier for message in results) for tier in range(3)]
    truncated = sum(message.cut for message in results)
    cleared = sum(message.cleared for message in results)
    if stats.compaction_detected:
        kept = (f", then the {_plural(tail, 'message')} the agent kept verbatim before it"
                if tail else "")
        compaction = (f"Compaction: the context was compacted before; it starts at the latest "
                      f"compaction summary{kept} ({_plural(skipped, 'earlier message')} left "
                      "out).")
    else:
        compaction = "Compaction: none found; the context starts at the first message."
    return "\n".join((
        "[Forked context: a bounded copy of another session's conversation.]",
        compaction,
        f"Tool results: {tiers[0]} newest kept whole, {tiers[1]} cut to at most 3,000 "
        f"characters, {tiers[2]} cut to at most 500 characters ({truncated} truncated, "
        f"{cleared} already cleared).",
        f"Messages removed to fit the character budget: {stats.removed_messages}"
        + (f"; {_plural(cut_to_fit, 'message')} that must stay (the newest, the latest user "
           "request) cut to fit it." if cut_to_fit else "."),
        "Cut text is marked …[truncated N chars]…: re-read files for full contents."))


def fork(messages: Sequence[StoredMessage] | Sliced, count_tokens: Callable[[str], int],
         char_budget: int = CHAR_BUDGET, no_removal_chars: int = NO_REMOVAL_CHARS) -> Fork:
    """The forked context of a thread's messages (in thread order), or of what `sliced`
    kept of them (a fork fitted in several passes slices and scrubs once), and its exact
    tokens counted by ``count_tokens``.

    Raises:
        ScrubError: as `sliced`.
    """
    source = messages if isinstance(messages, Sliced) else sliced(messages)
    boundary, skipped = source.boundary, source.skipped
    forked, counts = truncate(source.messages)
    blocks = [block(message) for message in forked]
    fitted = fit(blocks, [m.role for m in forked], char_budget, no_removal_chars,
                 protected(forked), call_parents(forked))
    for index, cap in fitted.caps.items():
        forked[index] = _shrunk(forked[index], len(blocks[index]) - cap)
        blocks[index] = block(forked[index])
    final = [forked[index] for index in fitted.kept]
    removed = len(forked) - len(final)
    context = SEPARATOR.join(blocks[index] for index in fitted.kept)
    stats = ForkStats(
        original_count=source.original_count, final_count=len(forked) - removed,
        total_chars=len(context), removed_messages=removed,
        compaction_detected=boundary is not None,
        compaction_slice_index=None if boundary is None else boundary.summary,
        truncated_results=counts.truncated,
        tier_distribution=TierDistribution(tier1=counts.tiers[0], tier2=counts.tiers[1],
                                           tier3=counts.tiers[2]),
        head_tail_applied=counts.head_tail, cleared_results=counts.cleared,
        truncated_params=counts.params)
    head = preamble(stats, skipped, 0 if boundary is None else len(boundary.tail),
                    len(fitted.caps), final)
    return Fork(preamble=head, context=context, messages=final, stats=stats,
                tokens=count_tokens(head + SEPARATOR + context if context else head))

"""The context policies agents use today, each a small function over the same replay, and
what a policy's requests cost with Anthropic's prompt cache (``ctxctl replay``;
docs/decisions.md, "Replay: cost").

A replay is a list of model calls (`Call`): the raw thread as the agent would send it up
to each assistant response, Anthropic's shape, the response, and when it was made (the
transcript's timestamp). A policy turns it into the requests it would send (`Sent`);
`price` charges those, in order and on the transcript's clock, to a `PromptCache` that
starts empty. Every request carries one breakpoint, on the last block of its last message,
as Claude Code places it; tool definitions and the system prompt, which a transcript does
not record, are left out of every policy alike.

The policies (none tuned against ctxd; ctxd's own is its gateway, driven by the replay):

- ``raw``: the thread as it grew, nothing managed.
- ``claude-code``: a tool result over `PREVIEW_OVER` characters replaced by its first
  `PREVIEW_CHARS` (Claude Code saves the whole output to a file the model may read: one
  read away); past `COMPACT_AT` of the window, a compaction call (the context read from
  the cache, a summary instruction, `SUMMARY_TOKENS` of output) and the thread replaced by
  a summary of `SUMMARY_TOKENS` tokens, then the last assistant message and what follows.
- ``context-editing``: Anthropic's ``clear_tool_uses_20250919`` with its documented
  defaults: a request past `EDIT_TRIGGER` input tokens has every tool result but the
  `EDIT_KEEP` most recent replaced by a placeholder, server-side (what the cache sees).
- ``observation-masking``: every tool result but the `MASK_KEEP` most recent replaced by
  a placeholder.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxd.cost import COST_RATIOS, PRICES, PromptCache

Message = dict[str, Any]

MARK = {"type": "ephemeral"}
PREVIEW_OVER = 30_000
"""Claude Code keeps a tool result over this many characters in a file and sends a preview
(its ``<persisted-output>``)."""
PREVIEW_CHARS = 2_000
COMPACT_AT = 0.84
"""Claude Code compacts past this share of the window: 167,974 tokens of a 200,000-token
window in the ``compact_boundary`` record (trigger ``auto``) of a real Claude Code 2.x
transcript; Claude Code 2.x compacts at the window less its output reserve (20,000) and a
13,000-token buffer: 167,000 of 200,000."""
SUMMARY_TOKENS = 2_421
"""The summary Claude Code's compaction leaves: the larger of the two summaries in the
shared templar transcript (its second compaction; the first is 1,700 tokens)."""
SUMMARY_INSTRUCTION = ("Your task is to create a detailed summary of the conversation so "
                       "far, paying close attention to the user's explicit requests and "
                       "your previous actions.")
EDIT_TRIGGER = 100_000
EDIT_KEEP = 3
EDIT_PLACEHOLDER = "[Tool result cleared]"
MASK_KEEP = 10
"""The latest tool results observation masking keeps (M = 10 in the study that proposed
it: "The Complexity Trap", Lindenbauer et al., 2025)."""

POLICIES = ("raw", "claude-code", "context-editing", "observation-masking", "ctxd")
"""Every policy ``ctxctl replay`` runs, in its report's order."""


@dataclass(frozen=True)
class Call:
    """One model call of the transcript."""

    messages: list[Message]
    """The raw thread up to the response, Anthropic's shape, without cache marks."""
    at: float
    """When it was made: seconds, from the transcript's timestamps."""
    response: Message


@dataclass
class Sent:
    """A request a policy sends."""

    messages: list[Message]
    at: float
    output_tokens: int
    call: int
    """The transcript's call it belongs to (a compaction call belongs to the call it ran
    before)."""


@dataclass
class Applied:
    """What a policy did to a replay: its requests, and the context it keeps at the end."""

    sent: list[Sent]
    final: list[Message]
    """The context after the last call, as the policy would send it next."""
    removed_bytes: int = 0
    retrievable_bytes: int = 0
    """Of the removed bytes, those the model can read back (a file, a ref)."""
    readable: list[str] = field(default_factory=list)
    """Texts one read away from ``final`` (Claude Code's saved outputs)."""


@dataclass
class PolicyReport:
    """One policy's figures (``ctxctl replay --json``'s ``policies``)."""

    cost: float
    """In input-token units (`COST_RATIOS`)."""
    dollars: float
    """At the price model's list prices (`ctxd.cost.PRICES`)."""
    input_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    output_tokens: int
    peak_tokens: int
    model_calls: int
    key_facts_kept: float
    retrievable_fraction: float
    series: list[dict[str, Any]]
    """Per call of the transcript: the tokens of its request, its cost, and the cost so
    far."""


# ---- Anthropic's messages --------------------------------------------------------------

def blocks_of(message: Message) -> list[dict[str, Any]]:
    """A message's content blocks (a string content as one text block)."""
    content = message.get("content")
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(
        content or [])


def result_text(block: dict[str, Any]) -> str:
    """A tool_result block's text: its string, or its text blocks joined by newlines."""
    content = block.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content or []
                     if isinstance(part, dict) and part.get("type") == "text")


def results(messages: Sequence[Message]) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(message index, block index, block) of every tool_result, oldest first."""
    for index, message in enumerate(messages):
        if message.get("role") != "user" or not isinstance(message.get("content"), list):
            continue
        for k, block in enumerate(message["content"]):
            if isinstance(block, dict) and block.get("type") == "tool_result":
                yield index, k, block


def replace_results(messages: Sequence[Message],
                    replacement: Callable[[int, dict[str, Any]], str | None]) -> list[Message]:
    """``messages`` with each tool_result for which ``replacement(ordinal, block)`` gives a
    text holding that text instead (the others, and the messages, shared)."""
    out = list(messages)
    for ordinal, (index, k, block) in enumerate(list(results(messages))):
        text = replacement(ordinal, block)
        if text is None:
            continue
        if out[index] is messages[index]:
            out[index] = {**messages[index], "content": list(messages[index]["content"])}
        out[index]["content"][k] = {**block, "content": text}
    return out


def marked(messages: Sequence[Message]) -> list[Message]:
    """The request as the agent sends it: a breakpoint on its last message's last block."""
    if not messages:
        return []
    last = copy.deepcopy(messages[-1])
    parts = blocks_of(last)
    if parts:
        parts[-1] = {**parts[-1], "cache_control": MARK}
        last["content"] = parts
    return [*messages[:-1], last]


def size_of(value: Any) -> int:
    """A text's UTF-8 bytes, or a value's as compact JSON."""
    return len(value.encode()) if isinstance(value, str) else len(
        json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


# ---- the policies ----------------------------------------------------------------------

def raw(calls: Sequence[Call], final: list[Message], window: int,
        cache: PromptCache) -> Applied:
    """No management: each call's thread as it is."""
    return Applied([Sent(call.messages, call.at, output_of(call, cache), n)
                    for n, call in enumerate(calls)], final)


def _masked(messages: Sequence[Message], keep: int, placeholder: Callable[[str], str]
            ) -> tuple[list[Message], int]:
    total = sum(1 for _ in results(messages))
    removed = 0

    def replace(ordinal: int, block: dict[str, Any]) -> str | None:
        nonlocal removed
        if ordinal >= total - keep:
            return None
        text = result_text(block)
        removed += len(text.encode())
        return placeholder(text)

    return replace_results(messages, replace), removed


def _mask_placeholder(text: str) -> str:
    return f"Old environment output: ({len(text.splitlines())} lines omitted)"


def observation_masking(calls: Sequence[Call], final: list[Message], window: int,
                        cache: PromptCache, keep: int = MASK_KEEP) -> Applied:
    """Every tool result but the ``keep`` latest replaced by a placeholder."""
    sent = [Sent(_masked(call.messages, keep, _mask_placeholder)[0], call.at,
                 output_of(call, cache), n) for n, call in enumerate(calls)]
    kept, removed = _masked(final, keep, _mask_placeholder)
    return Applied(sent, kept, removed_bytes=removed)


def context_editing(calls: Sequence[Call], final: list[Message], window: int,
                    cache: PromptCache, trigger: int = EDIT_TRIGGER,
                    keep: int = EDIT_KEEP) -> Applied:
    """Anthropic's ``clear_tool_uses_20250919`` (defaults: `EDIT_TRIGGER`, `EDIT_KEEP`):
    past ``trigger`` input tokens, every tool result but the ``keep`` latest cleared (the
    request's tokens counted as the client sent it, before clearing)."""

    def edited(messages: list[Message]) -> tuple[list[Message], int]:
        if cache.tokens({"messages": messages}) <= trigger:
            return messages, 0
        return _masked(messages, keep, lambda _: EDIT_PLACEHOLDER)

    sent = [Sent(edited(call.messages)[0], call.at, output_of(call, cache), n)
            for n, call in enumerate(calls)]
    kept, removed = edited(final)
    return Applied(sent, kept, removed_bytes=removed)


def _preview(text: str) -> str:
    return (f"<persisted-output>\nOutput too large ({len(text):,} characters). Full output "
            f"saved to a file.\n\nPreview (first {PREVIEW_CHARS:,} characters):\n"
            f"{text[:PREVIEW_CHARS]}\n...\n</persisted-output>")


@dataclass
class _Gist:
    """What the stand-in summaries keep, carried from one compaction to the next."""

    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    named: list[str] = field(default_factory=list)
    """The files and commands the calls named, oldest first."""
    made: int = 0
    """Summaries made so far (each one's text differs, as a model's would)."""


def _summary(messages: Sequence[Message], cache: PromptCache, size: int,
             carried: _Gist | None = None) -> tuple[Message, _Gist]:
    """A stand-in for Claude Code's summary of ``messages`` (and of the summary before
    them, ``carried``): exactly ``size`` tokens that keep verbatim, as far as they fit,
    the user's first and latest requests, each tool error's first line, the files and
    commands the calls named (newest first), then the other requests; and what it was
    made of, for the next one."""
    gist = _Gist() if carried is None else _Gist(list(carried.requests),
                                                 list(carried.errors), list(carried.named),
                                                 carried.made)
    gist.made += 1
    for message in messages:
        for block in blocks_of(message):
            if block.get("type") == "text" and message.get("role") == "user":
                gist.requests.append(f"User: {block.get('text', '')}")
            elif block.get("type") == "tool_use" and isinstance(block.get("input"), dict):
                values = [f"{key}={value}" for key, value in block["input"].items()
                          if key in ("file_path", "path", "notebook_path", "command")
                          and isinstance(value, str)]
                if values:
                    gist.named.append(f"{block.get('name')}: {', '.join(values)}")
            elif block.get("type") == "tool_result" and block.get("is_error"):
                first = result_text(block).strip().splitlines()[:1]
                if first:
                    gist.errors.append(f"Error: {first[0]}")
    # The first and latest requests, errors, then the newest calls first: what a cut
    # leaves out is the oldest calls and the other requests.
    requests = gist.requests
    lines = ["This session is being continued from a previous conversation that ran out "
             f"of context. The conversation is summarized below (summary {gist.made}):",
             *requests[:1],
             *requests[1:][-1:], *gist.errors, *reversed(gist.named), *requests[1:-1]]
    text = "\n".join(lines)

    def tokens(value: str) -> int:
        return cache.tokens({"messages": [{"role": "user", "content": value}]})

    if tokens(text) > size:
        low, high = 0, len(text)
        while low < high:  # the longest head that fits
            middle = (low + high + 1) // 2
            low, high = (middle, high) if tokens(text[:middle]) <= size \
                else (low, middle - 1)
        text = text[:low]
    while (missing := size - tokens(text)) > 0:
        text += " ." * missing  # about a token each
    return {"role": "user", "content": text}, gist


def claude_code(calls: Sequence[Call], final: list[Message], window: int,
                cache: PromptCache, compact_at: float = COMPACT_AT,
                summary_tokens: int = SUMMARY_TOKENS) -> Applied:
    """Claude Code's own management: previews of large outputs, compaction past
    ``compact_at`` of the window to a summary of ``summary_tokens`` (defaults:
    `COMPACT_AT`, `SUMMARY_TOKENS`)."""
    threshold = compact_at * window
    saved: dict[str, str] = {}

    def previewed(messages: Sequence[Message]) -> list[Message]:
        def replace(_: int, block: dict[str, Any]) -> str | None:
            text = result_text(block)
            if len(text) <= PREVIEW_OVER:
                return None
            saved[str(block.get("tool_use_id"))] = text
            return _preview(text)

        return replace_results(messages, replace)

    summary: Message | None = None
    gist: _Gist | None = None
    cut = 0  # where the thread since the last compaction starts
    sent: list[Sent] = []
    for n, call in enumerate(calls):
        thread = previewed(call.messages[cut:])
        request = ([summary] if summary else []) + thread
        if cache.tokens({"messages": request}) > threshold:
            summarize = [*request, {"role": "user", "content": SUMMARY_INSTRUCTION}]
            sent.append(Sent(summarize, call.at, summary_tokens, n))
            # What follows the summary: the last assistant message and what came after.
            last = max((i for i, m in enumerate(call.messages)
                        if m.get("role") == "assistant"), default=len(call.messages))
            summary, gist = _summary(previewed(call.messages[cut:last]), cache,
                                     summary_tokens, gist)
            cut = max(cut, last)
            request = [summary, *previewed(call.messages[cut:])]
        sent.append(Sent(request, call.at, output_of(call, cache), n))
    kept = ([summary] if summary else []) + previewed(final[cut:])
    readable = [saved[str(block.get("tool_use_id"))] for _, _, block in results(final[cut:])
                if str(block.get("tool_use_id")) in saved]
    summarized = sum(size_of(message.get("content")) for message in final[:cut])
    in_previews = sum(size_of(text) for text in readable)
    return Applied(sent, kept, removed_bytes=summarized + in_previews,
                   retrievable_bytes=in_previews, readable=readable)


RUN: dict[str, Callable[[Sequence[Call], list[Message], int, PromptCache], Applied]] = {
    "raw": raw, "claude-code": claude_code, "context-editing": context_editing,
    "observation-masking": observation_masking}
"""The policies the replay applies itself (``ctxd`` is its gateway's requests)."""


# ---- the price --------------------------------------------------------------------------

def output_of(call: Call, cache: PromptCache) -> int:
    """The tokens of a call's response (counted as the cache counts blocks)."""
    return cache.tokens({"messages": [call.response]})


def price(applied: Applied, model: str, facts_kept: float,
          counter: PromptCache | None = None) -> PolicyReport:
    """What ``applied``'s requests cost, charged in order, each at its time, to a cache
    that starts empty (``counter``: a cache whose token counts it may reuse)."""
    now = [0.0]
    cache = PromptCache(lambda: now[0], count=counter.count if counter else None)
    totals = dict.fromkeys(COST_RATIOS, 0)
    series: dict[int, dict[str, Any]] = {}
    peak = 0
    for sent in applied.sent:
        now[0] = sent.at
        usage = cache.charge({"messages": marked(sent.messages)})
        counts = {"input_tokens": usage.input_tokens,
                  "cache_read_tokens": usage.cache_read_tokens,
                  "cache_write_tokens": usage.cache_write_tokens,
                  "output_tokens": sent.output_tokens}
        for name, value in counts.items():
            totals[name] += value
        point = series.setdefault(sent.call, {"call": sent.call + 1, "tokens": 0, "cost": 0.0})
        point["tokens"] = usage.total
        point["cost"] += usage.cost(sent.output_tokens)
        peak = max(peak, usage.total)
    so_far = 0.0
    points = []
    for call in sorted(series):
        point = series[call]
        so_far += point["cost"]
        points.append({**point, "cost": round(point["cost"], 2),
                       "cumulative_cost": round(so_far, 2)})
    cost = sum(totals[name] * ratio for name, ratio in COST_RATIOS.items())
    return PolicyReport(
        cost=round(cost, 2), dollars=round(PRICES[model].dollars(totals), 4),
        input_tokens=totals["input_tokens"], cache_read_tokens=totals["cache_read_tokens"],
        cache_write_tokens=totals["cache_write_tokens"],
        output_tokens=totals["output_tokens"], peak_tokens=peak,
        model_calls=len(applied.sent), key_facts_kept=facts_kept,
        retrievable_fraction=round(applied.retrievable_bytes / applied.removed_bytes, 4)
        if applied.removed_bytes else 1.0, series=points)


__all__ = [
    "POLICIES",
    "RUN",
    "Applied",
    "Call",
    "PolicyReport",
    "Sent",
    "blocks_of",
    "marked",
    "price",
    "result_text",
    "results",
    "size_of",
]

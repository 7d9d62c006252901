"""What a model call costs: Anthropic's prompt cache emulated over the requests sent (which
tokens are read from the cache, written to it, or plain input), the price ratios, and a
dated table of prices in dollars (docs/performance.md, "Replay: cost"). ``ctxctl replay``
prices every policy's requests with it; the tests' scripted model servers answer with its
usage.

The rules emulated (Anthropic's prompt-caching documentation):

- A prompt is its tool definitions, then its system blocks, then its messages' blocks.
- A block with ``cache_control`` is a breakpoint (at most 4 per request); the prefix that
  ends at a breakpoint is written to the cache (``cache_creation_input_tokens``) unless it
  is there already.
- A request reads the longest prefix that is in the cache and that ends at most 20 blocks
  before one of its breakpoints (``cache_read_input_tokens``); the rest up to its last
  breakpoint is written; what follows the last breakpoint is plain input (``input_tokens``).
- An entry lives 5 minutes, refreshed each time it is read.

A prefix is identified by its blocks' content: ``cache_control`` itself is not part of it
(moving a breakpoint keeps what was cached), and neither is how the JSON was spelled (keys
sorted). Tokens are cl100k counts of each block's compact JSON: not Anthropic's tokenizer,
but the same for every policy and path compared.
Left out: the minimum cacheable length (1,024 tokens on most models: a shorter prefix is
not cached at all), which only touches a conversation's first few calls.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["COST_RATIOS", "DEFAULT_MODEL", "PRICES", "PRICES_AS_OF", "CacheUsage", "Price",
           "PromptCache", "blocks"]

LOOKBACK_BLOCKS = 20
LIFETIME_S = 300.0
MAX_BREAKPOINTS = 4
COST_RATIOS = {"input_tokens": 1.0, "cache_write_tokens": 1.25, "cache_read_tokens": 0.1,
               "output_tokens": 5.0}
"""Anthropic's prices relative to an input token (5-minute cache writes): a call's cost in
input-token units."""


@dataclass(frozen=True)
class Price:
    """One model's dollars per million tokens of each kind."""

    input: float
    output: float
    cache_write: float
    cache_read: float

    def dollars(self, counts: dict[str, int]) -> float:
        """``counts`` (keys of `COST_RATIOS`) in dollars."""
        return (counts.get("input_tokens", 0) * self.input
                + counts.get("output_tokens", 0) * self.output
                + counts.get("cache_write_tokens", 0) * self.cache_write
                + counts.get("cache_read_tokens", 0) * self.cache_read) / 1_000_000


PRICES_AS_OF = "2025-11-24"
"""The date of Anthropic's published price list `PRICES` copies (Claude Opus 4.5's release)."""
PRICES: dict[str, Price] = {
    "claude-opus-4-5": Price(input=5.0, output=25.0, cache_write=6.25, cache_read=0.50),
    "claude-sonnet-4-5": Price(input=3.0, output=15.0, cache_write=3.75, cache_read=0.30),
    "claude-haiku-4-5": Price(input=1.0, output=5.0, cache_write=1.25, cache_read=0.10),
}
"""Anthropic's list prices per million tokens (5-minute cache writes), as of
`PRICES_AS_OF`; each keeps the ratios of `COST_RATIOS`."""
DEFAULT_MODEL = "claude-sonnet-4-5"



@functools.cache
def _counter() -> Any:
    """The token counter, made on first use (importing this module loads no tokenizer:
    ctxctl imports it to list the replay's policies)."""
    from ctxd.tokens import TokenCounter

    return TokenCounter()


class _Counts:
    """Tokens of each block's JSON seen, remembered (a conversation sends its blocks again
    and again)."""

    def __init__(self) -> None:
        self.known: dict[str, int] = {}

    def __call__(self, encoded: str) -> int:
        tokens = self.known.get(encoded)
        if tokens is None:
            if len(self.known) >= 65_536:
                self.known.clear()
            tokens = self.known[encoded] = _counter().count(encoded)
        return tokens


@dataclass(frozen=True)
class CacheUsage:
    """A request's input tokens as the cache charged them."""

    input_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int

    @property
    def total(self) -> int:
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens

    def cost(self, output_tokens: int = 0) -> float:
        """In input-token units (`COST_RATIOS`), with ``output_tokens`` of answer."""
        return (self.input_tokens * COST_RATIOS["input_tokens"]
                + self.cache_write_tokens * COST_RATIOS["cache_write_tokens"]
                + self.cache_read_tokens * COST_RATIOS["cache_read_tokens"]
                + output_tokens * COST_RATIOS["output_tokens"])

    def as_anthropic(self) -> dict[str, int]:
        """The ``usage`` fields of Anthropic's answer."""
        return {"input_tokens": self.input_tokens,
                "cache_read_input_tokens": self.cache_read_tokens,
                "cache_creation_input_tokens": self.cache_write_tokens}


def blocks(body: dict[str, Any]) -> Iterator[tuple[Any, bool]]:
    """The prompt's blocks in cache order, each as (its identity, whether it is a
    breakpoint)."""

    def identity(kind: str, block: Any, first: bool) -> Any:
        content = ({key: value for key, value in block.items() if key != "cache_control"}
                   if isinstance(block, dict) else block)
        return [kind, first, content]

    def marked(block: Any) -> bool:
        return isinstance(block, dict) and block.get("cache_control") is not None

    for tool in body.get("tools") or []:
        yield identity("tool", tool, False), marked(tool)
    system = body.get("system")
    for block in ([{"type": "text", "text": system}] if isinstance(system, str)
                  else system or []):
        yield identity("system", block, False), marked(block)
    for message in body.get("messages") or []:
        content = message.get("content")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for index, block in enumerate(parts or []):
            yield identity(message.get("role", "?"), block, index == 0), marked(block)


class PromptCache:
    """The cache of one API key: `charge` a request, get its `CacheUsage`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 count: Callable[[str], int] | None = None) -> None:
        self.clock = clock
        self.expires: dict[bytes, float] = {}
        self.lock = threading.Lock()
        self.count: Callable[[str], int] = count or _Counts()
        """The tokens of one block's compact JSON (default: cl100k, remembered; caches
        may share one)."""

    def tokens(self, body: dict[str, Any]) -> int:
        """All the tokens of ``body``'s prompt, as `charge` counts them."""
        return sum(self.count(json.dumps(identity, sort_keys=True, separators=(",", ":")))
                   for identity, _ in blocks(body))

    def charge(self, body: dict[str, Any]) -> CacheUsage:
        """What ``body`` costs, the cache updated by it (entries written, reads refreshed).

        Raises:
            ValueError: more than 4 breakpoints (Anthropic refuses such a request).
        """
        digests: list[bytes] = []
        tokens: list[int] = []
        breakpoints: list[int] = []
        running = hashlib.sha256()
        for index, (identity, breakpoint_) in enumerate(blocks(body)):
            encoded = json.dumps(identity, sort_keys=True, separators=(",", ":"))
            running.update(encoded.encode())
            digests.append(running.copy().digest())
            tokens.append(self.count(encoded))
            if breakpoint_:
                breakpoints.append(index)
        if len(breakpoints) > MAX_BREAKPOINTS:
            raise ValueError(f"{len(breakpoints)} cache_control blocks; at most 4")
        if not breakpoints:
            return CacheUsage(sum(tokens), 0, 0)
        now = self.clock()
        with self.lock:
            read_end = -1
            for mark in breakpoints:
                for index in range(mark, max(-1, mark - LOOKBACK_BLOCKS - 1), -1):
                    if self.expires.get(digests[index], 0.0) > now:
                        read_end = max(read_end, index)
                        break
            last = breakpoints[-1]
            if read_end >= 0:
                self.expires[digests[read_end]] = now + LIFETIME_S
            for mark in breakpoints:
                if mark > read_end:
                    self.expires[digests[mark]] = now + LIFETIME_S
        read = sum(tokens[:read_end + 1])
        written = sum(tokens[read_end + 1:last + 1])
        return CacheUsage(sum(tokens[last + 1:]), read, written)

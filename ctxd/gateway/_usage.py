"""The provider's usage of one call, read from its response as it streams through: a JSON
body, or Anthropic's and OpenAI's server-sent events (docs/protocol.md, "Usage")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from ctxd.cost import COST_RATIOS

MAX_JSON_BYTES = 32 * 1024 * 1024
"""A JSON response longer than this is passed on without its usage read."""
_decode = msgspec.json.Decoder()


@dataclass
class ProviderUsage:
    """What the provider said the call used; ``response_id`` keys its record."""

    response_id: str | None = None
    model: str | None = None
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def cost(self) -> float:
        return round(sum(self.counters.get(name, 0) * ratio
                         for name, ratio in COST_RATIOS.items()), 2)

    def take_anthropic(self, usage: Any) -> None:
        """Anthropic's ``usage`` (message_delta's repeats and updates message_start's)."""
        if not isinstance(usage, dict):
            return
        for name, key in (("input_tokens", "input_tokens"),
                          ("output_tokens", "output_tokens"),
                          ("cache_read_tokens", "cache_read_input_tokens"),
                          ("cache_write_tokens", "cache_creation_input_tokens")):
            value = usage.get(key)
            if isinstance(value, int) and value >= 0:
                self.counters[name] = value

    def take_openai(self, usage: Any) -> None:
        """OpenAI's ``usage``: prompt tokens include the cached ones."""
        if not isinstance(usage, dict):
            return
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        prompt_details = usage.get("prompt_tokens_details") or {}
        completion_details = usage.get("completion_tokens_details") or {}
        cached = prompt_details.get("cached_tokens") if isinstance(prompt_details, dict) else 0
        reasoning = (completion_details.get("reasoning_tokens")
                     if isinstance(completion_details, dict) else 0)
        cached = cached if isinstance(cached, int) else 0
        if isinstance(prompt, int):
            self.counters["input_tokens"] = max(0, prompt - cached)
            self.counters["cache_read_tokens"] = cached
        if isinstance(completion, int):
            self.counters["output_tokens"] = completion
        if isinstance(reasoning, int) and reasoning:
            self.counters["thinking_tokens"] = reasoning

    def take_message(self, message: Any) -> None:
        """A whole response object (a JSON body, message_start's message, a chunk)."""
        if not isinstance(message, dict):
            return
        if isinstance(message.get("id"), str):
            self.response_id = message["id"]
        if isinstance(message.get("model"), str):
            self.model = message["model"]
        if "prompt_tokens" in (message.get("usage") or {}):
            self.take_openai(message["usage"])
        else:
            self.take_anthropic(message.get("usage"))


class UsageReader:
    """Reads a response's usage from its bytes as they pass (`feed`), without holding more
    than one SSE line (or, for JSON, the body up to `MAX_JSON_BYTES`)."""

    def __init__(self, streaming: bool) -> None:
        self.usage = ProviderUsage()
        self._streaming = streaming
        self._pending = bytearray()
        self._overflow = False

    def feed(self, chunk: bytes) -> None:
        if self._overflow:
            return
        self._pending += chunk
        if not self._streaming:
            if len(self._pending) > MAX_JSON_BYTES:
                self._overflow = True
                self._pending.clear()
            return
        end = self._pending.rfind(b"\n")
        if end < 0:
            return
        lines = bytes(self._pending[:end])
        del self._pending[:end + 1]
        for line in lines.split(b"\n"):
            self._line(line.rstrip(b"\r"))

    def _line(self, line: bytes) -> None:
        # Only the events that carry usage are decoded: a stream's many content deltas
        # are passed over by one substring test each.
        if not line.startswith(b"data:"):
            return
        if b"usage" not in line and (self.usage.response_id is not None
                                     or b'"id"' not in line):
            return
        try:
            event = _decode.decode(line[5:].strip())
        except msgspec.DecodeError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "message_start":
            self.usage.take_message(event.get("message"))
        elif kind == "message_delta":
            self.usage.take_anthropic(event.get("usage"))
        elif kind is None:  # an OpenAI chunk: the last one carries usage, when asked
            self.usage.take_message(event)

    def finish(self) -> ProviderUsage:
        """The usage read, once the response has ended."""
        if self._streaming:
            self._line(bytes(self._pending).rstrip(b"\r"))
        elif not self._overflow:
            try:
                self.usage.take_message(_decode.decode(bytes(self._pending)))
            except msgspec.DecodeError:
                pass
        self._pending.clear()
        return self.usage

    @property
    def counted(self) -> bool:
        """Whether the response said anything of its usage."""
        return bool(self.usage.counters)



"""Summarizers: what the compaction chain's second strategy turns the oldest span of a
thread into (docs/protocol.md, "Compaction"). Chosen by ``[hygiene] summarizer``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from ctxd.config import HygieneConfig
from ctxd.wire.types import RenderedMessage


class SummarizerError(Exception):
    """A summarizer failed; the message says why, in one line (compaction then goes on to
    truncation and reports it)."""


class Summarizer(Protocol):
    @property
    def name(self) -> str:
        """``extractive``, ``command`` or ``http``."""

    async def summarize(self, span: Sequence[RenderedMessage], max_tokens: int) -> str:
        """A summary of ``span`` (oldest first) meant to take at most about ``max_tokens``
        tokens (the caller cuts a longer one exactly).

        Raises:
            SummarizerError: it could not summarise the span.
        """


class ExtractiveSummarizer:
    """Keeps what compaction must not drop, without a model."""

    name = "extractive"

    async def summarize(self, span: Sequence[RenderedMessage], max_tokens: int) -> str:
        users = [m for m in span if m.role == "user" and isinstance(m.content, str)]
        if not users:
            return f"({len(span)} earlier messages)"
        return users[0].content if isinstance(users[0].content, str) else ""


def make_summarizer(config: HygieneConfig,
                    environ: Mapping[str, str] | None = None) -> Summarizer:
    """The summarizer ``config`` names."""
    if config.summarizer != "extractive":
        raise SummarizerError(f"summarizer {config.summarizer!r} is not available")
    return ExtractiveSummarizer()

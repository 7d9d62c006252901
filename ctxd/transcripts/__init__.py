"""Transcript parsers: Claude Code JSONL and OpenCode exports as ctxd messages and usage;
the providers' message shapes (OpenAI Chat Completions, Anthropic Messages) as ctxd records
them and as it renders them back.

Pure: they read the bytes given to them and nothing else (no files, no store); the
importer (``transcript.import``, docs/protocol.md) feeds them and appends what they yield.
"""

from ctxd.transcripts._claude_code import (
    PERSISTED_OUTPUT,
    ClaudeCodeParser,
    decode_record,
    is_array,
    saved_output,
)
from ctxd.transcripts._model import Entry, Usage
from ctxd.transcripts._opencode import NOT_AN_EXPORT, locate_messages, parse_message
from ctxd.transcripts._providers import (
    SHAPE,
    anthropic_messages,
    anthropic_tools,
    call_part,
    decoded_arguments,
    openai_messages,
    openai_tools,
    recorded,
)
from ctxd.transcripts._split import ArraySplitter, LineSplitter, Piece

__all__ = ["NOT_AN_EXPORT", "PERSISTED_OUTPUT", "SHAPE", "ArraySplitter", "ClaudeCodeParser",
           "Entry", "LineSplitter", "Piece", "Usage", "anthropic_messages", "anthropic_tools",
           "call_part", "decode_record", "decoded_arguments", "is_array", "locate_messages",
           "openai_messages", "openai_tools", "parse_message", "recorded", "saved_output"]

"""Transcript parsers: Claude Code JSONL and OpenCode exports as ctxd messages and usage.

Pure: they read the bytes given to them and nothing else (no files, no store); the
importer (``transcript.import``, docs/protocol.md) feeds them and appends what they yield.
"""

from ctxd.transcripts._claude_code import ClaudeCodeParser, is_array, parse_claude_code_array
from ctxd.transcripts._model import Entry, Usage
from ctxd.transcripts._opencode import parse_opencode

__all__ = ["ClaudeCodeParser", "Entry", "Usage", "is_array", "parse_claude_code_array",
           "parse_opencode"]

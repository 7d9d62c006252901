"""What both APIs' messages share: a content block's ``cache_control`` mark, left out of
what the gateway remembers and put back on what it sends (docs/decisions.md, Gateway)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MARK = "cache_control"
"""The key of a prompt-cache breakpoint on a content block."""


@dataclass(frozen=True)
class ToolResult:
    """A tool result a message carries."""

    index: int
    """Its block's index in the message's content (-1: the message is the result)."""
    call_id: str
    content: Any
    is_error: bool

    @property
    def text(self) -> str | None:
        """Its text when its content is text only (the only form a stub stands for)."""
        return content_text(self.content)


def content_text(content: Any) -> str | None:
    """A tool result's content as one text: a string, nothing (""), or text blocks joined
    by newlines (as ctxd records them); None when a block is not text (an image)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
            isinstance(block, dict) and block.get("type") == "text"
            and isinstance(block.get("text"), str) for block in content):
        return "\n".join(block["text"] for block in content)
    return None


def _unmarked_block(block: Any) -> Any:
    """The block without its marks (itself when it has none)."""
    if not isinstance(block, dict):
        return block
    inner = block.get("content")
    inner_marked = isinstance(inner, list) and any(
        isinstance(part, dict) and MARK in part for part in inner)
    if MARK not in block and not inner_marked:
        return block
    unmarked = {key: value for key, value in block.items() if key != MARK}
    if inner_marked and isinstance(inner, list):
        unmarked["content"] = [_unmarked_block(part) for part in inner]
    return unmarked


def _plain_text(block: Any) -> bool:
    return (isinstance(block, dict) and block.keys() == {"type", "text"}
            and block["type"] == "text" and isinstance(block["text"], str))


def bare(message: dict[str, Any]) -> dict[str, Any]:
    """The message without its blocks' ``cache_control`` marks (a tool result's inner
    blocks' too), and one plain text block as the string it stands for: agents move their
    breakpoints from request to request, and Claude Code sends its last message's text as
    a marked block and the same text as a string once it is no longer last; a message is
    known, and remembered, by the rest. A message without marks is returned itself."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    blocks = [_unmarked_block(block) for block in content]
    if len(blocks) == 1 and _plain_text(blocks[0]):
        return {**message, "content": blocks[0]["text"]}
    if all(new is old for new, old in zip(blocks, content, strict=True)):
        return message
    return {**message, "content": blocks}


def _mark_of(block: Any) -> Any:
    """A block's mark, or its inner blocks' last one (None: unmarked)."""
    if not isinstance(block, dict):
        return None
    if MARK in block:
        return block[MARK]
    inner = block.get("content")
    marks = [part[MARK] for part in inner if isinstance(part, dict) and MARK in part] \
        if isinstance(inner, list) else []
    return marks[-1] if marks else None


def marked(sent: dict[str, Any], agent: dict[str, Any]) -> dict[str, Any]:
    """``sent`` (a remembered bare message) with the agent's current marks put back: a block
    sent as the agent gave it is the agent's own, marks and all (byte-identical); a block
    ctxd replaced takes the mark the agent put on it or inside it, so a breakpoint stays on
    the message it marks. Blocks ctxd added (at the end) are never marked."""
    if sent == bare(agent):
        return agent  # sent as the agent gave it: the agent's own bytes
    sent_content, agent_content = sent.get("content"), agent.get("content")
    if (not isinstance(sent_content, list) or not isinstance(agent_content, list)
            or not count_marks([agent])):
        return sent  # the same object: nothing to put back
    blocks = []
    for index, block in enumerate(sent_content):
        original = agent_content[index] if index < len(agent_content) else None
        if original is not None and _unmarked_block(original) == block:
            blocks.append(original)
            continue
        mark = _mark_of(original)
        blocks.append(block if mark is None or not isinstance(block, dict)
                      else {**block, MARK: mark})
    return {**sent, "content": blocks}


def count_marks(messages: list[dict[str, Any]]) -> int:
    """Breakpoints among the messages' blocks (inner blocks included)."""
    total = 0
    for message in messages:
        content = message.get("content")
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict):
                total += MARK in block
                inner = block.get("content")
                total += sum(isinstance(part, dict) and MARK in part
                             for part in inner) if isinstance(inner, list) else 0
    return total

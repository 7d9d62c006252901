"""JSON with comments and trailing commas (JSONC), as OpenCode reads its ``opencode.json``
and ``opencode.jsonc``: read it, and write a changed value back into the text, so that the
user's comments, order and layout stay where they are.

Comments (``//`` and ``/* */``) and trailing commas are blanked to spaces of the same
length, newlines kept: the blanked text is plain JSON at the same offsets as the original,
so a value found in the one is edited in the other. `patch` turns a document into a new
value one edit at a time: a member taken out, a member added after the object's last one,
a value replaced (an object's members compared one by one, so a changed key deep inside
rewrites only its own value).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_SPACE = " \t\r\n"
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None}


def _after_string(text: str, index: int) -> int:
    """Where the string that starts at ``index`` (its opening quote) ends: past its
    closing quote (the text's length when it has none)."""
    index += 1
    while index < len(text) and text[index] != '"':
        index += 2 if text[index] == "\\" else 1
    return min(index + 1, len(text))


def blank_comments(text: str) -> str:
    """``text`` with each comment replaced by spaces (newlines kept); strings untouched.

    Raises:
        ValueError: a ``/*`` comment that never ends.
    """
    out = list(text)
    index, length = 0, len(text)
    while index < length:
        char = text[index]
        if char == '"':
            index = _after_string(text, index)
        elif text.startswith("//", index):
            end = text.find("\n", index)
            end = length if end < 0 else end
            out[index:end] = " " * (end - index)
            index = end
        elif text.startswith("/*", index):
            end = text.find("*/", index + 2)
            if end < 0:
                line = text.count("\n", 0, index) + 1
                raise ValueError(f"a /* comment that never ends (line {line})")
            end += 2
            out[index:end] = [c if c == "\n" else " " for c in text[index:end]]
            index = end
        else:
            index += 1
    return "".join(out)


def _blank_trailing_commas(text: str) -> str:
    """``text`` (comments blanked) with each comma before a ``}`` or ``]`` a space."""
    out = list(text)
    index, length = 0, len(text)
    while index < length:
        char = text[index]
        if char == '"':
            index = _after_string(text, index) - 1
        elif char == ",":
            after = index + 1
            while after < length and text[after] in _SPACE:
                after += 1
            if after < length and text[after] in "}]":
                out[index] = " "
        index += 1
    return "".join(out)


def plain(text: str) -> str:
    """``text`` as plain JSON at the same offsets: comments and trailing commas blanked.

    Raises:
        ValueError: a ``/*`` comment that never ends.
    """
    return _blank_trailing_commas(blank_comments(text))


def loads(text: str) -> Any:
    """The value of a JSONC text.

    Raises:
        ValueError: it is not JSON once its comments and trailing commas are left out
            (the message gives the line and column).
    """
    return json.loads(plain(text))


def has_comments(text: str) -> bool:
    return blank_comments(text) != text


@dataclass
class _Node:
    """A value of the document and where it is: ``text[start:end]``; an object's members
    by key, each with where its key starts."""

    value: Any
    start: int
    end: int
    members: dict[str, tuple[int, _Node]] = field(default_factory=dict)


class _Parser:
    """A parser of plain JSON (`plain`'s output) that keeps each value's offsets."""

    def __init__(self, text: str):
        self.text = text

    def skip(self, index: int) -> int:
        while index < len(self.text) and self.text[index] in _SPACE:
            index += 1
        return index

    def value(self, index: int) -> _Node:
        index = self.skip(index)
        char = self.text[index:index + 1]
        if char == "{":
            return self.object(index)
        if char == "[":
            items, at = [], self.skip(index + 1)
            while self.text[at:at + 1] != "]":
                item = self.value(at)
                items.append(item.value)
                at = self.skip(item.end)
                if self.text[at:at + 1] == ",":
                    at += 1
                at = self.skip(at)
            return _Node(items, index, at + 1)
        if char == '"':
            string, end = json.decoder.scanstring(self.text, index + 1)  # type: ignore[attr-defined]
            return _Node(string, index, end)
        for word, literal in _LITERALS.items():
            if self.text.startswith(word, index):
                return _Node(literal, index, index + len(word))
        number = _NUMBER.match(self.text, index)
        assert number is not None, "the text was checked by json.loads"
        return _Node(json.loads(number.group()), index, number.end())

    def object(self, index: int) -> _Node:
        node = _Node({}, index, index)
        at = self.skip(index + 1)
        while self.text[at] != "}":
            key, after = json.decoder.scanstring(self.text, at + 1)  # type: ignore[attr-defined]
            child = self.value(self.skip(after) + 1)  # past the colon
            node.members[key] = (at, child)
            node.value[key] = child.value
            at = self.skip(child.end)
            if self.text[at] == ",":
                at = self.skip(at + 1)
        node.end = at + 1
        return node


def _indent_of(text: str, offset: int) -> str:
    line_start = text.rfind("\n", 0, offset) + 1
    line = text[line_start:offset]
    return line[:len(line) - len(line.lstrip(" \t"))]


def _dumps(value: Any, indent: str) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False).replace("\n", "\n" + indent)


def _next_token(text: str, index: int) -> int:
    while index < len(text) and text[index] in _SPACE:
        index += 1
    return index


def _previous_token(text: str, index: int) -> int:
    index -= 1
    while index >= 0 and text[index] in _SPACE:
        index -= 1
    return index


def _remove(text: str, commas: str, node: _Node, key: str) -> tuple[int, int, str]:
    """The edit that takes member ``key`` out of object ``node`` (``commas``: the text with
    its comments blanked, commas kept): with its comma, and its line when it had one."""
    key_start, child = node.members[key]
    rest = text[node.start + 1:node.end - 1].replace(text[key_start:child.end], "", 1)
    if len(node.members) == 1 and not rest.strip(_SPACE + ","):
        return node.start, node.end, "{}"  # nothing else inside, not even a comment
    after = _next_token(commas, child.end)
    if commas[after] != ",":  # the last member: the comma before it goes, not a comment
        before = _previous_token(commas, key_start)
        line_start = text.rfind("\n", 0, key_start) + 1
        own_line = line_start > before and not text[line_start:key_start].strip()
        if commas[before] == ",":
            kept = text[before + 1:line_start - 1] if own_line else text[before + 1:key_start]
            return before, child.end, kept.rstrip(" \t")
        line_end = text.find("\n", child.end)
        if own_line and line_end >= 0 and not text[child.end:line_end].strip():
            return line_start, line_end + 1, ""  # the only member, beside comments
        return key_start, child.end, ""
    end = after + 1
    while end < len(text) and text[end] in " \t":
        end += 1
    line_start = text.rfind("\n", 0, key_start) + 1
    if text[end:end + 1] != "\n" or text[line_start:key_start].strip():
        return key_start, end, ""  # the member shares its line: only it goes
    next_line = text.rfind("\n", 0, _next_token(text, end)) + 1
    return line_start, next_line, ""  # its whole line goes


def _add(text: str, commas: str, node: _Node, key: str, value: Any) -> tuple[int, int, str]:
    """The edit that adds member ``key`` after the last one of object ``node``."""
    if not node.members:
        indent = _indent_of(text, node.start)
        inner = indent + "  "
        member = f"{json.dumps(key)}: {_dumps(value, inner)}"
        if text[node.start + 1:node.end - 1].strip():  # comments only: the member above
            return node.start + 1, node.start + 1, f"\n{inner}{member}"
        return node.start + 1, node.start + 1, f"\n{inner}{member}\n{indent}"
    last_start, last = list(node.members.values())[-1]
    indent = _indent_of(text, last_start)
    member = f"{json.dumps(key)}: {_dumps(value, indent)}"
    after = _next_token(commas, last.end)
    if commas[after] == ",":  # a trailing comma: the new member goes after it
        line_end = text.find("\n", after)
        if 0 <= line_end < node.end - 1 and not plain(text[after + 1:line_end]).strip():
            return line_end, line_end, f"\n{indent}{member},"
        return after + 1, after + 1, f" {member},"
    line_end = text.find("\n", last.end)
    if 0 <= line_end < node.end - 1 and not plain(text[last.end:line_end]).strip():
        # A comment may follow the last value on its line: it stays with it.
        return last.end, line_end, f",{text[last.end:line_end]}\n{indent}{member}"
    return last.end, last.end, f", {member}"


def _first_edit(text: str, commas: str, node: _Node, new: Any) -> tuple[int, int, str] | None:
    if isinstance(new, dict) and isinstance(node.value, dict):
        for key in node.members:
            if key not in new:
                return _remove(text, commas, node, key)
        for key, value in new.items():
            if key not in node.members:
                return _add(text, commas, node, key, value)
            edit = _first_edit(text, commas, node.members[key][1], value)
            if edit is not None:
                return edit
        return None
    if node.value == new and type(node.value) is type(new):
        return None
    return node.start, node.end, _dumps(new, _indent_of(text, node.start))


def patch(text: str, new: Any) -> str:
    """``text``, a JSONC document, changed to hold ``new``: what did not change keeps its
    text, comments and layout; a new member follows its object's last one, in its
    indentation.

    Raises:
        ValueError: ``text`` is not JSONC.
    """
    for _ in range(10_000):  # one edit a loop; a document has fewer changes than this
        commas = blank_comments(text)
        blanked = _blank_trailing_commas(commas)
        json.loads(blanked)  # a clear error for a malformed text
        root = _Parser(blanked).value(0)
        edit = _first_edit(text, commas, root, new)
        if edit is None:
            return text
        start, end, replacement = edit
        text = text[:start] + replacement + text[end:]
    raise AssertionError("patch did not converge")

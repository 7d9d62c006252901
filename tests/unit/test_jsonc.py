"""JSONC as OpenCode reads it (ctxclient._jsonc): comments and trailing commas read, and a
changed value written into the text with the rest of it as it was."""

from __future__ import annotations

import pytest

from ctxclient import _jsonc


def test_comments_and_trailing_commas_are_read_and_strings_are_not_comments() -> None:
    text = ('{\n  // a comment\n  "url": "https://x/y", /* block\n spans */ "q": "a\\"//b",\n'
            '  "list": [1, 2,],\n}\n')
    assert _jsonc.loads(text) == {"url": "https://x/y", "q": 'a"//b', "list": [1, 2]}
    assert len(_jsonc.plain(text)) == len(text)
    assert _jsonc.has_comments(text)
    assert not _jsonc.has_comments('{"url": "https://x"}')


def test_a_comment_that_never_ends_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"a /\* comment that never ends \(line 2\)"):
        _jsonc.loads('{\n/* open\n}')


@pytest.mark.parametrize("text", [
    '{\n  "a": 1 // note\n}\n',
    '{\n  "a": 1, // note\n}\n',
    '{"a": 1, /* c */ "b": [1, 2]}',
    '{}',
    '{\n  // only a comment\n}\n',
    '{\n  "mcp": {\n    "x": {"k": "v"}, // theirs\n  },\n  "z": null,\n}\n',
])
def test_a_member_added_then_removed_gives_back_the_same_text(text: str) -> None:
    value = _jsonc.loads(text)
    added = {**value, "mcp": {**value.get("mcp", {}), "ctxd": {"command": ["c", "mcp"]}}}
    changed = _jsonc.patch(text, added)
    assert _jsonc.loads(changed) == added
    assert _jsonc.plain(text).count("//") == _jsonc.plain(changed).count("//")
    for comment in ("// note", "/* c */", "// only a comment", "// theirs"):
        assert (comment in text) == (comment in changed)
    assert _jsonc.patch(changed, value) == text


def test_a_changed_value_keeps_the_layout_around_it() -> None:
    text = '{\n  // port\n  "url": "http://a:1", "n": 2,\n  "keep": true\n}\n'
    assert _jsonc.patch(text, {"url": "http://b:2", "n": 2, "keep": True}) == (
        '{\n  // port\n  "url": "http://b:2", "n": 2,\n  "keep": true\n}\n')
    assert _jsonc.patch(text, {"url": "http://a:1", "n": 2}) == (
        '{\n  // port\n  "url": "http://a:1", "n": 2\n}\n')

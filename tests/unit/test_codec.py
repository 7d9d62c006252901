"""The codec's lone-surrogate replacement, checked against Python's own JSON reader."""

from __future__ import annotations

import json

import pytest

from ctxd.wire import replace_lone_surrogates


@pytest.mark.parametrize(("document", "expected"), [
    (rb'"\ud83d"', "\ufffd"),                        # a high surrogate alone
    (rb'"\ude00"', "\ufffd"),                        # a low surrogate alone
    (rb'"a\ud83d\ude00b"', "a\U0001f600b"),          # a pair is kept
    (rb'"\uD83D\uDE00"', "\U0001f600"),              # in capitals too
    (rb'"\ude00\ud83d"', "\ufffd\ufffd"),            # low then high: two lone halves
    (rb'"\ud83d\ud83d\ude00"', "\ufffd\U0001f600"),  # a lone high before a pair
    (rb'"\\ud83d"', "\\ud83d"),                      # an escaped backslash, then text
    (rb'"\\\ud83d"', "\\\ufffd"),                    # an escaped backslash, then an escape
    (rb'"\ud83d\\ude00"', "\ufffd\\ude00"),          # the low half is text, not an escape
    (rb'"\u00e9\n\"\ufffd"', "\u00e9\n\"\ufffd"),    # other escapes untouched
    (rb'{"k\ud800":["\udfff",1]}', {"k\ufffd": ["\ufffd", 1]}),
])
def test_lone_surrogates_become_the_replacement_character(document: bytes,
                                                          expected: object) -> None:
    replaced = replace_lone_surrogates(document)
    assert json.loads(replaced) == expected
    json.dumps(json.loads(replaced), ensure_ascii=False).encode("utf-8")  # valid Unicode now


def test_a_document_without_lone_surrogates_is_unchanged() -> None:
    plain = b'{"a": "caf\xc3\xa9 \\\\ plain"}'
    assert replace_lone_surrogates(plain) is plain  # no escape at all: not even scanned
    escaped = rb'{"a": "\u00e9 \\ \ud83d\ude00"}'
    assert replace_lone_surrogates(escaped) == escaped

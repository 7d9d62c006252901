"""The transcript parsers on small made-up inputs, one rule each, with the exact entries
they yield (docs/protocol.md, "transcript.import")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ctxd.transcripts import (
    NOT_AN_EXPORT,
    ArraySplitter,
    ClaudeCodeParser,
    Entry,
    LineSplitter,
    Piece,
    Usage,
    locate_messages,
    parse_message,
)
from ctxd.transcripts._claude_code import TOOL_USE_RESULT_MAX
from ctxd.wire.types import MessageIn


def jsonl(*records: Any) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n"
                    for r in records)


def feed(*records: Any) -> list[Entry]:
    data = jsonl(*records)
    entries, used = ClaudeCodeParser().feed(data, 0, 1)
    assert used == len(data)
    return entries


def ends(*records: Any) -> list[int]:
    """The byte offset after each record's line."""
    total, found = 0, []
    for record in records:
        total += len(jsonl(record))
        found.append(total)
    return found


def src(kind: str, line: int, uuid: str, parent: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"format": "claude-code", "type": kind, "line": line, "uuid": uuid}
    if parent is not None:
        found["parent_uuid"] = parent
    return found


USAGE = {"input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": 5,
         "cache_creation_input_tokens": 6}


def user(uuid: str, parent: str | None, content: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "user", "uuid": uuid, "parentUuid": parent,
            "message": {"role": "user", "content": content}, **extra}


def assistant(uuid: str, parent: str | None, message_id: str, *blocks: dict[str, Any],
              **extra: Any) -> dict[str, Any]:
    return {"type": "assistant", "uuid": uuid, "parentUuid": parent,
            "message": {"id": message_id, "model": "claude-x", "content": list(blocks),
                        "usage": USAGE}, **extra}


# ---- Claude Code -----------------------------------------------------------------------

def test_parent_uuid_and_usage_once_per_message_id() -> None:
    records = [user("u1", None, "hi"),
               assistant("a1", "u1", "msg_1", {"type": "thinking", "thinking": "hm"}),
               assistant("a2", "a1", "msg_1", {"type": "text", "text": "hello"})]
    e1, e2, e3 = ends(*records)
    assert feed(*records) == [
        Entry(line=1, end=e1, kind="message", messages=[
            MessageIn(role="user", content="hi", meta={"source": src("user", 1, "u1")})]),
        Entry(line=2, end=e2, kind="message",
              usage=Usage(key="msg_1", model="claude-x", input_tokens=3, output_tokens=4,
                          cache_read_tokens=5, cache_write_tokens=6),
              info={"dropped_blocks": ["thinking"]}),
        Entry(line=3, end=e3, kind="message", messages=[
            MessageIn(role="assistant", content=[{"type": "text", "text": "hello"}],
                      meta={"source": src("assistant", 3, "a2", "a1"),
                            "message_id": "msg_1", "model": "claude-x"})]),
    ]


def test_is_sidechain_chains_follow_parent_uuid() -> None:
    entries = feed(user("s1", None, "go", isSidechain=True),
                   assistant("s2", "s1", "m1", {"type": "text", "text": "ok"},
                             isSidechain=True),
                   user("t1", None, "other", isSidechain=True, agentId="agent-7"),
                   assistant("t2", "t1", "m2", {"type": "text", "text": "k"}, isSidechain=True),
                   user("u1", None, "main"))
    assert [e.thread for e in entries] == ["s1", "s1", "agent-7", "agent-7", None]


def test_compact_boundary_then_compact_summary() -> None:
    boundary = {"type": "system", "subtype": "compact_boundary", "uuid": "b1",
                "logicalParentUuid": "a9", "parentUuid": None,
                "compactMetadata": {"trigger": "auto", "preTokens": 155000}}
    summary = user("c1", "b1", "This session is being continued …", isCompactSummary=True,
                   isMeta=True)
    e1, e2 = ends(boundary, summary)
    meta_boundary = {"uuid": "b1", "logical_parent_uuid": "a9", "trigger": "auto",
                     "preTokens": 155000}
    assert feed(boundary, summary) == [
        Entry(line=1, end=e1, kind="message", info={"compact_boundary": meta_boundary}),
        Entry(line=2, end=e2, kind="message", messages=[MessageIn(
            role="user", content="This session is being continued …",
            meta={"source": src("user", 2, "c1", "b1"), "compact_summary": True,
                  "compact_boundary": meta_boundary, "is_meta": True})]),
    ]


def test_tool_use_result_small_kept_large_as_its_size() -> None:
    call = assistant("a1", None, "m1", {"type": "tool_use", "id": "tu1", "name": "Bash",
                                        "input": {"command": "ls"}})
    small = user("r1", "a1", [{"type": "tool_result", "tool_use_id": "tu1",
                               "content": [{"type": "text", "text": "a.txt"}]}],
                 toolUseResult={"stdout": "a.txt"})
    big = {"stdout": "x" * TOOL_USE_RESULT_MAX}
    large = user("r2", "a1", [{"type": "tool_result", "tool_use_id": "tu2", "is_error": True,
                               "content": "boom"}, {"type": "text", "text": "note"},
                              {"type": "image"}], toolUseResult=big)
    _, tool, other = feed(call, small, large)
    assert tool.messages == [MessageIn(role="tool", content="a.txt", tool_call_id="tu1",
                                       name="Bash", meta={"source": src("user", 2, "r1", "a1"),
                                                          "tool_use_result": {"stdout": "a.txt"}})]
    size = len(json.dumps(big).encode())
    assert other.messages == [
        MessageIn(role="tool", content="boom", tool_call_id="tu2", name="tool",
                  meta={"source": src("user", 3, "r2", "a1"), "is_error": True,
                        "tool_use_result": {"omitted_bytes": size}}),
        MessageIn(role="user", content="note\n[image]",
                  meta={"source": src("user", 3, "r2", "a1")})]


def test_malformed_line_numbers_and_the_rest_parsed() -> None:
    good = user("u1", None, "hi")
    data = jsonl(b"{nope", good, b"[1, 2]", {"type": "assistant", "uuid": "a"}, b"", good)
    entries, used = ClaudeCodeParser().feed(data, 100, 10)
    assert used == len(data)
    assert [(e.line, e.kind, e.error) for e in entries] == [
        (10, "malformed", entries[0].error), (11, "message", None),
        (12, "malformed", "a record must be a JSON object"),
        (13, "malformed", "an assistant record needs a `message` object"),
        (15, "message", None)]  # line 14 is blank: no entry, still counted
    assert str(entries[0].error).startswith("not JSON: ")
    assert entries[-1].end == 100 + len(data)


def test_partial_last_line_left_for_later() -> None:
    whole = jsonl(user("u1", None, "hi"))
    parser = ClaudeCodeParser()
    entries, used = parser.feed(whole + b'{"type": "user", "uu', 0, 1)
    assert (len(entries), used) == (1, len(whole))
    entries, used = parser.feed(b'{"type": "user", "uu', len(whole), 2)
    assert (entries, used) == ([], 0)


def test_a_lone_surrogate_is_read_as_u_fffd_and_deep_nesting_is_malformed() -> None:
    """Half an emoji (``\\ud83d`` alone, as JavaScript writes it) would make a text that
    cannot be stored: it is read as U+FFFD; a line nested 100,000 deep is a malformed line,
    and the line after each is read as usual."""
    deep = b'{"type": "user", "message": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    entries = feed(user("u1", None, "cut \ud83d here"), deep, user("u2", None, "next"))
    assert [(e.line, e.kind, e.error, [m.content for m in e.messages]) for e in entries] == [
        (1, "message", None, ["cut \ufffd here"]),
        (2, "malformed", "not JSON: nested too deep to read", []),
        (3, "message", None, ["next"])]


def chunked(splitter: LineSplitter | ArraySplitter, data: bytes, size: int) -> list[Piece]:
    pieces = []
    for start in range(0, len(data), size):
        pieces += splitter.feed(data[start:start + size])
    return pieces


@pytest.mark.parametrize("size", [1, 2, 3, 5, 64, 1 << 20])
def test_line_splitter_keeps_a_line_up_to_the_limit_and_counts_a_longer_one(size: int) -> None:
    """Whatever the chunks, the same pieces: a line over the limit as its size only, a
    blank line counted but not yielded, the unterminated last line pending."""
    data = b'{"a": 1}\n' + b"x" * 11 + b"\n\n" + b"y" * 10 + b"\nzz"
    splitter = LineSplitter(100, 7, 10)
    assert chunked(splitter, data, size) == [
        Piece(7, 109, b'{"a": 1}', 8), Piece(8, 121, None, 11),
        Piece(10, 133, b"y" * 10, 10)]
    assert (splitter.offset, splitter.line, splitter.pending_bytes) == (133, 11, 2)


def test_line_splitter_resumes_a_line_already_over_the_limit() -> None:
    """An unterminated line an earlier import read past the limit is read on from where it
    stopped: its size counts what was seen, its bytes are not read again."""
    splitter = LineSplitter(50, 4, 10, seen=25)
    assert splitter.feed(b"abc\n" + b"ok\n") == [Piece(4, 79, None, 28), Piece(5, 82, b"ok", 2)]


ARRAY = (b' \n[ {"a": "x\\\\"}, {"b": "]\\"[,}{"} ,\n"s" , 1 ,[[], {}], {"c": [1, {"d": 2}]}'
         b' ]  \n')


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 1 << 20])
def test_array_splitter_cuts_the_elements_json_reads(size: int) -> None:
    """Strings holding brackets, commas, quotes and backslashes, nested arrays and objects,
    any chunking: each piece decodes to the element json.loads finds at its index."""
    splitter = ArraySplitter(1 << 20)
    pieces = chunked(splitter, ARRAY, size)
    assert [json.loads(piece.data or b"") for piece in pieces] == json.loads(ARRAY)
    assert [(piece.line, ARRAY[piece.end:piece.end + 1]) for piece in pieces] == [
        (1, b","), (2, b","), (3, b","), (4, b","), (5, b","), (6, b"]")]
    assert (splitter.count, splitter.closed) == (6, True)


@pytest.mark.parametrize("size", [1, 4, 1 << 20])
def test_array_splitter_long_empty_and_unfinished_elements(size: int) -> None:
    """An element over the limit is its size only; an empty one (``,,``) is yielded empty;
    after the last comma of an unclosed array (a file being written) nothing is yielded."""
    data = b'[1,"' + b"x" * 20 + b'",,{"t": 2},{"t": 3'
    splitter = ArraySplitter(10)
    assert chunked(splitter, data, size) == [
        Piece(1, 2, b"1", 1), Piece(2, 25, None, 22), Piece(3, 26, b"", 0),
        Piece(4, 35, b'{"t": 2}', 8)]
    assert (splitter.count, splitter.closed) == (4, False)
    assert ArraySplitter(10).feed(b"[ ]") == []
    assert ArraySplitter(10).feed(b"[1, ]") == [Piece(1, 2, b"1", 1)]
    deep = b"[" + b"[" * 100_000 + b"]" * 100_000 + b",[[1]]]]"
    splitter = ArraySplitter(10)
    assert chunked(splitter, deep, size) == [Piece(1, 200_001, None, 200_000),
                                             Piece(2, 200_007, b"[[1]]", 5)]
    assert (splitter.count, splitter.closed) == (2, True)


def test_parse_piece_reports_a_record_over_the_limit_with_its_size() -> None:
    parser = ClaudeCodeParser()
    assert parser.parse_piece(Piece(3, 900, None, 123_456), 65_536) == Entry(
        line=3, end=900, kind="malformed",
        error="a record of 123,456 bytes, over the 65,536 a record may have "
              "(max_request_bytes): skipped")
    assert parser.parse_piece(Piece(4, 901, b" ", 1), 65_536, end=4) == Entry(
        line=4, end=4, kind="malformed", error="an empty element")


def test_unknown_types_are_kept_by_name() -> None:
    entries = feed({"type": "file-history-snapshot", "messageId": "x"},
                   {"type": "system", "subtype": "stop_hook_summary"},
                   {"type": "summary", "summary": "t"}, {"no": "type"})
    assert [(e.kind, e.unknown_type) for e in entries] == [
        ("unknown", "file-history-snapshot"), ("unknown", "system:stop_hook_summary"),
        ("unknown", "summary"), ("unknown", "(no type)")]


# ---- OpenCode --------------------------------------------------------------------------

def export(*messages: dict[str, Any]) -> bytes:
    return json.dumps({"info": {"id": "ses_x"}, "messages": list(messages)}).encode()


def parse_opencode(data: bytes, skip: int = 0) -> tuple[dict[str, Any], list[Entry], int]:
    """An export held in memory read as the importer reads a file: its info, the entries
    of its messages after the first ``skip``, and its number of messages."""
    if data.lstrip()[:1] != b"{":
        raise ValueError(NOT_AN_EXPORT)
    info, start = locate_messages(ArraySplitter(len(data)).feed(data),
                                  lambda offset, length: data[offset:offset + length])
    splitter = ArraySplitter(len(data))
    entries = [parse_message(piece, len(data)) for piece in splitter.feed(data[start:])
               if piece.line > skip]
    return info, entries, splitter.count


def osrc(message_id: str, index: int) -> dict[str, Any]:
    return {"format": "opencode", "id": message_id, "index": index}


PARTS: list[dict[str, Any]] = [
    {"type": "step-start", "snapshot": "s0"},
    {"type": "reasoning", "text": "think"},
    {"type": "file", "mime": "text/plain", "filename": "a.py", "url": "file:///a.py"},
    {"type": "agent", "name": "build"},
    {"type": "subtask", "prompt": "p", "description": "d", "agent": "x"},
    {"type": "compaction", "auto": True},
    {"type": "retry", "attempt": 2, "error": {"message": "503"}},
    {"type": "patch", "hash": "h", "files": ["a.py"]},
    {"type": "snapshot", "snapshot": "s1"},
    {"type": "step-finish", "reason": "stop", "cost": 0.5, "tokens": {"input": 1}},
]


def test_opencode_every_kept_part_type_and_usage() -> None:
    tokens = {"input": 10, "output": 2, "reasoning": 1, "cache": {"read": 4, "write": 3}}
    info, entries, total = parse_opencode(export(
        {"info": {"id": "m1", "role": "assistant", "modelID": "gpt-x", "tokens": tokens},
         "parts": [{"type": "text", "text": "hello"}, *PARTS, {"type": "laser", "x": 1}]}))
    assert (info, total) == ({"id": "ses_x"}, 1)
    assert entries == [Entry(
        line=1, end=1, kind="message",
        usage=Usage(key="m1", model="gpt-x", input_tokens=10, output_tokens=2,
                    cache_read_tokens=4, cache_write_tokens=3, thinking_tokens=1),
        info={"unknown_parts": ["laser"]},
        messages=[MessageIn(role="assistant", content=[{"type": "text", "text": "hello"}],
                            meta={"source": osrc("m1", 1), "modelID": "gpt-x",
                                  "parts": [*PARTS, {"type": "laser", "unknown": True}]})])]


def test_opencode_tool_parts_completed_error_and_compacted() -> None:
    parts = [{"type": "tool", "callID": "c1", "tool": "read",
              "state": {"status": "completed", "input": {"p": 1}, "output": "body",
                        "title": "a.py", "time": {"start": 1, "end": 2, "compacted": 9}}},
             {"type": "tool", "callID": "c2", "tool": "bash",
              "state": {"status": "error", "input": {}, "error": "exit 1",
                        "time": {"start": 2, "end": 3}}}]
    _, [entry], _ = parse_opencode(export({"info": {"id": "m1", "role": "assistant"},
                                           "parts": parts}))
    source = osrc("m1", 1)
    assert entry.messages == [
        MessageIn(role="assistant", content=[{"type": "tool_use", "id": "c1", "name": "read",
                                              "input": {"p": 1}}], meta={"source": source}),
        MessageIn(role="tool", content="body", tool_call_id="c1", name="read",
                  meta={"source": source, "status": "completed", "compacted": 9,
                        "title": "a.py"}),
        MessageIn(role="assistant", content=[{"type": "tool_use", "id": "c2", "name": "bash",
                                              "input": {}}], meta={"source": source}),
        MessageIn(role="tool", content="exit 1", tool_call_id="c2", name="bash",
                  meta={"source": source, "status": "error", "is_error": True}),
    ]
    assert entry.usage is None  # no tokens in its info


def test_opencode_calls_of_ctxds_tools_without_the_session_the_plugin_named() -> None:
    """ctxd's OpenCode plugin names the conversation's session in a ctxd tool call's
    ``_meta``, and OpenCode stores it with the call: the import keeps the call as the model
    made it (other ``_meta`` keys stay)."""
    route = {"ctxd/session_id": "ses_x", "ctxd/project": "/p"}
    inputs = [{"ref_id": "res_1", "_meta": route},
              {"query": "q", "_meta": {**route, "progressToken": 3}},
              {"query": "q", "_meta": {"other": 1}}, {"_meta": "not an object"}, ["a list"]]
    parts = [{"type": "tool", "callID": f"c{i}", "tool": "ctxd_read_result",
              "state": {"status": "completed", "input": tool_input, "output": "{}"}}
             for i, tool_input in enumerate(inputs)]
    _, [entry], _ = parse_opencode(export({"info": {"id": "m1", "role": "assistant"},
                                           "parts": parts}))
    assert [m.content[0]["input"] for m in entry.messages if m.role == "assistant"] == [
        {"ref_id": "res_1"}, {"query": "q", "_meta": {"progressToken": 3}},
        {"query": "q", "_meta": {"other": 1}}, {"_meta": "not an object"}, ["a list"]]


def test_opencode_summary_skip_unknown_role_and_malformed() -> None:
    data = export({"info": {"id": "u1", "role": "user"}, "parts": [{"type": "text",
                                                                     "text": "hi"}]},
                  {"info": {"id": "a1", "role": "assistant", "summary": True},
                   "parts": [{"type": "text", "text": "the summary"}]},
                  {"info": {"id": "x", "role": "system"}, "parts": []},
                  "not a message")
    _, entries, total = parse_opencode(data, skip=1)
    assert total == 4
    assert entries == [
        Entry(line=2, end=2, kind="message", messages=[MessageIn(
            role="assistant", content=[{"type": "text", "text": "the summary"}],
            meta={"source": osrc("a1", 2), "summary": True})]),
        Entry(line=3, end=3, kind="unknown", unknown_type="role:system"),
        Entry(line=4, end=4, kind="malformed",
              error="a message must be an object with an `info` object")]


def test_opencode_compaction_part_keeps_its_tail_start_id() -> None:
    # OpenCode 1.18's compaction request: the fork pipeline finds the tail it kept by
    # `tail_start_id`, an OpenCode message id (each message's meta.source.id).
    part = {"id": "prt_1", "sessionID": "ses_x", "messageID": "u2", "type": "compaction",
            "auto": True, "overflow": False, "tail_start_id": "a1"}
    _, entries, _ = parse_opencode(export(
        {"info": {"id": "a1", "role": "assistant"}, "parts": [{"type": "text", "text": "ok"}]},
        {"info": {"id": "u2", "role": "user"}, "parts": [part]}))
    assert [entry.messages for entry in entries] == [
        [MessageIn(role="assistant", content=[{"type": "text", "text": "ok"}],
                   meta={"source": osrc("a1", 1)})],
        [MessageIn(role="user", content="", meta={"source": osrc("u2", 2), "parts": [
            {"type": "compaction", "auto": True, "overflow": False,
             "tail_start_id": "a1"}]})]]


@pytest.mark.parametrize("data", [b"{", b"[]", b'{"info": {}}', b'{"messages": {}}',
                                  b'{"messages": 1, "info": []}'])
def test_opencode_not_an_export(data: bytes) -> None:
    with pytest.raises(ValueError, match=r"^an OpenCode export is an object \{info, "):
        parse_opencode(data)


def test_opencode_messages_are_read_one_by_one() -> None:
    """Each message decoded by itself: one nested 100,000 deep, one not JSON, one over the
    limit are malformed at their index; a lone surrogate is U+FFFD; the info is found
    whatever the members' order."""
    good = {"info": {"id": "u1", "role": "user"}, "parts": [{"type": "text",
                                                             "text": "cut \ud83d"}]}
    deep = b"[" * 100_000 + b"]" * 100_000
    data = (b'{"messages": [' + deep + b", {oops}, " + json.dumps(good).encode()
            + b', "' + b"x" * 100 + b'"], "info": {"id": "ses_x"}}')
    info, entries, total = parse_opencode(data)
    assert (info, total) == ({"id": "ses_x"}, 4)
    assert [(e.line, e.kind, e.error) for e in entries[:2]] == [
        (1, "malformed", "not JSON: nested too deep to read"),
        (2, "malformed", entries[1].error)]
    assert str(entries[1].error).startswith("not JSON: ")
    assert entries[2].messages[0].content == [{"type": "text", "text": "cut \ufffd"}]
    assert parse_message(Piece(4, 99, None, 102), 64) == Entry(
        line=4, end=4, kind="malformed",
        error="a record of 102 bytes, over the 64 a record may have (max_request_bytes): "
              "skipped")

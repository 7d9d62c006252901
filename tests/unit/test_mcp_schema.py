"""The MCP tools' JSON Schemas against the msgspec types they are made from
(docs/protocol.md, "MCP"): valid Draft 2020-12, self-contained, and they accept and refuse
what the daemon's decoders accept and refuse."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import msgspec
import pytest

from ctxd.mcp import TOOLS, plain_schema
from ctxd.wire.types import MemoryRecordArgs, ReadResultArgs

BY_NAME = {tool.name: tool for tool in TOOLS}

CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("context_branch", {"description": "d", "prompt": "p", "budget": 100}, True),
    ("context_branch", {"description": "d", "prompt": "p", "budget": 0}, False),
    ("context_branch", {"description": "", "prompt": "p"}, False),
    ("context_branch", {"prompt": "p"}, False),
    ("context_return", {"message": "m", "branch_id": "br_0123456789ab"}, True),
    ("context_return", {"message": "m", "branch_id": "br_0123456789AB"}, False),
    ("context_return", {"message": "m", "branch": "br_0123456789ab"}, False),
    ("context_branch_status", {}, True),
    ("context_list_branches", {"status": "completed"}, True),
    ("context_list_branches", {"status": "done"}, False),
    ("context_rollback", {"branch_id": "br_0123456789ab"}, True),
    ("context_rollback", {"branch_id": "br_0123456789ab", "restore_state": False}, False),
    ("read_result", {"ref_id": "res_0123456789abcdef", "limit": 10}, True),
    ("read_result", {"ref_id": "res_0123456789abcdef", "limit": 0}, False),
    ("read_result", {"ref_id": "res_0123"}, False),
    ("memory_search", {"query": "q", "scope": "project:demo", "k": 3}, True),
    ("memory_search", {"query": "q", "scope": "project:"}, False),
    ("memory_search", {"query": "q", "mode": "fuzzy"}, False),
    ("memory_record", {"title": "t", "content": "c", "tags": ["a-b"]}, True),
    ("memory_record", {"title": "t", "content": "c", "tags": ["a b"]}, False),
    ("compact_context", {"strategies": ["clear", "truncate"]}, True),
    ("compact_context", {"strategies": []}, False),
    ("tool_search", {"query": "q", "limit": 50, "project_path": "/p"}, True),
    ("tool_search", {"query": "q", "limit": 51}, False),
    ("context_fork", {}, True),
    ("context_fork", {"session_id": "sub-1", "include_context": True}, True),
    ("context_fork", {"session_id": "-sub"}, False),
    ("context_fork", {"include_context": "yes"}, False),
    ("context_fork", {"char_budget": 1_000}, False),
    ("context_fork", {"branch_id": "main"}, False),
]


@pytest.mark.parametrize("tool", TOOLS, ids=lambda tool: tool.name)
def test_every_schema_is_plain_draft_2020_12(tool: Any) -> None:
    for schema in (plain_schema(tool.arguments), plain_schema(tool.result)):
        jsonschema.Draft202012Validator.check_schema(schema)
        text = json.dumps(schema)
        assert "$ref" not in text
        assert "\\\\Z" not in text


@pytest.mark.parametrize(("name", "arguments", "valid"), CASES)
def test_the_schema_and_the_decoder_agree(name: str, arguments: dict[str, Any],
                                          valid: bool) -> None:
    tool = BY_NAME[name]
    validator = jsonschema.Draft202012Validator(plain_schema(tool.arguments))
    try:
        tool.decode(msgspec.json.encode(arguments))
        decoded = True
    except msgspec.ValidationError:
        decoded = False
    assert (validator.is_valid(arguments), decoded) == (valid, valid)


def test_patterns_are_anchored_with_a_dollar() -> None:
    read = plain_schema(ReadResultArgs)["properties"]["ref_id"]
    record = plain_schema(MemoryRecordArgs)["properties"]["tags"]["items"]
    assert read["pattern"] == "^res_[0-9a-f]{16}$"
    assert record["pattern"] == "^\\S{1,64}$"

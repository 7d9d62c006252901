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
from ctxd.wire.types import (
    BranchCreateParams,
    BranchListParams,
    BranchReturnParams,
    BranchRollbackParams,
    ContextCompactParams,
    ForkFrom,
    MemoryRecordParams,
    MemorySearchParams,
    ResultReadParams,
    ToolsSearchParams,
)

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
    read = plain_schema(BY_NAME["read_result"].arguments)["properties"]["ref_id"]
    record = plain_schema(BY_NAME["memory_record"].arguments)["properties"]["tags"]["items"]
    assert read["pattern"] == "^res_[0-9a-f]{16}$"
    assert record["pattern"] == "^\\S{1,64}$"


NATIVE: dict[str, type[msgspec.Struct]] = {
    "context_branch": BranchCreateParams, "context_return": BranchReturnParams,
    "context_list_branches": BranchListParams, "context_rollback": BranchRollbackParams,
    "read_result": ResultReadParams, "memory_search": MemorySearchParams,
    "memory_record": MemoryRecordParams, "compact_context": ContextCompactParams,
    "tool_search": ToolsSearchParams, "context_fork": ForkFrom}
"""The params of the native method each tool calls (ForkFrom: session.open's fork_from)."""


def _limits(field: msgspec.inspect.Field) -> msgspec.inspect.Type:
    """A field's type and constraints, without the None of an optional field (msgspec
    leaves out UNSET itself)."""
    found = field.type
    if isinstance(found, msgspec.inspect.UnionType):
        [found] = [t for t in found.types if not isinstance(t, msgspec.inspect.NoneType)]
    return found


@pytest.mark.parametrize(("name", "native"), NATIVE.items())
def test_a_tool_takes_the_limits_of_the_method_it_calls(
        name: str, native: type[msgspec.Struct]) -> None:
    """An argument a tool passes on accepts what the native method accepts, neither more
    (the method would refuse it) nor less."""
    def fields(struct: type[msgspec.Struct]) -> dict[str, msgspec.inspect.Type]:
        info = msgspec.inspect.type_info(struct)
        assert isinstance(info, msgspec.inspect.StructType)
        return {f.name: _limits(f) for f in info.fields}

    tool, method = fields(BY_NAME[name].arguments), fields(native)
    shared = sorted(tool.keys() & method.keys())
    assert shared  # the tool passes something on
    assert {key: tool[key] for key in shared} == {key: method[key] for key in shared}


def test_every_tool_is_checked_against_its_method_but_the_status_tool() -> None:
    assert sorted(BY_NAME.keys() - NATIVE.keys()) == ["context_branch_status"]

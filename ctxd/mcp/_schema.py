"""Plain JSON Schema for MCP tools, generated from the msgspec types (docs/protocol.md,
"MCP"): one self-contained object schema per type, no ``$ref``, ECMAScript regexes."""

from __future__ import annotations

from typing import Any

import msgspec

_REF = "#/$defs/"


def plain_schema(struct: type[msgspec.Struct]) -> dict[str, Any]:
    """The JSON Schema (Draft 2020-12) of ``struct``, as an MCP client wants it.

    Every ``$ref`` is inlined (some clients resolve no references; the types hold no
    recursion), and patterns use ``$`` where the types use Python's ``\\Z``: without the
    ``m`` flag an ECMAScript ``$`` matches only at the end, as ``\\Z`` does in Python.
    """
    generated = msgspec.json.schema(struct)
    definitions: dict[str, Any] = generated.get("$defs", {})
    return dict(_plain(generated, definitions))


def _plain(node: Any, definitions: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_plain(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(_REF):
        return _plain(definitions[ref[len(_REF):]], definitions)
    plain: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$defs":
            continue
        if key == "pattern" and isinstance(value, str):
            plain[key] = _ecmascript(value)
        elif key in ("properties", "$defs"):
            plain[key] = {name: _plain(sub, definitions) for name, sub in value.items()}
        else:
            plain[key] = _plain(value, definitions)
    return plain


def _ecmascript(pattern: str) -> str:
    """A Python pattern of the types' kind (anchored with ``^`` … ``\\Z``) in ECMAScript."""
    if pattern.endswith("\\Z") and not pattern.endswith("\\\\Z"):
        pattern = pattern[:-2] + "$"
    if "\\Z" in pattern or "\\A" in pattern or "(?P" in pattern:
        raise ValueError(f"pattern {pattern!r} has Python-only syntax")
    return pattern


def input_schema(struct: type[msgspec.Struct]) -> dict[str, Any]:
    """A tool's input schema as a model is sent it in every request: `plain_schema`
    without the type's title, and an optional argument that may be null shown as its
    value's schema alone (leaving it out means the same). The arguments are still checked
    against the type itself, so nothing the type refuses is accepted."""
    schema = plain_schema(struct)
    schema.pop("title", None)
    properties: dict[str, Any] = schema.get("properties", {})
    for name, prop in properties.items():
        options = prop.get("anyOf")
        if (prop.get("default", ...) is None and isinstance(options, list)
                and len(options) == 2 and {"type": "null"} in options):
            [value] = [option for option in options if option != {"type": "null"}]
            properties[name] = value
    return schema

"""The tokens ctxd's MCP tool definitions cost in every model request (docs/performance.md,
"MCP tool definitions"): each tool as Claude Code sends it to the model (``name`` as
``mcp__ctxd__<tool>``, ``description``, ``input_schema``: the tools/list answer's
``inputSchema``), its compact JSON counted by ctxd's token counter (cl100k_base, as the
gateway counts a request's ``tool_descriptions``). Both daemons answer tools/list over the
socket: one of a baseline revision (``--baseline``, default ``main``; before the lean set,
every tool was offered) and one of this tree, once with its default set and once with
``tools: "all"``.

Run: ``python bench/mcp_tools.py [--baseline REV]`` (a few seconds). It prints a table:
per tool, then the totals.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any

from _common import Connection, start_daemons

from ctxd.tokens import TokenCounter


def listed(connection: Connection, tools: str | None) -> list[dict[str, Any]]:
    """tools/list on a fresh MCP connection (bound with ``tools`` when given)."""
    if tools is not None:
        connection.call("mcp.bind", {"tools": tools})
    connection.call("initialize", {"protocolVersion": "2025-06-18"})
    answer = connection.call("tools/list", {})
    result: list[dict[str, Any]] = answer["tools"]  # type: ignore[assignment]
    return result


def cost(counter: TokenCounter, tool: dict[str, Any]) -> int:
    """One definition as the model receives it."""
    return counter.count(json.dumps({"name": "mcp__ctxd__" + tool["name"],
                                     "description": tool["description"],
                                     "input_schema": tool["inputSchema"]},
                                    separators=(",", ":"), ensure_ascii=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="main", help="revision to compare with")
    args = parser.parse_args()
    counter = TokenCounter()
    with contextlib.ExitStack() as stack:
        daemons = start_daemons(stack, args.baseline, {})
        columns: dict[str, dict[str, int]] = {}
        for label, tools in ((args.baseline, None), ("this tree, default", None),
                             ("this tree, all", "all")):
            daemon = daemons[args.baseline if label == args.baseline else "this tree"]
            connection = Connection(daemon.socket)
            try:
                columns[label] = {tool["name"]: cost(counter, tool)
                                  for tool in listed(connection, tools)}
            finally:
                connection.close()
    names = list(columns["this tree, all"])
    width = max(len(name) for name in names) + 2
    print(f"{'tool':<{width}}" + "".join(f"{label:>22}" for label in columns))
    for name in names:
        print(f"{name:<{width}}" + "".join(
            f"{columns[label].get(name, ''):>22}" for label in columns))
    print(f"{'total':<{width}}" + "".join(
        f"{sum(column.values()):>22}" for column in columns.values()))
    print(f"{'tools offered':<{width}}" + "".join(
        f"{len(column):>22}" for column in columns.values()))


if __name__ == "__main__":
    main()

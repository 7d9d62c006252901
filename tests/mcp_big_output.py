"""A stdio MCP server (the ``mcp`` SDK's MCPServer, formerly FastMCP) whose one tool,
``inventory``, returns `INVENTORY`: about 20 KB of text, for the agents' end-to-end tests
of offloading."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

INVENTORY = "".join(f"item {i:04d}: crate of spare parts, shelf {i % 40:02d}, checked\n"
                    for i in range(400))
"""The tool's whole answer: one text block."""

server = MCPServer("warehouse")


@server.tool(structured_output=False)
def inventory() -> str:
    """The warehouse's full inventory, one item a line."""
    return INVENTORY


if __name__ == "__main__":
    server.run("stdio")

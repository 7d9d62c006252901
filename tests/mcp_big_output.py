"""A stdio MCP server (the ``mcp`` SDK's MCPServer, formerly FastMCP) whose one tool,
``inventory``, returns `INVENTORY`: about 20 KB of text, for the agents' end-to-end tests
of offloading."""

from __future__ import annotations

INVENTORY = "".join(f"item {i:04d}: crate of spare parts, shelf {i % 40:02d}, checked\n"
                    for i in range(400))
"""The tool's whole answer: one text block."""


def serve() -> None:
    """Serve the one tool on stdio. The SDK is imported here, not at the top: the tests
    that import `INVENTORY` would otherwise pay half a second of CPU in each pytest-xdist
    worker that collects them."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("warehouse")

    @server.tool(structured_output=False)
    def inventory() -> str:
        """The warehouse's full inventory, one item a line."""
        return INVENTORY

    server.run("stdio")


if __name__ == "__main__":
    serve()

"""MCP over the daemon's socket (docs/protocol.md, "MCP"): the protocol's methods and the
tools, which call the native methods through the dispatcher."""

from ctxd.mcp._methods import (
    PROTOCOL_VERSION,
    PROTOCOL_VERSIONS,
    bind,
    cancelled,
    initialize,
    initialized,
    ping,
    tools_call,
    tools_list,
)
from ctxd.mcp._schema import plain_schema
from ctxd.mcp._tools import TOOLS, McpConnection
from ctxd.mcp._types import (
    McpBindParams,
    McpCancelledParams,
    McpInitializeParams,
    McpParams,
    McpToolCallParams,
    McpToolsListParams,
)

__all__ = [
    "PROTOCOL_VERSION",
    "PROTOCOL_VERSIONS",
    "TOOLS",
    "McpBindParams",
    "McpCancelledParams",
    "McpConnection",
    "McpInitializeParams",
    "McpParams",
    "McpToolCallParams",
    "McpToolsListParams",
    "bind",
    "cancelled",
    "initialize",
    "initialized",
    "ping",
    "plain_schema",
    "tools_call",
    "tools_list",
]

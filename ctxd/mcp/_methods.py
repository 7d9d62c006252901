"""MCP's methods (docs/protocol.md, "MCP"): initialize, ping, tools/list, tools/call, the
notifications, and the native ``mcp.bind``; each runs on the connection it came on
(`Call`), whose MCP state is `McpConnection`."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import msgspec

from ctxd import __version__
from ctxd.errors import CtxdError, ErrorCode, invalid_state
from ctxd.jobs import current_request
from ctxd.mcp._schema import input_schema, plain_schema
from ctxd.mcp._tools import (
    TOOLS,
    TOOLS_BY_NAME,
    McpConnection,
    ToolContext,
    context_health,
    error_text,
)
from ctxd.mcp._types import (
    DEFAULT_TOOLS,
    CallRoute,
    ContextHealth,
    McpBindParams,
    McpBindResult,
    McpCancelledParams,
    McpInitializeParams,
    McpParams,
    McpToolCallParams,
    McpToolsListParams,
)
from ctxd.wire import NO_REPLY, Call, Peer, encode

log = logging.getLogger("ctxd.mcp")

PROTOCOL_VERSION = "2025-06-18"
PROTOCOL_VERSIONS = ("2025-06-18", "2025-11-25")
"""The revisions served: a client asking for one of them gets it, any other client gets
``PROTOCOL_VERSION`` (and may hang up, as the specification says)."""

INSTRUCTIONS = (
    "ctxd manages this session's context. Branch before work that would fill the context "
    "(context_branch, then context_return with a summary); read offloaded tool outputs with "
    "read_result; look lessons up with memory_search{record}. Every result carries "
    "context_state: compact or fold when its health is not ok.")
"""What initialize says; ``{record}`` names memory_record when the connection offers it."""


def connection_of(peer: Peer) -> McpConnection:
    """The connection's MCP state, made on first use."""
    state = peer.extension
    if state is None:
        state = peer.extension = McpConnection()
    if not isinstance(state, McpConnection):
        raise invalid_state("this connection speaks another protocol",
                            "open a new connection for MCP")
    return state


def _output_schema(result: type[msgspec.Struct]) -> dict[str, Any]:
    """A tool's result type, and the `ContextHealth` any result may carry."""
    schema = plain_schema(result)
    schema["properties"]["context_health"] = plain_schema(ContextHealth)
    return schema


def _tool_listing(names: tuple[str, ...]) -> dict[str, Any]:
    return {"tools": [{
        "name": tool.name, "title": tool.title, "description": tool.description,
        "inputSchema": input_schema(tool.arguments),
        "outputSchema": _output_schema(tool.result),
        "annotations": {"title": tool.title, "readOnlyHint": tool.read_only,
                        "destructiveHint": tool.name == "context_rollback",
                        "openWorldHint": False},
    } for tool in TOOLS if tool.name in names]}


def _invalid_arguments(exc: msgspec.ValidationError) -> CtxdError:
    message, _, at = str(exc).partition(" - at `")
    path = at.rstrip("`") if at else "$"
    return CtxdError(ErrorCode.INVALID_PARAMS, f"invalid arguments: {message} (at {path})",
                     {"path": path, "reason": message,
                      "fix": "call the tool with arguments its inputSchema allows"})


ROUTE_KEY = "ctxd/session_id"


def _split_route(p: McpToolCallParams) -> tuple[bytes, CallRoute | None]:
    """The call's arguments, and the session it names in ``_meta`` (`CallRoute`): in its
    params' ``_meta``, where MCP puts a call's metadata, or in its arguments' ``_meta``,
    taken out of them, for a client that can change only a call's arguments (OpenCode's
    plugin: docs/decisions.md, "Agents end to end").

    Raises:
        CtxdError: the arguments' ``_meta`` is not an object, or the session or project
            it names is not valid (INVALID_PARAMS).
    """
    raw = bytes(p.arguments)
    meta: dict[str, Any] = dict(p.meta or {})
    if b'"_meta"' in raw:
        arguments = msgspec.json.decode(raw)
        if isinstance(arguments, dict) and "_meta" in arguments:
            inner = arguments.pop("_meta")
            if not isinstance(inner, dict):
                raise CtxdError(ErrorCode.INVALID_PARAMS,
                                "invalid arguments: `_meta` is not an object",
                                {"path": "$._meta", "fix": "send _meta as a JSON object"})
            meta = {**inner, **meta}
            raw = encode(arguments)
    if ROUTE_KEY not in meta:
        return raw, None
    try:
        return raw, msgspec.convert(meta, CallRoute)
    except msgspec.ValidationError as exc:
        raise CtxdError(ErrorCode.INVALID_PARAMS, f"invalid _meta: {exc}",
                        {"reason": str(exc), "fix": f"name the session in _meta[{ROUTE_KEY!r}] "
                         "with a valid session id, and its project with a path of at "
                         "most 256 characters"}) from None


def _error_result(error: CtxdError) -> dict[str, Any]:
    data = error.data if isinstance(error.data, dict) else {}
    return {"content": [{"type": "text", "text": error_text(error)}], "isError": True,
            "_meta": {"ctxd/error": {"code": int(error.code), "message": error.message,
                                      "data": data}}}


ALL_TOOLS = tuple(tool.name for tool in TOOLS)
_listings: dict[tuple[str, ...], dict[str, Any]] = {}
"""What tools/list answers for each set of tools asked for, made once."""


def tool_listing(names: tuple[str, ...]) -> dict[str, Any]:
    """tools/list's answer offering ``names`` (in `TOOLS`' order whatever theirs)."""
    listing = _listings.get(names)
    if listing is None:
        listing = _listings[names] = _tool_listing(names)
    return listing


def bind(call: Call, p: McpBindParams) -> McpBindResult:
    """mcp.bind: the session this connection's tools work on, before the first call."""
    state = connection_of(call.peer)
    if state.opened:
        raise invalid_state("this connection's MCP session is already open",
                            "send mcp.bind before the first tools/call",
                            session_id=state.session_id)
    state.session_id, state.project = p.session_id, p.project
    if p.tools == "all":
        state.tools = ALL_TOOLS
    elif isinstance(p.tools, list):
        state.tools = tuple(name for name in ALL_TOOLS if name in p.tools)
    else:
        state.tools = DEFAULT_TOOLS
    return McpBindResult(session_id=p.session_id, project=p.project, tools=list(state.tools))


def initialize(call: Call, p: McpInitializeParams) -> dict[str, Any]:
    state = connection_of(call.peer)
    version = (p.protocolVersion if p.protocolVersion in PROTOCOL_VERSIONS
               else PROTOCOL_VERSION)
    state.protocol_version = version
    return {"protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "ctxd", "title": "ctxd", "version": __version__},
            "instructions": INSTRUCTIONS.format(
                record=" and record them with memory_record"
                if "memory_record" in state.tools else "")}


def initialized(call: Call, p: McpParams) -> None:
    connection_of(call.peer).initialized = True


def ping(call: Call, p: McpParams) -> dict[str, Any]:
    return {}


def tools_list(call: Call, p: McpToolsListParams) -> dict[str, Any]:
    return tool_listing(connection_of(call.peer).tools)


def cancelled(call: Call, p: McpCancelledParams) -> None:
    state = connection_of(call.peer)
    request = state.calls.get(p.requestId)
    if request is None:
        # Answered already (then ignored, as the specification says), or not started.
        state.cancelled_early.append(p.requestId)
        return
    state.cancelled.add(p.requestId)
    request.cancel(p.reason or "cancelled by the MCP client")


async def tools_call(call: Call, p: McpToolCallParams) -> Any:
    """tools/call: the tool's arguments checked, then its native methods called through
    the call's dispatcher; a failure is the tool's error result, not a JSON-RPC error."""
    tool = TOOLS_BY_NAME.get(p.name)
    if tool is None:
        raise CtxdError(ErrorCode.INVALID_PARAMS, f"unknown tool: {p.name!r}",
                        {"tool": p.name, "available": [t.name for t in TOOLS],
                         "fix": "call one of the tools that tools/list names"})
    state = connection_of(call.peer)
    request_id = call.request_id
    if request_id is not None and request_id in state.cancelled_early:
        state.cancelled_early.remove(request_id)
        log.info("MCP call %r (%s) cancelled by its client before it started",
                 request_id, tool.name)
        return NO_REPLY
    request = current_request()
    if request_id is not None and request is not None:
        state.calls[request_id] = request
    token = (p.meta or {}).get("progressToken")
    context = ToolContext(call.dispatcher, call, state,
                          token if isinstance(token, (int, str)) else None)
    try:
        raw, route = _split_route(p)
        try:
            args = tool.decode(raw)
        except msgspec.ValidationError as exc:
            raise _invalid_arguments(exc) from None
        context.route = route
        result = await tool.run(context, args)
        health = await context_health(context)
    except CtxdError as error:
        if error.code == ErrorCode.CANCELLED and request_id in state.cancelled:
            log.info("MCP call %r (%s) cancelled by its client", request_id, tool.name)
            return NO_REPLY
        if error.code == ErrorCode.CANCELLED:
            log.info("MCP call %r (%s) cancelled: %s", request_id, tool.name,
                     error.message)
        answer = _error_result(error)
        with contextlib.suppress(CtxdError):
            health = (await context_health(context)
                      if error.code != ErrorCode.CANCELLED else None)
            if health is not None:
                answer["content"].append({"type": "text", "text": "context_health: " + encode(
                    msgspec.to_builtins(health)).decode()})
        return answer
    finally:
        if request_id is not None:
            if state.calls.get(request_id) is request:
                del state.calls[request_id]
            state.cancelled.discard(request_id)
    structured = msgspec.to_builtins(result)
    if health is not None:
        structured["context_health"] = msgspec.to_builtins(health)
    return {"content": [{"type": "text", "text": encode(structured).decode()}],
            "structuredContent": structured, "isError": False}

"""The route table: one row per method (docs/architecture.md, "Routes"), and the one
handler that runs any row.

A row says which params the method takes, what its operation runs on (a session's actor,
found from the params; a service; the connection; the daemon), the operation, whether it
is answered inline, and where the method is offered besides the socket: the MCP tools
whose work it does and the ctxctl commands that call it.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from ctxd import hub, mcp, memory, sessions
from ctxd.daemon import _methods as daemon_ops
from ctxd.mcp import (
    McpBindParams,
    McpCancelledParams,
    McpInitializeParams,
    McpParams,
    McpToolCallParams,
    McpToolsListParams,
)
from ctxd.sessions import Search, Supervisor
from ctxd.wire import Call, Dispatcher
from ctxd.wire.types import (
    AppendRequest,
    BranchCreateParams,
    BranchIdParams,
    BranchListParams,
    BranchReturnParams,
    BranchRollbackParams,
    BudgetMeasureParams,
    ContextCompactParams,
    ContextForkParams,
    DaemonLogParams,
    Empty,
    EventsSubscribeParams,
    EventsUnsubscribeParams,
    HelloParams,
    InjectAckParams,
    InjectListParams,
    InjectPullParams,
    InjectPushParams,
    MemoryContextParams,
    MemoryFeedbackParams,
    MemoryIdParams,
    MemoryListParams,
    MemoryOutcomeParams,
    MemoryRecordParams,
    MemorySearchParams,
    MemoryShareParams,
    MessageListParams,
    PromptBuildParams,
    RenderParams,
    RequestCancelParams,
    ResultReadParams,
    SessionIdParams,
    SessionListParams,
    SessionOpenParams,
    ToolGetParams,
    ToolListParams,
    ToolsRegisterParams,
    ToolsSearchParams,
    ToolStateParams,
    TranscriptImportParams,
    TurnCancelParams,
    TurnEndParams,
    TurnListParams,
    TurnRef,
    UsageGetParams,
    UsageRecordParams,
)

if TYPE_CHECKING:
    from ctxd.daemon._app import Daemon


class On(enum.Enum):
    """What a route's operation runs on, which says how it is called."""

    SESSION = "session_id"
    """``op(actor, params)`` on the actor of ``params.session_id``, in order with that
    session's other requests."""
    BRANCH = "branch_id"
    """``op(actor, params)`` on the actor of the session that holds ``params.branch_id``
    (the Supervisor's branch registry)."""
    INJECTION = "injection_id"
    """``op(actor, params)`` on the actor of the session whose queue holds
    ``params.injection_id`` (the store)."""
    RESULT = "ref_id"
    """``op(actor, params)`` on the actor of ``params.session_id`` when given, else of the
    session that holds the offloaded result ``params.ref_id`` (the store)."""
    SUPERVISOR = "supervisor"
    """``op(supervisor, params)``: finds its session(s) itself (``session.open`` runs on
    two when it forks, ``session.list`` on none)."""
    MEMORY = "memory"
    """``op(memory, params)`` on the memory service."""
    CONNECTION = "connection"
    """``op(call, params)``: the connection is all it needs (MCP's methods)."""
    DAEMON = "daemon"
    """``op(daemon, call, params)``: several of the daemon's parts (ctxd/daemon/_methods.py)."""


@dataclass(frozen=True, slots=True)
class Route:
    """One method: its row in `ROUTES`."""

    method: str
    params: type[msgspec.Struct]
    on: On
    op: Callable[..., Any]
    """Called as `On` says; a coroutine function, or a plain function when ``inline``."""
    inline: bool = False
    """Answered by the connection's reader without a task of its own: it cannot wait."""
    mcp: tuple[str, ...] = ()
    """The MCP tools whose work it does (`ctxd.mcp.TOOLS`)."""
    ctxctl: tuple[str, ...] = ()
    """The ctxctl commands that call it."""
    check: Callable[[Any], object] | None = None
    """A check of the params that needs no session, run before the session is found."""
    coalesce: Callable[[Any], Hashable] | None = None
    """The key under which identical requests of one session share one run
    (`Supervisor.call_shared`); the shared answer says ``coalesced``."""
    connection_ids: bool = False
    """Its request ids are its connection's own (MCP's): `request.cancel` does not reach it."""


ROUTES: tuple[Route, ...] = (
    # daemon
    Route("daemon.ping", Empty, On.DAEMON, daemon_ops.ping, inline=True),
    Route("daemon.hello", HelloParams, On.DAEMON, daemon_ops.hello, inline=True),
    Route("daemon.status", Empty, On.DAEMON, daemon_ops.status, inline=True,
          ctxctl=("status",)),
    Route("daemon.log", DaemonLogParams, On.DAEMON, daemon_ops.log_line, inline=True,
          ctxctl=("hook",)),
    Route("daemon.check", Empty, On.DAEMON, daemon_ops.check, ctxctl=("doctor",)),
    Route("daemon.shutdown", Empty, On.DAEMON, daemon_ops.shutdown, ctxctl=("stop",)),
    # sessions
    Route("session.open", SessionOpenParams, On.SUPERVISOR, sessions.session_open,
          mcp=("context_fork",), ctxctl=("session open", "hook")),
    Route("session.get", SessionIdParams, On.SESSION, sessions.session_get,
          ctxctl=("session show",)),
    Route("session.close", SessionIdParams, On.SESSION, sessions.session_close,
          ctxctl=("session close",)),
    Route("session.delete", SessionIdParams, On.SESSION, sessions.session_delete,
          ctxctl=("session delete",)),
    Route("session.list", SessionListParams, On.SUPERVISOR, sessions.session_list,
          ctxctl=("sessions", "status")),
    Route("session.resume", SessionIdParams, On.SESSION, sessions.session_resume,
          ctxctl=("session resume", "hook")),
    Route("message.append", AppendRequest, On.SESSION, sessions.append_request),
    Route("message.list", MessageListParams, On.SESSION, sessions.list_messages,
          ctxctl=("session messages",)),
    Route("ctxd.render", RenderParams, On.SESSION, sessions.render_request,
          ctxctl=("session render",)),
    Route("budget.measure", BudgetMeasureParams, On.SESSION, sessions.measure),
    Route("transcript.import", TranscriptImportParams, On.SUPERVISOR,
          sessions.transcript_import, ctxctl=("import", "hook")),
    # hygiene
    Route("context.compact", ContextCompactParams, On.SESSION, sessions.compact,
          coalesce=sessions.compaction_key, mcp=("compact_context",), ctxctl=("compact",)),
    Route("context.fork", ContextForkParams, On.SESSION, sessions.context_fork,
          mcp=("context_fork",), ctxctl=("fork",)),
    Route("result.read", ResultReadParams, On.RESULT, sessions.read_result,
          mcp=("read_result",), ctxctl=("result",)),
    Route("tools.register", ToolsRegisterParams, On.SESSION, sessions.register_tools),
    Route("tools.search", ToolsSearchParams, On.SESSION, sessions.search_tools,
          mcp=("tool_search",)),
    Route("prompt.build", PromptBuildParams, On.DAEMON, daemon_ops.prompt_build),
    # branches
    Route("branch.create", BranchCreateParams, On.SESSION, sessions.create_branch,
          mcp=("context_branch",)),
    Route("branch.return", BranchReturnParams, On.BRANCH, sessions.return_branch,
          mcp=("context_return",)),
    Route("branch.status", BranchIdParams, On.BRANCH, sessions.branch_status),
    Route("branch.list", BranchListParams, On.SESSION, sessions.list_branches,
          mcp=("context_branch_status", "context_list_branches"), ctxctl=("branches",)),
    Route("branch.rollback", BranchRollbackParams, On.SESSION, sessions.rollback,
          mcp=("context_rollback",)),
    # the hub's queue, ledger and tool states, kept per session
    Route("inject.push", InjectPushParams, On.SESSION, sessions.inject_push,
          ctxctl=("inject",)),
    Route("inject.pull", InjectPullParams, On.SESSION, sessions.inject_pull,
          ctxctl=("hook",)),
    Route("inject.ack", InjectAckParams, On.INJECTION, sessions.inject_ack,
          ctxctl=("hook",)),
    Route("inject.list", InjectListParams, On.SESSION, sessions.inject_list),
    Route("usage.record", UsageRecordParams, On.SESSION, sessions.usage_record,
          check=hub.counters_of),
    Route("usage.get", UsageGetParams, On.SESSION, sessions.usage_get,
          ctxctl=("usage", "status")),
    Route("tool.state", ToolStateParams, On.SESSION, sessions.tool_state),
    Route("tool.get", ToolGetParams, On.SESSION, sessions.tool_get),
    Route("tool.list", ToolListParams, On.SESSION, sessions.tool_list, ctxctl=("tools",)),
    # memory
    Route("memory.record", MemoryRecordParams, On.MEMORY, memory.Memory.record,
          mcp=("memory_record",), ctxctl=("memory add",)),
    Route("memory.search", MemorySearchParams, On.MEMORY, memory.Memory.search,
          mcp=("memory_search",), ctxctl=("memory search",)),
    Route("memory.context", MemoryContextParams, On.MEMORY, memory.memory_context,
          ctxctl=("hook",)),
    Route("memory.get", MemoryIdParams, On.MEMORY, memory.memory_get,
          ctxctl=("memory show",)),
    Route("memory.feedback", MemoryFeedbackParams, On.MEMORY, memory.memory_feedback,
          ctxctl=("memory rate",)),
    Route("memory.outcome", MemoryOutcomeParams, On.MEMORY, memory.memory_outcome,
          ctxctl=("memory rate",)),
    Route("memory.share", MemoryShareParams, On.MEMORY, memory.memory_share,
          ctxctl=("memory share",)),
    Route("memory.delete", MemoryIdParams, On.MEMORY, memory.memory_delete,
          ctxctl=("memory rm",)),
    Route("memory.list", MemoryListParams, On.MEMORY, memory.Memory.list,
          ctxctl=("memory list",)),
    Route("memory.reindex", Empty, On.MEMORY, memory.memory_reindex,
          ctxctl=("memory reindex",)),
    # events, cancellation, turns
    Route("events.subscribe", EventsSubscribeParams, On.DAEMON, daemon_ops.subscribe,
          ctxctl=("events",)),
    Route("events.unsubscribe", EventsUnsubscribeParams, On.DAEMON, daemon_ops.unsubscribe),
    # request.cancel never waits: the reader answers it at once, even while the
    # connection's other requests are all busy.
    Route("request.cancel", RequestCancelParams, On.DAEMON, daemon_ops.cancel_request,
          inline=True, ctxctl=("cancel",)),
    Route("turn.start", TurnRef, On.DAEMON, daemon_ops.turn_start),
    Route("turn.get", TurnRef, On.DAEMON, daemon_ops.turn_get, inline=True),
    Route("turn.cancel", TurnCancelParams, On.DAEMON, daemon_ops.turn_cancel, inline=True),
    Route("turn.end", TurnEndParams, On.DAEMON, daemon_ops.turn_end, inline=True),
    Route("turn.list", TurnListParams, On.DAEMON, daemon_ops.turn_list, inline=True),
    # MCP (docs/protocol.md, "MCP"), which an MCP client reaches through ctxctl mcp
    Route("mcp.bind", McpBindParams, On.CONNECTION, mcp.bind, inline=True,
          ctxctl=("mcp",)),
    Route("initialize", McpInitializeParams, On.CONNECTION, mcp.initialize, inline=True,
          ctxctl=("mcp",)),
    Route("notifications/initialized", McpParams, On.CONNECTION, mcp.initialized,
          inline=True, ctxctl=("mcp",)),
    Route("ping", McpParams, On.CONNECTION, mcp.ping, inline=True, ctxctl=("mcp",)),
    Route("tools/list", McpToolsListParams, On.CONNECTION, mcp.tools_list, inline=True,
          ctxctl=("mcp",)),
    Route("notifications/cancelled", McpCancelledParams, On.CONNECTION, mcp.cancelled,
          inline=True, ctxctl=("mcp",)),
    Route("tools/call", McpToolCallParams, On.CONNECTION, mcp.tools_call, ctxctl=("mcp",),
          connection_ids=True),
)
"""Every method the daemon answers. Adding a session method: its operation
(``async def op(actor, params)``), its row here, its docs (docs/protocol.md) and tests."""


async def _session_of_branch(supervisor: Supervisor, p: Any) -> str:
    session_id: str = await supervisor.registry.session_of(p.branch_id)
    return session_id


_FIND_SESSION: dict[On, Callable[[Supervisor, Any], Awaitable[str]]] = {
    On.BRANCH: _session_of_branch, On.INJECTION: sessions.session_of_injection,
    On.RESULT: sessions.session_of_result}
"""How a route whose operation runs on a session's actor, but whose params name no
session, finds it (`On.SESSION`'s is ``params.session_id``)."""


async def on_session(route: Route, supervisor: Supervisor, params: Any) -> Any:
    """Run a route's operation on its session's actor, in order with that session's other
    requests.

    Raises:
        CtxdError: what the route's check, the finding of the session or the operation
            raises; -32007 while the daemon shuts down.
    """
    if route.check is not None:
        route.check(params)
    if route.on is On.SESSION:
        session_id = params.session_id
    else:
        session_id = await _FIND_SESSION[route.on](supervisor, params)
    op = route.op
    key = None if route.coalesce is None else route.coalesce(params)
    answer, shared = await supervisor.call_shared(session_id, key,
                                                  lambda actor: op(actor, params))
    if shared:
        answer = msgspec.structs.replace(answer, coalesced=True)
    if isinstance(answer, Search):
        return await answer.run(supervisor.searches)  # off the session's mailbox
    return answer


def handler(route: Route, daemon: Daemon) -> Callable[[Call, Any], Any]:
    """What the dispatcher calls for a request of ``route.method``: the route's operation,
    called as its `On` says."""
    op, supervisor, memory_service = route.op, daemon.supervisor, daemon.memory
    if route.on in (On.SESSION, On.BRANCH, On.INJECTION, On.RESULT):
        return lambda call, params: on_session(route, supervisor, params)
    if route.on is On.SUPERVISOR:
        return lambda call, params: op(supervisor, params)
    if route.on is On.MEMORY:
        return lambda call, params: op(memory_service, params)
    if route.on is On.CONNECTION:
        return op
    return functools.partial(op, daemon)


def register_routes(dispatcher: Dispatcher, daemon: Daemon) -> None:
    """Add every route to the dispatcher, each with its params decoder."""
    for route in ROUTES:
        serve = handler(route, daemon)
        if route.inline:
            dispatcher.register_inline(route.method, route.params, serve)
        else:
            dispatcher.register(route.method, route.params, serve,
                                connection_ids=route.connection_ids)

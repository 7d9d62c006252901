"""The MCP tools (docs/protocol.md, "MCP"): each one's arguments and result types, and how
it maps to the native methods it calls through the dispatcher."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec
import trio

from ctxd.errors import CtxdError, ErrorCode, invalid_state, not_found
from ctxd.mcp._types import (
    DEFAULT_TOOLS,
    BudgetWarning,
    CallRoute,
    CompactContextArgs,
    ContextBranchArgs,
    ContextBranchStatusArgs,
    ContextBranchStatusResult,
    ContextForkArgs,
    ContextForkToolResult,
    ContextHealth,
    ContextListBranchesArgs,
    ContextListBranchesResult,
    ContextReturnArgs,
    ContextRollbackArgs,
    ForcedReturn,
    MemoryRecordArgs,
    MemoryRecordToolResult,
    MemorySearchArgs,
    MemorySearchToolResult,
    ReadResultArgs,
    ReadResultToolResult,
    ThreadTokens,
    ToolArgs,
    ToolSearchArgs,
    ToolSearchToolResult,
)
from ctxd.wire import Call, Dispatcher, encode
from ctxd.wire.types import (
    Branch,
    BranchCreateResult,
    BranchListResult,
    BranchReturnResult,
    BranchRollbackResult,
    ContextCompactResult,
    ContextForkResult,
    ContextState,
    ForkSeedInfo,
    MemoryRecordResult,
    MemorySearchResult,
    ResultReadResult,
    SessionOpenResult,
    SessionResult,
    ToolsSearchResult,
    project_scope,
)

NO_REMOVAL_CHARS = 120_000
"""``context.fork``'s default ``no_removal_chars`` (docs/protocol.md, "context.fork")."""

A = TypeVar("A", bound=ToolArgs)
EARLY_CANCELS_KEPT = 256
FORCED = ("budget_exhausted", "timeout")
"""The statuses of a branch ctxd returned by itself."""
ROUTES_KEPT = 256
"""Sessions named by calls' ``_meta`` whose opening a connection remembers (the oldest is
forgotten first, and opened again by its next call)."""


class McpConnection:
    """What MCP keeps with one connection: its session binding and its calls in flight
    (MCP request ids are the connection's own)."""

    def __init__(self) -> None:
        self.session_id: str | None = None
        """The bound session (``mcp.bind``), or the one opened for this connection."""
        self.project: str | None = None
        self.opened = False
        """``session.open`` ran for this connection (with ``project``)."""
        self.protocol_version: str | None = None
        self.initialized = False
        self.calls: dict[int | str, Any] = {}
        """Tool calls in flight by request id: their cancellable `ctxd.jobs.Request`."""
        self.cancelled: set[int | str] = set()
        """Ids the client cancelled with notifications/cancelled (they go unanswered)."""
        self.cancelled_early: deque[int | str] = deque(maxlen=EARLY_CANCELS_KEPT)
        """Ids cancelled before their call started (the reader reached the notification
        first); a call finds its id here and stops at once. MCP ids are never reused on a
        connection, so an id of a call already answered is only a little memory."""
        self.routes: dict[str, str | None] = {}
        """Sessions opened for calls that named them (`CallRoute`), with their project."""
        self._opening = trio.Lock()
        self.tools: tuple[str, ...] = DEFAULT_TOOLS
        """The tools tools/list offers (``mcp.bind``'s ``tools``)."""
        self.started_at = time.time()
        self.reported: set[tuple[str, str]] = set()
        """(branch id, notice) of the `ContextHealth` notices already given."""

    def connection_lost(self) -> None:
        for request in list(self.calls.values()):
            request.cancel("the MCP client disconnected")

    async def session(self, context: ToolContext, project_path: str | None) -> str:
        """The session's id, opened once per connection (again when ``project_path``
        names another project)."""
        async with self._opening:
            if self.opened and (project_path is None or project_path == self.project):
                assert self.session_id is not None
                return self.session_id
            opened: SessionOpenResult = await context.native("session.open", {
                "session_id": self.session_id, "project": project_path or self.project})
            self.session_id = opened.session.session_id
            self.project = opened.session.project
            self.opened = True
            return self.session_id

    async def routed(self, context: ToolContext, route: CallRoute,
                     project_path: str | None) -> str:
        """The session a call named, opened once per connection (again when its project
        changes): ``project_path``, else the call's ``ctxd/project``."""
        project = project_path or route.project
        async with self._opening:
            known = route.session_id in self.routes
            if not known or (project is not None and project != self.routes[route.session_id]):
                opened: SessionOpenResult = await context.native("session.open", {
                    "session_id": route.session_id, "project": project})
                self.routes.pop(route.session_id, None)
                if len(self.routes) >= ROUTES_KEPT:
                    del self.routes[next(iter(self.routes))]
                self.routes[route.session_id] = opened.session.project
            return route.session_id


@dataclass
class ToolContext:
    """One tool call: the native methods it may call, its connection, its progress."""

    dispatcher: Dispatcher
    call: Call
    connection: McpConnection
    progress_token: int | str | None
    route: CallRoute | None = None
    """The session the call named in its ``_meta``; None: the connection's."""

    async def native(self, method: str, params: dict[str, Any]) -> Any:
        """Call a native method (fields that are None are left out: their defaults)."""
        given = {name: value for name, value in params.items() if value is not None}
        return await self.dispatcher.invoke(method, encode(given), self.call)

    async def session(self, args: ToolArgs) -> str:
        if self.route is not None:
            return await self.connection.routed(self, self.route, args.project_path)
        return await self.connection.session(self, args.project_path)

    @property
    def project(self) -> str | None:
        """The project of the session the call works on (once `session` opened it)."""
        if self.route is not None:
            return self.connection.routes.get(self.route.session_id)
        return self.connection.project

    async def context_state(self, session_id: str) -> ContextState:
        got: SessionResult = await self.native("session.get", {"session_id": session_id})
        return got.context_state

    async def progress(self, progress: float, total: float | None, message: str) -> None:
        """``notifications/progress``, when the caller asked for it with a token."""
        if self.progress_token is None:
            return
        params: dict[str, Any] = {"progressToken": self.progress_token,
                                  "progress": progress, "message": message}
        if total is not None:
            params["total"] = total
        await self.call.peer.send_notification("notifications/progress", params)


@dataclass(frozen=True)
class Tool(Generic[A]):
    name: str
    title: str
    description: str
    arguments: type[A]
    result: type[msgspec.Struct]
    run: Callable[[ToolContext, A], Awaitable[msgspec.Struct]]
    read_only: bool

    def decode(self, raw: bytes) -> A:
        return msgspec.json.decode(raw, type=self.arguments)


def _fields(args: msgspec.Struct, *names: str) -> dict[str, Any]:
    return {name: getattr(args, name) for name in names}


async def _branch(context: ToolContext, args: ContextBranchArgs) -> BranchCreateResult:
    session_id = await context.session(args)
    created: BranchCreateResult = await context.native("branch.create", {
        "session_id": session_id, **_fields(args, "description", "prompt", "budget",
                                            "timeout_seconds", "inject_memories")})
    return created


async def _own_branch(context: ToolContext, session_id: str, branch_id: str) -> Branch:
    listed: BranchListResult = await context.native("branch.list", {"session_id": session_id})
    for branch in listed.branches:
        if branch.branch_id == branch_id:
            return branch
    raise not_found("branch", branch_id, "list this session's branches with "
                                         "context_list_branches")


async def _return(context: ToolContext, args: ContextReturnArgs) -> BranchReturnResult:
    session_id = await context.session(args)
    branch_id = args.branch_id
    if branch_id is None:
        branch_id = (await context.context_state(session_id)).active_branch_id
        if branch_id is None:
            raise invalid_state("no branch is active: the main thread cannot be returned",
                                "open one with context_branch first", session_id=session_id)
    else:
        await _own_branch(context, session_id, branch_id)
    returned: BranchReturnResult = await context.native("branch.return", {
        "branch_id": branch_id, "message": args.message,
        "extract_memory": args.extract_memory or None})
    return returned


async def _status(context: ToolContext,
                  args: ContextBranchStatusArgs) -> ContextBranchStatusResult:
    session_id = await context.session(args)
    listed: BranchListResult = await context.native("branch.list", {"session_id": session_id})
    state = listed.context_state
    by_id = {branch.branch_id: branch for branch in listed.branches}
    folded_into: dict[str | None, int] = {}
    for branch in listed.branches:
        if branch.tokens_folded is not None and branch.status != "discarded":
            parent = branch.parent_branch_id
            folded_into[parent] = folded_into.get(parent, 0) + branch.tokens_folded
    breakdown = [ThreadTokens(thread="main", total=state.main_thread_tokens,
                              folded_total=folded_into.get(None, 0))]
    breakdown += [ThreadTokens(thread=branch_id, total=by_id[branch_id].budget_used,
                               folded_total=folded_into.get(branch_id, 0))
                  for branch_id in state.branch_path]
    if args.branch_id is not None:
        if args.branch_id not in by_id:
            raise not_found("branch", args.branch_id, "list this session's branches with "
                                                      "context_list_branches")
        shown: Branch | None = by_id[args.branch_id]
    else:
        shown = by_id.get(state.active_branch_id) if state.active_branch_id else None
    return ContextBranchStatusResult(
        branch_path=["main", *state.branch_path], token_breakdown=breakdown,
        context_limit=state.effective_window, usage_percent=round(state.usage * 100, 2),
        branch=shown, context_state=state)


async def _list(context: ToolContext,
                args: ContextListBranchesArgs) -> ContextListBranchesResult:
    session_id = await context.session(args)
    listed: BranchListResult = await context.native("branch.list", {
        "session_id": session_id, "status": args.status})
    return ContextListBranchesResult(
        branches=listed.branches, total_branches=listed.total, active_branches=listed.active,
        folded_branches=listed.folded, context_state=listed.context_state)


async def _rollback(context: ToolContext, args: ContextRollbackArgs) -> BranchRollbackResult:
    session_id = await context.session(args)
    rolled: BranchRollbackResult = await context.native("branch.rollback", {
        "session_id": session_id, "branch_id": args.branch_id})
    return rolled


async def _read(context: ToolContext, args: ReadResultArgs) -> ReadResultToolResult:
    """The result in this session's blobs; else wherever its ref is, as ``ctxctl result
    REF`` finds it: an agent whose model calls go through the gateway (``ctxctl run``) has
    its stubs in the gateway's session, not in its MCP server's."""
    session_id = await context.session(args)
    fields = _fields(args, "ref_id", "offset", "limit", "pattern", "literal", "max_matches")
    read: ResultReadResult
    try:
        read = await context.native("result.read", {"session_id": session_id, **fields})
    except CtxdError as exc:
        if exc.code != ErrorCode.NOT_FOUND or (exc.data or {}).get("ref_id") != args.ref_id:
            raise
        read = await context.native("result.read", fields)
    return ReadResultToolResult(**msgspec.structs.asdict(read),
                                context_state=await context.context_state(session_id))


async def _search(context: ToolContext, args: MemorySearchArgs) -> MemorySearchToolResult:
    session_id = await context.session(args)
    found: MemorySearchResult = await context.native("memory.search", _fields(
        args, "query", "scope", "k", "min_confidence", "mode"))
    return MemorySearchToolResult(**msgspec.structs.asdict(found),
                                  context_state=await context.context_state(session_id))


async def _record(context: ToolContext, args: MemoryRecordArgs) -> MemoryRecordToolResult:
    session_id = await context.session(args)
    scope = args.scope or project_scope(context.project)
    recorded: MemoryRecordResult = await context.native("memory.record", {
        **_fields(args, "title", "content", "description", "outcome", "tags"),
        "scope": scope})
    return MemoryRecordToolResult(**msgspec.structs.asdict(recorded),
                                  context_state=await context.context_state(session_id))


async def _compact(context: ToolContext, args: CompactContextArgs) -> ContextCompactResult:
    session_id = await context.session(args)
    thread = args.branch_id or "the main thread"
    await context.progress(0, 1, f"compacting {thread}")
    compacted: ContextCompactResult = await context.native("context.compact", {
        "session_id": session_id, **_fields(args, "branch_id", "strategies")})
    await context.progress(1, 1, f"compacted {thread}: {compacted.before_tokens} → "
                                 f"{compacted.after_tokens} tokens")
    return compacted


async def _fork(context: ToolContext, args: ContextForkArgs) -> ContextForkToolResult:
    """A new session seeded with this one's forked context: the sub-agent works on it, and
    only what was cut comes back to the calling model (docs/protocol.md, "MCP")."""
    session_id = await context.session(args)
    source = {"session_id": session_id, "branch_id": args.branch_id}
    opened: SessionOpenResult = await context.native("session.open", {
        **_fields(args, "session_id"), "project": context.project,
        "fork_from": source})
    seed = opened.fork
    assert isinstance(seed, ForkSeedInfo)
    text: str | msgspec.UnsetType = msgspec.UNSET
    if args.include_context:
        forked: ContextForkResult = await context.native("context.fork", {
            **source, "char_budget": seed.char_budget,
            "no_removal_chars": min(seed.char_budget, NO_REMOVAL_CHARS)})
        text = forked.context
    return ContextForkToolResult(session_id=opened.session.session_id, preamble=seed.preamble,
                                 stats=seed.stats, tokens=seed.tokens, context=text,
                                 context_state=await context.context_state(session_id))


async def _tool_search(context: ToolContext, args: ToolSearchArgs) -> ToolSearchToolResult:
    session_id = await context.session(args)
    found: ToolsSearchResult = await context.native("tools.search", {
        "session_id": session_id, "query": args.query, "limit": args.limit})
    return ToolSearchToolResult(**msgspec.structs.asdict(found),
                                context_state=await context.context_state(session_id))


TOOLS: tuple[Tool[Any], ...] = (
    Tool("context_branch", "Open a context branch",
         "Do a sub-task in a branch of its own context; context_return folds it into a "
         "summary. Use before work that would fill the context.",
         ContextBranchArgs, BranchCreateResult, _branch, False),
    Tool("context_return", "Fold a branch back",
         "End the active branch: its work becomes `message`, a summary of what was found.",
         ContextReturnArgs, BranchReturnResult, _return, False),
    Tool("context_branch_status", "Where the context stands",
         "The active branch path (main first), each thread's tokens and what was folded "
         "into it, the context limit and how much of it is used.",
         ContextBranchStatusArgs, ContextBranchStatusResult, _status, True),
    Tool("context_list_branches", "List the branches",
         "Every branch of this session (optionally of one status), with counts.",
         ContextListBranchesArgs, ContextListBranchesResult, _list, True),
    Tool("context_rollback", "Roll back to before a branch",
         "Discard a branch and everything after it: the thread is restored as it was when "
         "the branch was made.",
         ContextRollbackArgs, BranchRollbackResult, _rollback, False),
    Tool("read_result", "Read an offloaded tool result",
         "Read a stubbed tool output by its ref_id: a page, or the lines matching pattern.",
         ReadResultArgs, ReadResultToolResult, _read, True),
    Tool("memory_search", "Search memories",
         "Find lessons recorded earlier that match the query.",
         MemorySearchArgs, MemorySearchToolResult, _search, True),
    Tool("memory_record", "Record a memory",
         "Keep a lesson for later sessions: what worked or failed and why. Scoped to this "
         "project unless `scope` says otherwise.",
         MemoryRecordArgs, MemoryRecordToolResult, _record, False),
    Tool("compact_context", "Compact the context",
         "Shrink the context: clear old tool results, summarize the oldest messages.",
         CompactContextArgs, ContextCompactResult, _compact, False),
    Tool("tool_search", "Find a deferred tool",
         "Tools left out of the context to save tokens: find those matching the query; "
         "each match's input_schema says how to call it, and it is offered again from the "
         "next model call.",
         ToolSearchArgs, ToolSearchToolResult, _tool_search, False),
    Tool("context_fork", "Fork the context into a session for a sub-agent",
         "Open a new session (session_id, or a new id) seeded with this session's context "
         "(or a branch's) bounded for a sub-agent: from the latest compaction summary, old "
         "tool results and parameters cut, the oldest messages removed to fit. Returns its "
         "session_id, the preamble that says what was cut, stats and tokens; the sub-agent "
         "works on that session. include_context also returns the context's text.",
         ContextForkArgs, ContextForkToolResult, _fork, False),
)
"""In the order tools/list gives them (fixed: clients cache the prompt that holds them)."""

TOOLS_BY_NAME: dict[str, Tool[Any]] = {tool.name: tool for tool in TOOLS}


async def context_health(context: ToolContext) -> ContextHealth | None:
    """The branches of the call's session (the one it named, else the connection's) that
    passed 80 % of their budget or that ctxd returned by itself since this connection last
    said so (and since it began: a client that connects
    again is not told the session's history); None when there is nothing new."""
    connection = context.connection
    if context.route is not None:
        session_id: str | None = (context.route.session_id
                                  if context.route.session_id in connection.routes else None)
    else:
        session_id = connection.session_id if connection.opened else None
    if session_id is None:
        return None
    listed: BranchListResult = await context.native("branch.list", {"session_id": session_id})
    warnings: list[BudgetWarning] = []
    forced: list[ForcedReturn] = []
    for branch in listed.branches:
        if branch.status in FORCED and (branch.returned_at or 0.0) >= connection.started_at \
                and (branch.branch_id, "forced_return") not in connection.reported:
            connection.reported.add((branch.branch_id, "forced_return"))
            forced.append(ForcedReturn(
                branch_id=branch.branch_id, description=branch.description,
                status=branch.status, reason=branch.return_reason, result=branch.result))
        elif branch.status == "active" and branch.budget_warned \
                and (branch.branch_id, "budget_warning") not in connection.reported:
            connection.reported.add((branch.branch_id, "budget_warning"))
            warnings.append(BudgetWarning(
                branch_id=branch.branch_id, description=branch.description,
                budget_used=branch.budget_used, budget=branch.budget))
    if not (warnings or forced):
        return None
    return ContextHealth(health=listed.context_state.health, budget_warnings=warnings,
                         forced_returns=forced)


def error_text(error: CtxdError) -> str:
    data = error.data if isinstance(error.data, dict) else {}
    fix = data.get("fix")
    return f"{error.message}" + (f"\nfix: {fix}" if fix else "")

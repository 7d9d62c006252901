"""MCP's own types (docs/protocol.md, "MCP"): the params of its methods, ``mcp.bind``, and
each tool's arguments and result. A tool's arguments take their limits from the native
params' named types, so a tool and the method it calls accept the same values; the tools'
JSON schemas are generated from these types (`ctxd.mcp.plain_schema`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from ctxd.wire.types import (
    Branch,
    BranchBudget,
    BranchDescription,
    BranchId,
    BranchPrompt,
    BranchStatus,
    BranchTimeout,
    Confidence,
    ContextState,
    ForkStats,
    MaxMatches,
    MemoryContent,
    MemoryDescription,
    MemoryQuery,
    MemoryRecordResult,
    MemorySearchResult,
    MemoryTitle,
    Outcome,
    Params,
    ReadLimit,
    ReadOffset,
    ReadPattern,
    RefId,
    Result,
    ResultReadResult,
    ReturnMessage,
    Scope,
    SearchK,
    SearchMode,
    SessionId,
    Strategies,
    Tags,
    Text,
    ToolQuery,
    ToolSearchLimit,
    ToolsSearchResult,
)


class McpParams(Params, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """Base of MCP's params: unlike native params they accept unknown fields, and ``_meta``,
    as the MCP specification requires of a server."""

    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


class McpInitializeParams(McpParams, frozen=True):
    # default_factory, which a default of {} or [] stands for in a Struct: ruff cannot see
    # that these classes are Structs (their base is imported) and would take {} for a shared
    # class attribute.
    protocolVersion: str
    capabilities: dict[str, Any] = msgspec.field(default_factory=dict)
    clientInfo: dict[str, Any] = msgspec.field(default_factory=dict)


class McpToolsListParams(McpParams, frozen=True):
    cursor: str | None = None


class McpToolCallParams(McpParams, frozen=True):
    name: str
    arguments: msgspec.Raw = msgspec.Raw(b"{}")
    """Decoded by the tool's own arguments type (msgspec takes no ``Raw`` in a union)."""


class McpCancelledParams(McpParams, frozen=True):
    requestId: int | str
    reason: str | None = None


ToolName = Literal["context_branch", "context_return", "context_branch_status",
                   "context_list_branches", "context_rollback", "read_result", "memory_search",
                   "memory_record", "compact_context", "tool_search", "context_fork"]
"""Every MCP tool, in the order tools/list gives them."""
DEFAULT_TOOLS: tuple[ToolName, ...] = ("context_branch", "context_return", "read_result",
                                       "memory_search", "compact_context")
"""The tools offered unless the client asks for others (``mcp.bind``'s ``tools``): each
definition is in every model request (docs/performance.md, "MCP tool definitions")."""


class McpBindParams(Params, frozen=True):
    """``mcp.bind``: the session and project the connection's MCP tools work on, and the
    tools it offers (None: `DEFAULT_TOOLS`; ``"all"``: every one)."""

    session_id: SessionId | None = None
    project: Text | None = None
    tools: Literal["all", "default"] | Annotated[list[ToolName], Meta(min_length=1)] | None = None


class CallRoute(msgspec.Struct, frozen=True, kw_only=True):
    """A ``tools/call``'s ``_meta`` keys that name the session it acts on, for a client
    whose one MCP server serves many conversations (OpenCode: its plugin stamps each call
    with the conversation's session; docs/decisions.md, "Agents end to end"). Other keys of
    ``_meta`` are left alone."""

    session_id: SessionId = msgspec.field(name="ctxd/session_id")
    project: Text | None = msgspec.field(default=None, name="ctxd/project")


class McpBindResult(Result, frozen=True):
    session_id: str | None
    """None: a new session is opened at the first tool call."""
    project: str | None
    tools: list[str]
    """The tools tools/list offers on this connection."""


ProjectPath = Annotated[str, Meta(min_length=1, max_length=256,
                                  description="the project's directory; it scopes memories")]


class ToolArgs(Params, frozen=True, kw_only=True):
    """Base of every MCP tool's arguments: a misspelt argument is an error naming it."""

    project_path: ProjectPath | None = None


class ContextBranchArgs(ToolArgs, frozen=True):
    description: BranchDescription
    prompt: BranchPrompt
    budget: BranchBudget | None = None
    timeout_seconds: BranchTimeout | None = None
    inject_memories: bool = True


class ContextReturnArgs(ToolArgs, frozen=True):
    message: ReturnMessage
    branch_id: BranchId | None = None
    """None: the active branch."""
    extract_memory: bool = False
    """Also keep the branch's lesson as a memory (branch.return's ``extract_memory``)."""


class ContextBranchStatusArgs(ToolArgs, frozen=True):
    branch_id: BranchId | None = None


class ContextListBranchesArgs(ToolArgs, frozen=True):
    status: BranchStatus | None = None


class ContextRollbackArgs(ToolArgs, frozen=True):
    branch_id: BranchId
    restore_state: Literal[True] = True
    """ctxd always restores the thread as it was when the branch was made."""


class ReadResultArgs(ToolArgs, frozen=True):
    ref_id: RefId
    offset: ReadOffset | None = None
    limit: ReadLimit | None = None
    pattern: ReadPattern | None = None
    literal: bool = False
    max_matches: MaxMatches = 100


class MemorySearchArgs(ToolArgs, frozen=True):
    query: MemoryQuery
    scope: Scope | None = None
    k: SearchK = 5
    min_confidence: Confidence = 0.0
    mode: SearchMode = "hybrid"


class MemoryRecordArgs(ToolArgs, frozen=True):
    title: MemoryTitle
    content: MemoryContent
    description: MemoryDescription = ""
    scope: Scope | None = None
    """None: the session's project's scope, or global without a project."""
    outcome: Outcome = "success"
    tags: Tags = msgspec.field(default_factory=list)


class CompactContextArgs(ToolArgs, frozen=True):
    branch_id: BranchId | None = None
    strategies: Strategies | None = None


class ToolSearchArgs(ToolArgs, frozen=True):
    query: ToolQuery
    limit: ToolSearchLimit = 5


class ThreadTokens(Result, frozen=True):
    thread: str
    """``main`` or a branch id."""
    total: int
    """The thread's own tokens: the main thread as rendered, a branch's ``budget_used``."""
    folded_total: int
    """Tokens folded into it by its returned branches."""


class ContextBranchStatusResult(Result, frozen=True):
    branch_path: list[str]
    """``main``, then the active branches from the outermost down."""
    token_breakdown: list[ThreadTokens]
    """One entry per thread of ``branch_path``, in its order."""
    context_limit: int
    usage_percent: float
    branch: Branch | None
    """The branch asked about (``branch_id``), else the active one (None on main)."""
    context_state: ContextState


class ContextListBranchesResult(Result, frozen=True):
    branches: list[Branch]
    total_branches: int
    active_branches: int
    folded_branches: int
    context_state: ContextState


class ReadResultToolResult(ResultReadResult, frozen=True, kw_only=True):
    context_state: ContextState


class MemorySearchToolResult(MemorySearchResult, frozen=True, kw_only=True):
    context_state: ContextState


class MemoryRecordToolResult(MemoryRecordResult, frozen=True, kw_only=True):
    context_state: ContextState


class ToolSearchToolResult(ToolsSearchResult, frozen=True, kw_only=True):
    context_state: ContextState

class ContextForkArgs(ToolArgs, frozen=True):
    """MCP ``context_fork``: a new session seeded with the connection's session forked
    (``session.open`` with ``fork_from``)."""

    session_id: SessionId | None = None
    """The new session's id (default: a new one)."""
    branch_id: BranchId | None = None
    """The thread to fork: a branch's own messages, or (null) the main thread."""
    include_context: bool = False
    """Also return the forked context's text (``context.fork`` at the seed's budget)."""


class ContextForkToolResult(Result, frozen=True, kw_only=True):
    session_id: str
    """The new session, seeded: a sub-agent works on it."""
    preamble: str
    stats: ForkStats
    tokens: int
    context: str | msgspec.UnsetType = msgspec.UNSET
    """With ``include_context`` only: the forked context's text."""
    context_state: ContextState
    """The calling session's, as every tool's result carries (the new session's is its
    own: ``session.get``)."""


class BudgetWarning(Result, frozen=True):
    """A live branch that has used 80 % of its budget."""

    branch_id: str
    description: str
    budget_used: int
    budget: int


class ForcedReturn(Result, frozen=True):
    """A branch ctxd returned by itself: its budget was spent or its deadline passed."""

    branch_id: str
    description: str
    status: str
    reason: str | None
    result: str | None
    """What it was folded with: its last assistant message, or a summary of its work."""


class ContextHealth(Result, frozen=True):
    """What happened to the session's branches since the connection's last tool result:
    added to the next one (docs/protocol.md, "MCP"), each notice once."""

    health: str
    budget_warnings: list[BudgetWarning]
    forced_returns: list[ForcedReturn]

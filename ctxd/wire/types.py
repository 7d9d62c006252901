"""msgspec types of every native method's params and results (docs/protocol.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

# gc=False: instances are not tracked by the cycle collector. They hold data only (never
# a reference back to themselves), and the daemon keeps many of them alive (a live
# branch's `Branch`, a session's messages): tracked, every full collection walked them all,
# a stall of 100+ ms with 10,000 live branches (docs/performance.md, "Folding").


class Params(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, gc=False):
    """Base of every native params type: unknown fields are an error that names them.

    Patterns end in ``\\Z``, not ``$``: ``$`` also matches before a trailing newline.
    """


class Result(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Base of every result type."""


SessionId = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z",
                                description="1-128 of A-Z a-z 0-9 . _ : - (first alphanumeric)")]
Ratio = Annotated[float, Meta(gt=0.0, le=1.0)]
Role = Literal["system", "user", "assistant", "tool"]
Component = Literal["system_prompt", "skill_prompts", "tool_descriptions", "conversation"]
COMPONENTS: tuple[Component, ...] = ("system_prompt", "skill_prompts", "tool_descriptions",
                                     "conversation")
Health = Literal["ok", "warn", "caution", "compact", "blocked"]
HEALTH_ORDER: tuple[Health, ...] = ("ok", "warn", "caution", "compact", "blocked")
"""The health levels, best first: a session's thresholds (`Budget`) tell them apart."""
SessionStateName = Literal["open", "closed"]
Compaction = Literal["cleared", "summarized", "truncated"]
"""What compaction did to a message it took out of its thread (docs/protocol.md,
"Compaction")."""
Strategy = Literal["clear", "summarize", "truncate"]
"""The compaction chain's strategies, in the order they run."""
Strategies = Annotated[list[Strategy], Meta(min_length=1, max_length=3)]
Text = Annotated[str, Meta(max_length=256)]
BranchId = Annotated[str, Meta(pattern=r"^br_[0-9a-f]{12}\Z",
                               description='"br_" and 12 lower-case hex digits')]
BranchStatus = Literal["active", "completed", "budget_exhausted", "timeout", "failed",
                       "discarded"]


# ---- shared shapes ------------------------------------------------------------------

class BudgetParams(Params, frozen=True):
    """Budget fields a client may set; each missing one takes the daemon's default."""

    context_window: ContextWindow | None = None
    max_output_tokens: OutputTokens | None = None
    compact_trigger: Ratio | None = None
    hard_block: Ratio | None = None
    warn: Ratio | None = None
    caution: Ratio | None = None


ContextWindow = Annotated[int, Meta(ge=1024, le=10_000_000)]
"""At most 10M tokens: a window no model has would only let one session grow without
bound (docs/security.md, "Resource limits")."""
OutputTokens = Annotated[int, Meta(ge=0, le=10_000_000)]
BranchBudget = Annotated[int, Meta(ge=1, le=32_768)]
BranchTimeout = Annotated[float, Meta(gt=0, le=600)]
BranchDescription = Annotated[str, Meta(min_length=1, max_length=500)]
BranchPrompt = Annotated[str, Meta(min_length=1, max_length=1_048_576)]
RETURN_MESSAGE_CHARS = 65_536
ReturnMessage = Annotated[str, Meta(min_length=1, max_length=RETURN_MESSAGE_CHARS)]
"""What a branch returns with: the fold message's text."""


class Budget(Result, frozen=True, forbid_unknown_fields=True):
    """A session's resolved budget; also the ``[budget]`` table of the configuration (the
    defaults a session gets). The thresholds must be in order: warn ≤ caution ≤
    compact_trigger ≤ hard_block."""

    context_window: ContextWindow = 200_000
    max_output_tokens: OutputTokens = 8_192
    compact_trigger: Ratio = 0.95
    hard_block: Ratio = 0.98
    warn: Ratio = 0.70
    caution: Ratio = 0.80

    @property
    def effective_window(self) -> int:
        """The tokens a prompt may use: context_window - max_output_tokens."""
        return self.context_window - self.max_output_tokens

    def health(self, usage: float) -> Health:
        """The health of a share of the window (or of a branch's budget) by these
        thresholds: ok < warn ≤ caution ≤ compact ≤ blocked."""
        if usage >= self.hard_block:
            return "blocked"
        if usage >= self.compact_trigger:
            return "compact"
        if usage >= self.caution:
            return "caution"
        if usage >= self.warn:
            return "warn"
        return "ok"


class ContextState(Result, frozen=True):
    """Where a session's context stands; carried by every session-scoped result."""

    session_id: str
    active_branch_id: str | None
    branch_depth: int
    branch_path: list[str]
    total_tokens: int
    main_thread_tokens: int
    current_branch_tokens: int
    current_branch_budget: int
    folded_tokens: int
    effective_window: int
    usage: float
    health: Health
    compact_failures: int = 0
    """Compactions in a row that did not shrink the context."""
    auto_compact_paused: bool = False
    """Three compactions in a row did not shrink it: ctxd no longer compacts this session by
    itself until a ``context.compact`` shrinks it (docs/protocol.md, "Compaction")."""


class SessionInfo(Result, frozen=True):
    session_id: str
    project: str | None
    title: str | None
    state: SessionStateName
    budget: Budget
    message_count: int
    total_tokens: int
    main_thread_tokens: int
    effective_window: int
    """``budget.effective_window``: what ``usage`` is a share of."""
    usage: float
    health: Health
    live_branches: int
    created_at: float
    updated_at: float
    closed_at: float | None


PageLimit = Annotated[int, Meta(ge=1, le=1000)]
"""The most items one call of a listing (``session.list``, ``message.list``, ``memory.list``,
``inject.list``, ``inject.pull``) returns."""
CURSOR_PATTERN = r"^[0-9]{1,18}\Z"
Cursor = Annotated[str, Meta(pattern=CURSOR_PATTERN)]
"""Where the next page of a listing starts (its ``next_cursor``)."""


# ---- daemon.* -----------------------------------------------------------------------

class Empty(Params, frozen=True):
    pass


class PingResult(Result, frozen=True):
    pong: bool
    ts: float


class HelloParams(Params, frozen=True):
    client: Text = ""
    protocol_features: list[Text] = []


class HelloResult(Result, frozen=True):
    name: str
    version: str
    protocol_version: int
    features: list[str]
    agreed_features: list[str]


class GatewayCall(Result, frozen=True):
    """A session's last model call through the gateway (docs/protocol.md, daemon.status)."""

    session_id: str
    model: str | None
    last_call_at: float
    sent_tokens: int
    """ctxd's count of the body it sent."""
    removed_tokens: int
    """Tokens ctxd's substitutions took out of that body."""
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost: float
    """In input-token units at Anthropic's ratios: input 1, cache write 1.25, cache read
    0.1, output 5."""


class GatewayInflight(Result, frozen=True):
    """A model call the gateway is making: ``request.cancel`` stops it by ``call_id``."""

    call_id: str
    session_id: str
    model: str | None
    started_at: float


class GatewayStatus(Result, frozen=True):
    listen: str
    """The address it serves on (the port chosen when the configured one is 0)."""
    base_url: str
    """``http://HOST:PORT/<token>``: what an agent's API base URL is set to."""
    calls: int
    rewrite_failures: int
    sessions: list[GatewayCall]
    """The last call of the sessions that called last, newest first (at most 20)."""
    inflight: list[GatewayInflight]
    """The model calls in flight, oldest first."""


class TeamLinkStatus(Result, frozen=True):
    """The link to the team database (``[memory.team]``; docs/decisions.md, "Team
    memory")."""

    name: str
    connected: bool
    outbox_depth: int
    """Writes to shared scopes the database has not applied yet."""
    last_change: int
    """The database's last change mirrored here."""
    lag_changes: int | None
    """Changes the database has that the mirror has not read (None: not connected)."""
    error: str | None
    """Why it is not connected (the password left out)."""


class DaemonStatus(Result, frozen=True):
    version: str
    pid: int
    uptime_s: float
    socket: str
    data_dir: str
    sessions_open: int
    sessions_total: int
    session_actors: int
    live_branches: int
    memories: int
    memory_index: MemoryIndexStatus
    connections: int
    requests_inflight: int
    subscribers: int
    db_size_bytes: int
    rss_bytes: int
    requests_total: int
    requests_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    bytes_inflight: int
    """Bytes held for clients: partial lines, requests at work, unread answers."""
    max_connections: int
    """Connections served at once: the configured number, or fewer when the open-files
    limit leaves room for fewer."""
    gateway: GatewayStatus | None
    """None when ``[gateway] enabled`` is false, or when it is off (``gateway_off``)."""
    team: TeamLinkStatus | None = None
    """None without ``[memory.team]``."""
    gateway_off: str | None = None
    """Why the enabled gateway is off (its port could not be bound), and what to do; None
    when it serves or is disabled."""


class ShutdownResult(Result, frozen=True):
    stopping: bool


class CheckResult(Result, frozen=True):
    database: str
    ok: bool
    problems: list[str]
    """What ``PRAGMA integrity_check`` found wrong (empty when ``ok``)."""
    seconds: float


# ---- session.* ----------------------------------------------------------------------

class SessionOpenParams(Params, frozen=True):
    session_id: SessionId | None = None
    project: Text | None = None
    title: Annotated[str, Meta(max_length=1024)] | None = None
    budget: BudgetParams | None = None
    fork_from: ForkFrom | None = None
    """A new session seeded with the forked context of another (docs/protocol.md,
    "context.fork")."""


class SessionIdParams(Params, frozen=True):
    session_id: SessionId


class SessionListParams(Params, frozen=True):
    project: Text | None = None
    state: SessionStateName | None = None
    limit: PageLimit = 50
    cursor: Cursor | None = None


class SessionResult(Result, frozen=True):
    session: SessionInfo
    context_state: ContextState


class SessionOpenResult(Result, frozen=True):
    session: SessionInfo
    created: bool
    context_state: ContextState
    fork: ForkSeedInfo | msgspec.UnsetType = msgspec.UNSET
    """With ``fork_from`` only: what seeded the session (docs/protocol.md, "context.fork")."""


class SessionListResult(Result, frozen=True):
    sessions: list[SessionInfo]
    next_cursor: str | None


class SessionDeleteResult(Result, frozen=True):
    session_id: str
    deleted: bool
    messages_deleted: int


# ---- message.* ----------------------------------------------------------------------

Content = str | list[dict[str, Any]]


class MessageIn(Params, frozen=True):
    role: Role
    content: Content
    name: Annotated[str, Meta(max_length=256)] | None = None
    tool_call_id: Annotated[str, Meta(max_length=256)] | None = None
    component: Component | None = None
    meta: dict[str, Any] | None = None


class MessageAppendParams(Params, frozen=True):
    """An append as the session makes it: messages in ctxd's own form (`AppendRequest`'s
    are brought to it first)."""

    session_id: SessionId
    messages: Annotated[list[MessageIn], Meta(min_length=1, max_length=10_000)]
    branch_id: BranchId | None = None
    allow_over: bool = False


CallId = Annotated[str, Meta(min_length=1, max_length=256)]


class FunctionCallIn(Params, frozen=True):
    name: Annotated[str, Meta(min_length=1, max_length=256)]
    arguments: str
    """The call's arguments as the model wrote them: JSON text (an object)."""


class ToolCallIn(Params, frozen=True):
    """A tool call of an assistant message in OpenAI Chat Completions' shape."""

    id: CallId
    type: Literal["function"]
    function: FunctionCallIn


class AppendMessage(Params, frozen=True):
    """A message as ``message.append`` takes it: ctxd's form (`MessageIn`), an OpenAI Chat
    Completions message (an assistant's ``tool_calls``, its ``content`` null), or an
    Anthropic Messages one (``tool_use`` and ``tool_result`` blocks) (docs/protocol.md,
    "Provider shapes")."""

    role: Role
    content: Content | msgspec.UnsetType | None = msgspec.UNSET
    """Required, but for an assistant message with ``tool_calls`` (null or left out)."""
    name: Annotated[str, Meta(max_length=256)] | None = None
    tool_call_id: Annotated[str, Meta(max_length=256)] | None = None
    component: Component | None = None
    meta: dict[str, Any] | None = None
    tool_calls: Annotated[list[ToolCallIn], Meta(max_length=1_000)] | None = None


class AppendRequest(Params, frozen=True):
    """``message.append``'s params."""

    session_id: SessionId
    messages: Annotated[list[AppendMessage], Meta(min_length=1, max_length=10_000)]
    branch_id: BranchId | None = None
    allow_over: bool = False


class AppendedMessage(Result, frozen=True, omit_defaults=True):
    seq: int
    tokens: int
    component: Component
    ref_id: str | None = None
    """An offloaded tool result's ref (absent when the message was stored inline)."""
    stub: str | None = None
    """What an offloaded tool result stores and renders as (absent when inline)."""


class ForcedReturn(Result, frozen=True):
    """A branch that ctxd returned by itself (budget, deadline, parent or session gone)."""

    branch_id: str
    status: BranchStatus
    reason: str
    result: str


class MessageAppendResult(Result, frozen=True):
    appended: list[AppendedMessage]
    tokens_appended: int
    forced_returns: list[ForcedReturn]
    context_state: ContextState
    compactions: list[CompactResult] = []
    """Compactions ctxd ran by itself: before the append (it would have passed the hard
    block) and after it (it reached the compact trigger)."""


class MessageListParams(Params, frozen=True):
    session_id: SessionId
    branch_id: BranchId | None = None
    cursor: Cursor | None = None
    limit: PageLimit = 100


class StoredMessage(Result, frozen=True, omit_defaults=True):
    seq: int
    role: Role
    content: Content
    component: Component
    tokens: int
    created_at: float
    name: str | None = None
    tool_call_id: str | None = None
    meta: dict[str, Any] | None = None
    branch_id: str | None = None
    discarded: bool = False
    ref_id: str | None = None
    """An offloaded tool result's ref (`result.read`): ``ctxd.render`` shows its stub, and
    ``message.list`` its whole content."""
    compaction: Compaction | None = None
    """Set when compaction took the message out of its thread (it stays here)."""
    replaced_by: int | None = None
    """The seq of the message that stands for it in the thread since (with ``compaction``)."""
    at_seq: int | None = None
    """Where a message that compaction wrote sits in its thread: the seq of the first
    message it stands for."""


class MessageListResult(Result, frozen=True):
    messages: list[StoredMessage]
    next_cursor: str | None
    context_state: ContextState


# ---- result.read ------------------------------------------------------------------

RefId = Annotated[str, Meta(pattern=r"^res_[0-9a-f]{16}\Z",
                            description='"res_" and 16 lower-case hex digits')]
ReadOffset = Annotated[int, Meta(ge=0)]
ReadLimit = Annotated[int, Meta(ge=1, le=1_048_576)]
"""Characters of an offloaded result one read returns at most."""
ReadPattern = Annotated[str, Meta(min_length=1, max_length=1_000)]
MaxMatches = Annotated[int, Meta(ge=1, le=1_000)]


class ResultReadParams(Params, frozen=True):
    """Read an offloaded tool result: a page of ``limit`` characters from ``offset``, or
    with ``pattern`` its matching lines (at most ``max_matches``)."""

    ref_id: RefId
    session_id: SessionId | None = None
    """None: the session that holds ``ref_id`` (a ref is unique across sessions)."""
    offset: ReadOffset | msgspec.UnsetType = msgspec.UNSET
    """Unset: 0."""
    limit: ReadLimit | msgspec.UnsetType = msgspec.UNSET
    """Unset: 8,000 characters."""
    pattern: ReadPattern | None = None
    literal: bool = False
    """``pattern`` is plain text, not a regular expression."""
    max_matches: MaxMatches = 100


class LineMatch(Result, frozen=True):
    line: int
    """1-based, as ``grep -n`` numbers lines."""
    text: str
    truncated: bool
    """The line was longer than what is shown of it."""


class ResultReadResult(Result, frozen=True):
    ref_id: str
    tool_name: str | None
    size_bytes: int
    total_chars: int
    seq: int
    branch_id: str | None
    offset: int = 0
    content: str | None = None
    """The page (without ``pattern``)."""
    next_offset: int | None = None
    """Where the next page starts; absent at the end."""
    matches: list[LineMatch] | None = None
    """The matching lines (with ``pattern``), in order."""
    matched_lines: int = 0
    more_matches: int = 0
    """Matching lines beyond ``max_matches``, not returned."""


# ---- ctxd.render / budget.measure ---------------------------------------------------

RenderFormat = Literal["ctxd", "openai", "anthropic"]


class RenderParams(Params, frozen=True):
    session_id: SessionId
    branch_id: BranchId | msgspec.UnsetType | None = msgspec.UNSET
    """Unset: the active thread (what to send now); null: the main thread."""
    format: RenderFormat = "ctxd"
    """``openai`` / ``anthropic``: the messages in that provider's shape, as its API takes
    them (docs/protocol.md, "Provider shapes")."""


class RenderedMessage(Result, frozen=True, omit_defaults=True):
    role: Role
    content: Content
    name: str | None = None
    tool_call_id: str | None = None


class RenderStats(Result, frozen=True):
    message_count: int
    stored_messages: int
    message_tokens: int
    reply_priming_tokens: int


class RenderResult(Result, frozen=True):
    branch_id: str | None
    """The thread rendered: a branch, or null for the main thread."""
    messages: list[RenderedMessage]
    tokens: int
    context_state: ContextState
    stats: RenderStats
    tools: list[ToolDefinition] = []
    """The session's active tool definitions (all registered ones but the deferred), in
    registration order (docs/protocol.md, "Tool deferral")."""
    tool_tokens: int = 0
    """Exact tokens of ``tools``, counted as budget.measure's ``tool_descriptions``."""
    tools_note: str | None = None
    """``[N tools deferred to save context. Use tool_search to find them.]`` when some are."""
    context_note: str | None = None
    """``[Context: 83% used. …]`` above the session's ``warn`` threshold (``[hygiene]
    context_note``): not a message, so that a cached prefix stays as it is."""


class ProviderRenderResult(Result, frozen=True):
    """``ctxd.render`` with ``format`` ``openai`` or ``anthropic``: what `RenderResult`
    says, the messages and tools in the provider's shape."""

    format: RenderFormat
    branch_id: str | None
    messages: list[dict[str, Any]]
    system: str | None
    """Anthropic: the system messages' text, for the request's ``system`` (null: none);
    always null for OpenAI, whose system messages stay among the messages."""
    tokens: int
    context_state: ContextState
    stats: RenderStats
    tools: list[dict[str, Any]]
    tool_tokens: int
    tools_note: str | None
    context_note: str | None


# ---- context.compact, session.resume (docs/protocol.md, "Compaction") ------------------

class ContextCompactParams(Params, frozen=True):
    session_id: SessionId
    branch_id: BranchId | None = None
    """The thread to compact: a live branch's own messages, or (null) the main thread."""
    strategies: Strategies | None = None
    """Which strategies may run (always in the chain's order); null: all three."""


class CompactResult(Result, frozen=True):
    """What one compaction did (``context.compact``, and the automatic one an append or a
    fold may run)."""

    branch_id: str | None
    before_tokens: int
    after_tokens: int
    tokens_recovered: int
    target_tokens: int
    """Tokens the chain aimed to bring the rendered thread under."""
    before_msgs: int
    after_msgs: int
    """Messages of the thread (a branch: its own), before and after."""
    strategies_run: list[Strategy]
    cleared: int = 0
    summarized: int = 0
    truncated: int = 0
    summarizer: str | None = None
    summarizer_error: str | None = None
    """Why the summarizer failed (the chain went on to truncation)."""
    snapshot_saved: bool = False
    automatic: bool = False


class ContextCompactResult(CompactResult, frozen=True, kw_only=True):
    context_state: ContextState
    coalesced: bool = False
    """This request shared the compaction of an identical one queued or running before it
    (docs/protocol.md, "Compaction"): the figures are that compaction's."""


class SessionResumeResult(Result, frozen=True):
    session_id: str
    source: Literal["snapshot", "thread"]
    """``snapshot``: the thread as the latest compaction left it, then what came after;
    ``thread``: the main thread as it is (the session was never compacted, or its latest
    snapshot could not be saved)."""
    compacted_at: float | None
    messages: list[RenderedMessage]
    tokens: int
    context_state: ContextState


class BudgetMeasureParams(Params, frozen=True):
    session_id: SessionId
    system_prompt: str | None = None
    skill_prompts: list[str] | None = None
    tool_definitions: list[dict[str, Any]] | None = None


class BudgetMeasureResult(Result, frozen=True):
    total: int
    max_output_tokens: int
    effective_window: int
    system_prompt: int
    skill_prompts: int
    tool_descriptions: int
    conversation: int
    used: int
    remaining: int
    used_pct: float
    should_compact: bool
    is_blocked: bool
    context_state: ContextState


# ---- branch.* (context folding: docs/protocol.md) -------------------------------------

class BranchCreateParams(Params, frozen=True):
    session_id: SessionId
    description: BranchDescription
    prompt: BranchPrompt
    budget: BranchBudget | None = None
    timeout_seconds: BranchTimeout | None = None
    inject_memories: bool = True
    parent_branch_id: BranchId | msgspec.UnsetType | None = msgspec.UNSET
    """Unset: the session's active branch (or the main thread); null: the main thread."""


class InjectedItem(Result, frozen=True):
    """A memory put in a model's context: its text itself, so that whoever reads the
    answer (an MCP agent, a hook) has what was counted as shown."""

    type: Literal["memory"]
    id: int
    """The memory's id (memory.get)."""
    title: str
    content: str
    tokens: int
    """Its block's tokens in the injected text (its head and its content)."""


class Injection(Result, frozen=True):
    """What memory injection did for a new branch, and why."""

    status: Literal["injected", "none_found", "disabled", "failed"]
    reason: str | None
    tokens: int
    budget: int


class BranchCreateResult(Result, frozen=True):
    branch_id: str
    parent_branch_id: str | None
    depth: int
    budget_allocated: int
    budget_used: int
    parent_budget_remaining: int
    timeout_seconds: float
    deadline: float
    injected_context: list[InjectedItem]
    injection: Injection
    created_at: float
    context_state: ContextState


class BranchIdParams(Params, frozen=True):
    branch_id: BranchId


class BranchReturnParams(Params, frozen=True):
    branch_id: BranchId
    message: ReturnMessage
    extract_memory: bool = False


class FoldSummary(Result, frozen=True):
    tokens_folded: int
    tokens_saved: int
    operations_count: int
    secrets_scrubbed: int
    summary_redacted: bool
    summary_truncated: bool
    """The fold message shows the result cut to ``max_fold_tokens`` (head and tail kept);
    the whole result is the branch's ``result`` (branch.status)."""


class BranchReturnResult(Result, frozen=True):
    success: bool
    branch_id: str
    parent_branch_id: str | None
    folded_at: float
    fold_seq: int
    tokens_used: int
    summary: FoldSummary
    memory_queued: bool
    forced_returns: list[ForcedReturn]
    context_state: ContextState


class Branch(Result, frozen=True):
    """A branch, as stored in ``branches`` (column for column) and as every method shows
    it. ``deadline`` is wall-clock time; ``time_left_s`` is set on live branches only."""

    branch_id: str
    session_id: str
    parent_branch_id: str | None
    depth: int
    description: str
    status: BranchStatus
    return_reason: str | None
    budget: int
    budget_used: int
    budget_remaining: int
    """``budget - budget_used``, at least 0 (set with the meter: see ``ctxd.folding``)."""
    budget_warned: bool
    operations_count: int
    timeout_seconds: float
    created_at: float
    deadline: float
    fork_seq: int
    prefix_tokens: int
    """Tokens of the parent thread's rendered prefix that the branch's context starts with."""
    returned_at: float | None = None
    result: str | None = None
    fold_seq: int | None = None
    tokens_folded: int | None = None
    tokens_saved: int | None = None
    secrets_scrubbed: int | None = None
    time_left_s: float | None = None


class BranchStatusResult(Result, frozen=True):
    branch: Branch
    context_state: ContextState


class BranchListParams(Params, frozen=True):
    session_id: SessionId
    status: BranchStatus | None = None


class BranchListResult(Result, frozen=True):
    branches: list[Branch]
    total: int
    active: int
    folded: int
    context_state: ContextState


class BranchRollbackParams(Params, frozen=True):
    session_id: SessionId
    branch_id: BranchId


class BranchRollbackResult(Result, frozen=True):
    rolled_back_to: int
    thread: str | None
    branches_discarded: list[str]
    messages_discarded: int
    tokens_recovered: int
    context_state: ContextState


# ---- memory.* (docs/protocol.md, Memory) ----------------------------------------------

SCOPE_PATTERN = r"^(global|(project|team|org):[^\s]{1,128})\Z"
Scope = Annotated[str, Meta(pattern=SCOPE_PATTERN,
                            description='"global" or "<project|team|org>:<name>"')]
SHARED_SCOPES = ("team:", "org:")
"""The prefixes of the scopes a team database holds (docs/decisions.md, "Team memory")."""


def project_scope(project: str | None) -> str:
    """The memory scope of a session's project (whitespace becomes ``-``), else global."""
    if not project or not project.split():
        return "global"
    return "project:" + "-".join(project.split())[:128]


Outcome = Literal["success", "failure"]
MemoryId = Annotated[int, Meta(ge=1, le=2**62)]
MemoryTitle = Annotated[str, Meta(min_length=1, max_length=500)]
"""Not blank either: `memory.record` refuses a title of whitespace only (a pattern here
would go into the tool's schema, in every model request)."""
MemoryContent = Annotated[str, Meta(min_length=1, max_length=65_536)]
"""Not blank either, as `MemoryTitle`."""
MemoryDescription = Annotated[str, Meta(max_length=2_000)]
TAG_PATTERN = r"^\S{1,64}\Z"
Tag = Annotated[str, Meta(pattern=TAG_PATTERN)]
Tags = Annotated[list[Tag], Meta(max_length=32)]
MemoryQuery = Annotated[str, Meta(min_length=1, max_length=8_192)]
"""What ``memory.search`` and ``memory.context`` look for."""
SearchK = Annotated[int, Meta(ge=1, le=100)]
Confidence = Annotated[float, Meta(ge=0.0, le=1.0)]
SearchMode = Literal["hybrid", "lexical", "dense"]
Leg = Literal["lexical", "dense"]


class MemoryItem(Result, frozen=True):
    id: int
    scope: str
    title: str
    description: str
    content: str
    outcome: Outcome
    tags: list[str]
    confidence: float
    usage_count: int
    source: str | None
    created_at: float
    updated_at: float


class MemoryRecordParams(Params, frozen=True):
    title: MemoryTitle
    content: MemoryContent
    description: MemoryDescription = ""
    scope: Scope = "global"
    outcome: Outcome = "success"
    tags: Tags = []


class MemoryRecordResult(Result, frozen=True):
    memory: MemoryItem
    secrets_scrubbed: int
    indexed: bool


class MemorySearchParams(Params, frozen=True):
    query: MemoryQuery
    scope: Scope | None = None
    k: SearchK = 5
    min_confidence: Confidence = 0.0
    mode: SearchMode = "hybrid"


class SearchHit(Result, frozen=True):
    id: int
    title: str
    description: str
    content: str
    scope: str
    confidence: float
    score: float
    legs: list[Leg]


class MemorySearchResult(Result, frozen=True):
    results: list[SearchHit]
    mode: SearchMode
    legs_used: list[Leg]
    note: str | None


class MemoryIdParams(Params, frozen=True):
    id: MemoryId


SHARED_SCOPE_PATTERN = r"^(team|org):[^\s]{1,128}\Z"
SharedScope = Annotated[str, Meta(pattern=SHARED_SCOPE_PATTERN,
                                  description='"team:<name>" or "org:<name>"')]
PATTERN_MEANINGS = {
    SCOPE_PATTERN: '"global" or "<project|team|org>:<name>" (a name of 1-128 characters, '
                   "no whitespace)",
    SHARED_SCOPE_PATTERN: '"team:<name>" or "org:<name>" (a name of 1-128 characters, no '
                          "whitespace)",
    TAG_PATTERN: "one word of 1-64 characters (no whitespace)",
    CURSOR_PATTERN: "a next_cursor as an earlier page gave it",
}
"""What a params error says a text of these patterns should be, where the type's own
description (which a tool's schema carries into every model request) is shorter or
none."""


class MemoryShareParams(Params, frozen=True):
    id: MemoryId
    scope: SharedScope
    """The shared scope it moves to (the team's: ``[memory.team] name``)."""


class MemoryFeedbackParams(Params, frozen=True):
    id: MemoryId
    helpful: bool


class MemoryOutcomeParams(Params, frozen=True):
    id: MemoryId
    succeeded: bool


class MemoryResult(Result, frozen=True):
    memory: MemoryItem


class MemoryDeleteResult(Result, frozen=True):
    id: int
    deleted: bool


class MemoryListParams(Params, frozen=True):
    scope: Scope | None = None
    limit: PageLimit = 50
    cursor: Cursor | None = None


class MemoryListResult(Result, frozen=True):
    memories: list[MemoryItem]
    next_cursor: str | None


class MemoryIndexStatus(Result, frozen=True):
    state: Literal["loading", "rebuilding", "ready", "unavailable"]
    reason: str | None
    vectors: int
    memories: int
    embedder: str
    lexical: Literal["loading", "ready"]
    whole: bool
    """Both legs ready: every memory in the dense index and the lexical ranking loaded, so
    a search sees all of them at full speed (docs/protocol.md, memory.reindex)."""


# ---- prompt.build (docs/protocol.md, Prompt builder) -----------------------------------

SectionName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z",
                                  description="1-64 of A-Z a-z 0-9 . _ - (first alphanumeric)")]
PROMPT_FORMATS = ("openai", "anthropic")
"""What ``prompt.build`` can return besides the text (checked by the method, which names
them in its error)."""


class PromptSection(Params, frozen=True):
    name: SectionName
    content: Annotated[str, Meta(min_length=1, max_length=1_048_576)]
    cacheable: bool | None = None
    """Unset: the default of a known name (docs/protocol.md, Prompt builder); else false."""


class PromptBuildParams(Params, frozen=True):
    session_id: SessionId | None = None
    sections: Annotated[list[PromptSection], Meta(min_length=1, max_length=32)] | None = None
    format: Annotated[str, Meta(max_length=64)] = "openai"


class PromptSectionInfo(Result, frozen=True):
    name: str
    cacheable: bool
    tokens: int
    """Exact tokens of the section's content alone (what its ``system`` block costs)."""
    offset: int
    """Where the content starts in ``text``, in characters (Unicode code points)."""
    length: int


class CacheBreakpoint(Result, frozen=True):
    section: str
    """The cacheable section the breakpoint follows."""
    index: int
    offset: int
    """The end of that section's content in ``text``, in characters: ``text[:offset]`` is
    the prefix cached there."""
    prefix_tokens: int


class SystemBlock(Result, frozen=True, omit_defaults=True):
    type: Literal["text"]
    text: str
    cache_control: dict[str, str] | None = None


class PromptBuildResult(Result, frozen=True):
    format: str
    text: str
    tokens: int
    sections: list[PromptSectionInfo]
    cache_breakpoints: list[CacheBreakpoint]
    system: list[SystemBlock] | None
    """The ``system`` blocks of an Anthropic Messages request (format ``anthropic``),
    else null."""


# ---- tools.* (tool deferral) --------------------------------------------------------

ToolSource = Literal["builtin", "mcp", "skill"]
TOOL_SOURCES: tuple[ToolSource, ...] = ("builtin", "mcp", "skill")


class ToolDefinition(Params, frozen=True):
    """A tool definition as the model sees it (``source`` aside: what deferral ranks by)."""

    name: Annotated[str, Meta(min_length=1, max_length=256)]
    description: Annotated[str, Meta(max_length=65_536)]
    input_schema: dict[str, Any]
    source: ToolSource


class ToolsRegisterParams(Params, frozen=True):
    session_id: SessionId
    tools: Annotated[list[ToolDefinition], Meta(min_length=1, max_length=2_000)]


class RegisteredTool(Result, frozen=True):
    name: str
    tokens: int
    replaced: bool


class ToolsRegisterResult(Result, frozen=True):
    registered: list[RegisteredTool]
    total_tools: int
    total_tokens: int
    threshold_tokens: int
    """Above this many tokens of definitions, tools are deferred."""
    deferred: list[str]
    """The tools the next render leaves out."""


ToolQuery = Annotated[str, Meta(min_length=1, max_length=1_000)]
ToolSearchLimit = Annotated[int, Meta(ge=1, le=50)]


class ToolsSearchParams(Params, frozen=True):
    session_id: SessionId
    query: ToolQuery
    limit: ToolSearchLimit = 5


class ToolMatch(Result, frozen=True):
    name: str
    source: ToolSource
    description: str
    input_schema: dict[str, Any]
    """The tool's input schema as registered: what a model needs to call it."""
    score: float
    tokens: int


class ToolsSearchResult(Result, frozen=True):
    matches: list[ToolMatch]
    """Deferred tools that match, best first; each is promoted into the next render."""
    deferred: int
    """How many tools are deferred after the promotion (promoted tools stay in, and may
    push out others to keep under the threshold)."""


# ---- events.* -----------------------------------------------------------------------

class EventsSubscribeParams(Params, frozen=True):
    session_id: SessionId | None = None
    types: Annotated[list[Text], Meta(max_length=64)] | None = None
    since_seq: Annotated[int, Meta(ge=0)] | None = None


class EventsSubscribeResult(Result, frozen=True):
    subscription_id: str
    seq: int


class EventsUnsubscribeParams(Params, frozen=True):
    subscription_id: Annotated[str, Meta(max_length=64)]


class EventsUnsubscribeResult(Result, frozen=True):
    unsubscribed: bool


class Event(Result, frozen=True):
    """One `event` notification: ``seq`` is monotonic per daemon."""

    seq: int
    ts: float
    session_id: str | None
    type: str
    data: dict[str, Any]


# ---- usage.* and tool.* (docs/protocol.md, "Usage" and "Tool states") ----------------

Tokens = Annotated[int, Meta(ge=0, le=1 << 40)]
USAGE_COUNTERS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
                  "thinking_tokens")
"""The counters of a usage record, in the order they are shown."""
UsageGroupBy = Literal["model", "branch", "day"]


class UsageRecordParams(Params, frozen=True):
    session_id: SessionId
    branch_id: BranchId | None = None
    request_id: Text | None = None
    model: Text | None = None
    input_tokens: Tokens | None = None
    output_tokens: Tokens | None = None
    cache_read_tokens: Tokens | None = None
    cache_write_tokens: Tokens | None = None
    thinking_tokens: Tokens | None = None
    idempotency_key: Text | None = None


class UsageEntry(Result, frozen=True):
    """One recorded LLM call (counters not given are 0)."""

    usage_id: int
    session_id: str
    branch_id: str | None
    request_id: str | None
    model: str | None
    idempotency_key: str | None
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    thinking_tokens: int
    local_input_tokens: int
    """ctxd's count of the thread's rendered tokens when the call was recorded."""
    recorded_at: float


class UsageRecordResult(Result, frozen=True):
    record: UsageEntry
    duplicate: bool
    """The idempotency key was recorded before: ``record`` is that first record."""


class UsageGetParams(Params, frozen=True):
    session_id: SessionId
    branch_id: BranchId | None = None
    group_by: UsageGroupBy | None = None


class UsageTotals(Result, frozen=True):
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    thinking_tokens: int
    calls: int


class UsageCost(Result, frozen=True):
    """Cost in the price table's currency, per counter and in total (of the priced calls)."""

    input_tokens: float
    output_tokens: float
    cache_read_tokens: float
    cache_write_tokens: float
    thinking_tokens: float
    total: float
    unpriced_calls: int
    """Calls whose model has no price (not in the cost)."""


class UsageGroup(Result, frozen=True):
    key: str | None
    """The model, the branch (None: the main thread) or the UTC day (YYYY-MM-DD)."""
    totals: UsageTotals
    cost: UsageCost | None


class Calibration(Result, frozen=True):
    """The latest call's reported input tokens beside ctxd's own count at that time."""

    usage_id: int
    input_tokens: int
    local_input_tokens: int
    ratio: float | None
    """``input_tokens / local_input_tokens`` rounded to 4 places (None when either is 0)."""


class UsageGetResult(Result, frozen=True):
    session_id: str
    branch_id: str | None
    totals: UsageTotals
    cost: UsageCost | None
    """None when no call's model has a price in ``[usage] prices``."""
    group_by: UsageGroupBy | None
    groups: list[UsageGroup] | None
    calibration: Calibration | None


ToolCallState = Literal["pending", "awaiting_approval", "running", "completed", "failed",
                        "denied", "timeout", "cancelled"]
TOOL_CALL_STATES: tuple[ToolCallState, ...] = (
    "pending", "awaiting_approval", "running", "completed", "failed", "denied", "timeout",
    "cancelled")
TERMINAL_TOOL_STATES = frozenset({"completed", "failed", "denied", "timeout", "cancelled"})
ToolCallId = Annotated[str, Meta(min_length=1, max_length=256)]


class ToolStateParams(Params, frozen=True):
    session_id: SessionId
    tool_call_id: ToolCallId
    state: ToolCallState
    detail: Annotated[str, Meta(max_length=4_096)] | None = None
    tool_name: Text | None = None


class ToolStateEntry(Result, frozen=True):
    """One state a tool call entered, and how long it stayed (None: it is still in it)."""

    state: ToolCallState
    entered_at: float
    detail: str | None
    seconds: float | None


class ToolCall(Result, frozen=True):
    tool_call_id: str
    tool_name: str | None
    state: ToolCallState
    terminal: bool
    created_at: float
    updated_at: float
    history: list[ToolStateEntry]
    seconds_in_state: dict[str, float]
    """Seconds spent in each state entered (the current one up to now, unless final)."""


class ToolStateResult(Result, frozen=True):
    tool_call: ToolCall
    previous_state: ToolCallState | None
    """None: this call created the tool call."""


class ToolGetParams(Params, frozen=True):
    session_id: SessionId
    tool_call_id: ToolCallId


class ToolGetResult(Result, frozen=True):
    tool_call: ToolCall


class ToolListParams(Params, frozen=True):
    session_id: SessionId
    state: ToolCallState | None = None


class ToolListResult(Result, frozen=True):
    tool_calls: list[ToolCall]
    """Oldest first."""
# ---- inject.* (docs/protocol.md, "Injection") ---------------------------------------

InjectPriority = Literal["immediate", "normal", "deferred"]
"""Priorities of an injection, most urgent first: inject.pull hands them out in this order."""
INJECT_PRIORITIES: tuple[InjectPriority, ...] = ("immediate", "normal", "deferred")
InjectState = Literal["pending", "delivered", "accepted", "rejected"]
IdempotencyKey = Annotated[str, Meta(min_length=1, max_length=128)]


class InjectPushParams(Params, frozen=True):
    session_id: SessionId
    content: Annotated[str, Meta(min_length=1, max_length=1_000_000)]
    priority: InjectPriority = "normal"
    source: Text | None = None
    idempotency_key: IdempotencyKey | None = None


class InjectPushResult(Result, frozen=True):
    injection_id: str
    duplicate: bool
    """True: a push with this idempotency_key was already taken; this is its injection."""
    state: InjectState
    priority: InjectPriority
    tokens: int
    """Exact tokens of the (scrubbed) content as a user message."""
    secrets_scrubbed: int


class InjectPullParams(Params, frozen=True):
    session_id: SessionId
    max_priority: InjectPriority = "deferred"
    """The least urgent priority handed out (``normal``: immediate and normal only)."""
    limit: PageLimit = 100


class InjectionInfo(Result, frozen=True):
    """An injection as inject.pull and inject.list show it."""

    injection_id: str
    session_id: str
    priority: InjectPriority
    content: str
    source: str | None
    tokens: int
    state: InjectState
    created_at: float
    deliveries: int
    delivered_at: float | None
    acked_at: float | None
    reason: str | None


class InjectPullResult(Result, frozen=True):
    injections: list[InjectionInfo]
    """Delivered now, priority then arrival order; ``deliveries`` > 1 is a redelivery."""
    waiting: int
    """Injections of the session still waiting (pending or delivered, not acknowledged)."""


class InjectAckParams(Params, frozen=True):
    injection_id: Annotated[str, Meta(pattern=r"^inj_[0-9a-f]{16}\Z",
                                      description='"inj_" and 16 lower-case hex digits')]
    accepted: bool
    reason: Annotated[str, Meta(max_length=4_096)] | None = None


class InjectAckResult(Result, frozen=True):
    injection: InjectionInfo
    already_acked: bool
    """True: this answer had been recorded before (the ack was repeated)."""


class InjectListParams(Params, frozen=True):
    session_id: SessionId
    state: InjectState | None = None
    limit: PageLimit = 100


class InjectListResult(Result, frozen=True):
    injections: list[InjectionInfo]
    """Oldest first (the ``state`` given, or every state)."""
    counts: dict[str, int]
    """The session's injections by state (every state, whatever ``state`` filters)."""
# ---- cancellation: request.cancel, turn.* ---------------------------------------------

JsonRpcId = Annotated[str, Meta(min_length=1, max_length=128)] | int
Reason = Annotated[str, Meta(max_length=1024)]
TurnId = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z",
                             description="the agent's own id for one of its turns")]


class RequestCancelParams(Params, frozen=True):
    request_id: JsonRpcId
    reason: Reason | None = None


class RequestCancelResult(Result, frozen=True):
    request_id: str | int
    cancelled: int
    """Requests stopped: their callers have -32006."""
    finishing: int
    """Requests with this id past their commit point: they are answered as done."""


class TurnRef(Params, frozen=True):
    session_id: SessionId
    turn_id: TurnId


class TurnCancelParams(Params, frozen=True):
    session_id: SessionId
    turn_id: TurnId
    reason: Reason | None = None


class TurnEndParams(Params, frozen=True):
    session_id: SessionId
    turn_id: TurnId
    cancelled: bool = False


class TurnListParams(Params, frozen=True):
    session_id: SessionId


class Turn(Result, frozen=True):
    session_id: str
    turn_id: str
    state: Literal["running", "cancel_requested", "ended"]
    started_at: float
    cancel_requested_at: float | None
    cancel_reason: str | None
    ended_at: float | None
    cancelled: bool | None
    """The agent's answer at turn.end: whether it stopped the turn (None while running, or
    when it never answered)."""
    terminated: bool = False
    """ctxd ended it: its cancel had no turn.end within ``cancel_timeout_s``."""


class TurnListResult(Result, frozen=True):
    turns: list[Turn]


# ---- Claude Code hooks ----

class MemoryContextParams(Params, frozen=True):
    """The memories that match ``query``, fitted into ``max_tokens`` (default: the
    ``[memory] hook_inject_tokens`` of the configuration) as one block of text."""

    query: MemoryQuery
    scope: Scope | None = None
    max_tokens: Annotated[int, Meta(ge=1, le=100_000)] | None = None
    session_id: SessionId | None = None
    """The session the text goes to: a memory it was given already is left out, and those
    given are remembered with it (docs/protocol.md, "Claude Code hooks")."""
    compacted: bool = False
    """The session's agent compacted its context since the last call: what was given
    before is gone from it, and may be given again."""


class MemoryContextResult(Result, frozen=True):
    text: str | None
    """The block to add to the model's context (None: nothing fits or matched)."""
    tokens: int
    items: list[InjectedItem]
    injection: Injection


LogLevel = Literal["debug", "info", "warning", "error"]


class DaemonLogParams(Params, frozen=True):
    """One line for ctxd's log from a client (a hook that failed open)."""

    source: Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}\Z",
                                description="1-64 of A-Z a-z 0-9 . _ : - (first alphanumeric)")]
    message: Annotated[str, Meta(min_length=1, max_length=2_000)]
    level: LogLevel = "warning"


class DaemonLogResult(Result, frozen=True):
    logged: bool
    """False when the line was dropped: too many lines came in the last minute."""


# ---- transcript importers (docs/protocol.md, "transcript.import") ----

TranscriptFormat = Literal["claude-code", "opencode"]


class TranscriptImportParams(Params, frozen=True):
    format: TranscriptFormat
    path: Annotated[str, Meta(min_length=1, max_length=4096)]
    """An absolute path the daemon can read (same user as the caller)."""
    session_id: SessionId | None = None
    """Default: the transcript's own session id (Claude Code ``sessionId``, OpenCode
    ``info.id``)."""
    project: Annotated[str, Meta(max_length=256)] | None = None
    restart: bool = False
    """Import a replaced or truncated file from its start (what was imported stays)."""
    subagents: bool = True
    """Claude Code: import the sub-agent files beside the transcript too (false: the
    transcript alone; the hooks record each sub-agent as it runs)."""


class MalformedLine(Result, frozen=True, omit_defaults=True):
    line: int
    error: str
    path: str | None = None
    """The sub-agent file it is in (None: the file imported)."""


class TranscriptImportResult(Result, frozen=True):
    session_id: str
    format: TranscriptFormat
    path: str
    created: bool
    """The import opened a new session."""
    restarted: bool
    lines_read: int
    """Lines (Claude Code) or messages (OpenCode) read by this import, blank lines too."""
    messages_added: int
    tool_results: int
    usage_records: int
    usage_duplicates: int
    """Usage already recorded under the same message id (an earlier import)."""
    already_recorded: int
    """Messages the live hooks had recorded (``meta.live``: prompts, tool calls, tool
    results), not appended again."""
    branches: int
    compactions: int
    """Compaction records found (``compact_boundary``, ``isCompactSummary``, OpenCode
    ``summary`` messages)."""
    malformed: list[MalformedLine]
    unknown_kept: dict[str, int]
    bytes_read: int
    """Of the file and its sub-agent files."""
    offset: int
    size: int
    subagent_files: int = 0
    """Claude Code sub-agent files found beside the transcript and imported
    (``<dir>/<session id>/subagents/agent-*.jsonl``)."""


# ---- context.fork, session.open's fork_from (docs/protocol.md, "context.fork") ---------

MAX_FORK_CHARS = 2_000_000
"""The largest ``char_budget`` / ``no_removal_chars``: ten times the default budget bounds
a fork's work (its formatted context and the exact count of its tokens)."""
ForkChars = Annotated[int, Meta(ge=1, le=MAX_FORK_CHARS)]


class ForkFrom(Params, frozen=True):
    """The session (and thread) whose forked context seeds a new session."""

    session_id: SessionId
    branch_id: BranchId | None = None


class ContextForkParams(Params, frozen=True):
    session_id: SessionId
    branch_id: BranchId | None = None
    """The thread to fork: a branch's own messages, or (null) the main thread."""
    char_budget: ForkChars = 200_000
    """Above it, the oldest messages are removed until the context fits."""
    no_removal_chars: ForkChars = 120_000
    """A context of at most this many characters is never cut (≤ ``char_budget``)."""


class TierDistribution(Result, frozen=True):
    tier1: int
    """Tool results kept whole (the newest 5)."""
    tier2: int
    """Tool results cut to 3,000 characters (the next 10)."""
    tier3: int
    """Tool results cut to 500 characters (the rest)."""


class ForkStats(Result, frozen=True):
    """What the fork pipeline did (docs/protocol.md, "context.fork")."""

    original_count: int
    """The thread's messages."""
    final_count: int
    """The forked context's messages."""
    total_chars: int
    """Characters of the formatted context (without the preamble)."""
    removed_messages: int
    """Messages the character budget removed (stage 3)."""
    compaction_detected: bool
    compaction_slice_index: int | None
    """The index, in the thread, of the compaction summary the fork starts at."""
    truncated_results: int
    """Tool results that were cut (stage 2)."""
    tier_distribution: TierDistribution
    head_tail_applied: int
    """Tool results and parameters cut head+tail (80/20)."""
    cleared_results: int
    """Tool results that were already cleared, passed through."""
    truncated_params: int
    """Tool calls whose parameters were cut."""


class ContextForkResult(Result, frozen=True):
    session_id: str
    branch_id: str | None
    preamble: str
    context: str
    """The formatted context: one block per message (``[role]``, ``[tool: name]``)."""
    stats: ForkStats
    tokens: int
    """Exact tokens of the preamble, a blank line and the context."""
    context_state: ContextState


# ---- session.open fork_from's seed (docs/protocol.md, "context.fork") ----

class ForkSeedInfo(Result, frozen=True):
    """What seeded a session opened with ``fork_from``."""

    preamble: str
    stats: ForkStats
    char_budget: int
    """The character budget the seed was fitted with (``context.fork`` with it gives the
    seed's context)."""
    tokens: int
    """The seed's tokens as the new session stores them (offloaded results: their stubs)."""

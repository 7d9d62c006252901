"""The session-scoped methods: session.*, message.*, ctxd.render, budget.measure, tools.*,
branch.*; each runs on its session's actor."""

from __future__ import annotations

import secrets

import msgspec

from ctxd.sessions import _branch_ops as branch_ops
from ctxd.sessions import _hygiene_ops as hygiene_ops
from ctxd.sessions import _queries as q
from ctxd.sessions import _session_ops as session_ops
from ctxd.sessions._compaction import STRATEGIES
from ctxd.sessions._fork import context_fork, fork_seed, seed_target
from ctxd.sessions._import import register_import
from ctxd.sessions._injection_methods import register_injection
from ctxd.sessions._state import resolve_budget
from ctxd.sessions._supervisor import Supervisor
from ctxd.wire import Call, Dispatcher
from ctxd.wire.types import (
    BranchCreateParams,
    BranchCreateResult,
    BranchIdParams,
    BranchListParams,
    BranchListResult,
    BranchReturnParams,
    BranchReturnResult,
    BranchRollbackParams,
    BranchRollbackResult,
    BranchStatusResult,
    BudgetMeasureParams,
    BudgetMeasureResult,
    ContextCompactParams,
    ContextCompactResult,
    ContextForkParams,
    ContextForkResult,
    MessageAppendParams,
    MessageAppendResult,
    MessageListParams,
    MessageListResult,
    RenderParams,
    RenderResult,
    ResultReadParams,
    ResultReadResult,
    SessionDeleteResult,
    SessionIdParams,
    SessionListParams,
    SessionListResult,
    SessionOpenParams,
    SessionOpenResult,
    SessionResult,
    SessionResumeResult,
    ToolsRegisterParams,
    ToolsRegisterResult,
    ToolsSearchParams,
    ToolsSearchResult,
)


def new_session_id() -> str:
    return "ses_" + secrets.token_hex(8)


def register(dispatcher: Dispatcher, supervisor: Supervisor) -> None:
    """Add the session methods to the dispatcher."""

    async def session_open(call: Call, p: SessionOpenParams) -> SessionOpenResult:
        source = p.fork_from
        if source is None:
            return await supervisor.call(p.session_id or new_session_id(),
                                         lambda a: session_ops.open_session(a, p))
        session_id = p.session_id or new_session_id()
        target = seed_target(resolve_budget(p.budget, supervisor.config.budget),
                             supervisor.config.hygiene.compact_target)
        seed = await supervisor.call(source.session_id,
                                     lambda a: fork_seed(a, source, session_id, target))
        return await supervisor.call(session_id, lambda a: session_ops.open_session(a, p, seed))

    async def session_get(call: Call, p: SessionIdParams) -> SessionResult:
        return await supervisor.call(p.session_id, lambda a: session_ops.get_session(a))

    async def session_close(call: Call, p: SessionIdParams) -> SessionResult:
        return await supervisor.call(p.session_id, lambda a: session_ops.close_session(a))

    async def session_delete(call: Call, p: SessionIdParams) -> SessionDeleteResult:
        return await supervisor.call(p.session_id, lambda a: session_ops.delete_session(a))

    async def session_list(call: Call, p: SessionListParams) -> SessionListResult:
        after = int(p.cursor) if p.cursor else 0
        rows = await supervisor.store.read(q.list_sessions, p.project, p.state, after,
                                           p.limit + 1)
        more = len(rows) > p.limit
        rows = rows[:p.limit]
        return SessionListResult(sessions=[supervisor.info(record, live)
                                           for _, record, live in rows],
                                 next_cursor=str(rows[-1][0]) if more else None)

    async def session_resume(call: Call, p: SessionIdParams) -> SessionResumeResult:
        return await supervisor.call(p.session_id, lambda a: hygiene_ops.resume(a))

    async def context_compact(call: Call, p: ContextCompactParams) -> ContextCompactResult:
        # Identical compactions of a thread share one run (docs/protocol.md, "Compaction").
        key = ("context.compact", p.branch_id, frozenset(p.strategies or STRATEGIES))
        done, shared = await supervisor.call_shared(p.session_id, key,
                                                    lambda a: hygiene_ops.compact(a, p))
        return msgspec.structs.replace(done, coalesced=True) if shared else done

    async def context_fork_(call: Call, p: ContextForkParams) -> ContextForkResult:
        return await supervisor.call(p.session_id, lambda a: context_fork(a, p))

    async def message_append(call: Call, p: MessageAppendParams) -> MessageAppendResult:
        return await supervisor.call(p.session_id, lambda a: session_ops.append(a, p))

    async def message_list(call: Call, p: MessageListParams) -> MessageListResult:
        return await supervisor.call(p.session_id, lambda a: session_ops.list_messages(a, p))

    async def render(call: Call, p: RenderParams) -> RenderResult:
        return await supervisor.call(p.session_id, lambda a: session_ops.render(a, p))

    async def result_read(call: Call, p: ResultReadParams) -> ResultReadResult:
        found = await supervisor.call(p.session_id, lambda a: hygiene_ops.read_result(a, p))
        if isinstance(found, hygiene_ops.Search):
            return await found.run(supervisor.searches)  # off the session's mailbox
        return found

    async def budget_measure(call: Call, p: BudgetMeasureParams) -> BudgetMeasureResult:
        return await supervisor.call(p.session_id, lambda a: session_ops.measure(a, p))

    async def tools_register(call: Call, p: ToolsRegisterParams) -> ToolsRegisterResult:
        return await supervisor.call(p.session_id, lambda a: hygiene_ops.register_tools(a, p))

    async def tools_search(call: Call, p: ToolsSearchParams) -> ToolsSearchResult:
        return await supervisor.call(p.session_id, lambda a: hygiene_ops.search_tools(a, p))

    async def branch_create(call: Call, p: BranchCreateParams) -> BranchCreateResult:
        return await supervisor.call(p.session_id, lambda a: branch_ops.create_branch(a, p))

    async def branch_return(call: Call, p: BranchReturnParams) -> BranchReturnResult:
        session_id = await supervisor.registry.session_of(p.branch_id)
        return await supervisor.call(session_id, lambda a: branch_ops.return_branch(a, p))

    async def branch_status(call: Call, p: BranchIdParams) -> BranchStatusResult:
        session_id = await supervisor.registry.session_of(p.branch_id)
        return await supervisor.call(session_id, lambda a: branch_ops.branch_status(a, p.branch_id))

    async def branch_list(call: Call, p: BranchListParams) -> BranchListResult:
        return await supervisor.call(p.session_id, lambda a: branch_ops.list_branches(a, p))

    async def branch_rollback(call: Call, p: BranchRollbackParams) -> BranchRollbackResult:
        return await supervisor.call(p.session_id, lambda a: branch_ops.rollback(a, p))

    dispatcher.register("session.open", SessionOpenParams, session_open)
    dispatcher.register("session.get", SessionIdParams, session_get)
    dispatcher.register("session.close", SessionIdParams, session_close)
    dispatcher.register("session.delete", SessionIdParams, session_delete)
    dispatcher.register("session.list", SessionListParams, session_list)
    dispatcher.register("session.resume", SessionIdParams, session_resume)
    dispatcher.register("context.compact", ContextCompactParams, context_compact)
    dispatcher.register("context.fork", ContextForkParams, context_fork_)
    dispatcher.register("message.append", MessageAppendParams, message_append)
    dispatcher.register("message.list", MessageListParams, message_list)
    dispatcher.register("ctxd.render", RenderParams, render)
    dispatcher.register("result.read", ResultReadParams, result_read)
    dispatcher.register("budget.measure", BudgetMeasureParams, budget_measure)
    dispatcher.register("tools.register", ToolsRegisterParams, tools_register)
    dispatcher.register("tools.search", ToolsSearchParams, tools_search)
    dispatcher.register("branch.create", BranchCreateParams, branch_create)
    dispatcher.register("branch.return", BranchReturnParams, branch_return)
    dispatcher.register("branch.status", BranchIdParams, branch_status)
    dispatcher.register("branch.list", BranchListParams, branch_list)
    dispatcher.register("branch.rollback", BranchRollbackParams, branch_rollback)
    register_injection(dispatcher, supervisor)
    register_import(dispatcher, supervisor)

"""The session-scoped methods: session.*, message.*, ctxd.render, budget.measure."""

from __future__ import annotations

import secrets

from ctxd.sessions import _queries as q
from ctxd.sessions._supervisor import Supervisor
from ctxd.wire import Call, Dispatcher
from ctxd.wire.types import (
    BudgetMeasureParams,
    BudgetMeasureResult,
    MessageAppendParams,
    MessageAppendResult,
    MessageListParams,
    MessageListResult,
    RenderParams,
    RenderResult,
    SessionDeleteResult,
    SessionIdParams,
    SessionListParams,
    SessionListResult,
    SessionOpenParams,
    SessionOpenResult,
    SessionResult,
)


def new_session_id() -> str:
    return "ses_" + secrets.token_hex(8)


def register(dispatcher: Dispatcher, supervisor: Supervisor) -> None:
    """Add the session methods to the dispatcher."""

    async def session_open(call: Call, p: SessionOpenParams) -> SessionOpenResult:
        return await supervisor.call(p.session_id or new_session_id(), lambda a: a.open(p))

    async def session_get(call: Call, p: SessionIdParams) -> SessionResult:
        return await supervisor.call(p.session_id, lambda a: a.get())

    async def session_close(call: Call, p: SessionIdParams) -> SessionResult:
        return await supervisor.call(p.session_id, lambda a: a.close())

    async def session_delete(call: Call, p: SessionIdParams) -> SessionDeleteResult:
        return await supervisor.call(p.session_id, lambda a: a.delete())

    async def session_list(call: Call, p: SessionListParams) -> SessionListResult:
        after = int(p.cursor) if p.cursor else 0
        rows = await supervisor.store.read(q.list_sessions, p.project, p.state, after,
                                           p.limit + 1)
        more = len(rows) > p.limit
        rows = rows[:p.limit]
        return SessionListResult(sessions=[supervisor.info(record, live)
                                           for _, record, live in rows],
                                 next_cursor=str(rows[-1][0]) if more else None)

    async def message_append(call: Call, p: MessageAppendParams) -> MessageAppendResult:
        return await supervisor.call(p.session_id, lambda a: a.append(p))

    async def message_list(call: Call, p: MessageListParams) -> MessageListResult:
        return await supervisor.call(p.session_id, lambda a: a.list_messages(p))

    async def render(call: Call, p: RenderParams) -> RenderResult:
        return await supervisor.call(p.session_id, lambda a: a.render(p))

    async def budget_measure(call: Call, p: BudgetMeasureParams) -> BudgetMeasureResult:
        return await supervisor.call(p.session_id, lambda a: a.measure(p))

    dispatcher.register("session.open", SessionOpenParams, session_open)
    dispatcher.register("session.get", SessionIdParams, session_get)
    dispatcher.register("session.close", SessionIdParams, session_close)
    dispatcher.register("session.delete", SessionIdParams, session_delete)
    dispatcher.register("session.list", SessionListParams, session_list)
    dispatcher.register("message.append", MessageAppendParams, message_append)
    dispatcher.register("message.list", MessageListParams, message_list)
    dispatcher.register("ctxd.render", RenderParams, render)
    dispatcher.register("budget.measure", BudgetMeasureParams, budget_measure)

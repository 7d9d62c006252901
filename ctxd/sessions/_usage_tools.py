"""usage.record, usage.get, tool.state, tool.get, tool.list: the session's side of the hub's
usage ledger and tool-call lifecycle (docs/protocol.md, "Usage" and "Tool states").

Each runs on its session's actor: the session must exist (-32004), a closed session still
takes records (docs/decisions.md, "Usage and tool states"), and one session's records are
written one at a time, so an idempotency key is checked and written without a race. The
SQL is the hub's (`ctxd.hub`); this module only finds the session's record, its branch,
and publishes the events.
"""

from __future__ import annotations

import logging
import time

from ctxd.errors import not_found
from ctxd.folding import rendered_tokens
from ctxd.hub import (
    allowed_next,
    counters_of,
    find_usage,
    insert_usage,
    list_tool_calls,
    load_tool_call,
    set_tool_state,
    usage_summary,
)
from ctxd.scrub import ScrubError, scrub
from ctxd.sessions._actor import SessionActor
from ctxd.tokens import REPLY_PRIMING
from ctxd.wire.types import (
    USAGE_COUNTERS,
    ToolGetParams,
    ToolGetResult,
    ToolListParams,
    ToolListResult,
    ToolStateParams,
    ToolStateResult,
    UsageGetParams,
    UsageGetResult,
    UsageRecordParams,
    UsageRecordResult,
)

log = logging.getLogger("ctxd.sessions")


async def _local_input_tokens(actor: SessionActor, branch_id: str | None) -> int:
    """ctxd's count of the thread the call read: the main thread's rendered tokens, or the
    branch's (its prefix and its own messages, as it is now or as it ended).

    Raises:
        CtxdError: -32004 when the branch is not one of the session's.
    """
    record = actor.require()
    if branch_id is None:
        return record.main_thread_tokens
    branch = actor.branches.live.get(branch_id) or await actor.branches.stored(branch_id)
    return rendered_tokens(branch) + REPLY_PRIMING


async def record_usage(actor: SessionActor, p: UsageRecordParams) -> UsageRecordResult:
    return await record_sent_usage(actor, p, None)


async def record_sent_usage(actor: SessionActor, p: UsageRecordParams,
                            sent_tokens: int | None) -> UsageRecordResult:
    """usage.record, with ctxd's count of the call's input when ctxd sent the call itself
    (the gateway: ``sent_tokens``), else the thread's rendered tokens."""
    counters = counters_of(p)
    actor.require()
    store = actor.services.store
    if p.idempotency_key is not None:
        first = await store.read(find_usage, actor.session_id, p.idempotency_key)
        if first is not None:
            return UsageRecordResult(record=first, duplicate=True)
    local = (sent_tokens if sent_tokens is not None
             else await _local_input_tokens(actor, p.branch_id))
    entry = await store.write(insert_usage, p, counters, local, time.time())
    actor.services.bus.publish(actor.session_id, "usage.recorded", {
        "usage_id": entry.usage_id, "branch_id": entry.branch_id, "model": entry.model,
        "request_id": entry.request_id, "local_input_tokens": local,
        **{name: getattr(entry, name) for name in USAGE_COUNTERS}})
    return UsageRecordResult(record=entry, duplicate=False)


async def get_usage(actor: SessionActor, p: UsageGetParams) -> UsageGetResult:
    actor.require()
    if p.branch_id is not None and p.branch_id not in actor.branches.live:
        await actor.branches.stored(p.branch_id)
    return await actor.services.store.read(usage_summary, actor.session_id, p.branch_id,
                                           p.group_by, actor.services.config.usage.prices)


def _shown_detail(detail: str | None) -> str | None:
    """A tool call's detail as its event shows it: scrubbed, or left out when it cannot be
    (what leaves a session is scrubbed, fail closed: docs/security.md)."""
    if detail is None:
        return None
    try:
        return scrub(detail).text
    except ScrubError:
        log.exception("a tool call's detail could not be scrubbed; its event leaves it out")
        return None


async def set_state(actor: SessionActor, p: ToolStateParams) -> ToolStateResult:
    actor.require()
    tool_call, previous = await actor.services.store.write(set_tool_state, p, time.time())
    if previous != p.state:
        actor.services.bus.publish(actor.session_id, "tool.state", {
            "tool_call_id": tool_call.tool_call_id, "tool_name": tool_call.tool_name,
            "from": previous, "to": p.state, "detail": _shown_detail(p.detail),
            "terminal": tool_call.terminal, "allowed_next": allowed_next(p.state)})
    return ToolStateResult(tool_call=tool_call, previous_state=previous)


async def get_tool_call(actor: SessionActor, p: ToolGetParams) -> ToolGetResult:
    actor.require()
    found = await actor.services.store.read(load_tool_call, actor.session_id,
                                            p.tool_call_id, time.time())
    if found is None:
        raise not_found("tool_call", p.tool_call_id,
                        "report its first state with tool.state, or list them with tool.list")
    return ToolGetResult(tool_call=found)


async def list_calls(actor: SessionActor, p: ToolListParams) -> ToolListResult:
    actor.require()
    return ToolListResult(tool_calls=await actor.services.store.read(
        list_tool_calls, actor.session_id, p.state, time.time()))

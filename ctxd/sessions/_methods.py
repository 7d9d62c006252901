"""The session operations the route table (ctxd/daemon/_routes.py) names besides the
actor's own: those that run on the Supervisor (``session.open``, ``session.list``), the
actor's operations that take no params in the route's shape ``op(actor, params)``, and
the key that lets identical compactions share one run."""

from __future__ import annotations

import secrets
from collections.abc import Hashable

from ctxd.sessions import _branch_ops as branch_ops
from ctxd.sessions import _hygiene_ops as hygiene_ops
from ctxd.sessions import _queries as q
from ctxd.sessions import _session_ops as session_ops
from ctxd.sessions._actor import SessionActor
from ctxd.sessions._compaction import STRATEGIES
from ctxd.sessions._fork import fork_seed, seed_target
from ctxd.sessions._state import resolve_budget
from ctxd.sessions._supervisor import Supervisor
from ctxd.wire.types import (
    BranchIdParams,
    BranchStatusResult,
    ContextCompactParams,
    SessionDeleteResult,
    SessionIdParams,
    SessionListParams,
    SessionListResult,
    SessionOpenParams,
    SessionOpenResult,
    SessionResult,
    SessionResumeResult,
)


def new_session_id() -> str:
    return "ses_" + secrets.token_hex(8)


async def session_open(supervisor: Supervisor, p: SessionOpenParams) -> SessionOpenResult:
    """session.open: on the session's actor, which ``fork_from``'s source actor seeds first
    (docs/protocol.md, "context.fork")."""
    session_id = p.session_id or new_session_id()
    source = p.fork_from
    if source is None:
        return await supervisor.call(session_id, lambda a: session_ops.open_session(a, p))
    target = seed_target(resolve_budget(p.budget, supervisor.config.budget),
                         supervisor.config.hygiene.compact_target)
    seed = await supervisor.call(source.session_id,
                                 lambda a: fork_seed(a, source, session_id, target))
    return await supervisor.call(session_id, lambda a: session_ops.open_session(a, p, seed))


async def session_list(supervisor: Supervisor, p: SessionListParams) -> SessionListResult:
    """session.list: from the store, each session as its running actor knows it."""
    after = int(p.cursor) if p.cursor else 0
    rows = await supervisor.store.read(q.list_sessions, p.project, p.state, after,
                                       p.limit + 1)
    more = len(rows) > p.limit
    rows = rows[:p.limit]
    return SessionListResult(sessions=[supervisor.info(record, live)
                                       for _, record, live in rows],
                             next_cursor=str(rows[-1][0]) if more else None)


async def session_get(actor: SessionActor, p: SessionIdParams) -> SessionResult:
    return await session_ops.get_session(actor)


async def session_close(actor: SessionActor, p: SessionIdParams) -> SessionResult:
    return await session_ops.close_session(actor)


async def session_delete(actor: SessionActor, p: SessionIdParams) -> SessionDeleteResult:
    return await session_ops.delete_session(actor)


async def session_resume(actor: SessionActor, p: SessionIdParams) -> SessionResumeResult:
    return await hygiene_ops.resume(actor)


async def branch_status(actor: SessionActor, p: BranchIdParams) -> BranchStatusResult:
    return await branch_ops.branch_status(actor, p.branch_id)


def compaction_key(p: ContextCompactParams) -> Hashable:
    """What makes two compactions of a session identical, so that they share one run
    (docs/protocol.md, "Compaction"): the thread and the strategies."""
    return ("context.compact", p.branch_id, frozenset(p.strategies or STRATEGIES))

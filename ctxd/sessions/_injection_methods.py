"""inject.push, inject.pull, inject.ack, inject.list: the injection queue of a session, run
on its actor so that a push is measured against the thread it joins and ordered with the
session's other requests (docs/protocol.md, "Injection"). The queue's table and SQL are
the hub's."""

from __future__ import annotations

import time

from ctxd.errors import invalid_state, not_found, scrub_failed
from ctxd.folding import rendered_tokens
from ctxd.hub import (
    NewInjection,
    ack_injection,
    find_by_key,
    insert_injection,
    list_injections,
    load_injection,
    pull_injections,
)
from ctxd.scrub import ScrubError, scrub
from ctxd.sessions._actor import SessionActor
from ctxd.sessions._supervisor import Supervisor
from ctxd.tokens import REPLY_PRIMING
from ctxd.wire.types import (
    InjectAckParams,
    InjectAckResult,
    InjectionInfo,
    InjectListParams,
    InjectListResult,
    InjectPullParams,
    InjectPullResult,
    InjectPushParams,
    InjectPushResult,
    MessageIn,
)


def _pushed(info: InjectionInfo, duplicate: bool, secrets_scrubbed: int) -> InjectPushResult:
    return InjectPushResult(injection_id=info.injection_id, duplicate=duplicate,
                            state=info.state, priority=info.priority, tokens=info.tokens,
                            secrets_scrubbed=secrets_scrubbed)


async def push(actor: SessionActor, p: InjectPushParams) -> InjectPushResult:
    """Scrub, count and queue one injection; answered once it has committed. A retried
    idempotency key answers the first push's injection (``duplicate``)."""
    store = actor.services.store
    actor.require_open()
    if p.idempotency_key is not None:
        found = await store.read(find_by_key, actor.session_id, p.idempotency_key)
        if found is not None:
            return _pushed(found[0], True, found[1])
    try:
        scrubbed = scrub(p.content)
    except ScrubError as exc:
        raise scrub_failed("the injection", exc, "nothing was queued") from exc
    [tokens] = await actor.services.counter.count_messages(
        [MessageIn(role="user", content=scrubbed.text)])
    record = actor.require_open()
    active = actor.branches.active
    thread = record.main_message_tokens if active is None else rendered_tokens(active)
    would_use = thread + tokens + REPLY_PRIMING
    if would_use / record.budget.effective_window >= record.budget.hard_block:
        raise actor.over_hard_block(would_use, tokens, allow_over=False, what="injecting")
    info = await store.write(insert_injection, NewInjection(
        session_id=actor.session_id, priority=p.priority, content=scrubbed.text,
        source=p.source, idempotency_key=p.idempotency_key, tokens=tokens,
        secrets_scrubbed=scrubbed.total, created_at=time.time()))
    actor.services.bus.publish(actor.session_id, "inject.pushed", {
        "injection_id": info.injection_id, "priority": info.priority, "source": info.source,
        "tokens": tokens, "secrets_scrubbed": scrubbed.total})
    return _pushed(info, False, scrubbed.total)


async def pull(actor: SessionActor, p: InjectPullParams) -> InjectPullResult:
    """Hand out what waits (and what waited for its ack past ``inject_redeliver_s``)."""
    actor.require()
    now = time.time()
    delivered, waiting = await actor.services.store.write(
        pull_injections, actor.session_id, p.max_priority, p.limit, now,
        now - actor.services.config.inject_redeliver_s)
    for info in delivered:
        actor.services.bus.publish(actor.session_id, "inject.delivered", {
            "injection_id": info.injection_id, "priority": info.priority,
            "deliveries": info.deliveries})
    return InjectPullResult(injections=delivered, waiting=waiting)


async def ack(actor: SessionActor, p: InjectAckParams) -> InjectAckResult:
    """Record the answer to a delivered injection; the same answer again is idempotent, a
    different one is refused (docs/decisions.md, Injection)."""
    store = actor.services.store
    info = await store.read(load_injection, p.injection_id)
    if info is None or info.session_id != actor.session_id:
        raise _unknown(p.injection_id)
    answer = "accepted" if p.accepted else "rejected"
    if info.state == answer:
        return InjectAckResult(injection=info, already_acked=True)
    if info.state != "delivered":
        fix = ("it has not been delivered yet: take it with inject.pull first"
               if info.state == "pending" else
               f"it was already acknowledged as {info.state}; an answer is final")
        raise invalid_state(f"injection {p.injection_id!r} is {info.state}", fix,
                            injection_id=p.injection_id, state=info.state,
                            reason=info.reason)
    reason = None
    if p.reason is not None:
        try:
            reason = scrub(p.reason).text
        except ScrubError as exc:
            raise scrub_failed("the reason", exc, "the answer was not recorded") from exc
    acked = await store.write(ack_injection, p.injection_id, p.accepted, reason, time.time())
    actor.services.bus.publish(actor.session_id, "inject.acked", {
        "injection_id": acked.injection_id, "accepted": p.accepted, "reason": reason,
        "deliveries": acked.deliveries})
    return InjectAckResult(injection=acked, already_acked=False)


async def list_queue(actor: SessionActor, p: InjectListParams) -> InjectListResult:
    actor.require()
    injections, counts = await actor.services.store.read(
        list_injections, actor.session_id, p.state, p.limit)
    return InjectListResult(injections=injections, counts=counts)


def _unknown(injection_id: str) -> Exception:
    return not_found("injection", injection_id,
                     "use an injection_id that inject.pull handed out")


async def session_of_injection(supervisor: Supervisor, p: InjectAckParams) -> str:
    """The session whose queue holds the injection (``inject.ack`` names no session).

    Raises:
        CtxdError: -32004 when no session holds it.
    """
    info = await supervisor.store.read(load_injection, p.injection_id)
    if info is None:
        raise _unknown(p.injection_id)
    return info.session_id

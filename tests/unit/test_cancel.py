"""Cancellation in-process, at its two landing points: a session operation cancelled while
it runs (answered -32006 whether it ends without writing or reaches its first write), and
the store's commit point (docs/protocol.md, "Cancellation")."""

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from tests_support import running_supervisor

from ctxd.config import Config
from ctxd.errors import CtxdError, ErrorCode, cancelled
from ctxd.hub import Subscription
from ctxd.jobs import Request, working_for
from ctxd.sessions import Supervisor
from ctxd.sessions import _session_ops as session_ops
from ctxd.store import Store
from ctxd.wire.types import (
    Event,
    MessageAppendParams,
    MessageIn,
    MessageListParams,
    SessionOpenParams,
)


@pytest.fixture
async def supervisor(tmp_path: Path) -> AsyncIterator[Supervisor]:
    async with running_supervisor(tmp_path / "ctxd.db", Config()) as running:
        await running.call("s1", lambda a: session_ops.open_session(
            a, SessionOpenParams(session_id="s1")))
        yield running


async def drained(bus_subscription: Subscription, supervisor: Supervisor) -> list[Event]:
    supervisor.bus.unsubscribe(bus_subscription.subscription_id)
    events = []
    while True:
        try:
            events.append(await bus_subscription.receive())
        except trio.EndOfChannel:
            return events


async def cancelled_while_running(supervisor: Supervisor,
                                  then: Callable[[Any], Awaitable[Any]]) -> CtxdError:
    """Run an operation on s1 that waits until its request is cancelled, then goes on with
    ``then``; the error its caller gets."""
    request = Request("r1", cancelled)
    running, go_on = trio.Event(), trio.Event()

    async def op(actor: Any) -> Any:
        running.set()
        await go_on.wait()
        return await then(actor)

    async def call() -> None:
        with working_for(request), pytest.raises(CtxdError) as caught:
            await supervisor.call("s1", op)
        errors.append(caught.value)

    errors: list[CtxdError] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        await running.wait()
        assert request.cancel("stop") is True
        go_on.set()
    return errors[0]


async def test_an_operation_cancelled_while_running_writes_nothing_not_even_inline(
        supervisor: Supervisor) -> None:
    # An append with a tool result to offload, whose write is refused: the refusal is not
    # taken for a failed offload (that would append the result inline instead).
    watcher = supervisor.bus.subscribe("s1")
    big = MessageAppendParams(session_id="s1", messages=[MessageIn(
        role="tool", tool_call_id="call_1", name="bash", content="line\n" * 2_000)])
    error = await cancelled_while_running(supervisor, lambda actor: session_ops.append(actor, big))
    listed = await supervisor.call("s1", lambda a: session_ops.list_messages(a, MessageListParams(
        session_id="s1")))
    events = await drained(watcher, supervisor)
    assert (error.code, error.message) == (ErrorCode.CANCELLED,
                                           "request 'r1' was cancelled: stop")
    assert listed.messages == []
    assert [event.type for event in events] == []


async def test_a_read_cancelled_while_running_answers_cancelled_and_the_session_goes_on(
        supervisor: Supervisor) -> None:
    error = await cancelled_while_running(supervisor, lambda actor: session_ops.get_session(actor))
    appended = await supervisor.call("s1", lambda a: session_ops.append(a, MessageAppendParams(
        session_id="s1", messages=[MessageIn(role="user", content="hello")])))
    assert error.code == ErrorCode.CANCELLED
    assert [m.seq for m in appended.appended] == [1]


async def test_the_store_refuses_a_cancelled_requests_write_and_counts_the_first_one(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "ctxd.db")
    store.open()
    try:
        def write(conn: Any) -> None:
            conn.execute("PRAGMA user_version")

        stopped, committing = Request("a", cancelled), Request("b", cancelled)
        stopped.actor_op = committing.actor_op = True
        assert stopped.cancel(None) is True
        with working_for(stopped), pytest.raises(CtxdError) as refused:
            await store.write(write)
        with working_for(committing):
            await store.write(write)
        assert (refused.value.code, refused.value.message) == (
            ErrorCode.CANCELLED, "request 'a' was cancelled")
        assert (committing.committed, committing.cancellable) == (True, False)
        assert committing.cancel("late") is False
        assert committing.stopped is False
    finally:
        store.close()

"""Supervisor and SessionActors in-process: ordering, idle retirement, rehydration."""

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest
import trio
import trio.testing
from tests_support import COUNTER, running_supervisor

from ctxd.config import Config
from ctxd.errors import CtxdError, ErrorCode
from ctxd.hub import EventBus
from ctxd.sessions import SessionActor, Supervisor
from ctxd.sessions import _session_ops as session_ops
from ctxd.sessions._actor import MAILBOX_SIZE
from ctxd.store import Store
from ctxd.wire.types import (
    MessageAppendParams,
    MessageIn,
    SessionOpenParams,
    SessionOpenResult,
)


@pytest.fixture
async def supervisor(tmp_path: Path) -> AsyncIterator[Supervisor]:
    config = Config(session_idle_s=600.0, max_open_sessions=3)
    async with running_supervisor(tmp_path / "ctxd.db", config) as running:
        yield running


def open_op(session_id: str) -> Callable[[SessionActor], Awaitable[SessionOpenResult]]:
    return lambda a: session_ops.open_session(a, SessionOpenParams(session_id=session_id))


def append(session_id: str, *texts: str) -> MessageAppendParams:
    return MessageAppendParams(session_id=session_id,
                               messages=[MessageIn(role="user", content=t) for t in texts])


async def test_idle_actor_retires_and_is_rehydrated(
        supervisor: Supervisor, autojump_clock: trio.testing.MockClock) -> None:
    await supervisor.call("s1", open_op("s1"))
    await supervisor.call("s1", lambda a: session_ops.append(a, append("s1", "hello world")))
    assert supervisor.actor_count == 1
    await trio.sleep(599)
    assert supervisor.actor_count == 1
    await trio.sleep(2)
    assert supervisor.actor_count == 0
    got = await supervisor.call("s1", lambda a: session_ops.get_session(a))
    assert supervisor.actor_count == 1
    assert (got.session.message_count, got.session.total_tokens) == (1, 6)
    result = await supervisor.call("s1",
                                   lambda a: session_ops.append(a, append("s1", "hello world")))
    assert [m.seq for m in result.appended] == [2]


async def test_unknown_session_does_not_leave_an_actor(supervisor: Supervisor) -> None:
    with pytest.raises(CtxdError) as caught:
        await supervisor.call("ghost", lambda a: session_ops.get_session(a))
    assert caught.value.code == ErrorCode.NOT_FOUND
    await trio.testing.wait_all_tasks_blocked()
    assert supervisor.actor_count == 0


async def test_requests_of_one_session_run_in_order_and_sessions_concurrently(
        supervisor: Supervisor) -> None:
    for sid in ("a", "b"):
        await supervisor.call(sid, open_op(sid))
    seqs: dict[str, list[int]] = {"a": [], "b": []}

    async def writer(sid: str, n: int) -> None:
        result = await supervisor.call(
            sid, lambda a: session_ops.append(a, append(sid, f"m{n}", f"m{n}")))
        seqs[sid].extend(m.seq for m in result.appended)

    async with trio.open_nursery() as nursery:
        for n in range(50):
            for sid in ("a", "b"):
                nursery.start_soon(writer, sid, n)
    for sid in ("a", "b"):
        assert sorted(seqs[sid]) == list(range(1, 101))
        got = await supervisor.call(sid, lambda a: session_ops.get_session(a))
        assert got.session.message_count == 100


async def test_max_open_sessions(supervisor: Supervisor) -> None:
    for sid in ("a", "b", "c"):
        await supervisor.call(sid, open_op(sid))
    with pytest.raises(CtxdError) as caught:
        await supervisor.call("d", open_op("d"))
    assert caught.value.code == ErrorCode.LIMIT_REACHED
    await supervisor.call("a", lambda a: session_ops.close_session(a))
    opened = await supervisor.call("d", open_op("d"))
    assert opened.created is True
    assert supervisor.sessions_open == 3


async def test_a_shared_operation_whose_caller_left_while_the_mailbox_was_full_is_not_waited_for(
        supervisor: Supervisor, autojump_clock: trio.testing.MockClock) -> None:
    # Regression: the operation queued last was recorded as the one to share before its
    # caller waited for room in the mailbox; a caller cancelled there (its connection
    # dropped) left that record behind, and whoever shared it waited forever.
    await supervisor.call("s", open_op("s"))
    gate = trio.Event()

    async def held(actor: object) -> str:
        await gate.wait()
        return "held"

    async def own(actor: object) -> str:
        return "own"

    async with trio.open_nursery() as nursery:
        nursery.start_soon(supervisor.call, "s", held)
        await trio.testing.wait_all_tasks_blocked()
        for _ in range(MAILBOX_SIZE):  # the mailbox full behind it
            nursery.start_soon(supervisor.call, "s", own)
        await trio.testing.wait_all_tasks_blocked()
        leaving = trio.CancelScope()

        async def left() -> None:
            with leaving:
                await supervisor.call_shared("s", "compact", own)

        nursery.start_soon(left)
        await trio.testing.wait_all_tasks_blocked()  # waiting for room
        shared: list[tuple[str, bool]] = []
        answered = trio.Event()

        async def sharing() -> None:
            shared.append(await supervisor.call_shared("s", "compact", own))
            answered.set()

        nursery.start_soon(sharing)
        await trio.testing.wait_all_tasks_blocked()  # waiting for the first one's result
        leaving.cancel()
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
        with trio.fail_after(60):  # virtual time: a wait that never ends fails at once
            await answered.wait()
    assert shared == [("own", False)]  # queued after all, and run


async def test_an_append_s_events_are_written_with_it(tmp_path: Path) -> None:
    """message.append writes its events in its own transaction: they are in the table and
    sent when it is answered (docs/decisions.md, Events), in the order published."""
    store = Store(tmp_path / "ctxd.db")
    store.open()
    try:
        bus = EventBus(store=store)
        async with trio.open_nursery() as nursery:
            await nursery.start(bus.run)
            supervisor = await nursery.start(Supervisor(store, COUNTER, bus, Config()).run)
            watcher = bus.subscribe(since_seq=0)
            await supervisor.call("s1", open_op("s1"))
            assert (await watcher.receive()).type == "session.opened"  # the bus's writer
            seen = bus.subscribe(session_id="s1")
            result = await supervisor.call(
                "s1", lambda a: session_ops.append(a, append("s1", "hello world", "hello")))
            rows = await store.read(lambda conn: conn.execute(
                "SELECT seq, type, data FROM events ORDER BY seq").fetchall())
            assert [(seq, type) for seq, type, _ in rows] == [
                (1, "session.opened"), (2, "message.appended")]
            assert bus.seq == 2
            event = seen._receive.receive_nowait()
            assert (event.seq, event.type) == (2, "message.appended")
            assert event.data == msgspec.json.decode(rows[1][2]) == {
                "branch_id": None, "first_seq": 1, "last_seq": 2, "count": 2,
                "tokens": result.tokens_appended,
                "main_thread_tokens": result.context_state.main_thread_tokens}
            nursery.cancel_scope.cancel()
    finally:
        store.close()

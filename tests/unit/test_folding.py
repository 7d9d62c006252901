"""Folding in-process on trio's virtual clock: branch deadlines and forced returns (the
timer itself: test_deadlines.py)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from tests_support import running_supervisor

from ctxd.config import Config
from ctxd.errors import CtxdError, ErrorCode
from ctxd.sessions import SessionActor, Supervisor
from ctxd.sessions import _branch_ops as branch_ops
from ctxd.sessions import _queries as q
from ctxd.sessions import _session_ops as session_ops
from ctxd.wire.types import (
    BranchCreateParams,
    BranchCreateResult,
    MessageAppendParams,
    MessageIn,
    SessionOpenParams,
)


@pytest.fixture
def clock() -> trio.testing.MockClock:
    """Virtual time that jumps only when every task has waited 10 ms of real time, so that
    the store's thread (real time) finishes its work before the clock moves on. Tests that
    sleep must request it themselves (pytest-trio takes the clock from the test's own
    arguments)."""
    return trio.testing.MockClock(autojump_threshold=0.01)


@pytest.fixture
async def supervisor(tmp_path: Path, clock: trio.testing.MockClock
                     ) -> AsyncIterator[Supervisor]:
    config = Config(session_idle_s=3600.0, max_live_branches=2000)
    async with running_supervisor(tmp_path / "ctxd.db", config) as running:
        yield running


async def open_session(supervisor: Supervisor, session_id: str) -> None:
    await supervisor.call(session_id, lambda a: session_ops.open_session(
        a, SessionOpenParams(session_id=session_id)))


async def create(supervisor: Supervisor, session_id: str, timeout_s: float,
                 parent: str | msgspec.UnsetType | None = msgspec.UNSET) -> BranchCreateResult:
    params = BranchCreateParams(session_id=session_id, description="work", prompt="do it",
                                timeout_seconds=timeout_s, parent_branch_id=parent)
    return await supervisor.call(session_id, lambda a: branch_ops.create_branch(a, params))


async def status_of(supervisor: Supervisor, session_id: str, branch_id: str) -> str:
    result = await supervisor.call(session_id, lambda a: branch_ops.branch_status(a, branch_id))
    return result.branch.status


async def test_timeout_force_returns_at_the_deadline(
        supervisor: Supervisor, clock: trio.testing.MockClock) -> None:
    await open_session(supervisor, "s1")
    created = await create(supervisor, "s1", 300)
    start = trio.current_time()
    subscription = supervisor.bus.subscribe("s1", ["branch.forced_return"])
    await trio.sleep(299.5)
    assert await status_of(supervisor, "s1", created.branch_id) == "active"
    info = (await supervisor.call(
        "s1", lambda a: branch_ops.branch_status(a, created.branch_id))).branch
    assert info.time_left_s == pytest.approx(0.5, abs=0.01)
    with trio.fail_after(5):
        event = await subscription.receive()
    fired_at = trio.current_time() - start
    assert 300 <= fired_at < 300.1
    assert (event.data["branch_id"], event.data["status"]) == (created.branch_id, "timeout")
    assert await status_of(supervisor, "s1", created.branch_id) == "timeout"
    assert supervisor.registry.count == 0


async def test_requests_are_judged_by_when_they_arrived(
        supervisor: Supervisor, clock: trio.testing.MockClock) -> None:
    await open_session(supervisor, "s1")
    created = await create(supervisor, "s1", 10)

    def append(text: str) -> MessageAppendParams:
        return MessageAppendParams(session_id="s1", branch_id=created.branch_id,
                                   messages=[MessageIn(role="assistant", content=text)])

    async def busy(actor: SessionActor) -> None:
        await trio.sleep(11)  # holds the actor past the deadline

    async def late_request() -> None:
        await trio.sleep(10.5)
        with pytest.raises(CtxdError) as caught:
            await supervisor.call("s1", lambda a: session_ops.append(a, append("late")))
        late_errors.append(caught.value.code)

    late_errors: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(supervisor.call, "s1", busy)
        await trio.sleep(1)
        # Arrives before the deadline, is processed after it: accepted (it becomes the
        # partial result below).
        nursery.start_soon(supervisor.call, "s1", lambda a: session_ops.append(a, append("ok")))
        nursery.start_soon(late_request)
    assert late_errors == [ErrorCode.TIMEOUT]
    info = (await supervisor.call(
        "s1", lambda a: branch_ops.branch_status(a, created.branch_id))).branch
    assert (info.status, info.result) == ("timeout", "ok")


async def _real_time_limit(seconds: float) -> None:
    """Fail the test after ``seconds`` of real time (its clock only moves when told)."""
    await trio.to_thread.run_sync(time.sleep, seconds, abandon_on_cancel=True)
    raise AssertionError(f"no forced return within {seconds} s of real time")


async def test_hundreds_of_deadlines_fire_at_their_deadline(
        supervisor: Supervisor, clock: trio.testing.MockClock) -> None:
    """Each of 300 branches is force-returned when the clock reaches its deadline, not
    before. The clock moves only when the test moves it (to each deadline in turn), so the
    store's thread, which works in real time, cannot make a return look late or early.
    How late deadlines fire under load is measured by bench/folding.py."""
    clock.autojump_threshold = math.inf
    rng = random.Random(7)
    subscription = supervisor.bus.subscribe(None, ["branch.forced_return"])
    deadlines: dict[str, float] = {}
    for session in range(30):
        session_id = f"s{session}"
        await open_session(supervisor, session_id)
        for _ in range(10):
            timeout_s = rng.uniform(60, 600)
            created = await create(supervisor, session_id, timeout_s, parent=None)
            deadlines[created.branch_id] = trio.current_time() + timeout_s
    assert supervisor.registry.count == 300
    fired: list[tuple[str, float]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_real_time_limit, 60.0)
        for _, deadline in sorted(deadlines.items(), key=lambda item: item[1]):
            clock.jump(deadline - trio.current_time())
            event = await subscription.receive()
            fired.append((event.data["branch_id"], trio.current_time()))
        nursery.cancel_scope.cancel()
    assert fired == sorted(deadlines.items(), key=lambda item: item[1])
    assert supervisor.registry.count == 0


async def test_a_timed_out_parent_returns_its_children_first(
        supervisor: Supervisor, clock: trio.testing.MockClock) -> None:
    await open_session(supervisor, "s1")
    parent = await create(supervisor, "s1", 50)
    child = await create(supervisor, "s1", 500)
    subscription = supervisor.bus.subscribe("s1", ["branch.folded"])
    await trio.sleep(51)
    folded = [await subscription.receive(), await subscription.receive()]
    assert [(e.data["branch_id"], e.data["status"]) for e in folded] == [
        (child.branch_id, "failed"), (parent.branch_id, "timeout")]
    assert await status_of(supervisor, "s1", child.branch_id) == "failed"


async def test_coincident_deadlines_of_a_session_return_in_one_transaction(
        supervisor: Supervisor, clock: trio.testing.MockClock) -> None:
    """Three branches of one session whose deadlines coincide are force-returned together:
    one commit for the three folds (and their expiries after the first find nothing)."""
    await open_session(supervisor, "s1")
    created = [await create(supervisor, "s1", 30, parent=None) for _ in range(3)]
    subscription = supervisor.bus.subscribe("s1", ["branch.folded"])
    commits = supervisor.store.statistics().commits
    await trio.sleep(31)
    folded = [await subscription.receive() for _ in created]
    assert sorted(e.data["branch_id"] for e in folded) == sorted(c.branch_id for c in created)
    assert [e.data["fold_seq"] for e in folded] == [
        folded[0].data["fold_seq"] + i for i in range(3)]
    assert supervisor.store.statistics().commits == commits + 1
    assert supervisor.registry.count == 0


async def test_expiries_queued_behind_a_busy_actor_return_together(
        supervisor: Supervisor, clock: trio.testing.MockClock) -> None:
    """Deadlines at 10, 10.2 and 10.4 s pass while the actor is busy: with nothing but the
    expiries waiting, the first returns all three in one commit."""
    await open_session(supervisor, "s1")
    created = [await create(supervisor, "s1", 10 + 0.2 * i, parent=None) for i in range(3)]
    commits = supervisor.store.statistics().commits

    async def busy(actor: SessionActor) -> None:
        await trio.sleep(11)

    await supervisor.call("s1", busy)
    await trio.testing.wait_all_tasks_blocked()
    assert [await status_of(supervisor, "s1", c.branch_id) for c in created] == ["timeout"] * 3
    assert supervisor.store.statistics().commits == commits + 1


async def test_a_request_that_arrived_before_a_deadline_is_not_overtaken_by_expiries(
        supervisor: Supervisor, clock: trio.testing.MockClock) -> None:
    """An append to the third branch arrives at 10.3 s, before its deadline (10.4 s), and
    waits behind the busy actor with the expiries: it is accepted, and the branch's own
    expiry returns it afterwards (with the append as its partial result)."""
    await open_session(supervisor, "s1")
    created = [await create(supervisor, "s1", 10 + 0.2 * i, parent=None) for i in range(3)]
    last = created[2].branch_id

    async def busy(actor: SessionActor) -> None:
        await trio.sleep(11)

    async def append_late() -> None:
        await trio.sleep(10.3)
        await supervisor.call("s1", lambda a: session_ops.append(a, MessageAppendParams(
            session_id="s1", branch_id=last,
            messages=[MessageIn(role="assistant", content="made it")])))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(supervisor.call, "s1", busy)
        nursery.start_soon(append_late)
    await trio.testing.wait_all_tasks_blocked()
    info = (await supervisor.call("s1", lambda a: branch_ops.branch_status(a, last))).branch
    assert (info.status, info.result) == ("timeout", "made it")


@pytest.fixture
def works_read(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The branches whose recent work each forced return read from the store."""
    read: list[list[str]] = []
    recent_works = q.recent_works

    def recording(conn: Any, branch_ids: Sequence[str], opening_meta: dict[str, Any]
                  ) -> Any:
        read.append(sorted(branch_ids))
        return recent_works(conn, branch_ids, opening_meta)

    monkeypatch.setattr(q, "recent_works", recording)
    return read


async def test_a_forced_return_reads_the_work_only_of_branches_that_did_some(
        supervisor: Supervisor, clock: trio.testing.MockClock,
        works_read: list[list[str]]) -> None:
    await open_session(supervisor, "s1")
    idle, busy = [await create(supervisor, "s1", 10, parent=None) for _ in range(2)]
    await supervisor.call("s1", lambda a: session_ops.append(a, MessageAppendParams(
        session_id="s1", branch_id=busy.branch_id,
        messages=[MessageIn(role="assistant", content="half done")])))
    await trio.sleep(11)
    await trio.testing.wait_all_tasks_blocked()
    assert works_read == [[busy.branch_id]]
    results = {b: (await supervisor.call("s1", lambda a, b=b: branch_ops.branch_status(
        a, b))).branch.result for b in (idle.branch_id, busy.branch_id)}
    assert results == {idle.branch_id: "(the branch ended before any work was recorded)",
                       busy.branch_id: "half done"}


async def test_a_branch_loaded_after_a_restart_has_its_work_read(
        tmp_path: Path, clock: trio.testing.MockClock, works_read: list[list[str]]) -> None:
    """What a branch holds is known only for those this run created: one loaded from the
    store is read, whatever it holds."""
    config = Config(session_idle_s=3600.0)
    async with running_supervisor(tmp_path / "ctxd.db", config) as first:
        await open_session(first, "s1")
        created = await create(first, "s1", 600, parent=None)
    async with running_supervisor(tmp_path / "ctxd.db", config) as second:
        await trio.sleep(601)
        await trio.testing.wait_all_tasks_blocked()
        info = (await second.call("s1", lambda a: branch_ops.branch_status(
            a, created.branch_id))).branch
    assert works_read == [[created.branch_id]]
    assert (info.status, info.result) == (
        "timeout", "(the branch ended before any work was recorded)")


def test_wire_values_are_not_walked_by_the_cycle_collector() -> None:
    # Every params and result type (a live branch's Branch among them): with 10,000 live
    # branches, a full collection that walked them all stalled the loop for 100+ ms.
    import gc

    from ctxd.wire import types as wire

    structs = [value for value in vars(wire).values() if isinstance(value, type)
               and issubclass(value, msgspec.Struct) and value not in (wire.Params, wire.Result)]
    assert len(structs) > 60
    assert [struct.__name__ for struct in structs
            if not issubclass(struct, (wire.Params, wire.Result))] == []
    # One that holds a container (msgspec untracks one of plain values by itself).
    params = msgspec.convert({"types": ["branch.created"]}, wire.EventsSubscribeParams)
    assert (gc.is_tracked(params), gc.is_tracked(params.types)) == (False, True)
    assert [struct.__name__ for struct in structs if struct.__struct_config__.gc] == []

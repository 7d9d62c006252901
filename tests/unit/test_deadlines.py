"""One timer per session on trio's virtual clock: `folding.DeadlineTimer` alone, then a
session actor's branches (coincident deadlines, a deadline moved or ended by a return, no
timer task without live branches)."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
from tests_support import running_supervisor

from ctxd.config import Config
from ctxd.folding import RETRY_S, DeadlineTimer
from ctxd.sessions import Supervisor
from ctxd.sessions import _branch_ops as branch_ops
from ctxd.sessions import _session_ops as session_ops
from ctxd.wire.types import (
    BranchCreateParams,
    BranchCreateResult,
    BranchReturnParams,
    SessionOpenParams,
)


def _tasks(task: trio.lowlevel.Task) -> Iterator[trio.lowlevel.Task]:
    yield task
    for nursery in task.child_nurseries:
        for child in nursery.child_tasks:
            yield from _tasks(child)


def timer_tasks() -> int:
    """The deadline timers running: tasks of `DeadlineTimer._run` in trio's task tree."""
    return sum(task.name.endswith("DeadlineTimer._run")
               for task in _tasks(trio.lowlevel.current_root_task()))


class Calls:
    """An ``on_deadline`` that notes when it was called and returns the branches that
    are due, as the session actor's expiry does (those listed in ``failing`` stay)."""

    def __init__(self) -> None:
        self.deadlines: dict[str, float] = {}
        self.failing: set[str] = set()
        self.at: list[float] = []
        self.timer = DeadlineTimer(self)

    def arm(self, branch_id: str, deadline: float) -> None:
        self.deadlines[branch_id] = deadline
        self.timer.arm(branch_id, deadline)

    def disarm(self, branch_id: str) -> None:
        del self.deadlines[branch_id]
        self.timer.disarm(branch_id)

    async def __call__(self) -> None:
        now = trio.current_time()
        self.at.append(now)
        await trio.lowlevel.checkpoint()
        for branch_id, deadline in list(self.deadlines.items()):
            if deadline <= now and branch_id not in self.failing:
                self.disarm(branch_id)


async def test_the_timer_calls_at_the_earliest_deadline_and_retries_one_not_returned(
        autojump_clock: trio.testing.MockClock) -> None:
    calls = Calls()
    async with trio.open_nursery() as nursery:
        calls.timer.start(nursery)
        calls.arm("late", 30.0)
        calls.arm("early", 20.0)
        calls.failing.add("late")
        await trio.sleep(32.5)
        assert calls.at == [20.0, 30.0, 30.0 + RETRY_S, 30.0 + 2 * RETRY_S]
        calls.failing.clear()  # the store is back: the next try returns it
        await trio.sleep(1)
        assert calls.at[-1] == 30.0 + 3 * RETRY_S
        assert calls.deadlines == {}
        await trio.testing.wait_all_tasks_blocked()
        assert timer_tasks() == 0
        assert calls.timer.statistics().timer_running is False


async def test_coincident_deadlines_are_one_call(
        autojump_clock: trio.testing.MockClock) -> None:
    calls = Calls()
    async with trio.open_nursery() as nursery:
        calls.timer.start(nursery)
        for number in range(10_000):
            calls.arm(f"br_{number}", 60.0)
        assert timer_tasks() == 1
        assert calls.timer.statistics().armed == 10_000
        await trio.sleep(61)
    assert calls.at == [60.0]
    assert calls.deadlines == {}


async def test_a_return_moves_the_timer_to_the_next_deadline_and_the_last_ends_it(
        autojump_clock: trio.testing.MockClock) -> None:
    calls = Calls()
    async with trio.open_nursery() as nursery:
        calls.timer.start(nursery)
        calls.arm("first", 10.0)
        calls.arm("second", 20.0)
        calls.arm("third", 5.0)  # earlier than the one the timer sleeps for
        assert calls.timer.statistics().earliest == 5.0
        await trio.sleep(1)
        calls.disarm("third")
        calls.disarm("first")  # returned before their deadlines
        assert calls.timer.statistics().earliest == 20.0
        await trio.sleep(18)
        assert calls.at == []
        await trio.sleep(2)
        assert calls.at == [20.0]
        calls.arm("fourth", 100.0)
        await trio.testing.wait_all_tasks_blocked()
        assert timer_tasks() == 1
        calls.disarm("fourth")
        await trio.testing.wait_all_tasks_blocked()
        assert timer_tasks() == 0
        assert trio.current_time() == 21.0
    assert calls.at == [20.0]


async def test_branches_that_return_early_leave_no_heap_behind(
        autojump_clock: trio.testing.MockClock) -> None:
    calls = Calls()
    async with trio.open_nursery() as nursery:
        calls.timer.start(nursery)
        calls.arm("kept", 1_000.0)
        for number in range(5_000):
            calls.arm(f"br_{number}", 500.0 + number)
            calls.disarm(f"br_{number}")
        assert calls.timer.statistics().heap_entries <= 2 * 1 + 64
        nursery.cancel_scope.cancel()
    assert calls.at == []


# ---- a session actor's branches --------------------------------------------------------

@pytest.fixture
def clock() -> trio.testing.MockClock:
    """Virtual time that jumps only when every task has waited 10 ms of real time (the
    store's thread works in real time)."""
    return trio.testing.MockClock(autojump_threshold=0.01)


@pytest.fixture
async def supervisor(tmp_path: Path, clock: trio.testing.MockClock
                     ) -> AsyncIterator[Supervisor]:
    config = Config(session_idle_s=3600.0, max_live_branches=2000,
                    max_live_branches_per_session=200)
    async with running_supervisor(tmp_path / "ctxd.db", config) as running:
        yield running


async def create(supervisor: Supervisor, session_id: str, timeout_s: float
                 ) -> BranchCreateResult:
    params = BranchCreateParams(session_id=session_id, description="work", prompt="do it",
                                timeout_seconds=timeout_s, parent_branch_id=None)
    return await supervisor.call(session_id, lambda a: branch_ops.create_branch(a, params))


async def open_session(supervisor: Supervisor, session_id: str) -> None:
    await supervisor.call(session_id, lambda a: session_ops.open_session(
        a, SessionOpenParams(session_id=session_id)))


async def _real_time_limit(seconds: float) -> None:
    """Fail the test after ``seconds`` of real time (its clock only moves when told)."""
    await trio.to_thread.run_sync(time.sleep, seconds, abandon_on_cancel=True)
    raise AssertionError(f"no forced returns within {seconds} s of real time")


async def test_a_session_holds_a_timer_task_only_while_it_has_live_branches(
        supervisor: Supervisor, clock: trio.testing.MockClock) -> None:
    await open_session(supervisor, "s1")
    await trio.testing.wait_all_tasks_blocked()
    assert (supervisor.actor_count, timer_tasks()) == (1, 0)
    created = [await create(supervisor, "s1", 600) for _ in range(5)]
    await trio.testing.wait_all_tasks_blocked()
    assert timer_tasks() == 1
    for branch in created:
        await supervisor.call("s1", lambda a, b=branch.branch_id: branch_ops.return_branch(
            a, BranchReturnParams(branch_id=b, message="done")))
    await trio.testing.wait_all_tasks_blocked()
    assert timer_tasks() == 0
    assert supervisor.registry.count == 0


async def test_coincident_deadlines_of_many_branches_return_in_one_commit_at_the_deadline(
        supervisor: Supervisor, clock: trio.testing.MockClock) -> None:
    """200 branches of one session and 10 of each of 20 others, every deadline at the same
    instant: one timer per session wakes once, and each session returns its branches in
    one transaction."""
    clock.autojump_threshold = math.inf
    subscription = supervisor.bus.subscribe(None, ["branch.forced_return"])
    await open_session(supervisor, "big")
    deadline = trio.current_time() + 300
    for _ in range(200):
        await create(supervisor, "big", deadline - trio.current_time())
    for session in range(20):
        await open_session(supervisor, f"s{session}")
        for _ in range(10):
            await create(supervisor, f"s{session}", deadline - trio.current_time())
    await trio.testing.wait_all_tasks_blocked()
    assert (supervisor.registry.count, timer_tasks()) == (400, 21)
    commits = supervisor.store.statistics().commits
    clock.jump(deadline - trio.current_time())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_real_time_limit, 60.0)
        events = [await subscription.receive() for _ in range(400)]
        nursery.cancel_scope.cancel()
    assert trio.current_time() == deadline
    assert {(event.data["status"], event.data["reason"]) for event in events} == {
        ("timeout", "timeout")}
    assert supervisor.store.statistics().commits == commits + 21
    await trio.testing.wait_all_tasks_blocked()
    assert (supervisor.registry.count, timer_tasks()) == (0, 0)


async def test_a_branch_returned_before_its_deadline_is_not_force_returned(
        supervisor: Supervisor, clock: trio.testing.MockClock) -> None:
    await open_session(supervisor, "s1")
    early = await create(supervisor, "s1", 10)
    later = await create(supervisor, "s1", 20)
    subscription = supervisor.bus.subscribe("s1", ["branch.forced_return"])
    await supervisor.call("s1", lambda a: branch_ops.return_branch(
        a, BranchReturnParams(branch_id=early.branch_id, message="done")))
    await trio.sleep(25)
    event = await subscription.receive()
    assert (event.data["branch_id"], event.data["status"]) == (later.branch_id, "timeout")
    assert subscription.receive_nowait() is None
    info = (await supervisor.call("s1", lambda a: branch_ops.branch_status(
        a, early.branch_id))).branch
    assert (info.status, info.result) == ("completed", "done")

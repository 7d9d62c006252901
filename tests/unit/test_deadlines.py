"""One timer per session on trio's virtual clock: `folding.Deadlines` (coincident deadlines,
a deadline moved or ended by a return, no timer task without armed deadlines)."""

from __future__ import annotations

from collections.abc import Iterator

import trio
import trio.testing

from ctxd.folding import RETRY_S, Deadlines


def _tasks(task: trio.lowlevel.Task) -> Iterator[trio.lowlevel.Task]:
    yield task
    for nursery in task.child_nurseries:
        for child in nursery.child_tasks:
            yield from _tasks(child)


def timer_tasks() -> int:
    """The deadline timers running: tasks of `Deadlines._run` in trio's task tree."""
    return sum(task.name.endswith("Deadlines._run")
               for task in _tasks(trio.lowlevel.current_root_task()))


class Calls:
    """An ``on_deadline`` that notes when it was called and returns the branches that
    are due, as the session actor's expiry does (those listed in ``failing`` stay)."""

    def __init__(self) -> None:
        self.deadlines: dict[str, float] = {}
        self.failing: set[str] = set()
        self.at: list[float] = []
        self.timer = Deadlines(self)

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
        assert len(calls.timer._heap) <= 2 * 1 + 64
        nursery.cancel_scope.cancel()
    assert calls.at == []

"""ctxd.jobs: a Slot fulfilled once from a task or a thread; an owner's JobQueue."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import trio
import trio.testing

from ctxd.jobs import JobQueue, Slot


class Stopping(Exception):
    pass


async def test_a_slot_hands_its_value_to_the_task_that_waits(
        autojump_clock: trio.testing.MockClock) -> None:
    await trio.sleep(3)
    slot: Slot[str] = Slot()
    got: list[tuple[str, float]] = []

    async def waiter() -> None:
        got.append((await slot.wait(), trio.current_time()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(2)
        assert (slot.done, got) == (False, [])
        slot.set("answer")
        assert slot.done
    assert (got, slot.arrived) == ([("answer", 5.0)], 3.0)
    assert await slot.wait() == "answer"  # and again, to any later waiter


async def test_a_failed_slot_raises_its_error_in_every_waiter() -> None:
    slot: Slot[int] = Slot()
    error = ValueError("no answer")
    slot.fail(error)
    assert slot.done
    for _ in range(2):
        with pytest.raises(ValueError, match="no answer") as raised:
            await slot.wait()
        assert raised.value is error


async def test_a_slot_is_fulfilled_once() -> None:
    slot: Slot[int] = Slot()
    slot.set(1)
    with pytest.raises(RuntimeError, match="fulfilled once"):
        slot.set(2)
    with pytest.raises(RuntimeError, match="fulfilled once"):
        slot.fail(ValueError())
    assert await slot.wait() == 1


async def test_a_cancelled_wait_leaves_the_slot_to_be_fulfilled(
        autojump_clock: trio.testing.MockClock) -> None:
    slot: Slot[int] = Slot()
    with trio.move_on_after(1.5) as scope:
        await slot.wait()
    assert (scope.cancelled_caught, trio.current_time(), slot.done) == (True, 1.5, False)
    slot.set(4)
    assert await slot.wait() == 4


async def test_a_wait_is_a_checkpoint_even_when_the_value_is_in() -> None:
    slot: Slot[int] = Slot()
    slot.set(1)
    with trio.CancelScope() as scope:
        scope.cancel()
        await slot.wait()
    assert scope.cancelled_caught


@pytest.mark.parametrize(("fulfil", "expected"), [
    pytest.param(lambda slot: slot.set(7), 7, id="set"),
    pytest.param(lambda slot: slot.fail(ValueError("thread")), "thread", id="fail"),
])
async def test_a_thread_fulfils_a_slot_a_task_waits_on(
        fulfil: Callable[[Slot[int]], None], expected: object) -> None:
    slot: Slot[int] = Slot()
    outcomes: list[object] = []
    started = threading.Event()

    def in_a_thread() -> None:
        started.wait()
        fulfil(slot)

    async def waiter() -> None:
        try:
            outcomes.append(await slot.wait())
        except ValueError as exc:
            outcomes.append(str(exc))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        thread = threading.Thread(target=in_a_thread)
        thread.start()
        started.set()
        await trio.to_thread.run_sync(thread.join)
    assert (outcomes, slot.done) == ([expected], True)


def test_a_thread_fulfils_a_slot_whose_run_is_over() -> None:
    async def make() -> Slot[int]:
        return Slot()

    slot = trio.run(make)
    with ThreadPoolExecutor(1) as pool:
        pool.submit(slot.set, 1).result()  # nothing to wake, nothing raised
    assert slot.done


async def run_jobs(queue: JobQueue, *, task_status: trio.TaskStatus[None]
                   = trio.TASK_STATUS_IGNORED) -> None:
    """An owner task: runs jobs until cancelled, then closes its queue."""
    task_status.started()
    try:
        while True:
            job = await queue.receive()
            await job.run()
    finally:
        queue.close()


async def test_the_owner_runs_jobs_in_order_and_each_caller_gets_its_result() -> None:
    queue = JobQueue(4, Stopping)
    ran: list[int] = []

    async def job(n: int) -> int:
        ran.append(n)
        await trio.lowlevel.checkpoint()
        if n == 2:
            raise ValueError("two")
        return n * 10

    results: dict[int, object] = {}

    async def caller(n: int) -> None:
        try:
            results[n] = await queue.submit(lambda: job(n))
        except ValueError as exc:
            results[n] = exc.args[0]

    async with trio.open_nursery() as nursery:
        await nursery.start(run_jobs, queue)
        async with trio.open_nursery() as callers:
            for n in range(4):
                callers.start_soon(caller, n)
                await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert (ran, results) == ([0, 1, 2, 3], {0: 0, 1: 10, 2: "two", 3: 30})


async def test_a_job_cancelled_with_its_owner_fails_with_the_stopping_error(
        autojump_clock: trio.testing.MockClock) -> None:
    queue = JobQueue(4, Stopping)
    errors: list[str] = []

    async def caller(job_s: float) -> None:
        try:
            await queue.submit(functools.partial(trio.sleep, job_s))
        except Stopping:
            errors.append(f"stopping {job_s}")

    async with trio.open_nursery() as callers:
        async with trio.open_nursery() as owner:
            owner.start_soon(run_jobs, queue)
            callers.start_soon(caller, 10.0)  # running when the owner stops
            await trio.testing.wait_all_tasks_blocked()
            callers.start_soon(caller, 1.0)  # still queued then
            await trio.testing.wait_all_tasks_blocked()
            await trio.sleep(5)
            owner.cancel_scope.cancel()
    assert (sorted(errors), trio.current_time()) == (["stopping 1.0", "stopping 10.0"], 5.0)
    with pytest.raises(Stopping):
        await queue.submit(trio.lowlevel.checkpoint)


async def test_a_cancelled_caller_does_not_take_its_job_back(
        autojump_clock: trio.testing.MockClock) -> None:
    queue = JobQueue(4, Stopping)
    done: list[float] = []

    async def job() -> None:
        await trio.sleep(2)
        done.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        await nursery.start(run_jobs, queue)
        with trio.move_on_after(1) as scope:
            await queue.submit(job)
        assert scope.cancelled_caught
        await queue.submit(trio.lowlevel.checkpoint)  # queued behind it
        nursery.cancel_scope.cancel()
    assert done == [2.0]

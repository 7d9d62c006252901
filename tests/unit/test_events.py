"""The EventBus: seq written to the events table and kept across restarts, filters, lossy
buffers with a dropped marker, replay then live with no gap at the seam, the bounds."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import apsw
import pytest
import trio
import trio.testing

from ctxd.hub import EventBus
from ctxd.hub._events import Subscription
from ctxd.store import Store, Transaction


def drain(subscription: Subscription) -> list[tuple[str, int, dict[str, object]]]:
    out = []
    while True:
        try:
            event = subscription._receive.receive_nowait()
        except trio.WouldBlock:
            return out
        out.append((event.type, event.seq, event.data))


def table(path: Path) -> list[tuple[int, str]]:
    store = Store(path)
    store.open()
    try:
        return [(int(seq), str(type)) for seq, type in
                store.connection.execute("SELECT seq, type FROM events ORDER BY seq")]
    finally:
        store.close()


def age(path: Path, through_seq: int) -> None:
    """Make the events up to ``through_seq`` two days old."""
    store = Store(path)
    store.open()
    store.connection.execute("UPDATE events SET ts = ? WHERE seq <= ?",
                             (time.time() - 2 * 86_400, through_seq))
    store.close()


@asynccontextmanager
async def running(path: Path, **options: object) -> AsyncIterator[EventBus]:
    """A bus on a store at ``path``, its writer running."""
    store = Store(path)
    store.open()
    try:
        bus = EventBus(store=store, **options)  # type: ignore[arg-type]
        async with trio.open_nursery() as nursery:
            await nursery.start(bus.run)
            yield bus
            nursery.cancel_scope.cancel()
    finally:
        store.close()


async def written(bus: EventBus, seq: int) -> None:
    """Wait until the writer has written (and sent) the event ``seq``: a watcher of what
    comes after the last written seq sees the queued events too (a plain subscription
    would not: they were published before it)."""
    watcher = bus.subscribe(since_seq=bus.seq)
    while bus.seq < seq:
        await watcher.receive()
    bus.unsubscribe(watcher.subscription_id)


async def take(subscription: Subscription, count: int) -> list[tuple[str, int, object]]:
    return [(event.type, event.seq, event.data)
            for event in [await subscription.receive() for _ in range(count)]]


async def test_seq_is_monotonic_and_filters_apply(tmp_path: Path) -> None:
    async with running(tmp_path / "db", buffer=16) as bus:
        everything = bus.subscribe()
        one_session = bus.subscribe(session_id="a")
        appends_only = bus.subscribe(types=["message.appended"])
        bus.publish("a", "session.opened", {})
        bus.publish("b", "message.appended", {"n": 1})
        bus.publish("a", "message.appended", {"n": 2})
        assert bus.seq == 0  # queued: nobody sees an event before it is written
        await written(bus, 3)
        assert [(t, s) for t, s, _ in drain(everything)] == [
            ("session.opened", 1), ("message.appended", 2), ("message.appended", 3)]
        assert [s for _, s, _ in drain(one_session)] == [1, 3]
        assert [s for _, s, _ in drain(appends_only)] == [2, 3]
    assert table(tmp_path / "db") == [(1, "session.opened"), (2, "message.appended"),
                                      (3, "message.appended")]


async def test_seq_continues_after_a_restart(tmp_path: Path) -> None:
    async with running(tmp_path / "db") as bus:
        for n in range(5):
            bus.publish("a", "tick", {"n": n})
    async with running(tmp_path / "db") as bus:
        assert bus.seq == 5  # a graceful stop wrote what was queued
        bus.publish("a", "tick", {"n": 5})
        await written(bus, 6)
        resumed = bus.subscribe(since_seq=3)
        assert await take(resumed, 3) == [("tick", 4, {"n": 3}), ("tick", 5, {"n": 4}),
                                          ("tick", 6, {"n": 5})]
    assert [seq for seq, _ in table(tmp_path / "db")] == [1, 2, 3, 4, 5, 6]


async def test_replay_then_live_with_no_gap_and_no_duplicate(tmp_path: Path) -> None:
    async with running(tmp_path / "db", buffer=10_000) as bus:
        for n in range(5_000):
            bus.publish("a" if n % 2 else "b", "tick", {"n": n})
        await written(bus, 5_000)
        late = bus.subscribe(since_seq=10)
        only_a = bus.subscribe(session_id="a", since_seq=0)
        seen: list[int] = []
        seen_a: list[int] = []
        # Events keep coming while both replay: the seam falls somewhere among them.
        for n in range(5_000, 6_000):
            bus.publish("a" if n % 2 else "b", "tick", {"n": n})
            seen.append((await late.receive()).seq)
            seen_a.append((await only_a.receive()).seq)
        while len(seen) < 5_990:
            seen.append((await late.receive()).seq)
        while len(seen_a) < 3_000:
            seen_a.append((await only_a.receive()).seq)
        assert seen == list(range(11, 6_001))
        assert seen_a == list(range(2, 6_001, 2))
        bus.publish("a", "tick", {"n": 6_000})
        assert (await late.receive()).seq == (await only_a.receive()).seq == 6_001


async def test_a_slow_subscriber_loses_events_but_is_told_how_many(tmp_path: Path) -> None:
    async with running(tmp_path / "db", buffer=3) as bus:
        slow = bus.subscribe()
        for n in range(10):
            bus.publish("a", "tick", {"n": n})  # never blocks, though nobody reads
        await written(bus, 10)
        assert [d["n"] for _, _, d in drain(slow)] == [0, 1, 2]
        bus.publish("a", "tick", {"n": 10})
        await written(bus, 11)
        assert drain(slow) == [("dropped", 10, {"dropped": 7}), ("tick", 11, {"n": 10})]


async def test_losses_are_reported_when_the_backlog_drains(tmp_path: Path) -> None:
    async with running(tmp_path / "db", buffer=2) as bus:
        slow = bus.subscribe()
        for n in range(5):
            bus.publish("a", "tick", {"n": n})
        await written(bus, 5)
        assert await take(slow, 3) == [("tick", 1, {"n": 0}), ("tick", 2, {"n": 1}),
                                       ("dropped", 5, {"dropped": 3})]
        bus.publish("a", "tick", {"n": 5})
        assert (await slow.receive()).data == {"n": 5}


async def test_events_keep_prunes_the_oldest_and_a_late_subscriber_is_told(
        tmp_path: Path) -> None:
    async with running(tmp_path / "db", keep=10) as bus:
        for n in range(25):
            bus.publish("a", "tick", {"n": n})
        await written(bus, 25)
        assert [seq for seq, _ in table(tmp_path / "db")] == list(range(16, 26))
        too_old = bus.subscribe(since_seq=3)
        assert await take(too_old, 3) == [("dropped", 15, {"dropped": 12}),
                                          ("tick", 16, {"n": 15}), ("tick", 17, {"n": 16})]
    async with running(tmp_path / "db", keep=200) as bus:
        assert bus.seq == 25  # pruning never takes the seq back


async def test_pruning_comes_in_steps_of_a_hundredth_of_events_keep(tmp_path: Path) -> None:
    async with running(tmp_path / "db", keep=1_000) as bus:
        for n in range(1_015):
            bus.publish(None, "tick", {"n": n})
        await written(bus, 1_015)
    # seqs up to 10 (a whole step of 10 past keep) are gone; 11..15 wait for the next step
    assert [seq for seq, _ in table(tmp_path / "db")] == list(range(11, 1_016))


async def test_retention_removes_old_events_at_start_up_and_keeps_the_seq(
        tmp_path: Path) -> None:
    async with running(tmp_path / "db") as bus:
        for n in range(4):
            bus.publish("a", "tick", {"n": n})
    age(tmp_path / "db", 3)
    async with running(tmp_path / "db", retention_days=1.0) as bus:
        assert bus.seq == 4
        assert table(tmp_path / "db") == [(4, "tick")]
        replay = bus.subscribe(since_seq=0)
        assert await take(replay, 2) == [("dropped", 3, {"dropped": 3}), ("tick", 4, {"n": 3})]
    age(tmp_path / "db", 4)
    async with running(tmp_path / "db", retention_days=1.0) as bus:
        assert bus.seq == 4  # every event expired: the seq still goes on from 4
        bus.publish("a", "tick", {})
        await written(bus, 5)
    assert table(tmp_path / "db") == [(5, "tick")]


async def test_without_a_store_events_are_sent_at_once_and_kept_nowhere() -> None:
    bus = EventBus()
    subscription = bus.subscribe(since_seq=0)
    bus.publish(None, "tick", {})
    assert drain(subscription) == [("tick", 1, {})]


async def test_unsubscribe_ends_the_stream(tmp_path: Path) -> None:
    async with running(tmp_path / "db") as bus:
        bus.publish(None, "tick", {})
        await written(bus, 1)
        for subscribe in (bus.subscribe, lambda: bus.subscribe(since_seq=0)):
            subscription = subscribe()
            assert bus.unsubscribe(subscription.subscription_id) is True
            assert bus.unsubscribe(subscription.subscription_id) is False
            bus.publish(None, "tick", {})
            try:
                await subscription.receive()
            except trio.EndOfChannel:
                pass
            else:
                raise AssertionError("a closed subscription must end")



async def test_a_new_subscriber_gets_what_is_published_after_it(tmp_path: Path) -> None:
    async with running(tmp_path / "db") as bus:
        bus.publish("a", "message.appended", {"n": 1})  # queued, not yet written
        late = bus.subscribe()
        bus.publish("a", "message.appended", {"n": 2})
        await written(bus, 2)
        assert drain(late) == [("message.appended", 2, {"n": 2})]


async def test_a_forgotten_session_leaves_no_event_in_the_table(tmp_path: Path) -> None:
    async with running(tmp_path / "db") as bus:
        bus.publish("a", "branch.created", {"description": "secret plan"})
        bus.publish("b", "session.opened", {})
        await written(bus, 2)
        bus.publish("a", "branch.folded", {"result": "secret result"})  # still queued
        bus.forget("a")
        bus.publish("a", "session.deleted", {"messages_deleted": 4})
        await written(bus, 4)
    assert table(tmp_path / "db") == [(2, "session.opened"), (4, "session.deleted")]


async def test_the_seq_goes_on_after_a_restart_when_the_newest_events_were_forgotten(
        tmp_path: Path) -> None:
    async with running(tmp_path / "db") as bus:
        bus.publish("b", "session.opened", {})
        bus.publish("a", "branch.created", {})
        bus.publish("a", "branch.folded", {})
        await written(bus, 3)
        bus.forget("a")
    assert table(tmp_path / "db") == [(1, "session.opened")]
    async with running(tmp_path / "db") as bus:
        assert bus.seq == 3
        bus.publish(None, "tick", {})
        await written(bus, 4)
    assert table(tmp_path / "db") == [(1, "session.opened"), (4, "tick")]


def staged(bus: EventBus, session_id: str, *types: str) -> Transaction:
    """A request's transaction that writes nothing of its own but ``types`` as events."""
    transaction = Transaction()
    bus.stage(transaction, session_id, [(type, {"n": n}) for n, type in enumerate(types)])
    return transaction


def store_of(bus: EventBus) -> Store:
    assert bus._store is not None
    return bus._store


async def test_staged_events_are_written_with_the_request_and_sent_once_it_committed(
        tmp_path: Path) -> None:
    async with running(tmp_path / "db") as bus:
        everything = bus.subscribe()
        bus.publish("a", "session.opened", {})
        await written(bus, 1)
        assert drain(everything) == [("session.opened", 1, {})]
        transaction = staged(bus, "a", "result.offloaded", "message.appended")
        assert (bus.seq, drain(everything)) == (1, [])  # nothing before the commit
        await store_of(bus).commit(transaction)
        assert bus.seq == 3
        assert drain(everything) == [("result.offloaded", 2, {"n": 0}),
                                     ("message.appended", 3, {"n": 1})]
        assert table(tmp_path / "db") == [(1, "session.opened"), (2, "result.offloaded"),
                                          (3, "message.appended")]


async def test_a_rolled_back_request_sends_none_of_its_events_and_leaves_no_gap(
        tmp_path: Path) -> None:
    async with running(tmp_path / "db") as bus:
        everything = bus.subscribe()
        transaction = staged(bus, "a", "message.appended")

        def fails(conn: apsw.Connection) -> None:
            raise ValueError("the request's own write failed")

        transaction.add(fails)  # after the events' insert: their seq was given, then freed
        with pytest.raises(ValueError, match="own write failed"):
            await store_of(bus).commit(transaction)
        assert (bus.seq, drain(everything)) == (0, [])
        await store_of(bus).commit(staged(bus, "a", "message.appended"))
        bus.publish("a", "context.health", {})
        await written(bus, 2)
        assert drain(everything) == [("message.appended", 1, {"n": 0}),
                                     ("context.health", 2, {})]
    assert table(tmp_path / "db") == [(1, "message.appended"), (2, "context.health")]


async def test_events_published_before_keep_the_lower_seqs(tmp_path: Path) -> None:
    async with running(tmp_path / "db") as bus:
        everything = bus.subscribe()
        bus.publish("a", "context.compacted", {})  # queued: the writer has not taken it
        await store_of(bus).commit(staged(bus, "a", "message.appended"))
        await written(bus, 2)
        assert [(type, seq) for type, seq, _ in drain(everything)] == [
            ("context.compacted", 1), ("message.appended", 2)]


async def test_events_are_sent_in_seq_order_whichever_write_comes_back_first(
        tmp_path: Path) -> None:
    async with running(tmp_path / "db") as bus:
        everything = bus.subscribe()
        store = store_of(bus)
        gate = threading.Event()
        store._worker.submit(gate.wait)  # type: ignore[union-attr]  # hold the writer
        bus.publish("a", "branch.created", {})
        await trio.testing.wait_all_tasks_blocked()  # the bus's write waits behind it
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.commit, staged(bus, "a", "message.appended"))
            await trio.testing.wait_all_tasks_blocked()
            gate.set()
        await written(bus, 2)
        assert [(type, seq) for type, seq, _ in drain(everything)] == [
            ("branch.created", 1), ("message.appended", 2)]


async def test_staged_events_past_events_keep_have_the_writer_prune(tmp_path: Path) -> None:
    async with running(tmp_path / "db", keep=10) as bus:
        store = store_of(bus)
        for _ in range(25):
            await store.commit(staged(bus, "a", "message.appended"))
        await trio.testing.wait_all_tasks_blocked()  # the writer's prune is submitted
        await store.read(lambda conn: None)  # and done: the store runs jobs in order
        assert bus.seq == 25  # sent to nobody, but numbered all the same
        assert [seq for seq, _ in table(tmp_path / "db")] == list(range(16, 26))
        late = bus.subscribe(since_seq=23)
        assert await take(late, 2) == [("message.appended", 24, {"n": 0}),
                                       ("message.appended", 25, {"n": 0})]


async def test_without_a_store_staged_events_are_sent_after_the_commit(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "db")
    store.open()
    try:
        bus = EventBus()
        everything = bus.subscribe()
        transaction = staged(bus, "a", "message.appended")
        assert drain(everything) == []
        await store.commit(transaction)
        assert drain(everything) == [("message.appended", 1, {"n": 0})]
    finally:
        store.close()

"""The EventBus: monotonic seq, filters, lossy buffers with a dropped marker, resumption."""

import trio

from ctxd.hub import EventBus


def drain(subscription: object) -> list[tuple[str, int, dict[str, object]]]:
    out = []
    while True:
        try:
            event = subscription._receive.receive_nowait()  # type: ignore[attr-defined]
        except trio.WouldBlock:
            return out
        out.append((event.type, event.seq, event.data))


async def test_seq_is_monotonic_and_filters_apply() -> None:
    bus = EventBus(buffer=16, history=100)
    everything = bus.subscribe()
    one_session = bus.subscribe(session_id="a")
    appends_only = bus.subscribe(types=["message.appended"])
    bus.publish("a", "session.opened", {})
    bus.publish("b", "message.appended", {"n": 1})
    bus.publish("a", "message.appended", {"n": 2})
    assert [(t, s) for t, s, _ in drain(everything)] == [
        ("session.opened", 1), ("message.appended", 2), ("message.appended", 3)]
    assert [s for _, s, _ in drain(one_session)] == [1, 3]
    assert [s for _, s, _ in drain(appends_only)] == [2, 3]


async def test_a_slow_subscriber_loses_events_but_is_told_how_many() -> None:
    bus = EventBus(buffer=3, history=100)
    slow = bus.subscribe()
    for n in range(10):
        bus.publish("a", "tick", {"n": n})  # never blocks, though nobody reads
    assert [d["n"] for _, _, d in drain(slow)] == [0, 1, 2]
    bus.publish("a", "tick", {"n": 10})
    assert drain(slow) == [("dropped", 10, {"dropped": 7}), ("tick", 11, {"n": 10})]


async def test_losses_are_reported_when_the_backlog_drains() -> None:
    bus = EventBus(buffer=2, history=100)
    slow = bus.subscribe()
    for n in range(5):
        bus.publish("a", "tick", {"n": n})
    received = [await slow.receive() for _ in range(3)]
    assert [(e.type, e.seq, e.data) for e in received] == [
        ("tick", 1, {"n": 0}), ("tick", 2, {"n": 1}), ("dropped", 5, {"dropped": 3})]
    bus.publish("a", "tick", {"n": 5})
    assert (await slow.receive()).data == {"n": 5}


async def test_resume_from_since_seq() -> None:
    bus = EventBus(buffer=100, history=5)
    for n in range(8):
        bus.publish("a", "tick", {"n": n})  # seq 1..8; history keeps 4..8
    resumed = bus.subscribe(since_seq=5)
    assert [s for _, s, _ in drain(resumed)] == [6, 7, 8]
    too_old = bus.subscribe(since_seq=1)  # 2 and 3 have left the history
    assert drain(too_old)[:2] == [("dropped", 3, {"dropped": 2}), ("tick", 4, {"n": 3})]


async def test_unsubscribe_ends_the_stream() -> None:
    bus = EventBus()
    subscription = bus.subscribe()
    assert bus.unsubscribe(subscription.subscription_id) is True
    assert bus.unsubscribe(subscription.subscription_id) is False
    bus.publish(None, "tick", {})
    try:
        await subscription.receive()
    except trio.EndOfChannel:
        pass
    else:
        raise AssertionError("a closed subscription must end")

"""A turn cancel the agent does not answer (ctxd/hub/_turns.py): ended by ctxd after
``cancel_timeout_s`` of virtual time, and only then; one answered in time is not."""

from __future__ import annotations

import trio
import trio.testing

from ctxd.hub import EventBus, Turns


async def test_an_unanswered_cancel_ends_the_turn_at_its_timeout(
        autojump_clock: trio.testing.MockClock) -> None:
    stopped: list[tuple[str, str, float]] = []

    def terminated(session_id: str, turn_id: str) -> int:
        stopped.append((session_id, turn_id, trio.current_time()))
        return 2

    turns = Turns(EventBus(), cancel_timeout_s=10.0, terminated=terminated)
    async with trio.open_nursery() as nursery:
        await nursery.start(turns.run)
        turns.start("s", "quiet")
        turns.start("s", "answers")
        turns.start("s", "later")
        turns.cancel("s", "quiet", "stop")
        turns.cancel("s", "answers", None)
        await trio.sleep(4)
        turns.cancel("s", "later", None)  # its own ten seconds, from now
        turns.end("s", "answers", True)
        await trio.sleep(5.9)
        assert stopped == []
        await trio.sleep(0.2)
        assert stopped == [("s", "quiet", 10.0)]
        await trio.sleep(4)
        assert stopped == [("s", "quiet", 10.0), ("s", "later", 14.0)]
        nursery.cancel_scope.cancel()
    quiet, answers, later = (turns.get("s", name) for name in ("quiet", "answers", "later"))
    assert (quiet.state, quiet.terminated, quiet.cancelled) == ("ended", True, None)
    assert (answers.state, answers.terminated, answers.cancelled) == ("ended", False, True)
    assert (later.state, later.terminated) == ("ended", True)

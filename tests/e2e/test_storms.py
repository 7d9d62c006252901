"""A storm of requests on one session against a real daemon: identical compactions share
one run, so that its appends are not held up behind them (docs/protocol.md,
"Compaction")."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from e2e.test_cancel import WINDOW, Gated, cancelled_error, chat, gated_daemon

from ctxclient import Client

SUMMARIZE = {"strategies": ["summarize"]}


@pytest.fixture
def gated(daemon_root: Path) -> Iterator[Gated]:
    """A daemon that compacts only when asked, with a summarizer the test releases."""
    daemon = gated_daemon(daemon_root, "--hygiene-auto-compact", "false")
    with daemon.process.running():
        yield daemon


def started_all(client: Client) -> None:
    """Returns once every request this client sent before has started in the daemon:
    a connection starts its requests in the order they came, and a compaction shares
    another's, or is queued at its session, before the next one starts."""
    client.call("session.list", {"limit": 1})


def results(futures: list[Future[Any]]) -> list[Any]:
    return [future.result(30) for future in futures]


def test_identical_compactions_pipelined_behind_one_share_its_run(gated: Gated,
                                                                  sid: str) -> None:
    compact = {"session_id": sid, **SUMMARIZE}
    with gated.process.client() as client, gated.process.client() as other:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        client.call("message.append", {"session_id": sid, "messages": chat(10, 450)})
        first = client.submit("context.compact", compact)
        gated.wait_started()
        # Pipelined on one connection, they reach the session in this order.
        same = [client.submit("context.compact", compact) for _ in range(2)]
        left = client.submit("context.compact", compact, request_id="compact-left")
        other_strategies = client.submit("context.compact", {"session_id": sid,
                                                             "strategies": ["truncate"]})
        appended = client.submit("message.append", {"session_id": sid,
                                                    "messages": chat(1, 20)})
        after_append = client.submit("context.compact", compact)
        started_all(client)
        answer = other.cancel("compact-left", "no longer wanted")
        error = cancelled_error(left)
        assert not first.done()  # the one it waited for goes on
        gated.release()
        done = first.result(30)
        shared = results(same)
        truncating, after = results([other_strategies, after_append])
        messages = appended.result(30)
    assert done["coalesced"] is False
    assert (done["summarized"], done["after_msgs"]) == (5, 6)
    # One run for the three that came while it was the last thing queued.
    assert shared == [done | {"coalesced": True}] * 2
    assert answer == {"request_id": "compact-left", "cancelled": 1, "finishing": 0}
    assert (error.code, error.message) == (
        -32006, "request 'compact-left' was cancelled: no longer wanted")
    # Different strategies are a compaction of their own; one queued after the append is
    # too, and sees the message appended (both find the thread under its target).
    assert (truncating["coalesced"], truncating["strategies_run"]) == (False, [])
    assert truncating["before_tokens"] == done["after_tokens"]
    assert messages["appended"][0]["seq"] == 12  # 10, the summary, then this one
    assert (after["coalesced"], after["strategies_run"]) == (False, [])
    assert after["before_msgs"] == done["after_msgs"] + 1


def test_compactions_sharing_a_cancelled_one_run_their_own(gated: Gated, sid: str) -> None:
    compact = {"session_id": sid, **SUMMARIZE}
    with gated.process.client() as client, gated.process.client() as other:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        client.call("message.append", {"session_id": sid, "messages": chat(10, 450)})
        first = client.submit("context.compact", compact, request_id="compact-first")
        gated.wait_started()
        same = [client.submit("context.compact", compact) for _ in range(2)]
        started_all(client)
        other.cancel("compact-first", "stop")
        error = cancelled_error(first)
        gated.release()  # the next run's summarizer writes at once
        shared = sorted(results(same), key=lambda done: done["coalesced"])
    assert error.code == -32006
    # Nothing was written by the cancelled one: one of the two ran the compaction, the
    # other shared it.
    assert [done["coalesced"] for done in shared] == [False, True]
    assert shared[0]["summarized"] == 5
    assert shared[1] == shared[0] | {"coalesced": True}

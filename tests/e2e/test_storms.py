"""A storm of requests on one session against a real daemon: identical compactions share
one run, and slow searches of offloaded results leave the session's mailbox, so that its
appends and renders are not held up behind them (docs/protocol.md, "Compaction" and
"Offloaded tool results")."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonProcess
from e2e.test_cancel import WINDOW, Gated, cancelled_error, chat, gated_daemon
from e2e.test_hygiene import listed, start, tool

import ctxclient
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


def test_slow_searches_leave_the_session_to_its_other_requests(daemon: DaemonProcess,
                                                               sid: str) -> None:
    with daemon.client() as client, daemon.client() as other:
        start(client, sid)
        client.call("message.append", {"session_id": sid, "messages": [tool("a" * 5000)]})
        ref_id = listed(client, sid)[-1]["ref_id"]
        # Each backtracks without end: it would run 5 s, its time limit.
        searches = [client.submit("result.read", {"session_id": sid, "ref_id": ref_id,
                                                  "pattern": "(a+)+b"},
                                  request_id=f"search-{i}") for i in range(3)]
        # Behind them on the same connection, for the same session: answered while they
        # still run (the session's mailbox does not hold them).
        appended = client.call("message.append", {"session_id": sid,
                                                  "messages": chat(1, 20)})
        rendered = client.call("ctxd.render", {"session_id": sid})
        answers = [other.cancel(f"search-{i}", "enough") for i in range(3)]
        errors = [cancelled_error(search) for search in searches]
    assert appended["appended"][0]["seq"] == 5
    assert rendered["stats"]["stored_messages"] == 5
    assert answers == [{"request_id": f"search-{i}", "cancelled": 1, "finishing": 0}
                       for i in range(3)]
    assert [(e.code, e.message) for e in errors] == [
        (-32006, f"request 'search-{i}' was cancelled: enough") for i in range(3)]


def test_a_search_reads_the_result_as_it_was_when_asked(daemon: DaemonProcess,
                                                        sid: str) -> None:
    with daemon.client() as client:
        start(client, sid)
        client.call("message.append", {"session_id": sid, "messages": [
            tool("needle\n" * 1000)]})
        ref_id = listed(client, sid)[-1]["ref_id"]
        found = client.submit("result.read", {"session_id": sid, "ref_id": ref_id,
                                              "pattern": "^needle$", "max_matches": 1})
        deleted = client.call("session.delete", {"session_id": sid})
        searched = found.result(30)
        with pytest.raises(ctxclient.NotFound):
            client.call("result.read", {"session_id": sid, "ref_id": ref_id})
    assert deleted["deleted"] is True
    assert (searched["matched_lines"], searched["more_matches"]) == (1000, 999)

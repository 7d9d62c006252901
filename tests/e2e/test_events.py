"""events.subscribe over the socket: notifications, filters, resumption, slow subscribers."""

from __future__ import annotations

import contextlib
import queue
import socket
import time
from pathlib import Path

import msgspec
import pytest
from conftest import DaemonProcess
from tests_support import next_event

from ctxclient import RpcError


def test_session_events_stream_in_order(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as watcher, shared_daemon.client() as agent:
        subscribed = watcher.call("events.subscribe", {"session_id": sid})
        assert subscribed["subscription_id"].startswith("sub_")
        agent.call("session.open", {"session_id": sid, "budget": {
            "context_window": 1100, "max_output_tokens": 100}})
        agent.call("message.append", {"session_id": sid, "messages": [
            {"role": "user", "content": "hello" + " hello" * 799}]})
        agent.call("session.close", {"session_id": sid})
        events = [next_event(watcher) for _ in range(4)]
    assert [e["type"] for e in events] == [
        "session.opened", "message.appended", "context.health", "session.closed"]
    assert all(e["session_id"] == sid for e in events)
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(set(seqs))
    assert seqs[0] > subscribed["seq"]
    assert events[1]["data"] == {"branch_id": None, "first_seq": 1, "last_seq": 1, "count": 1,
                                 "tokens": 804, "main_thread_tokens": 807}
    assert events[2]["data"] == {"from": "ok", "to": "caution", "usage": 0.807}


def test_type_filter_and_unsubscribe(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as watcher, shared_daemon.client() as agent:
        subscription = watcher.call("events.subscribe", {"session_id": sid,
                                                         "types": ["session.closed"]})
        agent.call("session.open", {"session_id": sid})
        agent.call("session.close", {"session_id": sid})
        assert next_event(watcher)["type"] == "session.closed"
        assert watcher.call("events.unsubscribe", {
            "subscription_id": subscription["subscription_id"]}) == {"unsubscribed": True}
        agent.call("session.open", {"session_id": sid})
        agent.call("session.close", {"session_id": sid})
        watcher.call("daemon.ping")  # any event would have arrived before this answer
        assert watcher.notifications.empty()
        with pytest.raises(RpcError) as caught:
            watcher.call("events.unsubscribe", {"subscription_id": "sub_999999"})
        assert caught.value.code == -32004


def test_resume_with_since_seq(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as agent:
        opened_seq = agent.call("events.subscribe", {"session_id": sid})["seq"]
        agent.call("session.open", {"session_id": sid})
        agent.call("session.close", {"session_id": sid})
    with shared_daemon.client() as late:
        late.call("events.subscribe", {"session_id": sid, "since_seq": opened_seq})
        assert [next_event(late)["type"] for _ in range(2)] == ["session.opened",
                                                                 "session.closed"]


def test_a_subscriber_that_never_reads_blocks_nobody(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root, extra_args=["--event-buffer", "8"]).start()
    stack = contextlib.ExitStack()
    try:
        stalled = socket.socket(socket.AF_UNIX)
        stack.callback(stalled.close)
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(str(process.socket))
        stalled.sendall(b'{"jsonrpc":"2.0","id":1,"method":"events.subscribe"}\n')
        payload = "x" * 2000
        with process.client() as agent:
            agent.call("session.open", {"session_id": "busy", "budget": {
                "context_window": 10_000_000}})
            started = time.monotonic()
            for i in range(1500):
                agent.call("message.append", {"session_id": "busy", "messages": [
                    {"role": "user", "content": f"{i} {payload}"}]})
            elapsed = time.monotonic() - started
            got = agent.call("session.get", {"session_id": "busy"})["session"]
            assert got["message_count"] == 1500
        assert elapsed < 60
        # The stalled subscriber now reads: it finds a "dropped" marker among its events.
        stalled.settimeout(10)
        received = b""
        while b'"dropped"' not in received and len(received) < 10_000_000:
            chunk = stalled.recv(65536)
            if not chunk:
                break
            received += chunk
        lines = [msgspec.json.decode(line) for line in received.split(b"\n")[:-1]]
        dropped = [m["params"] for m in lines
                   if m.get("method") == "event" and m["params"]["type"] == "dropped"]
        assert dropped
        assert dropped[0]["data"]["dropped"] > 0
    finally:
        stack.close()
        assert process.stop() == 0


def test_events_reach_several_subscribers(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as a, shared_daemon.client() as b, \
            shared_daemon.client() as agent:
        for watcher in (a, b):
            watcher.call("events.subscribe", {"session_id": sid})
        agent.call("session.open", {"session_id": sid})
        for watcher in (a, b):
            assert next_event(watcher)["type"] == "session.opened"
            with pytest.raises(queue.Empty):
                watcher.notifications.get(timeout=0.05)


def test_subscriptions_per_connection_are_capped(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root,
                            extra_args=["--max-subscriptions-per-connection", "2"]).start()
    try:
        with process.client() as watcher:
            first = watcher.call("events.subscribe")
            watcher.call("events.subscribe")
            with pytest.raises(RpcError) as caught:
                watcher.call("events.subscribe")
            assert (caught.value.code, caught.value.data["limit"], caught.value.data["max"]) == (
                -32005, "max_subscriptions_per_connection", 2)
            watcher.call("events.unsubscribe", {"subscription_id": first["subscription_id"]})
            assert watcher.call("events.subscribe")["subscription_id"].startswith("sub_")
    finally:
        assert process.stop() == 0

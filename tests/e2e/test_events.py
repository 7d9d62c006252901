"""events.subscribe over the socket: notifications, filters, resumption, slow subscribers."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import apsw
import msgspec
import pytest
from conftest import DaemonProcess
from tests_support import next_event

from ctxclient import Client, RpcError


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
        # Were the agent held back by the subscriber, its next call would never be
        # answered (and raise Timeout after the client's 30 s): each one is.
        with process.client() as agent:
            agent.call("session.open", {"session_id": "busy", "budget": {
                "context_window": 10_000_000}})
            for i in range(1500):
                agent.call("message.append", {"session_id": "busy", "messages": [
                    {"role": "user", "content": f"{i} {payload}"}]})
            got = agent.call("session.get", {"session_id": "busy"})["session"]
            assert got["message_count"] == 1500
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


def stored_seqs(process: DaemonProcess) -> list[int]:
    """The seqs in the events table of a stopped daemon."""
    conn = apsw.Connection(str(process.data_dir / "ctxd.db"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return [int(row[0]) for row in conn.execute("SELECT seq FROM events ORDER BY seq")]
    finally:
        conn.close()


def replay(client: Client, since_seq: int, **params: Any) -> tuple[int, list[dict[str, Any]]]:
    """Subscribe from ``since_seq``: the daemon's last seq and every event up to it."""
    last = client.call("events.subscribe", {"since_seq": since_seq, **params})["seq"]
    events = []
    while not events or events[-1]["seq"] < last:
        events.append(next_event(client))
    return last, events


def test_events_replay_across_a_sigkill_and_restart_with_no_gap_and_no_duplicate(
        daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root).start()
    seen: list[dict[str, Any]] = []
    with process.client() as watcher:
        watcher.call("events.subscribe")
        # Pipelined appends, unanswered: the kill lands while events are being written.
        agent = socket.socket(socket.AF_UNIX)
        agent.connect(str(process.socket))
        lines = [{"jsonrpc": "2.0", "id": 0, "method": "session.open",
                  "params": {"session_id": "k"}}]
        lines += [{"jsonrpc": "2.0", "id": n, "method": "message.append", "params": {
            "session_id": "k", "messages": [{"role": "user", "content": f"m{n}"}]}}
            for n in range(1, 400)]
        agent.sendall(b"".join(msgspec.json.encode(line) + b"\n" for line in lines))
        while len(seen) < 20:
            seen.append(next_event(watcher))
        process.kill()
        agent.close()
        while True:  # what reached the watcher before the kill
            try:
                seen.append(next_event(watcher, timeout=0.5))
            except queue.Empty:
                break
    process.start()
    try:
        with process.client() as late:
            last, replayed = replay(late, 0)
            assert [e["seq"] for e in replayed] == list(range(1, last + 1))
            assert replayed[:len(seen)] == seen  # every event seen live was kept as seen
            assert [e["data"]["first_seq"] for e in replayed
                    if e["type"] == "message.appended"] == list(range(1, len(
                        [e for e in replayed if e["type"] == "message.appended"]) + 1))
            with process.client() as agent2:
                agent2.call("session.open", {"session_id": "after"})
            new = next_event(late)
            assert (new["seq"], new["session_id"], new["type"]) == (
                last + 1, "after", "session.opened")
    finally:
        assert process.stop() == 0
    assert stored_seqs(process) == list(range(1, last + 2))


def test_seq_and_replay_survive_a_graceful_restart(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root).start()
    with process.client() as agent:
        agent.call("session.open", {"session_id": "g"})
        agent.call("session.close", {"session_id": "g"})
    assert process.stop() == 0
    process.start()
    try:
        with process.client() as late:
            last, replayed = replay(late, 0, session_id="g")
            assert (last, [(e["seq"], e["type"]) for e in replayed]) == (
                2, [(1, "session.opened"), (2, "session.closed")])
            late.call("session.open", {"session_id": "g"})
            new = next_event(late)
            assert (new["seq"], new["type"]) == (3, "session.opened")
    finally:
        assert process.stop() == 0


def test_events_keep_bounds_the_table_and_a_late_subscriber_is_told(
        daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root, extra_args=["--events-keep", "10"]).start()
    try:
        with process.client() as agent:
            for n in range(12):  # 24 events
                agent.call("session.open", {"session_id": f"s{n}"})
                agent.call("session.close", {"session_id": f"s{n}"})
        with process.client() as late:
            # The last events of answered requests may still be on their way to the table
            # (docs/decisions.md, Events): wait for the 24th rather than the answer's seq.
            late.call("events.subscribe", {"since_seq": 3})
            replayed = [next_event(late)]
            while replayed[-1]["seq"] < 24:
                replayed.append(next_event(late))
        assert [(e["seq"], e["type"], e["data"]) for e in replayed[:1]] == [
            (14, "dropped", {"dropped": 11})]
        assert [e["seq"] for e in replayed[1:]] == list(range(15, 25))
        assert (replayed[1]["type"], replayed[1]["session_id"]) == ("session.opened", "s7")
    finally:
        assert process.stop() == 0
    assert stored_seqs(process) == list(range(15, 25))


def test_ctxctl_events_since_replays_then_follows(daemon: DaemonProcess) -> None:
    with daemon.client() as agent:
        agent.call("session.open", {"session_id": "c"})
        agent.call("session.close", {"session_id": "c"})
        environ = {**os.environ, "NO_COLOR": "1"}
        environ.pop("CTXD_SOCKET", None)
        stream = subprocess.Popen(
            [sys.executable, "-m", "ctxclient.cli", "--socket", str(daemon.socket), "events",
             "-f", "--json", "--session", "c", "--since", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
        try:
            assert stream.stdout is not None
            replayed = json.loads(stream.stdout.readline())
            agent.call("session.open", {"session_id": "c"})
            live = json.loads(stream.stdout.readline())
        finally:
            stream.send_signal(signal.SIGINT)
            stream.communicate(timeout=30)
    assert stream.returncode == 0
    assert [(e["seq"], e["type"]) for e in (replayed, live)] == [
        (2, "session.closed"), (3, "session.opened")]
    bad = subprocess.run([sys.executable, "-m", "ctxclient.cli", "--socket",
                          str(daemon.socket), "events", "--since", "-1"],
                         capture_output=True, text=True, env=environ, check=False)
    assert bad.returncode == 2
    assert bad.stderr.endswith("error: argument --since: must be a seq (0 or a positive "
                               "integer), got '-1'\n")

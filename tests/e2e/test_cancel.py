"""Cancellation against a real daemon: request.cancel of a compaction blocked in its
summarizer, of requests queued behind it, of a request past its commit point; turns and
their turn.cancel_requested event (docs/protocol.md, "Cancellation")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonProcess
from e2e.test_ctxctl import ctxctl
from tests_support import hello_text, next_event, rpc_error

import ctxclient
from ctxclient import Client

WINDOW = {"context_window": 6000, "max_output_tokens": 0}
"""Compaction target 3,600 tokens, trigger 5,700, hard block 5,880."""
SUMMARY = "The agent and the user exchanged greetings."
SUMMARIZER = f"""
import pathlib, sys, time
root = pathlib.Path(sys.argv[1])
sys.stdin.buffer.read()
(root / "started").touch()
while not (root / "release").exists():
    time.sleep(0.01)
print({SUMMARY!r})
"""
"""A summarizer command that says when it has started, then waits for the test to release
it (or for the daemon to kill it)."""


@dataclass
class Gated:
    """A daemon whose summarizer waits at a gate the test opens."""

    process: DaemonProcess
    root: Path

    def wait_started(self) -> None:
        """Until the summarizer runs (the request is blocked in the daemon)."""
        for _ in range(3000):
            if (self.root / "started").exists():
                return
            time.sleep(0.01)
        raise AssertionError("the summarizer never started")

    def release(self) -> None:
        (self.root / "release").touch()


def gated_daemon(root: Path, *args: str) -> Gated:
    script = root / "summarizer.py"
    script.write_text(SUMMARIZER)
    command = f"{sys.executable} {script} {root}"
    return Gated(DaemonProcess(root, extra_args=[
        "--hygiene-summarizer", "command", "--hygiene-summarizer-command", command,
        *args]), root)


@pytest.fixture
def gated(daemon_root: Path) -> Iterator[Gated]:
    """A daemon that compacts only when asked, with the gated summarizer."""
    daemon = gated_daemon(daemon_root, "--hygiene-auto-compact", "false")
    with daemon.process.running():
        yield daemon


def chat(count: int, tokens: int) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": hello_text(tokens)}
            for i in range(count)]


def snapshot(client: Client, sid: str) -> tuple[Any, Any]:
    return (client.call("message.list", {"session_id": sid, "limit": 1000}),
            client.call("ctxd.render", {"session_id": sid}))


def cancelled_error(future: Future[Any]) -> ctxclient.RpcError:
    with pytest.raises(ctxclient.Cancelled) as caught:
        future.result(30)
    return caught.value


def test_a_compaction_blocked_in_its_summarizer_is_cancelled_from_another_connection(
        gated: Gated, sid: str) -> None:
    with gated.process.client() as client, gated.process.client() as other:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        client.call("message.append", {"session_id": sid, "messages": chat(10, 450)})
        before = snapshot(client, sid)
        compacting = client.submit("context.compact", {"session_id": sid,
                                                       "strategies": ["summarize"]},
                                   request_id="compact-1")
        gated.wait_started()
        answer = other.cancel("compact-1", "the user pressed stop")
        error = cancelled_error(compacting)
        after = snapshot(client, sid)
        # The session's actor and the connection go on: the next request works.
        appended = client.call("message.append", {"session_id": sid,
                                                  "messages": chat(1, 10)})
        session = client.call("session.get", {"session_id": sid})
    assert answer == {"request_id": "compact-1", "cancelled": 1, "finishing": 0}
    assert (error.code, error.message) == (
        -32006, "request 'compact-1' was cancelled: the user pressed stop")
    assert error.data == {"request_id": "compact-1", "reason": "the user pressed stop",
                          "fix": "nothing was written; send the request again if still "
                                 "wanted"}
    assert after == before
    assert [m["seq"] for m in appended["appended"]] == [11]
    assert session["session"]["message_count"] == 11


def test_requests_queued_behind_a_blocked_one_are_cancelled_at_once(
        gated: Gated, sid: str) -> None:
    process = gated.process
    with process.client() as client, process.client() as first, \
            process.client() as second, process.client() as stopper:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        client.call("message.append", {"session_id": sid, "messages": chat(10, 450)})
        compacting = client.submit("context.compact", {"session_id": sid,
                                                       "strategies": ["summarize"]})
        gated.wait_started()
        # The same id on two connections: both wait in the session's mailbox.
        queued = [connection.submit("message.append", {
            "session_id": sid, "messages": chat(1, 20)}, request_id="append-2")
            for connection in (first, second)]
        # Both in flight (the compaction and the two appends: a request is counted and
        # made cancellable in one step), so that one request.cancel meets both.
        while stopper.call("daemon.status", {})["requests_inflight"] < 3:
            time.sleep(0.01)
        answer = stopper.cancel("append-2", "superseded")
        errors = [cancelled_error(future) for future in queued]
        assert not compacting.done()  # cancelled while the compaction still runs
        gated.release()
        done = compacting.result(30)
        messages = client.call("message.list", {"session_id": sid, "limit": 1000})
        appended = first.call("message.append", {"session_id": sid, "messages": chat(1, 5)})
    assert answer == {"request_id": "append-2", "cancelled": 2, "finishing": 0}
    assert [(e.code, e.message) for e in errors] == [
        (-32006, "request 'append-2' was cancelled: superseded")] * 2
    assert done["summarizer"] == "command"
    assert done["summarized"] > 0
    # Nothing of the cancelled appends: the originals, and the summary.
    assert [m["tokens"] for m in messages["messages"]].count(
        messages["messages"][0]["tokens"]) == 10
    assert len(messages["messages"]) == 11
    assert [m["seq"] for m in appended["appended"]] == [12]


def test_a_request_past_its_commit_point_is_answered_as_done(daemon_root: Path,
                                                             sid: str) -> None:
    # Automatic compaction on: the append that reaches the trigger commits, then compacts.
    gated = gated_daemon(daemon_root)
    with gated.process.running(), gated.process.client() as client, \
            gated.process.client() as other:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        step = 0
        while True:
            step += 1
            appending = client.submit("message.append", {
                "session_id": sid, "messages": chat(1, 100)}, request_id=f"step-{step}")
            while not appending.done() and not (gated.root / "started").exists():
                time.sleep(0.01)
            if not appending.done():
                break
            assert appending.result()["compactions"] == []
        answer = other.cancel(f"step-{step}", "too late")
        gated.release()
        appended = appending.result(30)
        messages = client.call("message.list", {"session_id": sid, "limit": 1000})
    assert answer == {"request_id": f"step-{step}", "cancelled": 0, "finishing": 1}
    assert [m["seq"] for m in appended["appended"]] == [step]
    [compaction] = appended["compactions"]
    assert (compaction["automatic"], compaction["summarizer"]) == (True, "command")
    assert [m["seq"] for m in messages["messages"]][-1] > step  # the summary was written


def test_a_turn_cancelled_reaches_the_agent_which_records_its_answer(
        shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as agent, shared_daemon.client() as ui:
        agent.call("session.open", {"session_id": sid})
        agent.call("events.subscribe", {"session_id": sid, "types": [
            "turn.cancel_requested", "turn.ended"]})
        started = agent.call("turn.start", {"session_id": sid, "turn_id": "turn-1"})
        requested = ui.call("turn.cancel", {"session_id": sid, "turn_id": "turn-1",
                                            "reason": "stop"})
        again = ui.call("turn.cancel", {"session_id": sid, "turn_id": "turn-1"})
        event = next_event(agent)
        ended = agent.call("turn.end", {"session_id": sid, "turn_id": "turn-1",
                                        "cancelled": True})
        ended_event = next_event(agent)
        listed = ui.call("turn.list", {"session_id": sid})
        twice = rpc_error(agent, "turn.end", {"session_id": sid, "turn_id": "turn-1"})
        restarted = rpc_error(agent, "turn.start", {"session_id": sid, "turn_id": "turn-1"})
        late = rpc_error(ui, "turn.cancel", {"session_id": sid, "turn_id": "turn-1"})
        unknown = rpc_error(ui, "turn.get", {"session_id": sid, "turn_id": "turn-2"})
        no_session = rpc_error(agent, "turn.start", {"session_id": sid + "x",
                                                     "turn_id": "turn-1"})
        bad_id = rpc_error(agent, "turn.start", {"session_id": sid, "turn_id": "-x"})
    assert (started["state"], started["cancelled"]) == ("running", None)
    assert (requested["state"], requested["cancel_reason"]) == ("cancel_requested", "stop")
    assert again == requested  # asked once: one event
    assert (event["type"], event["session_id"], event["data"]) == (
        "turn.cancel_requested", sid, {"turn_id": "turn-1", "reason": "stop",
                                       "timeout_s": 10.0})
    assert (ended["state"], ended["cancelled"]) == ("ended", True)
    assert ended["ended_at"] >= ended["cancel_requested_at"] >= ended["started_at"]
    assert (ended_event["type"], ended_event["data"]) == (
        "turn.ended", {"turn_id": "turn-1", "cancelled": True, "cancel_requested": True,
                       "terminated": False})
    assert listed == {"turns": [ended]}
    assert (twice.code, twice.message) == (-32003, "turn 'turn-1' has ended")
    assert restarted.code == -32003
    assert late.code == -32003
    assert (unknown.code, unknown.message) == (-32004,
                                               f"unknown turn 'turn-2' of session '{sid}'")
    assert (no_session.code, no_session.message) == (-32004, f"unknown session '{sid}x'")
    assert (bad_id.code, bad_id.data["path"]) == (-32602, "$.turn_id")


def test_ctxctl_cancels_a_ctxctl_call_by_its_id(gated: Gated, sid: str) -> None:
    socket = gated.process.socket
    with gated.process.client() as client:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        client.call("message.append", {"session_id": sid, "messages": chat(10, 450)})
    environ = {**os.environ, "NO_COLOR": "1"}
    environ.pop("CTXD_SOCKET", None)
    calling = subprocess.Popen(
        [sys.executable, "-m", "ctxclient.cli", "--socket", str(socket), "call",
         "--id", "compact-9", "context.compact",
         json.dumps({"session_id": sid, "strategies": ["summarize"]})],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
    gated.wait_started()
    cancelled = ctxctl(socket, "cancel", "compact-9", "--reason", "user stop")
    out, err = calling.communicate(timeout=60)
    unknown = ctxctl(socket, "cancel", "compact-9")
    assert (cancelled.returncode, cancelled.stdout) == (0, "request 'compact-9': 1 cancelled\n")
    assert (calling.returncode, out) == (1, "")
    assert err == ("ctxctl: error -32006: request 'compact-9' was cancelled: user stop\n"
                   "ctxctl: fix: nothing was written; send the request again if still "
                   "wanted\n")
    assert unknown.returncode == 1
    assert unknown.stderr.startswith(
        "ctxctl: error -32004: no request with id 'compact-9' is in flight\n")

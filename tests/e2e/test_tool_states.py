"""Tool-call states against a real daemon: tool.state, tool.get, tool.list; every legal and
illegal transition class, terminal states final, time in each state from the recorded
timestamps, the tool.state event, param errors."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from conftest import DaemonProcess
from tests_support import next_event, rpc_error

ORDER = ["pending", "awaiting_approval", "running"]
TERMINAL = ["completed", "failed", "denied", "timeout", "cancelled"]
STATES = ORDER + TERMINAL


def rank(state: str) -> int:
    return ORDER.index(state) if state in ORDER else 3


def allowed_next(state: str) -> list[str]:
    return [] if state in TERMINAL else [s for s in STATES if rank(s) > rank(state)]


def set_state(client: Any, sid: str, call_id: str, state: str, **extra: Any) -> dict[str, Any]:
    return client.call("tool.state", {"session_id": sid, "tool_call_id": call_id,  # type: ignore[no-any-return]
                                      "state": state, **extra})


def check_times(call: dict[str, Any]) -> None:
    """Each state's seconds is the gap to the next state's recorded entry."""
    history = call["history"]
    for entry, following in itertools.pairwise(history):
        assert entry["seconds"] == round(following["entered_at"] - entry["entered_at"], 6)
        assert call["seconds_in_state"][entry["state"]] == entry["seconds"]
    assert history[-1]["seconds"] is None
    assert call["created_at"] == history[0]["entered_at"]
    assert call["updated_at"] == history[-1]["entered_at"]
    assert [e["entered_at"] for e in history] == sorted(e["entered_at"] for e in history)


def test_a_full_lifecycle_with_events_and_times(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client, shared_daemon.client() as watcher:
        client.call("session.open", {"session_id": sid})
        watcher.call("events.subscribe", {"session_id": sid, "types": ["tool.state"]})
        created = set_state(client, sid, "call_1", "pending", tool_name="bash")
        assert created["previous_state"] is None
        assert created["tool_call"]["state"] == "pending"
        set_state(client, sid, "call_1", "awaiting_approval", detail="rm -rf build/")
        set_state(client, sid, "call_1", "running", tool_name="not-bash")  # the first stands
        done = set_state(client, sid, "call_1", "completed", detail="exit 0")
        call = done["tool_call"]
        assert done["previous_state"] == "running"
        assert (call["tool_call_id"], call["tool_name"], call["state"], call["terminal"]) == (
            "call_1", "bash", "completed", True)
        assert [(e["state"], e["detail"]) for e in call["history"]] == [
            ("pending", None), ("awaiting_approval", "rm -rf build/"), ("running", None),
            ("completed", "exit 0")]
        assert sorted(call["seconds_in_state"]) == ["awaiting_approval", "pending", "running"]
        check_times(call)
        events = [next_event(watcher) for _ in range(4)]
        assert [(e["type"], e["data"]["from"], e["data"]["to"]) for e in events] == [
            ("tool.state", None, "pending"), ("tool.state", "pending", "awaiting_approval"),
            ("tool.state", "awaiting_approval", "running"),
            ("tool.state", "running", "completed")]
        assert events[1]["data"] == {
            "tool_call_id": "call_1", "tool_name": "bash", "from": "pending",
            "to": "awaiting_approval", "detail": "rm -rf build/", "terminal": False,
            "allowed_next": ["running", *TERMINAL]}
        assert events[3]["data"]["allowed_next"] == []
        assert client.call("tool.get", {"session_id": sid, "tool_call_id": "call_1"}) == {
            "tool_call": call}


@pytest.mark.parametrize(("path", "to"), [
    (path, to) for path in (["pending"], ["pending", "awaiting_approval"], ["running"],
                            *[[t] for t in TERMINAL])
    for to in STATES])
def test_every_transition_class(shared_daemon: DaemonProcess, sid: str, path: list[str],
                                to: str) -> None:
    """From each state (reached directly or through the earlier ones) to each state:
    forward (a skip included) is taken, a repeat changes nothing, backward and out of a
    terminal state are refused with the allowed next states."""
    current = path[-1]
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        for state in path:
            set_state(client, sid, "c", state)
        if to == current:
            again = set_state(client, sid, "c", to)
            assert (again["previous_state"], len(again["tool_call"]["history"])) == (
                current, len(path))
        elif to in allowed_next(current):
            moved = set_state(client, sid, "c", to)
            assert (moved["previous_state"], moved["tool_call"]["state"]) == (current, to)
            assert [e["state"] for e in moved["tool_call"]["history"]] == [*path, to]
            check_times(moved["tool_call"])
        else:
            error = rpc_error(client, "tool.state", {"session_id": sid, "tool_call_id": "c",
                                                     "state": to})
            assert error.code == -32003
            assert error.data == {
                "tool_call_id": "c", "state": current, "requested": to,
                "allowed_next": allowed_next(current),
                "fix": ("report one of " + ", ".join(allowed_next(current))
                        if allowed_next(current)
                        else "report a new tool call under a new tool_call_id")}
            assert error.message == (
                f"tool call 'c' is {current}: it cannot move to {to} ("
                + ("it is final" if current in TERMINAL else "a tool call never goes back")
                + ")")
            unchanged = client.call("tool.get", {"session_id": sid, "tool_call_id": "c"})
            assert [e["state"] for e in unchanged["tool_call"]["history"]] == path


def test_list_by_state_and_the_current_states_time(shared_daemon: DaemonProcess,
                                                   sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        set_state(client, sid, "a", "running", tool_name="grep")
        set_state(client, sid, "b", "pending")
        set_state(client, sid, "b", "timeout", detail="no answer in 30 s")
        set_state(client, sid, "c", "awaiting_approval")
        every = client.call("tool.list", {"session_id": sid})["tool_calls"]
        assert [(c["tool_call_id"], c["state"]) for c in every] == [
            ("a", "running"), ("b", "timeout"), ("c", "awaiting_approval")]
        running = client.call("tool.list", {"session_id": sid, "state": "running"})
        [a] = running["tool_calls"]
        # The same call, but for the time of its current state, which grows as it runs.
        assert {**a, "seconds_in_state": None} == {**every[0], "seconds_in_state": None}
        # Still running: its time so far, and no end to its only state.
        assert a["history"] == [{"state": "running", "entered_at": a["created_at"],
                                 "detail": None, "seconds": None}]
        assert list(a["seconds_in_state"]) == ["running"]
        assert a["seconds_in_state"]["running"] >= 0
        b = every[1]
        assert b["seconds_in_state"] == {"pending": b["history"][0]["seconds"]}
        check_times(b)
        assert client.call("tool.list", {"session_id": sid, "state": "denied"}) == {
            "tool_calls": []}


def test_param_and_lookup_errors(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        assert rpc_error(client, "tool.state", {"session_id": sid, "tool_call_id": "x",
                                                "state": "pending"}).code == -32004
        assert rpc_error(client, "tool.list", {"session_id": sid}).code == -32004
        client.call("session.open", {"session_id": sid})
        error = rpc_error(client, "tool.state", {"session_id": sid, "tool_call_id": "x",
                                                 "state": "done"})
        assert (error.code, "$.state" in error.message) == (-32602, True)
        error = rpc_error(client, "tool.state", {"session_id": sid, "tool_call_id": "",
                                                 "state": "pending"})
        assert (error.code, "$.tool_call_id" in error.message) == (-32602, True)
        error = rpc_error(client, "tool.list", {"session_id": sid, "state": "paused"})
        assert (error.code, "$.state" in error.message) == (-32602, True)
        error = rpc_error(client, "tool.get", {"session_id": sid, "tool_call_id": "nope"})
        assert (error.code, error.message, error.data["tool_call_id"]) == (
            -32004, "unknown tool_call 'nope'", "nope")
        # A tool call id is the session's own: another session does not see it.
        set_state(client, sid, "shared", "running")
        client.call("session.open", {"session_id": sid + "b"})
        assert set_state(client, sid + "b", "shared", "pending")["previous_state"] is None

"""Context injection against a real daemon: inject.push, inject.pull, inject.ack and
inject.list — the order a queue is handed out in, retried pushes, redelivery of what was
not acknowledged, the hard block at push, scrubbing and exact tokens, events, durability
across a SIGKILL, and param errors (docs/protocol.md, "Injection")."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from conftest import DaemonProcess
from tests_support import COUNTER, hello_text, next_event, rpc_error

from ctxclient import Client

SECRET = "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"
REDACTED = "[REDACTED:github_token]"


def push(client: Client, sid: str, content: str, priority: str = "normal",
         **extra: Any) -> dict[str, Any]:
    return client.call("inject.push",  # type: ignore[no-any-return]
                       {"session_id": sid, "content": content, "priority": priority, **extra})


def pull(client: Client, sid: str, **extra: Any) -> dict[str, Any]:
    return client.call("inject.pull", {"session_id": sid, **extra})  # type: ignore[no-any-return]


def ack(client: Client, injection_id: str, accepted: bool, **extra: Any) -> dict[str, Any]:
    return client.call("inject.ack",  # type: ignore[no-any-return]
                       {"injection_id": injection_id, "accepted": accepted, **extra})


def user_tokens(text: str) -> int:
    return COUNTER.message_tokens("user", text, None, None)


def test_pull_hands_out_by_priority_then_arrival(shared_daemon: DaemonProcess,
                                                 sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        sent = [("deferred", "d1"), ("normal", "n1"), ("immediate", "i1"), ("normal", "n2"),
                ("immediate", "i2"), ("deferred", "d2")]
        ids = {text: push(client, sid, text, priority)["injection_id"]
               for priority, text in sent}
        first = pull(client, sid, max_priority="normal", limit=3)
        assert [i["content"] for i in first["injections"]] == ["i1", "i2", "n1"]
        assert first["waiting"] == 6
        assert [(i["state"], i["deliveries"]) for i in first["injections"]] == [
            ("delivered", 1)] * 3
        rest = pull(client, sid)
        assert [i["content"] for i in rest["injections"]] == ["n2", "d1", "d2"]
        assert [i["injection_id"] for i in rest["injections"]] == [
            ids["n2"], ids["d1"], ids["d2"]]
        # Delivered and within inject_redeliver_s (60 s): nothing is handed out again.
        assert pull(client, sid) == {"injections": [], "waiting": 6}
        listed = client.call("inject.list", {"session_id": sid, "state": "delivered"})
        assert [i["content"] for i in listed["injections"]] == [t for _, t in sent]
        assert listed["counts"] == {"pending": 0, "delivered": 6, "accepted": 0,
                                    "rejected": 0}


def test_retried_push_is_one_injection_delivered_once(shared_daemon: DaemonProcess,
                                                      sid: str) -> None:
    with shared_daemon.client() as client, shared_daemon.client() as watcher:
        client.call("session.open", {"session_id": sid})
        watcher.call("events.subscribe", {"session_id": sid, "types": ["inject.pushed"]})
        first = push(client, sid, "budget low", "immediate", idempotency_key="k-1",
                     source="harness")
        again = push(client, sid, "budget low", "immediate", idempotency_key="k-1")
        assert again == first | {"duplicate": True}
        assert first["duplicate"] is False
        # The same key in another session is another injection.
        other = sid + "_2"
        client.call("session.open", {"session_id": other})
        elsewhere = push(client, other, "budget low", idempotency_key="k-1")
        assert elsewhere["injection_id"] != first["injection_id"]
        pulled = pull(client, sid)["injections"]
        assert [i["injection_id"] for i in pulled] == [first["injection_id"]]
        assert pulled[0]["source"] == "harness"
        # A retry after delivery still answers the original, and queues nothing.
        assert push(client, sid, "budget low", idempotency_key="k-1")["injection_id"] == (
            first["injection_id"])
        assert pull(client, sid)["injections"] == []
        marker = push(client, sid, "after the retries")["injection_id"]
        # One inject.pushed for the three pushes of k-1, then the marker's.
        assert [next_event(watcher)["data"]["injection_id"] for _ in range(2)] == [
            first["injection_id"], marker]


def test_scrubbed_content_exact_tokens_and_events(shared_daemon: DaemonProcess,
                                                  sid: str) -> None:
    content = f"use the token {SECRET} for the next call"
    scrubbed = f"use the token {REDACTED} for the next call"
    with shared_daemon.client() as client, shared_daemon.client() as watcher:
        client.call("session.open", {"session_id": sid})
        watcher.call("events.subscribe", {"session_id": sid})
        pushed = push(client, sid, content)
        assert pushed == {"injection_id": pushed["injection_id"], "duplicate": False,
                          "state": "pending", "priority": "normal",
                          "tokens": user_tokens(scrubbed), "secrets_scrubbed": 1}
        injection_id = pushed["injection_id"]
        [delivered] = pull(client, sid)["injections"]
        assert delivered["content"] == scrubbed
        assert delivered["tokens"] == user_tokens(scrubbed)
        answer = ack(client, injection_id, True, reason=f"applied with {SECRET}")
        assert answer["already_acked"] is False
        assert answer["injection"]["state"] == "accepted"
        assert answer["injection"]["reason"] == f"applied with {REDACTED}"
        events = [next_event(watcher) for _ in range(3)]
        assert [(e["type"], e["data"]) for e in events] == [
            ("inject.pushed", {"injection_id": injection_id, "priority": "normal",
                               "source": None, "tokens": user_tokens(scrubbed),
                               "secrets_scrubbed": 1}),
            ("inject.delivered", {"injection_id": injection_id, "priority": "normal",
                                  "deliveries": 1}),
            ("inject.acked", {"injection_id": injection_id, "accepted": True,
                              "reason": f"applied with {REDACTED}", "deliveries": 1})]


def test_acks_are_final(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        waiting = push(client, sid, "not pulled yet")["injection_id"]
        error = rpc_error(client, "inject.ack", {"injection_id": waiting, "accepted": True})
        assert (error.code, error.data["state"]) == (-32003, "pending")
        taken = push(client, sid, "take me")["injection_id"]
        pull(client, sid)
        first = ack(client, taken, False, reason="not now")
        assert first["injection"]["state"] == "rejected"
        # The same answer again: recorded once, answered again.
        assert ack(client, taken, False) == first | {"already_acked": True}
        error = rpc_error(client, "inject.ack", {"injection_id": taken, "accepted": True})
        assert error.code == -32003
        assert (error.data["state"], error.data["reason"]) == ("rejected", "not now")
        error = rpc_error(client, "inject.ack",
                          {"injection_id": "inj_0000000000000000", "accepted": True})
        assert (error.code, error.data["injection_id"]) == (-32004, "inj_0000000000000000")


def test_push_past_the_hard_block_is_refused(shared_daemon: DaemonProcess, sid: str) -> None:
    # Effective window 1,000, hard block 0.95: 950 tokens.
    budget = {"context_window": 2_000, "max_output_tokens": 1_000, "hard_block": 0.95}
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid, "budget": budget})
        client.call("message.append", {"session_id": sid, "messages": [
            {"role": "user", "content": hello_text(600)}]})
        used = client.call("session.get", {"session_id": sid})["context_state"]
        thread = used["main_thread_tokens"] - 3
        fits = hello_text(950 - thread - 3 - 4 - 1)
        assert thread + user_tokens(fits) + 3 == 949
        assert push(client, sid, fits)["tokens"] == user_tokens(fits)
        over = fits + " hello"
        error = rpc_error(client, "inject.push", {"session_id": sid, "content": over})
        assert error.code == -32001
        assert error.message == (f"injecting {user_tokens(over)} tokens would bring the "
                                 "context to 950 of 1000 tokens, past the hard block at 950")
        assert {k: error.data[k] for k in ("would_use", "hard_block_tokens",
                                           "tokens_appended")} == {
            "would_use": 950, "hard_block_tokens": 950, "tokens_appended": user_tokens(over)}
        listed = client.call("inject.list", {"session_id": sid})
        assert [i["content"] for i in listed["injections"]] == [fits]


def test_param_errors(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        cases = [
            ("inject.push", {"session_id": sid, "content": "x", "priority": "urgent"},
             "$.priority"),
            ("inject.push", {"session_id": sid, "content": ""}, "$.content"),
            ("inject.push", {"session_id": sid}, "content"),
            ("inject.push", {"session_id": sid, "content": "x", "idempotency_key": ""},
             "$.idempotency_key"),
            ("inject.push", {"session_id": sid, "content": "x", "colour": 1}, "colour"),
            ("inject.pull", {"session_id": sid, "limit": 0}, "$.limit"),
            ("inject.pull", {"session_id": sid, "max_priority": "low"}, "$.max_priority"),
            ("inject.ack", {"injection_id": "42", "accepted": True}, "$.injection_id"),
            ("inject.ack", {"injection_id": "inj_0000000000000000"}, "accepted"),
            ("inject.list", {"session_id": sid, "state": "lost"}, "$.state"),
        ]
        for method, params, where in cases:
            error = rpc_error(client, method, params)
            assert error.code == -32602, (method, params)
            assert where in error.message, (method, params, error.message)
        error = rpc_error(client, "inject.push", {"session_id": "nope_" + sid,
                                                  "content": "x"})
        assert error.code == -32004
        error = rpc_error(client, "inject.pull", {"session_id": "nope_" + sid})
        assert error.code == -32004
        client.call("session.close", {"session_id": sid})
        error = rpc_error(client, "inject.push", {"session_id": sid, "content": "x"})
        assert error.code == -32003


def wait_for_redelivery(client: Client, sid: str) -> list[dict[str, Any]]:
    """Poll inject.pull until something comes back (a real wait for inject_redeliver_s)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pulled = pull(client, sid)["injections"]
        if pulled:
            return pulled
        time.sleep(0.05)
    raise AssertionError("nothing was delivered again within 30 s")


def test_unacknowledged_is_delivered_again_answered_never(daemon_root: Path, sid: str) -> None:
    process = DaemonProcess(daemon_root, extra_args=["--inject-redeliver-s", "0.2"])
    with process.running(), process.client() as client:
        client.call("session.open", {"session_id": sid})
        accepted = push(client, sid, "accept me")["injection_id"]
        rejected = push(client, sid, "reject me")["injection_id"]
        silent = push(client, sid, "never answered", "deferred")["injection_id"]
        assert [i["injection_id"] for i in pull(client, sid)["injections"]] == [
            accepted, rejected, silent]
        ack(client, accepted, True)
        ack(client, rejected, False, reason="wrong session")
        again = wait_for_redelivery(client, sid)
        assert [(i["injection_id"], i["deliveries"]) for i in again] == [(silent, 2)]
        assert ack(client, silent, True)["injection"]["deliveries"] == 2
        late = push(client, sid, "late")["injection_id"]
        assert [i["injection_id"] for i in pull(client, sid)["injections"]] == [late]
        assert [(i["injection_id"], i["deliveries"])
                for i in wait_for_redelivery(client, sid)] == [(late, 2)]
        counts = client.call("inject.list", {"session_id": sid})["counts"]
        assert counts == {"pending": 0, "delivered": 1, "accepted": 2, "rejected": 1}


def test_a_pushed_injection_survives_a_sigkill(daemon_root: Path, sid: str) -> None:
    process = DaemonProcess(daemon_root)
    with process.running():
        with process.client() as client:
            client.call("session.open", {"session_id": sid})
            first = push(client, sid, "kept", "immediate", idempotency_key="once")
        process.kill()
    with process.running(), process.client() as client:
        assert push(client, sid, "kept", idempotency_key="once") == first | {
            "duplicate": True}
        [kept] = pull(client, sid)["injections"]
        assert (kept["injection_id"], kept["content"], kept["priority"]) == (
            first["injection_id"], "kept", "immediate")

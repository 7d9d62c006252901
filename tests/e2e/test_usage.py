"""The usage ledger against a real daemon: usage.record and usage.get, exact totals, a
retried idempotency key never counted twice (across a restart too), group_by each way,
cost from a price table in the config file, the calibration ratio, the usage.recorded
event, param errors."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from conftest import DaemonProcess
from tests_support import hello_text, next_event, rpc_error

from ctxd.tokens import REPLY_PRIMING

COUNTERS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
            "thinking_tokens")
ZERO = dict.fromkeys(COUNTERS, 0)


def record(client: Any, sid: str, **fields: Any) -> dict[str, Any]:
    return client.call("usage.record", {"session_id": sid, **fields})  # type: ignore[no-any-return]


def totals(calls: int, **counters: int) -> dict[str, int]:
    return {**ZERO, **counters, "calls": calls}


def today() -> str:
    return datetime.now(UTC).date().isoformat()


def test_totals_groups_and_calibration(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client, shared_daemon.client() as watcher:
        client.call("session.open", {"session_id": sid})
        watcher.call("events.subscribe", {"session_id": sid, "types": ["usage.recorded"]})
        client.call("message.append", {"session_id": sid, "messages": [
            {"role": "user", "content": hello_text(100)}]})
        main = client.call("session.get", {"session_id": sid})["context_state"][
            "main_thread_tokens"]
        before = time.time()
        first = record(client, sid, model="m-a", request_id="req-1", input_tokens=120,
                       output_tokens=30, cache_read_tokens=5)
        entry = first["record"]
        assert first["duplicate"] is False
        assert before <= entry["recorded_at"] <= time.time()
        assert entry == {
            "usage_id": entry["usage_id"], "session_id": sid, "branch_id": None,
            "request_id": "req-1", "model": "m-a", "idempotency_key": None,
            **ZERO, "input_tokens": 120, "output_tokens": 30, "cache_read_tokens": 5,
            "local_input_tokens": main, "recorded_at": entry["recorded_at"]}
        event = next_event(watcher)
        assert (event["type"], event["data"]) == ("usage.recorded", {
            "usage_id": entry["usage_id"], "branch_id": None, "model": "m-a",
            "request_id": "req-1", "local_input_tokens": main, **ZERO, "input_tokens": 120,
            "output_tokens": 30, "cache_read_tokens": 5})

        branch = client.call("branch.create", {"session_id": sid, "description": "sub",
                                               "prompt": hello_text(40),
                                               "inject_memories": False})
        status = client.call("branch.status", {"branch_id": branch["branch_id"]})["branch"]
        branch_local = status["prefix_tokens"] + status["budget_used"] + REPLY_PRIMING
        record(client, sid, model="m-b", branch_id=branch["branch_id"], input_tokens=300,
               cache_write_tokens=7, thinking_tokens=11)
        record(client, sid, model="m-a", output_tokens=4)
        record(client, sid, input_tokens=1)  # no model

        got = client.call("usage.get", {"session_id": sid})
        assert got["totals"] == totals(4, input_tokens=421, output_tokens=34,
                                       cache_read_tokens=5, cache_write_tokens=7,
                                       thinking_tokens=11)
        assert (got["cost"], got["group_by"], got["groups"]) == (None, None, None)
        # The latest call reported 1 input token, beside the main thread's count.
        assert got["calibration"]["input_tokens"] == 1
        assert got["calibration"]["local_input_tokens"] == main
        assert got["calibration"]["ratio"] == round(1 / main, 4)

        by_model = client.call("usage.get", {"session_id": sid, "group_by": "model"})
        assert by_model["totals"] == got["totals"]
        assert [(g["key"], g["totals"], g["cost"]) for g in by_model["groups"]] == [
            (None, totals(1, input_tokens=1), None),
            ("m-a", totals(2, input_tokens=120, output_tokens=34, cache_read_tokens=5), None),
            ("m-b", totals(1, input_tokens=300, cache_write_tokens=7, thinking_tokens=11),
             None)]
        by_branch = client.call("usage.get", {"session_id": sid, "group_by": "branch"})
        assert [(g["key"], g["totals"]) for g in by_branch["groups"]] == [
            (None, totals(3, input_tokens=121, output_tokens=34, cache_read_tokens=5)),
            (branch["branch_id"], totals(1, input_tokens=300, cache_write_tokens=7,
                                         thinking_tokens=11))]
        by_day = client.call("usage.get", {"session_id": sid, "group_by": "day"})
        assert [(g["key"], g["totals"]) for g in by_day["groups"]] == [
            (today(), got["totals"])]

        one = client.call("usage.get", {"session_id": sid, "branch_id": branch["branch_id"]})
        assert one["totals"] == totals(1, input_tokens=300, cache_write_tokens=7,
                                       thinking_tokens=11)
        assert one["calibration"] == {
            "usage_id": one["calibration"]["usage_id"], "input_tokens": 300,
            "local_input_tokens": branch_local, "ratio": round(300 / branch_local, 4)}


def test_a_retried_key_is_counted_once_even_across_a_restart(daemon: DaemonProcess,
                                                             sid: str) -> None:
    with daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        first = record(client, sid, input_tokens=10, idempotency_key="call-1")
        again = record(client, sid, input_tokens=999, idempotency_key="call-1")
        assert again == {"record": first["record"], "duplicate": True}
    daemon.stop()
    daemon.start()
    with daemon.client() as client:
        after = record(client, sid, input_tokens=10, idempotency_key="call-1")
        assert after == {"record": first["record"], "duplicate": True}
        record(client, sid, input_tokens=5, idempotency_key="call-2")
        assert client.call("usage.get", {"session_id": sid})["totals"] == totals(
            2, input_tokens=15)


def test_the_same_key_in_two_sessions_is_two_records(shared_daemon: DaemonProcess,
                                                     sid: str) -> None:
    with shared_daemon.client() as client:
        for session in (sid, sid + "b"):
            client.call("session.open", {"session_id": session})
            assert record(client, session, output_tokens=3,
                          idempotency_key="k")["duplicate"] is False
        assert client.call("usage.get", {"session_id": sid + "b"})["totals"] == totals(
            1, output_tokens=3)


def test_cost_from_the_price_table(daemon_root: Path, sid: str) -> None:
    config = daemon_root / "prices.toml"
    config.write_text('[usage.prices."claude-sonnet-4"]\ninput = 3.0\noutput = 15.0\n'
                      "cache_read = 0.3\ncache_write = 3.75\nthinking = 15.0\n\n"
                      '[usage.prices."small"]\ninput = 0.25\n', encoding="utf-8")
    with DaemonProcess(daemon_root, extra_args=["--config", str(config)]).running() as daemon, \
            daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        record(client, sid, model="claude-sonnet-4", input_tokens=1_000_000,
               output_tokens=200_000, cache_read_tokens=500_000, cache_write_tokens=40_000,
               thinking_tokens=10_000)
        record(client, sid, model="small", input_tokens=2_000_000, output_tokens=50)
        record(client, sid, model="unpriced", input_tokens=70)
        got = client.call("usage.get", {"session_id": sid, "group_by": "model"})
        assert got["cost"] == {"input_tokens": 3.5, "output_tokens": 3.0,
                               "cache_read_tokens": 0.15, "cache_write_tokens": 0.15,
                               "thinking_tokens": 0.15, "total": 6.95, "unpriced_calls": 1}
        assert [(g["key"], g["cost"]) for g in got["groups"]] == [
            ("claude-sonnet-4", {"input_tokens": 3.0, "output_tokens": 3.0,
                                 "cache_read_tokens": 0.15, "cache_write_tokens": 0.15,
                                 "thinking_tokens": 0.15, "total": 6.45,
                                 "unpriced_calls": 0}),
            ("small", {"input_tokens": 0.5, "output_tokens": 0.0, "cache_read_tokens": 0.0,
                       "cache_write_tokens": 0.0, "thinking_tokens": 0.0, "total": 0.5,
                       "unpriced_calls": 0}),
            ("unpriced", None)]


def test_param_errors(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        error = rpc_error(client, "usage.record", {"session_id": sid, "model": "m"})
        assert error.code == -32602
        assert error.message == ("invalid params: give at least one of input_tokens, "
                                 "output_tokens, cache_read_tokens, cache_write_tokens, "
                                 "thinking_tokens (at $)")
        error = rpc_error(client, "usage.record", {"session_id": sid, "input_tokens": -1})
        assert (error.code, "$.input_tokens" in error.message) == (-32602, True)
        error = rpc_error(client, "usage.record", {"session_id": sid, "input_tokens": 1,
                                                   "tokens": 2})
        assert (error.code, "tokens" in error.message) == (-32602, True)
        error = rpc_error(client, "usage.get", {"session_id": sid, "group_by": "hour"})
        assert (error.code, "$.group_by" in error.message) == (-32602, True)
        assert rpc_error(client, "usage.record", {"session_id": sid,
                                                  "input_tokens": 1}).code == -32004
        assert rpc_error(client, "usage.get", {"session_id": sid}).code == -32004
        client.call("session.open", {"session_id": sid})
        error = rpc_error(client, "usage.record", {"session_id": sid, "input_tokens": 1,
                                                   "branch_id": "br_000000000000"})
        assert (error.code, error.data["branch_id"]) == (
            -32004, "br_000000000000")
        assert rpc_error(client, "usage.get", {"session_id": sid,
                                               "branch_id": "br_000000000000"}).code == -32004
        # Nothing was recorded by the refused calls.
        assert client.call("usage.get", {"session_id": sid})["totals"] == totals(0)
        assert client.call("usage.get", {"session_id": sid})["calibration"] is None


def test_a_closed_session_still_takes_records(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        client.call("session.close", {"session_id": sid})
        assert record(client, sid, output_tokens=9)["duplicate"] is False
        assert client.call("usage.get", {"session_id": sid})["totals"] == totals(
            1, output_tokens=9)


def test_deleting_a_session_deletes_its_records_and_tool_calls(shared_daemon: DaemonProcess,
                                                               sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        record(client, sid, input_tokens=3, idempotency_key="k")
        client.call("tool.state", {"session_id": sid, "tool_call_id": "t", "state": "running"})
        client.call("session.delete", {"session_id": sid})
        client.call("session.open", {"session_id": sid})
        assert client.call("usage.get", {"session_id": sid})["totals"] == totals(0)
        assert client.call("tool.list", {"session_id": sid}) == {"tool_calls": []}
        assert record(client, sid, input_tokens=3, idempotency_key="k")["duplicate"] is False

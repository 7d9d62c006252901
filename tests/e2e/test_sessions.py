"""session.*, message.*, ctxd.render and budget.measure against a real daemon."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import DaemonProcess
from e2e.test_compaction import SYSTEM, TASK, WINDOW, listed, work
from tests_support import (
    COUNTER,
    OPENAI_EXAMPLE,
    OPENAI_EXAMPLE_PROMPT_TOKENS,
    hello_text,
    rpc_error,
)

from ctxclient import Client, RpcError, StorageError


@pytest.fixture
def client(shared_daemon: DaemonProcess) -> Client:
    with shared_daemon.client() as connected:
        yield connected  # type: ignore[misc]


def test_open_is_idempotent_and_generates_ids(client: Client, sid: str) -> None:
    first = client.call("session.open", {"session_id": sid, "project": "p", "title": "T"})
    again = client.call("session.open", {"session_id": sid})
    assert (first["created"], again["created"]) == (True, False)
    assert again["session"] == first["session"]
    generated = client.call("session.open", {})
    assert re.fullmatch(r"ses_[0-9a-f]{16}", generated["session"]["session_id"])
    assert generated["session"]["budget"] == {
        "context_window": 200_000, "max_output_tokens": 8192, "compact_trigger": 0.95,
        "hard_block": 0.98, "warn": 0.7, "caution": 0.8}
    assert generated["context_state"] == {
        "session_id": generated["session"]["session_id"], "active_branch_id": None,
        "branch_depth": 0, "branch_path": [], "total_tokens": 0, "main_thread_tokens": 0,
        "current_branch_tokens": 0, "current_branch_budget": 0, "folded_tokens": 0,
        "effective_window": 191_808, "usage": 0.0, "health": "ok",
        "compact_failures": 0, "auto_compact_paused": False}


def test_open_updates_budget_of_an_existing_session(client: Client, sid: str) -> None:
    client.call("session.open", {"session_id": sid})
    updated = client.call("session.open", {"session_id": sid,
                                           "budget": {"context_window": 32_000}})
    assert updated["session"]["budget"]["context_window"] == 32_000
    assert updated["context_state"]["effective_window"] == 32_000 - 8192


def test_append_counts_components_and_parts(client: Client, sid: str) -> None:
    client.call("session.open", {"session_id": sid})
    result = client.call("message.append", {"session_id": sid, "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "system", "content": "hello world", "component": "skill_prompts"},
        {"role": "user", "content": [{"type": "text", "text": "hello world"},
                                     {"type": "text", "text": "You are helpful."}]},
        {"role": "assistant", "content": "hello world", "name": "get_weather"},
        {"role": "tool", "content": "hello world", "tool_call_id": "call_1",
         "meta": {"exit": 0}},
    ]})
    assert result["appended"] == [
        {"seq": 1, "tokens": 8, "component": "system_prompt"},
        {"seq": 2, "tokens": 6, "component": "skill_prompts"},
        {"seq": 3, "tokens": 3 + 1 + 2 + 4, "component": "conversation"},
        {"seq": 4, "tokens": 6 + 2 + 1, "component": "conversation"},
        {"seq": 5, "tokens": 6 + 3 + 1, "component": "conversation"},
    ]
    assert result["tokens_appended"] == 43
    assert result["context_state"]["main_thread_tokens"] == 46
    listed = client.call("message.list", {"session_id": sid})
    assert listed["messages"][4] == {
        "seq": 5, "role": "tool", "content": "hello world", "component": "conversation",
        "tokens": 10, "created_at": listed["messages"][4]["created_at"],
        "tool_call_id": "call_1", "meta": {"exit": 0}}
    measured = client.call("budget.measure", {"session_id": sid})
    assert {k: measured[k] for k in ("system_prompt", "skill_prompts", "tool_descriptions",
                                     "conversation", "used")} == {
        "system_prompt": 8, "skill_prompts": 6, "tool_descriptions": 0, "conversation": 29,
        "used": 46}


def test_render_matches_the_chat_api_count(client: Client, sid: str) -> None:
    client.call("session.open", {"session_id": sid})
    client.call("message.append", {"session_id": sid, "messages": OPENAI_EXAMPLE})
    rendered = client.call("ctxd.render", {"session_id": sid})
    assert rendered["tokens"] == OPENAI_EXAMPLE_PROMPT_TOKENS
    assert rendered["messages"] == OPENAI_EXAMPLE
    assert rendered["stats"] == {"message_count": 6, "stored_messages": 6,
                                 "message_tokens": 126, "reply_priming_tokens": 3}
    assert rendered["context_state"]["main_thread_tokens"] == OPENAI_EXAMPLE_PROMPT_TOKENS


def test_budget_measure_adds_what_the_harness_will_send(client: Client, sid: str) -> None:
    client.call("session.open", {"session_id": sid, "budget": {
        "context_window": 10_000, "max_output_tokens": 1000}})
    client.call("message.append", {"session_id": sid,
                                   "messages": [{"role": "user", "content": "hello world"}]})
    tool = {"name": "get_weather", "parameters": {"type": "object"}}
    measured = client.call("budget.measure", {
        "session_id": sid, "system_prompt": "You are helpful.",
        "skill_prompts": ["hello world", "hello world"], "tool_definitions": [tool]})
    # '{"' 'name' '":"' 'get' '_weather' '","' 'parameters' '":{"' 'type' '":"' 'object' '"}}'
    tool_tokens = 12
    assert measured == {
        "total": 10_000, "max_output_tokens": 1000, "effective_window": 9000,
        "system_prompt": 8, "skill_prompts": 4, "tool_descriptions": tool_tokens,
        "conversation": 6, "used": 8 + 4 + tool_tokens + 6 + 3,
        "remaining": 9000 - 33, "used_pct": round(33 / 9000 * 100, 4),
        "should_compact": False, "is_blocked": False,
        "context_state": measured["context_state"]}


PROSE = ("The daemon keeps each transcript, counts every message with the real tokenizer "
         "and decides what goes into the next prompt; a fold keeps the lesson. ")


def test_budget_measure_of_many_medium_prompts_is_exact(client: Client, sid: str) -> None:
    # Counted in chunks off the loop (docs/performance.md, A request does not hold the
    # loop): the totals are the tokenizer's, prompt by prompt.
    client.call("session.open", {"session_id": sid})
    prompts = [(f"{i}: " + PROSE * 600)[:64 * 1024] for i in range(40)]
    tools = [{"name": f"tool_{i}", "description": PROSE * 50} for i in range(30)]
    measured = client.call("budget.measure", {
        "session_id": sid, "skill_prompts": prompts, "tool_definitions": tools})
    assert measured["skill_prompts"] == sum(COUNTER.count(p) for p in prompts)
    assert measured["tool_descriptions"] == sum(
        COUNTER.count(msgspec.json.encode(tool).decode()) for tool in tools)


def test_a_16_mib_append_is_counted_and_stored_exactly(client: Client, sid: str) -> None:
    client.call("session.open", {"session_id": sid,
                                 "budget": {"context_window": 10_000_000}})
    # The request line stays within the default max_request_bytes (16 MiB).
    content = (PROSE * (16 * 1024 * 1024 // len(PROSE)))[:16 * 1024 * 1024 - 4096]
    appended = client.call("message.append", {
        "session_id": sid, "messages": [{"role": "user", "content": content}],
        "allow_over": True}, timeout=120)
    tokens = COUNTER.message_tokens("user", content)
    assert appended["tokens_appended"] == tokens
    assert appended["appended"] == [{"seq": 1, "tokens": tokens, "component": "conversation"}]
    [stored] = client.call("message.list", {"session_id": sid}, timeout=120)["messages"]
    assert (stored["content"] == content, stored["tokens"]) == (True, tokens)


def test_health_thresholds_and_the_hard_block(daemon_root: Path, sid: str) -> None:
    # The thresholds as such: nothing compacts the thread (test_compaction.py does).
    process = DaemonProcess(daemon_root, extra_args=["--hygiene-auto-compact", "false"])
    with process.running(), process.client() as client:
        _thresholds(client, sid)


def _thresholds(client: Client, sid: str) -> None:
    # effective window 1000: warn 700, caution 800, compact 950, blocked 980.
    client.call("session.open", {"session_id": sid, "budget": {
        "context_window": 1100, "max_output_tokens": 100}})

    def append(n_tokens: int, **extra: Any) -> dict[str, Any]:
        message = {"role": "user", "content": hello_text(n_tokens - 4)}  # 3 + role + text
        return client.call("message.append", {"session_id": sid, "messages": [message],
                                              **extra})["context_state"]

    assert (append(697)["health"], append(100)["health"], append(150)["health"]) == (
        "warn", "caution", "compact")
    error = rpc_error(client, "message.append", {"session_id": sid, "messages": [
        {"role": "user", "content": hello_text(26)}]})
    assert error.code == -32001
    assert {k: error.data[k] for k in ("would_use", "hard_block_tokens", "effective_window",
                                       "tokens_appended")} == {
        "would_use": 980, "hard_block_tokens": 980, "effective_window": 1000,
        "tokens_appended": 30}
    assert error.data["suggestion"].startswith("compact the context (context.compact), fold ")
    state = append(29)
    assert (state["main_thread_tokens"], state["health"]) == (979, "compact")
    over = append(100, allow_over=True)
    assert (over["main_thread_tokens"], over["usage"], over["health"]) == (1079, 1.079,
                                                                           "blocked")


def test_close_then_append_is_invalid_state_and_reopen_works(client: Client, sid: str) -> None:
    client.call("session.open", {"session_id": sid})
    closed = client.call("session.close", {"session_id": sid})
    assert closed["session"]["state"] == "closed"
    assert closed["session"]["closed_at"] is not None
    assert client.call("session.close", {"session_id": sid})["session"] == closed["session"]
    error = rpc_error(client, "message.append", {"session_id": sid, "messages": [
        {"role": "user", "content": "x"}]})
    assert (error.code, error.data["state"]) == (-32003, "closed")
    reopened = client.call("session.open", {"session_id": sid})
    assert (reopened["created"], reopened["session"]["state"]) == (False, "open")
    assert reopened["session"]["closed_at"] is None


def test_delete_removes_everything(client: Client, sid: str) -> None:
    client.call("session.open", {"session_id": sid})
    client.call("message.append", {"session_id": sid, "messages": [
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})
    assert client.call("session.delete", {"session_id": sid}) == {
        "session_id": sid, "deleted": True, "messages_deleted": 2}
    assert rpc_error(client, "session.get", {"session_id": sid}).code == -32004
    assert rpc_error(client, "message.list", {"session_id": sid}).code == -32004
    again = client.call("session.open", {"session_id": sid})
    assert (again["created"], again["session"]["message_count"]) == (True, 0)


def test_message_list_pages(client: Client, sid: str) -> None:
    client.call("session.open", {"session_id": sid})
    client.call("message.append", {"session_id": sid, "messages": [
        {"role": "user", "content": f"m{i}"} for i in range(7)]})
    seen, cursor = [], None
    while True:
        params: dict[str, Any] = {"session_id": sid, "limit": 3}
        if cursor:
            params["cursor"] = cursor
        page = client.call("message.list", params)
        seen.append([m["content"] for m in page["messages"]])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [["m0", "m1", "m2"], ["m3", "m4", "m5"], ["m6"]]


def test_session_list_filters_and_pages(client: Client, sid: str) -> None:
    project = "proj-" + sid
    for n in range(5):
        client.call("session.open", {"session_id": f"{sid}-{n}", "project": project})
    client.call("session.close", {"session_id": f"{sid}-1"})
    open_ids, cursor = [], None
    while True:
        params: dict[str, Any] = {"project": project, "state": "open", "limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = client.call("session.list", params)
        open_ids += [s["session_id"] for s in page["sessions"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert open_ids == [f"{sid}-{n}" for n in (0, 2, 3, 4)]
    closed = client.call("session.list", {"project": project, "state": "closed"})
    assert [s["session_id"] for s in closed["sessions"]] == [f"{sid}-1"]


def test_max_open_sessions_is_limit_reached(daemon_root: Any) -> None:
    process = DaemonProcess(daemon_root, extra_args=["--max-open-sessions", "2"]).start()
    try:
        with process.client() as client:
            client.call("session.open", {"session_id": "a"})
            client.call("session.open", {"session_id": "b"})
            error = rpc_error(client, "session.open", {"session_id": "c"})
            assert (error.code, error.data["limit"], error.data["max"]) == (
                -32005, "max_open_sessions", 2)
    finally:
        assert process.stop() == 0


def test_a_full_store_is_a_storage_error_and_nothing_half_written(daemon_root: Any) -> None:
    process = DaemonProcess(daemon_root, extra_args=["--max-db-bytes", str(512 * 1024)]).start()
    try:
        with process.client() as client:
            client.call("session.open", {"session_id": "s", "budget": {
                "context_window": 10_000_000}})
            batch = [{"role": "user", "content": hello_text(200) + f" {i}"} for i in range(20)]
            stored, failure = 0, None
            for _ in range(100):
                try:
                    client.call("message.append", {"session_id": "s", "messages": batch})
                except RpcError as error:
                    failure = error
                    break
                stored += len(batch)
            assert failure is not None, "the store never filled up"
            assert failure.code == -32008
            assert "max_db_bytes" in failure.data["fix"]
            assert stored > 0
            session = client.call("session.get", {"session_id": "s"})["session"]
            assert session["message_count"] == stored
            listed = client.call("message.list", {"session_id": "s", "limit": 1000})
            assert len(listed["messages"]) == stored
            assert client.call("daemon.ping")["pong"] is True
    finally:
        assert process.stop() == 0


@contextlib.contextmanager
def small_disk(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` (root only: skipped otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a disk to fill) needs root")
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                              str(where)], capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "--lazy", str(where)], check=True)


def fill(disk: Path) -> Path:
    """Write a file until the disk has not a byte left (ENOSPC), down to single bytes."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as out:
        for chunk in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    out.write(b"\0" * chunk)
    with (pytest.raises(OSError, match="No space left on device") as full,
          (disk / "probe").open("wb", buffering=0) as probe):
        probe.write(b"\0" * 4096)
    assert full.value.errno == errno.ENOSPC
    return filler


def test_an_append_that_needs_a_compaction_on_a_full_disk_is_a_storage_error(
        daemon_root: Path, sid: str) -> None:
    """The compaction that an append needs first fails to commit (the disk is full): the
    append's answer is -32008 saying so, not -32001, and nothing of either is written."""
    process = DaemonProcess(daemon_root)
    too_big = {"role": "user", "content": hello_text(3500)}
    with small_disk(process.data_dir, "32m"):
        with process.running(), process.client() as client:
            client.call("session.open", {"session_id": sid, "budget": WINDOW})
            client.call("message.append", {"session_id": sid, "messages": [SYSTEM, TASK]})
            work(client, sid, range(6))  # 2,460 tokens: with 3,500 more, past the hard block
        # Stopped cleanly, the daemon leaves no WAL behind: its next write grows a file.
        with process.running(), process.client() as client:
            before = (listed(client, sid),
                      client.call("session.get", {"session_id": sid})["session"])
            filler = fill(process.data_dir)
            with pytest.raises(StorageError) as full:
                client.call("message.append", {"session_id": sid, "messages": [too_big]})
            filler.unlink()
            after = (listed(client, sid),
                     client.call("session.get", {"session_id": sid})["session"])
            appended = client.call("message.append", {"session_id": sid,
                                                      "messages": [too_big]})
    assert (full.value.message, full.value.data) == (
        "storage error: the disk or the configured max_db_bytes (the database and its WAL) is "
        "full; nothing was written (the automatic compaction this append needed to fit could "
        "not be written)",
        {"sqlite_error": "FullError", "fix": "free disk space or raise max_db_bytes, then retry"})
    assert after == before
    assert [c["automatic"] for c in appended["compactions"]][:1] == [True]


def test_close_retitle_and_reopen_keep_every_message_and_the_order(
        client: Client, sid: str) -> None:
    # Regression: saving the session row with INSERT OR REPLACE deleted it first, and the
    # delete cascaded to all of its messages.
    project = "keep-" + sid
    for n in ("a", "b"):
        client.call("session.open", {"session_id": f"{sid}-{n}", "project": project})
    session = f"{sid}-a"
    client.call("message.append", {"session_id": session, "messages": [
        {"role": "user", "content": f"m{i}"} for i in range(3)]})
    client.call("session.close", {"session_id": session})
    client.call("session.open", {"session_id": session, "title": "renamed",
                                 "budget": {"context_window": 50_000}})
    listed = client.call("message.list", {"session_id": session})
    assert [m["content"] for m in listed["messages"]] == ["m0", "m1", "m2"]
    rendered = client.call("ctxd.render", {"session_id": session})
    # each: 3 framing + 1 role + 2 ("m", "0")
    assert rendered["stats"] == {"message_count": 3, "stored_messages": 3,
                                 "message_tokens": 18, "reply_priming_tokens": 3}
    ordered = client.call("session.list", {"project": project})
    assert [s["session_id"] for s in ordered["sessions"]] == [f"{sid}-a", f"{sid}-b"]


def _pipeline(process: DaemonProcess, requests: list[dict[str, Any]]) -> dict[Any, Any]:
    """Send requests in one write on a fresh connection; answers by id."""
    import socket as socket_module

    import msgspec

    with socket_module.socket(socket_module.AF_UNIX) as raw:
        raw.connect(str(process.socket))
        raw.sendall(b"".join(msgspec.json.encode({"jsonrpc": "2.0", **r}) + b"\n"
                             for r in requests))
        raw.shutdown(socket_module.SHUT_WR)
        data = b""
        while chunk := raw.recv(1 << 20):
            data += chunk
    answers = [msgspec.json.decode(line) for line in data.splitlines()]
    return {answer["id"]: answer for answer in answers}


def test_pipelined_requests_to_a_vanishing_session_keep_their_order(
        shared_daemon: DaemonProcess, sid: str) -> None:
    # Regression: the actor retired after a request left no session (an unknown id, a
    # delete) and failed what was queued behind it; the retries raced out of order.
    for round_number in range(20):
        session = f"{sid}-{round_number}"
        requests: list[dict[str, Any]] = [
            {"id": 0, "method": "session.get", "params": {"session_id": session}},
            {"id": 1, "method": "session.open", "params": {"session_id": session}},
            *({"id": 2 + i, "method": "message.append", "params": {
                "session_id": session, "messages": [{"role": "user", "content": f"m{i}"}]}}
              for i in range(3)),
            {"id": 5, "method": "session.delete", "params": {"session_id": session}},
            {"id": 6, "method": "session.open", "params": {"session_id": session}},
            {"id": 7, "method": "message.append", "params": {
                "session_id": session, "messages": [{"role": "user", "content": "again"}]}},
        ]
        answers = _pipeline(shared_daemon, requests)
        assert answers[0]["error"]["code"] == -32004
        assert [answers[i]["result"]["appended"][0]["seq"] for i in (2, 3, 4)] == [1, 2, 3]
        assert answers[5]["result"]["messages_deleted"] == 3
        assert answers[6]["result"]["created"] is True
        assert answers[7]["result"]["appended"][0]["seq"] == 1


def test_concurrent_opens_respect_max_open_sessions(daemon_root: Any) -> None:
    process = DaemonProcess(daemon_root, extra_args=["--max-open-sessions", "2"]).start()
    try:
        answers = _pipeline(process, [
            {"id": n, "method": "session.open", "params": {"session_id": f"s{n}"}}
            for n in range(6)])
        opened = [n for n, answer in answers.items() if "result" in answer]
        refused = [answers[n]["error"]["code"] for n in answers if "error" in answers[n]]
        assert (len(opened), refused) == (2, [-32005] * 4)
        with process.client() as client:
            assert client.call("daemon.status")["sessions_open"] == 2
    finally:
        assert process.stop() == 0


def test_budget_measure_counts_a_large_system_prompt(client: Client, sid: str) -> None:
    client.call("session.open", {"session_id": sid, "budget": {"context_window": 10_000_000}})
    prompt = hello_text(40_000)  # over 64 KiB: counted in a worker thread
    measured = client.call("budget.measure", {"session_id": sid, "system_prompt": prompt})
    assert measured["system_prompt"] == 3 + 1 + 40_000


def test_nothing_lands_between_the_items_of_a_batch(shared_daemon: DaemonProcess,
                                                    sid: str) -> None:
    import socket as socket_module

    import msgspec

    def append(i: int, text: str) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": i, "method": "message.append",
                "params": {"session_id": sid, "messages": [{"role": "user", "content": text}]}}

    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
    for trial in range(10):
        batch = msgspec.json.encode([append(1, f"{trial}-A1"), append(2, f"{trial}-A2")])
        single = msgspec.json.encode(append(3, f"{trial}-B"))
        with socket_module.socket(socket_module.AF_UNIX) as raw:
            raw.connect(str(shared_daemon.socket))
            raw.sendall(batch + b"\n" + single + b"\n")
            raw.shutdown(socket_module.SHUT_WR)
            while raw.recv(1 << 16):
                pass
    with shared_daemon.client() as client:
        listed = client.call("message.list", {"session_id": sid, "limit": 1000})
    assert [m["content"] for m in listed["messages"]] == [
        f"{trial}-{name}" for trial in range(10) for name in ("A1", "A2", "B")]

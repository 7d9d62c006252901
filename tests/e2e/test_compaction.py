"""The compaction chain against a real daemon: clearing old tool results, summarising the
oldest span, truncating, the circuit breaker, snapshots and session.resume, the context
note, branches and rollbacks (docs/protocol.md, "Compaction")."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from chat_server import ChatServer
from conftest import DaemonProcess, kill_leftovers, short_root
from daemon_process import entry_with
from tests_support import COUNTER, next_event, rpc_error

from ctxclient import Client
from ctxd.tokens import REPLY_PRIMING

SYSTEM = {"role": "system", "content": "You are a careful coding agent."}
TASK = {"role": "user", "content": "Fix the failing tests. Never edit the migrations."}
WINDOW = {"context_window": 6000, "max_output_tokens": 0}
"""An effective window of 6,000 tokens: target 3,600 (0.60), trigger 5,700 (0.95)."""


def call(step: int, name: str = "bash") -> dict[str, Any]:
    return {"role": "assistant", "content": f"Step {step}: running {name}.",
            "meta": {"tool_calls": [{"id": f"call_{step}", "name": name}]}}


def output(step: int, lines: int = 24) -> str:
    """A tool's output of ``lines`` numbered lines (24 lines: 1,228 bytes at step 5; with
    its call, 405 tokens)."""
    return "".join(f"step {step} line {i}: collected test case {i} of the suite\n"
                   for i in range(lines))


def result(step: int, content: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"role": "tool", "name": "bash", "tool_call_id": f"call_{step}",
            "content": output(step) if content is None else content, **extra}


def tokens_of(message: dict[str, Any]) -> int:
    return COUNTER.message_tokens(message["role"], message["content"], message.get("name"),
                                  message.get("tool_call_id"))


def rendered_tokens(messages: list[dict[str, Any]]) -> int:
    return sum(tokens_of(m) for m in messages) + REPLY_PRIMING if messages else 0


def cleared(ref_id: str) -> str:
    return (f'[Old tool result content cleared — read it with read_result ref_id="{ref_id}" '
            f"or ctxctl result {ref_id}]")


def listed(client: Client, sid: str) -> list[dict[str, Any]]:
    return client.call("message.list", {"session_id": sid, "limit": 1000})["messages"]  # type: ignore[no-any-return]


def render(client: Client, sid: str, **extra: Any) -> dict[str, Any]:
    return client.call("ctxd.render", {"session_id": sid, **extra})  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def manual_daemon() -> Iterator[DaemonProcess]:
    """A daemon that compacts only when asked."""
    root = short_root()
    process = DaemonProcess(root, extra_args=["--hygiene-auto-compact", "false"]).start()
    yield process
    process.stop()
    kill_leftovers(root)
    shutil.rmtree(root, ignore_errors=True)


def work(client: Client, sid: str, steps: range, **extra: Any) -> None:
    for step in steps:
        client.call("message.append", {"session_id": sid,
                                       "messages": [call(step), result(step, **extra)]})


def test_clearing_replaces_the_oldest_results_until_the_target(
        manual_daemon: DaemonProcess, sid: str) -> None:
    with manual_daemon.client() as client:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        client.call("message.append", {"session_id": sid, "messages": [SYSTEM, TASK]})
        work(client, sid, range(0, 1))
        # An old error result: never cleared.
        client.call("message.append", {"session_id": sid, "messages": [
            call(1), result(1, output(1), meta={"is_error": True})]})
        work(client, sid, range(2, 11))
        before = render(client, sid)
        archive = listed(client, sid)
        assert before["tokens"] == rendered_tokens(before["messages"])
        assert before["tokens"] > 3_600

        done = client.call("context.compact", {"session_id": sid, "strategies": ["clear"]})

        after = render(client, sid)
        archive_after = listed(client, sid)
    by_seq = {m["seq"]: m for m in archive_after}
    gone = [m for m in archive_after if m.get("compaction") == "cleared"]
    # Oldest first, the error result (seq 6) and the newest five (steps 6-10) kept.
    candidates = [m["seq"] for m in archive if m["role"] == "tool" and m["seq"] != 6][:-5]
    assert [m["seq"] for m in gone] == candidates[:len(gone)]
    gains = []
    for original in gone:
        marker = by_seq[original["replaced_by"]]
        ref_id = marker["content"].split('ref_id="')[1][:20]
        assert marker["content"] == cleared(ref_id)
        assert (marker["at_seq"], marker["tool_call_id"], marker["meta"]) == (
            original["seq"], original["tool_call_id"], {"compaction": "cleared",
                                                         "seq": original["seq"]})
        assert marker["tokens"] == tokens_of(marker)
        # The original, byte for byte, is where the marker says.
        with manual_daemon.client() as client:
            read = client.call("result.read", {"session_id": sid, "ref_id": ref_id})
        assert read["content"] == original["content"] == output((original["seq"] - 4) // 2)
        gains.append(original["tokens"] - marker["tokens"])
    # As few as bring it under the target.
    assert sum(gains[:-1]) < before["tokens"] - 3_600 <= sum(gains)
    assert done["strategies_run"] == ["clear"]
    assert (done["before_tokens"], done["after_tokens"], done["target_tokens"]) == (
        before["tokens"], before["tokens"] - sum(gains), 3_600)
    assert (done["before_msgs"], done["after_msgs"], done["cleared"]) == (24, 24, len(gone))
    assert done["tokens_recovered"] == sum(gains)
    assert after["tokens"] == rendered_tokens(after["messages"]) == done["after_tokens"]
    assert [m["content"] for m in after["messages"]] == [
        by_seq[m["replaced_by"]]["content"] if m.get("compaction") else m["content"]
        for m in archive_after if m.get("at_seq") is None]
    assert done["context_state"]["main_thread_tokens"] == after["tokens"]


def test_summary_keeps_tool_calls_with_their_results_and_the_latest_request(
        manual_daemon: DaemonProcess, sid: str) -> None:
    with manual_daemon.client() as client:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        client.call("message.append", {"session_id": sid, "messages": [SYSTEM, TASK]})
        work(client, sid, range(0, 5))
        later = {"role": "user", "content": "Now also update the changelog."}
        client.call("message.append", {"session_id": sid, "messages": [later]})
        work(client, sid, range(5, 10))
        before = render(client, sid)
        done = client.call("context.compact", {"session_id": sid,
                                               "strategies": ["summarize"]})
        after = render(client, sid)
        archive = listed(client, sid)
    summaries = [m for m in archive if (m.get("meta") or {}).get("compaction") == "summary"]
    assert len(summaries) == 1
    summary = summaries[0]
    span = [m["seq"] for m in archive if m.get("replaced_by") == summary["seq"]]
    # From the task (the first message that is not pinned), whole call/result pairs, as
    # many as free what the target needs and as much again for the summary's own room.
    needed = before["tokens"] - 3_600
    ends = [end for end in range(3, 13) if archive[end]["role"] != "tool"]
    end = next(end for end in ends if sum(m["tokens"] for m in archive[1:end]) >= 2 * needed)
    assert span == list(range(2, end + 1))
    assert summary["meta"] == {"compaction": "summary", "summarizer": "extractive",
                               "first_seq": 2, "last_seq": end}
    assert summary["content"].startswith(
        f"[Summary of {len(span)} earlier messages, written by the extractive summarizer when "
        "ctxd compacted the context; message.list keeps the originals.]\n\n")
    assert [m["content"] for m in after["messages"][:3]] == [
        SYSTEM["content"], summary["content"], archive[end]["content"]]
    assert after["messages"][2]["role"] == "assistant"
    assert later in after["messages"]
    assert done["summarized"] == len(span)
    assert done["summarizer"] == "extractive"
    assert done["after_tokens"] == after["tokens"] == rendered_tokens(after["messages"])
    assert done["tokens_recovered"] == before["tokens"] - after["tokens"] > 0


def test_truncation_keeps_the_newest_group(manual_daemon: DaemonProcess, sid: str) -> None:
    with manual_daemon.client() as client:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        client.call("message.append", {"session_id": sid, "messages": [SYSTEM, TASK]})
        work(client, sid, range(0, 10))
        done = client.call("context.compact", {"session_id": sid, "strategies": ["truncate"]})
        after = render(client, sid)
        archive = listed(client, sid)
    truncated = [m["seq"] for m in archive if m.get("compaction") == "truncated"]
    marker = archive[-1]
    assert marker["content"] == (f"[{len(truncated)} earlier messages were truncated to free "
                                 "context; message.list keeps them.]")
    # Whole call/result pairs, oldest first, after the (kept) latest request.
    assert truncated == list(range(3, 3 + len(truncated)))
    assert len(truncated) % 2 == 0
    assert after["messages"][:3] == [SYSTEM, TASK, {"role": "user",
                                                    "content": marker["content"]}]
    assert done["after_tokens"] <= 3_600 < done["after_tokens"] + tokens_of(
        archive[len(truncated)]) + tokens_of(archive[len(truncated) + 1])


def test_the_chain_runs_by_itself_at_the_trigger(shared_daemon: DaemonProcess,
                                                  sid: str) -> None:
    with shared_daemon.client() as client, shared_daemon.client() as watcher:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        watcher.call("events.subscribe", {"session_id": sid, "types": ["context.compacted"]})
        client.call("message.append", {"session_id": sid, "messages": [SYSTEM, TASK]})
        runs = []
        for step in range(20):
            appended = client.call("message.append", {"session_id": sid, "messages": [
                call(step), result(step)]})
            runs += appended["compactions"]
            assert appended["context_state"]["usage"] < 0.95
        event = next_event(watcher)
        final = render(client, sid)
    assert runs, "20 steps of 500 tokens pass the trigger of a 6,000-token window"
    first = runs[0]
    assert first["automatic"] is True
    assert first["strategies_run"][0] == "clear"
    assert first["after_tokens"] <= first["target_tokens"] < first["before_tokens"]
    assert event["data"]["after_tokens"] == first["after_tokens"]
    assert event["data"]["automatic"] is True
    assert final["tokens"] == rendered_tokens(final["messages"])


def test_a_compaction_that_cannot_shrink_trips_the_breaker(
        shared_daemon: DaemonProcess, sid: str) -> None:
    system = {"role": "system", "content": "Follow the rules. " * 1438}
    assert 0.95 * 6000 <= tokens_of(system) < 0.98 * 6000
    with shared_daemon.client() as client, shared_daemon.client() as watcher:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        watcher.call("events.subscribe", {"session_id": sid})
        first = client.call("message.append", {"session_id": sid, "messages": [system]})
        assert first["compactions"][0] | {"before_tokens": 0, "after_tokens": 0} == {
            "branch_id": None, "before_tokens": 0, "after_tokens": 0, "tokens_recovered": 0,
            "target_tokens": 3_600, "before_msgs": 1, "after_msgs": 1,
            "strategies_run": ["clear", "summarize", "truncate"], "cleared": 0,
            "summarized": 0, "truncated": 0, "summarizer": None, "summarizer_error": None,
            "snapshot_saved": False, "automatic": True}
        assert first["context_state"]["compact_failures"] == 1
        for failures in (2, 3):
            appended = client.call("message.append", {"session_id": sid, "allow_over": True,
                                                      "messages": [{"role": "user",
                                                                    "content": "go on"}]})
            assert appended["context_state"]["compact_failures"] == failures
        assert appended["context_state"]["auto_compact_paused"] is True
        # Paused: no more attempts.
        appended = client.call("message.append", {"session_id": sid, "allow_over": True,
                                                  "messages": [{"role": "user",
                                                                "content": "go on"}]})
        assert appended["compactions"] == []
        assert appended["context_state"]["compact_failures"] == 3
        types = []
        while (event := next_event(watcher))["type"] != "context.auto_compact_paused":
            types.append(event["type"])
        assert types.count("context.compacted") == 3
        assert event["data"] == {"branch_id": None, "compact_failures": 3}


def test_snapshot_survives_a_restart_and_resume_starts_from_it(
        daemon_root: Path, sid: str) -> None:
    process = DaemonProcess(daemon_root, extra_args=["--hygiene-auto-compact", "false"])
    with process.running(), process.client() as client:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        client.call("message.append", {"session_id": sid, "messages": [SYSTEM, TASK]})
        work(client, sid, range(0, 10))
        never = client.call("session.resume", {"session_id": sid})
        assert (never["source"], never["compacted_at"]) == ("thread", None)
        assert never["messages"] == render(client, sid)["messages"]
        done = client.call("context.compact", {"session_id": sid})
        assert done["snapshot_saved"] is True
        work(client, sid, range(10, 11))
        rendered = render(client, sid)
    with process.running(), process.client() as client:
        resumed = client.call("session.resume", {"session_id": sid})
    assert resumed["source"] == "snapshot"
    assert resumed["messages"] == rendered["messages"]
    assert resumed["tokens"] == rendered["tokens"] == rendered_tokens(resumed["messages"])
    assert resumed["compacted_at"] > 0

    database = apsw.Connection(str(process.data_dir / "ctxd.db"))
    database.execute("CREATE TRIGGER refuse_snapshots BEFORE UPDATE ON session_snapshots "
                     "BEGIN SELECT RAISE(ABORT, 'no room for snapshots'); END")
    database.close()
    with process.running(), process.client() as client, process.client() as watcher:
        watcher.call("events.subscribe", {"session_id": sid, "types": ["snapshot.failed"]})
        work(client, sid, range(11, 16))
        done = client.call("context.compact", {"session_id": sid})
        assert done["tokens_recovered"] > 0
        assert done["snapshot_saved"] is False
        assert next_event(watcher)["data"] == {
            "error": "ConstraintError: no room for snapshots"}
        resumed = client.call("session.resume", {"session_id": sid})
        assert (resumed["source"], resumed["compacted_at"]) == ("thread", None)
        assert resumed["messages"] == render(client, sid)["messages"]
    assert process.log().count("could not be saved") == 1


def test_the_context_note_above_warn(manual_daemon: DaemonProcess, sid: str) -> None:
    with manual_daemon.client() as client:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        client.call("message.append", {"session_id": sid, "messages": [SYSTEM, TASK]})
        work(client, sid, range(0, 6))
        below = render(client, sid)
        work(client, sid, range(6, 11))
        above = render(client, sid)
    assert below["tokens"] < 0.7 * 6_000 <= above["tokens"]
    assert below["context_note"] is None
    assert above["context_note"] == (
        f"[Context: {round(above['tokens'] / 60)}% used. Call compact_context to free space "
        "before large operations.]")


def test_a_branch_compacts_its_own_messages_and_its_parent_waits(
        manual_daemon: DaemonProcess, sid: str) -> None:
    with manual_daemon.client() as client:
        client.call("session.open", {"session_id": sid, "budget": {
            "context_window": 20_000, "max_output_tokens": 0}})
        client.call("message.append", {"session_id": sid, "messages": [SYSTEM, TASK]})
        branch = client.call("branch.create", {"session_id": sid, "description": "dig",
                                               "prompt": "Find the flaky test.",
                                               "budget": 16_000, "inject_memories": False})
        branch_id = branch["branch_id"]
        for step in range(32):
            client.call("message.append", {"session_id": sid, "branch_id": branch_id,
                                           "messages": [call(step), result(step)]})
        refused = rpc_error(client, "context.compact", {"session_id": sid})
        assert refused.code == -32003
        assert refused.data["live_branches"] == [branch_id]
        status = client.call("branch.status", {"branch_id": branch_id})["branch"]
        done = client.call("context.compact", {"session_id": sid, "branch_id": branch_id,
                                               "strategies": ["clear"]})
        after = client.call("branch.status", {"branch_id": branch_id})["branch"]
        shown = render(client, sid, branch_id=branch_id)
    assert done["branch_id"] == branch_id
    assert done["cleared"] > 0
    assert after["budget_used"] == status["budget_used"] - done["tokens_recovered"]
    assert shown["tokens"] == done["after_tokens"] == rendered_tokens(shown["messages"])
    assert done["after_tokens"] <= 12_000


def test_a_rollback_brings_back_what_a_later_compaction_took(
        manual_daemon: DaemonProcess, sid: str) -> None:
    with manual_daemon.client() as client:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        client.call("message.append", {"session_id": sid, "messages": [SYSTEM, TASK]})
        work(client, sid, range(0, 3))
        branch_id = client.call("branch.create", {
            "session_id": sid, "description": "try", "prompt": "Try a fix.",
            "inject_memories": False})["branch_id"]
        client.call("branch.return", {"branch_id": branch_id, "message": "It did not work."})
        work(client, sid, range(3, 10))
        before = render(client, sid)
        client.call("context.compact", {"session_id": sid})
        assert render(client, sid)["tokens"] < before["tokens"]
        rolled = client.call("branch.rollback", {"session_id": sid, "branch_id": branch_id})
        after = render(client, sid)
        assert client.call("session.resume", {"session_id": sid})["source"] == "thread"
    kept = [m for m in before["messages"]][:2 + 2 * 3]
    assert after["messages"] == kept
    assert after["tokens"] == rendered_tokens(kept) == rolled["context_state"][
        "main_thread_tokens"]


def test_a_closed_session_is_not_compacted(manual_daemon: DaemonProcess, sid: str) -> None:
    with manual_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        client.call("session.close", {"session_id": sid})
        error = rpc_error(client, "context.compact", {"session_id": sid})
        resumed = client.call("session.resume", {"session_id": sid})
    assert error.code == -32003
    assert (resumed["source"], resumed["messages"], resumed["tokens"]) == ("thread", [], 0)


def summarizing_daemon(root: Path, *args: str) -> DaemonProcess:
    return DaemonProcess(root, extra_args=["--hygiene-auto-compact", "false", *args])


def test_an_http_summarizer_writes_the_summary(daemon_root: Path, sid: str) -> None:
    with ChatServer() as server:
        server.summary = "The user wants the failing tests fixed; steps 0-2 ran bash."
        process = summarizing_daemon(daemon_root, "--hygiene-summarizer", "http",
                                     "--hygiene-summarizer-url", server.url,
                                     "--hygiene-summarizer-model", "small-model")
        with process.running(), process.client() as client:
            client.call("session.open", {"session_id": sid, "budget": WINDOW})
            client.call("message.append", {"session_id": sid, "messages": [SYSTEM, TASK]})
            work(client, sid, range(0, 10))
            done = client.call("context.compact", {"session_id": sid,
                                                   "strategies": ["summarize"]})
            rendered = render(client, sid)
    [request] = server.requests
    assert request.body["model"] == "small-model"
    assert (done["summarizer"], done["summarizer_error"]) == ("http", None)
    assert rendered["messages"][2]["content"] == (
        f"[Summary of {done['summarized']} earlier messages, written by the http summarizer "
        "when ctxd compacted the context; message.list keeps the originals.]\n\n"
        "The user wants the failing tests fixed; steps 0-2 ran bash.")


def test_a_failing_summarizer_falls_back_to_truncation_and_says_so(
        daemon_root: Path, sid: str) -> None:
    failing = f"{sys.executable} -c \"import sys; sys.stderr.write('out of memory'); sys.exit(3)\""
    process = summarizing_daemon(daemon_root, "--hygiene-summarizer", "command",
                                 "--hygiene-summarizer-command", failing)
    with process.running(), process.client() as client, process.client() as watcher:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        watcher.call("events.subscribe", {"session_id": sid, "types": ["context.compacted"]})
        client.call("message.append", {"session_id": sid, "messages": [SYSTEM, TASK]})
        work(client, sid, range(0, 10))
        done = client.call("context.compact", {"session_id": sid,
                                               "strategies": ["summarize", "truncate"]})
        event = next_event(watcher)
    assert done["strategies_run"] == ["summarize", "truncate"]
    assert (done["summarized"], done["summarizer"]) == (0, "command")
    assert done["summarizer_error"] == (f"summarizer command {sys.executable!r} exited with "
                                        "status 3: out of memory")
    assert done["truncated"] > 0
    assert done["after_tokens"] <= 3_600
    assert event["data"]["summarizer_error"] == done["summarizer_error"]
    assert process.log().count("the command summarizer failed") == 1


def test_a_span_leaving_the_daemon_is_scrubbed(daemon_root: Path, sid: str) -> None:
    token = "ghp_" + "".join("abcdefghijklmnopqrstuvwxyz0123456789"[i * 7 % 36]
                             for i in range(36))
    seen = daemon_root / "seen.json"
    script = daemon_root / "summarize.py"
    script.write_text(f"import sys\nopen({str(seen)!r}, 'w').write(sys.stdin.read())\n"
                      "print('Pushed the fix.')\n")
    process = summarizing_daemon(daemon_root, "--hygiene-summarizer", "command",
                                 "--hygiene-summarizer-command", f"{sys.executable} {script}")
    with process.running(), process.client() as client:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        client.call("message.append", {"session_id": sid, "messages": [
            SYSTEM, {"role": "user", "content": f"Push with {token} when done."}]})
        work(client, sid, range(0, 10))
        client.call("message.append", {"session_id": sid, "messages": [
            {"role": "user", "content": "Go on."}]})
        done = client.call("context.compact", {"session_id": sid,
                                               "strategies": ["summarize"]})
    assert (done["summarizer"], done["summarizer_error"]) == ("command", None)
    sent = seen.read_text()
    assert token not in sent
    assert '"content":"Push with [REDACTED:github_token] when done."' in sent


def write_call(step: int) -> dict[str, Any]:
    """An Anthropic tool call that writes a file of 60 lines (3,000 bytes or so)."""
    return {"role": "assistant", "content": [
        {"type": "text", "text": f"Writing module {step}."},
        {"type": "tool_use", "id": f"toolu_{step}", "name": "Write",
         "input": {"file_path": f"/src/mod{step}.py", "content": "".join(
             f"def f{step}_{i}(value):\n    return value + {i}  # {step}\n"
             for i in range(30))}}]}


def test_clearing_clears_old_tool_calls_large_inputs(manual_daemon: DaemonProcess,
                                                    sid: str) -> None:
    with manual_daemon.client() as client:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        client.call("message.append", {"session_id": sid, "messages": [SYSTEM, TASK]})
        for step in range(7):
            client.call("message.append", {"session_id": sid, "messages": [
                write_call(step),
                {"role": "tool", "name": "Write", "tool_call_id": f"toolu_{step}",
                 "content": f"wrote /src/mod{step}.py"}]})
        before = render(client, sid)
        done = client.call("context.compact", {"session_id": sid, "strategies": ["clear"]})
        after = render(client, sid)
        archive = listed(client, sid)
        by_seq = {m["seq"]: m for m in archive}
        gone = [m for m in archive if m.get("compaction") == "cleared"]
        # The two oldest calls (the newest five are kept), oldest first; their small
        # results stay as they are.
        assert [m["seq"] for m in gone] == [3, 5]
        reads = []
        for original in gone:
            marker = by_seq[original["replaced_by"]]
            value = original["content"][1]["input"]["content"]
            ref_id = f"res_{marker['content'][1]['input']['content'].split('res_')[1][:16]}"
            assert marker["content"] == [
                original["content"][0],
                {"type": "tool_use", "id": original["content"][1]["id"], "name": "Write",
                 "input": {"file_path": original["content"][1]["input"]["file_path"],
                           "content": f"[Old tool input cleared — {len(value):,} chars; "
                                      f'read it with read_result ref_id="{ref_id}" '
                                      f"offset=0 limit={len(value)} or ctxctl result "
                                      f"{ref_id} --offset 0 --limit {len(value)}]"}}]
            assert (marker["role"], marker["at_seq"], marker["meta"]) == (
                "assistant", original["seq"], {"compaction": "cleared",
                                               "seq": original["seq"]})
            read = client.call("result.read", {"session_id": sid, "ref_id": ref_id,
                                               "offset": 0, "limit": len(value)})
            reads.append(read)
            assert read["content"] == value
            assert (read["tool_name"], read["seq"], read["size_bytes"]) == (
                "Write", original["seq"], len(value.encode()))
    assert before["tokens"] > 3_600 >= done["after_tokens"]
    assert (done["cleared"], done["strategies_run"]) == (2, ["clear"])
    assert after["tokens"] == rendered_tokens(after["messages"]) == done["after_tokens"]
    # Every call is still followed by its result, ids intact.
    rendered = after["messages"]
    calls = [part["id"] for m in rendered if isinstance(m["content"], list)
             for part in m["content"] if part.get("type") == "tool_use"]
    assert calls == [f"toolu_{step}" for step in range(7)]
    for index, message in enumerate(rendered):
        if message["role"] == "assistant":
            assert rendered[index + 1]["tool_call_id"] == message["content"][1]["id"]


WORKER_THREAD_IDLE_S = 0.5
"""How long one of trio's cached worker threads waits for work before it ends, in the
daemon of the test below (10 s in trio: waiting for that took the test 11 s)."""
HELD_SUMMARIZER = """
import os, pathlib, sys, time
root = pathlib.Path(sys.argv[1])
sys.stdin.buffer.read()
(root / "pid.tmp").write_text(str(os.getpid()))
(root / "pid.tmp").rename(root / "pid")
while not (root / "release").exists():
    time.sleep(0.05)
print("The user greeted the agent.")
"""
"""A summarizer command that records its pid, then waits for the test's release."""


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie has ended: it only waits to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_the_command_summarizer_dies_with_a_killed_daemon(daemon_root: Path, sid: str) -> None:
    script = daemon_root / "held.py"
    script.write_text(HELD_SUMMARIZER)
    process = summarizing_daemon(
        daemon_root, "--hygiene-summarizer", "command", "--hygiene-summarizer-command",
        f"{sys.executable} {script} {daemon_root}", "--hygiene-summarizer-timeout-s", "600")
    process.entry = entry_with({"trio._core._thread_cache.IDLE_TIMEOUT": WORKER_THREAD_IDLE_S})
    process.start()
    try:
        with process.client() as client:
            client.call("session.open", {"session_id": sid, "budget": WINDOW})
            client.call("message.append", {"session_id": sid, "messages": [SYSTEM, TASK]})
            work(client, sid, range(0, 10))
            client.submit("context.compact", {"session_id": sid,
                                              "strategies": ["summarize"]})
            deadline = time.monotonic() + 30
            while not (daemon_root / "pid").exists():
                assert time.monotonic() < deadline, "the summarizer never started"
                time.sleep(0.01)
            pid = int((daemon_root / "pid").read_text())
            # The parent-death signal follows the thread that forked: a summarizer forked
            # by a worker thread of trio's cache was killed once that thread fell idle. A
            # real wait on purpose: that idle time is trio's, in another process, and no
            # clock of the test's can stand in for it (the daemon's is made short).
            time.sleep(WORKER_THREAD_IDLE_S + 1)
            assert running(pid)
            process.kill()
        deadline = time.monotonic() + 10
        while running(pid):
            assert time.monotonic() < deadline, f"summarizer {pid} outlived the daemon"
            time.sleep(0.01)
    finally:
        (daemon_root / "release").touch()

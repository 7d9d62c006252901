"""Context hygiene against a real daemon: offloaded tool results (the stub, its tokens,
result.read's pages and line search, branches, events, the inline fallback)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import apsw
import pytest
from conftest import DaemonProcess
from daemon_process import entry_with
from tests_support import COUNTER, next_event, rpc_error

from ctxclient import Client, RpcError
from ctxd.hygiene import stub_text

SYSTEM = {"role": "system", "content": "You are a careful coding agent."}
TASK = {"role": "user", "content": "Run the test suite and fix what fails."}
CALL = {"role": "assistant", "content": "Running the tests.",
        "meta": {"tool_calls": [{"id": "call_1", "name": "bash"}]}}


def log_text(lines: int) -> str:
    """A test run's output: ``lines`` numbered lines, every 7th a failure."""
    return "".join(f"tests/test_{i}.py::test_case {'FAILED' if i % 7 == 0 else 'PASSED'}\n"
                   for i in range(1, lines + 1))


def tool(content: Any, name: str | None = "bash", **extra: Any) -> dict[str, Any]:
    message = {"role": "tool", "content": content, "tool_call_id": "call_1", **extra}
    if name is not None:
        message["name"] = name
    return message


def stub(size: int, name: str | None, text: str, ref_id: str) -> str:
    """The stub of ``text`` (its exact text is the unit tests', tests/unit/test_offload_stub.py;
    here, that the daemon stores, counts and renders it)."""
    return stub_text(size, name, text, ref_id)


def tokens_of(message: dict[str, Any]) -> int:
    return COUNTER.message_tokens(message["role"], message["content"], message.get("name"),
                                  message.get("tool_call_id"))


def start(client: Client, sid: str) -> None:
    client.call("session.open", {"session_id": sid})
    client.call("message.append", {"session_id": sid, "messages": [SYSTEM, TASK, CALL]})


def listed(client: Client, sid: str, **extra: Any) -> list[dict[str, Any]]:
    return client.call("message.list", {"session_id": sid, **extra})["messages"]  # type: ignore[no-any-return]


def test_a_large_tool_result_renders_as_its_stub_and_counts_as_it(
        shared_daemon: DaemonProcess, sid: str) -> None:
    text = log_text(250)
    assert len(text.encode()) == 8_892
    with shared_daemon.client() as client, shared_daemon.client() as watcher:
        start(client, sid)
        watcher.call("events.subscribe", {"session_id": sid,
                                          "types": ["result.offloaded"]})
        before = client.call("session.get", {"session_id": sid})["context_state"]
        appended = client.call("message.append", {"session_id": sid,
                                                  "messages": [tool(text)]})
        whole = listed(client, sid)[-1]
        ref_id = whole["ref_id"]
        assert re.fullmatch(r"res_[0-9a-f]{16}", ref_id)
        assert whole["content"] == text
        shown = tool(stub(8_892, "bash", text, ref_id))
        # Its first 5 lines and last 5 (180 characters each at most), and the failures
        # between them that fit in 600 characters: lines 7, 14, 21 and 28 (559 with the
        # markers; line 35 would make 608).
        lines = text.splitlines()
        assert shown["content"] == (
            '[Tool result stored — 8,892 bytes, 250 lines from "bash". First and last lines, '
            "and lines with errors:\n" + "\n".join([
                *lines[0:5], "[… 1 line …]", lines[6], "[… 6 lines …]", lines[13],
                "[… 6 lines …]", lines[20], "[… 6 lines …]", lines[27], "[… 217 lines …]",
                *lines[245:250]]) + f'\n] Use read_result with ref_id="{ref_id}" (or run: '
            f"ctxctl result {ref_id}) to read more.")
        assert lines[27] == "tests/test_28.py::test_case FAILED"
        assert whole["tokens"] == tokens_of(shown)
        assert appended["appended"][0]["tokens"] == tokens_of(shown)
        state = appended["context_state"]
        assert state["main_thread_tokens"] == before["main_thread_tokens"] + tokens_of(shown)
        rendered = client.call("ctxd.render", {"session_id": sid})
        assert rendered["messages"][-1] == {"role": "tool", "content": shown["content"],
                                            "name": "bash", "tool_call_id": "call_1"}
        assert rendered["stats"]["message_tokens"] == sum(
            tokens_of(m) for m in [SYSTEM, TASK, CALL, shown])
        event = next_event(watcher)
        assert (event["type"], event["data"]) == ("result.offloaded", {
            "branch_id": None, "seq": 4, "ref_id": ref_id, "tool_name": "bash",
            "size_bytes": 8_892, "tokens": tokens_of(shown)})
        read = client.call("result.read", {"session_id": sid, "ref_id": ref_id})
        assert read == {"ref_id": ref_id, "tool_name": "bash", "size_bytes": 8_892,
                        "total_chars": 8_892, "seq": 4, "branch_id": None, "offset": 0,
                        "content": text[:8000], "next_offset": 8000, "matches": None,
                        "matched_lines": 0, "more_matches": 0}
        rest = client.call("result.read", {"session_id": sid, "ref_id": ref_id,
                                           "offset": 8000})
        assert (rest["content"], rest["next_offset"]) == (text[8000:], None)


def test_what_stays_inline(shared_daemon: DaemonProcess, sid: str) -> None:
    at_threshold = "x" * 4096
    over = "é" * 2049  # 4,098 bytes in 2,049 characters
    error = "Traceback (most recent call last):\n" + "y" * 5000
    with shared_daemon.client() as client:
        start(client, sid)
        client.call("message.append", {"session_id": sid, "messages": [
            tool(at_threshold),
            tool(error, meta={"is_error": True}),
            tool([{"type": "text", "text": error, "is_error": True}]),
            tool([{"type": "text", "text": "see the image"},
                  {"type": "image", "source": {"data": "z" * 5000}}]),
            {"role": "user", "content": "u" * 5000},
            tool(over, name=None)]})
        messages = listed(client, sid)[3:]
        assert [m.get("ref_id") is not None for m in messages] == [
            False, False, False, False, False, True]
        rendered = client.call("ctxd.render", {"session_id": sid})["messages"][3:]
        assert [m["content"] for m in rendered[:5]] == [m["content"] for m in messages[:5]]
        assert rendered[5]["content"] == stub(4098, None, over, messages[5]["ref_id"])


def test_text_parts_are_read_joined_and_listed_as_given(shared_daemon: DaemonProcess,
                                                        sid: str) -> None:
    parts = [{"type": "text", "text": log_text(100)}, {"type": "text", "text": log_text(50)}]
    joined = parts[0]["text"] + "\n" + parts[1]["text"]
    with shared_daemon.client() as client:
        start(client, sid)
        client.call("message.append", {"session_id": sid, "messages": [tool(parts)]})
        whole = listed(client, sid)[-1]
        assert whole["content"] == parts
        read = client.call("result.read", {"session_id": sid, "ref_id": whole["ref_id"],
                                           "limit": 1_000_000})
        assert (read["content"], read["size_bytes"]) == (joined, len(joined.encode()))
        rendered = client.call("ctxd.render", {"session_id": sid})["messages"][-1]
        assert rendered["content"] == stub(len(joined.encode()), "bash", joined,
                                           whole["ref_id"])


def test_pages_never_split_a_code_point(shared_daemon: DaemonProcess, sid: str) -> None:
    # 1, 2, 3 and 4 bytes per character: every page edge falls inside some byte sequence.
    text = "aé€😀" * 2000
    with shared_daemon.client() as client:
        start(client, sid)
        client.call("message.append", {"session_id": sid, "messages": [tool(text)]})
        ref_id = listed(client, sid)[-1]["ref_id"]
        pages: list[str] = []
        offset: int | None = 0
        while offset is not None:
            read = client.call("result.read", {"session_id": sid, "ref_id": ref_id,
                                               "offset": offset, "limit": 999})
            assert read["offset"] == offset
            pages.append(read["content"])
            offset = read["next_offset"]
        assert [len(p) for p in pages] == [999] * 8 + [8000 - 999 * 8]
        assert pages[1][:3] == "😀aé"  # 999 = 4·249 + 3: the second page opens on the emoji
        assert "".join(pages).encode() == text.encode()
        assert read["size_bytes"] == 20_000
        past = client.call("result.read", {"session_id": sid, "ref_id": ref_id,
                                           "offset": 9000})
        assert (past["content"], past["next_offset"]) == ("", None)


def test_pattern_returns_the_lines_grep_n_finds(shared_daemon: DaemonProcess, sid: str,
                                                tmp_path: Path) -> None:
    text = log_text(500) + "last line without newline: FAILED?"
    saved = tmp_path / "out.txt"
    saved.write_text(text)
    grep_n = subprocess.run(["grep", "-nE", "FAILED", str(saved)], capture_output=True,
                            text=True, check=True).stdout.splitlines()
    with shared_daemon.client() as client:
        start(client, sid)
        client.call("message.append", {"session_id": sid, "messages": [tool(text)]})
        ref_id = listed(client, sid)[-1]["ref_id"]
        found = client.call("result.read", {"session_id": sid, "ref_id": ref_id,
                                            "pattern": "FAILED", "max_matches": 1000})
        assert [f"{m['line']}:{m['text']}" for m in found["matches"]] == grep_n
        assert (found["matched_lines"], found["more_matches"], found["content"]) == (72, 0,
                                                                                     None)
        bounded = client.call("result.read", {"session_id": sid, "ref_id": ref_id,
                                              "pattern": r"test_(\d)\d\.py.*FAILED$",
                                              "max_matches": 3})
        assert bounded["matches"] == [
            {"line": 14, "text": "tests/test_14.py::test_case FAILED", "truncated": False},
            {"line": 21, "text": "tests/test_21.py::test_case FAILED", "truncated": False},
            {"line": 28, "text": "tests/test_28.py::test_case FAILED", "truncated": False}]
        assert (bounded["matched_lines"], bounded["more_matches"]) == (13, 10)
        literal = client.call("result.read", {"session_id": sid, "ref_id": ref_id,
                                              "pattern": "FAILED?", "literal": True})
        assert literal["matches"] == [{"line": 501, "truncated": False,
                                       "text": "last line without newline: FAILED?"}]
        error = rpc_error(client, "result.read", {"session_id": sid, "ref_id": ref_id,
                                                  "pattern": "FAILED(("})
        assert error.code == -32602
        assert error.message == ("invalid params: not a valid regular expression (missing ) at "
                                 "position 8); fix it, or pass literal=true to search for the "
                                 "text as it is (at $.pattern)")
        assert error.data["path"] == "$.pattern"
        error = rpc_error(client, "result.read", {"session_id": sid, "ref_id": ref_id,
                                                  "pattern": "x", "offset": 10})
        assert (error.code, error.data["path"]) == (-32602, "$.offset")


SEARCH_TIMEOUT_S = 0.5
"""How long a search may run in the daemon of the test below (5 s in ctxd)."""


def test_a_search_that_backtracks_without_end_is_stopped(daemon_root: Path, sid: str) -> None:
    daemon = DaemonProcess(daemon_root, entry=entry_with(
        {"ctxd.sessions._hygiene_ops.SEARCH_TIMEOUT_S": SEARCH_TIMEOUT_S}))
    with daemon.running(), daemon.client() as client, daemon.client() as other:
        start(client, sid)
        client.call("message.append", {"session_id": sid, "messages": [tool("a" * 5000)]})
        ref_id = listed(client, sid)[-1]["ref_id"]
        pending = client.submit("result.read", {"session_id": sid, "ref_id": ref_id,
                                                "pattern": "(a+)+b"})
        # The search holds no lock the daemon needs: other sessions are served meanwhile.
        assert other.call("session.open", {"session_id": sid + "_2"})["created"] is True
        with pytest.raises(RpcError) as caught:
            pending.result()
        assert (caught.value.code, caught.value.data["path"]) == (-32602, "$.pattern")
        assert caught.value.message.startswith(
            f"invalid params: the search did not end within {SEARCH_TIMEOUT_S:g} s")
        assert client.call("result.read", {"session_id": sid, "ref_id": ref_id,
                                           "pattern": "a{5000}"})["matched_lines"] == 1


def test_long_matching_lines_are_cut(shared_daemon: DaemonProcess, sid: str) -> None:
    text = "short match\n" + "match " + "z" * 5000 + "\n"
    with shared_daemon.client() as client:
        start(client, sid)
        client.call("message.append", {"session_id": sid, "messages": [tool(text)]})
        ref_id = listed(client, sid)[-1]["ref_id"]
        found = client.call("result.read", {"session_id": sid, "ref_id": ref_id,
                                            "pattern": "^match"})
        assert found["matches"] == [{"line": 2, "text": ("match " + "z" * 5000)[:1000],
                                     "truncated": True}]


def test_a_ref_of_another_session_is_unknown(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        start(client, sid)
        client.call("message.append", {"session_id": sid, "messages": [tool(log_text(200))]})
        ref_id = listed(client, sid)[-1]["ref_id"]
        other = sid + "_other"
        client.call("session.open", {"session_id": other})
        for session, ref in ((other, ref_id), (sid, "res_0123456789abcdef")):
            error = rpc_error(client, "result.read", {"session_id": session, "ref_id": ref})
            assert (error.code, error.message) == (-32004, f"unknown ref {ref!r}")
        error = rpc_error(client, "result.read", {"session_id": sid, "ref_id": "res_1"})
        assert error.code == -32602
        client.call("session.delete", {"session_id": sid})
    database = apsw.Connection(str(shared_daemon.data_dir / "ctxd.db"),
                               flags=apsw.SQLITE_OPEN_READONLY)
    assert database.execute("SELECT count(*) FROM tool_result_blobs WHERE ref_id = ?",
                            (ref_id,)).fetchall() == [(0,)]
    database.close()


def test_offloaded_in_a_branch(shared_daemon: DaemonProcess, sid: str) -> None:
    text = log_text(300)
    with shared_daemon.client() as client:
        start(client, sid)
        branch = client.call("branch.create", {"session_id": sid, "description": "tests",
                                               "prompt": "Run the tests.", "budget": 4000})
        branch_id = branch["branch_id"]
        appended = client.call("message.append", {"session_id": sid, "branch_id": branch_id,
                                                  "messages": [CALL, tool(text)]})
        whole = listed(client, sid, branch_id=branch_id)[-1]
        assert whole["content"] == text
        shown = tool(stub(len(text), "bash", text, whole["ref_id"]))
        assert appended["tokens_appended"] == tokens_of(CALL) + tokens_of(shown)
        status = client.call("branch.status", {"branch_id": branch_id})["branch"]
        assert status["status"] == "active"
        assert status["budget_used"] == branch["budget_used"] + appended["tokens_appended"]
        rendered = client.call("ctxd.render", {"session_id": sid, "branch_id": branch_id})
        assert rendered["messages"][-1]["content"] == shown["content"]
        read = client.call("result.read", {"session_id": sid, "ref_id": whole["ref_id"],
                                           "limit": 100_000})
        assert (read["content"], read["branch_id"]) == (text, branch_id)


def test_threshold_is_configured_and_a_failed_offload_stays_inline(
        daemon_root: Path, sid: str) -> None:
    process = DaemonProcess(daemon_root, extra_args=["--hygiene-offload-threshold-bytes", "256"])
    text = "z" * 300
    with process.running(), process.client() as client:
        start(client, sid)
        client.call("message.append", {"session_id": sid, "messages": [tool(text)]})
        ref_id = listed(client, sid)[-1]["ref_id"]
    database = apsw.Connection(str(process.data_dir / "ctxd.db"))
    # The store refuses every blob, and nothing else.
    database.execute("CREATE TRIGGER refuse_blobs BEFORE INSERT ON tool_result_blobs "
                     "BEGIN SELECT RAISE(ABORT, 'no room for blobs'); END")
    database.close()
    with process.running(), process.client() as client, process.client() as watcher:
        assert client.call("result.read", {"session_id": sid, "ref_id": ref_id})[
            "content"] == text
        watcher.call("events.subscribe", {"session_id": sid})
        appended = client.call("message.append", {"session_id": sid,
                                                  "messages": [tool(text + "!")]})
        assert appended["appended"][0]["tokens"] == tokens_of(tool(text + "!"))
        last = listed(client, sid)[-1]
        assert (last["content"], last.get("ref_id")) == (text + "!", None)
        rendered = client.call("ctxd.render", {"session_id": sid})["messages"][-1]
        assert rendered["content"] == text + "!"
        event = next_event(watcher)
        assert (event["type"], event["data"]) == ("result.offload_failed", {
            "branch_id": None, "count": 1,
            "error": "ConstraintError: no room for blobs"})
        assert next_event(watcher)["type"] == "message.appended"
    assert process.log().count("could not be offloaded") == 1

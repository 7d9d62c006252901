"""session.open's fork_from fits its seed to the new session (docs/protocol.md,
"context.fork"): within its compaction target, its tool results offloaded in it."""

from __future__ import annotations

from typing import Any

from conftest import DaemonProcess

from ctxd.hygiene import ref_id_for
from ctxd.hygiene._offload import STUB_PREFIX


def test_fork_from_fits_the_seed_to_the_child_and_offloads_its_results(
        shared_daemon: DaemonProcess, sid: str) -> None:
    log = "".join(f"line {index}: ok\n" for index in range(2_000))  # 26,890 characters
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        client.call("message.append", {"session_id": sid, "messages": [
            {"role": "user", "content": "hi " * 60_000},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "bash",
                                               "input": {"command": "make"}}]},
            {"role": "tool", "content": log, "tool_call_id": "c1", "name": "bash"}]})
        child = "seeded-child"  # fixed: its stub's ref_id, and so its tokens, derive from it
        opened = client.call("session.open", {"session_id": child, "budget": {
            "context_window": 16_384}, "fork_from": {"session_id": sid}})
        # An effective window of 8,192 tokens, a compaction target of 60%: 4,915 tokens.
        # The first fork (180,000 + 26,890 characters) is far over; the next, at a smaller
        # character budget, cuts both messages that must stay, and fits.
        # (The result's stub shows its first and last lines: 80 tokens more than the first
        # 200 characters it showed before.)
        state = opened["context_state"]
        assert (state["health"], state["effective_window"], state["total_tokens"],
                state["main_thread_tokens"]) == ("ok", 8_192, 3_221, 3_224)
        assert opened["session"]["message_count"] == 4
        assert (opened["fork"]["tokens"], opened["fork"]["char_budget"]) == (3_221, 16_920)
        again = client.call("context.fork", {"session_id": sid, "char_budget": 16_920,
                                             "no_removal_chars": 16_920})
        assert (again["preamble"], again["stats"]) == (opened["fork"]["preamble"],
                                                       opened["fork"]["stats"])
        listed = client.call("message.list", {"session_id": child})["messages"]
        assert listed[0]["content"].splitlines()[3] == (
            "Messages removed to fit the character budget: 0; 2 messages that must stay (the "
            "newest, the latest user request) cut to fit it.")
        # 26 characters less of budget than with the shorter stub: 13 less for each.
        assert len(listed[1]["content"]) == 8_424
        kept = log[:6_714] + "…[truncated 18497 chars]…" + log[-1_679:]
        assert listed[3]["content"] == kept
        # The seeded result is offloaded in the child, as an append would: its stub is in
        # the context, its text one result.read away on the child.
        ref_id = ref_id_for(child, 4)
        rendered = client.call("ctxd.render", {"session_id": child})["messages"]
        assert rendered[3]["content"].startswith(STUB_PREFIX)
        assert ref_id in rendered[3]["content"]
        read = client.call("result.read", {"session_id": child, "ref_id": ref_id,
                                           "limit": 10_000})
        assert (read["tool_name"], read["total_chars"], read["content"]) == (
            "bash", 8_418, kept)
        more = client.call("message.append", {"session_id": child, "messages": [
            {"role": "user", "content": "next"}]})
        assert more["context_state"]["health"] == "ok"


def test_a_fork_names_no_blob_of_the_forked_session(shared_daemon: DaemonProcess,
                                                    sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid, "budget": {
            "context_window": 8_192, "max_output_tokens": 0}})
        messages: list[dict[str, Any]] = [{"role": "user", "content": "read them"}]
        for index in range(12):
            messages += [
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": f"c{index}", "name": "read",
                     "input": {"path": f"f{index}.py", "note": "x" * 2_000}}]},
                {"role": "tool", "content": f"file {index} " * 150, "tool_call_id": f"c{index}",
                 "name": "read"}]
        # The append reaches the compaction trigger: the oldest results and inputs are
        # cleared, their markers naming blobs of this session.
        client.call("message.append", {"session_id": sid, "allow_over": True,
                                       "messages": messages})
        rendered = client.call("ctxd.render", {"session_id": sid})["messages"]
        assert rendered[2]["content"].startswith(
            '[Old tool result content cleared — read it with read_result ref_id="res_')
        got = client.call("context.fork", {"session_id": sid})
    assert "res_" not in got["context"]
    assert got["context"].startswith("\n\n".join([
        "[user]\nread them",
        '[assistant]\n[tool_use read id=c0] {"path": "f0.py", "note": '
        '"[Old tool input cleared]"}',
        "[tool: read]\n[Old tool result content cleared]"]))
    assert (got["stats"]["cleared_results"], got["context"].count("[Old tool input cleared]"),
            got["context"].count("[Old tool result content cleared]")) == (7, 7, 7)

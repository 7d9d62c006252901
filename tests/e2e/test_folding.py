"""Context folding against a real daemon: branch.* methods, budgets, deadlines, fold, render,
rollback, restart."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import apsw
import pytest
from conftest import DaemonProcess
from tests_support import COUNTER, hello_text, next_event, rpc_error

from ctxclient import Client, RpcError

SYSTEM = {"role": "system", "content": "You are a careful coding agent."}
TASK = {"role": "user", "content": "The migration test fails. Find out why and fix it."}


def message_tokens(message: dict[str, Any]) -> int:
    return COUNTER.message_tokens(message["role"], message["content"], message.get("name"),
                                  message.get("tool_call_id"))


def rendered_tokens(messages: list[dict[str, Any]]) -> int:
    """What a rendered list of messages costs: every message plus the reply priming."""
    return sum(message_tokens(m) for m in messages) + 3 if messages else 0


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def opening(client: Client, branch_id: str) -> list[dict[str, Any]]:
    """The note and prompt ctxd stored as a branch's first two messages."""
    listed = client.call("message.list", {"session_id": client_session(client, branch_id),
                                          "branch_id": branch_id, "limit": 2})
    return [{"role": m["role"], "content": m["content"]} for m in listed["messages"]]


def client_session(client: Client, branch_id: str) -> str:
    return client.call("branch.status", {"branch_id": branch_id})["branch"]["session_id"]  # type: ignore[no-any-return]


def start_session(client: Client, session_id: str, **budget: int) -> None:
    client.call("session.open", {"session_id": session_id, **({"budget": budget} if budget
                                                              else {})})
    client.call("message.append", {"session_id": session_id, "messages": [SYSTEM, TASK]})


def test_full_lifecycle_folds_the_branch_into_one_message(shared_daemon: DaemonProcess,
                                                          sid: str) -> None:
    with shared_daemon.client() as client:
        start_session(client, sid)
        created = client.call("branch.create", {
            "session_id": sid, "description": "find the failing migration test",
            "prompt": "Run the test suite and report which migration test fails and why.",
            "budget": 4000, "timeout_seconds": 120})
        branch_id = created["branch_id"]
        assert branch_id.startswith("br_")
        assert len(branch_id) == 15
        opened = opening(client, branch_id)
        assert opened[1] == user("Run the test suite and report which migration test fails "
                                 "and why.")
        assert opened[0]["content"].startswith('[Branch mode] You are working in a branch '
                                                '(depth 1 of 3) on one sub-task: "find the '
                                                'failing migration test". It has a budget of '
                                                '4000 tokens and 120 seconds.')
        assert created["budget_used"] == sum(message_tokens(m) for m in opened)
        main_tokens = rendered_tokens([SYSTEM, TASK])
        assert {k: created[k] for k in ("parent_branch_id", "depth", "budget_allocated",
                                        "timeout_seconds", "injected_context")} == {
            "parent_branch_id": None, "depth": 1, "budget_allocated": 4000,
            "timeout_seconds": 120.0, "injected_context": []}
        assert created["parent_budget_remaining"] == 191_808 - main_tokens
        assert created["deadline"] == pytest.approx(created["created_at"] + 120)
        work = [assistant("Running pytest -x tests/test_migrations.py"),
                {"role": "tool", "tool_call_id": "call_1", "content": hello_text(500)},
                assistant("test_v2 fails: the migration does not bump user_version.")]
        appended = client.call("message.append", {"session_id": sid, "branch_id": branch_id,
                                                  "messages": work})
        used = created["budget_used"] + sum(message_tokens(m) for m in work)
        state = appended["context_state"]
        assert appended["forced_returns"] == []
        assert {k: state[k] for k in ("active_branch_id", "branch_depth", "branch_path",
                                      "main_thread_tokens", "current_branch_tokens",
                                      "current_branch_budget", "total_tokens",
                                      "folded_tokens", "health")} == {
            "active_branch_id": branch_id, "branch_depth": 1, "branch_path": [branch_id],
            "main_thread_tokens": main_tokens, "current_branch_tokens": used,
            "current_branch_budget": 4000, "total_tokens": main_tokens - 3 + used,
            "folded_tokens": 0, "health": "ok"}
        assert state["usage"] == round((main_tokens + used) / 191_808, 6)

        summary = "test_v2 fails because v0002 does not bump user_version; fixed it."
        returned = client.call("branch.return", {"branch_id": branch_id, "message": summary})
        fold = user(f'Branch "find the failing migration test" returned: {summary}')
        assert returned["summary"] == {
            "tokens_folded": used, "tokens_saved": used - message_tokens(fold),
            "operations_count": 2, "secrets_scrubbed": 0, "summary_redacted": False,
            "summary_truncated": False}
        assert {k: returned[k] for k in ("success", "branch_id", "parent_branch_id",
                                         "tokens_used", "memory_queued", "forced_returns",
                                         "fold_seq")} == {
            "success": True, "branch_id": branch_id, "parent_branch_id": None,
            "tokens_used": used, "memory_queued": False, "forced_returns": [], "fold_seq": 8}

        rendered = client.call("ctxd.render", {"session_id": sid})
        assert rendered["messages"] == [SYSTEM, TASK, fold]
        assert rendered["tokens"] == rendered_tokens([SYSTEM, TASK, fold])
        assert rendered["stats"] == {"message_count": 3, "stored_messages": 8,
                                     "message_tokens": rendered["tokens"] - 3,
                                     "reply_priming_tokens": 3}
        state = rendered["context_state"]
        assert (state["active_branch_id"], state["main_thread_tokens"], state["folded_tokens"],
                state["total_tokens"]) == (None, rendered["tokens"], used,
                                           rendered["tokens"] - 3)

        archive = client.call("message.list", {"session_id": sid, "branch_id": branch_id})
        assert [m["seq"] for m in archive["messages"]] == [3, 4, 5, 6, 7]
        assert [{k: m[k] for k in ("role", "content")} for m in archive["messages"][2:]] == [
            {k: m[k] for k in ("role", "content")} for m in work]
        assert all(m["branch_id"] == branch_id for m in archive["messages"])
        status = client.call("branch.status", {"branch_id": branch_id})["branch"]
        assert {k: status[k] for k in ("status", "return_reason", "result", "fold_seq",
                                       "time_left_s", "budget_used", "tokens_folded")} == {
            "status": "completed", "return_reason": None, "result": summary, "fold_seq": 8,
            "time_left_s": None, "budget_used": used, "tokens_folded": used}
        listed = client.call("branch.list", {"session_id": sid})
        assert (listed["total"], listed["active"], listed["folded"]) == (1, 0, 1)


def test_nesting_to_depth_three_then_the_depth_error(shared_daemon: DaemonProcess,
                                                     sid: str) -> None:
    with shared_daemon.client() as client:
        start_session(client, sid)
        ids = []
        for depth in (1, 2, 3):
            created = client.call("branch.create", {"session_id": sid,
                                                    "description": f"level {depth}",
                                                    "prompt": f"work at level {depth}"})
            assert (created["depth"], created["parent_branch_id"]) == (
                depth, ids[-1] if ids else None)
            ids.append(created["branch_id"])
        assert created["context_state"]["branch_path"] == ids
        error = rpc_error(client, "branch.create", {"session_id": sid, "description": "too deep",
                                                    "prompt": "level 4"})
        assert error.code == -32005
        assert error.data == {"limit": "max_branch_depth", "max": 3,
                              "fix": "return the current branch first, or branch from a "
                                     "shallower one"}
        # A sibling of the main thread's branch is fine: parent_branch_id null.
        sibling = client.call("branch.create", {"session_id": sid, "description": "parallel",
                                                "prompt": "other work",
                                                "parent_branch_id": None})
        assert (sibling["depth"], sibling["parent_branch_id"]) == (1, None)
        assert client.call("daemon.status")["live_branches"] >= 4


def test_render_of_a_nested_branch_has_its_parents_prefix(shared_daemon: DaemonProcess,
                                                          sid: str) -> None:
    with shared_daemon.client() as client:
        start_session(client, sid)
        outer = client.call("branch.create", {"session_id": sid, "description": "outer",
                                              "prompt": "outer prompt"})["branch_id"]
        outer_work = [assistant("outer step one"), user("outer observation")]
        client.call("message.append", {"session_id": sid, "branch_id": outer,
                                       "messages": outer_work})
        inner = client.call("branch.create", {"session_id": sid, "description": "inner",
                                              "prompt": "inner prompt"})["branch_id"]
        inner_work = [assistant("inner step")]
        client.call("message.append", {"session_id": sid, "branch_id": inner,
                                       "messages": inner_work})
        # Added to the outer branch after the fork: not part of the inner branch's prefix.
        client.call("message.append", {"session_id": sid, "branch_id": outer,
                                       "messages": [user("after the fork")]})
        expected = [SYSTEM, TASK, *opening(client, outer), *outer_work,
                    *opening(client, inner), *inner_work]
        rendered = client.call("ctxd.render", {"session_id": sid, "branch_id": inner})
        assert rendered["branch_id"] == inner
        assert rendered["messages"] == expected
        assert rendered["tokens"] == rendered_tokens(expected)
        state = rendered["context_state"]
        assert state["active_branch_id"] == inner
        assert state["usage"] == round(rendered["tokens"] / 191_808, 6)
        assert client.call("ctxd.render", {"session_id": sid}) == rendered  # the active thread
        main = client.call("ctxd.render", {"session_id": sid, "branch_id": None})
        assert main["branch_id"] is None
        assert main["messages"] == [SYSTEM, TASK]
        assert main["tokens"] == rendered_tokens([SYSTEM, TASK])
        outer_render = client.call("ctxd.render", {"session_id": sid, "branch_id": outer})
        assert outer_render["messages"] == [SYSTEM, TASK, *opening(client, outer), *outer_work,
                                            user("after the fork")]


def test_budget_force_returns_at_exactly_the_budget(shared_daemon: DaemonProcess,
                                                    sid: str) -> None:
    with shared_daemon.client() as client, shared_daemon.client() as watcher:
        start_session(client, sid)
        watcher.call("events.subscribe", {"session_id": sid,
                                          "types": ["branch.budget_warning",
                                                    "branch.forced_return", "branch.folded"]})
        created = client.call("branch.create", {"session_id": sid, "description": "budgeted",
                                                "prompt": "do it", "budget": 1000})
        branch_id, used = created["branch_id"], created["budget_used"]
        # A user message of hello_text(n) costs n + 4 tokens.
        to_one_below = used + 0
        first = user(hello_text(1000 - 1 - used - 4))
        result = client.call("message.append", {"session_id": sid, "branch_id": branch_id,
                                                "messages": [first]})
        to_one_below = used + message_tokens(first)
        assert to_one_below == 999
        assert result["forced_returns"] == []
        state = result["context_state"]
        assert (state["active_branch_id"], state["current_branch_tokens"], state["health"]) == (
            branch_id, 999, "caution")
        warning = next_event(watcher)
        assert (warning["type"], warning["data"]) == ("branch.budget_warning", {
            "branch_id": branch_id, "budget": 1000, "budget_used": 999, "usage": 0.999})
        # The smallest message costs 4 tokens (3 + the role): 1003 ≥ 1000.
        last = assistant("")
        last_words = assistant("Found it: the fixture is stale.")
        result = client.call("message.append", {"session_id": sid, "branch_id": branch_id,
                                                "messages": [last_words]})
        assert result["forced_returns"] == [{
            "branch_id": branch_id, "status": "budget_exhausted", "reason": "budget_exhausted",
            "result": "Found it: the fixture is stale."}]
        assert result["context_state"]["active_branch_id"] is None
        forced = next_event(watcher)
        assert (forced["type"], forced["data"]) == ("branch.forced_return", {
            "branch_id": branch_id, "status": "budget_exhausted", "reason": "budget_exhausted",
            "budget": 1000, "budget_used": 999 + message_tokens(last_words)})
        folded = next_event(watcher)
        assert folded["type"] == "branch.folded"
        error = rpc_error(client, "message.append", {"session_id": sid, "branch_id": branch_id,
                                                     "messages": [last]})
        assert error.code == -32002
        assert error.data["status"] == "budget_exhausted"
        assert error.data["budget_used"] == 999 + message_tokens(last_words)
        fold = user('Branch "budgeted" was stopped (its token budget ran out); partial result: '
                    "Found it: the fixture is stale.")
        assert client.call("ctxd.render", {"session_id": sid})["messages"] == [SYSTEM, TASK,
                                                                              fold]
        error = rpc_error(client, "branch.return", {"branch_id": branch_id, "message": "late"})
        assert error.code == -32003


def test_a_branch_exactly_at_its_budget_is_force_returned(shared_daemon: DaemonProcess,
                                                          sid: str) -> None:
    with shared_daemon.client() as client:
        start_session(client, sid)
        created = client.call("branch.create", {"session_id": sid, "description": "exact",
                                                "prompt": "go", "budget": 500})
        exact = user(hello_text(500 - created["budget_used"] - 4))
        assert created["budget_used"] + message_tokens(exact) == 500
        result = client.call("message.append", {"session_id": sid,
                                                "branch_id": created["branch_id"],
                                                "messages": [exact]})
        assert result["forced_returns"] == [{
            "branch_id": created["branch_id"], "status": "budget_exhausted",
            "reason": "budget_exhausted",
            "result": "no assistant message; last messages: [user] " + exact["content"]}]
        status = client.call("branch.status", {"branch_id": created["branch_id"]})["branch"]
        assert (status["status"], status["budget_used"], status["budget_remaining"]) == (
            "budget_exhausted", 500, 0)


def test_a_short_real_timeout_force_returns_the_branch(shared_daemon: DaemonProcess,
                                                       sid: str) -> None:
    with shared_daemon.client() as client, shared_daemon.client() as watcher:
        start_session(client, sid)
        watcher.call("events.subscribe", {"session_id": sid, "types": ["branch.forced_return"]})
        created = client.call("branch.create", {"session_id": sid, "description": "slow",
                                                "prompt": "take your time",
                                                "timeout_seconds": 0.5})
        branch_id = created["branch_id"]
        client.call("message.append", {"session_id": sid, "branch_id": branch_id,
                                       "messages": [assistant("halfway there")]})
        event = next_event(watcher)
        assert event["data"] == {"branch_id": branch_id, "status": "timeout",
                                 "reason": "timeout", "budget": 8192,
                                 "budget_used": created["budget_used"]
                                 + message_tokens(assistant("halfway there")),
                                 "deadline": created["deadline"]}
        # Not before its deadline; how soon after is tested on virtual time (unit
        # test_timeout_force_returns_at_the_deadline), which a loaded machine cannot skew.
        assert event["ts"] >= created["deadline"]
        error = rpc_error(client, "message.append", {"session_id": sid, "branch_id": branch_id,
                                                     "messages": [assistant("too late")]})
        assert error.code == -32009
        assert error.data["deadline"] == created["deadline"]
        assert client.call("ctxd.render", {"session_id": sid})["messages"][-1] == user(
            'Branch "slow" was stopped (its time limit passed); partial result: halfway there')


def test_returning_a_branch_that_is_not_active(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        start_session(client, sid)
        branch_id = client.call("branch.create", {"session_id": sid, "description": "once",
                                                  "prompt": "go"})["branch_id"]
        client.call("branch.return", {"branch_id": branch_id, "message": "done"})
        error = rpc_error(client, "branch.return", {"branch_id": branch_id, "message": "again"})
        assert error.code == -32003
        assert error.data == {"branch_id": branch_id, "status": "completed",
                              "return_reason": None,
                              "fix": "only an active branch can take messages or return; "
                                     "see branch.list"}
        error = rpc_error(client, "message.append", {"session_id": sid, "branch_id": branch_id,
                                                     "messages": [user("more")]})
        assert error.code == -32003
        unknown = "br_000000000000"
        for method, params in (("branch.return", {"branch_id": unknown, "message": "x"}),
                               ("branch.status", {"branch_id": unknown}),
                               ("message.append", {"session_id": sid, "branch_id": unknown,
                                                   "messages": [user("x")]}),
                               ("ctxd.render", {"session_id": sid, "branch_id": unknown}),
                               ("branch.rollback", {"session_id": sid, "branch_id": unknown})):
            error = rpc_error(client, method, params)
            assert (error.code, error.data["branch_id"]) == (-32004, unknown), method


def test_children_are_force_returned_first_deepest_first(shared_daemon: DaemonProcess,
                                                         sid: str) -> None:
    with shared_daemon.client() as client, shared_daemon.client() as watcher:
        start_session(client, sid)
        watcher.call("events.subscribe", {"session_id": sid, "types": ["branch.folded"]})
        a = client.call("branch.create", {"session_id": sid, "description": "A",
                                          "prompt": "a"})["branch_id"]
        b = client.call("branch.create", {"session_id": sid, "description": "B",
                                          "prompt": "b"})["branch_id"]
        client.call("message.append", {"session_id": sid, "branch_id": b,
                                       "messages": [assistant("B found the config")]})
        c = client.call("branch.create", {"session_id": sid, "description": "C",
                                          "prompt": "c"})["branch_id"]
        returned = client.call("branch.return", {"branch_id": a, "message": "A is done"})
        assert [(f["branch_id"], f["status"], f["reason"]) for f in
                returned["forced_returns"]] == [(c, "failed", "parent_returned"),
                                                (b, "failed", "parent_returned")]
        assert [next_event(watcher)["data"]["branch_id"] for _ in range(3)] == [c, b, a]
        fold_b = user('Branch "B" was stopped (its parent branch returned first); partial '
                      "result: B found the config")
        a_messages = client.call("message.list", {"session_id": sid, "branch_id": a})
        assert [{k: m[k] for k in ("role", "content")} for m in a_messages["messages"]][-1] == \
            fold_b
        b_messages = client.call("message.list", {"session_id": sid, "branch_id": b})
        assert b_messages["messages"][-1]["content"] == (
            'Branch "C" was stopped (its parent branch returned first); partial result: '
            "(the branch ended before any work was recorded)")
        assert client.call("ctxd.render", {"session_id": sid})["messages"][-1] == user(
            'Branch "A" returned: A is done')
        assert client.call("branch.list", {"session_id": sid})["active"] == 0


def test_rollback_restores_the_thread_and_keeps_the_archive(shared_daemon: DaemonProcess,
                                                            sid: str) -> None:
    with shared_daemon.client() as client, shared_daemon.client() as watcher:
        start_session(client, sid)
        watcher.call("events.subscribe", {"session_id": sid, "types": ["branch.rolled_back"]})
        before = client.call("ctxd.render", {"session_id": sid})
        x = client.call("branch.create", {"session_id": sid, "description": "X",
                                          "prompt": "try approach X"})["branch_id"]
        client.call("message.append", {"session_id": sid, "branch_id": x,
                                       "messages": [assistant("X looked promising")]})
        client.call("branch.return", {"branch_id": x, "message": "X works"})
        later = [user("then do this"), assistant("ok")]
        client.call("message.append", {"session_id": sid, "messages": later})
        y = client.call("branch.create", {"session_id": sid, "description": "Y",
                                          "prompt": "try Y"})
        y_id = y["branch_id"]
        main_after = client.call("ctxd.render", {"session_id": sid, "branch_id": None})
        rolled = client.call("branch.rollback", {"session_id": sid, "branch_id": x})
        fold_x = user('Branch "X" returned: X works')
        assert {k: rolled[k] for k in ("rolled_back_to", "thread", "branches_discarded",
                                       "messages_discarded", "tokens_recovered")} == {
            "rolled_back_to": 2, "thread": None, "branches_discarded": [x, y_id],
            "messages_discarded": 3 + 1 + 2 + 2,
            "tokens_recovered": main_after["tokens"] - before["tokens"] + y["budget_used"]}
        assert main_after["tokens"] - before["tokens"] == sum(
            message_tokens(m) for m in [fold_x, *later])
        state = rolled["context_state"]
        assert (state["active_branch_id"], state["folded_tokens"], state["main_thread_tokens"]) \
            == (None, 0, before["tokens"])
        assert client.call("ctxd.render", {"session_id": sid})["messages"] == [SYSTEM, TASK]
        event = next_event(watcher)
        assert event["data"]["branches_discarded"] == [x, y_id]
        archive = client.call("message.list", {"session_id": sid})["messages"]
        assert [(m["seq"], m.get("discarded", False)) for m in archive] == [
            (1, False), (2, False), *((seq, True) for seq in range(3, 11))]
        listed = client.call("branch.list", {"session_id": sid, "status": "discarded"})
        assert [b["branch_id"] for b in listed["branches"]] == [x, y_id]
        assert (listed["total"], listed["active"], listed["folded"]) == (2, 0, 0)
        error = rpc_error(client, "message.append", {"session_id": sid, "branch_id": y_id,
                                                     "messages": [user("x")]})
        assert (error.code, error.data["status"]) == (-32003, "discarded")
        error = rpc_error(client, "branch.rollback", {"session_id": sid, "branch_id": x})
        assert error.code == -32003
        # Work goes on from the restored point.
        again = client.call("branch.create", {"session_id": sid, "description": "Z",
                                              "prompt": "z"})
        assert again["context_state"]["active_branch_id"] == again["branch_id"]


def test_rollback_inside_a_branch_charges_the_branch_back(shared_daemon: DaemonProcess,
                                                          sid: str) -> None:
    with shared_daemon.client() as client:
        start_session(client, sid)
        outer = client.call("branch.create", {"session_id": sid, "description": "outer",
                                              "prompt": "outer"})
        outer_id = outer["branch_id"]
        inner = client.call("branch.create", {"session_id": sid, "description": "inner",
                                              "prompt": "inner"})["branch_id"]
        client.call("branch.return", {"branch_id": inner, "message": "inner done"})
        client.call("message.append", {"session_id": sid, "branch_id": outer_id,
                                       "messages": [assistant("next")]})
        rolled = client.call("branch.rollback", {"session_id": sid, "branch_id": inner})
        assert (rolled["thread"], rolled["branches_discarded"]) == (outer_id, [inner])
        status = client.call("branch.status", {"branch_id": outer_id})["branch"]
        assert (status["status"], status["budget_used"], status["operations_count"]) == (
            "active", outer["budget_used"], 0)
        assert rolled["tokens_recovered"] == message_tokens(
            user('Branch "inner" returned: inner done')) + message_tokens(assistant("next"))


def test_secrets_in_a_return_message_are_redacted(shared_daemon: DaemonProcess,
                                                  sid: str) -> None:
    with shared_daemon.client() as client:
        start_session(client, sid)
        branch_id = client.call("branch.create", {"session_id": sid, "description": "deploy",
                                                  "prompt": "deploy"})["branch_id"]
        secret = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
        returned = client.call("branch.return", {
            "branch_id": branch_id,
            "message": f"Deployed with token {secret} and AWS key AKIAIOSFODNN7EXAMPLE.",
            "extract_memory": True})
        assert returned["summary"]["secrets_scrubbed"] == 2
        assert returned["summary"]["summary_redacted"] is True
        assert returned["memory_queued"] is True
        text = client.call("ctxd.render", {"session_id": sid})["messages"][-1]["content"]
        assert text == ('Branch "deploy" returned: Deployed with token [REDACTED:github_token] '
                        "and AWS key [REDACTED:aws_access_key_id].")
        status = client.call("branch.status", {"branch_id": branch_id})["branch"]
        assert secret not in status["result"]
    database = apsw.Connection(str(shared_daemon.data_dir / "ctxd.db"),
                               flags=apsw.SQLITE_OPEN_READONLY)
    rows = database.execute("SELECT session_id, title, content, outcome FROM memory_candidates "
                            "WHERE branch_id = ?", (branch_id,)).fetchall()
    database.close()
    assert rows == [(sid, "deploy", "Deployed with token [REDACTED:github_token] and AWS key "
                     "[REDACTED:aws_access_key_id].", "success")]


def test_live_branch_caps(daemon_root: Path, sid: str) -> None:
    process = DaemonProcess(daemon_root, ["--max-live-branches-per-session", "2",
                                          "--max-live-branches", "3"]).start()
    try:
        with process.client() as client:
            start_session(client, sid)
            for _ in range(2):
                client.call("branch.create", {"session_id": sid, "description": "d",
                                              "prompt": "p", "parent_branch_id": None})
            error = rpc_error(client, "branch.create", {"session_id": sid, "description": "d",
                                                        "prompt": "p"})
            assert (error.code, error.data["limit"], error.data["max"]) == (
                -32005, "max_live_branches_per_session", 2)
            start_session(client, sid + "b")
            client.call("branch.create", {"session_id": sid + "b", "description": "d",
                                          "prompt": "p"})
            error = rpc_error(client, "branch.create", {"session_id": sid + "b",
                                                        "description": "d", "prompt": "p"})
            assert (error.code, error.data["limit"], error.data["max"]) == (
                -32005, "max_live_branches", 3)
            assert client.call("daemon.status")["live_branches"] == 3
    finally:
        process.stop()


def test_closing_a_session_force_returns_its_branches(shared_daemon: DaemonProcess,
                                                      sid: str) -> None:
    with shared_daemon.client() as client:
        start_session(client, sid)
        outer = client.call("branch.create", {"session_id": sid, "description": "outer",
                                              "prompt": "o"})["branch_id"]
        inner = client.call("branch.create", {"session_id": sid, "description": "inner",
                                              "prompt": "i"})["branch_id"]
        live_before = client.call("daemon.status")["live_branches"]
        closed = client.call("session.close", {"session_id": sid})
        assert closed["session"]["live_branches"] == 0
        listed = client.call("branch.list", {"session_id": sid})["branches"]
        assert [(b["branch_id"], b["status"], b["return_reason"]) for b in listed] == [
            (outer, "failed", "session_closed"), (inner, "failed", "session_closed")]
        outer_archive = client.call("message.list", {"session_id": sid, "branch_id": outer})
        assert outer_archive["messages"][-1]["content"] == (
            'Branch "inner" was stopped (the session was closed); partial result: '
            "(the branch ended before any work was recorded)")
        assert client.call("daemon.status")["live_branches"] == live_before - 2
        deleted = client.call("session.delete", {"session_id": sid})
        assert deleted["deleted"] is True
        error = rpc_error(client, "branch.status", {"branch_id": outer})
        assert error.code == -32004


def test_deleting_a_session_ends_its_live_branches(shared_daemon: DaemonProcess,
                                                   sid: str) -> None:
    with shared_daemon.client() as client:
        start_session(client, sid)
        live_before = client.call("daemon.status")["live_branches"]
        branch_id = client.call("branch.create", {"session_id": sid, "description": "d",
                                                  "prompt": "p"})["branch_id"]
        assert client.call("daemon.status")["live_branches"] == live_before + 1
        client.call("session.delete", {"session_id": sid})
        assert client.call("daemon.status")["live_branches"] == live_before
        assert rpc_error(client, "branch.status", {"branch_id": branch_id}).code == -32004


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_live_branches_survive_a_restart(daemon_root: Path, sid: str, sig: int) -> None:
    process = DaemonProcess(daemon_root).start()
    with process.client() as client:
        start_session(client, sid)
        lasting = client.call("branch.create", {"session_id": sid, "description": "lasting",
                                                "prompt": "p", "timeout_seconds": 600})
        client.call("message.append", {"session_id": sid, "branch_id": lasting["branch_id"],
                                       "messages": [assistant("progress so far")]})
        brief = client.call("branch.create", {"session_id": sid, "description": "brief",
                                              "prompt": "p", "timeout_seconds": 1,
                                              "parent_branch_id": None})
    process.stop(sig)
    time.sleep(max(0.0, brief["deadline"] - time.time()) + 0.2)
    process.start()
    try:
        with process.client() as client:
            for _ in range(100):
                if client.call("daemon.status")["live_branches"] == 1:
                    break
                time.sleep(0.05)
            assert client.call("daemon.status")["live_branches"] == 1
            expired = client.call("branch.status", {"branch_id": brief["branch_id"]})["branch"]
            assert (expired["status"], expired["result"]) == (
                "timeout", "(the branch ended before any work was recorded)")
            kept = client.call("branch.status", {"branch_id": lasting["branch_id"]})["branch"]
            assert kept["status"] == "active"
            assert kept["deadline"] == lasting["deadline"]
            assert 0 < kept["time_left_s"] <= 600 - 1
            appended = client.call("message.append", {
                "session_id": sid, "branch_id": lasting["branch_id"],
                "messages": [assistant("continued after the restart")]})
            assert appended["context_state"]["active_branch_id"] == lasting["branch_id"]
            returned = client.call("branch.return", {"branch_id": lasting["branch_id"],
                                                     "message": "finished"})
            assert returned["summary"]["operations_count"] == 2
    finally:
        process.stop()


def test_a_fold_that_spends_the_parents_budget_while_it_returns_folds_it_once(
        shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        start_session(client, sid)
        parent = client.call("branch.create", {"session_id": sid, "description": "parent",
                                               "prompt": "p", "budget": 200})
        child = client.call("branch.create", {"session_id": sid, "description": "child",
                                              "prompt": "c"})["branch_id"]
        # The parent has fewer tokens left than the child's fold message will cost.
        fill = user(hello_text(200 - parent["budget_used"] - 4 - 2))
        client.call("message.append", {"session_id": sid, "branch_id": parent["branch_id"],
                                       "messages": [fill]})
        returned = client.call("branch.return", {"branch_id": parent["branch_id"],
                                                 "message": "parent done"})
        assert [(f["branch_id"], f["reason"]) for f in returned["forced_returns"]] == [
            (child, "parent_returned")]
        main = client.call("ctxd.render", {"session_id": sid})
        assert main["messages"] == [SYSTEM, TASK, user('Branch "parent" returned: parent done')]
        listed = client.call("branch.list", {"session_id": sid})["branches"]
        assert [(b["status"], b["fold_seq"]) for b in listed] == [("completed", 9),
                                                                  ("failed", 8)]
        assert main["context_state"]["folded_tokens"] == sum(b["tokens_folded"]
                                                             for b in listed)


def test_rollback_keeps_what_grew_from_earlier_branches(shared_daemon: DaemonProcess,
                                                        sid: str) -> None:
    with shared_daemon.client() as client:
        start_session(client, sid)
        a = client.call("branch.create", {"session_id": sid, "description": "A",
                                          "prompt": "a"})["branch_id"]
        b = client.call("branch.create", {"session_id": sid, "description": "B", "prompt": "b",
                                          "parent_branch_id": None})["branch_id"]
        c = client.call("branch.create", {"session_id": sid, "description": "C", "prompt": "c",
                                          "parent_branch_id": a})["branch_id"]
        rolled = client.call("branch.rollback", {"session_id": sid, "branch_id": b})
        assert rolled["branches_discarded"] == [b]
        active = client.call("branch.list", {"session_id": sid, "status": "active"})
        assert [x["branch_id"] for x in active["branches"]] == [a, c]


def test_render_of_a_branch_past_its_deadline_shows_its_archive(shared_daemon: DaemonProcess,
                                                                sid: str) -> None:
    with shared_daemon.client() as client, shared_daemon.client() as watcher:
        start_session(client, sid)
        watcher.call("events.subscribe", {"session_id": sid, "types": ["branch.folded"]})
        created = client.call("branch.create", {"session_id": sid, "description": "brief",
                                                "prompt": "p", "timeout_seconds": 0.2})
        work = [assistant("")]
        client.call("message.append", {"session_id": sid, "branch_id": created["branch_id"],
                                       "messages": work})
        next_event(watcher)
        rendered = client.call("ctxd.render", {"session_id": sid,
                                               "branch_id": created["branch_id"]})
        assert rendered["messages"] == [SYSTEM, TASK, *opening(client, created["branch_id"]),
                                        *work]
        # The last assistant message is empty: the partial result is an extractive summary.
        status = client.call("branch.status", {"branch_id": created["branch_id"]})["branch"]
        assert (status["status"], status["result"]) == (
            "timeout", "no assistant message; last messages: [assistant] ")


def test_secrets_in_a_description_never_reach_the_context(shared_daemon: DaemonProcess,
                                                          sid: str) -> None:
    with shared_daemon.client() as client:
        start_session(client, sid)
        created = client.call("branch.create", {
            "session_id": sid, "description": "rotate AKIAIOSFODNN7EXAMPLE", "prompt": "p"})
        assert opening(client, created["branch_id"])[0]["content"].count(
            "[REDACTED:aws_access_key_id]") == 1
        client.call("branch.return", {"branch_id": created["branch_id"], "message": "done"})
        assert client.call("ctxd.render", {"session_id": sid})["messages"][-1] == user(
            'Branch "rotate [REDACTED:aws_access_key_id]" returned: done')


def test_session_list_counts_live_branches(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        start_session(client, sid)
        client.call("branch.create", {"session_id": sid, "description": "d", "prompt": "p"})
        listed = client.call("session.list", {"state": "open", "limit": 1000})["sessions"]
        [mine] = [s for s in listed if s["session_id"] == sid]
        got = client.call("session.get", {"session_id": sid})
        assert mine == got["session"]
        assert mine["live_branches"] == 1


def test_an_append_that_committed_is_acknowledged_when_the_forced_return_fails(
        daemon_root: Path, sid: str) -> None:
    process = DaemonProcess(daemon_root, ["--max-db-bytes", "1000000"]).start()

    def fill(client: Client) -> None:
        """Append to another session until not even 1,000 bytes fit."""
        for size in (20_000, 3_000, 1_000):
            codes: list[int] = []
            while not codes:
                try:
                    client.call("message.append", {"session_id": sid + "f",
                                                   "messages": [user("y" * size)]})
                except RpcError as error:
                    codes.append(error.code)
            assert codes == [-32008]

    try:
        with process.client() as client:
            start_session(client, sid)
            created = client.call("branch.create", {"session_id": sid, "description": "d",
                                                    "prompt": "p", "budget": 2000})
            branch_id = created["branch_id"]
            # A long last answer: the forced return's fold message (its partial result, cut
            # to max_fold_tokens, here a quarter of the budget) needs far more room than the
            # small append below.
            client.call("message.append", {"session_id": sid, "branch_id": branch_id,
                                           "messages": [assistant(hello_text(
                                               2000 - created["budget_used"] - 4 - 12))]})
            client.call("session.open", {"session_id": sid + "f",
                                         "budget": {"context_window": 10_000_000}})
            fill(client)
        # The cap counts the WAL, and truncating a large WAL gives its room back: a clean
        # stop leaves none, so that what is filled after the restart stays full.
        process.stop()
        process.start()
        with process.client() as client:
            fill(client)
            result = client.call("message.append", {"session_id": sid, "branch_id": branch_id,
                                                    "messages": [user(hello_text(8))]})
            # It committed: the answer says so, although the forced return (a second write)
            # did not fit; further appends are refused all the same.
            assert result["forced_returns"] == []
            assert result["context_state"]["current_branch_tokens"] == 2000
            error = rpc_error(client, "message.append", {"session_id": sid,
                                                         "branch_id": branch_id,
                                                         "messages": [user("more")]})
            assert (error.code, error.data["status"]) == (-32002, "budget_exhausted")
            assert client.call("branch.status", {"branch_id": branch_id})["branch"][
                "status"] == "active"
            # With room again, the next request that touches it force-returns it.
            client.call("session.delete", {"session_id": sid + "f"})
            status = client.call("branch.status", {"branch_id": branch_id})["branch"]
            assert (status["status"], status["budget_used"]) == ("budget_exhausted", 2000)
    finally:
        process.stop()


def test_rollback_discards_branches_folded_after_the_point(shared_daemon: DaemonProcess,
                                                           sid: str) -> None:
    with shared_daemon.client() as client:
        start_session(client, sid)
        a = client.call("branch.create", {"session_id": sid, "description": "A",
                                          "prompt": "a"})["branch_id"]
        x = client.call("branch.create", {"session_id": sid, "description": "X", "prompt": "x",
                                          "parent_branch_id": None})["branch_id"]
        client.call("branch.return", {"branch_id": a, "message": "A done"})
        rolled = client.call("branch.rollback", {"session_id": sid, "branch_id": x})
        assert rolled["branches_discarded"] == [a, x]
        listed = client.call("branch.list", {"session_id": sid})
        assert (listed["folded"], listed["context_state"]["folded_tokens"]) == (0, 0)
        assert client.call("ctxd.render", {"session_id": sid})["messages"] == [SYSTEM, TASK]


def test_deleting_a_session_force_returns_its_branches_first(shared_daemon: DaemonProcess,
                                                             sid: str) -> None:
    with shared_daemon.client() as client, shared_daemon.client() as watcher:
        start_session(client, sid)
        watcher.call("events.subscribe", {"session_id": sid})
        branch_id = client.call("branch.create", {"session_id": sid, "description": "d",
                                                  "prompt": "p"})["branch_id"]
        client.call("session.delete", {"session_id": sid})
        events = [next_event(watcher) for _ in range(4)]
        assert [e["type"] for e in events] == ["branch.created", "branch.forced_return",
                                               "branch.folded", "session.deleted"]
        assert (events[1]["data"]["branch_id"], events[1]["data"]["reason"]) == (
            branch_id, "session_deleted")


def test_a_branch_past_the_hard_block_is_refused_without_allow_over(
        shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid, "budget": {
            "context_window": 2000, "max_output_tokens": 100}})
        client.call("message.append", {"session_id": sid, "messages": [
            user(hello_text(1800))], "allow_over": True})
        error = rpc_error(client, "branch.create", {"session_id": sid, "description": "d",
                                                    "prompt": "p"})
        assert error.code == -32001
        assert error.data["suggestion"] == ("compact the context (context.compact), fold "
                                            "finished sub-tasks (branch.return), or go on in "
                                            "a new session (session.open) with a larger "
                                            "context_window")


def _cut_fold(content: str, prefix: str) -> tuple[str, int, str]:
    """A bounded fold message's head, the number of tokens its marker says were cut, and
    its tail."""
    assert content.startswith(prefix)
    head, marker, tail = re.split(r"\n(\[… \d+ tokens cut; the whole text is the result of "
                                  r"branch br_[0-9a-f]{12} …\])\n", content[len(prefix):])
    return head, int(marker.split()[1]), tail


def test_a_long_return_message_is_cut_to_max_fold_tokens(shared_daemon: DaemonProcess,
                                                          sid: str) -> None:
    """A fold takes at most a quarter of the branch's budget (here 500 of 2,000 tokens):
    the message's head and tail, the marker in between; the whole message stays the
    branch's result."""
    with shared_daemon.client() as client:
        start_session(client, sid)
        branch_id = client.call("branch.create", {"session_id": sid, "description": "long",
                                                  "prompt": "do it", "budget": 2000})["branch_id"]
        message = "START " + hello_text(3000) + " END"
        returned = client.call("branch.return", {"branch_id": branch_id, "message": message})
        assert returned["summary"]["summary_truncated"] is True
        fold = client.call("ctxd.render", {"session_id": sid})["messages"][-1]
        head, cut, tail = _cut_fold(fold["content"], 'Branch "long" returned: ')
        assert (head.split()[:2], tail.split()[-2:]) == (["START", "hello"], ["hello", "END"])
        assert COUNTER.count(head) + cut + COUNTER.count(tail) == COUNTER.count(message)
        tokens = message_tokens(fold)
        assert 450 <= tokens <= 500
        assert returned["summary"]["tokens_saved"] == returned["summary"]["tokens_folded"] - tokens
        status = client.call("branch.status", {"branch_id": branch_id})["branch"]
        assert status["result"] == message


def test_a_forced_return_cannot_flood_its_parent(shared_daemon: DaemonProcess,
                                                 sid: str) -> None:
    """The issue's case: a branch of budget 300 whose last append was 5,100 tokens folds
    into at most 75 tokens, not a 4,000-character partial result."""
    with shared_daemon.client() as client:
        start_session(client, sid)
        branch_id = client.call("branch.create", {"session_id": sid, "description": "flood",
                                                  "prompt": "do it", "budget": 300})["branch_id"]
        last = assistant("BEGIN " + hello_text(5100) + " FINISH")
        appended = client.call("message.append", {"session_id": sid, "branch_id": branch_id,
                                                  "messages": [last]})
        [forced] = appended["forced_returns"]
        assert (forced["status"], len(forced["result"])) == ("budget_exhausted", 4000)
        fold = client.call("ctxd.render", {"session_id": sid})["messages"][-1]
        head, cut, tail = _cut_fold(
            fold["content"],
            'Branch "flood" was stopped (its token budget ran out); partial result: ')
        assert (head[:11], tail[-5:]) == ("BEGIN hello", " hel…")
        assert (forced["result"][:len(head)], forced["result"][-len(tail):]) == (head, tail)
        assert COUNTER.count(head) + cut + COUNTER.count(tail) == COUNTER.count(forced["result"])
        assert message_tokens(fold) <= 75
        status = client.call("branch.status", {"branch_id": branch_id})["branch"]
        assert status["result"] == forced["result"]

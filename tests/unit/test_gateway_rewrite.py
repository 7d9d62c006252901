"""The gateway's rewrite, case by case, in-process on a real Store file, Supervisor and
token counter: identity, offload stubs, folds, compaction points (the model's and the
automatic one), injections, cache breakpoints, count_tokens, bad bodies."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import apsw
import msgspec
import pytest
import trio
from tests_support import COUNTER, ledger_line, running_supervisor

from ctxd.config import Config
from ctxd.errors import CtxdError, ErrorCode
from ctxd.gateway import GatewayRequest, _anthropic, prepare, session_of
from ctxd.gateway._blocks import bare
from ctxd.gateway._identity import conversation_key
from ctxd.gateway._ledger import LINES_KEPT, load_lines
from ctxd.gateway._rewrite import SEEN_BY_THE_GATEWAY, _ledgers, digest_of, thread_of
from ctxd.hub import EventBus
from ctxd.hygiene import cleared_input_text, cleared_text, ref_id_for, stub_text
from ctxd.memory import HashingEmbedder, Memory
from ctxd.sessions import (
    Supervisor,
    compact,
    get_session,
    inject_list,
    inject_push,
    list_messages,
    read_result,
    record_sent_usage,
    tool_list,
    tool_state,
)
from ctxd.store import Store
from ctxd.store.migrations import load_all
from ctxd.wire.types import (
    ContextCompactParams,
    InjectListParams,
    InjectPushParams,
    MemoryRecordParams,
    MessageIn,
    MessageListParams,
    ResultReadParams,
    ToolListParams,
    ToolStateParams,
    UsageRecordParams,
)

BIG = "line of output\n" * 400  # 6,000 bytes: over the 4,096 offload threshold


@pytest.fixture
async def supervisor(tmp_path: Path) -> AsyncIterator[Supervisor]:
    async with running_supervisor(tmp_path / "ctxd.db", Config()) as running:
        yield running


def anthropic(messages: list[dict[str, Any]], endpoint: str = "messages",
              **body: Any) -> GatewayRequest:
    return GatewayRequest(api="anthropic", endpoint=endpoint,  # type: ignore[arg-type]
                          session_header="s1",
                          body={"model": "claude-x", "max_tokens": 100, **body,
                                "messages": messages})


def openai(messages: list[dict[str, Any]]) -> GatewayRequest:
    return GatewayRequest(api="openai", endpoint="chat_completions", session_header="s1",
                          body={"model": "gpt-x", "messages": messages})


def sent(body: bytes) -> list[dict[str, Any]]:
    return msgspec.json.decode(body)["messages"]  # type: ignore[no-any-return]


def call(call_id: str, tool: str, **arguments: Any) -> dict[str, Any]:
    return {"role": "assistant",
            "content": [{"type": "tool_use", "id": call_id, "name": tool, "input": arguments}]}


def answer(call_id: str, content: Any, **extra: Any) -> dict[str, Any]:
    return {"role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call_id, "content": content,
                         **extra}]}


async def read_all(supervisor: Supervisor, ref_id: str) -> str:
    page = await supervisor.call("s1", lambda a: read_result(a, ResultReadParams(
        session_id="s1", ref_id=ref_id, limit=1_048_576)))
    assert page.next_offset is None
    return page.content or ""


def drain(events: Any) -> list[Any]:
    """The events published to the subscription so far."""
    got = []
    while (event := events.receive_nowait()) is not None:
        got.append(event)
    events.close()
    return got


# ---- identity -----------------------------------------------------------------------------

def test_the_session_is_the_header_then_claude_codes_id_then_the_conversation() -> None:
    body = {"metadata": {"user_id": json.dumps({"device_id": "d", "session_id": "cc-1"})},
            "system": "sys", "messages": [{"role": "user", "content": "hi"}]}
    assert session_of(GatewayRequest("anthropic", "messages", "mine", body)) == "mine"
    assert session_of(GatewayRequest("anthropic", "messages", None, body)) == "cc-1"
    plain = {"system": "sys", "messages": [{"role": "user", "content": "hi"}]}
    key = session_of(GatewayRequest("anthropic", "messages", None, plain))
    assert key == conversation_key(plain)
    assert key.startswith("gw-")
    later = {"system": "sys", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"},
        {"role": "user", "content": [{"type": "text", "text": "more",
                                      "cache_control": {"type": "ephemeral"}}]}]}
    assert conversation_key(later) == key
    assert conversation_key({**plain, "system": "other"}) != key
    odd = session_of(GatewayRequest("openai", "chat_completions", "not a valid id!", plain))
    assert odd.startswith("gw-")
    assert odd == session_of(
        GatewayRequest("openai", "chat_completions", "not a valid id!", {}))
    assert session_of(GatewayRequest("anthropic", "messages", None,
                                     {"metadata": {"user_id": "plain-user"}, **plain})) == key
    older = ("user_3f2a_account_7c1e9d2a-0b4f-4a8e-9c3d-2e1f0a9b8c7d_session_"
             "5d6e7f80-1a2b-4c3d-8e9f-0a1b2c3d4e5f")
    assert session_of(GatewayRequest("anthropic", "messages", None,
                                     {"metadata": {"user_id": older}, **plain})) == (
        "5d6e7f80-1a2b-4c3d-8e9f-0a1b2c3d4e5f")


# ---- offload, stickiness, idempotence -----------------------------------------------------

async def test_a_large_result_is_sent_as_its_stub_and_reads_back_whole(
        supervisor: Supervisor) -> None:
    thinking = {"type": "thinking", "thinking": "hm", "signature": "SIG=="}
    history = [{"role": "user", "content": "list it"},
               {"role": "assistant", "content": [
                   thinking, {"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]},
               answer("t1", BIG, cache_control={"type": "ephemeral"})]
    first = await prepare(supervisor, anthropic(history))
    ref_id = ref_id_for("s1", 3)
    stub = stub_text(len(BIG), "Bash", BIG, ref_id)
    assert sent(first.body) == [history[0], history[1],
                                answer("t1", stub, cache_control={"type": "ephemeral"})]
    assert await read_all(supervisor, ref_id) == BIG
    counts = await COUNTER.count_messages([_counted(answer("t1", BIG)),
                                           _counted(answer("t1", stub))])
    assert first.removed_tokens == counts[0] - counts[1]
    assert first.tokens == {"system_prompt": 0, "tool_descriptions": 0,
                            "conversation": sum(await COUNTER.count_messages(
                                [_counted(m) for m in sent(first.body)]))}
    # The next request: the agent moved its breakpoint; the stub's bytes stay.
    longer = [*history[:2], answer("t1", BIG), call("t2", "Bash"),
              answer("t2", "ok", cache_control={"type": "ephemeral"})]
    second = await prepare(supervisor, anthropic(longer))
    assert sent(second.body) == [history[0], history[1], answer("t1", stub), longer[3],
                                 longer[4]]
    session = (await supervisor.call("s1", get_session)).session
    assert session.message_count == 5
    assert await prepare(supervisor, anthropic(longer)) == second
    assert (await supervisor.call("s1", get_session)).session.message_count == 5


def _counted(message: dict[str, Any]) -> MessageIn:
    return MessageIn(role=message["role"], content=message["content"])


async def test_system_and_tools_are_counted_as_their_components(
        supervisor: Supervisor) -> None:
    tools = [{"name": "Bash", "description": "run a command", "input_schema": {"type": "object"}}]
    prepared = await prepare(supervisor, anthropic(
        [{"role": "user", "content": "hi"}], system="You are terse.", tools=tools))
    [system] = await COUNTER.count_messages([_system("You are terse.")])
    [tool] = await COUNTER.count_texts([msgspec.json.encode(tools[0]).decode()])
    assert (prepared.tokens["system_prompt"], prepared.tokens["tool_descriptions"]) == (
        system, tool)
    assert prepared.model == "claude-x"


def _system(text: str) -> MessageIn:
    return MessageIn(role="system", content=text)


async def test_count_tokens_rewrites_alike_and_records_nothing(supervisor: Supervisor) -> None:
    history = [{"role": "user", "content": "x"}, call("t1", "Read"), answer("t1", BIG)]
    counted = await prepare(supervisor, anthropic(history, "count_tokens"))
    assert (await supervisor.call("s1", get_session)).session.message_count == 0
    assert await ledger_line(supervisor.store, "s1", _anthropic,
                             anthropic(history).body) == (None, [])
    sent_now = await prepare(supervisor, anthropic(history))
    assert (counted.body, counted.tokens, counted.removed_tokens) == (
        sent_now.body, sent_now.tokens, sent_now.removed_tokens)


async def test_an_edited_turn_is_a_boundary(supervisor: Supervisor) -> None:
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
               {"role": "user", "content": "c"}]
    await prepare(supervisor, anthropic(history))
    events = supervisor.bus.subscribe("s1", types=["gateway.boundary"])
    edited = [*history[:2], {"role": "user", "content": "c, said otherwise"}]
    prepared = await prepare(supervisor, anthropic(edited))
    assert [(e.type, e.data) for e in drain(events)] == [
        ("gateway.boundary", {"position": 2})]
    assert sent(prepared.body) == edited
    assert (await supervisor.call("s1", get_session)).session.message_count == 4
    line, ledger = await ledger_line(supervisor.store, "s1", _anthropic,
                                     anthropic(edited).body)
    assert [row.sent for row in ledger] == edited
    # The turn before the edit keeps its line: going back to it sends it as it was.
    assert line == 1
    assert (await ledger_line(supervisor.store, "s1", _anthropic, anthropic(history).body)
            )[0] == 0


async def test_a_side_request_with_its_own_system_prompt_leaves_the_conversation_be(
        supervisor: Supervisor) -> None:
    history = [{"role": "user", "content": "x"}, call("t1", "Read"), answer("t1", BIG)]
    first = await prepare(supervisor, anthropic(history, system="the agent"))
    events = supervisor.bus.subscribe("s1", types=["gateway.boundary"])
    await prepare(supervisor, anthropic([{"role": "user", "content": "title this"}],
                                        system="write a title"))
    longer = [*history, {"role": "assistant", "content": "read"},
              {"role": "user", "content": "next"}]
    again = await prepare(supervisor, anthropic(longer, system="the agent"))
    assert drain(events) == []
    assert sent(again.body)[:3] == sent(first.body)
    assert (await supervisor.call("s1", get_session)).session.message_count == 6


def task(name: str, turns: int) -> list[list[dict[str, Any]]]:
    """A sub-agent's requests, one per turn: its task, then a large result and a word per
    turn."""
    history: list[dict[str, Any]] = [{"role": "user", "content": f"task {name}"}]
    requests = [list(history)]
    for turn in range(turns - 1):
        history += [call(f"{name}{turn}", "Read"), answer(f"{name}{turn}", f"{name}\n" + BIG),
                    {"role": "assistant", "content": f"{name} read {turn}"},
                    {"role": "user", "content": f"{name}: go on"}]
        requests.append(list(history))
    return requests


async def test_parallel_sub_agents_keep_their_lines_and_their_bytes(
        supervisor: Supervisor) -> None:
    """Conversations of one session with one system prompt (an agent's parallel
    sub-agents of one kind under one session header): each is a line of the thread, so
    none cuts another's ledger, each request sends what the one before it sent, and every
    message is recorded once."""
    agents = [task(name, 4) for name in "abc"]
    events = supervisor.bus.subscribe("s1", types=["gateway.boundary"])
    sent_by: dict[int, list[list[dict[str, Any]]]] = {0: [], 1: [], 2: []}
    for turn in range(4):
        for number, requests in enumerate(agents):
            prepared = await prepare(supervisor, anthropic(requests[turn], system="explorer"))
            sent_by[number].append(sent(prepared.body))
    for bodies in sent_by.values():
        for before, after in itertools.pairwise(bodies):
            assert after[:len(before)] == before
        assert BIG not in json.dumps(bodies[-1])
    assert (await supervisor.call("s1", get_session)).session.message_count == 3 * 13
    # The second and third agents each began a line: a boundary at their first message.
    assert [(e.type, e.data) for e in drain(events)] == [
        ("gateway.boundary", {"position": 0})] * 2
    lines = [(await ledger_line(supervisor.store, "s1", _anthropic,
                                anthropic(requests[-1], system="explorer").body))[0]
             for requests in agents]
    assert lines == [0, 1, 2]


async def test_a_thread_keeps_its_last_used_lines(supervisor: Supervisor) -> None:
    """Past `LINES_KEPT` lines a thread drops its least used one; a conversation on it
    is then new to the ledger (recorded again), the others are not."""
    firsts = [task(f"t{n}", 3) for n in range(LINES_KEPT + 1)]
    for requests in firsts[:LINES_KEPT]:
        await prepare(supervisor, anthropic(requests[1]))
    await prepare(supervisor, anthropic(firsts[0][2]))  # the first line's next turn
    await prepare(supervisor, anthropic(firsts[LINES_KEPT][1]))  # drops the second
    order = await supervisor.store.read(load_lines, "s1", thread_of(
        _anthropic, anthropic(firsts[0][1]).body, firsts[0][1]))
    assert order == [*range(2, LINES_KEPT), 0, LINES_KEPT]
    assert (await ledger_line(supervisor.store, "s1", _anthropic,
                              anthropic(firsts[1][1]).body)) == (None, [])
    recorded = (await supervisor.call("s1", get_session)).session.message_count
    await prepare(supervisor, anthropic(firsts[0][1]))
    assert (await supervisor.call("s1", get_session)).session.message_count == recorded
    await prepare(supervisor, anthropic(firsts[1][1]))
    assert (await supervisor.call("s1", get_session)).session.message_count == recorded + 5


async def test_a_ledger_from_before_lines_is_line_0_after_the_upgrade(tmp_path: Path) -> None:
    """Version 19 turns each thread's rows (by message digest) into line 0 (by node), a
    chain of nodes a thread, in every session: each conversation's next request matches
    them, records only its new messages and sends what was sent before."""
    path = tmp_path / "ctxd.db"
    conversations = {("s1", "agent"): task("a", 3), ("s1", "reviewer"): task("b", 3),
                     ("s2", "agent"): task("c", 3)}

    def request(session_id: str, system: str, messages: list[dict[str, Any]]
                ) -> GatewayRequest:
        return GatewayRequest(api="anthropic", endpoint="messages", session_header=session_id,
                              body={"model": "claude-x", "max_tokens": 100, "system": system,
                                    "messages": messages})

    firsts = {}
    async with running_supervisor(path, Config()) as supervisor:
        for (session_id, system), requests in conversations.items():
            firsts[session_id, system] = await prepare(
                supervisor, request(session_id, system, requests[1]))
    # The file as version 18 left it: one line a thread, each row by its message's digest.
    conn = apsw.Connection(str(path))
    rows = conn.execute("SELECT session_id, thread, position, sent, agent_tokens, sent_tokens, "
                        "first_seq, compaction, compaction_tokens FROM gateway_ledger "
                        "ORDER BY session_id, thread, position").fetchall()
    messages_of = {(session_id, thread_of(_anthropic, {"system": system}, [])): requests[1]
                   for (session_id, system), requests in conversations.items()}
    assert len(rows) == sum(len(requests[1]) for requests in conversations.values())
    with conn:
        conn.execute("DROP TABLE gateway_ledger; DROP TABLE gateway_lines")
        conn.execute(load_all()[14][1].SQL)
        conn.executemany(
            "INSERT INTO gateway_ledger (session_id, thread, position, digest, sent, "
            "agent_tokens, sent_tokens, first_seq, compaction, compaction_tokens) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(session_id, thread, position,
              digest_of(bare(messages_of[session_id, thread][position])), *rest)
             for session_id, thread, position, *rest in rows])
        conn.execute("PRAGMA user_version = 18")
    conn.close()
    _ledgers.clear()
    async with running_supervisor(path, Config()) as supervisor:
        for (session_id, system), requests in conversations.items():
            recorded = (await supervisor.call(session_id, get_session)).session.message_count
            later = await prepare(supervisor, request(session_id, system, requests[2]))
            assert (await supervisor.call(session_id, get_session)
                    ).session.message_count == recorded + 4
            assert sent(later.body)[:len(requests[1])] == sent(firsts[session_id, system].body)
            assert BIG not in json.dumps(sent(later.body))


async def test_the_tool_calls_whose_results_reach_the_model_are_reported_finished(
        supervisor: Supervisor) -> None:
    """An agent that reports no tool states has its calls listed all the same: completed,
    or failed for an error result, once its result is in a request; a call another
    reporter finished keeps its state, one it left running is finished; count_tokens
    reports nothing."""
    def state(call_id: str, to: str) -> ToolStateParams:
        return msgspec.convert({"session_id": "s1", "tool_call_id": call_id, "state": to,
                                "tool_name": "Bash"}, ToolStateParams)

    history: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for call_id, tool in (("t1", "Read"), ("t2", "Bash"), ("t3", "Bash"), ("t4", "Bash")):
        history += [call(call_id, tool), answer(call_id, "done", is_error=call_id == "t2")]
    await prepare(supervisor, anthropic(history[:1]))
    await supervisor.call("s1", lambda a: tool_state(a, state("t3", "failed")))
    await supervisor.call("s1", lambda a: tool_state(a, state("t4", "running")))
    events = supervisor.bus.subscribe("s1", types=["tool.state"])
    await prepare(supervisor, anthropic(history, "count_tokens"))  # reports nothing (below)
    await prepare(supervisor, anthropic(history))
    await prepare(supervisor, anthropic(history))  # a retry: nothing new to report
    listed = (await supervisor.call("s1", lambda a: tool_list(a, ToolListParams(
        session_id="s1")))).tool_calls
    assert [(c.tool_call_id, c.tool_name, c.state, [(h.state, h.detail) for h in c.history])
            for c in listed] == [
        ("t3", "Bash", "failed", [("failed", None)]),
        ("t4", "Bash", "completed", [("running", None), ("completed", SEEN_BY_THE_GATEWAY)]),
        ("t1", "Read", "completed", [("completed", SEEN_BY_THE_GATEWAY)]),
        ("t2", "Bash", "failed", [("failed", SEEN_BY_THE_GATEWAY)])]
    assert [(e.data["tool_call_id"], e.data["from"], e.data["to"]) for e in drain(events)] == [
        ("t1", None, "completed"), ("t2", None, "failed"), ("t4", "running", "completed")]


async def test_openai_tool_calls_are_reported_finished_and_one_without_an_id_is_not(
        supervisor: Supervisor) -> None:
    def called(call_id: str) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": None, "tool_calls": [
                    {"id": call_id, "type": "function",
                     "function": {"name": "grep", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": call_id, "content": "found"}]

    await prepare(supervisor, openai([{"role": "user", "content": "go"}, *called("call_1"),
                                      *called(""), {"role": "user", "content": "next"}]))
    listed = (await supervisor.call("s1", lambda a: tool_list(a, ToolListParams(
        session_id="s1")))).tool_calls
    assert [(c.tool_call_id, c.tool_name, c.state) for c in listed] == [
        ("call_1", "grep", "completed")]


async def test_a_bad_body_is_refused_naming_the_part(supervisor: Supervisor) -> None:
    with pytest.raises(CtxdError) as caught:
        await prepare(supervisor, anthropic([{"role": "user", "content": [{"text": "x"}]}]))
    assert (caught.value.code, caught.value.data["path"]) == (
        ErrorCode.INVALID_PARAMS, "$.messages[0].content[0]")


# ---- rewrite points -----------------------------------------------------------------------

FOLD = [{"role": "user", "content": "fix the bug"},
        call("b1", "mcp__ctxd__context_branch", name="explore"),
        answer("b1", "branch open"),
        {"role": "assistant", "content": [{"type": "text", "text": "reading"},
                                          {"type": "tool_use", "id": "r1", "name": "Read",
                                           "input": {"path": "a.py"}}]},
        answer("r1", "def f(): ..."),
        call("x1", "mcp__ctxd__context_return", message="the bug is in f"),
        answer("x1", "folded"),
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "thanks"}]


async def test_a_returned_branch_is_folded_out_of_every_later_request(
        supervisor: Supervisor) -> None:
    during = await prepare(supervisor, anthropic(FOLD[:5]))
    assert sent(during.body) == FOLD[:5]
    events = supervisor.bus.subscribe("s1", types=["gateway.rewrite_point"])
    after = await prepare(supervisor, anthropic(FOLD[:7]))
    [point] = drain(events)
    assert sent(after.body) == [*FOLD[:3], *FOLD[5:7]]
    removed = sum(await COUNTER.count_messages([_counted(m) for m in FOLD[3:5]]))
    assert point.data == {"kind": "fold", "first": 3, "end": 5, "messages": 2,
                          "tokens_removed": removed}
    assert after.removed_tokens == removed
    later = await prepare(supervisor, anthropic(FOLD))
    assert sent(later.body) == [*FOLD[:3], *FOLD[5:]]


async def test_a_rewind_past_the_return_brings_the_branch_back(
        supervisor: Supervisor) -> None:
    await prepare(supervisor, anthropic(FOLD))
    rewound = [*FOLD[:5], {"role": "assistant", "content": "let me look again"},
               {"role": "user", "content": "go on"}]
    prepared = await prepare(supervisor, anthropic(rewound))
    assert sent(prepared.body) == rewound


async def test_nested_branches_fold_inner_then_outer(supervisor: Supervisor) -> None:
    nested = [*FOLD[:3], call("b2", "mcp__ctxd__context_branch"), answer("b2", "open"),
              call("r2", "Read"), answer("r2", "deep"),
              call("x2", "mcp__ctxd__context_return", message="inner"), answer("x2", "ok"),
              *FOLD[3:]]
    inner = await prepare(supervisor, anthropic(nested[:9]))
    assert sent(inner.body) == [*nested[:5], *nested[7:9]]
    outer = await prepare(supervisor, anthropic(nested))
    assert sent(outer.body) == [*FOLD[:3], *FOLD[5:]]


async def test_an_error_is_sent_as_its_stub_beyond_four_thresholds_and_ctxds_answers_never(
        supervisor: Supervisor) -> None:
    inline_error = "E" * 16_384  # four times the 4,096 threshold: stays inline
    error = "Traceback (most recent call last):\n" + "  frame\n" * 2100 + "ValueError: bad"
    page = "page of a result\n" * 1000  # 17,000 bytes read back by ctxd's own tool
    history = [{"role": "user", "content": "go"},
               call("t1", "Bash"), answer("t1", inline_error, is_error=True),
               call("t2", "Bash"), answer("t2", error, is_error=True),
               call("t3", "mcp__ctxd__read_result", ref_id="res_0"), answer("t3", page)]
    prepared = await prepare(supervisor, anthropic(history))
    ref_id = ref_id_for("s1", 5)
    stub = stub_text(len(error), "Bash", error, ref_id)
    assert sent(prepared.body) == [*history[:4], answer("t2", stub, is_error=True),
                                   *history[5:]]
    assert stub.split("\n")[-2] == "ValueError: bad"
    assert await read_all(supervisor, ref_id) == error


async def test_claude_codes_saved_output_is_kept_whole_from_its_own_file_only(
        supervisor: Supervisor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Claude Code shows the model a 2 KB preview of an output it saved to a file; the
    gateway sends the stub of the whole file, when the file is Claude Code's own, of this
    session, and begins with the preview."""
    claude = tmp_path / "claude"
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(claude))
    whole = "".join(f"walrus-{i:05d} " + "x" * 40 + "\n" for i in range(2000))
    mine = claude / "projects" / "-p" / "s1" / "tool-results" / "b1.txt"
    other = claude / "projects" / "-p" / "s2" / "tool-results" / "b2.txt"
    for path in (mine, other):
        path.parent.mkdir(parents=True)
        path.write_text(whole)

    def preview(path: Path) -> str:
        return (f"<persisted-output>\nOutput too large (105.5KB). Full output saved to: "
                f"{path}\n\nPreview (first 2KB):\n{whole[:1998]}\n...\n</persisted-output>")

    history = [{"role": "user", "content": "go"},
               call("t1", "Bash"), answer("t1", preview(mine)),
               call("t2", "Bash"), answer("t2", preview(other)),
               call("t3", "Bash"), answer("t3", preview(mine).replace("walrus-00000", "x"))]
    prepared = await prepare(supervisor, anthropic(history))
    ref_id = ref_id_for("s1", 3)
    assert sent(prepared.body) == [
        *history[:2], answer("t1", stub_text(108_000, "Bash", whole, ref_id)), *history[3:]]
    assert await read_all(supervisor, ref_id) == whole


async def test_a_failed_return_folds_nothing(supervisor: Supervisor) -> None:
    failed = [*FOLD[:5], call("x1", "mcp__ctxd__context_return", message="m"),
              answer("x1", "no active branch", is_error=True)]
    prepared = await prepare(supervisor, anthropic(failed))
    assert sent(prepared.body) == failed


async def test_openai_folds_keep_each_call_answered(supervisor: Supervisor) -> None:
    def assistant(call_id: str, name: str) -> dict[str, Any]:
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": name, "arguments": "{}"}}]}

    def tool(call_id: str, text: str) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": call_id, "content": text}

    history = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"},
               assistant("b", "context_branch"), tool("b", "open"),
               assistant("r", "read"), tool("r", "text"),
               assistant("x", "context_return"), tool("x", "folded")]
    prepared = await prepare(supervisor, openai(history))
    assert sent(prepared.body) == [*history[:4], *history[6:]]


async def test_compact_context_replaces_the_history_before_it_with_ctxds_summary(
        supervisor: Supervisor) -> None:
    history = [{"role": "user", "content": "start"}]
    for n in range(6):
        history += [call(f"t{n}", "Bash"), answer(f"t{n}", f"output {n} " * 50)]
    await prepare(supervisor, anthropic(history))
    await supervisor.call("s1", lambda a: compact(a, ContextCompactParams(session_id="s1")))
    compacting = [*history, call("c1", "mcp__ctxd__compact_context"), answer("c1", "done")]
    events = supervisor.bus.subscribe("s1", types=["gateway.rewrite_point"])
    prepared = await prepare(supervisor, anthropic(compacting))
    [point] = drain(events)
    summary, *rest = sent(prepared.body)
    assert rest == compacting[-2:]
    text = summary["content"]
    assert summary["role"] == "user"
    assert text.startswith(f"[ctxd compacted the {len(history)} messages before this point")
    assert (point.data["kind"], point.data["first"], point.data["end"]) == (
        "compaction", 0, len(history))
    more = [*compacting, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "next"}]
    again = await prepare(supervisor, anthropic(more))
    assert sent(again.body) == [summary, *more[len(history):]]


async def test_past_the_trigger_old_results_are_cleared_at_least_clear_at_least(
        tmp_path: Path) -> None:
    config = msgspec.convert({"budget": {"context_window": 12_000, "max_output_tokens": 1_000},
                              "hygiene": {"clear_at_least": 2_000}}, Config)
    async with running_supervisor(tmp_path / "ctxd.db", config) as supervisor:
        results = [f"result {n}: " + "word " * 600 for n in range(20)]
        history: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        for n, text in enumerate(results):
            history += [call(f"t{n}", "Bash"), answer(f"t{n}", text)]
        prepared = await prepare(supervisor, anthropic(history))
        messages = sent(prepared.body)
        cleared = [n for n in range(20) if messages[2 + 2 * n] != history[2 + 2 * n]]
        assert cleared == list(range(len(cleared)))
        assert prepared.removed_tokens >= 2_000
        assert sum(prepared.tokens.values()) <= 0.6 * 11_000
        for n in cleared:
            ref_id = ref_id_for("s1", 3 + 2 * n)
            assert messages[2 + 2 * n] == answer(f"t{n}", cleared_text(ref_id))
            assert await read_all(supervisor, ref_id) == results[n]
        assert messages[-6:] == history[-6:]
        again = await prepare(supervisor, anthropic([*history, call("u", "Bash"),
                                                     answer("u", "small")]))
        assert sent(again.body)[:len(messages)] == messages


async def test_the_trigger_acts_on_the_providers_count_of_the_model(tmp_path: Path) -> None:
    config = msgspec.convert({"budget": {"context_window": 12_000, "max_output_tokens": 1_000},
                              "hygiene": {"clear_at_least": 2_000}}, Config)
    async with running_supervisor(tmp_path / "ctxd.db", config) as supervisor:
        history: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        for n in range(9):
            history += [call(f"t{n}", "Bash"), answer(f"t{n}", f"result {n}: " + "word " * 600)]
        first = await prepare(supervisor, anthropic(history))
        # About 5,800 of 11,000 tokens by ctxd's count: under the trigger (0.95), past it
        # at twice the count.
        assert 0.95 * 11_000 / 2 < sum(first.tokens.values()) < 0.95 * 11_000
        assert sent(first.body) == history

        def calls(session_id: str, model: str, reported: int, counted: int, key: str) -> Any:
            return supervisor.call(session_id, lambda a: record_sent_usage(a, UsageRecordParams(
                session_id=session_id, model=model, input_tokens=reported // 10,
                cache_read_tokens=reported - reported // 10, idempotency_key=key), counted))

        # Another model's calls say nothing of this one's.
        await calls("s1", "gpt-x", 9_000, 1_000, "r0")
        history += [call("u1", "Bash"), answer("u1", "small")]
        assert sent((await prepare(supervisor, anthropic(history))).body) == history
        # Its provider counts 2.5 tokens for each of ctxd's (bounded at 2): the same
        # conversation is past the trigger, and the old results are cleared in one step.
        await calls("s1", "claude-x", 2_500, 1_000, "r1")
        history += [call("u2", "Bash"), answer("u2", "small")]
        calibrated = await prepare(supervisor, anthropic(history))
        cleared = [n for n in range(9)
                   if sent(calibrated.body)[2 + 2 * n] != history[2 + 2 * n]]
        assert cleared == list(range(len(cleared)))
        assert cleared
        assert calibrated.removed_tokens >= 2_000
        assert (sum(calibrated.tokens.values()) * 2 <= 0.6 * 11_000
                < (sum(calibrated.tokens.values()) + 700) * 2)


# ---- injections and breakpoints -----------------------------------------------------------

async def test_an_injection_enters_the_last_user_message_once(supervisor: Supervisor) -> None:
    history = [{"role": "user", "content": "hello"}]
    await prepare(supervisor, anthropic(history))
    await supervisor.call("s1", lambda a: inject_push(a, InjectPushParams(
        session_id="s1", content="the build is red", source="ci")))
    turn = [*history, {"role": "assistant", "content": "hi"},
            {"role": "user", "content": [{"type": "text", "text": "and now?",
                                          "cache_control": {"type": "ephemeral"}}]}]
    counted = await prepare(supervisor, anthropic(turn, "count_tokens"))
    first = await prepare(supervisor, anthropic(turn))
    note = {"type": "text", "text": "[ctxd injection from ci] the build is red"}
    expected = [*turn[:2], {"role": "user", "content": [*turn[2]["content"], note]}]
    assert sent(first.body) == sent(counted.body) == expected
    queue = await supervisor.call("s1", lambda a: inject_list(a, InjectListParams(
        session_id="s1")))
    assert [i.state for i in queue.injections] == ["accepted"]
    later = [*turn[:2], {"role": "user", "content": [{"type": "text", "text": "and now?"}]},
             {"role": "assistant", "content": "red"}, {"role": "user", "content": "fix"}]
    again = await prepare(supervisor, anthropic(later))
    assert sent(again.body) == [*turn[:2], {"role": "user", "content": [
        {"type": "text", "text": "and now?"}, note]}, *later[3:]]


async def test_a_breakpoint_inside_an_offloaded_result_moves_to_its_block(
        supervisor: Supervisor) -> None:
    mark = {"type": "ephemeral"}
    history = [{"role": "user", "content": "x"}, call("t1", "Read"),
               answer("t1", [{"type": "text", "text": BIG, "cache_control": mark}])]
    prepared = await prepare(supervisor, anthropic(history))
    [block] = sent(prepared.body)[2]["content"]
    assert block["cache_control"] == mark
    assert block["content"].startswith("[Tool result")


async def test_a_conversation_starts_with_the_memories_that_fit_it_once(
        tmp_path: Path) -> None:
    config = Config()
    store = Store(tmp_path / "ctxd.db")
    store.open()
    try:
        async with trio.open_nursery() as nursery:
            bus = EventBus()
            memory = await nursery.start(Memory(store, HashingEmbedder(), tmp_path / "m.faiss",
                                                config.memory, bus, COUNTER).run)
            supervisor = await nursery.start(
                Supervisor(store, COUNTER, bus, config, memory).run)
            await memory.record(MemoryRecordParams(
                title="migrations", content="bump user_version when the schema changes"))
            history = [{"role": "user", "content": "add a column to the schema migrations"}]
            first = await prepare(supervisor, anthropic(history))
            [message] = sent(first.body)
            note = message["content"][-1]["text"]
            assert message["content"][0] == {"type": "text", "text": history[0]["content"]}
            assert note == ("Memories from earlier work that may help with this task:\n"
                            "- migrations (confidence 0.80): bump user_version when the "
                            "schema changes\n")
            longer = [*history, {"role": "assistant", "content": "done"},
                      {"role": "user", "content": "schema migrations again"}]
            again = await prepare(supervisor, anthropic(longer))
            assert sent(again.body) == [message, *longer[1:]]
            # Memories are found by the user's words, not by what the agent reminds the
            # model of in the same message (its CLAUDE.md names the schema migrations).
            reminded = [{"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>\nCLAUDE.md: schema migrations "
                                         "bump user_version.\n</system-reminder>"},
                {"type": "text", "text": "What is the weather in Paris?"}]}]
            other = await prepare(supervisor, GatewayRequest(
                api="anthropic", endpoint="messages", session_header="s2",
                body={"model": "claude-x", "max_tokens": 100, "messages": reminded}))
            assert sent(other.body) == reminded
            nursery.cancel_scope.cancel()
    finally:
        store.close()


COMPACT_TOOL = {"name": "mcp__ctxd__compact_context", "description": "compact the context",
                "input_schema": {"type": "object"}}


async def test_the_context_note_comes_once_per_threshold_crossed(tmp_path: Path) -> None:
    """To a model that has ctxd's compact_context tool; one without it gets no note (the
    gateway compacts by itself at compact_trigger)."""
    config = msgspec.convert({"budget": {"context_window": 4_000, "max_output_tokens": 1_000}},
                             Config)
    async with running_supervisor(tmp_path / "ctxd.db", config) as supervisor:
        history: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
        notes, without_tool = [], []
        for turn in range(12):
            history += [{"role": "assistant", "content": "word " * 200},
                        {"role": "user", "content": [{"type": "text", "text": f"go {turn}"}]}]
            prepared = await prepare(supervisor, anthropic(history, tools=[COMPACT_TOOL]))
            last = sent(prepared.body)[-1]["content"]
            usage = sum(prepared.tokens.values()) / 3_000
            notes.append((round(usage, 2), last[1]["text"] if len(last) > 1 else None))
            plain = await prepare(supervisor, GatewayRequest(
                api="anthropic", endpoint="messages", session_header="s2",
                body={"model": "claude-x", "max_tokens": 100, "messages": history}))
            without_tool.append(len(sent(plain.body)[-1]["content"]))
        assert without_tool == [1] * 12
        noted = [(usage, note) for usage, note in notes if note is not None]
        assert len(noted) == 2, notes
        (warned, _), (cautioned, _) = noted
        assert 0.70 <= warned < 0.80 <= cautioned < 0.95, notes
        for usage, note in noted:
            percent = int(note.removeprefix("[Context: ").split("%")[0])
            assert abs(percent - usage * 100) <= 1, (percent, usage)
            assert note == (f"[Context: {percent}% used. Call compact_context to free space "
                            "before large operations.]")
        # Sticky: the later requests carry each note where it was first sent.
        final = sent(prepared.body)
        assert sum(len(m["content"]) > 1 for m in final if isinstance(m["content"], list)) == 2


async def test_no_context_note_when_deferral_leaves_compact_context_out(tmp_path: Path) -> None:
    """What decides is the tools the model is sent: a compact_context the session defers
    (the request offers tool_search, and its tools are past the deferral threshold) is not
    sent, and neither is the note that would ask for it."""
    config = msgspec.convert({"budget": {"context_window": 4_000, "max_output_tokens": 1_000}},
                             Config)
    search = {"name": "mcp__ctxd__tool_search", "description": "find a deferred tool",
              "input_schema": {"type": "object"}}
    big = {**COMPACT_TOOL, "description": "compact the context " * 300}
    async with running_supervisor(tmp_path / "ctxd.db", config) as supervisor:
        history: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
        for turn in range(12):
            history += [{"role": "assistant", "content": "word " * 200},
                        {"role": "user", "content": [{"type": "text", "text": f"go {turn}"}]}]
            prepared = await prepare(supervisor, anthropic(history, tools=[search, big]))
            body = msgspec.json.decode(prepared.body)
            assert [tool["name"] for tool in body["tools"]] == ["mcp__ctxd__tool_search"]
            assert len(body["messages"][-1]["content"]) == 1, turn


async def test_a_request_that_ends_with_a_system_message_carries_notes_in_its_user_message(
        supervisor: Supervisor) -> None:
    # Claude Code's first request: the prompt, then its environment as a marked system
    # message.
    await prepare(supervisor, anthropic([{"role": "user", "content": "hello"}]))
    await supervisor.call("s1", lambda a: inject_push(a, InjectPushParams(
        session_id="s1", content="the build is red")))
    system = {"role": "system", "content": [{"type": "text", "text": "cwd: /src",
                                             "cache_control": {"type": "ephemeral"}}]}
    turn = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "what now?"}, system]
    prepared = await prepare(supervisor, anthropic(turn))
    note = {"type": "text", "text": "[ctxd injection] the build is red"}
    assert sent(prepared.body) == [*turn[:2], {"role": "user", "content": [
        {"type": "text", "text": "what now?"}, note]}, system]


# ---- cost: offloaded arguments, the automatic compaction point ---------------------------

async def test_a_calls_long_arguments_go_out_as_markers_from_their_first_request(
        supervisor: Supervisor) -> None:
    body = "def main():\n    return 42\n" * 60  # 1,560 bytes: a Write worth offloading
    written = {"role": "assistant", "content": [
        {"type": "text", "text": "Writing it."},
        {"type": "tool_use", "id": "w1", "name": "Write",
         "input": {"file_path": "/p/main.py", "content": body}}]}
    history = [{"role": "user", "content": "write main.py"}, written,
               answer("w1", "File created successfully at: /p/main.py")]
    prepared = await prepare(supervisor, anthropic(history))
    ref_id = ref_id_for("s1", 2)
    marker = cleared_input_text(ref_id, 0, len(body))
    [_, shown, _] = sent(prepared.body)
    assert shown == {"role": "assistant", "content": [
        {"type": "text", "text": "Writing it."},
        {"type": "tool_use", "id": "w1", "name": "Write",
         "input": {"file_path": "/p/main.py", "content": marker}}]}
    assert await read_all(supervisor, ref_id) == body
    # ctxd's own copy holds what was sent; the next request sends the same bytes.
    [_, copy, _] = (await supervisor.call("s1", lambda a: list_messages(a, MessageListParams(
        session_id="s1")))).messages
    assert copy.content[1]["input"] == {"file_path": "/p/main.py", "content": marker}
    later = await prepare(supervisor, anthropic([*history, call("r1", "Bash", command="ls"),
                                                 answer("r1", "main.py")]))
    assert sent(later.body)[:3] == sent(prepared.body)


async def test_only_a_file_writing_calls_arguments_go_out_as_markers(
        supervisor: Supervisor) -> None:
    """A plan or a sub-agent's task is not on disk: it stays whole (until compaction)."""
    plan = "1. Read the parser.\n2. Fix the dates.\n" * 60
    history = [{"role": "user", "content": "plan it"},
               call("p1", "ExitPlanMode", plan=plan), answer("p1", "approved")]
    assert sent((await prepare(supervisor, anthropic(history))).body) == history


async def test_openai_a_write_calls_arguments_go_out_as_markers_the_others_as_sent(
        supervisor: Supervisor) -> None:
    body = "x = 1\n" * 300
    other = '{"command":  "ls -la",  "n": 1.0e3}'  # spelled as the agent spelled it
    history = [{"role": "user", "content": "write it"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function", "function": {
                       "name": "write", "arguments": json.dumps(
                           {"filePath": "/p/a.py", "content": body})}},
                   {"id": "c2", "type": "function", "function": {
                       "name": "bash", "arguments": other}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "written"},
               {"role": "tool", "tool_call_id": "c2", "content": "a.py"}]
    prepared = await prepare(supervisor, openai(history))
    calls = sent(prepared.body)[1]["tool_calls"]
    ref_id = ref_id_for("s1", 2)
    assert json.loads(calls[0]["function"]["arguments"]) == {
        "filePath": "/p/a.py", "content": cleared_input_text(ref_id, 0, len(body))}
    assert calls[1] == history[1]["tool_calls"][1]
    assert await read_all(supervisor, ref_id) == body


async def test_with_scrub_at_rest_the_markers_count_the_scrubbed_arguments(
        tmp_path: Path) -> None:
    token = "ghp_" + "a1B2c3D4e5" * 3 + "f6G7h8"
    body = f"TOKEN = '{token}'\n" + "print('hello')\n" * 100
    config = msgspec.convert({"scrub_at_rest": True}, Config)
    async with running_supervisor(tmp_path / "ctxd.db", config) as supervisor:
        history = [{"role": "user", "content": "write it"},
                   call("w1", "Write", file_path="/p/a.py", content=body),
                   answer("w1", "done")]
        prepared = await prepare(supervisor, anthropic(history))
        stored = body.replace(token, "[REDACTED:github_token]")
        ref_id = ref_id_for("s1", 2)
        assert sent(prepared.body)[1]["content"][0]["input"]["content"] == (
            cleared_input_text(ref_id, 0, len(stored)))
        assert await read_all(supervisor, ref_id) == stored


async def test_offload_inputs_off_sends_the_arguments_as_they_are(tmp_path: Path) -> None:
    config = msgspec.convert({"hygiene": {"offload_inputs": False}}, Config)
    async with running_supervisor(tmp_path / "ctxd.db", config) as supervisor:
        history = [{"role": "user", "content": "write"},
                   call("w1", "Write", file_path="/p/a.py", content="x = 1\n" * 400),
                   answer("w1", "done")]
        assert sent((await prepare(supervisor, anthropic(history))).body) == history


async def test_past_the_trigger_with_nothing_to_clear_the_history_becomes_its_summary(
        tmp_path: Path) -> None:
    """No old result to clear (the requests' text is the user's and the model's): the
    messages before the first new one become their extractive summary, once; the
    following requests send the same bytes, and the originals stay in message.list."""
    config = msgspec.convert({"budget": {"context_window": 6_000, "max_output_tokens": 1_000},
                              "hygiene": {"context_note": ""}}, Config)
    async with running_supervisor(tmp_path / "ctxd.db", config) as supervisor:
        history: list[dict[str, Any]] = []
        for n in range(12):
            history += [{"role": "user", "content": f"Request {n}: always keep /p/f{n}.py. "
                                                    + "detail " * 150},
                        {"role": "assistant", "content": f"Done {n}. " + "note " * 150}]
        history.append({"role": "user", "content": "Request 12: and now the tests."})
        first = await prepare(supervisor, anthropic(history))
        assert sent(first.body) == history  # under the trigger (0.95 of 5,000)
        events = supervisor.bus.subscribe("s1", types=["gateway.rewrite_point"])
        grown = [*history, {"role": "assistant", "content": "Running them. " + "log " * 1000},
                 {"role": "user", "content": "Request 13: commit."}]
        compacted = await prepare(supervisor, anthropic(grown))
        [point] = drain(events)
        summary, *rest = sent(compacted.body)
        assert rest == grown[len(history):]
        assert summary["role"] == "user"
        assert summary["content"].startswith(f"[Summary of {len(history)} earlier messages]")
        for fact in ("Request 0: always keep /p/f0.py.", "Request 12: and now the tests."):
            assert fact in summary["content"]
        assert (point.data["kind"], point.data["first"], point.data["end"]) == (
            "compaction", 0, len(history))
        assert sum(compacted.tokens.values()) < 0.95 * 5_000
        again = await prepare(supervisor, anthropic(
            [*grown, {"role": "assistant", "content": "Committed."},
             {"role": "user", "content": "thanks"}]))
        assert sent(again.body)[:len(rest) + 1] == sent(compacted.body)
        stored = (await supervisor.call("s1", lambda a: list_messages(a, MessageListParams(
            session_id="s1", limit=1000)))).messages
        assert [m.content if isinstance(m.content, str) else "".join(
            part["text"] for part in m.content) for m in stored[:len(history)]] == [
            m["content"] for m in history]


@pytest.mark.parametrize(("why", "old", "new"), [
    ("worth it", 4_000, 800), ("auto_compact off", 4_000, 800), ("not worth it", 300, 4_500)])
async def test_an_automatic_compaction_point_halves_the_request_or_is_not_placed(
        tmp_path: Path, why: str, old: int, new: int) -> None:
    """Past the trigger with nothing to clear: the history is summarised when that at
    least halves the request; not when the new messages are most of it (the summary would
    rewrite the cached prefix for little), nor with auto_compact off."""
    hygiene = {"context_note": "", "auto_compact": why != "auto_compact off"}
    config = msgspec.convert({"budget": {"context_window": 6_000, "max_output_tokens": 1_000},
                              "hygiene": hygiene}, Config)
    async with running_supervisor(tmp_path / "ctxd.db", config) as supervisor:
        history: list[dict[str, Any]] = [
            {"role": "user", "content": "Request: go. " + "detail " * old},
            {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
        assert sent((await prepare(supervisor, anthropic(history))).body) == history
        grown = [*history, {"role": "assistant", "content": "log " * new},
                 {"role": "user", "content": "next"}]
        shown = sent((await prepare(supervisor, anthropic(grown))).body)
        if why == "worth it":
            assert shown[0]["content"].startswith("[Summary of 3 earlier messages]")
            assert shown[1:] == grown[3:]
        else:
            assert shown == grown

"""The ledgers the rewrite keeps in memory (`_Ledgers`) change nothing that is sent: the
same requests give the same bodies, counts and SQLite ledger whether each thread's rows
and last request are kept, read again after a restart, or read again after an eviction;
a message that would encode to other bytes is digested again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
from tests_support import ledger_line, running_supervisor

from ctxd.config import Config
from ctxd.gateway import GatewayRequest, _anthropic, prepare
from ctxd.gateway._ledger import LedgerRow, chained, load_line, load_nodes
from ctxd.gateway._rewrite import LEDGERS_KEPT, _ledgers, digest_of, thread_of
from ctxd.sessions import Supervisor, session_delete
from ctxd.wire.types import SessionIdParams

BIG = "line of output\n" * 400  # over the 4,096-byte offload threshold
SYSTEM = "You are a coding agent."

TASK = {"role": "user", "content": "list the files"}
CALL = {"role": "assistant", "content": [
    {"type": "thinking", "thinking": "ls", "signature": "SIG=="},
    {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]}
RESULT = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                       "content": BIG}]}
SAID = {"role": "assistant", "content": "There are many files."}
NEXT = {"role": "user", "content": [{"type": "text", "text": "count them",
                                     "cache_control": {"type": "ephemeral"}}]}
EDITED = {"role": "user", "content": "sort them instead"}

Step = tuple[str, bytes]


def db(tmp_path: Path, name: str) -> Path:
    """A database file in a folder of its own (each a daemon's data directory)."""
    (tmp_path / name).mkdir()
    return tmp_path / name / "ctxd.db"


def raw(messages: list[dict[str, Any]] | bytes) -> bytes:
    """A request body as an agent's JSON library writes it (spaces after separators)."""
    listed = messages if isinstance(messages, bytes) else json.dumps(messages).encode()
    return (b'{"model": "claude-x", "max_tokens": 100, "system": ' + json.dumps(SYSTEM).encode()
            + b', "messages": ' + listed + b"}")


STEPS: list[Step] = [
    ("messages", raw([TASK])),
    ("messages", raw([TASK, CALL, RESULT])),
    ("count_tokens", raw([TASK, CALL, RESULT, SAID, NEXT])),
    ("messages", raw([TASK, CALL, RESULT, SAID, NEXT])),
    ("messages", raw([TASK, CALL, RESULT, SAID, NEXT])),  # a retry: the same bytes
    ("messages", raw([TASK, CALL, RESULT, SAID, EDITED])),  # the user edited the last one
    # The first message's keys in another order: equal once decoded, other bytes, another
    # digest (a divergence at position 0, as without the kept ledger).
    ("messages", raw(b'[{"content": "list the files", "role": "user"}, '
                     + json.dumps([CALL, RESULT, SAID, EDITED]).encode()[1:])),
]


def request(step: Step) -> GatewayRequest:
    endpoint, body = step
    return GatewayRequest(api="anthropic", endpoint=endpoint,  # type: ignore[arg-type]
                          session_header="s1", body=msgspec.json.decode(body), raw=body)


def outcome(prepared: Any) -> tuple[bytes, dict[str, int], int]:
    return prepared.body, prepared.tokens, prepared.removed_tokens


def thread(step: Step) -> bytes:
    body = msgspec.json.decode(step[1])
    return thread_of(_anthropic, body, [_anthropic.bare(m) for m in body["messages"]])


async def ledger_of(supervisor: Supervisor, step: Step) -> tuple[int | None, list[LedgerRow]]:
    return await ledger_line(supervisor.services.store, "s1", _anthropic,
                             msgspec.json.decode(step[1]))


async def kept(path: Path, steps: list[Step], config: Config | None = None
               ) -> tuple[list[Any], list[LedgerRow]]:
    """The steps through one supervisor, the ledgers kept in memory between them."""
    _ledgers.clear()
    async with running_supervisor(path, config or Config()) as supervisor:
        results = [outcome(await prepare(supervisor, request(step)))
                   for step in steps]
        key = ("s1", thread(steps[-1]))
        assert key in _ledgers._kept
        line, rows = await ledger_of(supervisor, steps[-1])
        assert line is not None
        assert _ledgers._kept[key].lines[line] == rows  # the kept rows are the committed ones
        return results, rows


async def restarted(path: Path, steps: list[Step], config: Config | None = None
                    ) -> tuple[list[Any], list[LedgerRow]]:
    """Each step by a supervisor of its own on the same file, nothing kept in memory (a
    daemon restarted before every request)."""
    results = []
    for step in steps:
        _ledgers.clear()
        async with running_supervisor(path, config or Config()) as supervisor:
            results.append(outcome(await prepare(supervisor, request(step))))
    _ledgers.clear()
    async with running_supervisor(path, config or Config()) as supervisor:
        return results, (await ledger_of(supervisor, steps[-1]))[1]


async def test_kept_ledgers_send_what_a_restarted_daemon_sends(tmp_path: Path) -> None:
    results, rows = await kept(db(tmp_path, "kept"), STEPS)
    assert (results, rows) == await restarted(db(tmp_path, "restarted"), STEPS)
    # What the steps do, so that the comparisons compare something: the result went as
    # its stub, the retry sent the same bytes, the edit and the reordered keys diverged.
    assert BIG not in results[3][0].decode()
    assert results[4] == results[3]
    assert results[5][0] != results[4][0]
    body = msgspec.json.decode(STEPS[-1][1])
    nodes, parent = [], thread(STEPS[-1])
    for message in body["messages"]:
        parent = chained(parent, digest_of(_anthropic.bare(message)))
        nodes.append(parent)
    assert [row.node for row in rows] == nodes


AGAIN = {"role": "user", "content": "and again"}
BIG_TOO = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2",
                                        "content": BIG.upper()}]}
CALL_TOO = {"role": "assistant", "content": [
    {"type": "tool_use", "id": "t2", "name": "Bash", "input": {"command": "ls -R"}}]}
LINE_STEPS: list[Step] = [
    ("messages", raw([TASK, CALL, RESULT, SAID, NEXT])),
    ("messages", raw([TASK, CALL, RESULT, SAID, EDITED])),  # a second line
    ("messages", raw([TASK, CALL, RESULT, SAID, NEXT, CALL_TOO, BIG_TOO])),  # the first
    ("messages", raw([TASK, CALL, RESULT, SAID, EDITED, CALL_TOO, BIG_TOO])),  # the second
    ("messages", raw([TASK, CALL, RESULT, SAID, NEXT, CALL_TOO, BIG_TOO, SAID, AGAIN])),
]


async def test_kept_lines_send_what_a_restarted_daemon_finds_in_sqlite(
        tmp_path: Path) -> None:
    """Two lines of one thread, taken in turn: kept in memory, or found by their nodes
    in SQLite after a restart, each request sends the same bytes."""
    results, rows = await kept(db(tmp_path, "kept"), LINE_STEPS)
    assert (results, rows) == await restarted(db(tmp_path, "restarted"), LINE_STEPS)
    # Each line's next request begins with the bytes of its last one; the two offloaded
    # the same second result each under a ref of its own.
    sent = [msgspec.json.decode(body)["messages"] for body, _, _ in results]
    assert sent[2][:5] == sent[0]
    assert sent[4][:7] == sent[2]
    assert sent[3][:5] == sent[1]
    assert sent[2][6] != sent[3][6]
    assert BIG.upper() not in json.dumps(sent)


CLEARING = msgspec.convert({"budget": {"context_window": 12_000, "max_output_tokens": 1_000},
                           "hygiene": {"clear_at_least": 2_000}}, Config)


def calls_and_results(prefix: str, count: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for n in range(count):
        messages += [{"role": "assistant", "content": [
                         {"type": "tool_use", "id": f"{prefix}{n}", "name": "Bash", "input": {}}]},
                     {"role": "user", "content": [
                         {"type": "tool_result", "tool_use_id": f"{prefix}{n}",
                          "content": f"{prefix} {n}: " + "word " * 600}]}]
    return messages


async def test_two_lines_that_hold_a_prefix_send_the_last_used_ones_bytes_kept_or_not(
        tmp_path: Path) -> None:
    """Two lines hold a request's first messages with other bytes (the second cleared an
    old result when it passed the trigger): the request is sent as the line used last
    has them, whether only the other line's rows are kept in memory or none are."""
    base = [{"role": "user", "content": "go"}, *calls_and_results("t", 9)]
    first = [*base, SAID, {"role": "user", "content": "q1"}]
    edited = [*base, SAID, {"role": "user", "content": "q1 edited"}]
    longer = [*edited, *calls_and_results("v", 8)]
    elsewhere = [*base[:3], {"role": "assistant", "content": "another way"},
                 {"role": "user", "content": "try it"}]
    steps: list[Step] = [("messages", raw(messages)) for messages in (first, edited, longer)]
    path = db(tmp_path, "partly")
    async with running_supervisor(path, CLEARING) as supervisor:
        for step in steps:
            await prepare(supervisor, request(step))
    copy = db(tmp_path, "none")
    copy.write_bytes(path.read_bytes())
    _ledgers.clear()
    async with running_supervisor(path, CLEARING) as supervisor:
        await prepare(supervisor, request(("messages", raw(first))))  # keeps the first's rows
        partly = outcome(await prepare(supervisor, request(("messages", raw(elsewhere)))))
    _ledgers.clear()
    async with running_supervisor(copy, CLEARING) as supervisor:
        none = outcome(await prepare(supervisor, request(("messages", raw(elsewhere)))))
    assert partly == none
    assert "tool result content cleared" in json.dumps(
        msgspec.json.decode(partly[0])["messages"][2])


async def test_a_line_extended_turn_by_turn_reads_no_ledger_row(tmp_path: Path) -> None:
    """The common path: a conversation extended turn by turn is matched against the
    lines kept in memory; after a restart, the thread's nodes and the matched line's rows
    are read once."""
    read: list[str] = []
    conversation = [TASK, CALL, RESULT, SAID, NEXT, CALL_TOO, BIG_TOO, SAID, AGAIN]
    steps: list[Step] = [("messages", raw(conversation[:end])) for end in (1, 3, 5, 7, 9)]
    _ledgers.clear()
    for restart_after in (None, 2):
        async with running_supervisor(db(tmp_path, f"reads-{restart_after}"), Config()
                                      ) as supervisor:
            store = supervisor.services.store
            plain_read = store.read

            async def counted(fn: Any, *args: Any, plain_read: Any = plain_read) -> Any:
                if fn in (load_nodes, load_line):
                    read.append(fn.__name__)
                return await plain_read(fn, *args)

            store.read = counted  # type: ignore[method-assign]
            for number, step in enumerate(steps):
                if number == restart_after:
                    _ledgers.clear()
                    read.append("restart")
                await prepare(supervisor, request(step))
    # A new thread's nodes are read once (none yet), then nothing until the restart.
    assert read == ["load_nodes", "load_nodes", "restart", "load_nodes", "load_line"]


async def test_an_evicted_thread_reads_its_rows_again(tmp_path: Path) -> None:
    _ledgers.clear()
    async with running_supervisor(db(tmp_path, "evicted"), Config()) as supervisor:
        first = [outcome(await prepare(supervisor, request(step)))
                 for step in STEPS[:2]]
        for number in range(LEDGERS_KEPT):
            await prepare(supervisor, GatewayRequest(
                api="anthropic", endpoint="messages", session_header=f"other-{number}",
                body={"model": "claude-x", "max_tokens": 10,
                      "messages": [{"role": "user", "content": f"hello {number}"}]}))
        assert ("s1", thread(STEPS[0])) not in _ledgers._kept
        rest = [outcome(await prepare(supervisor, request(step)))
                for step in STEPS[2:]]
        _, rows = await ledger_of(supervisor, STEPS[-1])
    assert len(_ledgers._kept) == LEDGERS_KEPT
    assert (first + rest, rows) == await kept(db(tmp_path, "kept"), STEPS)


async def test_a_session_deleted_and_opened_again_does_not_use_its_old_rows(
        tmp_path: Path) -> None:
    _ledgers.clear()
    async with running_supervisor(db(tmp_path, "deleted"), Config()) as supervisor:
        await prepare(supervisor, request(STEPS[1]))
        await supervisor.call("s1", lambda actor: session_delete(
            actor, SessionIdParams(session_id="s1")))
        again = outcome(await prepare(supervisor, request(STEPS[3])))
        _, rows = await ledger_of(supervisor, STEPS[3])
    _ledgers.clear()
    async with running_supervisor(db(tmp_path, "fresh"), Config()) as supervisor:
        assert again == outcome(await prepare(supervisor, request(STEPS[3])))
        assert rows == (await ledger_of(supervisor, STEPS[3]))[1]
    assert [row.first_seq for row in rows] == [1, 2, 3, 4, 5]


async def test_clearing_decided_by_count_tokens_leaves_the_kept_rows_as_committed(
        tmp_path: Path) -> None:
    config = msgspec.convert({"budget": {"context_window": 12_000, "max_output_tokens": 1_000},
                              "hygiene": {"clear_at_least": 2_000}}, Config)
    history: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for n in range(20):
        history += [{"role": "assistant", "content": [
                        {"type": "tool_use", "id": f"t{n}", "name": "Bash", "input": {}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": f"t{n}",
                         "content": f"result {n}: " + "word " * 600}]}]
    short = history[:13]  # six results: under the trigger
    steps: list[Step] = [
        ("messages", raw(short)),
        ("count_tokens", raw(history)),  # past the trigger: the oldest results cleared
        ("messages", raw([*short, {"role": "assistant", "content": "ok"},
                          {"role": "user", "content": "next"}])),
    ]
    results, rows = await kept(db(tmp_path, "kept"), steps, config=config)
    assert (results, rows) == await restarted(db(tmp_path, "restarted"), steps, config)
    # The count_tokens request was cleared, the next one was not.
    assert "tool result content cleared" in results[1][0].decode()
    assert "tool result content cleared" not in results[2][0].decode()


async def test_values_equal_in_python_but_not_in_json_are_digested_again(
        tmp_path: Path) -> None:
    """``1 == 1.0 == True`` and ``0.0 == -0.0`` in Python; each encodes to other bytes, so
    each is another message to the ledger, kept in memory or not."""
    def history(value: Any) -> list[dict[str, Any]]:
        return [TASK, {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"n": value}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": "done"}]}]

    values = [1, 1.0, True, 1, 0.0, -0.0, 0.0]
    steps: list[Step] = [("messages", raw(history(value))) for value in values]
    results, rows = await kept(db(tmp_path, "kept"), steps)
    assert (results, rows) == await restarted(db(tmp_path, "restarted"), steps)
    assert [json.loads(body)["messages"][1]["content"][0]["input"]["n"]
            for body, _, _ in results] == values
    def node(value: Any) -> bytes:
        return chained(rows[0].node, digest_of(history(value)[1]))

    assert rows[1].node == node(0.0) != node(-0.0)

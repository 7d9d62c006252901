"""MCP end to end (docs/protocol.md, "MCP"): the real ``mcp`` SDK client against
``ctxctl mcp`` pumping to a real daemon; raw lines on the socket for what the SDK does not
show. Version negotiation, notifications left unanswered, the server/discover probe and
mcp.bind's checks are tested in-process (tests/unit/test_routes.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import pytest
import trio
from conftest import DaemonProcess
from e2e.test_cancel import WINDOW, Gated, chat, gated_daemon, snapshot

import ctxclient
from ctxd.tokens import TokenCounter

if TYPE_CHECKING:
    # The MCP SDK is imported where used: a second of CPU that every pytest-xdist worker
    # would spend collecting this module, not only the one running it.
    from mcp.client.session import ClientSession

CTXCTL = str(Path(sys.executable).parent / "ctxctl")
TOOL_NAMES = ["context_branch", "context_return", "context_branch_status",
              "context_list_branches", "context_rollback", "read_result", "memory_search",
              "memory_record", "compact_context", "tool_search", "context_fork"]
DEFAULT_TOOLS = ["context_branch", "context_return", "read_result", "memory_search",
                 "compact_context"]
OUTPUT = "\n".join(f"line {i}" for i in range(600))
"""A tool output over the 4,096-byte offload threshold."""


def pump_environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CTXD_", "CLAUDE_"))}
    env.update(extra)
    return env


@contextlib.asynccontextmanager
async def mcp_session(daemon: DaemonProcess, *args: str,
                      env: dict[str, str] | None = None) -> AsyncIterator[ClientSession]:
    """An initialized SDK session with ``ctxctl mcp --socket <daemon's>``."""
    from mcp import StdioServerParameters
    from mcp.client.session import ClientSession
    from mcp.client.stdio import stdio_client

    server = StdioServerParameters(command=CTXCTL,
                                   args=["mcp", "--socket", str(daemon.socket), *args],
                                   env=env or pump_environment())
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def structured(session: ClientSession, name: str, arguments: dict[str, Any],
                     schemas: dict[str, Any], **options: Any) -> Any:
    """A tool's structuredContent, checked against its outputSchema and its text block."""
    result = await session.call_tool(name, arguments, **options)
    assert result.is_error is False, result.content
    [block] = result.content
    assert json.loads(block.text) == result.structured_content  # type: ignore[union-attr]
    jsonschema.Draft202012Validator(schemas[name]).validate(result.structured_content)
    return result.structured_content


async def caller(session: ClientSession) -> Callable[..., Awaitable[Any]]:
    """A tool call on ``session`` by name and keyword arguments: its structured content,
    checked as `structured` checks it."""
    schemas = {tool.name: tool.output_schema for tool in (await session.list_tools()).tools}

    async def call(name: str, **arguments: Any) -> Any:
        return await structured(session, name, arguments, schemas)

    return call


@pytest.fixture
def gated(daemon_root: Path) -> Iterator[Gated]:
    daemon = gated_daemon(daemon_root, "--hygiene-auto-compact", "false")
    with daemon.process.running():
        yield daemon


async def test_tools_list_and_schemas(shared_daemon: DaemonProcess) -> None:
    async with mcp_session(shared_daemon) as session:
        assert session.initialize_result is not None
        assert session.initialize_result.protocol_version == "2025-11-25"
        assert session.initialize_result.server_info.name == "ctxd"
        lean = await session.list_tools()
        # The instructions name only tools the connection offers.
        assert "memory_record" not in (session.initialize_result.instructions or "")
    async with mcp_session(shared_daemon, "--tools", "memory_record,read_result") as session:
        chosen = await session.list_tools()
        assert session.initialize_result is not None
        assert "record them with memory_record" in (
            session.initialize_result.instructions or "")
    async with mcp_session(shared_daemon, "--tools", "all") as session:
        listed = await session.list_tools()
        again = await session.list_tools()
    # The default set, in the fixed order; the others on request.
    assert [tool.name for tool in lean.tools] == DEFAULT_TOOLS
    assert [tool.name for tool in chosen.tools] == ["read_result", "memory_record"]
    assert [tool.name for tool in listed.tools] == TOOL_NAMES
    assert again == listed
    assert lean.tools == [tool for tool in listed.tools if tool.name in DEFAULT_TOOLS]
    # What the default set costs in every model request (as Claude Code sends a tool:
    # name, description, input schema), counted as the gateway counts tool definitions.
    counter = TokenCounter()
    costs = [counter.count(json.dumps({"name": "mcp__ctxd__" + tool.name,
                                       "description": tool.description,
                                       "input_schema": tool.input_schema},
                                      separators=(",", ":")))
             for tool in listed.tools]
    # (All eleven: 1,790 before team and org scopes, whose pattern the memory tools carry.)
    assert sum(costs) < 1_820
    assert sum(cost for tool, cost in zip(listed.tools, costs, strict=True)
               if tool.name in DEFAULT_TOOLS) < 850
    for tool in listed.tools:
        for schema in (tool.input_schema, tool.output_schema):
            jsonschema.Draft202012Validator.check_schema(schema)
            text = json.dumps(schema)
            assert "$ref" not in text, tool.name
            assert "\\\\Z" not in text, tool.name
            assert schema["type"] == "object"
    branch = next(tool for tool in listed.tools if tool.name == "context_return")
    # An optional argument is its value's schema (leaving it out is null's meaning).
    assert branch.input_schema["properties"]["branch_id"] == {
        "description": '"br_" and 12 lower-case hex digits', "type": "string",
        "pattern": "^br_[0-9a-f]{12}$"}
    assert branch.input_schema["required"] == ["message"]
    assert branch.input_schema["additionalProperties"] is False


async def test_every_tool(shared_daemon: DaemonProcess, sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid, "project": "/p/demo"})
        client.call("message.append", {"session_id": sid, "messages": [
            {"role": "user", "content": "list the lines"},
            {"role": "tool", "name": "bash", "tool_call_id": "c1", "content": OUTPUT}]})
        [ref_id] = [m["ref_id"] for m in client.call(
            "message.list", {"session_id": sid})["messages"] if m.get("ref_id")]
        progress: list[tuple[float, float | None, str | None]] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append((value, total, message))

        async with mcp_session(shared_daemon, "--session", sid, "--tools", "all") as session:
            schemas = {tool.name: tool.output_schema
                       for tool in (await session.list_tools()).tools}

            async def call(name: str, **arguments: Any) -> Any:
                return await structured(session, name, arguments, schemas)

            state = client.call("session.get", {"session_id": sid})["context_state"]
            status = await call("context_branch_status")
            assert status == {
                "branch_path": ["main"],
                "token_breakdown": [{"thread": "main", "total": state["main_thread_tokens"],
                                     "folded_total": 0}],
                "context_limit": 191_808, "usage_percent": round(state["usage"] * 100, 2),
                "branch": None, "context_state": state}

            created = await call("context_branch", description="explore",
                                 prompt="look around", budget=2000, inject_memories=False)
            branch_id = created["branch_id"]
            assert (created["parent_branch_id"], created["depth"],
                    created["budget_allocated"]) == (None, 1, 2000)
            assert created["context_state"]["branch_path"] == [branch_id]
            branch = client.call("branch.status", {"branch_id": branch_id})["branch"]
            inside = await call("context_branch_status")
            assert inside["branch_path"] == ["main", branch_id]
            assert inside["token_breakdown"][1] == {"thread": branch_id,
                                                    "total": branch["budget_used"],
                                                    "folded_total": 0}
            assert inside["branch"]["branch_id"] == branch_id

            returned = await call("context_return", message="found line 7")
            assert (returned["success"], returned["branch_id"]) == (True, branch_id)
            assert returned["context_state"]["active_branch_id"] is None

            native = client.call("branch.list", {"session_id": sid})
            assert await call("context_list_branches") == {
                "branches": native["branches"], "total_branches": 1, "active_branches": 0,
                "folded_branches": 1, "context_state": native["context_state"]}
            folded = await call("context_branch_status")
            assert folded["token_breakdown"][0]["folded_total"] == \
                native["branches"][0]["tokens_folded"]

            doomed = (await call("context_branch", description="dead end",
                                 prompt="try it", inject_memories=False))["branch_id"]
            rolled = await call("context_rollback", branch_id=doomed)
            assert rolled["branches_discarded"] == [doomed]
            assert rolled["context_state"] == client.call(
                "session.get", {"session_id": sid})["context_state"]

            read = await call("read_result", ref_id=ref_id, pattern="^line 7$")
            native_read = client.call("result.read", {"session_id": sid, "ref_id": ref_id,
                                                      "pattern": "^line 7$"})
            assert read == {**native_read, "context_state": rolled["context_state"]}
            assert read["matches"] == [{"line": 8, "text": "line 7", "truncated": False}]

            recorded = await call("memory_record", title="Use uv",
                                  content="Install packages with uv, not pip.")
            assert (recorded["memory"]["scope"], recorded["memory"]["title"]) == (
                "project:/p/demo", "Use uv")
            found = await call("memory_search", query="install packages uv")
            assert [hit["id"] for hit in found["results"]] == [recorded["memory"]["id"]]
            assert found["context_state"]["session_id"] == sid

            compacted = await structured(session, "compact_context",
                                         {"strategies": ["clear"]}, schemas,
                                         progress_callback=on_progress)
            # The thread is far below the compaction target: nothing to do.
            assert (compacted["strategies_run"], compacted["tokens_recovered"]) == ([], 0)
            assert compacted["context_state"] == client.call(
                "session.get", {"session_id": sid})["context_state"]

            searched = await call("tool_search", query="weather")
            assert searched == {"matches": [], "deferred": 0,
                                "context_state": compacted["context_state"]}
            # The fork goes into a new session, not into the calling model's context: only
            # the preamble, the stats and the tokens come back.
            forked = await call("context_fork", session_id=sid + "-sub")
            native = client.call("context.fork", {"session_id": sid})
            child = client.call("session.get", {"session_id": sid + "-sub"})
            assert forked == {"session_id": sid + "-sub", "preamble": native["preamble"],
                              "stats": native["stats"],
                              "tokens": child["context_state"]["total_tokens"],
                              "context_state": native["context_state"]}
            listed = client.call("message.list", {"session_id": sid + "-sub"})["messages"]
            assert listed[0]["content"] == native["preamble"]
            assert len(listed) == native["stats"]["final_count"] + 1
            again = await call("context_fork", include_context=True)
            assert again["session_id"].startswith("ses_")
            assert (again["context"], again["stats"]) == (native["context"], native["stats"])
    assert progress == [
        (0.0, 1.0, "compacting the main thread"),
        (1.0, 1.0, f"compacted the main thread: {compacted['before_tokens']} → "
                   f"{compacted['after_tokens']} tokens")]


async def test_a_call_names_its_session_in_meta(shared_daemon: DaemonProcess,
                                                sid: str) -> None:
    """One MCP server for many conversations (OpenCode's): each call names its session
    and project in ``_meta`` (the params', or its arguments' when the client can change
    only those), and acts there; a call that names none acts on the connection's own."""
    other = sid + "-other"
    with shared_daemon.client() as client:
        for session_id in (sid, other):
            client.call("session.open", {"session_id": session_id})
            client.call("message.append", {"session_id": session_id, "messages": [
                {"role": "tool", "name": "bash", "tool_call_id": "c1",
                 "content": f"{session_id}\n{OUTPUT}"}]})
        refs = {session_id: next(m["ref_id"] for m in client.call(
            "message.list", {"session_id": session_id})["messages"] if m.get("ref_id"))
                for session_id in (sid, other)}
        async with mcp_session(shared_daemon, "--tools", "all") as session:
            schemas = {tool.name: tool.output_schema
                       for tool in (await session.list_tools()).tools}
            read = await structured(session, "read_result", {
                "ref_id": refs[sid], "limit": 40,
                "_meta": {"ctxd/session_id": sid, "ctxd/project": "/p/routed"}}, schemas)
            assert (read["content"], read["context_state"]["session_id"]) == (
                f"{sid}\n{OUTPUT}"[:40], sid)
            read = await structured(session, "read_result", {"ref_id": refs[other]},
                                    schemas, meta={"ctxd/session_id": other})
            assert read["content"].startswith(f"{other}\nline 0\n")
            assert read["context_state"]["session_id"] == other
            recorded = await structured(session, "memory_record", {
                "title": "Routed", "content": "Saved in the calling conversation's project.",
                "_meta": {"ctxd/session_id": sid, "ctxd/project": "/p/routed"}}, schemas)
            assert recorded["memory"]["scope"] == "project:/p/routed"
            assert client.call("session.get", {"session_id": sid})["session"]["project"] == \
                "/p/routed"
            # No session named: the connection's own, which is neither (the ref is still
            # read where it is, as `ctxctl result REF` reads it).
            unrouted = await structured(session, "read_result", {"ref_id": refs[sid],
                                                                 "limit": 40}, schemas)
            assert unrouted["content"] == f"{sid}\n{OUTPUT}"[:40]
            assert unrouted["context_state"]["session_id"] not in (sid, other)
            bad = await session.call_tool("read_result", {
                "ref_id": refs[sid], "_meta": {"ctxd/session_id": "no spaces allowed"}})
            assert bad.is_error is True
            [block] = bad.content
            assert block.text.startswith(  # type: ignore[union-attr]
                "invalid _meta: Expected `str` matching regex")
            not_object = await session.call_tool("read_result", {"ref_id": refs[sid],
                                                                 "_meta": "ses_x"})
            [block] = not_object.content
            assert block.text == ("invalid arguments: `_meta` is not an object\n"  # type: ignore[union-attr]
                                  "fix: send _meta as a JSON object")


async def test_read_result_finds_a_ref_of_another_session(shared_daemon: DaemonProcess,
                                                          sid: str) -> None:
    """An agent run through the gateway has its stubs in the gateway's session and its MCP
    server in its own: read_result finds the ref where it is, as ``ctxctl result REF``
    does; a ref no session holds is still an error that says so."""
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid + "-gw"})
        client.call("message.append", {"session_id": sid + "-gw", "messages": [
            {"role": "tool", "name": "bash", "tool_call_id": "c1", "content": OUTPUT}]})
        [ref_id] = [m["ref_id"] for m in client.call(
            "message.list", {"session_id": sid + "-gw"})["messages"] if m.get("ref_id")]
        native = client.call("result.read", {"ref_id": ref_id, "pattern": "^line 7$"})
    async with mcp_session(shared_daemon, "--session", sid) as session:
        found = await session.call_tool("read_result", {"ref_id": ref_id,
                                                        "pattern": "^line 7$"})
        unknown = await session.call_tool("read_result", {"ref_id": "res_0000000000000000"})
    with shared_daemon.client() as client:
        state = client.call("session.get", {"session_id": sid})["context_state"]
    assert found.is_error is False
    assert found.structured_content == {**native, "context_state": state}
    assert (unknown.is_error, unknown.content[0].text) == (  # type: ignore[union-attr]
        True, "unknown ref 'res_0000000000000000'\nfix: use a ref_id from a stub that ctxd "
              "wrote")


async def test_bad_arguments_and_errors_are_tool_errors(shared_daemon: DaemonProcess,
                                                        sid: str) -> None:
    from mcp.shared.exceptions import MCPError

    async with mcp_session(shared_daemon, "--session", sid) as session:
        missing = await session.call_tool("context_branch", {"description": "x"})
        wrong = await session.call_tool("context_branch", {"description": "x",
                                                           "prompt": "p", "budget": "a"})
        typo = await session.call_tool("memory_search", {"qurey": "x"})
        on_main = await session.call_tool("context_return", {"message": "done"})
        unknown_branch = await session.call_tool("context_rollback",
                                                 {"branch_id": "br_000000000000"})
        with pytest.raises(MCPError) as unknown_tool:
            await session.call_tool("context_fold", {})
    fix = "\nfix: call the tool with arguments its inputSchema allows"
    assert [(r.is_error, r.content[0].text) for r in (missing, wrong, typo)] == [  # type: ignore[union-attr]
        (True, "invalid arguments: Object missing required field `prompt` (at $)" + fix),
        (True, "invalid arguments: Expected `int | null`, got `str` (at $.budget)" + fix),
        (True, "invalid arguments: Object contains unknown field `qurey` (at $)" + fix)]
    assert (on_main.is_error, on_main.content[0].text) == (  # type: ignore[union-attr]
        True, "no branch is active: the main thread cannot be returned\n"
              "fix: open one with context_branch first")
    assert unknown_branch.is_error is True
    assert unknown_branch.content[0].text.startswith(  # type: ignore[union-attr]
        "unknown branch 'br_000000000000'")
    assert (unknown_tool.value.error.code, unknown_tool.value.error.message) == (
        -32602, "unknown tool: 'context_fold'")


def wait_until_idle(daemon: DaemonProcess) -> dict[str, Any]:
    """daemon.status once no request but this one is in flight (bounded)."""
    with daemon.client() as client:
        for _ in range(2000):
            status: dict[str, Any] = client.call("daemon.status")
            if status["requests_inflight"] == 0:
                return status
            time.sleep(0.01)
    raise AssertionError("a request stayed in flight")


async def test_a_cancelled_call_stops_in_the_daemon(gated: Gated, sid: str) -> None:
    with gated.process.client() as client:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        client.call("message.append", {"session_id": sid, "messages": chat(10, 450)})
        before = snapshot(client, sid)
        async with mcp_session(gated.process, "--session", sid, "--tools", "all") as session:
            with trio.move_on_after(60) as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(session.call_tool, "compact_context",
                                       {"strategies": ["summarize"]})
                    await trio.to_thread.run_sync(gated.wait_started)
                    nursery.cancel_scope.cancel()
            assert not scope.cancelled_caught
            # The daemon's answer was the cancellation: nothing waits at the gate any more.
            await trio.to_thread.run_sync(wait_until_idle, gated.process)
            after = snapshot(client, sid)
            status = await structured(session, "context_branch_status", {}, {
                tool.name: tool.output_schema for tool in (await session.list_tools()).tools})
    assert after == before
    assert not (gated.root / "release").exists()
    assert status["context_state"] == after[1]["context_state"]
    assert "cancelled by its client" in gated.process.log()


class LineClient:
    """A plain MCP client on raw lines (of the socket, or of a pump's stdio)."""

    def __init__(self, reader: Any, writer: Any):
        self.reader, self.writer = reader, writer

    def send(self, method: str, params: dict[str, Any] | None = None,
             request_id: int | str | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        if request_id is not None:
            message["id"] = request_id
        self.writer.write(json.dumps(message).encode() + b"\n")
        self.writer.flush()

    def receive(self) -> Any:
        line = self.reader.readline()
        assert line, "the connection closed"
        return json.loads(line)

    def ask(self, method: str, params: dict[str, Any] | None = None,
            request_id: int | str = 1) -> Any:
        self.send(method, params, request_id)
        return self.receive()


@contextlib.contextmanager
def raw(daemon: DaemonProcess) -> Iterator[LineClient]:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(daemon.socket))
        with sock.makefile("rb") as reader, sock.makefile("wb") as writer:
            yield LineClient(reader, writer)


def initialize(version: str, **extra: Any) -> dict[str, Any]:
    return {"protocolVersion": version, "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}, **extra}


def test_a_lone_surrogate_in_tool_arguments_is_read_as_the_replacement_character(
        shared_daemon: DaemonProcess, sid: str) -> None:
    """The MCP door decodes as the native one (docs/protocol.md, "Framing"): the arguments
    a JavaScript client writes with half an emoji are recorded with U+FFFD."""
    with raw(shared_daemon) as line:
        line.ask("mcp.bind", {"session_id": sid})
        line.ask("initialize", initialize("2025-06-18"))
        answer = line.ask("tools/call", {"name": "memory_record", "arguments": {
            "title": "emoji \ud83d cut", "content": "half \udc00 of it", "scope": "global"}})
    memory = answer["result"]["structuredContent"]["memory"]
    assert (answer["result"]["isError"], memory["title"], memory["content"]) == (
        False, "emoji \ufffd cut", "half \ufffd of it")


def test_cancellation_is_scoped_to_the_connection(gated: Gated, sid: str) -> None:
    with gated.process.client() as client, raw(gated.process) as line:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        client.call("message.append", {"session_id": sid, "messages": chat(10, 450)})
        before = snapshot(client, sid)
        line.ask("mcp.bind", {"session_id": sid})
        line.send("tools/call", {"name": "compact_context",
                                 "arguments": {"strategies": ["summarize"]},
                                 "_meta": {"progressToken": "t"}}, request_id=7)
        started = line.receive()
        gated.wait_started()
        # MCP ids are the connection's own: request.cancel elsewhere does not reach it.
        with pytest.raises(ctxclient.NotFound):
            client.call("request.cancel", {"request_id": 7})
        line.send("notifications/cancelled", {"requestId": 7, "reason": "user stop"})
        pong = line.ask("ping", request_id=8)
        after = snapshot(client, sid)
    assert started == {"jsonrpc": "2.0", "method": "notifications/progress", "params": {
        "progressToken": "t", "progress": 0, "total": 1,
        "message": "compacting the main thread"}}
    assert pong == {"jsonrpc": "2.0", "id": 8, "result": {}}  # no answer for id 7
    assert after == before


@contextlib.contextmanager
def pump(daemon: DaemonProcess, *args: str) -> Iterator[tuple[subprocess.Popen[bytes],
                                                               LineClient]]:
    """``ctxctl mcp`` driven by plain lines on its stdio; its stdin is closed after."""
    with subprocess.Popen([CTXCTL, "mcp", "--socket", str(daemon.socket), *args],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          env=pump_environment()) as process:
        yield process, LineClient(process.stdout, process.stdin)


def test_a_client_that_drops_mid_call_affects_no_one_else(gated: Gated, sid: str) -> None:
    with gated.process.client() as client:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        client.call("message.append", {"session_id": sid, "messages": chat(10, 450)})
        before = snapshot(client, sid)
        with pump(gated.process, "--session", sid) as (dropped, first), \
                pump(gated.process, "--session", sid + "-b") as (other, second):
            first.ask("initialize", initialize("2025-06-18"))
            second.ask("initialize", initialize("2025-06-18"))
            first.send("tools/call", {"name": "compact_context",
                                      "arguments": {"strategies": ["summarize"]}}, 2)
            gated.wait_started()
            dropped.send_signal(signal.SIGKILL)
            dropped.wait()
            listed = second.ask("tools/call", {"name": "context_list_branches",
                                               "arguments": {}}, 3)
            wait_until_idle(gated.process)
            listed_again = second.ask("tools/call", {"name": "context_list_branches",
                                                     "arguments": {}}, 4)
            other.stdin.close()  # type: ignore[union-attr]
            assert other.wait(30) == 0
        after = snapshot(client, sid)
    for answer in (listed, listed_again):
        assert answer["result"]["isError"] is False
        assert answer["result"]["structuredContent"]["context_state"]["session_id"] == \
            sid + "-b"
    assert after == before
    assert not (gated.root / "release").exists()


def test_ctxctl_mcp_starts_the_daemon_when_none_runs(daemon_root: Path) -> None:
    env = pump_environment(HOME=str(daemon_root), XDG_CONFIG_HOME=str(daemon_root / "config"),
                           XDG_STATE_HOME=str(daemon_root / "state"),
                           CTXD_SOCKET=str(daemon_root / "run" / "ctxd.sock"),
                           CTXD_DATA_DIR=str(daemon_root / "data"),
                           CLAUDE_CODE_SESSION_ID="cc-session",
                           CLAUDE_PROJECT_DIR="/work/project")
    with subprocess.Popen([CTXCTL, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env) as process:
        line = LineClient(process.stdout, process.stdin)
        try:
            line.ask("initialize", initialize("2025-06-18"))
            answer = line.ask("tools/call", {"name": "context_list_branches",
                                             "arguments": {}}, 2)
        finally:
            process.stdin.close()  # type: ignore[union-attr]
            process.wait(30)
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as sock:
                sock.connect(env["CTXD_SOCKET"])
                sock.sendall(b'{"jsonrpc":"2.0","id":1,"method":"daemon.shutdown"}\n')
                sock.recv(1024)
        stderr = process.stderr.read().decode()  # type: ignore[union-attr]
    assert process.returncode == 0
    assert stderr == (
        f"ctxctl mcp: no daemon on {env['CTXD_SOCKET']}; starting ctxd (log: "
        f"{daemon_root / 'state' / 'ctxd' / 'ctxd.log'})\n")
    assert answer["result"]["structuredContent"]["context_state"]["session_id"] == \
        "cc-session"
    log = (daemon_root / "state" / "ctxd" / "ctxd.log").read_text()
    assert "ready on" in log


def test_ctxctl_mcp_says_why_when_it_cannot_start(daemon_root: Path) -> None:
    unit = daemon_root / "config" / "systemd" / "user" / "ctxd.socket"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Socket]\n")
    path = daemon_root / "run" / "ctxd.sock"
    env = pump_environment(HOME=str(daemon_root), XDG_CONFIG_HOME=str(daemon_root / "config"),
                           CTXD_SOCKET=str(path))
    result = subprocess.run([CTXCTL, "mcp"], input=b"", capture_output=True, env=env,
                            check=False, timeout=30)
    assert (result.returncode, result.stdout) == (1, b"")
    assert result.stderr.decode() == (
        f"ctxctl mcp: nothing listens on {path}, and the systemd socket unit {unit} is "
        "installed: start it with `systemctl --user enable --now ctxd.socket`\n")


def test_a_call_cancelled_before_it_started_never_runs(shared_daemon: DaemonProcess,
                                                        sid: str) -> None:
    branch = {"name": "context_branch", "arguments": {"description": "d", "prompt": "p"}}
    with raw(shared_daemon) as line:
        line.ask("mcp.bind", {"session_id": sid})
        # One write: the daemon reads the cancellation before the call's task starts.
        line.writer.write(b"".join(json.dumps(message).encode() + b"\n" for message in (
            {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": branch},
            {"jsonrpc": "2.0", "method": "notifications/cancelled",
             "params": {"requestId": 5}},
            {"jsonrpc": "2.0", "id": 6, "method": "ping"},
            {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
             "params": {"name": "context_list_branches"}})))
        line.writer.flush()
        answers = [line.receive(), line.receive()]
    assert [answer["id"] for answer in answers] == [6, 7]
    assert answers[1]["result"]["structuredContent"]["total_branches"] == 0


def test_an_mcp_connection_is_never_idle(daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root, extra_args=["--idle-timeout-s", "0.5"]).start()
    try:
        with raw(process) as native, raw(process) as line:
            line.ask("mcp.bind", {})
            assert native.ask("daemon.ping")["result"]["pong"] is True
            assert native.reader.readline() == b""  # closed after 0.5 s of silence
            # The MCP client stayed longer than the idle timeout and is still served.
            assert line.ask("ping", request_id=2) == {"jsonrpc": "2.0", "id": 2, "result": {}}
    finally:
        process.stop()


async def test_a_call_in_flight_when_the_daemon_dies_is_answered_and_the_session_goes_on(
        gated: Gated, sid: str) -> None:
    with gated.process.client() as client:
        client.call("session.open", {"session_id": sid, "budget": WINDOW})
        client.call("message.append", {"session_id": sid, "messages": chat(10, 450)})
    async with mcp_session(gated.process, "--session", sid) as session:
        async with trio.open_nursery() as nursery:
            answers: list[Any] = []

            async def compact() -> None:
                answers.append(await session.call_tool(
                    "compact_context", {"strategies": ["summarize"]}))

            nursery.start_soon(compact)
            await trio.to_thread.run_sync(gated.wait_started)
            gated.process.kill()  # the call is in flight: held at the summarizer
        gated.process.start()  # the same socket and data
        listed = await session.call_tool("context_list_branches", {})
    [stopped] = answers
    assert (stopped.is_error, [block.text for block in stopped.content]) == (  # type: ignore[union-attr]
        True, ["ctxd stopped; retrying"])
    assert listed.is_error is False
    assert listed.structured_content is not None
    assert listed.structured_content["context_state"]["session_id"] == sid
    assert listed.structured_content["context_state"]["main_thread_tokens"] > 4500


def test_after_a_restart_the_pump_binds_the_session_the_daemon_made(
        daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root).start()
    try:
        with pump(process) as (pumping, line):
            line.ask("initialize", initialize("2025-06-18"))
            line.send("notifications/initialized")
            first = line.ask("tools/call", {"name": "context_list_branches",
                                            "arguments": {}}, 2)
            process.kill()
            # Nothing listens: answered by the pump.
            stopped = line.ask("ping", request_id=3)
            process.start()
            # Answered by the restarted daemon on a new connection of the same pump.
            again = line.ask("tools/call", {"name": "context_list_branches",
                                            "arguments": {}}, 4)
            pinged = line.ask("ping", request_id=5)
            pumping.stdin.close()  # type: ignore[union-attr]
            assert pumping.wait(30) == 0
    finally:
        process.stop()
    made = first["result"]["structuredContent"]["context_state"]["session_id"]
    assert made.startswith("ses_")
    assert again["result"]["isError"] is False
    assert again["result"]["structuredContent"]["context_state"]["session_id"] == made
    assert stopped == {"jsonrpc": "2.0", "id": 3,
                       "error": {"code": -32007, "message": "ctxd stopped; retrying"}}
    assert pinged == {"jsonrpc": "2.0", "id": 5, "result": {}}


async def test_the_fold_protocol_s_shapes(shared_daemon: DaemonProcess, sid: str) -> None:
    """What the fold protocol's agents expect of ctxd's tools and hello (docs/protocol.md,
    "MCP"): memories injected with their text, a return that extracts a lesson, a tool
    search that says how to call what it found, a fork that answers context_state, the
    protocol's feature names."""
    from e2e.test_tools import BUDGET, TOOLS

    with shared_daemon.client() as client:
        hello = client.call("daemon.hello", {"client": "fold-agent", "protocol_features": [
            "token_usage", "tool_states", "injection", "cancellation", "folding", "x"]})
        client.call("session.open", {"session_id": sid, "project": "/p/cobalt",
                                     "budget": BUDGET})
        lesson = client.call("memory.record", {
            "title": "cobalt builds need ninja", "scope": "project:/p/cobalt",
            "content": "Install ninja before building cobalt, or cmake stops."})["memory"]
        client.call("tools.register", {"session_id": sid, "tools": TOOLS})
        async with mcp_session(shared_daemon, "--session", sid, "--tools", "all") as session:
            call = await caller(session)

            created = await call("context_branch", description="build cobalt with cmake",
                                 prompt="Build cobalt: cmake, ninja.", budget=4000)
            used = client.call("memory.get", {"id": lesson["id"]})["memory"]["usage_count"]
            returned = await call("context_return", message="Built after installing ninja.",
                                  extract_memory=True)
            found = await call("tool_search", query="slack message")
            forked = await call("context_fork")
            after_fork = client.call("session.get", {"session_id": sid})["context_state"]
    assert hello["agreed_features"] == ["token_usage", "tool_states", "injection",
                                        "cancellation", "folding"]
    [item] = created["injected_context"]
    block = (f"- {lesson['title']} (confidence 0.80): {lesson['content']}\n")
    assert item == {"type": "memory", "id": lesson["id"], "title": lesson["title"],
                    "content": lesson["content"], "tokens": TokenCounter().count(block)}
    assert used == 1  # its text was in the answer: counted as used once
    assert (returned["success"], returned["memory_queued"]) == (True, True)
    slack = next(tool for tool in TOOLS if tool["name"] == "slack_post_message")
    assert [(match["name"], match["input_schema"]) for match in found["matches"]] == [
        ("slack_post_message", slack["input_schema"])]
    assert forked["context_state"] == after_fork
    assert forked["session_id"] != sid


async def test_budget_warnings_and_forced_returns_reach_the_agent(
        shared_daemon: DaemonProcess, sid: str) -> None:
    """A branch's budget warning and its forced return come with the next tool result the
    MCP agent gets, each once, even when that result is an error."""
    from tests_support import hello_text

    with shared_daemon.client() as client:
        async with mcp_session(shared_daemon, "--session", sid, "--tools", "all") as session:
            call = await caller(session)

            created = await call("context_branch", description="read the logs",
                                 prompt="Find the failure.", budget=1000,
                                 inject_memories=False)
            branch_id = created["branch_id"]
            quiet = await call("memory_search", query="anything")
            # The agent's work, recorded into the branch by its hooks or the gateway.
            left = 1000 - created["budget_used"]
            client.call("message.append", {"session_id": sid, "branch_id": branch_id,
                                           "messages": [{"role": "assistant",
                                                         "content": hello_text(left - 150)}]})
            warned = await call("memory_search", query="anything")
            again = await call("memory_search", query="anything")
            client.call("message.append", {"session_id": sid, "branch_id": branch_id,
                                           "messages": [{"role": "assistant",
                                                         "content": hello_text(300)}]})
            late = await session.call_tool("context_return", {"message": "done"})
            after = await call("memory_search", query="anything")
        branch = client.call("branch.status", {"branch_id": branch_id})["branch"]
    assert "context_health" not in quiet
    assert "context_health" not in again
    assert "context_health" not in after
    assert warned["context_health"] == {
        "health": warned["context_state"]["health"], "forced_returns": [],
        "budget_warnings": [{"branch_id": branch_id, "description": "read the logs",
                             "budget_used": warned["context_state"]["current_branch_tokens"],
                             "budget": 1000}]}
    assert warned["context_state"]["health"] == "caution"
    assert branch["status"] == "budget_exhausted"
    assert late.is_error is True
    [error, health] = late.content
    assert error.text.startswith("no branch is active")  # type: ignore[union-attr]
    assert json.loads(health.text.removeprefix("context_health: ")) == {  # type: ignore[union-attr]
        "health": "ok", "budget_warnings": [],
        "forced_returns": [{"branch_id": branch_id, "description": "read the logs",
                            "status": "budget_exhausted",
                            "reason": branch["return_reason"], "result": branch["result"]}]}


def test_ctxctl_mcp_refuses_a_tool_that_does_not_exist(shared_daemon: DaemonProcess) -> None:
    result = subprocess.run([CTXCTL, "mcp", "--socket", str(shared_daemon.socket),
                             "--tools", "read_result,context_fold"], input=b"",
                            capture_output=True, env=pump_environment(), check=False,
                            timeout=30)
    assert (result.returncode, result.stdout) == (1, b"")
    assert result.stderr.decode() == (
        "ctxctl mcp: ctxd refused the MCP session binding: invalid params: Invalid enum "
        "value 'context_fold' (at $.tools[1])\n")

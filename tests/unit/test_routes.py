"""The route table in-process (ctxd/daemon/_routes.py): the daemon's dispatcher answers
request lines as a connection does, for a fake peer, with the real table over a real store
in a temporary directory. What needs a socket (framing, line limits, concurrency,
cancellation over a connection) is tested end to end (tests/e2e/test_wire.py)."""

from __future__ import annotations

import argparse
import inspect
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import pytest
import trio
from jsonrpc import (
    NOT_FOUND_FIX,
    PARSE_FIX,
    assert_pong,
    encode,
    error,
    invalid_params,
    invalid_request,
    notification,
    request,
    same_id,
)
from tests_support import COUNTER

from ctxclient import cli
from ctxd.config import Config
from ctxd.daemon import ROUTES, Daemon, On, Route
from ctxd.errors import ErrorCode, cancelled
from ctxd.jobs import Request, working_for
from ctxd.mcp import TOOLS
from ctxd.wire import NOT_INLINE, Envelope, EventSource


class FakePeer:
    """A connection as a handler sees it (`ctxd.wire.Peer`)."""

    def __init__(self, uid: int) -> None:
        self.extension: Any = None
        self.peer_uid = uid
        self.sources: dict[str, EventSource] = {}
        self.notifications: list[tuple[str, Any]] = []

    @property
    def subscription_count(self) -> int:
        return len(self.sources)

    def attach(self, source: EventSource) -> None:
        self.sources[source.subscription_id] = source

    def detach(self, subscription_id: str) -> bool:
        return self.sources.pop(subscription_id, None) is not None

    async def send_notification(self, method: str, params: Any) -> None:
        self.notifications.append((method, params))


class Failure(NamedTuple):
    code: int
    message: str
    data: Any


class Door:
    """The daemon's dispatcher answering one connection's lines as the server does
    (ctxd/daemon/_server.py, ``Connection._dispatch``): a batch, an inline method on the
    reader, any other in a task of its own."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.peer = FakePeer(os.getuid())

    async def send(self, line: bytes) -> Any:
        """The decoded answer to one line, or None when none is sent."""
        dispatcher = self.daemon.dispatcher
        if line[:1] in (b" ", b"\t", b"\r", b"\n"):
            line = line.strip()
        if line.startswith(b"["):
            reply = await dispatcher.answer_batch(line, self.peer)
        else:
            envelope = dispatcher.decode(line)
            if isinstance(envelope, bytes):
                reply = envelope
            else:
                inline = dispatcher.answer_inline(envelope, self.peer)
                reply = await self._answer(envelope) if inline is NOT_INLINE else inline
        return None if reply is None else json.loads(reply)

    async def _answer(self, envelope: Envelope) -> bytes | None:
        """A request in a task of its own: one with an id may be cancelled, by
        request.cancel unless its ids are its connection's (``Connection._answer``)."""
        dispatcher = self.daemon.dispatcher
        if envelope.id is msgspec.UNSET or envelope.id is None:
            return await dispatcher.answer(envelope, self.peer)
        request = Request(envelope.id, cancelled)
        requests = (None if dispatcher.connection_ids(envelope.method)
                    else self.daemon.requests)
        if requests is not None:
            requests.add(request)
        try:
            with working_for(request):
                return await dispatcher.answer(envelope, self.peer)
        finally:
            if requests is not None:
                requests.discard(request)
            else:
                request.finished = True

    async def call(self, message: Any) -> Any:
        return await self.send(encode(message))

    async def result(self, method: str, params: Any = None) -> Any:
        """A call's result; it must succeed."""
        reply = await self.call(request(method, params))
        assert "result" in reply, reply
        return reply["result"]

    async def failure(self, method: str, params: Any = None) -> Failure:
        """A call's error; it must fail."""
        reply = await self.call(request(method, params))
        assert "error" in reply, reply
        return Failure(reply["error"]["code"], reply["error"]["message"],
                       reply["error"].get("data"))


@pytest.fixture
async def door(tmp_path: Path) -> AsyncIterator[Door]:
    daemon = Daemon(Config(data_dir=str(tmp_path), socket=str(tmp_path / "ctxd.sock")))
    daemon.store.open()
    try:
        daemon.assemble(COUNTER, max_connections=8)
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.bus.run)
            await nursery.start(daemon.memory.run)
            await nursery.start(daemon.supervisor.run)
            yield Door(daemon)
            nursery.cancel_scope.cancel()
    finally:
        daemon.store.close()


async def new_session(door: Door, session_id: str = "w_session") -> str:
    await door.result("session.open", {"session_id": session_id})
    return session_id


async def message_count(door: Door, session_id: str) -> int:
    got = await door.result("session.get", {"session_id": session_id})
    count: int = got["session"]["message_count"]
    return count


# ---- the table ------------------------------------------------------------------------

async def test_the_dispatcher_answers_exactly_the_routes(door: Door) -> None:
    methods = [route.method for route in ROUTES]
    assert len(methods) == len(set(methods))
    assert door.daemon.dispatcher.method_names == sorted(methods)


def _params_position(route: Route) -> int:
    return 2 if route.on is On.DAEMON else 1


@pytest.mark.parametrize("route", ROUTES, ids=[route.method for route in ROUTES])
def test_each_operation_takes_its_routes_params_and_waits_unless_inline(route: Route) -> None:
    parameters = list(inspect.signature(route.op).parameters.values())
    annotation = parameters[_params_position(route)].annotation
    assert annotation in (route.params, route.params.__name__)
    assert inspect.iscoroutinefunction(route.op) is not route.inline


FINDS = {On.SESSION: "session_id", On.BRANCH: "branch_id", On.INJECTION: "injection_id",
         On.RESULT: "ref_id"}


@pytest.mark.parametrize("route", [route for route in ROUTES if route.on in FINDS],
                         ids=[route.method for route in ROUTES if route.on in FINDS])
def test_a_session_route_names_its_session_by_a_required_field(route: Route) -> None:
    [field] = [field for field in msgspec.structs.fields(route.params)
               if field.name == FINDS[route.on]]
    assert field.required


@pytest.mark.parametrize("route", ROUTES, ids=[route.method for route in ROUTES])
async def test_empty_params_decode_or_name_the_missing_field(door: Door, route: Route) -> None:
    required = [field.name for field in msgspec.structs.fields(route.params) if field.required]
    if not required:
        msgspec.json.decode(b"{}", type=route.params)
        return
    # The dispatcher names the first one missing; the operation does not run.
    assert await door.call(request(route.method, {}, 7)) == invalid_params(
        7, "$", f"Object missing required field `{required[0]}`")


def test_every_mcp_tool_named_exists_and_every_tool_is_named() -> None:
    named = {tool for route in ROUTES for tool in route.mcp}
    assert named == {tool.name for tool in TOOLS}


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> set[str]:
    found: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.add(prefix + name)
                found |= _commands(sub, f"{prefix}{name} ")
    return found


def test_every_ctxctl_command_named_exists() -> None:
    commands = _commands(cli.parser())
    named = {command for route in ROUTES for command in route.ctxctl}
    assert sorted(named - commands) == []
    assert {"status", "session show", "memory rate", "mcp"} <= named


# ---- -32601 method not found --------------------------------------------------------

@pytest.mark.parametrize(("method", "request_id"), [
    ("nope", "abc"), ("Daemon.Ping", 0), ("", -1), ("daemon.ping ", 2**70),
])
async def test_unknown_method_lists_the_available_ones(door: Door, method: str,
                                                       request_id: Any) -> None:
    reply = await door.call(request(method, {"x": 1}, request_id))
    suggestion = {"Daemon.Ping": "daemon.ping", "daemon.ping ": "daemon.ping"}.get(method)
    assert reply == error(request_id, ErrorCode.METHOD_NOT_FOUND,
                          f"method not found: {method!r}",
                          {"method": method,
                           "available": sorted(route.method for route in ROUTES),
                           "suggestion": suggestion,
                           "fix": f"did you mean {suggestion}?" if suggestion else
                           "call one of the methods in data.available (docs/protocol.md)"})


# ---- -32700 parse error -------------------------------------------------------------

@pytest.mark.parametrize(("line", "message"), [
    (b"{bad", "parse error: JSON is malformed: object keys must be strings (byte 1)"),
    (b'{"jsonrpc":"2.0","id":9,"method":"daemon.ping"', "parse error: Input data was truncated"),
    (b'{"jsonrpc":"2.0","id":9,"method":"daemon.ping"} x',
     "parse error: JSON is malformed: trailing characters (byte 49)"),
    (b'[{"jsonrpc":"2.0","id":9,"method":"daemon.ping"},', "parse error: Input data was truncated"),
    (b"\x00", "parse error: JSON is malformed: invalid character (byte 0)"),
    # A lone surrogate does not hide a real syntax error, nor move its byte offset.
    (b'{"jsonrpc":"2.0","id":"\\ud800","method":"daemon.ping"} x',
     "parse error: JSON is malformed: trailing characters (byte 56)"),
], ids=["malformed", "truncated", "trailing", "truncated-batch", "nul",
        "lone-surrogate-and-trailing"])
async def test_parse_error(door: Door, line: bytes, message: str) -> None:
    # The id is never echoed on a parse error, even when it could be guessed (JSON-RPC 2.0).
    assert await door.send(line) == error(None, ErrorCode.PARSE_ERROR, message, PARSE_FIX)


# ---- lone surrogates: valid JSON, decoded with U+FFFD (docs/protocol.md, "Framing") --

async def test_a_lone_surrogate_in_params_is_stored_as_the_replacement_character(
        door: Door) -> None:
    """What JavaScript writes for an emoji cut in half is answered as any request: each
    lone surrogate escape is read as U+FFFD, a pair stays the character it encodes."""
    session_id = await new_session(door)
    content = rb'cut \ud83d, \ude00 alone, \ud83d\ude00 whole, \\ud83d as text'
    reply = await door.send(
        b'{"jsonrpc":"2.0","id":7,"method":"message.append","params":{"session_id":"'
        + session_id.encode() + b'","messages":[{"role":"user","content":"'
        + content + b'","meta":{"k\\udfff":"\\ud800"}}]}}')
    assert (reply["id"], list(reply["result"])[:1]) == (7, ["appended"])
    [message] = (await door.result("message.list", {"session_id": session_id}))["messages"]
    assert (message["content"], message["meta"]) == (
        "cut \ufffd, \ufffd alone, \U0001f600 whole, \\ud83d as text",
        {"k\ufffd": "\ufffd"})


async def test_lone_surrogates_in_the_envelope_and_batches(door: Door) -> None:
    # The id is read with U+FFFD too: that is the id the answer carries.
    assert_pong(await door.send(b'{"jsonrpc":"2.0","id":"\\ud800","method":"daemon.ping"}'),
                "\ufffd")
    pong, hello = await door.send(
        b'[{"jsonrpc":"2.0","id":1,"method":"daemon.ping"},'
        b'{"jsonrpc":"2.0","id":2,"method":"daemon.hello","params":{"client":"x\\udbff"}}]')
    assert_pong(pong, 1)
    assert (hello["id"], "result" in hello) == (2, True)
    # Invalid params name the field as it was read.
    assert await door.send(
        b'{"jsonrpc":"2.0","id":3,"method":"daemon.ping","params":{"\\udc00":1}}'
    ) == invalid_params(3, "$", "Object contains unknown field `\ufffd`")
    # An invalid request keeps its id.
    assert await door.send(b'{"jsonrpc":"2.0","id":"\\udc00x","method":5}') == invalid_request(
        "\ufffdx", "Expected `str`, got `int` - at `$.method`")


# ---- -32600 invalid request ---------------------------------------------------------

@pytest.mark.parametrize(("line", "expected"), [
    (b"3", invalid_request(None, "Expected `object`, got `int`")),
    (b'"daemon.ping"', invalid_request(None, "Expected `object`, got `str`")),
    (b"null", invalid_request(None, "Expected `object`, got `null`")),
    (b"true", invalid_request(None, "Expected `object`, got `bool`")),
    (b"{}", invalid_request(None, "Object missing required field `jsonrpc`")),
    (b'{"jsonrpc":"2.0"}', invalid_request(None, "Object missing required field `method`")),
    (b'{"jsonrpc":"2.0","id":5}', invalid_request(5, "Object missing required field `method`")),
    (b'{"id":"six","method":"daemon.ping"}',
     invalid_request("six", "Object missing required field `jsonrpc`")),
    (b'{"jsonrpc":2,"id":7,"method":"daemon.ping"}',
     invalid_request(7, "Expected `str`, got `int` - at `$.jsonrpc`")),
    (b'{"jsonrpc":"2.0","id":8,"method":5}',
     invalid_request(8, "Expected `str`, got `int` - at `$.method`")),
    (b'{"jsonrpc":"2.0","id":1.5,"method":"daemon.ping"}',
     invalid_request(None, "Expected `int | str | null`, got `float` - at `$.id`")),
    (b'{"jsonrpc":"2.0","id":[1],"method":"daemon.ping"}',
     invalid_request(None, "Expected `int | str | null`, got `array` - at `$.id`")),
    (b'{"jsonrpc":"1.0","id":9,"method":"daemon.ping"}',
     error(9, ErrorCode.INVALID_REQUEST, "invalid request: jsonrpc must be \"2.0\", got '1.0'",
           {"fix": 'set "jsonrpc":"2.0"'})),
    (b"[]", error(None, ErrorCode.INVALID_REQUEST, "invalid request: empty batch",
                  {"fix": "send at least one request in a batch"})),
    (b' [1,"x",[]]', [invalid_request(None, "Expected `object`, got `int`"),
                      invalid_request(None, "Expected `object`, got `str`"),
                      invalid_request(None, "Expected `object`, got `array`")]),
], ids=["number", "string", "null", "bool", "empty-object", "no-method-no-id", "no-method",
        "no-jsonrpc", "jsonrpc-not-string", "method-not-string", "float-id", "array-id",
        "jsonrpc-1.0", "empty-batch", "batch-of-non-requests"])
async def test_invalid_request(door: Door, line: bytes, expected: Any) -> None:
    assert await door.send(line) == expected


async def test_invalid_request_in_a_batch_echoes_each_readable_id(door: Door) -> None:
    replies = {json.dumps(reply["id"]): reply for reply in await door.call([
        {"jsonrpc": "2.0", "id": 1}, request("daemon.ping", None, 2),
        {"jsonrpc": "1.0", "id": "three", "method": "daemon.ping"}])}
    assert set(replies) == {"1", "2", '"three"'}
    assert replies["1"] == invalid_request(1, "Object missing required field `method`")
    assert_pong(replies["2"], 2)
    assert replies['"three"'] == error(
        "three", ErrorCode.INVALID_REQUEST, "invalid request: jsonrpc must be \"2.0\", got '1.0'",
        {"fix": 'set "jsonrpc":"2.0"'})


# ---- -32602 invalid params ----------------------------------------------------------

SESSION_ID_REASON = "Expected 1-128 of A-Z a-z 0-9 . _ : - (first alphanumeric)"


@pytest.mark.parametrize(("method", "params", "request_id", "path", "reason"), [
    ("session.open", {"session_id": 5}, 1, "$.session_id", "Expected `str | null`, got `int`"),
    ("session.open", {"session_id": "bad id!"}, "s", "$.session_id", SESSION_ID_REASON),
    ("session.open", {"sesion_id": "x"}, 2, "$", "Object contains unknown field `sesion_id`"),
    ("message.append", {"messages": [{"role": "user", "content": "x"}]}, 3, "$",
     "Object missing required field `session_id`"),
    ("message.append", {"session_id": "s", "messages": []}, 4, "$.messages",
     "Expected `array` of length >= 1"),
    ("message.append", {"session_id": "s", "messages": [
        {"role": "user", "content": "x"}, {"role": "bob", "content": "y"}]},
     None, "$.messages[1].role", "Invalid enum value 'bob'"),
    ("message.append", {"session_id": "s", "messages": [{"role": "user"}]}, 5,
     "$.messages[0].content", "a message needs content (a string or a list of parts); only "
     "an assistant message with tool_calls may leave it null"),
    ("message.append", {"session_id": "s", "messages": [
        {"role": "user", "content": "x", "rol": "y"}]}, 6,
     "$.messages[0]", "Object contains unknown field `rol`"),
    ("session.open", {"budget": {"warn": 1.5}}, 7, "$.budget.warn", "Expected `float` <= 1.0"),
    ("session.open", {"budget": {"context_window": "big"}}, 8, "$.budget.context_window",
     "Expected `int | null`, got `str`"),
    ("daemon.hello", {"protocol_features": ["events", 1]}, 9, "$.protocol_features[1]",
     "Expected `str`, got `int`"),
    ("session.list", {"limit": 0}, 10, "$.limit", "Expected `int` >= 1"),
    ("daemon.ping", [], 11, "$", "Expected `object`, got `array`"),
    ("session.get", ["s"], 12, "$", "Expected `object`, got `array`"),
    ("daemon.status", "x", 13, "$", "Expected `object`, got `str`"),
], ids=["wrong-type", "pattern", "unknown-field", "missing-field", "empty-list",
        "nested-enum", "nested-missing", "nested-unknown", "nested-range", "nested-type",
        "list-item", "range", "array-params", "array-params-2", "string-params"])
async def test_invalid_params_names_the_bad_field(door: Door, method: str, params: Any,
                                                  request_id: Any, path: str,
                                                  reason: str) -> None:
    assert await door.call(request(method, params, request_id)) == invalid_params(
        request_id, path, reason)


async def test_null_params_are_invalid(door: Door) -> None:
    # `"params": null` is present (not omitted), so it is decoded as the params object.
    assert await door.send(b'{"jsonrpc":"2.0","id":"n","method":"daemon.ping","params":null}'
                           ) == invalid_params("n", "$", "Expected `object`, got `null`")


async def test_invalid_content_part_is_invalid_params(door: Door) -> None:
    session_id = await new_session(door)
    reply = await door.call(request("message.append", {"session_id": session_id, "messages": [
        {"role": "user", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"text": "b"}]}]}, 14))
    assert reply == invalid_params(14, "$.messages[1].content[1].type",
                                   "every content part needs a string `type`")
    assert await message_count(door, session_id) == 0


@pytest.mark.parametrize("method", ["session.list", "message.list"])
async def test_cursor_past_int64_is_not_an_internal_error(door: Door, method: str) -> None:
    """The cursor pattern admits 19 digits; past 2**63 - 1 it is a bad field (or no page)."""
    params = {"cursor": "9999999999999999999"}
    if method == "message.list":
        params["session_id"] = await new_session(door)
    reply = await door.call(request(method, params, "cursor"))
    if "error" in reply:
        path = (reply["error"].get("data") or {}).get("path")
        assert (reply["id"], reply["error"]["code"], path) == (
            "cursor", ErrorCode.INVALID_PARAMS, "$.cursor"), reply
    else:
        assert reply["id"] == "cursor"
        assert reply["result"]["next_cursor"] is None


@pytest.mark.parametrize("request_id", [0, -7, 2**64, "", "ключ 🔑", None])
async def test_ids_are_echoed_exactly(door: Door, request_id: Any) -> None:
    reply = await door.call(request("daemon.ping", None, request_id))
    assert_pong(reply, request_id)
    assert same_id(reply["id"], request_id)
    reply = await door.call(request("daemon.ping", {"bogus": True}, request_id))
    assert reply == invalid_params(request_id, "$", "Object contains unknown field `bogus`")


# ---- notifications ------------------------------------------------------------------

async def test_notifications_never_get_a_response(door: Door) -> None:
    session_id = await new_session(door)
    for message in (
            notification("daemon.ping"),
            notification("nope"),
            notification("daemon.ping", {"bogus": 1}),
            notification("daemon.ping", []),
            {"jsonrpc": "1.0", "method": "daemon.ping"},
            notification("session.get", {"session_id": "w_missing"}),
            notification("message.append", {"session_id": session_id,
                                            "messages": [{"role": "user", "content": "hi"}]}),
    ):
        assert await door.call(message) is None, message
    assert await message_count(door, session_id) == 1  # the notification did run


# ---- batches ------------------------------------------------------------------------

async def test_batch_answers_only_its_requests(door: Door) -> None:
    session_id = await new_session(door)
    replies = await door.call([
        request("daemon.ping", None, 1),
        notification("daemon.ping"),
        request("nope", None, "two"),
        notification("nope"),
        request("session.open", {"session_id": 5}, 3),
        notification("session.open", {"session_id": 5}),
        request("session.get", {"session_id": "w_missing"}, 4),
        notification("message.append", {"session_id": session_id,
                                        "messages": [{"role": "user", "content": "a"}]}),
        request("message.list", {"session_id": session_id}, 5),
    ])
    assert isinstance(replies, list)
    by_id = {json.dumps(reply["id"]): reply for reply in replies}
    assert len(by_id) == len(replies) == 5
    assert_pong(by_id["1"], 1)
    assert by_id['"two"'] == error("two", ErrorCode.METHOD_NOT_FOUND, "method not found: 'nope'",
                                   {"method": "nope",
                                    "available": sorted(route.method for route in ROUTES),
                                    "suggestion": None, "fix": "call one of the methods in "
                                    "data.available (docs/protocol.md)"})
    assert by_id["3"] == invalid_params(3, "$.session_id", "Expected `str | null`, got `int`")
    assert by_id["4"] == error(4, ErrorCode.NOT_FOUND, "unknown session 'w_missing'",
                               {"session_id": "w_missing", "fix": NOT_FOUND_FIX})
    # Batch items run in order: the list sees the append notified just before it.
    assert [m["content"] for m in by_id["5"]["result"]["messages"]] == ["a"]


async def test_batch_of_notifications_gets_no_reply(door: Door) -> None:
    assert await door.call([notification("daemon.ping"), notification("nope"),
                            notification("session.get", {"session_id": "w_missing"})]) is None


async def test_batch_runs_in_order(door: Door) -> None:
    session_id = await new_session(door)
    replies = {reply["id"]: reply["result"] for reply in await door.call([
        request("message.append", {"session_id": session_id,
                                   "messages": [{"role": "user", "content": "one"}]}, 1),
        request("message.append", {"session_id": session_id,
                                   "messages": [{"role": "assistant", "content": "two"}]}, 2),
        request("ctxd.render", {"session_id": session_id}, 3),
    ])}
    assert [m["seq"] for m in replies[1]["appended"]] == [1]
    assert [m["seq"] for m in replies[2]["appended"]] == [2]
    assert replies[3]["messages"] == [{"role": "user", "content": "one"},
                                      {"role": "assistant", "content": "two"}]


# ---- what each method checks of its params (formerly over a socket) -------------------

async def test_hello_negotiates_features(door: Door) -> None:
    hello = await door.result("daemon.hello", {"client": "test", "protocol_features": [
        "events", "tools", "time-travel"]})
    assert hello["features"] == ["folding", "memory", "events", "usage", "tools", "inject",
                                 "cancel", "mcp"]
    assert hello["agreed_features"] == ["events", "tools"]
    # The fold protocol's names for the same features, as the client spelt them.
    seed = await door.result("daemon.hello", {"client": "seed", "protocol_features": [
        "cancellation", "token_usage", "tool_states", "injection", "token_usage", "offload"]})
    assert seed["agreed_features"] == ["cancellation", "token_usage", "tool_states",
                                       "injection"]
    assert (await door.failure("daemon.hello", {"client": 5})).data["path"] == "$.client"


@pytest.mark.parametrize(("budget", "path"), [
    ({"context_window": 8000, "max_output_tokens": 8000}, "$.budget.max_output_tokens"),
    ({"warn": 0.9, "caution": 0.8}, "$.budget.warn"),
    ({"hard_block": 1.5}, "$.budget.hard_block"),
    ({"context_window": 10}, "$.budget.context_window"),
    ({"context_windw": 10}, "$.budget"),
])
async def test_bad_budgets_name_the_field(door: Door, budget: dict[str, Any],
                                          path: str) -> None:
    failure = await door.failure("session.open", {"session_id": "s1", "budget": budget})
    assert (failure.code, failure.data["path"]) == (-32602, path)


async def test_bad_session_ids(door: Door) -> None:
    for bad in ("", "has space", "-leading-dash", "x" * 129):
        failure = await door.failure("session.open", {"session_id": bad})
        assert (failure.code, failure.data["path"]) == (-32602, "$.session_id")


async def test_unknown_session_is_not_found_for_every_method(door: Door) -> None:
    calls = [("session.get", {}), ("session.close", {}), ("session.delete", {}),
             ("message.append", {"messages": [{"role": "user", "content": "x"}]}),
             ("message.list", {}), ("ctxd.render", {}), ("budget.measure", {})]
    for method, params in calls:
        failure = await door.failure(method, {"session_id": "no-such-session", **params})
        assert failure.code == -32004, method
        assert failure.data["session_id"] == "no-such-session"


async def test_bad_parts_name_the_field(door: Door) -> None:
    session_id = await new_session(door)
    failure = await door.failure("message.append", {"session_id": session_id, "messages": [
        {"role": "user", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "ok"}, {"type": "text"}]}]})
    assert (failure.code, failure.data["path"]) == (-32602, "$.messages[1].content[1].text")
    failure = await door.failure("message.append", {"session_id": session_id, "messages": []})
    assert (failure.code, failure.data["path"]) == (-32602, "$.messages")
    # Nothing of a rejected batch was stored.
    assert await message_count(door, session_id) == 0


async def test_cancelling_an_unknown_request(door: Door) -> None:
    unknown = await door.failure("request.cancel", {"request_id": "no-such-request"})
    numbered = await door.failure("request.cancel", {"request_id": 42})
    empty = await door.failure("request.cancel", {"request_id": ""})
    missing = await door.failure("request.cancel", {})
    hello = await door.result("daemon.hello", {})
    assert (unknown.code, unknown.message) == (
        -32004, "no request with id 'no-such-request' is in flight")
    assert unknown.data == {"request_id": "no-such-request",
                            "fix": "use the id the request was sent with; it may have been "
                                   "answered already"}
    assert (numbered.code, numbered.message) == (-32004, "no request with id 42 is in flight")
    assert (empty.code, empty.data["path"]) == (-32602, "$.request_id")
    assert missing.code == -32602
    assert "cancel" in hello["features"]


def mcp_initialize(version: str, **extra: Any) -> dict[str, Any]:
    return {"protocolVersion": version, "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}, **extra}


@pytest.mark.parametrize(("asked", "answered"), [
    ("2025-06-18", "2025-06-18"), ("2025-11-25", "2025-11-25"),
    ("2024-11-05", "2025-06-18"), ("2026-07-28", "2025-06-18")])
async def test_initialize_negotiates_the_version(door: Door, asked: str, answered: str) -> None:
    answer = await door.result("initialize",
                               mcp_initialize(asked, _meta={"k": 1}, later_field=2))
    assert answer["protocolVersion"] == answered
    assert answer["capabilities"] == {"tools": {"listChanged": False}}


async def test_discover_ping_and_notifications(door: Door) -> None:
    discover = await door.call(request("server/discover", {}, 0))
    await door.result("initialize", mcp_initialize("2025-06-18"))
    assert await door.call(notification("notifications/initialized")) is None
    assert await door.call(notification("notifications/cancelled", {
        "requestId": 99, "reason": "no such call"})) is None
    pong = await door.call(request("ping", None, "p"))
    assert discover["error"]["code"] == -32601
    assert discover["id"] == 0
    assert pong == {"jsonrpc": "2.0", "id": "p", "result": {}}


async def test_mcp_bind_validates_like_a_native_method(door: Door) -> None:
    typo = await door.call(request("mcp.bind", {"sesion_id": "s"}))
    bad = await door.call(request("mcp.bind", {"session_id": "no spaces"}))
    no_tool = await door.call(request("mcp.bind", {"tools": ["read_result", "context_fold"]}))
    no_set = await door.call(request("mcp.bind", {"tools": "most"}))
    bound = await door.call(request("mcp.bind", {"session_id": "s-1", "project": "/p"}))
    listed = await door.call(request("tools/call", {"name": "context_list_branches"}))
    late = await door.call(request("mcp.bind", {"session_id": "s-2"}))
    assert (typo["error"]["code"], typo["error"]["data"]["path"]) == (-32602, "$")
    assert (bad["error"]["code"], bad["error"]["data"]["path"]) == (-32602, "$.session_id")
    assert (no_tool["error"]["code"], no_tool["error"]["data"]["path"]) == (
        -32602, "$.tools[1]")
    assert (no_set["error"]["code"], no_set["error"]["data"]["path"]) == (-32602, "$.tools")
    assert bound["result"] == {"session_id": "s-1", "project": "/p", "tools": [
        "context_branch", "context_return", "read_result", "memory_search", "compact_context"]}
    assert listed["result"]["structuredContent"]["context_state"]["session_id"] == "s-1"
    assert late["error"] == {"code": -32003,
                             "message": "this connection's MCP session is already open",
                             "data": {"session_id": "s-1",
                                      "fix": "send mcp.bind before the first tools/call"}}


@pytest.mark.parametrize(("params", "code", "path"), [
    ({"strategies": ["squash"]}, -32602, "$.strategies[0]"),
    ({"strategies": []}, -32602, "$.strategies"),
    ({"branch_id": "br_000000000000"}, -32004, None),
])
async def test_compact_params_are_checked(door: Door, params: dict[str, Any], code: int,
                                          path: str | None) -> None:
    session_id = await new_session(door)
    failure = await door.failure("context.compact", {"session_id": session_id, **params})
    assert failure.code == code
    if path is not None:
        assert failure.data["path"] == path


async def test_invalid_branch_params_name_the_field(door: Door) -> None:
    session_id = await new_session(door)
    await door.result("message.append", {"session_id": session_id, "messages": [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "Fix the failing tests. Never edit the migrations."}]})
    base = {"session_id": session_id, "description": "d", "prompt": "p"}
    cases = [({"budget": 32_769}, "$.budget"), ({"budget": 0}, "$.budget"),
             ({"timeout_seconds": 601}, "$.timeout_seconds"),
             ({"timeout_seconds": 0}, "$.timeout_seconds"),
             ({"description": "x" * 501}, "$.description"), ({"description": ""},
                                                              "$.description"),
             ({"parent_branch_id": "br_nothex!!!!!"}, "$.parent_branch_id"),
             ({"budget": 50}, "$.budget"), ({"colour": "red"}, "$")]
    for extra, path in cases:
        failure = await door.failure("branch.create", {**base, **extra})
        assert (failure.code, failure.data["path"]) == (-32602, path), extra
    failure = await door.failure("branch.create", {**base, "budget": 50})
    assert "the branch's opening (its note and prompt) takes" in failure.data["reason"]
    failure = await door.failure("branch.return", {"branch_id": "br_000000000000",
                                                   "message": ""})
    assert (failure.code, failure.data["path"]) == (-32602, "$.message")
    closed = await new_session(door, session_id + "c")
    await door.result("session.close", {"session_id": closed})
    failure = await door.failure("branch.create", {**base, "session_id": closed})
    assert failure.code == -32003


async def test_fork_params_errors(door: Door) -> None:
    failure = await door.failure("context.fork", {"session_id": "nope-never-opened"})
    assert failure.code == -32004
    session_id = await new_session(door)
    failure = await door.failure("context.fork", {"session_id": session_id,
                                                  "char_budget": 1_000})
    assert (failure.code, failure.data["path"]) == (-32602, "$.no_removal_chars")
    assert failure.data["reason"] == (
        "no_removal_chars (120,000) is above char_budget (1,000): a context is never cut "
        "at or under no_removal_chars, and always fits char_budget; lower it, or raise "
        "char_budget")
    failure = await door.failure("context.fork", {"session_id": session_id, "char_budget": 0})
    assert (failure.code, failure.data["path"]) == (-32602, "$.char_budget")
    failure = await door.failure("context.fork", {"session_id": session_id,
                                                  "branch_id": "br_000000000000"})
    assert failure.code == -32004
    failure = await door.failure("context.fork", {"session_id": session_id, "budget": 3})
    assert failure.code == -32602


async def test_invalid_memory_params_name_the_field(door: Door) -> None:
    cases = [("memory.record", {"title": "", "content": "x"}, "$.title"),
             ("memory.record", {"title": "t", "content": "x", "scope": "project x"},
              "$.scope"),
             ("memory.record", {"title": "t", "content": "x", "outcome": "meh"},
              "$.outcome"),
             ("memory.record", {"title": "t", "content": "x", "tags": ["two words"]},
              "$.tags[0]"),
             ("memory.search", {"query": "q", "k": 0}, "$.k"),
             ("memory.search", {"query": "q", "mode": "fuzzy"}, "$.mode"),
             ("memory.search", {"query": "q", "min_confidence": 1.5}, "$.min_confidence"),
             ("memory.search", {"query": ""}, "$.query"),
             ("memory.get", {"id": 0}, "$.id"),
             ("memory.feedback", {"id": 1}, "$"),
             ("memory.list", {"cursor": "abc"}, "$.cursor")]
    for method, params, path in cases:
        failure = await door.failure(method, params)
        assert (failure.code, failure.data["path"]) == (-32602, path), (method, params)


@pytest.mark.parametrize(("params", "path", "reason"), [
    ({"title": " \n\t", "content": "x"}, "$.title", "Expected a text that is not blank"),
    ({"title": "t", "content": "   "}, "$.content", "Expected a text that is not blank"),
    ({"title": "t", "content": "x", "scope": "team:two words"}, "$.scope",
     'Expected "global" or "<project|team|org>:<name>" (a name of 1-128 characters, '
     "no whitespace)"),
    ({"title": "t", "content": "x", "tags": ["two words"]}, "$.tags[0]",
     "Expected one word of 1-64 characters (no whitespace)"),
])
async def test_a_text_that_does_not_match_its_pattern_is_told_what_it_should_be(
        door: Door, params: dict[str, Any], path: str, reason: str) -> None:
    failure = await door.failure("memory.record", params)
    assert (failure.code, failure.message, failure.data) == (
        -32602, f"invalid params: {reason} (at {path})", {"path": path, "reason": reason})


@pytest.mark.parametrize(("params", "path", "reason"), [
    ({}, "$", "give exactly one of session_id and sections"),
    ({"session_id": "s", "sections": [{"name": "a", "content": "b"}]}, "$",
     "give exactly one of session_id and sections"),
    ({"sections": []}, "$.sections", "Expected `array` of length >= 1"),
    ({"sections": [{"name": "", "content": "b"}]}, "$.sections[0].name",
     "Expected 1-64 of A-Z a-z 0-9 . _ - (first alphanumeric)"),
    ({"sections": [{"name": "a b", "content": "b"}]}, "$.sections[0].name",
     "Expected 1-64 of A-Z a-z 0-9 . _ - (first alphanumeric)"),
    ({"sections": [{"name": "a", "content": ""}]}, "$.sections[0].content",
     "Expected `str` of length >= 1"),
    ({"sections": [{"name": "a", "content": "x"}] * 33}, "$.sections",
     "Expected `array` of length <= 32"),
    ({"sections": [{"name": "a", "content": "x"}, {"name": "b", "content": "y"},
                   {"name": "a", "content": "z"}]}, "$.sections[2].name",
     "section name 'a' given twice; names must be unique"),
    ({"sections": [{"name": "a", "content": "x", "cache": True}]}, "$.sections[0]",
     "Object contains unknown field `cache`"),
    ({"sections": [{"name": "a", "content": "x"}], "format": "gemini"}, "$.format",
     "unknown format 'gemini'; one of openai, anthropic"),
])
async def test_bad_prompt_params_are_named(door: Door, params: dict[str, Any], path: str,
                                           reason: str) -> None:
    failure = await door.failure("prompt.build", params)
    assert (failure.code, failure.data["path"], failure.data["reason"]) == (-32602, path,
                                                                            reason)
    if path == "$.format":
        assert failure.data["allowed"] == ["openai", "anthropic"]


async def test_a_prompt_of_an_unknown_session_is_not_found(door: Door) -> None:
    failure = await door.failure("prompt.build", {"session_id": "no-such-session"})
    assert (failure.code, failure.data["session_id"]) == (-32004, "no-such-session")


READ_FILE = {"name": "read_file", "description": "Read a file from the workspace.",
             "input_schema": {"type": "object", "properties": {"path": {"type": "string"}},
                              "required": ["path"]},
             "source": "builtin"}


async def test_bad_tools_params_are_named(door: Door) -> None:
    session_id = await new_session(door)
    failure = await door.failure("tools.register", {"session_id": session_id, "tools": [
        dict(READ_FILE, source="remote")]})
    assert (failure.code, failure.data["path"]) == (-32602, "$.tools[0].source")
    failure = await door.failure("tools.register", {"session_id": session_id,
                                                    "tools": [READ_FILE, READ_FILE]})
    assert (failure.code, failure.data["path"]) == (-32602, "$.tools[1].name")
    assert "given twice" in failure.message
    failure = await door.failure("tools.register", {"session_id": session_id, "tools": []})
    assert (failure.code, failure.data["path"]) == (-32602, "$.tools")
    failure = await door.failure("tools.register", {"session_id": session_id, "tools": [
        {k: v for k, v in READ_FILE.items() if k != "input_schema"}]})
    assert (failure.code, failure.data["path"]) == (-32602, "$.tools[0]")
    failure = await door.failure("tools.search", {"session_id": session_id, "query": "?!"})
    assert (failure.code, failure.data["path"]) == (-32602, "$.query")
    failure = await door.failure("tools.search", {"session_id": "no-such", "query": "x"})
    assert (failure.code, failure.data["session_id"]) == (-32004, "no-such")
    await door.result("session.close", {"session_id": session_id})
    failure = await door.failure("tools.register", {"session_id": session_id,
                                                    "tools": [READ_FILE]})
    assert (failure.code, failure.data["state"]) == (-32003, "closed")


# ---- docs/architecture.md shows the table ----------------------------------------------

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def table_rows() -> list[str]:
    """The route table as docs/architecture.md shows it, one line a route."""
    rows = []
    for route in ROUTES:
        op = route.op
        where = f"{op.__module__.removeprefix('ctxd.')}.{op.__qualname__}"
        rows.append(" | ".join([
            f"| {_code(route.method)}", _code(route.params.__name__), route.on.name.lower(),
            _code(where), "yes" if route.inline else "",
            ", ".join(_code(tool) for tool in route.mcp),
            ", ".join(_code(command) for command in route.ctxctl)]) + " |")
    return rows


def test_the_architecture_shows_the_route_table() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    shown = [line for line in text.split("\n## Routes\n", 1)[1].split("\n## ", 1)[0]
             .splitlines() if line.startswith("| `")]
    assert shown == table_rows()

"""What ``ctxctl mcp`` keeps of an MCP session across connections (`ctxclient._mcp.Link`):
the requests in flight and how they are answered when the daemon goes away, the binding
and the handshake it repeats (docs/protocol.md, "MCP")."""

from __future__ import annotations

import json
import socket
import tempfile
import threading
from typing import Any

import pytest

from ctxclient._mcp import REINITIALIZE_ID, Link, PumpError


def line(message: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **message}).encode()


INITIALIZE = {"id": 0, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "t", "version": "1"}}}


def test_the_calls_in_flight_are_answered_when_the_daemon_goes_away() -> None:
    link = Link("/run/ctxd.sock", "s1", None)
    for message in (INITIALIZE, {"method": "notifications/initialized"},
                    {"id": 1, "method": "tools/call", "params": {"name": "memory_search"}},
                    {"id": "two", "method": "tools/call", "params": {"name": "compact_context"}},
                    {"id": 3, "method": "tools/list"},
                    {"method": "notifications/cancelled", "params": {"requestId": "two"}}):
        link.from_client(line(message))
    assert link.from_daemon(line({"id": 0, "result": {"protocolVersion": "2025-06-18"}}))
    assert (link.initialize, link.initialized) == ({"jsonrpc": "2.0", **INITIALIZE}, True)
    # The cancelled call goes unanswered (as the daemon leaves it); the others are answered.
    assert [json.loads(answer) for answer in link.lost().splitlines()] == [
        {"jsonrpc": "2.0", "id": 1, "result": {
            "content": [{"type": "text", "text": "ctxd stopped; retrying"}], "isError": True}},
        {"jsonrpc": "2.0", "id": 3,
         "error": {"code": -32007, "message": "ctxd stopped; retrying"}}]
    assert link.lost() == b""


def test_the_session_the_daemon_made_is_learnt_and_the_repeated_handshake_is_not_passed_on(
        ) -> None:
    link = Link("/run/ctxd.sock", None, "/work/p")
    link.from_client(line({"id": 7, "method": "tools/call",
                           "params": {"name": "context_list_branches"}}))
    assert link.from_daemon(line({"id": 7, "result": {
        "content": [], "isError": False,
        "structuredContent": {"branches": [], "context_state": {"session_id": "ses_made"}}}}))
    assert (link.session_id, link.in_flight) == ("ses_made", {})
    assert link.from_daemon(line({"id": REINITIALIZE_ID, "result": {}})) is False
    # Notifications and lines that are not JSON pass on untouched.
    assert link.from_daemon(line({"method": "notifications/progress", "params": {}}))
    assert link.from_daemon(b"not json")


def test_a_call_that_names_its_session_does_not_teach_the_connections() -> None:
    """OpenCode's calls name their conversation's session (`_meta`, in the params or the
    arguments): their answers' session is not the one the pump binds again."""
    link = Link("/run/ctxd.sock", None, None)
    named = [{"name": "read_result", "arguments": {
                 "ref_id": "res_1", "_meta": {"ctxd/session_id": "ses_a"}}},
             {"name": "read_result", "_meta": {"ctxd/session_id": "ses_b"},
              "arguments": {"ref_id": "res_1"}}]
    for request_id, params in enumerate(named):
        link.from_client(line({"id": request_id, "method": "tools/call", "params": params}))
    link.from_client(line({"id": 9, "method": "tools/call", "params": {
        "name": "read_result", "arguments": {"ref_id": "res_1", "_meta": {"other": 1}}}}))
    assert link.named == {0, 1}
    for request_id, session in ((0, "ses_a"), (1, "ses_b")):
        assert link.from_daemon(line({"id": request_id, "result": {"structuredContent": {
            "context_state": {"session_id": session}}}}))
    assert (link.session_id, link.named, link.in_flight) == (None, set(), {9: "tools/call"})
    assert link.from_daemon(line({"id": 9, "result": {"structuredContent": {
        "context_state": {"session_id": "ses_own"}}}}))
    assert link.session_id == "ses_own"


@pytest.mark.parametrize(("answer", "retried"), [
    (None, True),  # accepted, then closed before answering (a daemon going down)
    ({"id": None, "error": {"code": -32007, "message": "overloaded: too many connections; "
                            "retry later"}}, True),
    ({"id": "ctxctl-mcp-bind", "error": {"code": -32602, "message": "invalid params"}}, False),
])
def test_a_reconnection_tries_again_unless_the_binding_is_refused(
        answer: dict[str, Any] | None, retried: bool) -> None:
    # Regression: a pump reconnecting to a daemon that was full or stopping exited 1.
    with tempfile.TemporaryDirectory(prefix="ctxd-t") as root, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        path = f"{root}/ctxd.sock"
        listener.bind(path)
        listener.listen(1)

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.makefile("rb").readline()  # the binding
                if answer is not None:
                    conn.sendall(line(answer) + b"\n")

        server = threading.Thread(target=serve)
        server.start()
        link = Link(path, "s1", None)
        try:
            if retried:
                assert link.reconnect() is None
            else:
                with pytest.raises(PumpError, match="refused the MCP session binding: invalid"):
                    link.reconnect()
        finally:
            server.join()

"""A fork's work stays off the event loop and is bounded (docs/protocol.md, "context.fork"):
the budgets' limit, and other connections answered while a large fork runs."""

from __future__ import annotations

import json
import select
import socket
from typing import Any

from conftest import DaemonProcess
from tests_support import rpc_error


def test_a_budget_over_the_limit_says_the_limit(shared_daemon: DaemonProcess,
                                                sid: str) -> None:
    with shared_daemon.client() as client:
        client.call("session.open", {"session_id": sid})
        for field in ("char_budget", "no_removal_chars"):
            error = rpc_error(client, "context.fork", {"session_id": sid, field: 2_000_001})
            assert (error.code, error.message, error.data["path"]) == (
                -32602, f"invalid params: Expected `int` <= 2000000 (at $.{field})",
                f"$.{field}")
        done = client.call("context.fork", {"session_id": sid, "char_budget": 2_000_000,
                                            "no_removal_chars": 2_000_000})
        assert done["stats"]["final_count"] == 0


class Line:
    """One raw connection: a request out, one decoded answer per line in."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.settimeout(120)
        self.buffer = b""

    def send(self, request_id: int, method: str, params: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method,
                                      "params": params}).encode() + b"\n")

    def answered(self) -> bool:
        """Whether an answer has arrived (without waiting)."""
        return b"\n" in self.buffer or bool(select.select([self.sock], [], [], 0)[0])

    def read(self) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(1 << 20)
            assert chunk
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        self.sock.close()


def test_other_connections_are_answered_while_a_large_fork_runs(
        shared_daemon: DaemonProcess, sid: str) -> None:
    # Five results of 2,000,000 characters, offloaded: their rows count their stubs' tokens,
    # so only the loaded originals show the fork's size.
    with shared_daemon.client(timeout=300) as client:
        client.call("session.open", {"session_id": sid, "budget": {
            "context_window": 10_000_000}})
        client.call("message.append", {"session_id": sid, "messages": [
            {"role": "user", "content": "go"}]})
        for index in range(5):
            client.call("message.append", {"session_id": sid, "allow_over": True, "messages": [
                {"role": "assistant", "content": [{"type": "tool_use", "id": f"c{index}",
                                                   "name": "read", "input": {}}]},
                {"role": "tool", "name": "read", "tool_call_id": f"c{index}",
                 "content": f"lorem ipsum dolor sit amet {index} " * 66_667}]})
        assert client.call("session.get", {"session_id": sid})[
            "context_state"]["total_tokens"] < 4_000 * 5
        client.call("session.open", {"session_id": sid + "-other"})
    forking, other = Line(str(shared_daemon.socket)), Line(str(shared_daemon.socket))
    try:
        forking.send(1, "context.fork", {"session_id": sid, "char_budget": 2_000_000,
                                         "no_removal_chars": 2_000_000})
        # Queued in the store's thread behind the fork's read: answered once the fork's
        # work has started, and, that work being off the loop, before the fork.
        other.send(2, "message.list", {"session_id": sid + "-other"})
        other.send(3, "daemon.ping", {})
        answers = [other.read(), other.read()]
        assert sorted(answer["id"] for answer in answers) == [2, 3]
        assert not forking.answered()
        done = forking.read()["result"]
        # Of 10,000,000 characters, the newest result (1,933,343), its call and the request.
        assert (done["stats"]["total_chars"], done["stats"]["final_count"]) == (1_933_405, 3)
    finally:
        forking.close()
        other.close()

"""A mock OpenAI-compatible chat-completions server on 127.0.0.1: the model of the HTTP
summarizer's tests and of the agents driven end to end (OpenCode)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from local_http import LocalServer, ScriptedHandler, SeenRequest

__all__ = ["USAGE", "ChatServer", "SeenRequest", "ToolCall", "Turn"]

@dataclass(frozen=True)
class ToolCall:
    """A scripted turn in which the model calls ``name`` with ``arguments``."""

    name: str
    arguments: dict[str, Any]
    call_id: str = "call_1"
    usage: dict[str, int] | None = None
    """The usage this answer reports (default `USAGE`)."""


Turn = str | ToolCall | Callable[[dict[str, Any]], str | ToolCall]
"""A scripted answer, or what makes it from the request's body (a call whose arguments
come from what the model was sent: a ref_id in a stub)."""

USAGE = {"prompt_tokens": 1200, "completion_tokens": 34, "total_tokens": 1234}
"""The usage every streamed answer reports."""


class ChatServer(LocalServer):
    """``POST /v1/chat/completions`` on 127.0.0.1, in a thread.

    A plain request is answered ``summary`` as ``choices[0].message.content``, or, by
    ``failure``, HTTP 500 (``"status"``), a body that is not JSON (``"bad-json"``), JSON
    without choices (``"no-choices"``); ``delay_s`` delays every answer.

    A request that offers tools gets the next of ``turns`` (a text, a `ToolCall`, or a
    function of the request's body that returns one; ``"done"`` once they run out), as
    server-sent events when it is streamed (``"stream": true``); a streamed one without
    tools (an agent's title or summary request) gets ``summary``.
    Every streamed answer ends with `USAGE` (a `ToolCall`'s own ``usage`` when it has one).
    """

    def __init__(self) -> None:
        self.summary = "  The user wants a --json flag.  "
        self.failure: str | None = None
        self.delay_s = 0.0
        self.requests: list[SeenRequest] = []
        self.turns: list[Turn] = []
        server = self

        class Handler(ScriptedHandler):
            def do_POST(self) -> None:
                body = self.read_json(server.requests)
                time.sleep(server.delay_s)
                if self.path != "/v1/chat/completions":
                    self.answer(404, b'{"error": "not found"}')
                elif server.failure == "status":
                    self.answer(500, b'{"error": "model crashed"}')
                elif server.failure == "bad-json":
                    self.answer(200, b"<html>not json</html>")
                elif server.failure == "no-choices":
                    self.answer(200, b'{"choices": []}')
                elif body.get("stream"):
                    turn = (server.turns.pop(0) if server.turns else "done") \
                        if body.get("tools") else server.summary.strip()
                    if callable(turn):
                        turn = turn(body)
                    self.stream(body["model"], turn)
                elif body.get("tools"):
                    turn = server.turns.pop(0) if server.turns else "done"
                    self.complete(body["model"], turn(body) if callable(turn) else turn)
                else:
                    self.answer(200, json.dumps({
                        "id": "chatcmpl-1", "object": "chat.completion",
                        "model": body["model"],
                        "choices": [{"index": 0, "finish_reason": "stop", "message": {
                            "role": "assistant", "content": server.summary}}]}).encode())

            def complete(self, model: str, turn: str | ToolCall) -> None:
                """A plain answer (not streamed) to a request that offers tools."""
                message: dict[str, Any] = {"role": "assistant", "content": turn}
                finish, usage = "stop", USAGE
                if isinstance(turn, ToolCall):
                    message = {"role": "assistant", "content": None, "tool_calls": [{
                        "id": turn.call_id, "type": "function",
                        "function": {"name": turn.name,
                                     "arguments": json.dumps(turn.arguments)}}]}
                    finish, usage = "tool_calls", turn.usage or USAGE
                self.answer(200, json.dumps({
                    "id": f"chatcmpl-{len(server.requests)}", "object": "chat.completion",
                    "created": 1, "model": model, "usage": usage,
                    "choices": [{"index": 0, "finish_reason": finish,
                                 "message": message}]}).encode())

            def stream(self, model: str, turn: str | ToolCall) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk",
                         "created": 1, "model": model}
                if isinstance(turn, ToolCall):
                    delta: dict[str, Any] = {"role": "assistant", "tool_calls": [{
                        "index": 0, "id": turn.call_id, "type": "function",
                        "function": {"name": turn.name,
                                     "arguments": json.dumps(turn.arguments)}}]}
                    finish = "tool_calls"
                    usage = turn.usage or USAGE
                else:
                    delta, finish = {"role": "assistant", "content": turn}, "stop"
                    usage = USAGE
                events = [{**chunk, "choices": [{"index": 0, "delta": delta,
                                                 "finish_reason": None}]},
                          {**chunk, "choices": [{"index": 0, "delta": {},
                                                 "finish_reason": finish}], "usage": usage}]
                try:
                    for event in events:
                        self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                    self.wfile.write(b"data: [DONE]\n\n")
                except OSError:
                    pass

        super().__init__(Handler, "/v1")

"""A scripted Anthropic Messages API on 127.0.0.1 for running real agent CLIs (Claude Code)
hermetically: the model is the only thing the end-to-end tests replace.

The main loop's requests (those that offer tools) get the scripted turns in order; side
requests (titles, quota probes, summaries: no tools) get a short text; ``count_tokens``
gets an estimate. Every request is recorded (path and parsed body) for the test to inspect.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

from local_http import LocalServer, ScriptedHandler

from ctxd.cost import CacheUsage, PromptCache

Block = dict[str, Any]
Turn = list[Block] | Callable[[dict[str, Any]], list[Block]]
"""One model turn: its content blocks (``text`` and ``tool_use``), or a function of the
request that returns them."""


def text(value: str) -> Block:
    return {"type": "text", "text": value}


def tool_use(tool_id: str, name: str, tool_input: dict[str, Any]) -> Block:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": tool_input}


def tool_results(body: dict[str, Any], call_id: str) -> list[str]:
    """The text of each tool_result for ``call_id`` in a request the model received."""
    found = []
    for message in body["messages"]:
        if message["role"] != "user" or not isinstance(message["content"], list):
            continue
        for block in message["content"]:
            if block.get("type") == "tool_result" and block["tool_use_id"] == call_id:
                content = block["content"]
                found.append(content if isinstance(content, str) else "".join(
                    part.get("text", "") for part in content))
    return found


class MockAnthropic(LocalServer):
    """The server: ``url`` for ``ANTHROPIC_BASE_URL``; ``requests`` as received."""

    def __init__(self, turns: list[Turn], final: str = "Done.",
                 cache: PromptCache | None = None):
        self.turns = list(turns)
        self.final = final
        self.cache = cache
        """Prices the main loop's requests as Anthropic's prompt cache would (their
        ``usage``; `charged` keeps each); None: a rough ``input_tokens`` and no cache."""
        self.charged: list[CacheUsage] = []
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        super().__init__(self._handler())

    def main_requests(self) -> list[dict[str, Any]]:
        """The bodies of the main loop's ``/v1/messages`` requests, in order."""
        return [body for path, body in self.requests
                if path.startswith("/v1/messages") and "count_tokens" not in path
                and body.get("tools")]

    def _next_turn(self, body: dict[str, Any]) -> list[Block]:
        with self.lock:
            turn = self.turns.pop(0) if self.turns else [text(self.final)]
        return turn(body) if callable(turn) else turn

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        mock = self

        class Handler(ScriptedHandler):
            protocol_version = "HTTP/1.1"

            def do_HEAD(self) -> None:
                self._json(200, {})

            def do_GET(self) -> None:
                self._json(200, {"data": [], "has_more": False})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"raw": raw.decode(errors="replace")}
                with mock.lock:
                    mock.requests.append((self.path, body))
                if "count_tokens" in self.path:
                    self._json(200, {"input_tokens": max(1, len(raw) // 4)})
                    return
                if not self.path.startswith("/v1/messages"):
                    self._json(200, {})
                    return
                blocks = mock._next_turn(body) if body.get("tools") else [text("ok")]
                usage = mock._usage(body)
                if body.get("stream"):
                    self._stream(body, blocks, usage)
                else:
                    self._json(200, message(body, blocks, usage))

            def _json(self, status: int, payload: Any) -> None:
                self.answer(status, json.dumps(payload).encode())

            def _stream(self, body: dict[str, Any], blocks: list[Block],
                        usage: dict[str, int]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")
                self.end_headers()
                for name, data in events(body, blocks, usage):
                    self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                    self.wfile.flush()
                self.close_connection = True

        return Handler

    def _usage(self, body: dict[str, Any]) -> dict[str, int]:
        """The input side of a request's ``usage``."""
        if self.cache is None or not body.get("tools"):
            return {"input_tokens": max(1, len(json.dumps(body)) // 4),
                    "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        charged = self.cache.charge(body)
        with self.lock:
            self.charged.append(charged)
        return charged.as_anthropic()


def _stop_reason(blocks: list[Block]) -> str:
    return "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"


_ids = iter(range(1, 1 << 30))


def message(body: dict[str, Any], blocks: list[Block], usage: dict[str, int]
            ) -> dict[str, Any]:
    """A whole (non-streamed) message."""
    return {"id": f"msg_mock{next(_ids):06d}", "type": "message", "role": "assistant",
            "model": body.get("model", "claude-mock"), "content": blocks,
            "stop_reason": _stop_reason(blocks), "stop_sequence": None,
            "usage": {**usage, "output_tokens": 10}}


def events(body: dict[str, Any], blocks: list[Block], usage: dict[str, int]
           ) -> Iterator[tuple[str, dict[str, Any]]]:
    """The server-sent events of a streamed message: message_start, then per block
    content_block_start/delta/stop, message_delta and message_stop."""
    start = message(body, [], usage)
    start["stop_reason"] = None
    start["usage"]["output_tokens"] = 1
    yield "message_start", {"type": "message_start", "message": start}
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            yield "content_block_start", {"type": "content_block_start", "index": index,
                                          "content_block": {"type": "text", "text": ""}}
            delta: dict[str, Any] = {"type": "text_delta", "text": block["text"]}
        elif block["type"] == "thinking":
            yield "content_block_start", {"type": "content_block_start", "index": index,
                                          "content_block": {"type": "thinking", "thinking": "",
                                                            "signature": ""}}
            yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                          "delta": {"type": "thinking_delta",
                                                    "thinking": block["thinking"]}}
            delta = {"type": "signature_delta", "signature": block["signature"]}
        else:
            yield "content_block_start", {"type": "content_block_start", "index": index,
                                          "content_block": {**block, "input": {}}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                      "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield "message_delta", {"type": "message_delta",
                            "delta": {"stop_reason": _stop_reason(blocks),
                                      "stop_sequence": None},
                            "usage": {"output_tokens": 10}}
    yield "message_stop", {"type": "message_stop"}

"""A scripted model provider for the gateway's tests (on tests/local_http.py): answers the
Anthropic Messages and OpenAI Chat Completions APIs, JSON or server-sent events, records
every request as it arrived, and plays scripted failures (an error status, a stream cut
off, a stream held open until released)."""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from local_http import LocalServer, ScriptedHandler

USAGE = {"input_tokens": 21, "output_tokens": 7, "cache_read_input_tokens": 5,
         "cache_creation_input_tokens": 3}
OPENAI_USAGE = {"prompt_tokens": 30, "completion_tokens": 9,
                "prompt_tokens_details": {"cached_tokens": 12}}
REPLY_TEXT = "hello from the model"


@dataclass(frozen=True)
class Received:
    """A request as the upstream received it (header names in lower case)."""

    method: str
    path: str
    headers: dict[str, str]
    raw_headers: list[tuple[str, str]]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Failure:
    """The next answer: ``status`` with ``body``; or (``cut_after`` events) a stream that
    stops without its end."""

    status: int = 200
    body: bytes = b""
    cut_after: int | None = None


@dataclass
class Script:
    received: list[Received] = field(default_factory=list)
    failures: deque[Failure] = field(default_factory=deque)
    response_id: str = "msg_01"
    hold: threading.Event | None = None
    """When set, each stream waits for it after its first event."""
    hold_answer: threading.Event | None = None
    """When set, each POST waits for it before it answers at all."""
    holding: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    """Released once by each answer that waits on `hold` or `hold_answer`."""
    lock: threading.Lock = field(default_factory=threading.Lock)


def anthropic_message(response_id: str, model: str) -> dict[str, Any]:
    return {"id": response_id, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": REPLY_TEXT}], "stop_reason": "end_turn",
            "stop_sequence": None, "usage": USAGE}


def anthropic_events(response_id: str, model: str) -> list[tuple[str, dict[str, Any]]]:
    start = {**anthropic_message(response_id, model), "content": [],
             "stop_reason": None, "usage": {**USAGE, "output_tokens": 1}}
    return [
        ("message_start", {"type": "message_start", "message": start}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": "hello "}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": "from the model"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta",
                           "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"output_tokens": USAGE["output_tokens"]}}),
        ("message_stop", {"type": "message_stop"}),
    ]


def openai_completion(response_id: str, model: str) -> dict[str, Any]:
    return {"id": response_id, "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": REPLY_TEXT}}],
            "usage": {**OPENAI_USAGE, "total_tokens": 39}}


def openai_chunks(response_id: str, model: str, usage: bool) -> list[dict[str, Any]]:
    base = {"id": response_id, "object": "chat.completion.chunk", "created": 1,
            "model": model}
    chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                          "content": "hello "},
                                    "finish_reason": None}]},
              {**base, "choices": [{"index": 0, "delta": {"content": "from the model"},
                                    "finish_reason": "stop"}]}]
    if usage:
        chunks.append({**base, "choices": [], "usage": {**OPENAI_USAGE, "total_tokens": 39}})
    return chunks


class ModelUpstream(LocalServer):
    """The provider, on a free port of 127.0.0.1, while in a ``with`` block."""

    def __init__(self) -> None:
        self.script = Script()
        script = self.script

        class Handler(ScriptedHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # Headers and body leave in two writes: without this, each answer waits
                # for the client's delayed ACK (40 ms), which would swamp what the
                # gateway adds.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_GET(self) -> None:
                self.take(b"")
                self.answer(200, json.dumps({"data": [], "path": self.path}).encode())

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                self.take(body)
                with script.lock:
                    failure = script.failures.popleft() if script.failures else None
                if script.hold_answer is not None:
                    script.holding.release()
                    script.hold_answer.wait(60)
                if failure is not None and failure.cut_after is None:
                    self.answer(failure.status, failure.body)
                    return
                request = json.loads(body)
                model = request.get("model", "")
                if self.path.endswith("/count_tokens"):
                    self.answer(200, json.dumps({"input_tokens": 42}).encode())
                elif not request.get("stream"):
                    reply = (openai_completion if "chat" in self.path
                             else anthropic_message)(script.response_id, model)
                    self.answer(200, json.dumps(reply).encode())
                else:
                    cut = failure.cut_after if failure else None
                    self.stream(self.events(request, model), cut)

            def take(self, body: bytes) -> None:
                raw = [(name, value) for name, value in self.headers.items()]
                with script.lock:
                    script.received.append(Received(
                        self.command, self.path, {n.lower(): v for n, v in raw}, raw, body))

            def events(self, request: dict[str, Any], model: str) -> list[bytes]:
                if "chat" in self.path:
                    usage = bool((request.get("stream_options") or {}).get("include_usage"))
                    return [f"data: {json.dumps(chunk)}\n\n".encode()
                            for chunk in openai_chunks(script.response_id, model, usage)
                            ] + [b"data: [DONE]\n\n"]
                return [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
                        for name, data in anthropic_events(script.response_id, model)]

            def stream(self, events: list[bytes], cut_after: int | None) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for index, event in enumerate(events):
                    if index == cut_after:
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        self.close_connection = True
                        return
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                    self.wfile.flush()
                    if index == 0 and script.hold is not None:
                        script.holding.release()
                        script.hold.wait(60)
                self.wfile.write(b"0\r\n\r\n")

        super().__init__(Handler)
        # Room for every stream of the concurrency test at once (socketserver's backlog
        # is 5: connections past it wait for SYN retries, seconds each).
        self._http.socket.listen(128)
        report = self._http.handle_error

        def handle_error(request: Any, client_address: Any) -> None:
            # A client that goes away (a cut or cancelled stream) is the script; any other
            # failure of a handler is reported.
            if not isinstance(sys.exc_info()[1], OSError):
                report(request, client_address)

        self._http.handle_error = handle_error  # type: ignore[method-assign]

    @property
    def received(self) -> list[Received]:
        return self.script.received

"""HTTP/1.1 on a trio stream with h11: reading a request's events, sending an answer, and
relaying an upstream answer back as it arrives (the gateway's connections)."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import h11
import msgspec
import trio

from ctxd.gateway._upstream import response_headers
from ctxd.gateway._usage import ProviderUsage, UsageReader

if TYPE_CHECKING:
    import httpx2

log = logging.getLogger("ctxd.gateway")

RECEIVE_BYTES = 64 * 1024


def error_body(kind: str, message: str) -> bytes:
    """An error as Anthropic's API writes it (OpenAI's clients read its ``error`` too)."""
    return msgspec.json.encode({"type": "error", "error": {"type": kind, "message": message}})


@dataclass
class Answer(Exception):
    """A request the gateway answers itself (a refusal), with this status and body."""

    status: int
    body: bytes
    close: bool = False


class Relay:
    """One upstream answer on its way back to the agent: what of it was sent, its usage."""

    def __init__(self, stream: trio.SocketStream, connection: h11.Connection,
                 counted: bool) -> None:
        self._stream = stream
        self._connection = connection
        self._counted = counted
        self._reader: UsageReader | None = None
        self._event_stream = False
        self._sized = False
        self.status = 0

    async def run(self, response: httpx2.Response) -> bool:
        """Stream ``response`` back as it arrives, reading its usage on the way; whether
        the answer was sent whole."""
        import httpx2  # loaded already, by the client that got ``response``

        headers = response_headers(list(response.headers.raw))
        self.status = response.status_code
        self._event_stream = response.headers.get("content-type", "").startswith(
            "text/event-stream")
        self._sized = any(name.lower() == b"content-length" for name, _ in headers)
        self._reader = UsageReader(streaming=self._event_stream)
        await send(self._stream, self._connection, h11.Response(
            status_code=response.status_code, headers=headers,
            reason=response.reason_phrase.encode()))
        # Closed here, in this run, however the loop ends (the agent gone, a cancel, an
        # upstream error): left to the garbage collector, the client's stream generators
        # would be finalized whenever a cycle is collected, perhaps after the run.
        chunks = response.aiter_raw()
        try:
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    await send(self._stream, self._connection, h11.Data(data=chunk))
                    if self._counted:
                        self._reader.feed(chunk)
        except httpx2.HTTPError as exc:
            log.warning("gateway: the upstream broke off an answer: %s", type(exc).__name__)
            return await self.end_early(502, "api_error", "ctxd gateway: the upstream "
                                        "connection was lost mid-stream")
        await send(self._stream, self._connection, h11.EndOfMessage())
        return True

    async def end_early(self, status: int, kind: str, message: str) -> bool:
        """End the answer where the call stopped: an error answer when nothing was sent
        yet, an error event ending an event stream; else False (only closing the
        connection can say it)."""
        if self._connection.our_state is h11.SEND_RESPONSE:
            await send_answer(self._stream, self._connection,
                               Answer(status, error_body(kind, message)))
            return True
        if self._event_stream and not self._sized:
            event = b"event: error\ndata: " + error_body(kind, message) + b"\n\n"
            await send(self._stream, self._connection, h11.Data(data=event))
            await send(self._stream, self._connection, h11.EndOfMessage())
            return True
        return False

    def usage(self) -> ProviderUsage:
        """The usage read of the answer (what was, when it ended early)."""
        return self._reader.finish() if self._reader is not None else ProviderUsage()


async def receive(stream: trio.SocketStream, connection: h11.Connection,
                  max_bytes: int = RECEIVE_BYTES) -> Any:
    """The next h11 event of the request, reading at most ``max_bytes`` at a time."""
    while True:
        event = connection.next_event()
        if event is not h11.NEED_DATA:
            return event
        connection.receive_data(await stream.receive_some(max_bytes))


async def send(stream: trio.SocketStream, connection: h11.Connection, event: Any) -> None:
    data = connection.send(event)
    if data:
        await stream.send_all(data)


async def send_answer(stream: trio.SocketStream, connection: h11.Connection,
                       answer: Answer) -> None:
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(answer.body)).encode())]
    if answer.close:
        headers.append((b"connection", b"close"))
    await send(stream, connection, h11.Response(status_code=answer.status, headers=headers))
    await send(stream, connection, h11.Data(data=answer.body))
    await send(stream, connection, h11.EndOfMessage())

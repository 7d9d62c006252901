"""The trio client: one reader task matches answers to callers by id (pipelining-safe)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import trio

from ctxclient._codec import encode
from ctxclient._errors import DaemonUnavailable, check_server, check_socket_path, outcome
from ctxd.paths import default_socket_path

_decode = msgspec.json.decode


class AsyncClient:
    """A trio connection to ctxd; make one with `connect`."""

    def __init__(self, stream: trio.SocketStream, path: str):
        self.path = path
        self._stream = stream
        self._send_lock = trio.Lock()
        self._pending: dict[str, trio.MemorySendChannel[dict[str, Any]]] = {}
        self._notify_send, self.notifications = trio.open_memory_channel[dict[str, Any]](1024)

    async def call(self, method: str, params: dict[str, Any] | None = None,
                   request_id: str | None = None) -> Any:
        """Call a method and wait for its result.

        Args:
            request_id: the request's id (default: a new UUID); `cancel` takes it.

        Raises:
            RpcError: the daemon answered with an error (`Cancelled` once cancelled).
            DaemonUnavailable: the connection was lost.
        """
        # Unique string ids: any connection may name this request to cancel it.
        request_id = request_id or str(uuid.uuid4())
        if request_id in self._pending:
            raise ValueError(f"request id {request_id!r} is already in flight")
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        self._pending[request_id] = send
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        try:
            await self.send_raw(encode(message))
            try:
                answer = await receive.receive()
            except trio.EndOfChannel:
                raise DaemonUnavailable(self.path, "connection closed") from None
        finally:
            self._pending.pop(request_id, None)
        return outcome(answer)

    async def cancel(self, request_id: str, reason: str | None = None) -> Any:
        """Cancel the requests in flight with this id, from this or any other connection
        (request.cancel): how many were cancelled.

        Raises:
            NotFound: no request with this id is in flight.
        """
        params: dict[str, Any] = {"request_id": request_id}
        if reason is not None:
            params["reason"] = reason
        return await self.call("request.cancel", params)

    async def send_raw(self, line: bytes) -> None:
        """Send one line as is (a newline is added)."""
        async with self._send_lock:
            try:
                await self._stream.send_all(line + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise DaemonUnavailable(self.path, str(exc)) from None

    async def _read_loop(self) -> None:
        buffer = bytearray()
        try:
            while True:
                data = await self._stream.receive_some(256 * 1024)
                if not data:
                    break
                buffer += data
                while (newline := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:newline])
                    del buffer[:newline + 1]
                    message = _decode(line)
                    for item in message if isinstance(message, list) else [message]:
                        self._deliver(item)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except (ValueError, AttributeError, TypeError):
            # Not ctxd's protocol (a line that is no JSON, an answer that is no object):
            # the connection ends, and waiting callers get DaemonUnavailable.
            pass
        finally:
            for send in self._pending.values():
                send.close()
            self._notify_send.close()

    def _deliver(self, item: dict[str, Any]) -> None:
        if item.get("id") is not None:
            send = self._pending.get(item["id"])
        elif "error" in item and len(self._pending) == 1:
            # A line the daemon could not read: the one request outstanding
            # (docs/protocol.md, "Framing").
            [send] = self._pending.values()
        else:
            send = None
        if send is None:
            try:
                self._notify_send.send_nowait(item)
            except trio.WouldBlock:
                pass  # a client that never reads notifications loses the newest ones
            return
        with contextlib.suppress(trio.WouldBlock):  # a second answer to one id is ignored
            send.send_nowait(item)


@asynccontextmanager
async def connect(path: str | os.PathLike[str] | None = None) -> AsyncIterator[AsyncClient]:
    """Open an `AsyncClient`; the connection closes when the block ends.

    Raises:
        DaemonUnavailable: nothing listens on the socket (`UntrustedSocket`: it is not the
            user's own ctxd's, and nothing was sent).
    """
    where = str(path or default_socket_path())
    check_socket_path(where)
    try:
        stream = await trio.open_unix_socket(where)
    except OSError as exc:
        raise DaemonUnavailable(where, exc.strerror or str(exc)) from None
    try:
        check_server(stream.socket, where)
    except DaemonUnavailable:
        await trio.aclose_forcefully(stream)
        raise
    client = AsyncClient(stream, where)
    # The stream is closed after the nursery: closing it inside the cancelled nursery
    # would raise Cancelled there and hide whatever the caller's block raised.
    try:
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(client._read_loop)
            try:
                yield client
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The reader never raises (it ends the connection instead), so only the caller's
        # block can have failed: give its exception back as raised, not wrapped.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise

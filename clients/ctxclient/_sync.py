"""The blocking client: thread-safe, pipelined (many calls in flight on one connection)."""

from __future__ import annotations

import os
import queue
import socket
import threading
import uuid
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

import msgspec

from ctxclient._codec import encode
from ctxclient._errors import DaemonUnavailable, check_server, check_socket_path, outcome
from ctxd.paths import default_socket_path

_decode = msgspec.json.decode


class Client:
    """A connection to ctxd.

    Args:
        path: the socket (default: ``$CTXD_SOCKET``, else the daemon's default).
        timeout: seconds a `call` waits for its answer (None: forever).

    Raises:
        DaemonUnavailable: nothing listens on the socket (`BadSocketPath`: nothing could,
            the path is too long or not a socket; `UntrustedSocket`: it is not the user's
            own ctxd's, and nothing was sent).
    """

    def __init__(self, path: str | os.PathLike[str] | None = None,
                 timeout: float | None = 60.0):
        self.path = str(path or default_socket_path())
        self.timeout = timeout
        check_socket_path(self.path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(self.path)
            check_server(self._sock, self.path)
        except OSError as exc:
            self._sock.close()
            if isinstance(exc, DaemonUnavailable):
                raise
            raise DaemonUnavailable(self.path, exc.strerror or str(exc)) from None
        self._send_lock = threading.Lock()
        self._pending: dict[str, Future[Any]] = {}
        self._pending_lock = threading.Lock()
        self.notifications: queue.Queue[dict[str, Any]] = queue.Queue()
        self._reader = threading.Thread(target=self._read_loop, name="ctxclient-reader",
                                        daemon=True)
        self._reader.start()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connected(self) -> bool:
        """Whether the connection is still up (the daemon has not gone away)."""
        return self._reader.is_alive()

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._reader is not threading.current_thread():
            self._reader.join(5)
        self._sock.close()

    def call(self, method: str, params: dict[str, Any] | None = None,
             timeout: float | None = None, request_id: str | None = None) -> Any:
        """Call a method and wait for its result.

        Args:
            request_id: the request's id (default: a new UUID); `cancel` takes it.

        Raises:
            RpcError: the daemon answered with an error (`Cancelled` once cancelled).
            DaemonUnavailable: the connection was lost.
        """
        return self.submit(method, params, request_id).result(
            self.timeout if timeout is None else timeout)

    def submit(self, method: str, params: dict[str, Any] | None = None,
               request_id: str | None = None) -> Future[Any]:
        """Send a request without waiting; the future resolves to its result.

        Args:
            request_id: the request's id (default: a new UUID); `cancel` takes it.
        """
        request_id, future = self._register(request_id)
        self.send_raw(encode(_request(request_id, method, params)))
        return future

    def cancel(self, request_id: str, reason: str | None = None) -> Any:
        """Cancel the requests in flight with this id, from this or any other connection
        (request.cancel): how many were cancelled.

        Raises:
            NotFound: no request with this id is in flight.
        """
        params: dict[str, Any] = {"request_id": request_id}
        if reason is not None:
            params["reason"] = reason
        return self.call("request.cancel", params)

    def batch(self, calls: Iterable[tuple[str, dict[str, Any] | None]]) -> list[Future[Any]]:
        """Send calls as one JSON-RPC batch; one future per call, in order."""
        registered = [(*self._register(), method, params) for method, params in calls]
        self.send_raw(encode([_request(i, m, p) for i, _, m, p in registered]))
        return [future for _, future, _, _ in registered]

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        """Send a notification (no answer comes back)."""
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.send_raw(encode(message))

    def send_raw(self, line: bytes) -> None:
        """Send one line as is (a newline is added)."""
        with self._send_lock:
            try:
                self._sock.sendall(line + b"\n")
            except OSError as exc:
                raise DaemonUnavailable(self.path, str(exc)) from None

    def _register(self, request_id: str | None = None) -> tuple[str, Future[Any]]:
        # Unique string ids: any connection may name this request to cancel it.
        request_id = request_id or str(uuid.uuid4())
        future: Future[Any] = Future()
        with self._pending_lock:
            if request_id in self._pending:
                raise ValueError(f"request id {request_id!r} is already in flight")
            self._pending[request_id] = future
        return request_id, future

    def _read_loop(self) -> None:
        try:
            with self._sock.makefile("rb") as reader:
                for line in reader:
                    message = _decode(line)
                    for item in message if isinstance(message, list) else [message]:
                        self._deliver(item)
        except (OSError, ValueError):
            pass
        finally:
            with self._pending_lock:
                pending, self._pending = self._pending, {}
            for future in pending.values():
                future.set_exception(DaemonUnavailable(self.path, "connection closed"))

    def _deliver(self, item: dict[str, Any]) -> None:
        if "id" not in item:
            self.notifications.put(item)
            return
        with self._pending_lock:
            if item["id"] is not None:
                future = self._pending.pop(item["id"], None)
            elif "error" in item and len(self._pending) == 1:
                # A line the daemon could not read: the one request outstanding
                # (docs/protocol.md, "Framing").
                future = self._pending.popitem()[1]
            else:
                future = None
        if future is None:
            self.notifications.put(item)  # with several outstanding, nobody's in particular
            return
        try:
            future.set_result(outcome(item))
        except Exception as exc:
            future.set_exception(exc)


def _request(request_id: str, method: str, params: dict[str, Any] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message

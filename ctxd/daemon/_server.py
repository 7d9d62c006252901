"""The Server: the Unix-socket listener and one Connection per client (NDJSON framing)."""

from __future__ import annotations

import errno
import logging
import math
import os
import socket
from collections import deque
from time import perf_counter
from typing import Any

import msgspec
import trio

from ctxd.config import Config
from ctxd.errors import CtxdError, ErrorCode, cancelled, shutting_down
from ctxd.hub import EventBus, Requests
from ctxd.jobs import Request, working_for
from ctxd.paths import peer_uid
from ctxd.wire import (
    NOT_INLINE,
    ConnectionExtension,
    Dispatcher,
    Envelope,
    EventSource,
    error_response,
    notification,
    salvage_id,
)

log = logging.getLogger("ctxd.server")
READ_CHUNK = 256 * 1024
OUTBOX_LIMIT = 1024 * 1024
"""Bytes of answers queued for a client before the tasks answering it wait for it to read."""
YIELD_EVERY_S = 0.002
YIELD_CHECK_LINES = 32
"""The reader gives other tasks a turn about every 2 ms while it works through a chunk (it
looks at the clock every 32 lines: looking at every line cost ping throughput 5%)."""
_WHITESPACE = (b" ", b"\t", b"\r", b"\n")
EVENT_OUTBOX_LIMIT = 16 * 1024
"""Events wait for a smaller outbox: a lagging subscriber loses events (and is told so by
the bus) instead of piling a megabyte of stale notifications into its connection."""
REPLY_ESTIMATE = 256 * 1024
"""What a connection assumes its next answer weighs until it has sent some (see
`Connection._wait_to_start`)."""
REPLY_SIZES_KEPT = 8
ACCEPT_BACKOFF_S = 0.1
"""How long the listener pauses when the process is out of file descriptors."""
_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def _overloaded(request_id: Any, why: str, limit: str, value: int) -> bytes:
    return error_response(request_id, CtxdError(
        ErrorCode.OVERLOADED, f"overloaded: {why}; retry later",
        {"limit": limit, "max": value, "fix": "retry after a moment with fewer requests"}))


class ServerStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What `Server.statistics` reports (daemon.status shows it)."""

    connections: int
    requests_inflight: int
    requests_total: int
    requests_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    bytes_inflight: int
    max_connections: int


class Connection:
    """One client: a reader that frames lines, request tasks, one outbox.

    Answers go out in completion order (pipelined requests may be answered out of order)
    and event subscriptions of this connection share the same outbox. There is no writer
    task: whoever queues a line sends the outbox, unless another task already is, which
    then sends it for everyone; the reader sends once per chunk it read, so pipelined
    answers leave in one write.

    Methods registered inline (they cannot wait) are answered by the reader itself;
    everything else gets a task of its own. Those tasks start in arrival order (trio starts
    new tasks in no fixed order), so pipelined requests for one session reach its actor in
    the order they were sent.

    Memory (docs/security.md, "Resource limits"): the bytes a connection holds (its partial
    line, the request lines its tasks work on, its unsent answers) count against the
    daemon-wide ``max_inflight_bytes``; a task does not start its request while its
    client has not read the answers already queued (`_wait_to_start`).
    """

    def __init__(self, server: Server, stream: trio.SocketStream, uid: int):
        self.server = server
        self.stream = stream
        self.peer_uid = uid
        self.inflight = 0
        self.subscriptions: dict[str, EventSource] = {}
        self.extension: ConnectionExtension | None = None
        """MCP's state when the client speaks MCP on it (docs/protocol.md, "MCP")."""
        self._dispatcher = server.dispatcher
        self._outbox: list[bytes] = []
        self._outbox_bytes = 0
        self._outbox_taken = trio.Event()
        self._sending = False
        self._sent = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._last_started = trio.Event()
        self._last_started.set()
        self._idle = trio.Event()
        self._idle.set()
        self._pending_bytes = 0
        """Bytes of the line being received (no newline yet), counted by the server."""
        self._sending_bytes = 0
        self._starting = 0
        """Requests started whose answer is not queued yet."""
        self._reply_sizes: deque[int] = deque(maxlen=REPLY_SIZES_KEPT)
        self._room = trio.Event()
        """Set (and replaced) whenever unsent answers leave or a started request's answer
        is queued while `_wait_to_start` waits for it: it looks again."""
        self._room_waiters = 0
        self.last_active = trio.current_time()
        """When it last finished a line or an answer (not when it last sent a byte: half a
        line keeps no connection from being the oldest idle one, `Server._evict_idle`)."""
        self._read_scope: trio.CancelScope | None = None
        """The scope of the read waiting now, when a deadline may fall on it."""
        self._scope = trio.CancelScope()
        """Around everything it does: cancelled when it is dropped to make room."""
        self._line_open = False
        """The last chunk ended inside a line (kept or being discarded)."""
        self._partial_since = 0.0

    @property
    def idle(self) -> bool:
        """Nothing asked and unanswered, no subscription, not MCP's (an MCP client keeps
        its server for its whole session): it may be closed to make room."""
        return not self.inflight and not self.subscriptions and self.extension is None

    def evict(self) -> None:
        """Close it (it is idle: nothing asked is left unanswered), even while its reader
        waits for the client to read answers already sent."""
        log.info("closed an idle connection to make room for a new one")
        self._scope.cancel()

    def _wake(self) -> None:
        if self._room_waiters:
            self._room.set()
            self._room = trio.Event()

    def _hold(self, size: int) -> None:
        self.server.bytes_inflight += size

    def _release_pending(self) -> None:
        self.server.bytes_inflight -= self._pending_bytes
        self._pending_bytes = 0

    async def serve(self) -> None:
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    try:
                        await self._read_loop()
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
                    if self.extension is not None:
                        # An MCP client that goes away abandons its calls: they are
                        # cancelled (docs/protocol.md, "MCP"); native ones are answered.
                        self.extension.connection_lost()
                    # EOF (or a half-close): answer everything that was asked, then hang up.
                    await self._idle.wait()
                    await self.flushed()
                    nursery.cancel_scope.cancel()
        finally:
            self._release_pending()
            self.server.bytes_inflight -= self._outbox_bytes
            self._outbox_bytes = 0
            self._outbox.clear()
            for subscription_id in list(self.subscriptions):
                self.server.bus.unsubscribe(subscription_id)
            with trio.move_on_after(1, shield=True):
                await self.stream.aclose()

    def queue_line(self, line: bytes) -> None:
        """Add one line (without newline) to the outbox; `flush` sends it."""
        self._outbox.append(line + b"\n")
        self._outbox_bytes += len(line) + 1
        self._hold(len(line) + 1)

    async def send_line(self, line: bytes, limit: int = OUTBOX_LIMIT) -> None:
        """Queue one line and send the outbox; waits while ``limit`` bytes are unsent.

        The line is queued before any wait, so lines queued by one task keep their order
        relative to what other tasks queue afterwards (a subscribe's answer precedes the
        subscription's first event).
        """
        self.queue_line(line)
        await self.wait_for_room(limit)
        await self.flush()

    async def wait_for_room(self, limit: int = OUTBOX_LIMIT) -> None:
        """Wait until fewer than ``limit`` bytes are queued (the client is reading)."""
        while self._outbox_bytes >= limit:
            if self._sending:
                await self._outbox_taken.wait()
            else:
                await self.flush()

    async def flush(self) -> None:
        """Send the outbox, unless another task is already sending it (it sends for us)."""
        if self._sending:
            return
        self._sending = True
        try:
            while self._outbox:
                data = b"".join(self._outbox)
                self._outbox.clear()
                self._outbox_bytes = 0
                self._outbox_taken.set()
                self._outbox_taken = trio.Event()
                self._sending_bytes = len(data)
                try:
                    await self.stream.send_all(data)
                finally:
                    self._hold(-len(data))
                    self._sending_bytes = 0
                    self._wake()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._hold(-self._outbox_bytes)
            self._outbox.clear()
            self._outbox_bytes = 0
            assert self._nursery is not None
            self._nursery.cancel_scope.cancel()  # the client is gone
        finally:
            self._sending = False
            self._sent.set()
            self._sent = trio.Event()

    async def send_notification(self, method: str, params: Any) -> None:
        await self.send_line(notification(method, params))

    async def flushed(self) -> None:
        """Wait until every queued line has been handed to the kernel."""
        while self._outbox or self._sending:
            if self._sending:
                await self._sent.wait()
            else:
                await self.flush()

    @property
    def subscription_count(self) -> int:
        return len(self.subscriptions)

    def attach(self, subscription: EventSource) -> None:
        """Stream a subscription's events to this client until it is unsubscribed."""
        assert self._nursery is not None
        self.subscriptions[subscription.subscription_id] = subscription
        self._nursery.start_soon(self._pump_events, subscription)

    def detach(self, subscription_id: str) -> bool:
        if self.subscriptions.pop(subscription_id, None) is None:
            return False
        unsubscribed: bool = self.server.bus.unsubscribe(subscription_id)
        return unsubscribed

    async def _pump_events(self, subscription: EventSource) -> None:
        while True:
            try:
                event = await subscription.receive()
            except trio.EndOfChannel:
                return
            self.queue_line(notification("event", event))
            # The events already waiting go out in the same write (a replay comes in pages).
            while (self._outbox_bytes < EVENT_OUTBOX_LIMIT
                   and (waiting := subscription.receive_nowait()) is not None):
                self.queue_line(notification("event", waiting))
            await self.wait_for_room(EVENT_OUTBOX_LIMIT)
            await self.flush()

    def _read_deadline(self) -> float:
        """When the read gives up: the partial-line timeout while a line is unfinished,
        the idle timeout while nothing is asked and nothing subscribed."""
        config = self.server.config
        if self._line_open:
            return self._partial_since + config.partial_line_timeout_s
        if config.idle_timeout_s and self.idle:
            return self.last_active + config.idle_timeout_s
        return math.inf

    async def _receive(self) -> bytes | None:
        """The next chunk; None when the connection is to close (EOF, a timeout, evicted)."""
        while True:
            if not self._line_open and not self.server.config.idle_timeout_s:
                # No deadline can fall on this read: only the reader opens a line, and
                # without idle_timeout_s being idle sets none. A cancel scope per read
                # was a measurable share of a small request's CPU (docs/performance.md).
                data: bytes = await self.stream.receive_some(READ_CHUNK)
                return data or None
            deadline = self._read_deadline()
            if trio.current_time() >= deadline:
                log.info("closed a connection: %s", "its line was not finished within "
                         "partial_line_timeout_s" if self._line_open else
                         "idle for idle_timeout_s")
                return None
            self._read_scope = trio.CancelScope(deadline=deadline)
            try:
                with self._read_scope:
                    data = await self.stream.receive_some(READ_CHUNK)
                    return data or None
            finally:
                self._read_scope = None

    def refresh_deadline(self) -> None:
        """Its idle state changed: the deadline of the read waiting now follows."""
        if self._read_scope is not None:
            self._read_scope.deadline = self._read_deadline()

    async def _read_loop(self) -> None:
        limit = self.server.config.max_request_bytes
        budget = self.server.config.max_inflight_bytes
        pending = bytearray()
        discarding = False
        while True:
            data = await self._receive()
            if data is None:
                return
            start = 0
            lines = 0
            last_yield = perf_counter()
            while True:
                lines += 1
                if not lines % YIELD_CHECK_LINES and (
                        perf_counter() - last_yield > YIELD_EVERY_S):
                    # A chunk of pipelined inline requests never waits otherwise.
                    await trio.lowlevel.checkpoint()
                    last_yield = perf_counter()
                newline = data.find(b"\n", start)
                if newline < 0:
                    if not discarding:
                        added = len(data) - start
                        pending += data[start:]
                        if len(pending) > limit:
                            pending.clear()
                            self._release_pending()
                            discarding = True
                            await self._too_large(limit)
                        elif self.server.bytes_inflight + added > budget:
                            # Partial lines count: idle clients holding unfinished lines
                            # cannot pin more than the budget.
                            pending.clear()
                            self._release_pending()
                            discarding = True
                            await self.send_line(_overloaded(
                                None, "too many bytes in flight; the line was discarded",
                                "max_inflight_bytes", budget))
                        else:
                            self._pending_bytes += added
                            self._hold(added)
                    if discarding or start < len(data):
                        if not self._line_open:
                            self._line_open = True
                            self._partial_since = trio.current_time()
                    else:
                        self._line_open = False
                    break
                self._line_open = False
                if discarding:
                    discarding = False
                elif pending:
                    pending += data[start:newline]
                    self._release_pending()
                    if len(pending) > limit:
                        await self._too_large(limit)
                    else:
                        await self._dispatch(bytes(pending))
                    pending.clear()
                elif newline - start > limit:
                    await self._too_large(limit)
                else:
                    await self._dispatch(data[start:newline])
                start = newline + 1
            if lines > 1:  # a line ended in this chunk (read once a chunk, not a line)
                self.last_active = trio.current_time()
            if self._outbox:
                await self.flush()  # the inline answers to this chunk, in one write

    async def _too_large(self, limit: int) -> None:
        await self.send_line(error_response(None, CtxdError(
            ErrorCode.INVALID_REQUEST,
            f"invalid request: line longer than max_request_bytes ({limit}); it was discarded",
            {"max_request_bytes": limit,
             "fix": "send smaller requests (split a large append into batches)"})))

    async def _dispatch(self, line: bytes) -> None:
        if not line:
            return
        first = line[:1]
        if first in _WHITESPACE:
            line = line.strip()
            first = line[:1]
            if not line:
                return
        dispatcher = self._dispatcher
        if self.server.draining:
            await self.send_line(error_response(salvage_id(line), shutting_down()))
            return
        envelope: Envelope | None = None
        if first != b"[":
            decoded = dispatcher.decode(line)
            if isinstance(decoded, bytes):
                await self.send_line(decoded)
                return
            envelope = decoded
            started = perf_counter()
            reply = dispatcher.answer_inline(envelope, self)
            if reply is not NOT_INLINE:
                if reply is not None:
                    self.queue_line(reply)
                    # The reader stops reading while its client does not read its answers
                    # (checked here first: a coroutine per ping is measurable).
                    if self._outbox_bytes >= OUTBOX_LIMIT:
                        await self.wait_for_room()
                ended = perf_counter()
                self.server.record(ended - started, ended)
                return
        config = self.server.config
        if self.inflight >= config.max_inflight_per_connection:
            await self.send_line(_overloaded(
                salvage_id(line), "too many requests in flight on this connection",
                "max_inflight_per_connection", config.max_inflight_per_connection))
            return
        if self.server.bytes_inflight + len(line) > config.max_inflight_bytes:
            await self.send_line(_overloaded(
                salvage_id(line), "too many bytes in flight", "max_inflight_bytes",
                config.max_inflight_bytes))
            return
        self._hold(len(line))
        self.inflight += 1
        if self.inflight == 1:
            self.refresh_deadline()
        self._idle = trio.Event() if self.inflight == 1 else self._idle
        assert self._nursery is not None
        previous, self._last_started = self._last_started, trio.Event()
        self._nursery.start_soon(self._handle, line, envelope, previous, self._last_started)

    async def _handle(self, line: bytes, envelope: Envelope | None, previous: trio.Event,
                      started_event: trio.Event) -> None:
        started = perf_counter()
        self.server.begin_request()
        dispatcher = self.server.dispatcher
        try:
            if not previous.is_set():
                await previous.wait()
            if self._outbox_bytes or self._sending_bytes or self._starting:
                await self._wait_to_start()  # (with none of them there is room)
            self._starting += 1
            try:
                if envelope is None:
                    # A batch runs its items one after the other; the next request starts
                    # once the whole batch is done, so nothing lands between its items.
                    try:
                        reply = await dispatcher.answer_batch(line, self)
                    finally:
                        started_event.set()
                else:
                    # No checkpoint from here until the request is queued at its session's
                    # actor, so the next request's task cannot overtake this one.
                    started_event.set()
                    reply = await self._answer(envelope)
            finally:
                self._starting -= 1
                self._wake()
            if reply is not None:
                self._reply_sizes.append(len(reply))
                await self.send_line(reply)
        finally:
            self._hold(-len(line))
            self.inflight -= 1
            if self.inflight == 0:
                self._idle.set()
                self.last_active = trio.current_time()
                self.refresh_deadline()
            self.server.end_request(perf_counter() - started)

    async def _answer(self, envelope: Envelope) -> bytes | None:
        """Answer one request; one with an id may be cancelled by request.cancel while it
        runs (docs/protocol.md, "Cancellation")."""
        request_id = envelope.id
        if request_id is msgspec.UNSET or request_id is None:
            return await self._dispatcher.answer(envelope, self)
        request = Request(request_id, cancelled)
        # MCP's request ids are the connection's own: its calls are cancelled by its
        # notifications/cancelled only, never by a request.cancel from elsewhere.
        requests = (None if self._dispatcher.connection_ids(envelope.method)
                    else self.server.requests)
        if requests is not None:
            requests.add(request)
        try:
            with working_for(request):
                return await self._dispatcher.answer(envelope, self)
        finally:
            if requests is not None:
                requests.discard(request)
            else:
                request.finished = True

    async def _wait_to_start(self) -> None:
        """Wait until the client has read enough of its answers for one more request.

        A request starts when the unsent answers plus what the requests already started
        are expected to answer (each as large as the largest of the last answers) fit in
        the outbox limit, or when nothing is started and the outbox has room: a client
        that pipelines large renders without reading holds one answer in the outbox and
        one being built, not all of them (docs/security.md, "Resource limits").
        """
        while True:
            unsent = self._outbox_bytes + self._sending_bytes
            estimate = max(self._reply_sizes, default=REPLY_ESTIMATE)
            if unsent + self._starting * estimate < OUTBOX_LIMIT:
                return
            if self._outbox and not self._sending:
                await self.flush()
            else:
                self._room_waiters += 1
                try:
                    await self._room.wait()
                finally:
                    self._room_waiters -= 1


class Server:
    """Accepts connections on the listening socket and serves them.

    Args:
        dispatcher: answers request lines.
        bus: the event bus (subscriptions end with their connection).
        config: limits (connections, in-flight requests, line size) and ``allow_root``.
        requests: where requests in flight are registered for request.cancel.
    """

    def __init__(self, dispatcher: Dispatcher, bus: EventBus, config: Config,
                 max_connections: int | None = None, requests: Requests | None = None):
        self.dispatcher = dispatcher
        self.bus = bus
        self.requests = requests or Requests()
        """The requests in flight that request.cancel may stop."""
        self.config = config
        self.max_connections = max_connections or config.max_connections
        """``max_connections``, or fewer when the open files allow fewer."""
        self.bytes_inflight = 0
        """Bytes held for clients: partial lines, request lines at work, unsent answers."""
        self.connections: set[Connection] = set()
        self.inflight = 0
        self.requests_total = 0
        self._latencies: deque[float] = deque(maxlen=4096)
        # (time, requests_total) at most once a second: the rate over the last ~10 s.
        self._rate_marks: deque[tuple[float, int]] = deque([(perf_counter(), 0)], maxlen=11)
        self._accept_scope = trio.CancelScope()
        self.closed = trio.Event()
        self.draining = False
        self._drained = trio.Event()
        self._drained.set()
        self._own_uid = os.getuid()
        self._descriptor_warning = -math.inf

    async def run(self, sock: socket.socket, *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until `stop_accepting`, then drain in-flight requests (up to the deadline)."""
        try:
            await self._run(sock, task_status)
        finally:
            self.closed.set()

    async def _run(self, sock: socket.socket, task_status: trio.TaskStatus[None]) -> None:
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        async with trio.open_nursery() as connections:
            with self._accept_scope:
                task_status.started()
                while True:
                    try:
                        stream = await listener.accept()
                    except OSError as exc:
                        if exc.errno not in _OUT_OF_DESCRIPTORS:
                            raise
                        # Out of descriptors: the open connections go on; newcomers wait
                        # in the listen backlog until some close.
                        self._warn_out_of_descriptors(exc)
                        await trio.sleep(ACCEPT_BACKOFF_S)
                        continue
                    connections.start_soon(self._serve, stream)
            await listener.aclose()
            with trio.move_on_after(self.config.shutdown_timeout_s) as deadline:
                if self.inflight:
                    await self._drained.wait()
                # A finished request has only queued its answer: deliver it before closing.
                for connection in list(self.connections):
                    await connection.flushed()
            if deadline.cancelled_caught:
                log.warning("shutdown deadline (%ss) passed with %d requests in flight; they "
                            "were cancelled unanswered (a store write already under way "
                            "still commits)", self.config.shutdown_timeout_s, self.inflight)
            connections.cancel_scope.cancel()

    def _warn_out_of_descriptors(self, exc: OSError) -> None:
        now = trio.current_time()
        if now - self._descriptor_warning >= 60:
            self._descriptor_warning = now
            log.warning("cannot accept a connection: %s (%d connections open); new "
                        "connections wait until some close; raise LimitNOFILE / ulimit -n "
                        "or lower max_connections", exc.strerror, len(self.connections))

    def stop_accepting(self) -> None:
        """Begin shutdown: no new connections, and no new requests on open ones."""
        self.draining = True
        self._accept_scope.cancel()

    async def _serve(self, stream: trio.SocketStream) -> None:
        try:
            uid = peer_uid(stream.socket)
        except OSError:
            await stream.aclose()
            return
        if uid != self._own_uid and not (uid == 0 and self.config.allow_root):
            log.warning("refused a connection from uid %d", uid)
            await stream.aclose()
            return
        if len(self.connections) >= self.max_connections and not self._evict_idle():
            with trio.move_on_after(1):
                try:
                    await stream.send_all(_overloaded(
                        None, "too many connections", "max_connections",
                        self.max_connections) + b"\n")
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
            await stream.aclose()
            return
        connection = Connection(self, stream, uid)
        self.connections.add(connection)
        try:
            await connection.serve()
        except Exception:
            # A connection is an actor boundary: a bug here closes this client, never the
            # daemon. (Cancellation and KeyboardInterrupt are BaseExceptions and pass.)
            log.exception("connection failed; it was closed")
        finally:
            self.connections.discard(connection)

    def _evict_idle(self) -> bool:
        """Close the connection idle for longest to make room; False when none is idle."""
        idle = [connection for connection in self.connections if connection.idle]
        if not idle:
            return False
        oldest = min(idle, key=lambda connection: connection.last_active)
        self.connections.discard(oldest)  # its slot is free now; it closes on its own
        oldest.evict()
        return True

    def begin_request(self) -> None:
        if self.inflight == 0:
            self._drained = trio.Event()
        self.inflight += 1

    def end_request(self, seconds: float) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._drained.set()
        self.record(seconds, perf_counter())

    def record(self, seconds: float, now: float) -> None:
        """Count one answered request and its latency (``now``: `time.perf_counter`)."""
        self.requests_total += 1
        self._latencies.append(seconds)
        if now - self._rate_marks[-1][0] >= 1.0:
            self._rate_marks.append((now, self.requests_total))

    def statistics(self) -> ServerStatistics:
        """Requests per second over about the last 10 s, p50/p99 of the last 4096 requests."""
        recent = sorted(self._latencies)
        since, total_then = self._rate_marks[0]
        elapsed = perf_counter() - since

        def percentile(p: float) -> float:
            return recent[min(len(recent) - 1, int(p * len(recent)))] * 1000 if recent else 0.0

        return ServerStatistics(
            connections=len(self.connections), requests_inflight=self.inflight,
            requests_total=self.requests_total,
            requests_per_s=(self.requests_total - total_then) / elapsed if elapsed else 0.0,
            latency_p50_ms=percentile(0.50), latency_p99_ms=percentile(0.99),
            bytes_inflight=self.bytes_inflight, max_connections=self.max_connections)

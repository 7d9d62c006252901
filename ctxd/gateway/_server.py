"""The Gateway: the HTTP/1.1 listener (h11 on trio), one task per connection; the checks
every request passes (Host, Origin, token, size); the forwarding of each call and its
usage (docs/security.md, "The model gateway")."""

from __future__ import annotations

import hmac
import itertools
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import h11
import msgspec
import trio

from ctxd import __version__
from ctxd.config import GatewayConfig, is_loopback, listen_address
from ctxd.errors import CtxdError, ErrorCode, cancelled
from ctxd.gateway._http import Answer, Relay, error_body, receive, send, send_answer
from ctxd.gateway._rewrite import Api, Endpoint, GatewayRequest, Prepared, prepare, session_of
from ctxd.gateway._upstream import (
    Headers,
    is_anthropic,
    new_client,
    request_headers,
)
from ctxd.gateway._usage import ProviderUsage
from ctxd.hub import EventBus, Requests
from ctxd.jobs import Request, cancellation_point, working_for
from ctxd.sessions import Supervisor, record_sent_usage
from ctxd.wire.types import GatewayCall, GatewayInflight, GatewayStatus, UsageRecordParams

if TYPE_CHECKING:
    import httpx2

log = logging.getLogger("ctxd.gateway")
SUB_AGENT_HEADER = b"x-claude-code-agent-id"
"""What Claude Code adds to a sub-agent's model calls (its ``agent_id``, as its hooks see
it)."""

REWRITTEN: dict[str, tuple[Api, Endpoint]] = {
    "/v1/messages": ("anthropic", "messages"),
    "/v1/messages/count_tokens": ("anthropic", "count_tokens"),
    "/v1/chat/completions": ("openai", "chat_completions"),
}
"""The POST paths whose body ctxd rewrites (`prepare`); every other path passes through."""
HEALTH_PATH = "/_ctxd/health"
UPSTREAMS_QUERY = "?upstreams=1"
"""With it, the health answer says whether each upstream answers (``ctxctl doctor``)."""
UPSTREAM_SETTINGS = ("anthropic_upstream", "openai_upstream")
UPSTREAM_CHECK_TIMEOUT_S = 5.0
"""How long the health answer waits for each upstream's."""
REQUEST_TIMEOUT_S = 120.0
"""Time a connection has to send a whole request, from the end of the last answer (or
its opening): an idle keep-alive connection is closed after it too."""
MAX_HEADER_BYTES = 64 * 1024
LAST_CALLS_KEPT = 20
MAX_ERROR_CHARS = 1_000
"""Of a failed rewrite's error, what its event carries."""
DECODE_IN_THREAD_BYTES = 1 << 20
"""A body this large is parsed in a worker thread (about a millisecond a megabyte): the
event loop goes on serving the socket and the other calls meanwhile."""
BODY_RECEIVE_BYTES = 1 << 20
"""Largest read of a request's body (a large body in few reads: each costs a pass of h11
and of the event loop)."""
CLOSE_TIMEOUT_S = 5.0
"""Time given to closing an upstream call (it is cut after)."""

Prepare = Callable[[Supervisor, GatewayRequest], Awaitable[Prepared]]


def _not_found() -> Answer:
    """The answer to a wrong or missing token: the same whatever the path, no hint."""
    return Answer(404, error_body("not_found_error", "Not found"))


@dataclass(frozen=True)
class _Call:
    """A rewritten model call, for its usage and the gateway's status."""

    request: GatewayRequest
    prepared: Prepared | None
    """None when the rewrite failed and the agent's own body went."""

    @property
    def session_id(self) -> str:
        return self.prepared.session_id if self.prepared else session_of(self.request)

    @property
    def sent_tokens(self) -> int | None:
        return sum(self.prepared.tokens.values()) if self.prepared else None


def listen_text(address: Any) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind(config: GatewayConfig) -> socket.socket:
    """The gateway's listening socket at ``config.listen``.

    Raises:
        OSError: it cannot be bound (the port is taken).
    """
    host, port = listen_address(config.listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=128)


class Gateway:
    """The model gateway: an Anthropic/OpenAI API base URL that forwards each call to its
    upstream, the session's body sent in place of the agent's (`prepare`).

    Args:
        config: ``[gateway]``.
        supervisor: where the calls' sessions are (and their usage is recorded).
        bus: where ``gateway.call`` and ``gateway.rewrite_failed`` are published.
        requests: the requests ``request.cancel`` may stop (the model calls join them).
        token: the secret first segment of every path.
        prepare: what finds a request's session and rewrites its body.
    """

    def __init__(self, config: GatewayConfig, supervisor: Supervisor, bus: EventBus,
                 requests: Requests, token: str, prepare: Prepare = prepare) -> None:
        self.config = config
        self._supervisor = supervisor
        self._bus = bus
        self._requests = requests
        self._call_ids = itertools.count(1)
        self._inflight: dict[str, GatewayInflight] = {}
        self._calls: dict[str, Request] = {}
        self._token = token.encode()
        self._prepare = prepare
        self._upstream_slots = trio.CapacityLimiter(config.max_upstream_calls)
        self._accepting = trio.CancelScope()
        self._client: httpx2.AsyncClient | None = None
        self._last_calls: OrderedDict[str, GatewayCall] = OrderedDict()
        self.listen = ""
        """Where it serves (set once it listens)."""
        self.connections = 0
        self.calls = 0
        self.rewrite_failures = 0
        self.calls_inflight = 0
        self._calls_done = trio.Event()

    @property
    def base_url(self) -> str:
        return f"http://{self.listen}/{self._token.decode()}"

    def status(self) -> GatewayStatus:
        return GatewayStatus(listen=self.listen, base_url=self.base_url, calls=self.calls,
                             rewrite_failures=self.rewrite_failures,
                             sessions=list(reversed(self._last_calls.values())),
                             inflight=list(self._inflight.values()))

    async def run(self, sock: socket.socket, *,
                  task_status: trio.TaskStatus[Gateway] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve ``sock`` until `stop_accepting`, then until the connections end."""
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        self.listen = listen_text(sock.getsockname())
        try:
            async with trio.open_nursery() as nursery:
                task_status.started(self)
                with self._accepting:
                    while True:
                        stream = await listener.accept()
                        nursery.start_soon(self._serve_connection, stream)
        finally:
            if self._client is not None:
                with trio.CancelScope(shield=True):
                    await self._client.aclose()

    def stop_accepting(self) -> None:
        self._accepting.cancel()

    async def wait_calls_done(self) -> None:
        """Wait until no call is in flight."""
        while self.calls_inflight:
            await self._calls_done.wait()

    def cancel_calls(self, reason: str) -> None:
        """Stop every model call in flight as ``request.cancel`` would (at shutdown: the
        agents' answers end with an error rather than a cut connection)."""
        for request in list(self._calls.values()):
            request.cancel(reason)

    # ---- one connection ---------------------------------------------------------------

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        try:
            async with stream:
                connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
                if self.connections > self.config.max_connections:
                    await send_answer(stream, connection, Answer(
                        503, error_body("overloaded_error", "ctxd gateway: too many "
                                        "connections"), close=True))
                    return
                while await self._serve_request(stream, connection):
                    connection.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            pass  # the agent went away, or spoke no HTTP: nothing to answer
        except Exception:  # the connection's boundary: one failure never stops the others
            log.exception("gateway: a connection failed; it was closed")
        finally:
            self.connections -= 1

    async def _serve_request(self, stream: trio.SocketStream,
                             connection: h11.Connection) -> bool:
        """Read one request and answer it; whether the connection may carry another."""
        with trio.move_on_after(REQUEST_TIMEOUT_S) as reading:
            try:
                request = await receive(stream, connection)
                if not isinstance(request, h11.Request):
                    return False  # closed between requests
                rest = self._check(request)
                body = await self._read_body(stream, connection, request)
            except Answer as answer:
                await send_answer(stream, connection, answer)
                return not answer.close
            except h11.RemoteProtocolError as exc:
                if connection.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await send_answer(stream, connection, Answer(
                        exc.error_status_hint, error_body("invalid_request_error",
                                                          "malformed HTTP request"), True))
                return False
        if reading.cancelled_caught:
            return False  # too slow, or idle too long: closed
        headers: Headers = list(request.headers)
        if rest in (HEALTH_PATH, HEALTH_PATH + UPSTREAMS_QUERY) and request.method == b"GET":
            health: dict[str, Any] = {"ok": True, "version": __version__, "session_id": None}
            if rest.endswith(UPSTREAMS_QUERY):
                health["upstreams"] = await self._reach_upstreams()
            await send_answer(stream, connection, Answer(200, msgspec.json.encode(health)))
            return True
        complete = await self._forward(stream, connection, request.method, rest, headers, body)
        return complete and connection.our_state is h11.DONE \
            and connection.their_state is h11.DONE

    def _check(self, request: h11.Request) -> str:
        """The path under the token.

        Raises:
            Answer: 403 for a browser's request (an Origin) or another host's name
                (DNS rebinding); 404 for a missing or wrong token, whatever the path.
        """
        headers = dict(request.headers)
        if b"origin" in headers:
            raise Answer(403, error_body("permission_error", "ctxd gateway: requests from "
                                          "a web page are refused"))
        if not self.config.allow_non_loopback and not _loopback_host(headers.get(b"host", b"")):
            raise Answer(403, error_body("permission_error", "ctxd gateway: the Host must "
                                          "be a loopback address"))
        path, question, query = request.target.decode("ascii", "replace").partition("?")
        given, _, under = path.removeprefix("/").partition("/")
        if not path.startswith("/") or not hmac.compare_digest(given.encode(), self._token):
            raise _not_found()
        return "/" + under + question + query

    async def _read_body(self, stream: trio.SocketStream, connection: h11.Connection,
                         request: h11.Request) -> bytes:
        limit = self.config.max_body_bytes
        too_large = Answer(413, error_body("request_too_large", f"ctxd gateway: the body "
                                            f"exceeds gateway.max_body_bytes ({limit})"), True)
        length = dict(request.headers).get(b"content-length")
        if length is not None and int(length) > limit:
            raise too_large
        if connection.they_are_waiting_for_100_continue:  # curl, for a large body
            await send(stream, connection, h11.InformationalResponse(status_code=100, headers=[]))
        chunks: list[bytes] = []
        size = 0
        while True:
            event = await receive(stream, connection, BODY_RECEIVE_BYTES)
            if isinstance(event, h11.EndOfMessage):
                return b"".join(chunks)
            if not isinstance(event, h11.Data):
                raise h11.RemoteProtocolError("the request ended early", 400)
            chunks.append(event.data)
            size += len(event.data)
            if size > limit:
                raise too_large

    # ---- one call -----------------------------------------------------------------------

    async def _forward(self, stream: trio.SocketStream, connection: h11.Connection,
                       method: bytes, rest: str, headers: Headers, body: bytes) -> bool:
        """Send the call upstream and stream its answer back; whether it was all sent.

        Cancellation: a model call is a request that ``request.cancel`` stops by its call
        id (``gw_N``, in ``gateway.call_started`` and ``daemon.status``): its upstream
        call is closed and the agent's answer ends with an error (`Relay.end_early`).
        """
        path = rest.partition("?")[0]
        setting = "anthropic_upstream" if is_anthropic(path, headers) else "openai_upstream"
        url = getattr(self.config, setting).rstrip("/") + rest
        call = None
        if method == b"POST" and path in REWRITTEN:
            call, body = await self._rewrite(REWRITTEN[path], headers, body)
        if call is None:  # passed through, or no JSON object: no session, no usage
            return await self._call_upstream(method, url, setting, headers, body,
                                             Relay(stream, connection, counted=False))
        relay = Relay(stream, connection, counted=True)
        request = Request(f"gw_{next(self._call_ids)}", cancelled)
        self._started(request, call)
        try:
            with working_for(request), cancellation_point():
                complete = await self._call_upstream(method, url, setting, headers, body,
                                                     relay)
        except CtxdError as exc:
            if exc.code != ErrorCode.CANCELLED:
                raise
            complete = await relay.end_early(499, "cancelled", f"ctxd gateway: {exc.message}")
        finally:
            self._ended(request)
        if call.request.endpoint != "count_tokens":
            await self._account(call, request.request_id, relay.status, relay.usage())
        return complete

    async def _call_upstream(self, method: bytes, url: str, setting: str, headers: Headers,
                             body: bytes, relay: Relay) -> bool:
        """``setting``: the configuration key that names the upstream, for the error that
        says it could not be reached."""
        import httpx2  # loaded by the first call's client (`new_client`)

        if self._client is None:
            self._client = new_client(self.config)
        async with self._upstream_slots:
            request = self._client.build_request(method.decode(), url, content=body,
                                                 headers=request_headers(headers))
            try:
                response = await self._client.send(request, stream=True)
            except httpx2.HTTPError as exc:
                log.warning("gateway: %s %s failed: %s", method.decode(),
                            _origin(request.url), type(exc).__name__)
                return await relay.end_early(502, "api_error", (
                    f"ctxd gateway: the upstream {_origin(request.url)} {_failure(exc)}; "
                    f"check the gateway's {setting} in ctxd's config"))
            try:
                return await relay.run(response)
            finally:
                with trio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                    await response.aclose()

    async def _reach_upstreams(self) -> list[dict[str, Any]]:
        """Whether each upstream answers (``HEAD /``; any HTTP status is an answer), asked
        side by side, `UPSTREAM_CHECK_TIMEOUT_S` each in all, by a client made like the
        calls' (the same settings and environment) but of its own, so that calls holding
        every connection of theirs do not make an upstream look unreachable."""
        import httpx2

        found: dict[str, dict[str, Any]] = {}

        async def reach(client: httpx2.AsyncClient, setting: str) -> None:
            url = httpx2.URL(getattr(self.config, setting).rstrip("/") + "/")
            answer: dict[str, Any] = {
                "setting": setting, "url": _origin(url), "reached": False, "status": None,
                "problem": f"gave no answer in {UPSTREAM_CHECK_TIMEOUT_S:g} s"}
            with trio.move_on_after(UPSTREAM_CHECK_TIMEOUT_S):
                try:
                    response = await client.request("HEAD", url)
                    answer.update(reached=True, status=response.status_code, problem=None)
                except httpx2.HTTPError as exc:
                    answer["problem"] = _failure(exc)
            found[setting] = answer

        async with new_client(self.config) as client, trio.open_nursery() as nursery:
            for setting in UPSTREAM_SETTINGS:
                nursery.start_soon(reach, client, setting)
        return [found[setting] for setting in UPSTREAM_SETTINGS]

    def _started(self, request: Request, call: _Call) -> None:
        self._requests.add(request)
        call_id = str(request.request_id)
        self._calls[call_id] = request
        model = call.prepared.model if call.prepared else None
        self._inflight[call_id] = GatewayInflight(call_id=call_id, session_id=call.session_id,
                                                  model=model, started_at=time.time())
        self._bus.publish(call.session_id, "gateway.call_started",
                          {"call_id": call_id, "model": model,
                           "endpoint": call.request.endpoint})
        if not self.calls_inflight:
            self._calls_done = trio.Event()
        self.calls_inflight += 1

    def _ended(self, request: Request) -> None:
        self._requests.discard(request)
        self._calls.pop(str(request.request_id), None)
        self._inflight.pop(str(request.request_id), None)
        self.calls_inflight -= 1
        if not self.calls_inflight:
            self._calls_done.set()

    async def _rewrite(self, route: tuple[Api, Endpoint], headers: Headers, body: bytes
                       ) -> tuple[_Call | None, bytes]:
        """The call and the body to send: ``prepare``'s, or on any failure the agent's own
        (fail open: ctxd never turns a request the provider would take into an error)."""
        api, endpoint = route
        session_header = dict(headers).get(b"x-ctxd-session")
        try:
            parsed = (msgspec.json.decode(body) if len(body) < DECODE_IN_THREAD_BYTES
                      else await trio.to_thread.run_sync(msgspec.json.decode, body))
        except msgspec.DecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            self._rewrite_failed(None, "the body is not a JSON object")
            return None, body
        request = GatewayRequest(
            api=api, endpoint=endpoint, body=parsed, raw=body,
            session_header=session_header.decode("utf-8", "replace") if session_header
            else None)
        if any(name == SUB_AGENT_HEADER for name, _ in headers):
            # A Claude Code sub-agent's call: its hooks record it, in the sub-agent's branch
            # (docs/decisions.md, Agents end to end); it goes as sent, its usage counted.
            return _Call(request, None), body
        try:
            prepared = await self._prepare(self._supervisor, request)
        except Exception as exc:  # the rewrite's boundary: the agent's body goes instead
            if isinstance(exc, CtxdError) and exc.code == ErrorCode.INVALID_PARAMS:
                # The agent's body is not what the API takes: the provider will say so;
                # not a fault of ctxd's, so no traceback.
                log.warning("gateway: a %s request's body cannot be rewritten (%s); sent "
                            "as received", endpoint, exc.message)
            else:
                log.exception("gateway: the rewrite of a %s request failed; sent as "
                              "received", endpoint)
            self._rewrite_failed(session_of(request),
                                 f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS])
            return _Call(request, None), body
        return _Call(request, prepared), prepared.body

    def _rewrite_failed(self, session_id: str | None, error: str) -> None:
        self.rewrite_failures += 1
        self._bus.publish(session_id, "gateway.rewrite_failed",
                          {"session_id": session_id, "error": error})

    async def _account(self, call: _Call, call_id: str | int, status: int,
                       usage: ProviderUsage) -> None:
        """Record the call's usage (once per response id) and keep it as its session's
        last call."""
        self.calls += 1
        session_id = call.session_id
        model = usage.model or (call.prepared.model if call.prepared else None)
        counters = usage.counters
        if 200 <= status < 300 and counters:
            params = msgspec.structs.replace(
                UsageRecordParams(session_id=session_id, request_id=usage.response_id,
                                  model=model, idempotency_key=usage.response_id),
                **counters)
            sent = call.sent_tokens
            try:
                await self._supervisor.call(
                    session_id, lambda actor: record_sent_usage(actor, params, sent))
            except CtxdError as exc:
                log.warning("gateway: the usage of a call of session %s was not recorded: "
                            "%s", session_id, exc.message)
        prepared = call.prepared
        last = GatewayCall(
            session_id=session_id, model=model, last_call_at=time.time(),
            sent_tokens=call.sent_tokens or 0,
            removed_tokens=prepared.removed_tokens if prepared else 0,
            input_tokens=counters.get("input_tokens", 0),
            output_tokens=counters.get("output_tokens", 0),
            cache_read_tokens=counters.get("cache_read_tokens", 0),
            cache_write_tokens=counters.get("cache_write_tokens", 0), cost=usage.cost)
        self._last_calls.pop(session_id, None)
        self._last_calls[session_id] = last
        while len(self._last_calls) > LAST_CALLS_KEPT:
            self._last_calls.popitem(last=False)
        self._bus.publish(session_id, "gateway.call", {
            **msgspec.structs.asdict(last), "call_id": call_id, "status": status,
            "response_id": usage.response_id, "rewritten": prepared is not None})


def _loopback_host(host: bytes) -> bool:
    """Whether a Host header names this machine's loopback (an address or localhost)."""
    name = host.decode("ascii", "replace")
    name = name[1:].partition("]")[0] if name.startswith("[") else name.rpartition(":")[0] \
        if name.count(":") == 1 else name
    if name == "localhost":
        return True
    try:
        return is_loopback(name)
    except ValueError:
        return False


def _origin(url: httpx2.URL) -> str:
    """An upstream as errors name it: scheme, host and port, never credentials."""
    host = url.host
    host = f"[{host}]" if ":" in host else host
    port = f":{url.port}" if url.port is not None else ""
    return f"{url.scheme}://{host}{port}"


def _failure(exc: httpx2.HTTPError) -> str:
    """What an upstream call's failure was: not reached, or reached with no valid answer
    (it closed the connection, or is not an HTTP server)."""
    import httpx2

    unreached = isinstance(exc, (httpx2.ConnectError, httpx2.ConnectTimeout,
                                 httpx2.ProxyError, httpx2.UnsupportedProtocol))
    what = "could not be reached" if unreached else "was reached but gave no valid answer"
    return f"{what} ({type(exc).__name__})"

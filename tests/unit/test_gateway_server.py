"""The gateway's parts in-process: fail-open with a rewrite that raises (a real
Supervisor and store, a real upstream on loopback), the usage read from JSON and from
event streams cut at any byte, the headers that cross, the Host check, the token file,
and the configuration's refusals."""

from __future__ import annotations

import functools
import json
import os
import socket
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import msgspec
import pytest
import trio
from gateway_upstream import Failure, ModelUpstream, anthropic_events, openai_chunks
from tests_support import running_supervisor

from ctxd import config as ctxd_config
from ctxd.config import Config, GatewayConfig
from ctxd.errors import CtxdError
from ctxd.gateway import (
    Gateway,
    GatewayRequest,
    Prepared,
    UsageReader,
    bind,
    load_token,
    prepare,
)
from ctxd.gateway._server import (
    DECODE_IN_THREAD_BYTES,
    REQUEST_TIMEOUT_S,
    _loopback_host,
    listen_text,
)
from ctxd.gateway._upstream import is_anthropic, request_headers, response_headers
from ctxd.hub import Requests
from ctxd.sessions import Supervisor

TOKEN = "t" * 43
BODY = b'{"model":"claude-test","max_tokens":10,  "messages":[{"role":"user","content":"hi"}]}'


async def failing_prepare(supervisor: Supervisor, request: GatewayRequest) -> Prepared:
    raise RuntimeError("the rewrite cannot handle this request")


@asynccontextmanager
async def serving(tmp_path: Path, upstream: ModelUpstream | str,
                  rewrite: Any = failing_prepare) -> AsyncIterator[Gateway]:
    origin = upstream if isinstance(upstream, str) else upstream.origin
    gateway_config = GatewayConfig(listen="127.0.0.1:0", anthropic_upstream=origin,
                                   openai_upstream=origin)
    config = Config(gateway=gateway_config)
    with bind(gateway_config) as sock:
        async with running_supervisor(tmp_path / "db", config) as supervisor, \
                trio.open_nursery() as nursery:
            gateway = Gateway(gateway_config, supervisor, supervisor.bus, Requests(), TOKEN,
                              prepare=rewrite)
            await nursery.start(gateway.run, sock)
            yield gateway
            nursery.cancel_scope.cancel()


async def test_a_rewrite_that_raises_sends_the_agents_bytes_once(tmp_path: Path) -> None:
    with ModelUpstream() as upstream:
        async with serving(tmp_path, upstream) as gateway, httpx2.AsyncClient() as client:
            events = gateway._bus.subscribe(types=["gateway.rewrite_failed"])
            response = await client.post(
                gateway.base_url + "/v1/messages", content=BODY,
                headers={"x-api-key": "sk-secret", "x-ctxd-session": "s-1",
                         "content-type": "application/json"})
            assert response.status_code == 200
            assert response.json()["content"][0]["text"] == "hello from the model"
            assert [(r.path, r.body) for r in upstream.received] == [("/v1/messages", BODY)]
            event = events.receive_nowait()
            assert event is not None
            assert (event.type, event.session_id, event.data) == (
                "gateway.rewrite_failed", "s-1",
                {"session_id": "s-1",
                 "error": "RuntimeError: the rewrite cannot handle this request"})
            assert "sk-secret" not in json.dumps(event.data)
            assert (gateway.rewrite_failures, gateway.status().rewrite_failures) == (1, 1)


async def test_a_body_the_api_does_not_take_is_a_warning_not_an_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    body = b'{"model": "m", "max_tokens": 1, "messages": "hello"}'
    with ModelUpstream() as upstream:
        async with serving(tmp_path, upstream, rewrite=prepare) as gateway, \
                httpx2.AsyncClient() as client:
            response = await client.post(gateway.base_url + "/v1/messages", content=body,
                                         headers={"x-ctxd-session": "s-2"})
            assert response.status_code == 200
            assert [r.body for r in upstream.received] == [body]
    [record] = [r for r in caplog.records if r.name == "ctxd.gateway"
                and "cannot be rewritten" in r.getMessage()]
    assert (record.levelname, record.exc_info, record.getMessage()) == (
        "WARNING", None, "gateway: a messages request's body cannot be rewritten (invalid "
                         "params: must be a list of messages (at $.messages)); sent as "
                         "received")


async def test_a_large_body_is_parsed_aside_and_sent_whole(tmp_path: Path) -> None:
    body = msgspec.json.encode({"model": "m", "max_tokens": 1, "messages": [
        {"role": "user", "content": "x" * (2 * DECODE_IN_THREAD_BYTES)}]})
    with ModelUpstream() as upstream:
        async with serving(tmp_path, upstream) as gateway, httpx2.AsyncClient() as client:
            events = gateway._bus.subscribe(types=["gateway.rewrite_failed"])
            response = await client.post(gateway.base_url + "/v1/messages", content=body)
            assert response.status_code == 200
            assert [r.body for r in upstream.received] == [body]
            event = events.receive_nowait()  # the parsed body reached prepare
            assert event is not None
            assert event.data["error"].startswith("RuntimeError")


async def test_a_body_that_is_no_json_object_goes_as_it_came(tmp_path: Path) -> None:
    with ModelUpstream() as upstream:
        async with serving(tmp_path, upstream) as gateway, httpx2.AsyncClient() as client:
            events = gateway._bus.subscribe(types=["gateway.rewrite_failed"])
            upstream.script.failures.append(Failure(400, b'{"type":"error"}'))
            response = await client.post(gateway.base_url + "/v1/messages", content=b"[1, 2")
            assert (response.status_code, response.content) == (400, b'{"type":"error"}')
            assert [r.body for r in upstream.received] == [b"[1, 2"]
            event = events.receive_nowait()
            assert event is not None
            assert event.data == {"session_id": None, "error": "the body is not a JSON object"}


async def test_too_many_connections_are_answered_503(tmp_path: Path) -> None:
    with ModelUpstream() as upstream:
        async with serving(tmp_path, upstream) as gateway:
            gateway.config = msgspec.structs.replace(gateway.config, max_connections=1)
            host, port = gateway.listen.rsplit(":", 1)
            first = await trio.open_tcp_stream(host, int(port))
            await trio.testing.wait_all_tasks_blocked()
            second = await trio.open_tcp_stream(host, int(port))
            answer = b""
            while chunk := await second.receive_some(4096):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 503 ")
            await first.aclose()
            await second.aclose()


async def test_an_unreachable_upstream_is_answered_502(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    async with serving(tmp_path, f"http://127.0.0.1:{port}") as gateway, \
            httpx2.AsyncClient() as client:
        response = await client.post(gateway.base_url + "/v1/messages", content=BODY)
        assert (response.status_code, response.json()["error"]) == (502, {
            "type": "api_error", "message": f"ctxd gateway: the upstream http://127.0.0.1:"
                                            f"{port} could not be reached (ConnectError); "
                                            "check the gateway's anthropic_upstream in "
                                            "ctxd's config"})
        await trio.testing.wait_all_tasks_blocked()  # the answer left; its call has ended
        assert gateway.status().inflight == []


async def test_an_upstream_that_hangs_up_is_answered_502_as_reached(tmp_path: Path) -> None:
    async def hang_up(stream: trio.SocketStream) -> None:
        await stream.receive_some(65_536)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(
            functools.partial(trio.serve_tcp, hang_up, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        async with serving(tmp_path, f"http://127.0.0.1:{port}") as gateway, \
                httpx2.AsyncClient() as client:
            response = await client.post(gateway.base_url + "/v1/messages", content=BODY)
        nursery.cancel_scope.cancel()
    assert (response.status_code, response.json()["error"]) == (502, {
        "type": "api_error", "message": f"ctxd gateway: the upstream http://127.0.0.1:{port} "
                                        "was reached but gave no valid answer "
                                        "(RemoteProtocolError); check the gateway's "
                                        "anthropic_upstream in ctxd's config"})


async def test_a_connection_that_sends_nothing_is_closed(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    with ModelUpstream() as upstream:
        async with serving(tmp_path, upstream) as gateway:
            host, port = gateway.listen.rsplit(":", 1)
            idle = await trio.open_tcp_stream(host, int(port))
            started = trio.current_time()
            assert await idle.receive_some(4096) == b""  # closed, nothing said
            assert trio.current_time() - started == pytest.approx(REQUEST_TIMEOUT_S, abs=1)
            await trio.testing.wait_all_tasks_blocked()
            assert gateway.connections == 0
            await idle.aclose()


async def test_a_chunked_body_is_cut_off_at_the_limit(tmp_path: Path) -> None:
    with ModelUpstream() as upstream:
        async with serving(tmp_path, upstream) as gateway, httpx2.AsyncClient() as client:
            limit = gateway.config.max_body_bytes

            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(limit // 65_536 + 2):
                    yield b"x" * 65_536

            response = await client.post(gateway.base_url + "/v1/messages", content=chunks())
            assert (response.status_code, response.json()["error"]["type"]) == (
                413, "request_too_large")
            assert upstream.received == []


async def test_expect_100_continue_is_answered(tmp_path: Path) -> None:
    with ModelUpstream() as upstream:
        async with serving(tmp_path, upstream) as gateway:
            host, port = gateway.listen.rsplit(":", 1)
            stream = await trio.open_tcp_stream(host, int(port))
            await stream.send_all(
                f"POST /{TOKEN}/v1/messages HTTP/1.1\r\nHost: {gateway.listen}\r\n"
                f"Content-Length: {len(BODY)}\r\nExpect: 100-continue\r\n\r\n".encode())
            assert await stream.receive_some(4096) == b"HTTP/1.1 100 \r\n\r\n"
            await stream.send_all(BODY)
            answer = await stream.receive_some(65_536)
            assert answer.startswith(b"HTTP/1.1 200 ")
            assert [r.body for r in upstream.received] == [BODY]
            await stream.aclose()


# ---- usage --------------------------------------------------------------------------


def anthropic_stream() -> bytes:
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
                    for name, data in anthropic_events("msg_9", "claude-test"))


@pytest.mark.parametrize("stream", ["anthropic", "openai"])
def test_usage_is_read_from_a_stream_cut_anywhere(stream: str) -> None:
    data = anthropic_stream() if stream == "anthropic" else b"".join(
        f"data: {json.dumps(chunk)}\r\n\r\n".encode()
        for chunk in openai_chunks("chatcmpl-9", "gpt-test", usage=True)) + b"data: [DONE]"
    expected = ({"input_tokens": 21, "output_tokens": 7, "cache_read_tokens": 5,
                 "cache_write_tokens": 3} if stream == "anthropic" else
                {"input_tokens": 18, "output_tokens": 9, "cache_read_tokens": 12})
    response_id = "msg_9" if stream == "anthropic" else "chatcmpl-9"
    model = "claude-test" if stream == "anthropic" else "gpt-test"
    for cut in range(0, len(data), 7):
        reader = UsageReader(streaming=True)
        reader.feed(data[:cut])
        reader.feed(data[cut:])
        usage = reader.finish()
        assert (usage.response_id, usage.model, usage.counters) == (response_id, model,
                                                                    expected), cut


def test_usage_is_read_from_a_json_body() -> None:
    reader = UsageReader(streaming=False)
    body = json.dumps({"id": "msg_1", "model": "m", "usage": {
        "input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": 0}}).encode()
    reader.feed(body[:5])
    reader.feed(body[5:])
    usage = reader.finish()
    assert (usage.response_id, usage.counters, usage.cost) == (
        "msg_1", {"input_tokens": 3, "output_tokens": 4, "cache_read_tokens": 0}, 23.0)


def test_a_response_without_usage_counts_nothing() -> None:
    for streaming, data in ((False, b"not json"), (True, b"data: {\"type\": \"ping\"}\n\n"),
                            (False, b'{"input_tokens": 42}')):
        reader = UsageReader(streaming=streaming)
        reader.feed(data)
        assert reader.finish().counters == {}


# ---- headers, hosts, routing ----------------------------------------------------------


def test_request_headers_keep_keys_and_drop_hop_by_hop() -> None:
    sent = request_headers([
        (b"host", b"127.0.0.1:8788"), (b"x-api-key", b"k"), (b"authorization", b"Bearer b"),
        (b"anthropic-version", b"2023-06-01"), (b"anthropic-beta", b"x"),
        (b"connection", b"keep-alive, x-private"), (b"x-private", b"1"),
        (b"keep-alive", b"timeout=5"), (b"te", b"trailers"), (b"content-length", b"9"),
        (b"transfer-encoding", b"chunked"), (b"x-ctxd-session", b"s"),
        (b"accept-encoding", b"gzip"), (b"Upgrade", b"h2c")])
    assert sent == [(b"x-api-key", b"k"), (b"authorization", b"Bearer b"),
                    (b"anthropic-version", b"2023-06-01"), (b"anthropic-beta", b"x"),
                    (b"accept-encoding", b"identity")]


def test_response_headers_drop_hop_by_hop_only() -> None:
    assert response_headers([(b"Content-Type", b"text/event-stream"),
                             (b"Transfer-Encoding", b"chunked"), (b"Connection", b"close"),
                             (b"request-id", b"r"), (b"Content-Length", b"3")]) == [
        (b"Content-Type", b"text/event-stream"), (b"request-id", b"r"),
        (b"Content-Length", b"3")]


@pytest.mark.parametrize(("host", "loopback"), [
    (b"127.0.0.1:8788", True), (b"127.0.0.1", True), (b"localhost:1", True),
    (b"[::1]:8788", True), (b"127.9.9.9:80", True), (b"", False),
    (b"evil.example", False), (b"10.0.0.1:8788", False), (b"[::ffff:10.0.0.1]:1", False),
    (b"localhost.evil.example:8788", False), (b"127.0.0.1.nip.io", False)])
def test_only_a_loopback_host_passes(host: bytes, loopback: bool) -> None:
    assert _loopback_host(host) is loopback


@pytest.mark.parametrize(("path", "headers", "anthropic"), [
    ("/v1/messages", [], True), ("/v1/messages/batches", [], True),
    ("/v1/chat/completions", [(b"anthropic-version", b"1")], False),
    ("/v1/models", [(b"anthropic-version", b"1")], True), ("/v1/models", [], False)])
def test_a_path_picks_its_upstream(path: str, headers: list[tuple[bytes, bytes]],
                                   anthropic: bool) -> None:
    assert is_anthropic(path, headers) is anthropic


def test_an_ipv6_loopback_listen_is_served_and_named_in_brackets() -> None:
    try:
        sock = bind(GatewayConfig(listen="[::1]:0"))
    except OSError as exc:  # no IPv6 on this host
        pytest.skip(f"cannot bind [::1]: {exc}")
    with sock:
        port = sock.getsockname()[1]
        assert listen_text(sock.getsockname()) == f"[::1]:{port}"
        assert _loopback_host(f"[::1]:{port}".encode())


# ---- the token, the configuration -----------------------------------------------------


def test_the_token_is_made_once_private_and_kept(tmp_path: Path) -> None:
    token = load_token(tmp_path)
    path = tmp_path / "gateway.token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(token) == 43
    assert token.replace("-", "").replace("_", "").isalnum()
    os.chmod(path, 0o644)
    assert load_token(tmp_path) == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("short\n")
    assert load_token(tmp_path) not in (token, "short")


@pytest.mark.parametrize(("environ", "problem"), [
    ({"CTXD_GATEWAY_LISTEN": "0.0.0.0:8788"}, "0.0.0.0 is not a loopback address"),
    ({"CTXD_GATEWAY_LISTEN": "localhost:8788"}, "the host must be an IP address"),
    ({"CTXD_GATEWAY_LISTEN": "127.0.0.1"}, "expected HOST:PORT"),
    ({"CTXD_GATEWAY_LISTEN": "127.0.0.1:65536"}, "expected HOST:PORT"),
    ({"CTXD_GATEWAY_ANTHROPIC_UPSTREAM": "api.anthropic.com"}, "expected an http"),
    ({"CTXD_GATEWAY_OPENAI_UPSTREAM": "https://x/v1?key=1"}, "expected an http"),
    ({"CTXD_GATEWAY_MAX_BODY_BYTES": "10"}, "expected an integer from 1024"),
])
def test_the_configuration_refuses_what_cannot_serve(tmp_path: Path, environ: dict[str, str],
                                                     problem: str) -> None:
    (tmp_path / "empty.toml").write_text("")
    with pytest.raises(CtxdError) as caught:
        ctxd_config.load(environ=environ, config_path=tmp_path / "empty.toml")
    assert caught.value.message.startswith(next(iter(environ)) + ": ")
    assert problem in caught.value.message


def test_a_non_loopback_listen_is_taken_when_allowed(tmp_path: Path) -> None:
    (tmp_path / "empty.toml").write_text("")
    config = ctxd_config.load(environ={"CTXD_GATEWAY_LISTEN": "[::]:0",
                                       "CTXD_GATEWAY_ALLOW_NON_LOOPBACK": "true"},
                              config_path=tmp_path / "empty.toml")
    assert (config.gateway.listen, config.gateway.allow_non_loopback) == ("[::]:0", True)

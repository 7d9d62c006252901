"""The gateway's side of the provider: which upstream a path goes to, the headers that
cross, and the HTTP client that makes the calls (httpx2, on trio through anyio)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ctxd.config import GatewayConfig

if TYPE_CHECKING:
    import httpx2

HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate",
                        b"proxy-authorization", b"proxy-connection", b"te", b"trailer",
                        b"transfer-encoding", b"upgrade"})
"""Headers of one connection (RFC 9110 §7.6.1), never forwarded either way."""
NOT_FORWARDED = HOP_BY_HOP | {b"host", b"content-length", b"x-ctxd-session",
                              b"accept-encoding"}
"""Request headers the gateway does not pass on. Content-Length is the sent body's;
Accept-Encoding is replaced by ``identity``: the gateway reads the usage in the response
it streams back, and compression between two processes of one machine saves nothing."""
CONNECT_TIMEOUT_S = 30.0
READ_TIMEOUT_S = 600.0
"""Longest silence of an upstream within a response: a model thinking before its first
byte can be minutes, a dead upstream is given up after this."""
WRITE_TIMEOUT_S = 60.0

Headers = list[tuple[bytes, bytes]]


def connection_headers(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """The names a ``Connection`` header lists: hop-by-hop for this message too."""
    return frozenset(token.strip().lower() for name, value in headers
                     if name.lower() == b"connection" for token in value.split(b","))


def request_headers(headers: Headers) -> Headers:
    """The agent's headers as sent upstream: its keys and versions pass, as they are."""
    dropped = NOT_FORWARDED | connection_headers(headers)
    kept = [(name, value) for name, value in headers if name.lower() not in dropped]
    return [*kept, (b"accept-encoding", b"identity")]


def response_headers(headers: Headers) -> Headers:
    """The upstream's headers as sent back: all but the hop-by-hop ones."""
    dropped = HOP_BY_HOP | connection_headers(headers)
    return [(name, value) for name, value in headers if name.lower() not in dropped]


def is_anthropic(path: str, headers: Headers) -> bool:
    """Whether ``path`` (under the token) goes to the Anthropic upstream: the Messages API,
    or any request that names an ``anthropic-version`` (every Anthropic client sends it);
    the rest goes to OpenAI's."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return True
    if path.startswith("/v1/chat/"):
        return False
    return any(name.lower() == b"anthropic-version" for name, _ in headers)


def new_client(config: GatewayConfig) -> httpx2.AsyncClient:
    """The client of every upstream call: no headers of its own (the agent's are sent),
    no retries, no redirects followed (the agent sees them), a connection pool a call
    wide. httpx2 is imported here, by the first call: a daemon that serves no model call
    never loads it (80 ms of CPU of a start; docs/decisions.md, Gateway)."""
    import httpx2

    client = httpx2.AsyncClient(
        timeout=httpx2.Timeout(connect=CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S,
                               write=WRITE_TIMEOUT_S, pool=None),
        limits=httpx2.Limits(max_connections=config.max_upstream_calls,
                             max_keepalive_connections=config.max_upstream_calls),
        follow_redirects=False)
    for name in list(client.headers):
        del client.headers[name]
    # httpx2 logs each request's URL at INFO: a query may carry a key (some APIs take
    # one there), and keys never reach the log.
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    return client

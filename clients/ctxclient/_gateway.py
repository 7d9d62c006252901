"""The model gateway as ctxctl sees it (docs/protocol.md, "daemon.status"): its base URL
from ``daemon.status``'s ``gateway``, the URLs and environment that point an agent at it,
and its health check. No HTTP library but urllib: ctxctl imports neither httpx nor trio.
"""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ctxclient._errors import CtxdClientError, DaemonUnavailable, RpcError
from ctxclient._sync import Client
from ctxd.paths import is_default_socket

ANTHROPIC_ENV = "ANTHROPIC_BASE_URL"
"""Where Claude Code, the anthropic SDKs and most agents read Anthropic's base URL (the
SDKs add ``/v1/messages`` to it)."""
OPENAI_ENV = "OPENAI_BASE_URL"
"""Where the openai SDKs (and Codex, aider through litellm) read OpenAI's base URL; it
ends in ``/v1`` (the SDKs add ``/chat/completions``)."""
HEALTH_PATH = "/_ctxd/health"
HEALTH_TIMEOUT_S = 5.0
UPSTREAMS_TIMEOUT_S = 15.0
"""The gateway gives each upstream 5 s, side by side."""
ENABLE_FIX = ("set `enabled = true` under [gateway] in ctxd's config (ctxd.toml(5)), then "
              "restart ctxd: `ctxctl stop`, then `ctxd`")
_TOKEN = re.compile(r"/[A-Za-z0-9_-]{32,}")
LOOPBACK = ("127.0.0.1", "::1", "localhost")


class GatewayUnavailable(CtxdClientError):
    """No gateway to point an agent at: the daemon's is disabled, or no daemon answers.
    The message says why and the command to type next."""


def openai_url(base_url: str) -> str:
    """The OpenAI base URL of a gateway: its base URL and ``/v1``, as the openai SDKs'
    default (``https://api.openai.com/v1``) has it."""
    return base_url.rstrip("/") + "/v1"


def is_gateway_url(value: object) -> bool:
    """Whether ``value`` has the shape of a gateway's URL (plain HTTP on loopback, one
    path segment of a token, ``/v1`` after it or not): how uninstall knows a value as
    ctxd's when it has no record of writing it."""
    if not isinstance(value, str):
        return False
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return False
    path = parts.path.removesuffix("/v1").rstrip("/")
    return (parts.scheme == "http" and parts.hostname in LOOPBACK and port is not None
            and _TOKEN.fullmatch(path) is not None and not parts.query
            and not parts.fragment)


def base_url_of(status: Mapping[str, Any]) -> str:
    """The gateway's base URL from a ``daemon.status`` answer.

    Raises:
        GatewayUnavailable: its ``gateway`` is null: disabled (absent, from a ctxd without
            one, reads the same), or off (``gateway_off`` says why).
    """
    gateway = status.get("gateway")
    if gateway is None:
        off = status.get("gateway_off")
        raise GatewayUnavailable(f"the daemon's model gateway is disabled; {ENABLE_FIX}"
                                 if off is None else f"the daemon's model gateway is off: "
                                 f"{off}")
    url: str = gateway["base_url"]
    return url


def daemon_status(socket: str | None, start: bool, who: str) -> dict[str, Any]:
    """``daemon.status`` of the user's ctxd, started first when none answers and
    ``start`` (as ``ctxctl mcp`` starts one: docs/decisions.md, "One way to start a
    daemon").

    Raises:
        GatewayUnavailable: no daemon answers (and none could be started), naming the
            command to type next, or it answered with an error.
    """
    from ctxclient import _mcp

    try:
        if start:
            _mcp.connect(socket, os.environ, who=who).close()
        with Client(socket) as client:
            status: dict[str, Any] = client.call("daemon.status")
            return status
    except _mcp.PumpError as exc:
        raise GatewayUnavailable(str(exc)) from None
    except DaemonUnavailable as exc:
        # The user unit listens on ctxd's default socket only.
        default = socket is None or is_default_socket(socket)
        raise GatewayUnavailable(f"{exc} (or `systemctl --user start ctxd.socket`)"
                                 if default else str(exc)) from None
    except RpcError as exc:
        raise GatewayUnavailable(f"the daemon answered daemon.status with error {exc.code}: "
                                 f"{exc.message}") from None


def agent_environment(base_url: str, environ: Mapping[str, str],
                      socket: str | None) -> dict[str, str]:
    """``environ`` with the agents' base URLs pointing at the gateway, and
    ``CTXD_SOCKET`` when ``socket`` is given (so the agent's ctxd hooks and MCP server
    reach the same daemon)."""
    env = dict(environ)
    env[ANTHROPIC_ENV] = base_url
    env[OPENAI_ENV] = openai_url(base_url)
    if socket is not None:
        env["CTXD_SOCKET"] = os.path.abspath(socket)
    return env


def health_problem(base_url: str, timeout: float = HEALTH_TIMEOUT_S) -> str | None:
    """What is wrong with the gateway at ``base_url``, asked end to end over HTTP
    (``GET <base_url>/_ctxd/health``, expecting 200 and ``{"ok": true}``); None when it
    answers so."""
    return _health(base_url, "", timeout)[0]


def health_with_upstreams(base_url: str) -> tuple[str | None, list[dict[str, Any]] | None]:
    """`health_problem`, asked with ``?upstreams=1`` in the same request, and whether the
    gateway reaches each upstream (its ``upstreams``, each ``setting``, ``url``,
    ``reached``, ``status``, ``problem``; None when it does not say: no answer, or an
    older gateway)."""
    problem, answer = _health(base_url, "?upstreams=1", UPSTREAMS_TIMEOUT_S)
    found = None if answer is None else answer.get("upstreams")
    return problem, found if isinstance(found, list) else None


def _health(base_url: str, query: str, timeout: float
            ) -> tuple[str | None, dict[str, Any] | None]:
    """The health answer's problem (None: it answered ok) and the answer."""
    url = base_url.rstrip("/") + HEALTH_PATH + query
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    # No proxy: the gateway is on loopback, and a proxy from the environment must not
    # see its token.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            status, body = response.status, response.read(65536)
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read(65536)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"no answer from {shown(base_url)}{HEALTH_PATH} ({reason})", None
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if status != 200 or not isinstance(answer, dict) or answer.get("ok") is not True:
        text = body[:200].decode("utf-8", "replace")
        return f"{shown(base_url)}{HEALTH_PATH} answered {status}: {text}", None
    return None, answer


def shown(base_url: str) -> str:
    """The base URL with its token hidden (what doctor prints may be pasted elsewhere)."""
    parts = urlsplit(base_url)
    return f"{parts.scheme}://{parts.netloc}/<token>" if parts.path.strip("/") else base_url



RUN_FAILED = 125
"""``ctxctl run`` could not run the command (no daemon, no gateway), as env(1) and
timeout(1) say it; 126: the command cannot be executed; 127: it was not found."""
UPSTREAM_KEYS = {ANTHROPIC_ENV: "anthropic_upstream", OPENAI_ENV: "openai_upstream"}


def overridden(environ: Mapping[str, str], env: Mapping[str, str]) -> list[str]:
    """What ``ctxctl run`` says when the agent's environment already pointed a base URL
    elsewhere (a proxy): the gateway forwards to its configured upstream instead."""
    return [f"{key} was {environ[key]}; through the gateway, calls go to its "
            f"[gateway] {config} instead" for key, config in UPSTREAM_KEYS.items()
            if environ.get(key) and environ[key] != env[key]]


def exec_agent(argv: list[str], env: Mapping[str, str]) -> int:
    """Replace this process with ``argv`` in ``env``: the agent gets this process's id,
    its terminal and its signals, and its exit status is ours. Returns only when the
    command cannot be run: 127 when it is not found, 126 otherwise (a message said why).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], argv, dict(env))
    except FileNotFoundError:
        print(f"ctxctl run: {argv[0]}: command not found", file=sys.stderr)
        return 127
    except OSError as exc:
        print(f"ctxctl run: {argv[0]}: {exc.strerror}", file=sys.stderr)
        return 126

"""daemon.ping, daemon.hello, daemon.status, daemon.check, daemon.shutdown, daemon.log."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from ctxd import __version__
from ctxd.errors import CtxdError, ErrorCode, invalid_state
from ctxd.store import DatabaseError, integrity_problems
from ctxd.wire import Call, Dispatcher
from ctxd.wire.types import (
    CheckResult,
    DaemonLogParams,
    DaemonLogResult,
    DaemonStatus,
    Empty,
    HelloParams,
    HelloResult,
    PingResult,
    ShutdownResult,
)

if TYPE_CHECKING:
    from ctxd.daemon._app import Daemon

log = logging.getLogger("ctxd.client")

LOG_LINES_PER_MINUTE = 60
"""Client lines daemon.log writes per minute; more are dropped (docs/protocol.md,
daemon.log): a client in a loop cannot flood the journal."""
_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
               "error": logging.ERROR}

PROTOCOL_VERSION = 1
FEATURES = ["folding", "memory", "events", "usage", "tools", "inject", "cancel", "mcp"]
"""Protocol features this daemon implements (docs/protocol.md, daemon.hello); later
capabilities add theirs."""


def rss_bytes() -> int:
    """Resident set size of this process."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def register(dispatcher: Dispatcher, daemon: Daemon, request_stop: Callable[[], None]) -> None:
    """Add the daemon methods to the dispatcher."""

    def ping(call: Call, p: Empty) -> PingResult:
        return PingResult(pong=True, ts=time.time())

    def hello(call: Call, p: HelloParams) -> HelloResult:
        return HelloResult(name="ctxd", version=__version__, protocol_version=PROTOCOL_VERSION,
                           features=FEATURES,
                           agreed_features=[f for f in FEATURES if f in p.protocol_features])

    def status(call: Call, p: Empty) -> DaemonStatus:
        server = daemon.server.statistics()
        supervisor = daemon.supervisor
        return DaemonStatus(
            version=__version__, pid=os.getpid(),
            uptime_s=round(time.monotonic() - daemon.started, 3),
            socket=daemon.socket_path, data_dir=daemon.config.data_dir,
            sessions_open=supervisor.sessions_open, sessions_total=supervisor.sessions_total,
            session_actors=supervisor.actor_count, live_branches=supervisor.registry.count,
            memories=daemon.memory.count, memory_index=daemon.memory.status(),
            connections=server.connections, requests_inflight=server.requests_inflight,
            subscribers=daemon.bus.statistics().subscribers,
            db_size_bytes=daemon.store.size_bytes(), rss_bytes=rss_bytes(),
            requests_total=server.requests_total,
            requests_per_s=round(server.requests_per_s, 2),
            latency_p50_ms=round(server.latency_p50_ms, 3),
            latency_p99_ms=round(server.latency_p99_ms, 3),
            bytes_inflight=server.bytes_inflight, max_connections=server.max_connections)

    checking = trio.Lock()

    async def check(call: Call, p: Empty) -> CheckResult:
        # Its own read-only connection in a thread of its own: the writer goes on
        # committing meanwhile (WAL). One check at a time: each reads the whole file.
        if checking.locked():
            raise CtxdError(ErrorCode.OVERLOADED, "a database check is already running",
                            {"fix": "wait for its answer, then retry"})
        async with checking:
            started = time.monotonic()
            try:
                problems = await trio.to_thread.run_sync(
                    integrity_problems, daemon.store.path, abandon_on_cancel=True)
            except DatabaseError as error:
                raise CtxdError(ErrorCode.STORAGE_ERROR, str(error),
                                {"fix": "check the data directory"}) from None
        return CheckResult(database=str(daemon.store.path), ok=not problems,
                           problems=problems, seconds=round(time.monotonic() - started, 3))

    async def shutdown(call: Call, p: Empty) -> ShutdownResult:
        if call.peer.peer_uid != os.getuid():
            raise invalid_state("only the daemon's owner may shut it down",
                                "ask its owner, or stop it with systemctl",
                                owner_uid=os.getuid(), your_uid=call.peer.peer_uid)
        request_stop()
        return ShutdownResult(stopping=True)

    logged: list[float] = []

    def log_line(call: Call, p: DaemonLogParams) -> DaemonLogResult:
        now = time.monotonic()
        while logged and logged[0] <= now - 60.0:
            logged.pop(0)
        if len(logged) >= LOG_LINES_PER_MINUTE:
            return DaemonLogResult(logged=False)
        logged.append(now)
        # One line per call: a client's newlines and control characters are escaped.
        text = p.message.encode("unicode_escape").decode("ascii")
        log.log(_LOG_LEVELS[p.level], "%s (uid %s): %s", p.source, call.peer.peer_uid, text)
        return DaemonLogResult(logged=True)

    dispatcher.register_inline("daemon.ping", Empty, ping)
    dispatcher.register_inline("daemon.log", DaemonLogParams, log_line)
    dispatcher.register_inline("daemon.hello", HelloParams, hello)
    dispatcher.register_inline("daemon.status", Empty, status)
    dispatcher.register("daemon.check", Empty, check)
    dispatcher.register("daemon.shutdown", Empty, shutdown)

"""The operations that run on the daemon rather than on one session or service (the routes
``On.DAEMON``: daemon.*, events.*, request.cancel, turn.*, prompt.build). Each is
``op(daemon, call, params)``; the inline ones are plain functions."""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from typing import TYPE_CHECKING

import trio

from ctxd import __version__, hygiene
from ctxd.errors import CtxdError, ErrorCode, invalid_state, limit_reached, not_found
from ctxd.sessions import SessionActor, get_session
from ctxd.store import DatabaseError, integrity_problems
from ctxd.wire import Call
from ctxd.wire.types import (
    CheckResult,
    DaemonLogParams,
    DaemonLogResult,
    DaemonStatus,
    Empty,
    EventsSubscribeParams,
    EventsSubscribeResult,
    EventsUnsubscribeParams,
    EventsUnsubscribeResult,
    HelloParams,
    HelloResult,
    PingResult,
    PromptBuildParams,
    PromptBuildResult,
    RequestCancelParams,
    RequestCancelResult,
    ShutdownResult,
    Turn,
    TurnCancelParams,
    TurnEndParams,
    TurnListParams,
    TurnListResult,
    TurnRef,
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
FEATURE_ALIASES = {"token_usage": "usage", "tool_states": "tools", "injection": "inject",
                   "cancellation": "cancel"}
"""The fold protocol's names for ctxd's features: a client may send either."""


def rss_bytes() -> int:
    """Resident set size of this process."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class ClientLog:
    """daemon.log's allowance: the times of the lines written in the last minute."""

    def __init__(self) -> None:
        self._written: deque[float] = deque()

    def take(self, now: float) -> bool:
        """Whether one more line may be written at ``now`` (counted if so)."""
        while self._written and self._written[0] <= now - 60.0:
            self._written.popleft()
        if len(self._written) >= LOG_LINES_PER_MINUTE:
            return False
        self._written.append(now)
        return True


# ---- daemon.* ------------------------------------------------------------------------

def ping(daemon: Daemon, call: Call, p: Empty) -> PingResult:
    return PingResult(pong=True, ts=time.time())


def hello(daemon: Daemon, call: Call, p: HelloParams) -> HelloResult:
    """daemon.hello: ``agreed_features`` are the client's features this daemon has, as the
    client spelt them (ctxd's name or the fold protocol's), in the client's order."""
    agreed: list[str] = []
    for name in p.protocol_features:
        if FEATURE_ALIASES.get(name, name) in FEATURES and name not in agreed:
            agreed.append(name)
    return HelloResult(name="ctxd", version=__version__, protocol_version=PROTOCOL_VERSION,
                       features=FEATURES, agreed_features=agreed)


def status(daemon: Daemon, call: Call, p: Empty) -> DaemonStatus:
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
        bytes_inflight=server.bytes_inflight, max_connections=server.max_connections,
        gateway=daemon.gateway.status() if daemon.gateway is not None else None,
        gateway_off=daemon.gateway_off,
        team=daemon.team.status() if daemon.team is not None else None)


async def check(daemon: Daemon, call: Call, p: Empty) -> CheckResult:
    # Its own read-only connection in a thread of its own: the writer goes on
    # committing meanwhile (WAL). One check at a time: each reads the whole file.
    if daemon.checking.locked():
        raise CtxdError(ErrorCode.OVERLOADED, "a database check is already running",
                        {"fix": "wait for its answer, then retry"})
    async with daemon.checking:
        started = time.monotonic()
        try:
            problems = await trio.to_thread.run_sync(
                integrity_problems, daemon.store.path, abandon_on_cancel=True)
        except DatabaseError as error:
            raise CtxdError(ErrorCode.STORAGE_ERROR, str(error),
                            {"fix": "check the data directory"}) from None
    return CheckResult(database=str(daemon.store.path), ok=not problems,
                       problems=problems, seconds=round(time.monotonic() - started, 3))


async def shutdown(daemon: Daemon, call: Call, p: Empty) -> ShutdownResult:
    if call.peer.peer_uid != os.getuid():
        raise invalid_state("only the daemon's owner may shut it down",
                            "ask its owner, or stop it with systemctl",
                            owner_uid=os.getuid(), your_uid=call.peer.peer_uid)
    daemon.request_stop()
    return ShutdownResult(stopping=True)


def log_line(daemon: Daemon, call: Call, p: DaemonLogParams) -> DaemonLogResult:
    if not daemon.client_log.take(time.monotonic()):
        return DaemonLogResult(logged=False)
    # One line per call: a client's newlines and control characters are escaped.
    text = p.message.encode("unicode_escape").decode("ascii")
    log.log(_LOG_LEVELS[p.level], "%s (uid %s): %s", p.source, call.peer.peer_uid, text)
    return DaemonLogResult(logged=True)


# ---- events.* ------------------------------------------------------------------------

async def subscribe(daemon: Daemon, call: Call,
                    p: EventsSubscribeParams) -> EventsSubscribeResult:
    """events.subscribe: the connection becomes a stream of ``event`` notifications."""
    most = daemon.config.max_subscriptions_per_connection
    if call.peer.subscription_count >= most:
        raise limit_reached("max_subscriptions_per_connection", most,
                            f"this connection already has {most} subscriptions",
                            "unsubscribe one, or filter one subscription by types")
    subscription = daemon.bus.subscribe(p.session_id, p.types, p.since_seq)
    # The result goes out before the first notification: the pump starts after this
    # operation returns and the writer is fed in order.
    seq = daemon.bus.seq
    call.peer.attach(subscription)
    return EventsSubscribeResult(subscription_id=subscription.subscription_id, seq=seq)


async def unsubscribe(daemon: Daemon, call: Call,
                      p: EventsUnsubscribeParams) -> EventsUnsubscribeResult:
    if not call.peer.detach(p.subscription_id):
        raise not_found("subscription", p.subscription_id,
                        "use the subscription_id that events.subscribe returned on this "
                        "connection")
    return EventsUnsubscribeResult(unsubscribed=True)


# ---- request.cancel, turn.* ----------------------------------------------------------

def cancel_request(daemon: Daemon, call: Call, p: RequestCancelParams) -> RequestCancelResult:
    counts = daemon.requests.cancel(p.request_id, p.reason)
    if counts is None:
        raise CtxdError(ErrorCode.NOT_FOUND,
                        f"no request with id {p.request_id!r} is in flight",
                        {"request_id": p.request_id,
                         "fix": "use the id the request was sent with; it may have been "
                                "answered already"})
    cancelled, finishing = counts
    return RequestCancelResult(request_id=p.request_id, cancelled=cancelled,
                               finishing=finishing)


async def turn_start(daemon: Daemon, call: Call, p: TurnRef) -> Turn:
    await daemon.supervisor.call(p.session_id, _require_open)  # -32004 / -32003
    return daemon.turns.start(p.session_id, p.turn_id)


async def _require_open(actor: SessionActor) -> None:
    actor.require_open()


def turn_get(daemon: Daemon, call: Call, p: TurnRef) -> Turn:
    return daemon.turns.get(p.session_id, p.turn_id)


def turn_cancel(daemon: Daemon, call: Call, p: TurnCancelParams) -> Turn:
    return daemon.turns.cancel(p.session_id, p.turn_id, p.reason)


def turn_end(daemon: Daemon, call: Call, p: TurnEndParams) -> Turn:
    return daemon.turns.end(p.session_id, p.turn_id, p.cancelled)


def turn_list(daemon: Daemon, call: Call, p: TurnListParams) -> TurnListResult:
    return TurnListResult(turns=daemon.turns.list(p.session_id))


# ---- prompt.build --------------------------------------------------------------------

async def prompt_build(daemon: Daemon, call: Call, p: PromptBuildParams) -> PromptBuildResult:
    """prompt.build: the sections given, or those ctxd knows of the session (its memories,
    its context status)."""
    hygiene.check_prompt_params(p)
    if p.sections is not None:
        sections = p.sections
    else:
        assert p.session_id is not None  # check_prompt_params: exactly one of the two
        session = await daemon.supervisor.call(p.session_id, get_session)
        sections = await hygiene.session_sections(session, daemon.memory)
    return await hygiene.build_prompt(daemon.counter, sections, p.format)

"""The Daemon: start-up order, the root nursery, signals, graceful shutdown."""

from __future__ import annotations

import logging
import os
import resource
import signal
import socket
import time
from pathlib import Path

import trio

from ctxd import __version__, gateway, hub, memory, team
from ctxd.config import Config
from ctxd.daemon import _systemd
from ctxd.daemon._methods import ClientLog
from ctxd.daemon._routes import register_routes
from ctxd.daemon._server import Server
from ctxd.daemon._socket import Lock, bind_unix_socket, check_private_directory
from ctxd.hub import EventBus
from ctxd.sessions import Supervisor
from ctxd.store import Store
from ctxd.tokens import TokenCounter
from ctxd.wire import Dispatcher

log = logging.getLogger("ctxd")
DESCRIPTORS_KEPT = 32
"""File descriptors kept free for the daemon's own use (threads' files, the database's
journal, a refused connection's answer) beyond those open when it starts serving."""
CALLS_CANCEL_S = 1.0
"""At shutdown, time the gateway's calls still in flight at the deadline get to end their
answers with an error once cancelled."""


def raise_descriptor_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-files limit from %d to %d: %s",
                        soft, wanted, exc)
    return soft


def fitting_connections(wanted: int, limit: int) -> int:
    """How many of ``wanted`` connections fit in ``limit`` open files, given those open
    now; a warning is logged when fewer than ``wanted`` do (docs/security.md, "Resource
    limits")."""
    open_now = len(os.listdir("/proc/self/fd"))
    room = limit - open_now - DESCRIPTORS_KEPT
    if room >= wanted:
        return wanted
    fitting = max(1, room)
    log.warning("max_connections is %d but the open-files limit (%d, %d in use) leaves room "
                "for %d: serving at most %d connections; raise LimitNOFILE / ulimit -n to "
                "allow more", wanted, limit, open_now, fitting, fitting)
    return fitting


def bind_gateway(config: Config) -> tuple[socket.socket | None, str | None]:
    """The gateway's listening socket; None and why when ``[gateway] listen`` cannot be
    bound (the port is another process's: another user's ctxd on the default port), which
    is logged too: the daemon serves its socket without the gateway (docs/decisions.md,
    "Gateway"), and ``daemon.status`` says why."""
    try:
        return gateway.bind(config.gateway), None
    except OSError as exc:
        why = (f"it cannot listen on {config.gateway.listen} "
               f"({os.strerror(exc.errno) if exc.errno else exc}); set [gateway] listen to "
               "a free port (0: any) and restart ctxd")
        log.error("the gateway is off: %s", why)
        return None, why


class Daemon:
    """Everything one ctxd process owns.

    Start-up: data-dir lock → store opened and migrated → tokenizer loaded → socket
    bound (or taken from systemd) → actors and server started → READY=1.
    Shutdown (SIGTERM/SIGINT or daemon.shutdown): STOPPING=1 → stop accepting → in-flight
    requests finish (up to ``shutdown_timeout_s``) → actors stop → store checkpointed and
    closed → socket removed. A second signal exits at once; every acknowledged write has
    already committed, so nothing acknowledged is lost either way.
    """

    def __init__(self, config: Config):
        self.config = config
        self.started = time.monotonic()
        self.store = Store(Path(config.data_dir) / "ctxd.db", config.durability,
                           config.max_db_bytes)
        self.bus = EventBus(config.event_buffer, self.store, config.events_keep,
                            config.events_retention_days)
        self._stop = trio.Event()
        self.socket_path = config.socket
        """Where clients reach us: the configured path, or the activated socket's address."""
        self._signals = 0
        self.requests = hub.Requests()
        """The requests in flight that request.cancel may stop."""
        self.checking = trio.Lock()
        """Held while daemon.check reads the database (one check at a time)."""
        self.client_log = ClientLog()
        self.counter: TokenCounter
        self.supervisor: Supervisor
        self.memory: memory.Memory
        self.turns: hub.Turns
        self.dispatcher: Dispatcher
        self.server: Server
        self.gateway: gateway.Gateway | None = None
        """The model gateway (None when ``[gateway] enabled`` is false, or it is off)."""
        self.gateway_off: str | None = None
        """Why the enabled gateway is off (its port could not be bound)."""
        self.team: team.TeamLink | None = None

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        config = self.config
        # What ctxd creates holds transcripts (the database, its WAL and shared-memory
        # file): private to the user, whatever umask the caller had.
        os.umask(0o077)
        descriptor_limit = raise_descriptor_limit()
        data_dir = Path(config.data_dir)
        check_private_directory(data_dir)
        data_lock = Lock(data_dir / "ctxd.lock", f"data directory {data_dir}")
        try:
            await trio.to_thread.run_sync(self.store.open)
        except BaseException:
            data_lock.release()  # nothing started: the store said why, in one line
            raise
        sock: socket.socket | None = None
        gateway_sock: socket.socket | None = None
        socket_lock: Lock | None = None
        try:
            counter = await trio.to_thread.run_sync(TokenCounter, config.encoding)
            sock, gateway_sock = _systemd.activated_sockets()
            activated = sock is not None
            if sock is not None:
                self.socket_path = str(sock.getsockname())
            else:
                sock, socket_lock = bind_unix_socket(Path(config.socket))
            if not config.gateway.enabled and gateway_sock is not None:
                gateway_sock.close()  # the unit holds the port; ctxd was told not to serve
                gateway_sock = None
            elif config.gateway.enabled and gateway_sock is None:
                gateway_sock, self.gateway_off = bind_gateway(config)
            max_connections = fitting_connections(config.max_connections, descriptor_limit)
            await self._serve(sock, gateway_sock, counter, activated, max_connections)
        finally:
            if gateway_sock is not None:
                gateway_sock.close()
            if sock is not None:
                sock.close()
            if socket_lock is not None:
                # Remove the socket, then the lock file, while still holding the lock, so
                # no newcomer's is removed (Lock makes a newcomer that opened the removed
                # file take the lock again on a new one).
                try:
                    os.unlink(config.socket)
                except FileNotFoundError:
                    pass
                socket_lock.release(remove=True)
            self.store.close()
            data_lock.release()
            log.info("ctxd stopped")

    def assemble(self, counter: TokenCounter, max_connections: int) -> None:
        """Make the parts that serve, the store being open: memory, the supervisor, the
        server, and its dispatcher with every route (ctxd/daemon/_routes.py). Nothing
        runs until their tasks start."""
        self.counter = counter
        self.memory = memory.Memory(self.store, memory.make_embedder(self.config.memory),
                                    Path(self.config.data_dir) / "memory.faiss",
                                    self.config.memory, self.bus, counter)
        self.supervisor = Supervisor(self.store, counter, self.bus, self.config, self.memory)
        self.turns = hub.Turns(self.bus, cancel_timeout_s=self.config.cancel_timeout_s,
                               terminated=self._stop_session_calls)
        self.dispatcher = Dispatcher()
        self.server = Server(self.dispatcher, self.bus, self.config, max_connections,
                             self.requests)
        register_routes(self.dispatcher, self)

    def _stop_session_calls(self, session_id: str, turn_id: str) -> int:
        """A turn was terminated (its cancel went unanswered): cancel the session's model
        calls in flight through the gateway, as `request.cancel` would."""
        if self.gateway is None:
            return 0
        reason = f"turn {turn_id!r} was terminated: its cancel had no answer"
        return sum((self.requests.cancel(call.call_id, reason) or (0, 0))[0]
                   for call in self.gateway.status().inflight
                   if call.session_id == session_id)

    async def _start_team(self, root: trio.Nursery) -> team.TeamLink | None:
        """The team link of ``[memory.team]``, when it names a team; its database's URL
        comes from the variable ``url_env`` names (without it, the link reports why)."""
        config = self.config.memory.team
        if not config.name:
            return None
        url = os.environ.get(config.url_env, "")
        link = team.TeamLink(self.memory, config, url)
        if not url:
            link.error = f"{config.url_env} is not set: set it to the team database's URL"
            log.warning("team %s: %s", config.name, link.error)
            return link
        started: team.TeamLink = await root.start(link.run)
        return started

    async def _serve(self, sock: socket.socket, gateway_sock: socket.socket | None,
                     counter: TokenCounter, activated: bool, max_connections: int) -> None:
        self.assemble(counter, max_connections)
        if gateway_sock is not None:
            self.gateway = gateway.Gateway(
                self.config.gateway, self.supervisor, self.bus, self.requests,
                gateway.load_token(Path(self.config.data_dir)))
        async with trio.open_nursery() as root:
            root.start_soon(self._watch_signals)
            root.start_soon(self.store.keep_wal_small)
            await root.start(self.bus.run)
            await root.start(self.turns.run)
            await root.start(self.memory.run)
            self.team = await self._start_team(root)
            await root.start(self.supervisor.run)
            await root.start(self.server.run, sock)
            if self.gateway is not None:
                await root.start(self.gateway.run, gateway_sock)
                log.info("gateway on http://%s/…", self.gateway.listen)
            where = self.socket_path + (" (systemd-activated)" if activated else "")
            log.info("ctxd %s ready on %s (data in %s, pid %d)", __version__, where,
                     self.config.data_dir, os.getpid())
            _systemd.notify(f"READY=1\nSTATUS=serving on {where}\nMAINPID={os.getpid()}")
            interval = _systemd.watchdog_interval()
            if interval:
                root.start_soon(_systemd.keep_watchdog_fed, interval)
            await self._stop.wait()
            log.info("ctxd stopping")
            _systemd.notify("STOPPING=1")
            deadline = trio.current_time() + self.config.shutdown_timeout_s
            self.server.stop_accepting()
            if self.gateway is not None:
                self.gateway.stop_accepting()
            await self.server.closed.wait()
            if self.gateway is not None:
                # Model calls in flight may finish within the same deadline as the
                # socket's requests (a stream can last minutes); then they are cut.
                with trio.move_on_at(deadline):
                    await self.gateway.wait_calls_done()
                self.gateway.cancel_calls("ctxd is stopping")
                with trio.move_on_after(CALLS_CANCEL_S):
                    await self.gateway.wait_calls_done()
            root.cancel_scope.cancel()

    async def _watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                self._signals += 1
                if self._signals > 1:
                    log.warning("second %s: exiting at once", signal.Signals(signum).name)
                    os._exit(1)
                log.info("%s received: shutting down gracefully", signal.Signals(signum).name)
                self.request_stop()

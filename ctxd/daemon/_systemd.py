"""systemd integration without libsystemd: sd_notify and socket activation."""

from __future__ import annotations

import logging
import os
import socket
from typing import NamedTuple

import trio

log = logging.getLogger("ctxd.systemd")
SD_LISTEN_FDS_START = 3


def notify(state: str) -> bool:
    """Send ``state`` (e.g. ``READY=1``) to ``$NOTIFY_SOCKET``; False when not under systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        log.warning("sd_notify %s failed: %s", state.split("=")[0], exc)
        return False
    return True


class Activated(NamedTuple):
    """The listening sockets systemd passed us."""

    socket: socket.socket | None
    """The Unix stream socket clients reach (``ListenStream=%t/ctxd/ctxd.sock``)."""
    gateway: socket.socket | None
    """The model gateway's TCP socket (``ListenStream=127.0.0.1:8788``), if the unit has
    one."""


def activated_sockets() -> Activated:
    """The listening sockets systemd passed us (LISTEN_FDS/LISTEN_PID), told apart by
    their address family: one Unix socket, at most one TCP socket (the gateway's).

    Raises:
        RuntimeError: a socket passed is neither, or one kind comes twice.
    """
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return Activated(None, None)
    count = int(os.environ.get("LISTEN_FDS", "0") or 0)
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)
    found: dict[int, socket.socket] = {}
    for descriptor in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + count):
        sock = socket.socket(fileno=descriptor)
        if (sock.type != socket.SOCK_STREAM or sock.family in found
                or sock.family not in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6)):
            raise RuntimeError(
                "systemd may pass one Unix stream socket (ListenStream=%t/ctxd/ctxd.sock) "
                "and one TCP socket for the gateway (ListenStream=127.0.0.1:8788)")
        found[sock.family] = sock
    tcp = [sock for family, sock in found.items() if family != socket.AF_UNIX]
    if len(tcp) > 1:
        raise RuntimeError("systemd passed two TCP sockets; the gateway listens on one")
    return Activated(found.get(socket.AF_UNIX), tcp[0] if tcp else None)


def watchdog_interval() -> float | None:
    """Half the watchdog period systemd asked for, in seconds, or None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2 / 1_000_000


async def keep_watchdog_fed(interval: float) -> None:
    """Send WATCHDOG=1 every ``interval`` seconds from the event loop (a stuck loop starves it)."""
    while True:
        notify("WATCHDOG=1")
        await trio.sleep(interval)

"""systemd integration without libsystemd: sd_notify and socket activation."""

from __future__ import annotations

import logging
import os
import socket

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


def activated_socket() -> socket.socket | None:
    """The listening socket systemd passed us (LISTEN_FDS/LISTEN_PID), if any."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    count = int(os.environ.get("LISTEN_FDS", "0") or 0)
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)
    if count < 1:
        return None
    sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        raise RuntimeError("the activated socket must be a Unix stream socket "
                           "(ListenStream=%t/ctxd/ctxd.sock)")
    return sock


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

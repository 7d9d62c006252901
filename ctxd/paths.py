"""Where ctxd's socket, data and configuration are when nothing else is said; see ctxd(1),
FILES. And whether a socket is the user's own ctxd's (docs/security.md, "Who serves the
socket"): the check every Python client makes before it sends a byte.

Only the standard library: the clients import this module, and must not load the daemon
(its tokenizer, its store) just to find the socket; `ctxctl hook` imports it too, so not
`socket` nor `typing` either.
"""

from __future__ import annotations

import _socket
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    class Socket(Protocol):
        def getsockopt(self, level: int, option: int, buflen: int, /) -> bytes: ...

MAX_SOCKET_PATH = 107
"""Bytes of a Unix socket's path (sun_path is 108 with the terminating NUL)."""


def _home(environ: Mapping[str, str]) -> Path:
    return Path(environ["HOME"]) if environ.get("HOME") else Path.home()


def default_socket_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the daemon listens and clients connect when nothing else is said."""
    environ = os.environ if environ is None else environ
    explicit = environ.get("CTXD_SOCKET")
    if explicit:
        return Path(explicit)
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "ctxd" / "ctxd.sock"
    return Path(f"/tmp/ctxd-{os.getuid()}") / "ctxd.sock"


def is_default_socket(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is the socket ctxd takes when nothing else is said (here, now)."""
    return os.path.abspath(path) == os.path.abspath(default_socket_path())


def default_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where the database lives when nothing else is said."""
    environ = os.environ if environ is None else environ
    data_home = environ.get("XDG_DATA_HOME") or str(_home(environ) / ".local" / "share")
    return Path(data_home) / "ctxd"


def default_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the TOML file is looked for (``$CTXD_CONFIG`` overrides)."""
    environ = os.environ if environ is None else environ
    explicit = environ.get("CTXD_CONFIG")
    if explicit:
        return Path(explicit)
    config_home = environ.get("XDG_CONFIG_HOME") or str(_home(environ) / ".config")
    return Path(config_home) / "ctxd" / "config.toml"


class UntrustedSocket(Exception):
    """A socket that is not the user's own ctxd's: its directory is another user's or open
    to others, or another user's process listens on it. The message says what to do."""


SOCKET_FIX = ("set XDG_RUNTIME_DIR or CTXD_SOCKET to a private directory (mode 0700) of "
              "your own")
"""How to choose a socket elsewhere, for the messages that refuse one."""


def shared_directory(directory: str | os.PathLike[str], info: os.stat_result) -> bool:
    """Whether a directory is there for others too: sticky or writable by others (like
    /tmp, /dev/shm), or a `system_directory`. Advice never asks to change its mode."""
    return bool(info.st_mode & (stat.S_ISVTX | 0o022)) or system_directory(directory)


def system_directory(directory: str | os.PathLike[str]) -> bool:
    """Whether a directory is the system's (/, /tmp, /run, /var, /run/user: at the top),
    which no advice asks to remove."""
    resolved = Path(directory).resolve()
    return len(resolved.parts) <= 2 or resolved == Path("/run/user")


def foreign_directory(directory: str | os.PathLike[str], owner: int) -> str:
    """The one line that refuses a socket directory another user owns (the client's and the
    daemon's: someone may have made it to pose as the user's ctxd)."""
    return (f"{directory} is owned by uid {owner}, not by you (uid {os.getuid()}), so a "
            f"socket there is not your ctxd's: have it removed (by uid {owner} or root), or "
            f"{SOCKET_FIX}")


def check_socket_directory(path: str | os.PathLike[str]) -> None:
    """Refuse a socket whose directory is not a private one of the user's own (theirs, mode
    0700): anyone else could have put a socket there. A directory that does not exist (or
    cannot be looked at) passes: connecting fails, and says why.

    The directory is followed if it is a symlink: connecting goes where it points. Who
    listens is checked again once connected (`check_peer`).

    Raises:
        UntrustedSocket: the directory is another user's, shared, or open to others.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        info = os.stat(directory)
    except OSError:
        return
    if info.st_uid == os.getuid() and not info.st_mode & 0o077:
        return
    if system_directory(directory) or (info.st_uid == os.getuid()
                                       and shared_directory(directory, info)):
        raise UntrustedSocket(f"{directory} is shared with other users, so a socket there may "
                              f"not be your ctxd's: {SOCKET_FIX}")
    if info.st_uid != os.getuid():
        raise UntrustedSocket(foreign_directory(directory, info.st_uid))
    raise UntrustedSocket(f"{directory} has mode {stat.S_IMODE(info.st_mode):04o}, so others "
                          f"could have put a socket there: make it private with "
                          f"`chmod 700 {directory}`, or {SOCKET_FIX}")


def peer_uid(sock: Socket) -> int:
    """The uid of the process at the other end of a connected Unix socket (SO_PEERCRED:
    for a client, whoever called listen)."""
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    return int.from_bytes(creds[4:8], sys.byteorder)  # struct ucred: pid, uid, gid


def check_peer(sock: Socket, path: str | os.PathLike[str]) -> None:
    """Refuse a connected socket unless the user's own process listens on it; call it
    before sending a byte.

    Raises:
        UntrustedSocket: another user's process (root's too) listens there.
    """
    uid = peer_uid(sock)
    if uid != os.getuid():
        raise UntrustedSocket(f"{path} is served by uid {uid}, not by you (uid {os.getuid()}), "
                              "so it is not your ctxd; nothing was sent to it: stop that "
                              f"server (or have root do so), or {SOCKET_FIX}")


__all__ = ["MAX_SOCKET_PATH", "SOCKET_FIX", "UntrustedSocket", "check_peer",
           "check_socket_directory", "default_config_path", "default_data_dir",
           "default_socket_path", "foreign_directory", "peer_uid", "shared_directory",
           "system_directory"]

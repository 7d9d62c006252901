"""Socket placement: the private directory, the lock file, stale sockets."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
from pathlib import Path

from ctxd.paths import MAX_SOCKET_PATH, foreign_directory, shared_directory, system_directory


class PlacementError(Exception):
    """The socket or data directory is unsafe or taken; the message says what to do."""


def check_private_directory(directory: Path, create: bool = True) -> None:
    """Create ``directory`` 0700 if missing (unless not ``create``: a missing one passes);
    refuse one that others could tamper with.

    Raises:
        PlacementError: it cannot be created, or it is a symlink, not a directory, owned by
            another user, or open to group/others.
    """
    try:
        if not create:
            if not os.path.lexists(directory):
                return
        else:
            with contextlib.suppress(FileExistsError):
                directory.mkdir(mode=0o700, parents=True)
        info = os.lstat(directory)
    except OSError as exc:
        raise PlacementError(f"cannot create the directory {directory}: "
                             f"{exc.strerror or exc}") from None
    if stat.S_ISLNK(info.st_mode):
        raise PlacementError(f"{directory} is a symlink; ctxd needs a real private directory")
    if not stat.S_ISDIR(info.st_mode):
        raise PlacementError(f"{directory} is not a directory")
    if info.st_uid != os.getuid():
        raise PlacementError(f"{directory} belongs to uid {info.st_uid}, not to you "
                             f"(uid {os.getuid()}); choose a directory of your own")
    if info.st_mode & 0o077:
        mode = stat.S_IMODE(info.st_mode)
        if shared_directory(directory, info):
            # Never advise changing a directory others rely on (/tmp, /run, …).
            raise PlacementError(f"{directory} has mode {mode:04o} and is shared; ctxd "
                                 "needs a private directory (mode 0700) of your own: choose "
                                 "one (a path inside a new directory) for --socket/--data-dir")
        raise PlacementError(f"{directory} has mode {mode:04o}; "
                             f"it must be private: chmod 700 {directory}")


class Lock:
    """An ``flock`` held for the daemon's lifetime, with the holder's pid written in it.

    A holder may remove the file when it lets go (`release`), so a lock is only taken on
    the file that is still at the path: one opened just before the holder removed it is
    locked in vain, and taking the lock starts over on the new file.
    """

    def __init__(self, path: Path, what: str):
        self.path = path
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise PlacementError(
                    f"cannot open the lock file {path} ({exc.strerror or exc}); ctxd needs "
                    f"to write in {path.parent}: check its permissions and that its file "
                    "system is not mounted read-only, or choose another --socket/--data-dir"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise PlacementError(f"another ctxd (pid {holder}) is already running on "
                                     f"{what}; stop it first (ctxctl stop) or choose another "
                                     "--socket/--data-dir") from None
            if _same_file(fd, path):
                break
            os.close(fd)  # removed by the holder we waited for: lock the new one
        self._fd = fd
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self, remove: bool = False) -> None:
        """Let go; with ``remove``, delete the file first, while it is still held."""
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        os.close(self._fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        at_path = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (at_path.st_dev, at_path.st_ino)


def check_socket_path(path: Path, create: bool = True) -> None:
    """Refuse a socket path that `bind_unix_socket` could not use; its directory is created
    (0700) when missing (unless not ``create``).

    The daemon calls it before it touches its data directory, so a mistyped ``--socket``
    leaves nothing behind.

    Raises:
        PlacementError: the path is too long, its directory cannot be created or is
            unsafe, or something that is not a socket sits at the path.
    """
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise PlacementError(f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes; "
                             "choose a shorter --socket")
    _check_not_foreign(path.parent)
    _check_not_other_file(path)
    check_private_directory(path.parent, create)


def _check_not_foreign(directory: Path) -> None:
    """Refuse, first and whatever is in it, a socket directory another user made: they may
    pose as this user's ctxd there (/tmp/ctxd-<uid>), and the line says what to do as
    clients say it (`ctxd.paths.foreign_directory`)."""
    try:
        owner = os.lstat(directory).st_uid
    except OSError:
        return  # missing: check_private_directory creates it, or says why it cannot
    if owner != os.getuid() and not system_directory(directory):
        raise PlacementError(foreign_directory(directory, owner))


def _check_not_other_file(path: Path) -> None:
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return  # nothing there (a parent that is no directory is check_private_directory's)
    except OSError as exc:
        raise PlacementError(f"cannot look at {path}: {exc.strerror or exc}") from None
    if not stat.S_ISSOCK(info.st_mode):
        raise PlacementError(f"{path} exists and is not a socket; not removing it")


def bind_unix_socket(path: Path) -> tuple[socket.socket, Lock]:
    """Lock, clear a stale socket, and bind ``path`` with mode 0600.

    Raises:
        PlacementError: the path is too long, the directory unsafe, another daemon holds
            the lock, or something that is not a socket sits at the path.
    """
    check_socket_path(path)
    lock = Lock(path.with_name(path.name + ".lock"), str(path))
    try:
        _check_not_other_file(path)  # again: it may have appeared since
        if os.path.lexists(path):
            os.unlink(path)  # stale: nobody holds the lock
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            sock.bind(str(path))
        finally:
            os.umask(old_umask)
        sock.listen(512)
    except BaseException:
        lock.release()
        raise
    return sock, lock

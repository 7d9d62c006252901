"""Opening a file a client names (a transcript to import): only a regular file, checked on
what was opened, never on the path before it (docs/security.md, "Resource limits").

A path checked with ``stat`` and opened afterwards may be swapped in between: a FIFO opened
for reading blocks until a writer comes, and a read of it until the writer writes, each
holding a worker thread for good. So the file is opened without blocking and without
becoming a controlling terminal, and ``fstat`` of the open descriptor decides.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from ctxd.errors import CtxdError, params_error

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def kind_of(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words (``a FIFO (named pipe)``)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: Path, field: str = "$.path") -> BinaryIO:
    """``path`` opened for reading (blocking reads), if what it opens is a regular file.

    Args:
        path: the file (a symbolic link is followed: what it leads to is checked).
        field: the request's field the path came from, for the error.

    Raises:
        CtxdError: -32602 at ``field`` naming the path and what it is (a FIFO, a directory,
            a device, a socket), or why it cannot be opened.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise params_error(field, f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise params_error(field, f"{path} is {kind_of(mode)}, not a regular file; give "
                                      "the path of a transcript file")
        os.set_blocking(fd, True)
        return open(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise



def read_inside(path: str, root: str, max_bytes: int) -> str | None:
    """The UTF-8 text of the file at ``path`` when it is a regular file inside the folder
    ``root`` (both resolved: a link out of it is outside) of at most ``max_bytes``; None
    otherwise. For a path another file names (Claude Code's transcript names the file it
    saved a large output to): it reads nothing outside the folder the client gave."""
    if not os.path.isabs(path):
        return None
    real, top = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([real, top]) != top:
        return None
    try:
        with open_regular(Path(real)) as file:
            data = file.read(max_bytes + 1)
        return data.decode() if len(data) <= max_bytes else None
    except (CtxdError, OSError, UnicodeDecodeError):
        return None

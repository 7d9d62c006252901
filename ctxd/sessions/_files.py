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

from ctxd.errors import params_error

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


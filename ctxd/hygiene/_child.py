"""Child processes that die with the daemon (the command summarizer's): forked by one
thread that lives as long as the daemon, with ``PR_SET_PDEATHSIG``, each the leader of a
process group of its own (docs/decisions.md, "Child processes die with the daemon").

Linux sends the parent-death signal when the *thread* that forked the child ends, not the
process: a child forked from a worker thread of trio's cache (as ``trio.lowlevel.open_process``
forks) would be killed ten seconds after that thread fell idle. So every child is forked by
one long-lived thread, and its pipes and its exit are then awaited on the event loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from functools import partial

import trio

from ctxd.store import WorkerThread

PR_SET_PDEATHSIG = 1
"""prctl(2)'s option: the signal a process gets when its parent thread ends."""
_prctl: Callable[..., int] | None = (ctypes.CDLL(None, use_errno=True).prctl
                                     if sys.platform == "linux" else None)
"""Looked up once, before any fork: a child only makes the call."""

_forker: WorkerThread | None = None
"""The thread that forks every child; started at the first, it lives as long as the process
(a child it forked would be killed when it ended)."""


def _forking_thread() -> WorkerThread:
    global _forker
    if _forker is None:
        _forker = WorkerThread("ctxd-children")
    return _forker


def _die_with(parent: int, prctl: Callable[..., int]) -> None:
    """In the child, before exec: SIGKILL when the daemon ends, even of SIGKILL; at once if
    it ended before this ran (the child was then given to another parent)."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


class Child:
    """A running child: its pipes as trio streams, its exit awaited on the event loop."""

    def __init__(self, popen: subprocess.Popen[bytes], stdin: trio.lowlevel.FdStream,
                 stdout: trio.lowlevel.FdStream, stderr: trio.lowlevel.FdStream):
        self._popen = popen
        self.pid = popen.pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr

    @property
    def returncode(self) -> int | None:
        """Its exit status once `wait` has seen it exit (a signal's as its negative)."""
        return self._popen.returncode

    async def wait(self) -> int:
        """Until it exits; its exit status (it is then reaped)."""
        if self._popen.returncode is None:
            pidfd = os.pidfd_open(self.pid)
            try:
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                os.close(pidfd)
        return self._popen.wait()

    def kill(self) -> None:
        """SIGKILL its process group (it and whatever it started), unless it was reaped."""
        if self._popen.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)


async def open_child(argv: Sequence[str]) -> Child:
    """Start ``argv`` with its stdin, stdout and stderr on pipes, in a process group of its
    own, to be SIGKILLed when the daemon ends (on Linux).

    Raises:
        OSError: it could not be started (no such program, not executable).

    Cancellation: not abandoned; a fork under way finishes (and its child is returned).
    """
    pipes = [os.pipe() for _ in range(3)]  # non-inheritable: only the child's ends are passed
    (stdin_read, stdin_write), (stdout_read, stdout_write), (stderr_read, stderr_write) = pipes
    preexec = None if _prctl is None else partial(_die_with, os.getpid(), _prctl)

    def fork() -> subprocess.Popen[bytes]:
        return subprocess.Popen(list(argv), stdin=stdin_read, stdout=stdout_write,
                                stderr=stderr_write, process_group=0, preexec_fn=preexec)

    try:
        popen = await _forking_thread().run(fork)
    except BaseException:
        for read, write in pipes:
            os.close(read)
            os.close(write)
        raise
    for fd in (stdin_read, stdout_write, stderr_write):
        os.close(fd)
    return Child(popen, trio.lowlevel.FdStream(stdin_write),
                 trio.lowlevel.FdStream(stdout_read), trio.lowlevel.FdStream(stderr_read))

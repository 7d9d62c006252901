"""Starting a ctxd process: the one way ``ctxctl mcp`` (when no daemon answers),
``ctxctl replay``, the tests and the benchmarks run a daemon (docs/decisions.md, "One way
to start a daemon").

The daemon runs as ``python -P -m ctxd``: ``-P`` keeps the current directory (and a
wrapper script's folder) off ``sys.path``, so a folder named ``ctxd`` where the user
stands is never imported in place of the installed package. ``-I`` and ``-s`` would also
drop the user's site-packages (where ``pip install --user`` puts ctxd), and ``-I``/``-E``
``PYTHONPATH``, which runs another checkout's code (``code=``). An empty or relative entry
of ``PYTHONPATH`` (``export PYTHONPATH=$PYTHONPATH:/x`` with none before leaves one) puts
the current directory back even with ``-P``: the daemon gets the absolute entries only.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ctxd.paths import is_default_socket

MODULE = ("-m", "ctxd")
"""What runs ctxd after the interpreter's flags."""
INHERITED_BY_NO_PRIVATE_DAEMON = ("CTXD_", "NOTIFY_SOCKET", "LISTEN_", "WATCHDOG_")
"""What a private daemon must not take from its starter's environment: the user's ctxd
settings, and systemd's notify socket, activation sockets and watchdog."""
_PR_SET_PDEATHSIG = 1


def daemon_command(args: Sequence[str] = (), *, python: str | None = None,
                   entry: Sequence[str] = MODULE) -> list[str]:
    """The command line of a ctxd: ``python -P -m ctxd ARGS``.

    Args:
        args: ctxd's own arguments (``--socket``, ``--data-dir``, …).
        python: the interpreter (default: this one).
        entry: what runs after ``-P``: ``-m ctxd``, or a profiler or script that runs
            ctxd's ``main`` (``-m cProfile -o FILE -m ctxd``).
    """
    return [python or sys.executable, "-P", *entry, *args]


def private_environment(overrides: Mapping[str, str] | None = None,
                        environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) without what would make a private daemon
    take the user's settings or systemd's place (`INHERITED_BY_NO_PRIVATE_DAEMON`), then
    ``overrides``."""
    source = os.environ if environ is None else environ
    env = {key: value for key, value in source.items()
           if not key.startswith(INHERITED_BY_NO_PRIVATE_DAEMON)}
    env.update(overrides or {})
    return env


def absolute_entries(pythonpath: str) -> str:
    """``pythonpath`` without its empty and relative entries, which Python takes from the
    current directory (where a folder named ``ctxd`` would shadow the package)."""
    return os.pathsep.join(entry for entry in pythonpath.split(os.pathsep)
                           if os.path.isabs(entry))


def _die_with_parent() -> None:
    """In the daemon's child, before exec: SIGTERM when its starter dies, even of SIGKILL
    (Linux's PR_SET_PDEATHSIG); a detached daemon gets no signal of the terminal's."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def open_log(log: Path) -> int:
    """A descriptor that appends to a daemon's log, the file made 0600 (it may hold what
    the daemon logs of its sessions).

    Raises:
        OSError: it cannot be opened.
    """
    descriptor = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.fchmod(descriptor, 0o600)
    except OSError:
        os.close(descriptor)
        raise
    return descriptor


def start_command(search_path: str | None = None, socket: str | None = None) -> str:
    """What starts the daemon from where this client runs: ``ctxd`` when the ``ctxd``
    beside this interpreter is the one ``PATH`` (or ``search_path``) finds, else that
    one's full path (a virtualenv not activated); ``ctxd`` when there is none beside it.
    With ``socket`` other than the one ctxd takes by default here, ``--socket`` and it."""
    beside = Path(sys.executable).parent / "ctxd"
    command = "ctxd" if not beside.is_file() or shutil.which(
        "ctxd", path=search_path) == str(beside) else shlex.quote(str(beside))
    if socket is not None and not is_default_socket(socket):
        command += f" --socket {shlex.quote(os.path.abspath(socket))}"
    return command


def spawn_daemon(args: Sequence[str] = (), *, log: Path,
                 env: Mapping[str, str] | None = None, python: str | None = None,
                 entry: Sequence[str] = MODULE, code: Path | None = None,
                 detach: bool = False, die_with_parent: bool = False,
                 cwd: Path | None = None, pass_fds: Sequence[int] = (),
                 before_exec: Callable[[], object] | None = None
                 ) -> subprocess.Popen[bytes]:
    """Start ctxd (`daemon_command`) in the background and return at once; the caller
    waits until its socket answers.

    Args:
        args: ctxd's own arguments.
        log: its stdout and stderr are appended there (the file is made 0600).
        env: its environment (default: this process's).
        python: the interpreter (default: this one).
        entry: see `daemon_command`.
        code: a source tree whose ``ctxd`` package runs instead of the installed one (a
            benchmark's baseline checkout): put first on ``PYTHONPATH``.
        detach: in a session of its own: the terminal's signals (Ctrl-C) do not reach it.
        die_with_parent: SIGTERM when the calling process dies (Linux).
        cwd: its working directory (default: this process's); it never imports from it.
        pass_fds: descriptors it inherits (a systemd-style listening socket).
        before_exec: run in the child before it becomes ctxd (a benchmark's resource
            limits).

    Raises:
        OSError: the log cannot be opened or the interpreter cannot be run.
    """
    environment = dict(os.environ if env is None else env)
    kept = absolute_entries(environment.get("PYTHONPATH", ""))
    if kept:
        environment["PYTHONPATH"] = kept
    else:
        environment.pop("PYTHONPATH", None)
    if code is not None:
        environment["PYTHONPATH"] = os.pathsep.join(
            [str(code), *filter(None, [environment.get("PYTHONPATH")])])
    steps = [step for step in (_die_with_parent if die_with_parent and sys.platform == "linux"
                               else None, before_exec) if step is not None]

    def prepare() -> None:
        for step in steps:
            step()

    descriptor = open_log(log)
    try:
        return subprocess.Popen(
            daemon_command(args, python=python, entry=entry), stdin=subprocess.DEVNULL,
            stdout=descriptor, stderr=descriptor, env=environment, cwd=cwd,
            pass_fds=tuple(pass_fds), start_new_session=detach,
            preexec_fn=prepare if steps else None)
    finally:
        os.close(descriptor)

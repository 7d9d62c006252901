"""DaemonProcess: a ctxd started by ``ctxclient.spawn_daemon`` (``python -P -m ctxd``) on a
private socket and data directory, for the end-to-end tests and for the benchmarks (which
add this folder to their import path); in the test suite, forked from a process that has
imported ctxd (`FORKED_BY_DEFAULT`)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ctxclient import Client, DaemonUnavailable, daemon_command, private_environment, spawn_daemon

REPO_ROOT = Path(__file__).resolve().parents[1]
NO_PROVIDER = "http://127.0.0.1:1"
"""The upstream of a test daemon's gateway unless the test gives one: a port nothing
listens on (1, tcpmux), so a call is refused at once."""
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0

FORKED_BY_DEFAULT = False
"""Whether a DaemonProcess is `forked` unless told: the test suite sets it (tests/conftest.py);
a benchmark, which measures starts, runs the command."""
_forkserver = multiprocessing.get_context("forkserver")
_forkserver.set_forkserver_preload(["forked_daemon"])
_forked_pids: set[int] = set()
_forkserver_started = False


def _start_forkserver() -> None:
    """Start the forkserver once, with this folder on its ``PYTHONPATH``: Python 3.11's
    forkserver imports its preload on its own ``sys.path``, not this process's, and skips
    a module it cannot import (every daemon would then import ctxd again)."""
    from multiprocessing import forkserver

    global _forkserver_started
    if _forkserver_started:
        return
    _forkserver_started = True
    folder = str(Path(__file__).resolve().parent)
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [folder, before]))
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def forked_pids() -> set[int]:
    """The daemons this process forked that have not been seen to exit."""
    return set(_forked_pids)


class ForkedProcess:
    """A daemon forked from the forkserver (tests/forked_daemon.py), with the part of
    `subprocess.Popen`'s interface that DaemonProcess and the tests use: its exit code is
    as Popen gives it (``-N`` for signal N)."""

    def __init__(self, entry: list[str], args: list[str], env: dict[str, str], log: Path,
                 cwd: Path | None):
        from forked_daemon import run

        _start_forkserver()
        self.args = [*entry, *args]
        self._process = _forkserver.Process(target=run, args=(entry, args, env, log, cwd),
                                            daemon=True)  # stopped if a test leaves it
        self._process.start()
        assert self._process.pid is not None
        self.pid: int = self._process.pid
        self.returncode: int | None = None
        _forked_pids.add(self.pid)

    def poll(self) -> int | None:
        if self.returncode is None and self._process.exitcode is not None:
            self.returncode = self._process.exitcode
            self._process.close()
            _forked_pids.discard(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._process.join(timeout)
        code = self.poll()
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def entry_with(constants: Mapping[str, object]) -> list[str]:
    """The entry (`DaemonProcess.entry`) of a ctxd whose module constants, named
    ``module.NAME``, are set before it runs: a test's daemon that waits less than a user's
    where the test would otherwise sit out the whole wait (the same code runs). A constant
    that is not there (moved, renamed) stops the daemon with AttributeError."""
    lines = ["import importlib, runpy"]
    for dotted, value in constants.items():
        module, name = dotted.rsplit(".", 1)
        lines.append(f"module = importlib.import_module({module!r})")
        lines.append(f"getattr(module, {name!r})")
        lines.append(f"setattr(module, {name!r}, {value!r})")
    lines.append('runpy.run_module("ctxd", run_name="__main__", alter_sys=True)')
    return ["-c", "\n".join(lines)]


class DaemonFailed(Exception):
    """The daemon exited or did not answer as it started, or ignored a signal to stop; the
    message ends with its log."""


@dataclass
class DaemonProcess:
    """A ctxd started with ``python -P -m ctxd``: the installed package (this tree, in the
    development install), or the tree named by ``code``; never one where it stands.

    Its socket is ``<root>/run/<name>.sock``, its log ``<root>/<name>.log`` and its
    configuration folder ``<root>/config``: daemons that share a root differ by name.
    """

    root: Path
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    name: str = "ctxd"
    data: Path | None = None
    """Its data directory (default ``<root>/data``)."""
    python: str = sys.executable
    profile: Path | None = None
    """Where cProfile writes the daemon's profile (default: not profiled)."""
    entry: list[str] = field(default_factory=lambda: ["-m", "ctxd"])
    """What runs the daemon after the interpreter: ``-m ctxd``, or a script that wraps it."""
    code: Path | None = None
    """Another source tree whose ctxd runs (a benchmark's baseline checkout)."""
    start_timeout: float = START_TIMEOUT_S
    forked: bool = field(default_factory=lambda: FORKED_BY_DEFAULT)
    """Forked from the forkserver, which has imported ctxd and loaded its tokenizer, rather
    than started as a command: its entry runs the same, without a start's imports. Only a
    daemon of this tree in this interpreter, unprofiled, without descriptors to inherit
    or a step before it runs is forked; any other runs its command."""
    proc: subprocess.Popen[bytes] | ForkedProcess | None = None

    @property
    def socket(self) -> Path:
        return self.root / "run" / f"{self.name}.sock"

    @property
    def data_dir(self) -> Path:
        return self.data or self.root / "data"

    @property
    def log_path(self) -> Path:
        return self.root / f"{self.name}.log"

    def arguments(self) -> list[str]:
        """ctxd's own arguments (its socket, data directory and ``extra_args``)."""
        return ["--socket", str(self.socket), "--data-dir", str(self.data_dir),
                *self.extra_args]

    def entry_point(self) -> list[str]:
        profiler = [] if self.profile is None else [
            "-m", "cProfile", "-o", str(self.profile.resolve())]
        return [*profiler, *self.entry]

    def command(self) -> list[str]:
        """The command line `start` runs (to run it otherwise: in the foreground, under
        another process), in `environment`."""
        return daemon_command(self.arguments(), python=self.python, entry=self.entry_point())

    def environment(self) -> dict[str, str]:
        """Its environment: private, its configuration folder under ``root``, and (for a
        tree that has the gateway) the gateway on any free port, so that daemons run side
        by side, and upstreams that refuse every connection (`NO_PROVIDER`: a daemon of
        the tests never reaches the internet; a test that calls a model names its
        scripted server); ``env`` overrides any of them."""
        tree = self.code or REPO_ROOT
        gateway = ({"CTXD_GATEWAY_LISTEN": "127.0.0.1:0",
                    "CTXD_GATEWAY_ANTHROPIC_UPSTREAM": NO_PROVIDER,
                    "CTXD_GATEWAY_OPENAI_UPSTREAM": NO_PROVIDER}
                   if (tree / "ctxd" / "gateway").is_dir() else {})
        return private_environment({"XDG_CONFIG_HOME": str(self.root / "config"), **gateway,
                                    **self.env})

    def start(self, wait: bool = True, *, cwd: Path | None = None,
              pass_fds: tuple[int, ...] = (),
              before_exec: Callable[[], object] | None = None) -> DaemonProcess:
        """Start it (standing in ``cwd``, which never makes it run the code there: that is
        ``code``; see `ctxclient.spawn_daemon`) and (with ``wait``) wait until it answers
        a ping.

        Raises:
            DaemonFailed: it exited, or did not answer within ``start_timeout``.
        """
        if (self.forked and self.python == sys.executable and self.profile is None
                and self.code is None and not pass_fds and before_exec is None):
            self.proc = ForkedProcess(self.entry, self.arguments(), self.environment(),
                                      self.log_path, cwd)
        else:
            self.proc = spawn_daemon(self.arguments(), log=self.log_path,
                                     env=self.environment(), python=self.python,
                                     entry=self.entry_point(), code=self.code, cwd=cwd,
                                     pass_fds=pass_fds, before_exec=before_exec)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DaemonFailed(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with Client(self.socket, timeout=5) as client:
                    client.call("daemon.ping")
                    return
            except (DaemonUnavailable, OSError):
                time.sleep(0.02)
        raise DaemonFailed(f"{self.name} did not answer within {self.start_timeout}s:\n"
                           f"{self.log()}")

    @contextlib.contextmanager
    def running(self) -> Iterator[DaemonProcess]:
        """Started (and answering) for the block, stopped after it; stopped too when it
        does not start."""
        try:
            yield self.start()
        finally:
            if self.proc is not None:
                self.stop()

    def client(self, timeout: float = 30.0) -> Client:
        return Client(self.socket, timeout=timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int:
        """Signal the daemon and return its exit code.

        Raises:
            DaemonFailed: it did not exit within ``timeout`` (it is killed).
        """
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise DaemonFailed(f"{self.name} ignored signal {sig}:\n{self.log()}") from None
        return self.proc.returncode

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

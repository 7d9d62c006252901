"""Shared fixtures: a real ctxd process on a private temporary socket and data directory."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ctxclient import Client, DaemonUnavailable

START_TIMEOUT_S = 30.0


@dataclass
class DaemonProcess:
    """A ctxd started with ``python -m ctxd`` for one test (or one module)."""

    root: Path
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.root / "run" / "ctxd.sock"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        return self.root / "ctxd.log"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "ctxd", "--socket", str(self.socket),
                "--data-dir", str(self.data_dir), *self.extra_args]

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CTXD_", "NOTIFY_SOCKET", "LISTEN_", "WATCHDOG_"))}
        env["XDG_CONFIG_HOME"] = str(self.root / "config")
        env.update(self.env)
        return env

    def start(self, wait: bool = True, **popen: object) -> DaemonProcess:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log,
                                     env=self.environment(), **popen)  # type: ignore[call-overload]
        log.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"ctxd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with Client(self.socket, timeout=5) as client:
                    client.call("daemon.ping")
                    return
            except (DaemonUnavailable, OSError):
                time.sleep(0.02)
        raise AssertionError(f"ctxd did not answer within {START_TIMEOUT_S}s:\n{self.log()}")

    def client(self, timeout: float = 30.0) -> Client:
        return Client(self.socket, timeout=timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Signal the daemon and return its exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"ctxd ignored signal {sig}:\n{self.log()}") from None
        return self.proc.returncode

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


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
                if str(root).encode() not in cmdline.read():
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


@pytest.fixture
def sid() -> str:
    """A fresh session id."""
    return "t_" + uuid.uuid4().hex[:12]
